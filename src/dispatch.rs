//! The job's path through the system: submit → build → events → result → Discord.
//!
//! Handlers call into this; it reads top to bottom: record, call out, move the job forward
//! (the store's conditional write decides who wins), then tell Discord what the winner saw.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::{Instrument, info, warn};

use crate::buildkite::model::{Build, NewBuild, pick_result};
use crate::buildkite::{BuildkiteClient, BuildkiteError};
use crate::config::Config;
use crate::discord::{DiscordError, Notifier, render};
use crate::jobs::model::now_millis;
use crate::jobs::{BuildRef, Created, Job, JobState, JobStore, RunId, StoreError, Transition};
use crate::result::{FullResult, Outcome};
use crate::submission::Submission;

#[derive(Clone)]
pub struct Dispatcher {
    pub store: Arc<dyn JobStore>,
    pub buildkite: BuildkiteClient,
    pub discord: Notifier,
    pub config: Arc<Config>,
}

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Buildkite refused or failed to create the build; the job is recorded as `failed`.
    #[error("Buildkite did not create the build: {source}")]
    BuildRefused {
        job: Box<Job>,
        source: BuildkiteError,
    },
    /// Buildkite could not be reached to read a finished build; the sweep will retry.
    #[error("Buildkite unavailable: {0}")]
    BuildkiteUnavailable(BuildkiteError),
}

/// What a submission did.
#[derive(Debug)]
pub enum Submitted {
    New(Job),
    /// The run id was known: nothing was created.
    Existing(Job),
}

/// What a webhook event did.
#[derive(Debug, PartialEq, Eq)]
pub enum EventOutcome {
    Advanced(JobState),
    Ignored(&'static str),
}

impl From<BuildkiteError> for DispatchError {
    fn from(e: BuildkiteError) -> Self {
        Self::BuildkiteUnavailable(e)
    }
}

fn build_ref(build: &Build) -> BuildRef {
    BuildRef {
        id: build.id.clone(),
        number: build.number,
        web_url: build.web_url.clone(),
    }
}

impl Dispatcher {
    pub fn new(config: Arc<Config>, store: Arc<dyn JobStore>) -> Result<Self, String> {
        Ok(Self {
            store,
            buildkite: BuildkiteClient::new(&config.buildkite).map_err(|e| e.to_string())?,
            discord: Notifier::new(config.discord.api_url.clone()).map_err(|e| e.to_string())?,
            config,
        })
    }

    fn new_build(&self, sub: &Submission) -> NewBuild {
        let bk = &self.config.buildkite;
        let env = BTreeMap::from([
            ("KERNELBOT_RUN_ID".to_owned(), sub.run_id.to_string()),
            (crate::payload::PAYLOAD_VAR.to_owned(), sub.payload.clone()),
            ("KERNELBOT_QUEUE".to_owned(), sub.queue.clone()),
            ("KERNELBOT_IMAGE".to_owned(), bk.image.clone()),
        ]);
        let meta_data = BTreeMap::from([
            ("run_id".to_owned(), sub.run_id.to_string()),
            ("queue".to_owned(), sub.queue.clone()),
        ]);
        NewBuild {
            commit: bk.commit.clone(),
            branch: bk.branch.clone(),
            message: format!(
                "Kernel eval: {}",
                sub.title.as_deref().unwrap_or(sub.run_id.as_str())
            ),
            env,
            meta_data,
        }
    }

    /// Creates the build. When the answer is lost (timeout, 5xx) the build may exist all the
    /// same: look for it by its run id before calling the submission failed.
    async fn create_build(&self, sub: &Submission) -> Result<Build, BuildkiteError> {
        match self.buildkite.create_build(&self.new_build(sub)).await {
            Err(e @ BuildkiteError::Unavailable(_)) => {
                warn!(error = %e, "build creation unconfirmed; looking the build up");
                match self.buildkite.find_build(sub.run_id.as_str()).await {
                    Ok(Some(build)) => Ok(build),
                    Ok(None) => Err(e),
                    Err(lookup) => {
                        warn!(error = %lookup, "could not look the build up");
                        Err(e)
                    }
                }
            }
            other => other,
        }
    }

