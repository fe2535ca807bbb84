//! Record → create (or defer) → first delivery.

use std::collections::BTreeMap;

use tracing::{Instrument, info, warn};

use super::rules::{self, CREATE_HOLD_MS, CreateMiss, claim_creation};
use super::{DispatchError, Dispatcher, EventOutcome, SweepReport};
use crate::buildkite::BuildkiteError;
use crate::buildkite::model::{Build, NewBuild};
use crate::jobs::model::Creation;
use crate::jobs::{BuildRef, Created, Job, JobState, Transition, Updated, update_seen};
use crate::retry::Deadline;
use crate::submission::Submission;

/// What a submission did.
#[derive(Debug)]
pub enum Submitted {
    New(Job),
    /// The run id was known: nothing was created.
    Existing(Job),
}

pub(crate) fn build_ref(build: &Build) -> BuildRef {
    BuildRef {
        id: build.id.clone(),
        number: build.number,
        web_url: build.web_url.clone(),
    }
}

/// How one try at creating a job's build ended.
pub(crate) enum Creating {
    Created(Build),
    Deferred(CreateMiss),
    Refused(BuildkiteError),
}

impl Creating {
    /// The refusal's error (only meaningful for [`Creating::Refused`]).
    pub(crate) fn into_error(self) -> BuildkiteError {
        match self {
            Self::Refused(e) => e,
            _ => BuildkiteError::Protocol("not a refusal".into()),
        }
    }
}

impl Dispatcher {
    fn new_build(&self, job: &Job, payload: &str) -> NewBuild {
        let bk = &self.config.buildkite;
        let env = BTreeMap::from([
            ("KERNELBOT_RUN_ID".to_owned(), job.run_id.to_string()),
            (crate::payload::PAYLOAD_VAR.to_owned(), payload.to_owned()),
            ("KERNELBOT_QUEUE".to_owned(), job.queue.clone()),
            ("KERNELBOT_IMAGE".to_owned(), bk.image.clone()),
        ]);
        let meta_data = BTreeMap::from([
            ("run_id".to_owned(), job.run_id.to_string()),
            ("queue".to_owned(), job.queue.clone()),
        ]);
        NewBuild {
            commit: bk.commit.clone(),
            branch: bk.branch.clone(),
            message: format!(
                "Kernel eval: {}",
                job.title.as_deref().unwrap_or(job.run_id.as_str())
            ),
            env,
            meta_data,
        }
    }

    /// One try at creating the build. When the answer is lost (timeout, 5xx) the build may
    /// exist all the same: it is looked up at once, and if not found yet, later.
    pub(crate) async fn try_create(
        &self,
        job: &Job,
        payload: &str,
        deadline: Deadline,
    ) -> Creating {
        match self
            .buildkite
            .create_build(&self.new_build(job, payload), deadline)
            .await
        {
            Ok(build) => Creating::Created(build),
            Err(BuildkiteError::RateLimited { reset }) => {
                Creating::Deferred(CreateMiss::RateLimited {
                    reset_ms: reset.map_or(60_000, |r| r.as_millis() as i64),
                })
            }
            // Not sent at all (the pass's budget, no connection, no time): nothing to look up.
            Err(BuildkiteError::OverBudget) => Creating::Deferred(CreateMiss::NotSent),
            Err(BuildkiteError::Unavailable(e)) => {
                warn!(error = %e, "build not created; deferred");
                Creating::Deferred(CreateMiss::NotSent)
            }
            Err(e @ (BuildkiteError::Unconfirmed(_) | BuildkiteError::Protocol(_))) => {
                warn!(error = %e, "build creation unconfirmed; looking the build up");
                match self
                    .buildkite
                    .find_build(job.run_id.as_str(), deadline)
                    .await
                {
                    Ok(Some(build)) => Creating::Created(build),
                    Ok(None) | Err(_) => Creating::Deferred(CreateMiss::Unconfirmed),
                }
            }
            Err(e) => Creating::Refused(e),
        }
    }

