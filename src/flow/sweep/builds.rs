//! The sweep's Buildkite work: deferred creates, then the builds of open jobs due for a
//! look, read from two listings (live builds, ended builds) rather than a GET each, in
//! bookmark order as far as the pass's call budget goes.

use std::collections::{BTreeSet, HashMap, HashSet};

use tracing::warn;

use super::super::advance::EventOutcome;
use super::super::create::{Tried, create_deferred};
use super::super::deferred;
use super::super::effects::Effects;
use super::super::follow::{PipelineSeen, follow, look_at_build, overdue_now};
use super::super::{Deps, DispatchError, settle::settle_after};
use super::PASS_RESERVE;
use super::order::{bookmark, rotate_to};
use super::report::SweepReport;
use crate::buildkite::{Build, BuildkiteError, TERMINAL_STATES};
use crate::jobs::{Cursor, Job, Listed, Queue, RunId, StoreError};
use crate::retry::Deadline;

/// Pages one listing reads at most; builds below them are read one by one, in bookmark
/// order, as the budget allows.
const LISTING_PAGES: usize = 10;

/// Build states in which a build may still change.
const LIVE_STATES: &[&str] = &[
    "creating",
    "scheduled",
    "running",
    "failing",
    "canceling",
    "waiting",
    "waiting_failed",
];

fn number(job: &Listed) -> u64 {
    job.build.as_ref().map_or(0, |b| b.number)
}

