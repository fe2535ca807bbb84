//! Record → create (or defer) → first delivery.

use std::collections::BTreeMap;

use tracing::{Instrument, info, warn};

use super::rules::{self, CREATE_HOLD_MS, CreateMiss};
use super::{DispatchError, Dispatcher};
use crate::buildkite::BuildkiteError;
use crate::buildkite::model::{Build, NewBuild};
use crate::jobs::model::Creation;
use crate::jobs::{BuildRef, Created, Job, JobState, Transition, Updated, update};
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
            // Not sent at all (no connection, no time): nothing to look up.
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
                let written = update(self.store.as_ref(), &job.run_id, |j| j.apply(&t)).await?;
                if let Updated::Unchanged(j) = &written
                    && j.cancel_requested
                    && j.build.as_ref().is_none_or(|b| b.id != build.id)
                {
                    self.cancel_build(build.number, deadline).await;
                }
                written
            }
            Creating::Deferred(miss) => {
                update(self.store.as_ref(), &job.run_id, |j| {
                    rules::defer_creation(j, miss, now)
                })
                .await?
            }
            Creating::Refused(source) => {
                warn!(error = %source, "Buildkite refused the build");
                let t = Transition::to(JobState::Failed, now).with_failure(source.to_string());
                let job = update(self.store.as_ref(), &job.run_id, |j| j.apply(&t))
                    .await?
                    .job()
                    .unwrap_or_else(|| job.clone());
                self.deliver(&job.run_id, deadline).await?;
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
            let job = self.deliver(&job.run_id, deadline).await?.unwrap_or(job);
            Ok(Submitted::New(job))
        }
        .instrument(span)
        .await
    }
}
