//! One sweep pass: the Discord outbox, deferred creates, then open jobs whose webhooks never
//! came. One job's trouble is counted and logged; it does not stop the pass. A pipeline- or
//! store-level error does, changing nothing, so the pass exits non-zero naming the cause.

use std::time::Duration;

use tracing::{Instrument, info, warn};

use super::rules::{self, Overdue, claim_creation};
use super::submit::build_ref;
use super::{DispatchError, Dispatcher, EventOutcome};
use crate::buildkite::BuildkiteError;
use crate::jobs::{Job, JobState, RunId, Shard, Transition, Updated, update};
use crate::result::{Outcome, Verdict};
use crate::retry::Deadline;

/// How many jobs of each partition one pass reads.
pub const SWEEP_BATCH: usize = 500;
/// How many open jobs one pass checks against Buildkite (oldest first).
pub const CHECK_BATCH: usize = 200;
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
}

impl std::fmt::Display for SweepReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sweep: checked {} unfinished jobs: {} finished, {} failed, {} advanced, {} unchanged, \
             {} builds created, {} creates deferred, {} reports sent, {} reports pending, {} errors",
            self.checked,
            self.finished,
            self.failed,
            self.advanced,
            self.unchanged,
            self.created,
            self.deferred,
            self.reports_sent,
            self.reports_pending,
            self.errors
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

/// Whether the pass has reached the pipeline: a build's 404 ends its job only then.
#[derive(Default)]
struct PipelineSeen(Option<bool>);

impl Dispatcher {
    /// One pass over the store: open jobs first (deferred creates, deadlines, lost
    /// webhooks), then pending reports. Each job's Discord delivery gets a short slice of the
    /// pass, and the pass stops starting work when its own deadline is near.
    pub async fn sweep(&self, deadline: Deadline) -> Result<SweepReport, DispatchError> {
        let mut report = SweepReport::default();
        let now = self.clock.now();
        let min_age = self.config.sweep_min_age.as_millis() as i64;
        let mut pipeline = PipelineSeen::default();
        let mut checks = 0;
        for job in self.store.list(Shard::Open, i64::MAX, SWEEP_BATCH).await? {
            if deadline.remaining() < PASS_RESERVE {
                warn!("sweep pass out of time; the next pass goes on");
                return Ok(report);
            }
            // Deadlines and cancels are handled whatever the job's age.
            let urgent = job.cancel_requested || self.overdue(&job).is_some();
            let due_check = urgent || (job.created_at <= now - min_age && checks < CHECK_BATCH);
            if due_check || job.creation.is_some() || job.build.is_none() {
                checks += usize::from(due_check && job.build.is_some());
                let span = tracing::info_span!("sweep", run_id = %job.run_id, state = %job.state);
                self.sweep_open(&job, due_check, &mut pipeline, deadline, &mut report)
                    .instrument(span)
                    .await?;
            }
            if self
                .store
                .get(&job.run_id)
                .await?
                .is_some_and(|j| j.owes_discord())
            {
                self.deliver_counted(&job.run_id, self.slice(deadline), &mut report)
                    .await?;
            }
        }
        for job in self
            .store
            .list(Shard::Outbox, i64::MAX, SWEEP_BATCH)
            .await?
        {
            if deadline.remaining() < PASS_RESERVE {
                warn!("sweep pass out of time; the next pass goes on");
                break;
            }
            self.deliver_counted(&job.run_id, self.slice(deadline), &mut report)
                .await?;
        }
        Ok(report)
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
        self.deliver_counted(run_id, deadline, &mut report).await?;
        Ok(report)
    }

