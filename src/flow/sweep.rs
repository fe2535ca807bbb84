//! One sweep pass: the Discord outbox, deferred creates, then open jobs whose webhooks never
//! came. One job's trouble is counted and logged; it does not stop the pass. A pipeline- or
//! store-level error does, changing nothing, so the pass exits non-zero naming the cause.

use std::time::Duration;

use std::collections::HashMap;

use tracing::warn;

use super::{DispatchError, Dispatcher, EventOutcome};
use crate::buildkite::client::CallBudget;
use crate::buildkite::{Build, BuildkiteError};
use crate::jobs::{DeliveryStatus, Job, JobState, RunId, Shard};
use crate::retry::Deadline;
use crate::telemetry::metrics::Unit;

/// How many jobs of each partition one pass reads.
pub const SWEEP_BATCH: usize = 1000;
/// Pages one listing reads at most; builds below them are read one by one, in bookmark
/// order, as the budget allows.
const LISTING_PAGES: usize = 10;
/// A pass starts no new job's work with less than this left.
const PASS_RESERVE: Duration = Duration::from_secs(10);

/// What one sweep pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SweepReport {
    pub checked: usize,
    pub finished: usize,
    pub failed: usize,
    pub advanced: usize,
    pub unchanged: usize,
    pub created: usize,
    pub deferred: usize,
    pub reports_sent: usize,
    pub reports_pending: usize,
    pub errors: usize,
    /// Calls made to the Buildkite API (artifact storage not counted).
    pub buildkite_calls: u32,
    /// The pass stopped its Buildkite work on its call budget or the rate limit.
    pub budget_spent: bool,
    /// Reports given up in this pass (a day of failures, or refused for good).
    pub reports_given_up: usize,
    /// Age of the oldest report still pending after the pass.
    pub oldest_pending_secs: u64,
    /// Open jobs past a deadline when the pass began.
    pub past_deadline: usize,
    /// Signed callbacks accepted in this pass, still owed after it, and given up in it.
    pub callbacks_sent: usize,
    pub callbacks_pending: usize,
    pub callbacks_given_up: usize,
}

impl std::fmt::Display for SweepReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sweep: checked {} unfinished jobs: {} finished, {} failed, {} advanced, {} unchanged, \
             {} builds created, {} creates deferred, {} reports sent, {} reports pending, {} errors; \
             {} Buildkite calls{}",
            self.checked,
            self.finished,
            self.failed,
            self.advanced,
            self.unchanged,
            self.created,
            self.deferred,
            self.reports_sent,
            self.reports_pending,
            self.errors,
            self.buildkite_calls,
            if self.budget_spent {
                " (budget spent: the next pass goes on)"
            } else {
                ""
            }
        )
    }
}

impl SweepReport {
    fn count(&mut self, outcome: &EventOutcome) {
        match outcome {
            EventOutcome::Advanced(JobState::Finished) => self.finished += 1,
            EventOutcome::Advanced(JobState::Failed) => self.failed += 1,
            EventOutcome::Advanced(_) => self.advanced += 1,
            EventOutcome::Ignored(_) => self.unchanged += 1,
        }
    }
}

/// Build states in which a build may still change.
const LIVE_STATES: &[&str] = &[
    "creating",
    "scheduled",
    "running",
    "failing",
    "canceling",
    "waiting",
    "waiting_failed",
];
/// Build states after which nothing more happens.
const ENDED_STATES: &[&str] = &[
    "passed", "failed", "canceled", "skipped", "not_run", "blocked",
];

/// A job's place in the sweep's order (and the bookmark's form).
fn bookmark(job: &Job) -> String {
    format!("{:020}:{}", job.created_at.max(0), job.run_id)
}

/// Where one outbox of a job stands after a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Delivery {
    Sent,
    Pending,
    GivenUp,
}

/// A job's two outboxes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outbox {
    Discord,
    Callback,
}

impl Outbox {
    fn owed(self, job: &Job) -> bool {
        match self {
            Self::Discord => job.owes_discord(),
            Self::Callback => job.owes_callback(),
        }
    }

    /// Nothing more will be sent: given up, or the receiver is gone.
    fn given_up(self, job: &Job) -> bool {
        let status = match self {
            Self::Discord => job.discord.as_ref().map(|o| o.status),
            Self::Callback => job.callback.as_ref().map(|c| c.status),
        };
        matches!(status, Some(DeliveryStatus::GivenUp))
            || (self == Self::Callback && status == Some(DeliveryStatus::Gone))
    }
}