    /// Records what a create try did; returns the job as it is then.
    pub(crate) async fn settle_creation(
        &self,
        job: &Job,
        creating: Creating,
        deadline: Deadline,
    ) -> Result<Job, DispatchError> {
        let now = self.clock.now();
        let written = match creating {
            Creating::Created(build) => {
                info!(build = build.number, "build created");
                let t = Transition::to(JobState::Scheduled, now).with_build(build_ref(&build));
                // A webhook may have recorded the build (and more) first: that is kept.
                let written = update_seen(self.store.as_ref(), job, |j| j.apply(&t)).await?;
                // The job was canceled meanwhile, or already has another build (a lookup
                // raced a create): this build must not take a GPU.
                if let Updated::Unchanged(j) = &written
                    && (j.cancel_requested || j.build.is_some())
                    && j.build.as_ref().is_none_or(|b| b.id != build.id)
                {
                    self.cancel_build(build.number, deadline).await;
                }
                written
            }
            Creating::Deferred(miss) => {
                update_seen(self.store.as_ref(), job, |j| {
                    rules::defer_creation(j, miss, now)
                })
                .await?
            }
            Creating::Refused(source) => {
                warn!(error = %source, "Buildkite refused the build");
                // The report names the status only; Buildkite's own text is in the log line above.
                let reason = match &source {
                    BuildkiteError::Rejected { status, .. } => {
                        format!("Buildkite refused the build (HTTP {status})")
                    }
                    other => other.public(),
                };
                let t = Transition::to(JobState::Failed, now).with_failure(reason);
                let job = update_seen(self.store.as_ref(), job, |j| j.apply(&t))
                    .await?
                    .job()
                    .unwrap_or_else(|| job.clone());
                self.deliver(&job, deadline).await?;
                return Err(DispatchError::BuildRefused {
                    job: Box::new(job),
                    source,
                });
            }
        };
        Ok(written.job().unwrap_or_else(|| job.clone()))
    }

    /// Records the job, then creates its build (or defers that to the sweep), then shows it
    /// in Discord. The record comes first so a webhook never arrives for a job we do not know.
    pub async fn submit(
        &self,
        sub: Submission,
        deadline: Deadline,
    ) -> Result<Submitted, DispatchError> {
        let span = tracing::info_span!("submit", run_id = %sub.run_id, gpu = %sub.gpu);
        async move {
            let now = self.clock.now();
            let mut job = Job::new(
                sub.run_id.clone(),
                sub.gpu.clone(),
                sub.queue.clone(),
                sub.title.clone(),
                sub.discord.clone(),
                now,
            );
            job.max_queue_secs = sub.max_queue_secs;
            job.private = sub.private;
            if self.callbacks.is_some() {
                job.callback = Some(crate::jobs::CallbackOutbox::new(now));
            }
            // Held while this create is in flight; if this function dies, the sweep looks the
            // build up once the hold has passed, then creates it.
            job.creation = Some(Creation {
                payload: sub.payload.clone(),
                after: now + CREATE_HOLD_MS,
                look_up_first: true,
            });
            if let Created::Existing(existing) = self.store.create(&job).await? {
                info!(state = %existing.state, "run id already known; nothing created");
                return Ok(Submitted::Existing(*existing));
            }
            let creating = self
                .try_create(&job, &sub.payload, self.buildkite_deadline(deadline))
                .await;
            let job = self.settle_creation(&job, creating, deadline).await?;
            let job = self.deliver(&job, deadline).await?.unwrap_or(job);
            Ok(Submitted::New(job))
        }
        .instrument(span)
        .await
    }

    /// A job without a build, seen by the sweep: failed past its queue deadline (after a last
    /// lookup when a create may have landed), else its build created if that is due.
    pub(crate) async fn create_deferred(
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
                return self.adopt(job, build, deadline).await;
            }
            let t = Transition::to(JobState::Failed, now)
                .with_failure("no Buildkite build could be created in time");
            // `apply` fails only a job still without a build, as stored now.
            return self.advance(job, t, deadline).await;
        }
        if self.buildkite.over_budget() {
            return Ok(EventOutcome::Ignored(
                "no Buildkite calls left in this pass",
            ));
        }
        let mut was = None;
        let claimed = update_seen(self.store.as_ref(), job, |j| {
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
            return self.adopt(&held, build, deadline).await;
        }
        let creating = self.try_create(&held, &was.payload, bk_deadline).await;
        if let Creating::Refused(e) = &creating
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
        let created = matches!(creating, Creating::Created(_));
        let after = self.settle_creation(&held, creating, deadline).await?;
        if created {
            report.created += 1;
        } else if after.state == JobState::Submitted {
            report.deferred += 1;
        }
        self.deliver(&after, deadline).await?;
        Ok(if after.state == held.state {
            EventOutcome::Ignored("creation deferred")
        } else {
            EventOutcome::Advanced(after.state)
        })
    }

    /// Takes a build found by its run id as the job's, as a create's answer would be (a job
    /// canceled or given another build meanwhile gets it canceled instead).
    async fn adopt(
        &self,
        job: &Job,
        build: Build,
        deadline: Deadline,
    ) -> Result<EventOutcome, DispatchError> {
        let before = job.state;
        let after = self
            .settle_creation(job, Creating::Created(build), deadline)
            .await?;
        self.deliver(&after, deadline).await?;
        Ok(if after.state == before {
            EventOutcome::Ignored("build found; the job had moved on")
        } else {
            EventOutcome::Advanced(after.state)
        })
    }
}