    /// Records the job, then creates its build, then posts its Discord message. The record
    /// comes first so a webhook can never arrive for a job we do not know.
    pub async fn submit(&self, sub: Submission) -> Result<Submitted, DispatchError> {
        let span = tracing::info_span!("submit", run_id = %sub.run_id, gpu = %sub.gpu);
        async move {
            let job = Job::new(
                sub.run_id.clone(),
                sub.gpu.clone(),
                sub.queue.clone(),
                sub.title.clone(),
                sub.discord.clone(),
                now_millis(),
            );
            if let Created::Existing(existing) = self.store.create(&job).await? {
                info!(state = %existing.state, "run id already known; nothing created");
                return Ok(Submitted::Existing(*existing));
            }
            let build = match self.create_build(&sub).await {
                Ok(build) => build,
                Err(source) => {
                    warn!(error = %source, "Buildkite did not create the build");
                    let failed = Transition::to(JobState::Failed, now_millis())
                        .with_failure(source.to_string());
                    let job = self
                        .store
                        .advance(&job.run_id, &failed)
                        .await?
                        .unwrap_or(job);
                    self.notify(&job, true).await;
                    return Err(DispatchError::BuildRefused {
                        job: Box::new(job),
                        source,
                    });
                }
            };
            info!(build = build.number, "build created");
            let scheduled =
                Transition::to(JobState::Scheduled, now_millis()).with_build(build_ref(&build));
            let job = match self.store.advance(&job.run_id, &scheduled).await {
                Ok(Some(job)) => job,
                // A webhook got there first: it recorded the build too.
                Ok(None) => self.store.get(&job.run_id).await?.unwrap_or(job),
                Err(e) => {
                    // The build exists and its webhooks will move the job along; the caller
                    // still gets its answer.
                    warn!(error = %e, "could not record the build on the job");
                    job.apply(&scheduled).unwrap_or(job)
                }
            };
            self.notify(&job, true).await;
            Ok(Submitted::New(job))
        }
        .instrument(span)
        .await
    }

    /// Handles a verified Buildkite webhook event.
    pub async fn on_build_event(
        &self,
        event: &str,
        build: &Build,
    ) -> Result<EventOutcome, DispatchError> {
        let Some(run_id) = build.run_id().and_then(|r| r.parse::<RunId>().ok()) else {
            return Ok(EventOutcome::Ignored("build is not ours"));
        };
        let span = tracing::info_span!("webhook", run_id = %run_id, event, build = build.number);
        async move {
            let target = match event {
                "build.scheduled" => JobState::Scheduled,
                "build.running" | "build.failing" => JobState::Running,
                "build.finished" => JobState::Finished,
                _ => return Ok(EventOutcome::Ignored("event not handled")),
            };
            let Some(job) = self.store.get(&run_id).await? else {
                info!("no job for this run id");
                return Ok(EventOutcome::Ignored("unknown job"));
            };
            if job.build.as_ref().is_some_and(|b| b.id != build.id) {
                return Ok(EventOutcome::Ignored("event for another build of this run"));
            }
            // Cheap early exit for duplicates; the conditional write below is what decides.
            if target.rank() <= job.state.rank() {
                info!(state = %job.state, "event does not move the job forward");
                return Ok(EventOutcome::Ignored("duplicate or out of order"));
            }
            let mut transition = Transition::to(target, now_millis()).with_build(build_ref(build));
            if target == JobState::Finished {
                transition = transition.with_outcome(self.collect_outcome(build).await?);
            }
            self.advance(&run_id, &transition).await
        }
        .instrument(span)
        .await
    }

