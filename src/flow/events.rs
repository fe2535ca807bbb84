//! Events: a signed Buildkite webhook moves its job forward. The raw body is verified
//! before anything parses it; the signed body's event decides, never the unsigned header.

use tracing::{Instrument, info, warn};

use super::advance::{advance, build_ref};
use super::deferred::{self, Work};
use super::effects::Effects;
use super::keys::Keys;
use super::outcome::read_outcome;
use super::rules::signal::{Signal, progress_of, signal_of};
use super::stop::stop_build;
use super::{Deps, DispatchError, catch_up, fleet, ridden, settle};
use crate::buildkite::{Build, VerifyError, WebhookEvent};
use crate::jobs::{Job, JobState, RunId, Transition, View};
use crate::retry::Deadline;

pub use super::advance::EventOutcome;

/// What a webhook request's headers claim, each `None` where absent. No `Debug`: the token
/// is the webhook secret itself where the token mode is allowed.
pub(crate) struct Claimed {
    /// `X-Buildkite-Signature`.
    pub(crate) signature: Option<String>,
    /// `X-Buildkite-Token` (accepted only where the deployment allows it).
    pub(crate) token: Option<String>,
    /// `X-Buildkite-Event`: not signed, so it must agree with the body.
    pub(crate) event: Option<String>,
}

