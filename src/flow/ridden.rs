//! The finish path off the quota: each `job.finished` of the evaluation step is noted on its
//! job, and a `build.finished` whose meta-data carries the result ends the job from the
//! event alone (see `rules::riding`): no API call, one round trip (Discord's) to the report.

use tracing::info;

use super::Deps;
use super::DispatchError;
use super::advance::EventOutcome;
use super::profiles;
use super::rules::riding::{Fallback, ride, seen_try, with_try};
use super::rules::tries::tries;
use crate::buildkite::{Build, BuildJob, MAX_ARTIFACT_BYTES};
use crate::jobs::{Job, RunId, Updated, update};
use crate::result::Outcome;
use crate::telemetry::metrics::Unit;

/// Notes `try_job` (a `job.finished` event's job of `build`) on run `run_id`'s job.
pub(crate) async fn note_try(
    d: &Deps,
    run_id: &RunId,
    build: &Build,
    try_job: &BuildJob,
) -> Result<EventOutcome, DispatchError> {
    let seen = seen_try(try_job);
    let updated = update(d.store.as_ref(), run_id, |job| {
        with_try(job, &build.id, &seen)
    })
    .await?;
    Ok(match updated {
        Updated::Written(_) => EventOutcome::TryNoted,
        Updated::Unchanged(_) => EventOutcome::Ignored("a try noted already, or not this job's"),
        Updated::Missing => EventOutcome::Ignored("unknown job"),
    })
}

/// The outcome of `job`'s ended `build` (a `build.finished` event's) when the event tells it
/// all; else why the API must be asked. Counted either way, by path.
pub(crate) fn outcome_of(d: &Deps, job: &Job, build: &Build) -> Result<Outcome, Fallback> {
    let ridden = ride(build, &job.tries_seen, MAX_ARTIFACT_BYTES);
    let path = match &ridden {
        Ok(_) => "event",
        Err(why) => why.name(),
    };
    d.metrics
        .put(&[("Path", path)], &[("FinishesRead", Unit::Count, 1.0)]);
    let ridden = ridden.inspect_err(|why| match why {
        Fallback::Absent | Fallback::Profile | Fallback::NotEnded => {}
        why => info!(reason = %why, "the result in the event is not used; the artifact is read"),
    })?;
    let built = &ridden.build;
    let mut outcome = Outcome::judge(built.final_state(), Some(ridden.result), None)
        .with_timings(built.timings());
    outcome.tries = tries(built, Some(&ridden.job_id), outcome.result.as_ref());
    let links = d.config.profile_links.as_ref();
    Ok(profiles::attach(links, &job.run_id, d.clock.now(), outcome))
}
