//! Signed event → transition → outcome.

use tracing::{Instrument, info, warn};

use super::rules::{self, Signal};
use super::submit::build_ref;
use super::{DispatchError, Dispatcher};
use crate::buildkite::BuildkiteError;
use crate::buildkite::model::{Build, pick_result};
use crate::buildkite::webhook::WebhookEvent;
use crate::jobs::{Job, JobState, RunId, StoreError, Transition, Updated, update_seen};
use crate::result::{FullResult, Outcome};
use crate::retry::Deadline;

/// What a webhook event did.
#[derive(Debug, PartialEq, Eq)]
pub enum EventOutcome {
    Advanced(JobState),
    Ignored(&'static str),
}

#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("build has no finished result.json artifact")]
    Missing,
    #[error("result.json could not be read: {0}")]
    Unreadable(String),
    #[error("result.json could not be downloaded: {0}")]
    Buildkite(#[from] BuildkiteError),
}

impl FetchError {
    /// What the report says: fixed texts, the details stay in the logs.
    fn public(&self) -> String {
        match self {
            Self::Missing => self.to_string(),
            Self::Unreadable(_) => "result.json could not be read".into(),
            Self::Buildkite(e) => format!("result.json could not be downloaded: {}", e.public()),
        }
    }
}

impl Dispatcher {
    /// Handles a verified Buildkite webhook event.
    pub async fn on_event(
        &self,
        event: &WebhookEvent,
        deadline: Deadline,
    ) -> Result<EventOutcome, DispatchError> {
        let signal = rules::signal_of(&event.event, event.job.as_ref());
        let target = match signal {
            Signal::Ignore(why) => return Ok(EventOutcome::Ignored(why)),
            Signal::Scheduled => JobState::Scheduled,
            Signal::Running => JobState::Running,
            Signal::Finished => JobState::Finished,
        };
        let Some(build) = &event.build else {
            return Ok(EventOutcome::Ignored("no build in the event"));
        };
        let Some(run_id) = build.run_id().and_then(|r| r.parse::<RunId>().ok()) else {
            return Ok(EventOutcome::Ignored("build is not ours"));
        };
        let span =
            tracing::info_span!("webhook", %run_id, event = %event.event, build = build.number);
        self.on_build_signal(&run_id, target, build, deadline)
            .instrument(span)
            .await
    }

    async fn on_build_signal(
        &self,
        run_id: &RunId,
        target: JobState,
        build: &Build,
        deadline: Deadline,
    ) -> Result<EventOutcome, DispatchError> {
        let Some(job) = self.store.get(run_id).await? else {
            info!("no job for this run id");
            return Ok(EventOutcome::Ignored("unknown job"));
        };
        // A second build of one run (a create whose answer was lost, then made again, or a
        // rebuild), or the build of a job that ended before it had one (canceled, or given
        // up in the queue): nobody reads its result, so it must not hold a GPU.
        let stray = job.build.as_ref().is_some_and(|b| b.id != build.id)
            || (job.build.is_none() && job.state.is_terminal());
        if stray {
            if target != JobState::Finished {
                self.cancel_build(build.number, self.buildkite_deadline(deadline))
                    .await;
            }
            return Ok(EventOutcome::Ignored("a build this job does not use"));
        }
        // Cheap early exit for duplicates; the conditional write is what decides.
        if target.rank() <= job.state.rank() {
            if job.owes_delivery() {
                self.deliver(&job, deadline).await?;
            }
            return Ok(EventOutcome::Ignored("duplicate or out of order"));
        }
        let mut t = Transition::to(target, self.clock.now()).with_build(build_ref(build));
        if target == JobState::Finished {
            // Webhook payloads can lag the build; the API's view decides, and only a
            // terminal state finishes a job.
            let bk_deadline = self.buildkite_deadline(deadline);
            let current = self.buildkite.get_build(build.number, bk_deadline).await?;
            if current.id != build.id {
                return Ok(EventOutcome::Ignored(
                    "the event's build is not the one read back",
                ));
            }
            if rules::progress_of(&current) != JobState::Finished {
                return Ok(EventOutcome::Ignored("build has not finished"));
            }
            t = t.with_outcome(self.outcome_of(&current, bk_deadline).await?);
        }
        self.advance(&job, t, deadline).await
    }

    /// Moves a job (`seen` as last read) forward and delivers what that owes. An outcome too
    /// large for the store is stored without its result (the verdict stands), never retried
    /// as it is.
    pub(crate) async fn advance(
        &self,
        seen: &Job,
        t: Transition,
        deadline: Deadline,
    ) -> Result<EventOutcome, DispatchError> {
        let store = self.store.as_ref();
        let written = match update_seen(store, seen, |j| j.apply(&t)).await {
            Err(StoreError::TooLarge) if t.outcome.is_some() => {
                warn!("outcome too large for the store; keeping the verdict only");
                let mut slim = t.clone();
                slim.outcome = t
                    .outcome
                    .as_ref()
                    .map(|o| o.without_result("the result was too large to store"));
                update_seen(store, seen, |j| j.apply(&slim)).await?
            }
            other => other?,
        };
        match written {
            Updated::Written(job) => {
                info!(state = %job.state, "job moved forward");
                self.deliver(&job, deadline).await?;
                Ok(EventOutcome::Advanced(job.state))
            }
            Updated::Unchanged(job) => {
                if job.owes_delivery() {
                    self.deliver(&job, deadline).await?;
                }
                Ok(EventOutcome::Ignored("duplicate or out of order"))
            }
            Updated::Missing => Ok(EventOutcome::Ignored("unknown job")),
        }
    }

    /// The outcome of a finished build as the REST API shows it (with its jobs). Only
    /// Buildkite being unreachable is an error (so the sweep can try again later); a missing
    /// or unreadable result is part of the outcome.
    pub(crate) async fn outcome_of(
        &self,
        build: &Build,
        deadline: Deadline,
    ) -> Result<Outcome, DispatchError> {
        let state = build.final_state().to_owned();
        let (result, error) = match self.fetch_result(build, deadline).await {
            Ok(r) => (Some(r), None),
            // Unreachable, or our token may not read artifacts: try again later rather than
            // judge the run on a result we could not read.
            Err(FetchError::Buildkite(
                e @ (BuildkiteError::Unavailable(_)
                | BuildkiteError::OverBudget
                | BuildkiteError::RateLimited { .. }
                | BuildkiteError::Rejected {
                    status: 401 | 403, ..
                }),
            )) => return Err(e.into()),
            Err(e) => {
                info!(error = %e, "no usable result.json");
                (None, Some(e.public()))
            }
        };
        Ok(Outcome::judge(&state, result, error).with_timings(build.timings()))
    }

    async fn fetch_result(
        &self,
        build: &Build,
        deadline: Deadline,
    ) -> Result<FullResult, FetchError> {
        let artifacts = self
            .buildkite
            .list_artifacts(build.number, deadline)
            .await?;
        let artifact = pick_result(build, &artifacts).ok_or(FetchError::Missing)?;
        let bytes = self
            .buildkite
            .download_artifact(build.number, artifact, deadline)
            .await?;
        FullResult::parse(&bytes).map_err(|e| FetchError::Unreadable(e.to_string()))
    }
}
