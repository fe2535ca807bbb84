//! Work that Buildkite's rate limit deferred, taken up by the next webhook of its queue
//! rather than by the sweep's next pass: in a rush an event comes every few seconds, the
//! sweep every five minutes (and it leaves young jobs to their webhooks), while Buildkite's
//! window resets every minute. A deferred finish or create is noted on its queue's list in
//! the store; any function instance whose window has room takes up to [`MAX_PER_CALL`] of
//! them, finishes first. A create is claimed in the store first ([`create_if_due`]) and a
//! finish is a forward-only write, so whoever takes one up does it once.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::create::{Tried, create_if_due};
use super::follow::{PipelineSeen, look_at_build};
use super::{Deps, DispatchError};
use crate::buildkite::{BuildkiteError, Priority};
use crate::jobs::{CacheEntry, Job, RunId, StoreError};
use crate::retry::Deadline;
use crate::time::Millis;

/// Deferred jobs one call takes up at most.
const MAX_PER_CALL: usize = 4;
/// Below this much of its deadline left, a call takes up nothing more: an item claimed
/// when the function stops is off the list until the sweep finds its job.
const TIME_FLOOR: Duration = Duration::from_secs(10);
/// A queue's list holds this many; past it, the sweep finds the rest on its own.
const MAX_LISTED: usize = 1_000;
const MAX_TRIES: usize = 5;

/// What was deferred for a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Work {
    /// Reading its finished build's result.
    Finish,
    /// Creating its build.
    Create,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Deferred {
    pub(crate) run_id: String,
    pub(crate) work: Work,
    /// The job's user, so that deferred creates are taken up in fair order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) user: Option<String>,
    /// Not before then (the reset Buildkite gave a create): nobody claims it for nothing.
    #[serde(default)]
    pub(crate) not_before: Millis,
}

fn list_key(queue: &str) -> String {
    format!("~deferred/{queue}")
}

fn parse(entry: Option<&CacheEntry>) -> Vec<Deferred> {
    entry
        .and_then(|e| serde_json::from_str(e.value.as_deref()?).ok())
        .unwrap_or_default()
}

/// The next jobs to take up: finishes (a report waits) oldest first, then creates
/// round-robin over users, oldest first within a user (a job without a user is its own).
pub(crate) fn next(list: &[Deferred], now: Millis) -> Vec<Deferred> {
    let due = |w: &&Deferred| w.not_before <= now;
    let mut out: Vec<Deferred> = list
        .iter()
        .filter(due)
        .filter(|w| w.work == Work::Finish)
        .cloned()
        .collect();
    let mut by_user: Vec<(Option<&str>, Vec<&Deferred>)> = Vec::new();
    for w in list.iter().filter(due).filter(|w| w.work == Work::Create) {
        let user = w.user.as_deref();
        match by_user
            .iter_mut()
            .find(|(u, _)| user.is_some() && *u == user)
        {
            Some((_, jobs)) => jobs.push(w),
            None => by_user.push((user, vec![w])),
        }
    }
    let rounds = by_user
        .iter()
        .map(|(_, jobs)| jobs.len())
        .max()
        .unwrap_or(0);
    for round in 0..rounds {
        out.extend(
            by_user
                .iter()
                .filter_map(|(_, jobs)| jobs.get(round))
                .map(|w| (*w).clone()),
        );
    }
    out.truncate(MAX_PER_CALL);
    out
}

/// Changes `queue`'s list by compare-and-swap (again on what another wrote meanwhile).
async fn change(d: &Deps, queue: &str, f: impl Fn(&mut Vec<Deferred>)) -> Result<(), StoreError> {
    let key = list_key(queue);
    for _ in 0..MAX_TRIES {
        let entry = d.store.cached(&key).await?;
        let mut list = parse(entry.as_ref());
        let before = list.clone();
        f(&mut list);
        if list == before {
            return Ok(());
        }
        let version = entry.as_ref().map(|e| e.claimed_at);
        let next = CacheEntry {
            value: Some(serde_json::to_string(&list).map_err(StoreError::corrupt)?),
            fetched_at: d.clock.now(),
            claimed_at: version.unwrap_or(0) + 1,
        };
        if d.store.put_cached(&key, &next, version).await? {
            return Ok(());
        }
    }
    Err(StoreError::unavailable("the deferred list kept changing"))
}