/// Why a webhook request was not acted on.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WebhookError {
    /// The signature (or token) is missing, wrong or stale.
    #[error("unauthorized")]
    Unauthorized(#[source] VerifyError),
    #[error("webhook body is not a Buildkite event: {0}")]
    NotAnEvent(#[source] serde_json::Error),
    /// A signed body replayed under another `X-Buildkite-Event`.
    #[error("X-Buildkite-Event {claimed:?} does not match the signed body's event {signed:?}")]
    EventMismatch { claimed: String, signed: String },
    #[error(transparent)]
    Dispatch(#[from] DispatchError),
}

/// At most 64 characters of what a request claimed, for an error to quote.
fn quoted(text: &str) -> String {
    text.chars().take(64).collect()
}

/// Verifies a webhook request (what its headers claim, and its raw body) at `now` (Unix
/// seconds), then acts on its event.
pub(crate) async fn receive(
    d: &Deps,
    claimed: &Claimed,
    body: &[u8],
    now: i64,
    deadline: Deadline,
) -> Result<EventOutcome, WebhookError> {
    let (signature, token) = (claimed.signature.as_deref(), claimed.token.as_deref());
    // A key this instance does not hold may be the rotation's new one: read them again.
    let verify = |k: &Keys| k.webhook.verify(signature, token, body, now);
    let unknown = |e: &VerifyError| matches!(e, VerifyError::Mismatch | VerifyError::BadToken);
    d.keys
        .check(d.clock.now(), verify, unknown)
        .await
        .map_err(|e| {
            warn!(reason = %e, "webhook rejected");
            WebhookError::Unauthorized(e)
        })?;
    let event: WebhookEvent = serde_json::from_slice(body).map_err(WebhookError::NotAnEvent)?;
    if let Some(header) = claimed.event.as_deref().filter(|h| *h != event.event) {
        warn!(header, body = %event.event, "event header disagrees with the signed body");
        return Err(WebhookError::EventMismatch {
            claimed: quoted(header),
            signed: quoted(&event.event),
        });
    }
    Ok(on_event(d, &event, deadline).await?)
}

/// Handles a verified Buildkite webhook event.
pub(crate) async fn on_event(
    d: &Deps,
    event: &WebhookEvent,
    deadline: Deadline,
) -> Result<EventOutcome, DispatchError> {
    if event.event.starts_with("agent.") {
        let Some(agent) = &event.agent else {
            return Ok(EventOutcome::Ignored("an agent event without its agent"));
        };
        let ours = fleet::on_agent_event(d, &event.event, agent).await?;
        return Ok(if ours {
            EventOutcome::AgentNoted
        } else {
            EventOutcome::Foreign
        });
    }
    let target = match signal_of(&event.event, event.job.as_ref()) {
        Signal::Ignore(why) => return Ok(EventOutcome::Ignored(why)),
        Signal::Scheduled => Some(JobState::Scheduled),
        Signal::Running => Some(JobState::Running),
        Signal::Finished => Some(JobState::Finished),
        Signal::TryEnded => None,
    };
    let ours = &d.config.buildkite.pipeline;
    // Buildkite names the pipeline in every build and job event: one that names none is no
    // event of ours either.
    if event.pipeline.as_ref().is_none_or(|p| p.slug != *ours) {
        info!(event = %event.event, "an event of another pipeline");
        return Ok(EventOutcome::Foreign);
    }
    let Some(build) = &event.build else {
        return Ok(EventOutcome::Ignored("no build in the event"));
    };
    let Some(run_id) = build.run_id().and_then(|r| r.parse::<RunId>().ok()) else {
        return Ok(EventOutcome::Ignored("build is not ours"));
    };
    let span = tracing::info_span!("webhook", %run_id, event = %event.event, build = build.number);
    match (target, &event.job) {
        (Some(target), _) => {
            on_build_signal(d, &run_id, target, build, deadline)
                .instrument(span)
                .await
        }
        (None, Some(try_job)) => {
            ridden::note_try(d, &run_id, build, try_job)
                .instrument(span)
                .await
        }
        (None, None) => Ok(EventOutcome::Ignored("a job event without its job")),
    }
}

async fn on_build_signal(
    d: &Deps,
    run_id: &RunId,
    target: JobState,
    build: &Build,
    deadline: Deadline,
) -> Result<EventOutcome, DispatchError> {
    let Some(job) = d.store.get(run_id).await? else {
        info!("no job for this run id");
        return Ok(EventOutcome::Ignored("unknown job"));
    };
    let mut effects = Effects::default();
    let result = on_job_signal(d, job.clone(), target, build, deadline, &mut effects).await;
    let result = settle::settle_after(d, effects, deadline, result).await;
    if target == JobState::Finished && result.as_ref().is_err_and(deferred::rate_limited) {
        deferred::note(d, &job, Work::Finish, 0).await;
    }
    // Events come every few seconds in a rush: each takes up what the rate limit deferred,
    // each job one of those ends settled before the next is taken up.
    if let Some(mut batch) = catch_up::Batch::take(d, &job.queue, false).await {
        loop {
            let mut effects = Effects::default();
            let more = batch.do_next(d, deadline, &mut effects).await;
            if let Err(e) = settle::settle(d, effects, deadline).await {
                warn!(error = %e, "a message of deferred work is left to the sweep");
            }
            if !more {
                break;
            }
        }
        batch.put_back(d).await;
    }
    result
}

async fn on_job_signal(
    d: &Deps,
    job: Job,
    target: JobState,
    build: &Build,
    deadline: Deadline,
    effects: &mut Effects,
) -> Result<EventOutcome, DispatchError> {
    // A second build of one run (a create whose answer was lost, then made again, or a
    // rebuild), or the build of a job that ended before it had one (canceled, or given
    // up in the queue): nobody reads its result, so it must not hold a GPU.
    let stray = job.build.as_ref().is_some_and(|b| b.id != build.id)
        || (job.build.is_none() && job.state.is_terminal());
    if stray {
        if target != JobState::Finished {
            stop_build(d, build.number, d.buildkite_deadline(deadline)).await;
        }
        return Ok(EventOutcome::Ignored("a build this job does not use"));
    }
    // Cheap early exit for duplicates; the conditional write is what decides.
    if target.rank() <= job.state.rank() {
        if job.owes_delivery() {
            // As read just now, by this event.
            effects.deliver(job, View::Own);
        }
        return Ok(EventOutcome::Ignored("duplicate or out of order"));
    }
    let mut t = Transition::to(target, d.clock.now()).with_build(build_ref(build));
    if target == JobState::Finished
        && let Ok(outcome) = ridden::outcome_of(d, &job, build)
    {
        return advance(d, &job, t.with_outcome(outcome), effects).await;
    }
    if target == JobState::Finished {
        // Webhook payloads can lag the build; the API's view decides, and only a
        // terminal state finishes a job. The build and its artifacts are read side by side:
        // neither needs the other, and the report is a round trip sooner.
        let bk_deadline = d.buildkite_deadline(deadline);
        let (current, artifacts) = tokio::join!(
            d.buildkite.get_build(build.number, bk_deadline),
            d.buildkite.list_artifacts(build.number, bk_deadline)
        );
        let current = current?;
        if current.id != build.id {
            return Ok(EventOutcome::Ignored(
                "the event's build is not the one read back",
            ));
        }
        if progress_of(&current) != JobState::Finished {
            return Ok(EventOutcome::Ignored("build has not finished"));
        }
        let read = read_outcome(d, &job, &current, Some(artifacts), bk_deadline).await?;
        // None: it ended meanwhile; the transition changes nothing, and what it owes is sent.
        if let Some(read) = read {
            t = t.with_outcome(read.outcome?);
            return advance(d, &read.job, t, effects).await;
        }
    }
    advance(d, &job, t, effects).await
}