    /// Moves a job forward and, if this call won, tells Discord.
    pub async fn advance(
        &self,
        run_id: &RunId,
        t: &Transition,
    ) -> Result<EventOutcome, DispatchError> {
        match self.store.advance(run_id, t).await? {
            Some(job) => {
                info!(state = %job.state, "job moved forward");
                self.notify(&job, job.state.is_terminal()).await;
                Ok(EventOutcome::Advanced(job.state))
            }
            None => Ok(EventOutcome::Ignored("duplicate or out of order")),
        }
    }

    /// Reads a finished build's state and `result.json` and draws the verdict. Only
    /// Buildkite being unreachable is an error (so the sweep can try again later); a missing
    /// or unreadable result is part of the outcome.
    pub async fn collect_outcome(&self, hint: &Build) -> Result<Outcome, DispatchError> {
        // Webhook payloads can lag the build; the API's view is authoritative.
        let build = match self.buildkite.get_build(hint.number).await {
            Ok(b) => b,
            Err(e @ (BuildkiteError::Unavailable(_) | BuildkiteError::RateLimited)) => {
                return Err(e.into());
            }
            Err(e) => {
                warn!(error = %e, "could not re-read the build; using the webhook's view");
                hint.clone()
            }
        };
        self.outcome_of(&build).await
    }

    /// The outcome of a build as the REST API shows it (with its jobs).
    async fn outcome_of(&self, build: &Build) -> Result<Outcome, DispatchError> {
        let state = build.final_state().to_owned();
        let (result, error) = match self.fetch_result(build).await {
            Ok(r) => (Some(r), None),
            Err(FetchError::Buildkite(
                e @ (BuildkiteError::Unavailable(_) | BuildkiteError::RateLimited),
            )) => {
                return Err(e.into());
            }
            Err(e) => {
                info!(error = %e, "no usable result.json");
                (None, Some(e.to_string()))
            }
        };
        Ok(Outcome::judge(&state, result, error))
    }

    async fn fetch_result(&self, build: &Build) -> Result<FullResult, FetchError> {
        let artifacts = self.buildkite.list_artifacts(build.number).await?;
        let artifact = pick_result(build, &artifacts).ok_or(FetchError::Missing)?;
        let bytes = self
            .buildkite
            .download_artifact(build.number, artifact)
            .await?;
        FullResult::parse(&bytes).map_err(|e| FetchError::Unreadable(e.to_string()))
    }

    /// Shows the job's current state in its Discord message. Discord trouble never fails
    /// the job: it is logged, and a deleted webhook is recorded so it is not used again.
    ///
    /// Without a message id yet, only `may_post` callers post: submit (which creates the
    /// message) and final reports (so a result is never lost).
    pub async fn notify(&self, job: &Job, may_post: bool) {
        let Some(target) = job.discord.as_ref().filter(|_| !job.discord_gone) else {
            return;
        };
        let message = render(job);
        let result = match &job.discord_message_id {
            Some(id) => self.discord.edit(target, id, &message).await,
            None if may_post => match self.discord.post(target, &message).await {
                Ok(id) => self.record_message(job, id).await,
                Err(e) => Err(e),
            },
            None => {
                info!("no Discord message yet; submit will show the latest state");
                Ok(())
            }
        };
        match result {
            Ok(()) => {}
            Err(DiscordError::Gone) => {
                warn!("Discord webhook is gone; it will not be used again");
                if let Err(e) = self.store.mark_discord_gone(&job.run_id).await {
                    warn!(error = %e, "could not record that the Discord webhook is gone");
                }
            }
            Err(e) => warn!(error = %e, "Discord update failed"),
        }
    }

    /// Keeps a new message's id, then catches up with anything that happened while it was
    /// being posted (an event that found no message to edit).
    async fn record_message(&self, shown: &Job, id: String) -> Result<(), DiscordError> {
        // The update answers with the job as it is now: no second read needed.
        let latest = match self.store.set_discord_message(&shown.run_id, &id).await {
            Ok(Some(latest)) => latest,
            Ok(None) => {
                warn!("job already had a Discord message; a second one was posted");
                return Ok(());
            }
            Err(e) => {
                warn!(error = %e, "could not record the Discord message id");
                return Ok(());
            }
        };
        if latest.state.rank() > shown.state.rank()
            && let Some(target) = latest.discord.as_ref()
        {
            return self.discord.edit(target, &id, &render(&latest)).await;
        }
        Ok(())
    }