impl SweepReport {
    /// Counts one outbox's delivery.
    fn count_delivery(&mut self, outbox: Outbox, delivery: Option<Delivery>) {
        let (sent, pending, given_up) = match outbox {
            Outbox::Discord => (
                &mut self.reports_sent,
                &mut self.reports_pending,
                &mut self.reports_given_up,
            ),
            Outbox::Callback => (
                &mut self.callbacks_sent,
                &mut self.callbacks_pending,
                &mut self.callbacks_given_up,
            ),
        };
        match delivery {
            Some(Delivery::Sent) => *sent += 1,
            Some(Delivery::Pending) => *pending += 1,
            Some(Delivery::GivenUp) => *given_up += 1,
            None => {}
        }
    }
}

/// Whether the pass has reached the pipeline: a build's 404 ends its job only then.
#[derive(Default)]
pub(super) struct PipelineSeen(pub(super) Option<bool>);

impl Dispatcher {
    /// One pass over the store within `deadline` and at most `SWEEP_MAX_CALLS` Buildkite
    /// calls: deferred creates, then the builds of open jobs (two listings rather than a GET
    /// each), then pending reports. Each delivery gets a short slice of the pass, and the pass
    /// starts no new work when its deadline is near.
    pub async fn sweep(&self, deadline: Deadline) -> Result<SweepReport, DispatchError> {
        let budget = CallBudget::new(self.config.sweep_max_calls);
        let pass = Self {
            buildkite: self.buildkite.with_budget(budget.clone()),
            ..self.clone()
        };
        let mut report = SweepReport::default();
        let result = pass.sweep_pass(deadline, &mut report).await;
        report.buildkite_calls = budget.made();
        report.budget_spent = budget.spent();
        self.publish(&report, result.is_err());
        result.map(|()| report)
    }

    /// The pass's metrics: what the alarms in `template.yaml` watch.
    fn publish(&self, report: &SweepReport, failed: bool) {
        self.metrics.put(
            &[],
            &[
                ("SweepFailed", Unit::Count, f64::from(u8::from(failed))),
                ("SweepErrors", Unit::Count, report.errors as f64),
                (
                    "SweepBuildkiteCalls",
                    Unit::Count,
                    f64::from(report.buildkite_calls),
                ),
                ("ReportsPending", Unit::Count, report.reports_pending as f64),
                (
                    "ReportsGivenUp",
                    Unit::Count,
                    report.reports_given_up as f64,
                ),
                (
                    "OldestPendingReportAge",
                    Unit::Seconds,
                    report.oldest_pending_secs as f64,
                ),
                (
                    "OpenJobsPastDeadline",
                    Unit::Count,
                    report.past_deadline as f64,
                ),
                (
                    "CallbacksPending",
                    Unit::Count,
                    report.callbacks_pending as f64,
                ),
                (
                    "CallbacksGivenUp",
                    Unit::Count,
                    report.callbacks_given_up as f64,
                ),
            ],
        );
    }

    async fn sweep_pass(
        &self,
        deadline: Deadline,
        report: &mut SweepReport,
    ) -> Result<(), DispatchError> {
        let open = self.store.list(Shard::Open, i64::MAX, SWEEP_BATCH).await?;
        report.past_deadline = open.iter().filter(|j| self.overdue(j).is_some()).count();
        // Discord needs no Buildkite call: reports go out even when Buildkite work failed.
        let buildkite = self.buildkite_work(&open, deadline, report).await;
        let outbox = self
            .store
            .list(Shard::Outbox, i64::MAX, SWEEP_BATCH)
            .await?;
        let owing: Vec<&Job> = open
            .iter()
            .chain(outbox.iter())
            .filter(|j| j.owes_delivery())
            .collect();
        let mut still_pending = Vec::new();
        for job in owing {
            let (discord, callback) = self.deliver_both(job, deadline).await;
            let discord = discord?;
            if discord == Some(Delivery::Pending) {
                still_pending.push(job);
            }
            report.count_delivery(Outbox::Discord, discord);
            report.count_delivery(Outbox::Callback, callback?);
        }
        // Measured on every report still owed, tried in this pass or not.
        let now = self.clock.now();
        report.reports_pending = still_pending.len();
        report.oldest_pending_secs = still_pending
            .iter()
            .map(|j| {
                let since = j
                    .discord
                    .as_ref()
                    .and_then(|o| o.pending_since)
                    .unwrap_or(j.updated_at);
                (now - since).max(0) as u64 / 1000
            })
            .max()
            .unwrap_or(0);
        buildkite
    }

