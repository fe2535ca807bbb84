//! A finished build's outcome: its final state, and the `result.json` it left, read through
//! the API's 302 to artifact storage, a bounded number of times a job.

use std::collections::BTreeMap;

use tracing::{info, warn};

use super::profiles;
use super::rules::ending::{count_attempt, give_back_attempt, unread_outcome};
use super::rules::tries::tries;
use super::{Deps, DispatchError};
use crate::buildkite::{Artifact, Build, BuildkiteError, beside, pick_result};
use crate::jobs::{Job, RunId, Updated, update_seen};
use crate::result::{ArtifactRef, FullResult, Outcome};
use crate::retry::Deadline;

#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("build has no finished result.json artifact")]
    Missing,
    #[error("result.json could not be read: {0}")]
    Unreadable(#[source] serde_json::Error),
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

    /// The error to try again later on rather than judge the run on a result we could not
    /// read (Buildkite unreachable, or our token may not read artifacts); else this failure,
    /// which becomes part of the outcome.
    fn passing(self) -> Result<BuildkiteError, Self> {
        match self {
            Self::Buildkite(
                e @ (BuildkiteError::Unavailable(_)
                | BuildkiteError::OverBudget
                | BuildkiteError::RateLimited { .. }
                | BuildkiteError::Misconfigured { .. }),
            ) => Ok(e),
            other => Err(other),
        }
    }
}

/// A read of a finished job's outcome, and the job as it was last written.
pub(crate) struct Read {
    pub(crate) job: Job,
    pub(crate) outcome: Result<Outcome, DispatchError>,
}

/// The outcome of `job`'s ended `build` (its artifacts listed already by a caller that read
/// the build beside them, or `None`), read at most `MAX_FINISH_ATTEMPTS` times. Each read
/// is counted on the job before it begins, so one that never comes back (the function
/// crashed or ran out of time on it) still counts, and the job then ends as `error` rather
/// than take down every later try; one that fails in a way to try again is given back.
/// `None`: the job has ended meanwhile, or is gone.
pub(crate) async fn read_outcome(
    d: &Deps,
    job: &Job,
    build: &Build,
    artifacts: Option<Result<Vec<Artifact>, BuildkiteError>>,
    deadline: Deadline,
) -> Result<Option<Read>, DispatchError> {
    let store = d.store.as_ref();
    let job = match update_seen(store, job, count_attempt).await? {
        Updated::Written(job) => job,
        Updated::Unchanged(job) if !job.state.is_terminal() => {
            let attempts = job.finish_attempts;
            warn!(
                attempts,
                "its result's reads never came back; the job ends without one"
            );
            let outcome = unread_outcome(build.final_state()).with_timings(build.timings());
            return Ok(Some(Read {
                job,
                outcome: Ok(outcome),
            }));
        }
        _ => return Ok(None),
    };
    let artifacts = match artifacts {
        Some(listed) => listed,
        None => d.buildkite.list_artifacts(build.number, deadline).await,
    };
    let outcome = outcome_with(d, &job.run_id, build, artifacts, deadline).await;
    if outcome.is_ok() {
        return Ok(Some(Read { job, outcome }));
    }
    let given_back = match update_seen(store, &job, give_back_attempt).await {
        Ok(updated) => updated.job(),
        Err(e) => {
            warn!(error = %e, "the result's read could not be given back");
            None
        }
    };
    Ok(Some(Read {
        job: given_back.unwrap_or(job),
        outcome,
    }))
}

/// The outcome of a finished build as the REST API shows it (with its jobs), from its
/// artifacts' listing. Only Buildkite being unreachable is an error (so the sweep can try
/// again later); a missing or unreadable result is part of the outcome.
async fn outcome_with(
    d: &Deps,
    run_id: &RunId,
    build: &Build,
    artifacts: Result<Vec<Artifact>, BuildkiteError>,
    deadline: Deadline,
) -> Result<Outcome, DispatchError> {
    let state = build.final_state().to_owned();
    let result_job = artifacts
        .as_ref()
        .ok()
        .and_then(|a| pick_result(build, a))
        .map(|a| a.job_id.clone());
    let zips = artifacts
        .as_ref()
        .map(|a| profile_zips(build, a))
        .unwrap_or_default();
    let (result, error) = match fetch_result(d, build, artifacts, deadline)
        .await
        .map_err(FetchError::passing)
    {
        Ok(r) => (Some(r), None),
        Err(Ok(e)) => return Err(e.into()),
        Err(Err(e)) => {
            info!(error = %e, "no usable result.json");
            (None, Some(e.public()))
        }
    };
    let mut outcome = Outcome::judge(&state, result, error).with_timings(build.timings());
    outcome.profile_zips = zips;
    outcome.tries = tries(build, result_job.as_deref(), outcome.result.as_ref());
    let links = d.config.profile_links.as_ref();
    Ok(profiles::attach(links, run_id, d.clock.now(), outcome))
}

/// The profile zips the job that left the build's `result.json` uploaded, by run name.
fn profile_zips(build: &Build, artifacts: &[Artifact]) -> BTreeMap<String, ArtifactRef> {
    let Some(result) = pick_result(build, artifacts) else {
        return BTreeMap::new();
    };
    let zip = |name: &str| {
        let index = name.strip_prefix("profile.")?.strip_suffix(".zip")?;
        index
            .parse::<usize>()
            .ok()
            .filter(|i| i.to_string() == index)
    };
    beside(result, artifacts, |name| zip(name).is_some())
        .into_iter()
        .filter_map(|(name, a)| {
            let run = format!("profile.{}", zip(name)?);
            let at = ArtifactRef {
                job_id: a.job_id.clone(),
                artifact_id: a.id.clone(),
            };
            Some((run, at))
        })
        .collect()
}

async fn fetch_result(
    d: &Deps,
    build: &Build,
    artifacts: Result<Vec<Artifact>, BuildkiteError>,
    deadline: Deadline,
) -> Result<FullResult, FetchError> {
    let artifacts = artifacts?;
    let artifact = pick_result(build, &artifacts).ok_or(FetchError::Missing)?;
    let bytes = d
        .buildkite
        .download_artifact(build.number, artifact, deadline)
        .await?;
    FullResult::parse(&bytes).map_err(FetchError::Unreadable)
}