/// Notes `work` for `job` on its queue's list. A note that fails is logged: the sweep still
/// finds the job, later.
pub(crate) async fn note(d: &Deps, job: &Job, work: Work, not_before: Millis) {
    let item = Deferred {
        run_id: job.run_id.to_string(),
        work,
        user: job.user.clone(),
        not_before,
    };
    put(d, &job.queue, std::slice::from_ref(&item), false).await;
}

/// Puts `items` on `queue`'s list: at its end, or back at its front (in their order: they
/// are older than what came since). Trouble is logged: the sweep still finds them.
async fn put(d: &Deps, queue: &str, items: &[Deferred], front: bool) {
    if items.is_empty() {
        return;
    }
    let noted = change(d, queue, |list| {
        let new: Vec<Deferred> = items
            .iter()
            .filter(|i| {
                !list
                    .iter()
                    .any(|w| w.run_id == i.run_id && w.work == i.work)
            })
            .take(MAX_LISTED.saturating_sub(list.len()))
            .cloned()
            .collect();
        if new.len() < items.len() && list.len() + new.len() >= MAX_LISTED {
            warn!(queue, "the deferred list is full; the sweep finds the rest");
        }
        let at = if front { 0 } else { list.len() };
        list.splice(at..at, new);
    });
    if let Err(e) = noted.await {
        warn!(error = %e, queue, "deferred work left to the sweep");
    }
}

/// Whether the error is Buildkite's rate limit (told, or kept to by us).
pub(crate) fn rate_limited(e: &DispatchError) -> bool {
    matches!(
        e,
        DispatchError::Buildkite(BuildkiteError::RateLimited { .. })
    )
}

/// Run ids of `queue`'s deferred finishes, for the sweep to look at whatever their age.
pub(crate) async fn finishes(d: &Deps, queue: &str) -> Result<Vec<String>, StoreError> {
    let list = parse(d.store.cached(&list_key(queue)).await?.as_ref());
    Ok(list
        .into_iter()
        .filter(|w| w.work == Work::Finish)
        .map(|w| w.run_id)
        .collect())
}

/// Takes up `queue`'s deferred work while this instance's window has room for it. The
/// items are taken off the list first (compare-and-swap), so that two instances never read
/// one job's result at once (each read counts against the job's few); what is not done is
/// put back. Trouble is logged: the caller's own work is done, and the sweep takes up what
/// is left.
pub(crate) async fn take_up(d: &Deps, queue: &str, deadline: Deadline) {
    let Some(taken) = claimed(d, queue, false).await else {
        return;
    };
    let mut left = taken.as_slice();
    while let Some((item, rest)) = left.split_first() {
        if deadline.remaining() < TIME_FLOOR {
            break;
        }
        let done = match item.work {
            Work::Finish => finish_one(d, item, deadline).await,
            Work::Create => create_one(d, item, deadline).await,
        };
        if !carry_on(item, done) {
            break;
        }
        left = rest;
    }
    put(d, queue, left, true).await;
}

/// As [`take_up`], creates only: for a job's end, whose own finish path this is.
pub(crate) async fn take_up_creates(d: &Deps, queue: &str, deadline: Deadline) {
    let Some(taken) = claimed(d, queue, true).await else {
        return;
    };
    let mut left = taken.as_slice();
    while let Some((item, rest)) = left.split_first() {
        if deadline.remaining() < TIME_FLOOR || !carry_on(item, create_one(d, item, deadline).await)
        {
            break;
        }
        left = rest;
    }
    put(d, queue, left, true).await;
}

/// Whether to go on after `item`: it is off the list; else it was deferred again or failed
/// (logged), and it and the rest go back.
fn carry_on(item: &Deferred, done: Result<bool, DispatchError>) -> bool {
    match done {
        Ok(true) => {
            info!(run_id = item.run_id, work = ?item.work, "deferred work taken up");
            true
        }
        Ok(false) => false,
        Err(e) => {
            warn!(error = %e, run_id = item.run_id, "deferred work is left to the sweep");
            false
        }
    }
}