/// The job a listing showed, read whole to act on; `None` to pass it by: it has ended or
/// gone since, or its record cannot be read (counted: one such job does not stop the pass).
async fn read_open(
    d: &Deps,
    listed: &Listed,
    report: &mut SweepReport,
) -> Result<Option<Job>, DispatchError> {
    match d.store.get(&listed.run_id).await {
        Ok(job) => Ok(job.filter(|j| !j.state.is_terminal())),
        Err(e @ StoreError::Corrupt(_)) => {
            warn!(run_id = %listed.run_id, error = %e, "sweep cannot read the job");
            report.errors += 1;
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Deferred creates, then the builds of open jobs due for a look.
pub(super) async fn buildkite_work(
    d: &Deps,
    open: &[Listed],
    deadline: Deadline,
    report: &mut SweepReport,
) -> Result<(), DispatchError> {
    let now = d.clock.now();
    let min_age = d.config.timing.sweep_min_age.as_millis() as i64;
    let mut pipeline = PipelineSeen::default();
    for listed in open.iter().filter(|j| j.build.is_none()) {
        if deadline.remaining() < PASS_RESERVE {
            return Ok(());
        }
        if let Some(job) = read_open(d, listed, report).await? {
            sweep_open(d, &job, false, &mut pipeline, deadline, report).await?;
        }
    }
    // Deadlines, cancels and finishes the rate limit deferred are handled whatever the
    // job's age.
    let deferred = deferred_finishes(d, open).await;
    let due: Vec<&Listed> = open
        .iter()
        .filter(|j| j.build.is_some())
        .filter(|j| {
            j.created_at <= now - min_age
                || j.cancel_requested
                || overdue_now(d, j.timeline()).is_some()
                || deferred.contains(&j.run_id)
        })
        .collect();
    follow_builds(d, &due, &mut pipeline, deadline, report).await
}

/// The open jobs' finishes that Buildkite's rate limit deferred, from their queues' lists
/// (one that cannot be read is logged: its jobs wait for their age).
async fn deferred_finishes(d: &Deps, open: &[Listed]) -> HashSet<RunId> {
    let queues: BTreeSet<&Queue> = open.iter().map(|j| &j.queue).collect();
    let mut out = HashSet::new();
    for queue in queues {
        match deferred::finishes(d, queue).await {
            Ok(list) => out.extend(list),
            Err(e) => warn!(error = %e, %queue, "deferred finishes wait for their age"),
        }
    }
    out
}

/// One open job: create its build if that is due, else (`check_build`) follow its build.
pub(super) async fn sweep_open(
    d: &Deps,
    job: &Job,
    check_build: bool,
    pipeline: &mut PipelineSeen,
    deadline: Deadline,
    report: &mut SweepReport,
) -> Result<(), DispatchError> {
    let mut effects = Effects::default();
    let result = if job.build.is_none() {
        create_deferred(d, job, deadline, &mut effects)
            .await
            .map(|(outcome, tried)| {
                match tried {
                    Tried::Created => report.created += 1,
                    Tried::Deferred => report.deferred += 1,
                    Tried::Nothing => {}
                }
                outcome
            })
    } else if check_build {
        report.checked += 1;
        look_at_build(d, job, pipeline, deadline, &mut effects).await
    } else {
        return Ok(());
    };
    let result = settle_after(d, effects, deadline, result).await;
    count(job, result, report)?;
    Ok(())
}

/// Follows the builds of `due` jobs: live builds from one listing, ended ones from another
/// (and a GET for any in neither).
async fn follow_builds(
    d: &Deps,
    due: &[&Listed],
    pipeline: &mut PipelineSeen,
    deadline: Deadline,
    report: &mut SweepReport,
) -> Result<(), DispatchError> {
    let Some(lowest) = due.iter().map(|j| number(j)).min() else {
        return Ok(());
    };
    let bk_deadline = d.buildkite_deadline(deadline);
    let listed = listing(d, LIVE_STATES, lowest, bk_deadline, pipeline, report).await?;
    let Some(live) = listed else {
        return Ok(());
    };
    let (listed, ended): (Vec<&Listed>, Vec<&Listed>) =
        due.iter().partition(|j| live.contains_key(&number(j)));
    for listed in listed {
        if deadline.remaining() < PASS_RESERVE {
            return Ok(());
        }
        let Some(job) = read_open(d, listed, report).await? else {
            continue;
        };
        report.checked += 1;
        let mut effects = Effects::default();
        let result = follow(d, &job, &live[&number(listed)], deadline, &mut effects).await;
        let result = settle_after(d, effects, deadline, result).await;
        if !count(&job, result, report)? {
            return Ok(());
        }
    }
    follow_ended(d, ended, pipeline, deadline, report).await
}

/// Follows the builds no live listing showed, from the bookmark the last pass left; where
/// the budget runs out, the bookmark is left for the next pass, so every job is reached.
/// The bookmark moves past each job before its work begins: a job whose work kills the pass
/// holds back no other.
async fn follow_ended(
    d: &Deps,
    ended: Vec<&Listed>,
    pipeline: &mut PipelineSeen,
    deadline: Deadline,
    report: &mut SweepReport,
) -> Result<(), DispatchError> {
    let ended = bookmark_order(d, ended).await?;
    let Some(lowest) = ended.iter().map(|j| number(j)).min() else {
        return set_cursor(d, None).await;
    };
    let bk_deadline = d.buildkite_deadline(deadline);
    let listed = listing(d, TERMINAL_STATES, lowest, bk_deadline, pipeline, report).await?;
    let Some(done) = listed else {
        return Ok(());
    };
    for (i, listed) in ended.iter().enumerate() {
        if deadline.remaining() < PASS_RESERVE || d.buildkite.over_budget() {
            return set_cursor(d, Some(&bookmark(listed))).await;
        }
        let Some(job) = read_open(d, listed, report).await? else {
            continue;
        };
        // Saved before the job's result is read: should the pass die on it, the next one
        // goes on past it and comes round to it last.
        let past = ended[(i + 1) % ended.len()];
        set_cursor(d, Some(&bookmark(past))).await?;
        report.checked += 1;
        let mut effects = Effects::default();
        let result = match done.get(&number(listed)) {
            Some(build) => follow(d, &job, build, deadline, &mut effects).await,
            None => look_at_build(d, &job, pipeline, deadline, &mut effects).await,
        };
        let result = settle_after(d, effects, deadline, result).await;
        if !count(&job, result, report)? {
            return set_cursor(d, Some(&bookmark(listed))).await;
        }
    }
    set_cursor(d, None).await
}

async fn set_cursor(d: &Deps, cursor: Option<&str>) -> Result<(), DispatchError> {
    Ok(d.store.set_cursor(Cursor::Builds, cursor).await?)
}

/// One listing of the pipeline's builds in `states` down to build `lowest`, by number;
/// `None` when the budget or Buildkite stops the pass's Buildkite work.
async fn listing(
    d: &Deps,
    states: &[&str],
    lowest: u64,
    deadline: Deadline,
    pipeline: &mut PipelineSeen,
    report: &mut SweepReport,
) -> Result<Option<HashMap<u64, Build>>, DispatchError> {
    match d
        .buildkite
        .list_builds(states, lowest, LISTING_PAGES, deadline)
        .await
    {
        Ok(builds) => {
            pipeline.reached();
            Ok(Some(builds.into_iter().map(|b| (b.number, b)).collect()))
        }
        Err(e) if e.is_misconfiguration() => Err(DispatchError::Pipeline(e)),
        Err(BuildkiteError::OverBudget) => Ok(None),
        Err(e) => {
            warn!(error = %e, "could not list builds; the next pass tries again");
            report.errors += 1;
            Ok(None)
        }
    }
}

/// `jobs` in (creation time, run id) order, starting at the bookmark the last pass left.
async fn bookmark_order<'a>(
    d: &Deps,
    mut jobs: Vec<&'a Listed>,
) -> Result<Vec<&'a Listed>, DispatchError> {
    let mark = d.store.cursor(Cursor::Builds).await?;
    rotate_to(&mut jobs, mark.as_deref());
    Ok(jobs)
}

/// Counts one job's result; `false` when the pass must stop its Buildkite work.
fn count(
    job: &Job,
    result: Result<EventOutcome, DispatchError>,
    report: &mut SweepReport,
) -> Result<bool, DispatchError> {
    match result {
        Ok(outcome) => report.count(&outcome),
        Err(DispatchError::Buildkite(BuildkiteError::OverBudget)) => return Ok(false),
        Err(DispatchError::Buildkite(e)) if e.is_misconfiguration() => {
            return Err(DispatchError::Pipeline(e));
        }
        Err(e @ (DispatchError::Pipeline(_) | DispatchError::Store(_))) => return Err(e),
        Err(e) => {
            warn!(run_id = %job.run_id, error = %e, "sweep could not check the job");
            report.errors += 1;
        }
    }
    Ok(true)
}