    /// One job's Discord report and callback, side by side within a short slice of the
    /// pass, so a slow Discord never holds callbacks back, nor the reverse. `None`: that
    /// outbox owed nothing.
    async fn deliver_both(
        &self,
        job: &Job,
        deadline: Deadline,
    ) -> (
        Result<Option<Delivery>, DispatchError>,
        Result<Option<Delivery>, DispatchError>,
    ) {
        tokio::join!(
            self.deliver_one(Outbox::Discord, job, deadline),
            self.deliver_one(Outbox::Callback, job, deadline)
        )
    }

    /// Sends what `job` owes through `outbox`; where that outbox stands after.
    async fn deliver_one(
        &self,
        outbox: Outbox,
        job: &Job,
        deadline: Deadline,
    ) -> Result<Option<Delivery>, DispatchError> {
        if !outbox.owed(job) {
            return Ok(None);
        }
        if deadline.remaining() < PASS_RESERVE {
            return Ok(Some(Delivery::Pending));
        }
        let slice = self.slice(deadline);
        let delivered = match outbox {
            Outbox::Discord => self.deliver_discord(job, slice).await?,
            Outbox::Callback => self.deliver_callback(job, slice).await?,
        };
        // Nothing seen when it had no time to try: the job as stored says.
        let after = match delivered {
            Some(after) => after,
            None => match self.store.get(&job.run_id).await? {
                Some(after) => after,
                None => return Ok(Some(Delivery::Sent)),
            },
        };
        Ok(Some(if outbox.owed(&after) {
            Delivery::Pending
        } else if outbox.given_up(&after) {
            Delivery::GivenUp
        } else {
            Delivery::Sent
        }))
    }

    /// Deferred creates, then the builds of open jobs due for a look.
    async fn buildkite_work(
        &self,
        open: &[Job],
        deadline: Deadline,
        report: &mut SweepReport,
    ) -> Result<(), DispatchError> {
        let now = self.clock.now();
        let min_age = self.config.sweep_min_age.as_millis() as i64;
        let mut pipeline = PipelineSeen::default();
        for job in open.iter().filter(|j| j.build.is_none()) {
            if deadline.remaining() < PASS_RESERVE {
                return Ok(());
            }
            self.sweep_open(job, false, &mut pipeline, deadline, report)
                .await?;
        }
        // Deadlines and cancels are handled whatever the job's age.
        let due: Vec<&Job> = open
            .iter()
            .filter(|j| j.build.is_some())
            .filter(|j| {
                j.created_at <= now - min_age || j.cancel_requested || self.overdue(j).is_some()
            })
            .collect();
        self.follow_builds(&due, &mut pipeline, deadline, report)
            .await
    }

    /// Follows the builds of `due` jobs: live builds from one listing, ended ones from
    /// another (and a GET for any in neither), in bookmark order as far as the budget goes.
    async fn follow_builds(
        &self,
        due: &[&Job],
        pipeline: &mut PipelineSeen,
        deadline: Deadline,
        report: &mut SweepReport,
    ) -> Result<(), DispatchError> {
        let number = |j: &Job| j.build.as_ref().map_or(0, |b| b.number);
        let Some(lowest) = due.iter().map(|j| number(j)).min() else {
            return Ok(());
        };
        let bk_deadline = self.buildkite_deadline(deadline);
        let Some(live) = self
            .listing(LIVE_STATES, lowest, bk_deadline, pipeline, report)
            .await?
        else {
            return Ok(());
        };
        let (listed, ended): (Vec<&Job>, Vec<&Job>) =
            due.iter().partition(|j| live.contains_key(&number(j)));
        for job in listed {
            report.checked += 1;
            let result = self.follow(job, &live[&number(job)], deadline).await;
            if !self.settle(job, result, report)? {
                return Ok(());
            }
        }
        let ended = self.bookmark_order(ended).await?;
        let Some(lowest) = ended.iter().map(|j| number(j)).min() else {
            return self.store.set_sweep_cursor(None).await.map_err(Into::into);
        };
        let Some(done) = self
            .listing(ENDED_STATES, lowest, bk_deadline, pipeline, report)
            .await?
        else {
            return Ok(());
        };
        for job in &ended {
            if deadline.remaining() < PASS_RESERVE || self.buildkite.over_budget() {
                // Resume here next pass, so every open job is reached in turn.
                return self
                    .store
                    .set_sweep_cursor(Some(&bookmark(job)))
                    .await
                    .map_err(Into::into);
            }
            report.checked += 1;
            let result = match done.get(&number(job)) {
                Some(build) => self.follow(job, build, deadline).await,
                None => self.look_at_build(job, pipeline, deadline).await,
            };
            if !self.settle(job, result, report)? {
                return self
                    .store
                    .set_sweep_cursor(Some(&bookmark(job)))
                    .await
                    .map_err(Into::into);
            }
        }
        self.store.set_sweep_cursor(None).await.map_err(Into::into)
    }

