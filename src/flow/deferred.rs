//! Work that Buildkite's rate limit deferred, as a list per queue in the store: a deferred
//! finish or create is noted here (by whichever arrow met the limit), taken off by compare-
//! and-swap by whoever takes it up (`catch_up`), and put back when not done. The
//! list is data only: nothing here calls an arrow of the flow.

use serde::{Deserialize, Serialize};
use tracing::warn;

use super::{Deps, DispatchError};
use crate::buildkite::BuildkiteError;
use crate::jobs::{Job, Queue, RunId, SharedKey, StoreError, UserId, shared};
use crate::time::Millis;

/// Deferred jobs one call takes up at most.
const MAX_PER_CALL: usize = 4;
/// A queue's list holds this many; past it, the sweep finds the rest on its own.
const MAX_LISTED: usize = 1_000;

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
    pub(crate) run_id: RunId,
    pub(crate) work: Work,
    /// The job's user, so that deferred creates are taken up in fair order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) user: Option<UserId>,
    /// Not before then (the reset Buildkite gave a create): nobody claims it for nothing.
    #[serde(default)]
    pub(crate) not_before: Millis,
    /// Takings that failed (not for the rate limit); at the [`MAX_ATTEMPTS`]th failure it
    /// is dropped, and the sweep finds its job (a create at once, a finish by its age).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) attempts: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Failures of one item at which it is dropped from the list (logged and counted).
pub(crate) const MAX_ATTEMPTS: u32 = 4;

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
        let user = w.user.as_ref().map(UserId::as_str);
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
async fn change<R>(
    d: &Deps,
    queue: &Queue,
    f: impl FnMut(&mut Vec<Deferred>) -> R,
) -> Result<R, StoreError> {
    let key = SharedKey::Deferred(queue);
    let changed = shared::update(d.store.as_ref(), key, d.clock.now(), Vec::new, f).await?;
    Ok(changed.said)
}

/// Notes `work` for `job` on its queue's list. A note that fails is logged: the sweep still
/// finds the job, later.
pub(crate) async fn note(d: &Deps, job: &Job, work: Work, not_before: Millis) {
    let item = Deferred {
        run_id: job.run_id.clone(),
        work,
        user: job.user.clone(),
        not_before,
        attempts: 0,
    };
    put(d, &job.queue, std::slice::from_ref(&item), false).await;
}

/// Puts `items` on `queue`'s list: at its end, or back at its front (in their order: they
/// are older than what came since). Trouble is logged: the sweep still finds them.
pub(crate) async fn put(d: &Deps, queue: &Queue, items: &[Deferred], front: bool) {
    if items.is_empty() {
        return;
    }
    let noted = change(d, queue, |list| {
        // One already listed keeps its place, with the later wait and the higher count of
        // the two: a note that came meanwhile does not undo a failure's backoff.
        for item in items {
            if let Some(w) = list
                .iter_mut()
                .find(|w| w.run_id == item.run_id && w.work == item.work)
            {
                w.not_before = w.not_before.max(item.not_before);
                w.attempts = w.attempts.max(item.attempts);
            }
        }
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
            warn!(%queue, "the deferred list is full; the sweep finds the rest");
        }
        let at = if front { 0 } else { list.len() };
        list.splice(at..at, new);
    });
    // Whatever the write did, this instance looks at the list at its next event.
    d.quiet_lists.saw(queue, false, d.clock.now());
    if let Err(e) = noted.await {
        warn!(error = %e, %queue, "deferred work left to the sweep");
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
pub(crate) async fn finishes(d: &Deps, queue: &Queue) -> Result<Vec<RunId>, StoreError> {
    let (list, _) =
        shared::read::<Vec<Deferred>>(d.store.as_ref(), SharedKey::Deferred(queue), d.clock.now())
            .await?;
    Ok(finishes_of(list))
}

/// The run ids of a list's finishes (none of a list never written).
fn finishes_of(list: Option<Vec<Deferred>>) -> Vec<RunId> {
    list.unwrap_or_default()
        .into_iter()
        .filter(|w| w.work == Work::Finish)
        .map(|w| w.run_id)
        .collect()
}

/// Run ids of `queue`'s deferred finishes, builds that ended and hold no GPU, as this
/// instance saw the list less than `within` before (none while it read the list empty
/// lately): what fair share counts out of the queue's builds in flight.
pub(crate) async fn finishes_seen(
    d: &Deps,
    queue: &Queue,
    within: Millis,
) -> Result<Vec<RunId>, StoreError> {
    let now = d.clock.now();
    if d.quiet_lists.quiet(queue, now) {
        return Ok(Vec::new());
    }
    let key = (SharedKey::Deferred(queue), now);
    let list = d.seen.read_within(d.store.as_ref(), key, within).await?;
    Ok(finishes_of(list))
}

/// Takes the next items off `queue`'s list (none while this instance read it empty lately).
pub(crate) async fn claim(
    d: &Deps,
    queue: &Queue,
    creates_only: bool,
) -> Result<Vec<Deferred>, StoreError> {
    let now = d.clock.now();
    if d.quiet_lists.quiet(queue, now) {
        return Ok(Vec::new());
    }
    let mut empty = false;
    let taken = change(d, queue, |list| {
        empty = list.is_empty();
        let taken = if creates_only {
            let creates: Vec<Deferred> = list
                .iter()
                .filter(|w| w.work == Work::Create)
                .cloned()
                .collect();
            next(&creates, now)
        } else {
            next(list, now)
        };
        list.retain(|w| !taken.contains(w));
        taken
    })
    .await?;
    d.quiet_lists.saw(queue, empty, now);
    Ok(taken)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(run_id: &str, work: Work, user: Option<&str>) -> Deferred {
        Deferred {
            run_id: run_id.parse().expect("a run id"),
            work,
            user: user.map(UserId::from),
            not_before: 0,
            attempts: 0,
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
            next(l, 100)
                .into_iter()
                .map(|d| d.run_id.to_string())
                .collect()
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