    async fn deliver_counted(
        &self,
        run_id: &RunId,
        deadline: Deadline,
        report: &mut SweepReport,
    ) -> Result<(), DispatchError> {
        let before = self
            .store
            .get(run_id)
            .await?
            .is_some_and(|j| j.owes_discord());
        let after = self.deliver(run_id, deadline).await?;
        let owed = after.is_some_and(|j| j.owes_discord());
        if owed {
            report.reports_pending += 1;
        } else if before {
            report.reports_sent += 1;
        }
        Ok(())
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
            self.sweep_creation(job, deadline, report).await
        } else if check_build {
            report.checked += 1;
            self.sweep_build(job, pipeline, deadline).await
        } else {
            return Ok(());
        };
        match result {
            Ok(outcome) => report.count(&outcome),
            Err(DispatchError::Buildkite(e)) if e.is_misconfiguration() => {
                return Err(DispatchError::Pipeline(e));
            }
            Err(e @ DispatchError::Pipeline(_)) => return Err(e),
            Err(DispatchError::Store(e)) => return Err(e.into()),
            Err(e) => {
                warn!(run_id = %job.run_id, error = %e, "sweep could not check the job");
                report.errors += 1;
            }
        }
        Ok(())
    }

    /// A job without a build: fail it past its queue deadline, else create its build if due.
    async fn sweep_creation(
        &self,
        job: &Job,
        deadline: Deadline,
        report: &mut SweepReport,
    ) -> Result<EventOutcome, DispatchError> {
        let now = self.clock.now();
        let queue_timeout = self.config.queue_timeout.as_millis() as i64;
        let bk_deadline = self.buildkite_deadline(deadline);
        if job.creation.is_none() || now - job.created_at >= queue_timeout {
            // A create whose answer was lost may have made a build after all: look first.
            if job.creation.as_ref().is_none_or(|c| c.look_up_first)
                && let Some(build) = self
                    .buildkite
                    .find_build(job.run_id.as_str(), bk_deadline)
                    .await?
            {
                let t = Transition::to(JobState::Scheduled, now).with_build(build_ref(&build));
                return self.advance(&job.run_id, t, deadline).await;
            }
            let t = Transition::to(JobState::Failed, now)
                .with_failure("no Buildkite build could be created in time");
            // `apply` fails only a job still without a build, as stored now.
            return self.advance(&job.run_id, t, deadline).await;
        }
        let mut was = None;
        let claimed = update(self.store.as_ref(), &job.run_id, |j| {
            let (next, creation) = claim_creation(j, now)?;
            was = Some(creation);
            Some(next)
        })
        .await?;
        let (Updated::Written(held), Some(was)) = (claimed, was) else {
            return Ok(EventOutcome::Ignored("creation not due"));
        };
        if was.look_up_first
            && let Some(build) = self
                .buildkite
                .find_build(held.run_id.as_str(), deadline)
                .await?
        {
            info!(
                build = build.number,
                "found the build of an unconfirmed create"
            );
            let t = Transition::to(JobState::Scheduled, now).with_build(build_ref(&build));
            return self.advance(&held.run_id, t, deadline).await;
        }
        let creating = self.try_create(&held, &was.payload, bk_deadline).await;
        if let super::submit::Creating::Refused(e) = &creating
            && matches!(
                e,
                BuildkiteError::Rejected {
                    status: 401 | 403 | 404,
                    ..
                }
            )
        {
            // The pipeline or token is wrong, not this job: change nothing, fail the pass.
            return Err(DispatchError::Pipeline(creating.into_error()));
        }
        let created = matches!(creating, super::submit::Creating::Created(_));
        let after = self.settle_creation(&held, creating, deadline).await?;
        if created {
            report.created += 1;
        } else if after.state == JobState::Submitted {
            report.deferred += 1;
        }
        self.deliver(&held.run_id, deadline).await?;
        Ok(if after.state == held.state {
            EventOutcome::Ignored("creation deferred")
        } else {
            EventOutcome::Advanced(after.state)
        })
    }

    /// A job with a build: move it as its build has moved.
    async fn sweep_build(
        &self,
        job: &Job,
        pipeline: &mut PipelineSeen,
        deadline: Deadline,
    ) -> Result<EventOutcome, DispatchError> {
        let Some(b) = &job.build else {
            return Ok(EventOutcome::Ignored("no build"));
        };
        let bk_deadline = self.buildkite_deadline(deadline);
        let build = match self.buildkite.get_build(b.number, bk_deadline).await {
            Ok(build) => {
                pipeline.0 = Some(true);
                build
            }
            Err(BuildkiteError::Rejected { status: 404, .. }) => {
                self.reach_pipeline(pipeline, bk_deadline).await?;
                // The pipeline is there and the build is not: it will never finish.
                let outcome = Outcome::decided(
                    "unknown",
                    Verdict::Error,
                    "the build no longer exists in Buildkite",
                );
                let t = Transition::to(JobState::Finished, self.clock.now()).with_outcome(outcome);
                return self.advance(&job.run_id, t, deadline).await;
            }
            Err(e) => return Err(e.into()),
        };
        let target = rules::progress_of(&build);
        if target == JobState::Finished {
            let outcome = self.outcome_of(&build, bk_deadline).await?;
            let t = Transition::to(target, self.clock.now())
                .with_build(build_ref(&build))
                .with_outcome(outcome);
            return self.advance(&job.run_id, t, deadline).await;
        }
        let mut seen = job.clone();
        seen.state = if target.rank() > job.state.rank() {
            target
        } else {
            job.state
        };
        if let Some(overdue) = self.overdue(&seen) {
            return self.end_overdue(&seen, overdue, deadline).await;
        }
        if job.cancel_requested {
            // An earlier cancel call failed: try again until the build ends.
            self.cancel_build(b.number, bk_deadline).await;
        }
        if target.rank() <= job.state.rank() {
            return Ok(EventOutcome::Ignored("build has not moved on"));
        }
        let t = Transition::to(target, self.clock.now()).with_build(build_ref(&build));
        self.advance(&job.run_id, t, deadline).await
    }

    fn overdue(&self, job: &Job) -> Option<Overdue> {
        rules::overdue(
            job,
            self.clock.now(),
            self.config.queue_timeout.as_millis() as i64,
            self.config.job_max_age.as_millis() as i64,
        )
    }

    /// Cancels an overdue job's live build and ends the job with the deadline's verdict.
    async fn end_overdue(
        &self,
        job: &Job,
        overdue: Overdue,
        deadline: Deadline,
    ) -> Result<EventOutcome, DispatchError> {
        if let Some(b) = &job.build
            && !self
                .cancel_build(b.number, self.buildkite_deadline(deadline))
                .await
        {
            // A build we could not stop is not reported as stopped: next pass.
            return Ok(EventOutcome::Ignored(
                "overdue; its build could not be canceled yet",
            ));
        }
        let outcome = match overdue {
            Overdue::QueueTimeout => {
                let waited = job
                    .max_queue_secs
                    .unwrap_or(self.config.queue_timeout.as_secs());
                Outcome::decided(
                    "canceled",
                    Verdict::QueueTimeout,
                    format!(
                        "no agent on queue `{}` started it within {waited} s",
                        job.queue
                    ),
                )
            }
            Overdue::Expired => Outcome::decided(
                "canceled",
                Verdict::Expired,
                format!(
                    "still unfinished {} s after submission",
                    self.config.job_max_age.as_secs()
                ),
            ),
        };
        info!(?overdue, "job overdue; its build is canceled");
        let t = Transition::to(JobState::Finished, self.clock.now()).with_outcome(outcome);
        self.advance(&job.run_id, t, deadline).await
    }

    /// Confirms once per pass that the pipeline itself is readable.
    async fn reach_pipeline(
        &self,
        seen: &mut PipelineSeen,
        deadline: Deadline,
    ) -> Result<(), DispatchError> {
        match seen.0 {
            Some(true) => Ok(()),
            Some(false) => Err(DispatchError::Pipeline(BuildkiteError::Rejected {
                status: 404,
                message: "pipeline not found".into(),
            })),
            None => match self.buildkite.check_pipeline(deadline).await {
                Ok(()) => {
                    seen.0 = Some(true);
                    Ok(())
                }
                Err(e @ BuildkiteError::Rejected { .. }) => {
                    seen.0 = Some(false);
                    Err(DispatchError::Pipeline(e))
                }
                Err(e) => Err(e.into()),
            },
        }
    }
}