    /// One listing of the pipeline's builds in `states` down to build `lowest`, by number;
    /// `None` when the budget or Buildkite stops the pass's Buildkite work.
    async fn listing(
        &self,
        states: &[&str],
        lowest: u64,
        deadline: Deadline,
        pipeline: &mut PipelineSeen,
        report: &mut SweepReport,
    ) -> Result<Option<HashMap<u64, Build>>, DispatchError> {
        match self
            .buildkite
            .list_builds(states, lowest, LISTING_PAGES, deadline)
            .await
        {
            Ok(builds) => {
                pipeline.0 = Some(true);
                Ok(Some(builds.into_iter().map(|b| (b.number, b)).collect()))
            }
            Err(
                e @ BuildkiteError::Rejected {
                    status: 401 | 403 | 404,
                    ..
                },
            ) => Err(DispatchError::Pipeline(e)),
            Err(BuildkiteError::OverBudget) => Ok(None),
            Err(e) => {
                warn!(error = %e, "could not list builds; the next pass tries again");
                report.errors += 1;
                Ok(None)
            }
        }
    }

    /// `jobs` in (creation time, run id) order, starting at the bookmark the last pass left.
    async fn bookmark_order<'a>(
        &self,
        mut jobs: Vec<&'a Job>,
    ) -> Result<Vec<&'a Job>, DispatchError> {
        jobs.sort_by_key(|j| bookmark(j));
        if let Some(mark) = self.store.sweep_cursor().await? {
            let at = jobs.partition_point(|j| bookmark(j) < mark);
            jobs.rotate_left(at);
        }
        Ok(jobs)
    }

    /// Counts one job's result; `false` when the pass must stop its Buildkite work.
    fn settle(
        &self,
        job: &Job,
        result: Result<EventOutcome, DispatchError>,
        report: &mut SweepReport,
    ) -> Result<bool, DispatchError> {
        match result {
            Ok(outcome) => report.count(&outcome),
            Err(DispatchError::Buildkite(BuildkiteError::OverBudget)) => return Ok(false),
            Err(DispatchError::Buildkite(e)) if e.is_misconfiguration() => {
                return Err(DispatchError::Pipeline(e));
            }
            Err(e @ (DispatchError::Pipeline(_) | DispatchError::Store(_))) => return Err(e),
            Err(e) => {
                warn!(run_id = %job.run_id, error = %e, "sweep could not check the job");
                report.errors += 1;
            }
        }
        Ok(true)
    }

    /// The part of the pass one job's Discord delivery may use: one try and a short wait.
    fn slice(&self, deadline: Deadline) -> Deadline {
        let slice = Deadline::after(2 * self.discord.timeout() + Duration::from_secs(3));
        if slice.remaining() < deadline.remaining() {
            slice
        } else {
            deadline
        }
    }

    /// Re-drives one run: its build is checked whatever its age, and what it owes is sent.
    pub async fn sweep_run(
        &self,
        run_id: &RunId,
        deadline: Deadline,
    ) -> Result<SweepReport, DispatchError> {
        let mut report = SweepReport::default();
        let Some(job) = self.store.get(run_id).await? else {
            return Ok(report);
        };
        if !job.state.is_terminal() {
            let mut pipeline = PipelineSeen::default();
            self.sweep_open(&job, true, &mut pipeline, deadline, &mut report)
                .await?;
        }
        if let Some(job) = self.store.get(run_id).await? {
            let (discord, callback) = self.deliver_both(&job, deadline).await;
            report.count_delivery(Outbox::Discord, discord?);
            report.count_delivery(Outbox::Callback, callback?);
        }
        Ok(report)
    }

    /// One open job: create its build if that is due, else follow its build.
    async fn sweep_open(
        &self,
        job: &Job,
        check_build: bool,
        pipeline: &mut PipelineSeen,
        deadline: Deadline,
        report: &mut SweepReport,
    ) -> Result<(), DispatchError> {
        let result = if job.build.is_none() {
            self.create_deferred(job, deadline, report).await
        } else if check_build {
            report.checked += 1;
            self.look_at_build(job, pipeline, deadline).await
        } else {
            return Ok(());
        };
        self.settle(job, result, report)?;
        Ok(())
    }
}