    /// Finishes what webhooks left undone: every unfinished job older than `min_age` is
    /// checked against Buildkite and moved forward as its build is. One job's trouble is
    /// counted and logged; it does not stop the pass.
    pub async fn sweep(&self, min_age: Duration) -> Result<SweepReport, DispatchError> {
        let cutoff = now_millis() - min_age.as_millis() as i64;
        let mut report = SweepReport::default();
        for job in self.store.list_open(cutoff, SWEEP_BATCH).await? {
            report.checked += 1;
            let span = tracing::info_span!("sweep", run_id = %job.run_id, state = %job.state);
            match self.sweep_one(&job).instrument(span).await {
                Ok(EventOutcome::Advanced(JobState::Finished)) => report.finished += 1,
                Ok(EventOutcome::Advanced(JobState::Failed)) => report.failed += 1,
                Ok(EventOutcome::Advanced(_)) => report.advanced += 1,
                Ok(EventOutcome::Ignored(_)) => report.unchanged += 1,
                Err(e) => {
                    warn!(run_id = %job.run_id, error = %e, "sweep could not check the job");
                    report.errors += 1;
                }
            }
        }
        Ok(report)
    }

    async fn sweep_one(&self, job: &Job) -> Result<EventOutcome, DispatchError> {
        let build = match &job.build {
            Some(b) => match self.buildkite.get_build(b.number).await {
                Ok(build) => build,
                // Deleted (or its pipeline was): it will never finish, so the job ends here
                // rather than being checked on every pass.
                Err(BuildkiteError::Rejected { status: 404, .. }) => {
                    let outcome = Outcome {
                        build_state: "unknown".into(),
                        verdict: crate::result::Verdict::Failed,
                        error: Some("the build no longer exists in Buildkite".into()),
                        result: None,
                    };
                    let t = Transition::to(JobState::Finished, now_millis()).with_outcome(outcome);
                    return self.advance(&job.run_id, &t).await;
                }
                Err(e) => return Err(e.into()),
            },
            None => match self.buildkite.find_build(job.run_id.as_str()).await? {
                Some(b) => b,
                None => {
                    // Submit stopped between recording the job and creating its build.
                    let t = Transition::to(JobState::Failed, now_millis())
                        .with_failure("no Buildkite build was created for this job");
                    return self.advance(&job.run_id, &t).await;
                }
            },
        };
        let target = state_of(&build);
        if target.rank() <= job.state.rank() {
            return Ok(EventOutcome::Ignored("build has not moved on"));
        }
        let mut t = Transition::to(target, now_millis()).with_build(build_ref(&build));
        if target == JobState::Finished {
            t = t.with_outcome(self.outcome_of(&build).await?);
        }
        self.advance(&job.run_id, &t).await
    }
}

/// How many unfinished jobs one sweep pass looks at.
pub const SWEEP_BATCH: usize = 200;

/// What one sweep pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SweepReport {
    pub checked: usize,
    pub finished: usize,
    pub failed: usize,
    pub advanced: usize,
    pub unchanged: usize,
    pub errors: usize,
}

impl std::fmt::Display for SweepReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sweep: checked {} unfinished jobs: {} finished, {} failed, {} advanced, {} unchanged, {} errors",
            self.checked, self.finished, self.failed, self.advanced, self.unchanged, self.errors
        )
    }
}

/// The job state a build's REST state corresponds to.
pub fn state_of(build: &Build) -> JobState {
    if build.is_finished() {
        JobState::Finished
    } else if matches!(build.state.as_str(), "running" | "failing" | "canceling") {
        JobState::Running
    } else {
        JobState::Scheduled
    }
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
