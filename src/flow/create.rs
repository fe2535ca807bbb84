//! Creating a job's build: the first try at submit, and the tries the sweep makes for a
//! create that was deferred (a rate limit, an answer lost, a function stopped). A create
//! whose answer was lost may have made the build: it is looked up before another is made,
//! so a run never gets two builds.

use std::collections::BTreeMap;

use tracing::{info, warn};

use super::advance::{EventOutcome, advance, build_ref};
use super::deferred::{self, Work};
use super::effects::Effects;
use super::rules::creation::{CreateMiss, claim_creation, defer_creation};
use super::stop::stop_build;
use super::{Deps, DispatchError};
use crate::buildkite::{Build, BuildkiteError, NewBuild};
use crate::jobs::{Creation, Job, JobState, Transition, Updated, View, update_seen};
use crate::retry::Deadline;

/// How one try at creating a job's build ended.
pub(crate) enum Creating {
    Created(Build),
    Deferred(CreateMiss),
    Refused(BuildkiteError),
}

/// What a deferred create tried, as the sweep counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tried {
    /// The build was created.
    Created,
    /// The create was deferred again.
    Deferred,
    /// No create was made (not due, looked up, or the job ended).
    Nothing,
}

fn new_build(d: &Deps, job: &Job, payload: &str) -> NewBuild {
    let bk = &d.config.buildkite;
    let env = BTreeMap::from([
        ("KERNELBOT_RUN_ID".to_owned(), job.run_id.to_string()),
        (crate::payload::PAYLOAD_VAR.to_owned(), payload.to_owned()),
        ("KERNELBOT_QUEUE".to_owned(), job.queue.to_string()),
        ("KERNELBOT_IMAGE".to_owned(), bk.image.clone()),
    ]);
    let meta_data = BTreeMap::from([
        ("run_id".to_owned(), job.run_id.to_string()),
        ("queue".to_owned(), job.queue.to_string()),
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
pub(crate) async fn try_create(d: &Deps, job: &Job, payload: &str, deadline: Deadline) -> Creating {
    let build = new_build(d, job, payload);
    match d.buildkite.create_build(&build, deadline).await {
        Ok(build) => Creating::Created(build),
        Err(BuildkiteError::RateLimited { reset }) => Creating::Deferred(CreateMiss::RateLimited {
            reset_ms: reset.map_or(60_000, |r| r.as_millis() as i64),
        }),
        // Not sent at all (the pass's budget, no connection, no time): nothing to look up.
        Err(BuildkiteError::OverBudget) => Creating::Deferred(CreateMiss::NotSent),
        Err(e @ BuildkiteError::Unavailable(_)) => {
            warn!(error = %e, "build not created; deferred");
            Creating::Deferred(CreateMiss::NotSent)
        }
        Err(e @ (BuildkiteError::Unconfirmed(_) | BuildkiteError::Protocol(_))) => {
            warn!(error = %e, "build creation unconfirmed; looking the build up");
            match d.buildkite.find_build(job.run_id.as_str(), deadline).await {
                Ok(Some(build)) => Creating::Created(build),
                Ok(None) | Err(_) => Creating::Deferred(CreateMiss::Unconfirmed),
            }
        }
        Err(e) => Creating::Refused(e),
    }
}

/// Records what a create try did (`earlier_unconfirmed`: a create before it may have made a
/// build); returns the job as it is then, as this write (or the read that declined it) left
/// it (a job it failed owes its report to `effects`).
pub(crate) async fn settle_creation(
    d: &Deps,
    job: &Job,
    (creating, earlier_unconfirmed): (Creating, bool),
    deadline: Deadline,
    effects: &mut Effects,
) -> Result<Job, DispatchError> {
    let now = d.clock.now();
    let written = match creating {
        Creating::Created(build) => record_build(d, job, &build, deadline).await?,
        Creating::Deferred(miss) => {
            if let CreateMiss::RateLimited { reset_ms } = miss {
                // Taken up by the next webhook whose window has room, not only the sweep.
                deferred::note(d, job, Work::Create, now.saturating_add(reset_ms)).await;
            }
            let miss = (miss, earlier_unconfirmed);
            update_seen(d.store.as_ref(), job, |j| defer_creation(j, miss, now)).await?
        }
        Creating::Refused(source) => return Err(refused(d, job, source, effects).await),
    };
    Ok(written.job().unwrap_or_else(|| job.clone()))
}

/// Records a build made for `job`. A webhook may have recorded it (and more) first: that is
/// kept. A job canceled meanwhile, or given another build (a lookup raced a create), gets
/// this build canceled: it must not take a GPU.
async fn record_build(
    d: &Deps,
    job: &Job,
    build: &Build,
    deadline: Deadline,
) -> Result<Updated, DispatchError> {
    info!(build = build.number, "build created");
    let t = Transition::to(JobState::Scheduled, d.clock.now()).with_build(build_ref(build));
    let written = update_seen(d.store.as_ref(), job, |j| j.apply(&t)).await?;
    if let Updated::Unchanged(j) = &written
        && (j.cancel_requested || j.build.is_some())
        && j.build.as_ref().is_none_or(|b| b.id != build.id)
    {
        stop_build(d, build.number, deadline).await;
    }
    Ok(written)
}

/// Buildkite refused the build: the job fails, its report is owed to `effects`, and the
/// refusal is returned. (Its slot is not freed: the sweep's next release covers it.)
async fn refused(
    d: &Deps,
    job: &Job,
    source: BuildkiteError,
    effects: &mut Effects,
) -> DispatchError {
    warn!(error = %source, "Buildkite refused the build");
    // The report names the status only; Buildkite's own text is in the log line above.
    let reason = match source.refused_with() {
        Some(status) => format!("Buildkite refused the build (HTTP {status})"),
        None => source.public(),
    };
    let t = Transition::to(JobState::Failed, d.clock.now()).with_failure(reason);
    let (job, view) = match update_seen(d.store.as_ref(), job, |j| j.apply(&t)).await {
        Ok(written) => written
            .job()
            .map_or((job.clone(), View::Earlier), |j| (j, View::Own)),
        Err(e) => return e.into(),
    };
    effects.deliver(job.clone(), view);
    DispatchError::BuildRefused {
        job: Box::new(job),
        source,
    }
}

/// A job without a build, seen by the sweep: failed past its queue deadline (after a last
/// lookup when a create may have landed; left to `effects`), else its build created if
/// that is due.
pub(crate) async fn create_deferred(
    d: &Deps,
    job: &Job,
    deadline: Deadline,
    effects: &mut Effects,
) -> Result<(EventOutcome, Tried), DispatchError> {
    let now = d.clock.now();
    // A background job waits for an idle GPU by design: only the job's maximum age ends it.
    let queue_timeout = match job.max_queue_secs {
        _ if job.background && job.waiting => d.config.timing.job_max_age.as_millis() as i64,
        Some(secs) => secs as i64 * 1000,
        None => d.config.timing.queue_timeout.as_millis() as i64,
    };
    if job.creation.is_none() || now - job.created_at >= queue_timeout {
        return Ok((too_late(d, job, deadline, effects).await?, Tried::Nothing));
    }
    create_if_due(d, job, deadline, effects).await
}

/// Creates the build of a job without one, if its creation is due (and not held or waiting):
/// claimed by compare-and-swap first, so it is made once whoever else tries. What the job
/// owes then is left to `effects`.
pub(crate) async fn create_if_due(
    d: &Deps,
    job: &Job,
    deadline: Deadline,
    effects: &mut Effects,
) -> Result<(EventOutcome, Tried), DispatchError> {
    let now = d.clock.now();
    if d.buildkite.over_budget() {
        let why = "no Buildkite calls left in this pass";
        return Ok((EventOutcome::Ignored(why), Tried::Nothing));
    }
    let mut was = None;
    let claimed = update_seen(d.store.as_ref(), job, |j| {
        let (next, creation) = claim_creation(j, now)?;
        was = Some(creation);
        Some(next)
    })
    .await?;
    let (Updated::Written(held), Some(was)) = (claimed, was) else {
        return Ok((EventOutcome::Ignored("creation not due"), Tried::Nothing));
    };
    create_claimed(d, &held, &was, deadline, effects).await
}

/// A job past its queue deadline with no build: a create whose answer was lost may have
/// made one after all, so it is looked up first; else the job fails.
async fn too_late(
    d: &Deps,
    job: &Job,
    deadline: Deadline,
    effects: &mut Effects,
) -> Result<EventOutcome, DispatchError> {
    // A job that waited its turn never had a create sent: nothing to look up.
    if !job.waiting
        && job.creation.as_ref().is_none_or(|c| c.look_up_first)
        && let Some(build) = d
            .buildkite
            .find_build(job.run_id.as_str(), d.buildkite_deadline(deadline))
            .await?
    {
        return adopt(d, job, build, deadline, effects).await;
    }
    let why = if job.waiting && job.background {
        "a background job, it waited for an idle GPU with nothing else waiting, and none came \
         before the job's maximum age"
    } else if job.waiting {
        "it waited for its turn past the queue deadline: the queue's GPUs went by share and its \
         turn did not come"
    } else {
        "no Buildkite build could be created in time"
    };
    let t = Transition::to(JobState::Failed, d.clock.now()).with_failure(why);
    // `apply` fails only a job still without a build, as stored now.
    advance(d, job, t, effects).await
}

/// The create of a job this sweep holds (`was`: its creation as claimed).
async fn create_claimed(
    d: &Deps,
    held: &Job,
    was: &Creation,
    deadline: Deadline,
    effects: &mut Effects,
) -> Result<(EventOutcome, Tried), DispatchError> {
    if was.look_up_first
        && let Some(build) = d
            .buildkite
            .find_build(held.run_id.as_str(), deadline)
            .await?
    {
        info!(
            build = build.number,
            "found the build of an unconfirmed create"
        );
        return Ok((
            adopt(d, held, build, deadline, effects).await?,
            Tried::Nothing,
        ));
    }
    let bk_deadline = d.buildkite_deadline(deadline);
    let creating = match try_create(d, held, &was.payload, bk_deadline).await {
        // The pipeline or token is wrong, not this job: change nothing, fail the pass.
        Creating::Refused(e) if e.is_misconfiguration() => return Err(DispatchError::Pipeline(e)),
        other => other,
    };
    let created = matches!(creating, Creating::Created(_));
    let creating = (creating, was.look_up_first);
    let after = settle_creation(d, held, creating, deadline, effects).await?;
    let tried = match after.state {
        _ if created => Tried::Created,
        JobState::Submitted => Tried::Deferred,
        _ => Tried::Nothing,
    };
    effects.deliver(after.clone(), View::Own);
    let outcome = if after.state == held.state {
        EventOutcome::Ignored("creation deferred")
    } else {
        EventOutcome::Advanced(after.state)
    };
    Ok((outcome, tried))
}

/// Takes a build found by its run id as the job's, as a create's answer would be (a job
/// canceled or given another build meanwhile gets it canceled instead).
async fn adopt(
    d: &Deps,
    job: &Job,
    build: Build,
    deadline: Deadline,
    effects: &mut Effects,
) -> Result<EventOutcome, DispatchError> {
    let before = job.state;
    let created = (Creating::Created(build), false);
    let after = settle_creation(d, job, created, deadline, effects).await?;
    effects.deliver(after.clone(), View::Own);
    Ok(if after.state == before {
        EventOutcome::Ignored("build found; the job had moved on")
    } else {
        EventOutcome::Advanced(after.state)
    })
}
