//! Moving a job forward: a transition written by compare-and-swap; what it owes (its
//! messages, its slot when it ended) left to the caller's effects.

use tracing::{info, warn};

use super::effects::Effects;
use super::{Deps, DispatchError};
use crate::buildkite::Build;
use crate::jobs::{BuildRef, Job, JobState, StoreError, Transition, Updated, View, update_seen};
use crate::telemetry::metrics::Unit;

/// What an event (a webhook, a sweep's look at a build) did to its job.
#[derive(Debug, PartialEq, Eq)]
pub enum EventOutcome {
    Advanced(JobState),
    Ignored(&'static str),
    /// An event about another pipeline (the notification service sends every pipeline's, or
    /// a second deployment shares the organization): no job of ours is touched.
    Foreign,
    /// An event about an agent of one of our queues, noted on its record.
    AgentNoted,
    /// A try of the evaluation step ended, noted on its job (see `rules::riding`).
    TryNoted,
}

/// The job's record of `build`.
pub(crate) fn build_ref(build: &Build) -> BuildRef {
    BuildRef {
        id: build.id.clone(),
        number: build.number,
        web_url: build.web_url.clone(),
    }
}

/// Moves a job (`seen` as last read) forward; what that owes is left to `effects` (its
/// messages, and a job it ends frees its slot on the queue). An outcome too large for the store is
/// stored without its result (the verdict stands), never retried as it is.
pub(crate) async fn advance(
    d: &Deps,
    seen: &Job,
    t: Transition,
    effects: &mut Effects,
) -> Result<EventOutcome, DispatchError> {
    let store = d.store.as_ref();
    let written = match update_seen(store, seen, |j| j.apply(&t)).await {
        Err(StoreError::TooLarge) if t.outcome.is_some() => {
            warn!("outcome too large for the store; keeping the verdict only");
            let mut slim = t.clone();
            slim.outcome = t
                .outcome
                .as_ref()
                .map(|o| o.without_result("the result was too large to store").into());
            update_seen(store, seen, |j| j.apply(&slim)).await?
        }
        other => other?,
    };
    match written {
        Updated::Written(job) => {
            info!(state = %job.state, "job moved forward");
            if let Some(outcome) = job.outcome.as_deref() {
                // Jobs by verdict, on the dashboard: counted once, by whoever ended the job.
                let verdict = [("Verdict", outcome.verdict.as_str())];
                d.metrics
                    .put(&verdict, &[("JobsFinished", Unit::Count, 1.0)]);
            }
            // A test or benchmark that ended with its own verdict answers the same code's
            // next submissions; without the note they run, as before.
            if job.state.is_terminal() {
                if let Err(e) = super::reuse::note(d, &job, t.at).await {
                    warn!(error = %e, "the run could not be noted as an answer for its copies");
                }
                // Its user's GPU time: a failure under-counts one run, never blocks its end.
                if let Err(e) = super::budget::note(d, &job, t.at).await {
                    warn!(error = %e, "the run's GPU time could not be noted");
                }
            }
            // The user's report and callback (with the fleet's notes of its tries); then,
            // once they are out, the queue's waiting jobs.
            let state = job.state;
            if state.is_terminal() {
                effects.ended(job);
            } else {
                effects.deliver(job, View::Own);
            }
            Ok(EventOutcome::Advanced(state))
        }
        // (A change declined only on the job as read.)
        Updated::Unchanged(job) => {
            if job.owes_delivery() {
                effects.deliver(job, View::Own);
            }
            Ok(EventOutcome::Ignored("duplicate or out of order"))
        }
        Updated::Missing => Ok(EventOutcome::Ignored("unknown job")),
    }
}