/// The next items, taken off `queue`'s list; `None` when the window has no room or the
/// list cannot be read (logged).
async fn claimed(d: &Deps, queue: &str, creates_only: bool) -> Option<Vec<Deferred>> {
    if !d.buildkite.allows(Priority::Create) {
        return None;
    }
    claim(d, queue, creates_only)
        .await
        .inspect_err(|e| warn!(error = %e, queue, "deferred work is left to the sweep"))
        .ok()
}

/// Takes the next items off `queue`'s list.
async fn claim(d: &Deps, queue: &str, creates_only: bool) -> Result<Vec<Deferred>, StoreError> {
    let key = list_key(queue);
    for _ in 0..MAX_TRIES {
        let entry = d.store.cached(&key).await?;
        let mut list = parse(entry.as_ref());
        let now = d.clock.now();
        let mut taken = next(&list, now);
        if creates_only {
            let creates: Vec<Deferred> = list
                .iter()
                .filter(|w| w.work == Work::Create)
                .cloned()
                .collect();
            taken = next(&creates, now);
        }
        if taken.is_empty() {
            return Ok(taken);
        }
        list.retain(|w| !taken.contains(w));
        let version = entry.as_ref().map(|e| e.claimed_at);
        let rest = CacheEntry {
            value: Some(serde_json::to_string(&list).map_err(StoreError::corrupt)?),
            fetched_at: d.clock.now(),
            claimed_at: version.unwrap_or(0) + 1,
        };
        if d.store.put_cached(&key, &rest, version).await? {
            return Ok(taken);
        }
    }
    Err(StoreError::unavailable("the deferred list kept changing"))
}

/// The job of `item`, while it is open; `None` when there is nothing left to do.
async fn open_job(d: &Deps, item: &Deferred) -> Result<Option<Job>, DispatchError> {
    let Ok(run_id) = item.run_id.parse::<RunId>() else {
        return Ok(None);
    };
    Ok(d.store
        .get(&run_id)
        .await?
        .filter(|j| !j.state.is_terminal()))
}

/// A deferred finish: `Ok(true)` when it is off the list, `Ok(false)` when the window
/// deferred it again.
async fn finish_one(d: &Deps, item: &Deferred, deadline: Deadline) -> Result<bool, DispatchError> {
    let Some(job) = open_job(d, item).await? else {
        return Ok(true);
    };
    match look_at_build(d, &job, &mut PipelineSeen::default(), deadline).await {
        Ok(_) => Ok(true),
        Err(e) if rate_limited(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// A deferred create, as [`finish_one`].
async fn create_one(d: &Deps, item: &Deferred, deadline: Deadline) -> Result<bool, DispatchError> {
    let Some(job) = open_job(d, item).await?.filter(|j| j.build.is_none()) else {
        return Ok(true);
    };
    match create_if_due(d, &job, d.buildkite_deadline(deadline)).await {
        Ok((_, tried)) => Ok(tried == Tried::Created),
        Err(e) if rate_limited(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(run_id: &str, work: Work, user: Option<&str>) -> Deferred {
        Deferred {
            run_id: run_id.into(),
            work,
            user: user.map(str::to_owned),
            not_before: 0,
        }
    }

    #[test]
    fn finishes_are_taken_up_first_then_creates_round_robin_over_users() {
        use Work::*;
        let (heavy, light) = (Some("heavy"), Some("light"));
        let list = [
            w("h1", Create, heavy),
            w("f1", Finish, heavy),
            w("h2", Create, heavy),
            w("l1", Create, light),
            w("h3", Create, heavy),
            w("f2", Finish, None),
            w("anon", Create, None),
            w("l2", Create, light),
        ];
        let names = |l: &[Deferred]| -> Vec<String> {
            next(l, 100).into_iter().map(|d| d.run_id).collect()
        };
        assert_eq!(names(&list), ["f1", "f2", "h1", "l1"]);
        assert_eq!(names(&list[2..]), ["f2", "h2", "l1", "anon"]);
        let anonymous = [
            w("a", Create, None),
            w("h1", Create, heavy),
            w("h2", Create, heavy),
            w("b", Create, None),
        ];
        assert_eq!(
            names(&anonymous),
            ["a", "h1", "b", "h2"],
            "each job without a user is a user of its own"
        );
        assert!(next(&[], 100).is_empty());
        let mut later = w("later", Create, None);
        later.not_before = 101;
        assert!(next(&[later], 100).is_empty(), "not before its reset");
    }
}
