//! Taking up work that Buildkite's rate limit deferred ([`super::deferred`]'s lists) by the
//! next webhook of its queue rather than the sweep's next pass: in a rush an event comes
//! every few seconds, the sweep every five minutes (and it leaves young jobs to their
//! webhooks), while Buildkite's window resets every minute. Any function instance whose
//! window has room takes up to a few of them, finishes first. A create is claimed in the
//! store first ([`create_if_due`]) and a finish is a forward-only write, so whoever takes
//! one up does it once. One item holds back no other: one not yet due goes back with its
//! time, one that fails goes to the back with its attempt counted and a growing wait
//! (dropped after a few); only Buildkite deferring one again (its rate limit, a create not
//! sent) stops a batch.

use std::time::Duration;

use tracing::{info, warn};

use super::create::{Tried, create_if_due};
use super::deferred::{Deferred, MAX_ATTEMPTS, Work, claim, put, rate_limited};
use super::effects::Effects;
use super::follow::{PipelineSeen, look_at_build};
use super::{Deps, DispatchError};
use crate::buildkite::Priority;
use crate::jobs::{Job, Queue, RunId};
use crate::retry::Deadline;
use crate::telemetry::metrics::Unit;
use crate::time::Millis;

/// Below this much of its deadline left, a call takes up nothing more: an item claimed
/// when the function stops is off the list until the sweep finds its job.
const TIME_FLOOR: Duration = Duration::from_secs(10);

/// Deferred work taken off a queue's list, done one item at a time by whoever holds it: the
/// items are taken off first (compare-and-swap), so that two instances never read one job's
/// result at once (each read counts against the job's few); what is not done is put back.
/// Trouble is logged: the caller's own work is done, and the sweep takes up what is left.
pub(crate) struct Batch {
    queue: Queue,
    /// Not yet done, in order.
    left: std::collections::VecDeque<Deferred>,
    /// Taken but not done, for the list's end: not yet due, or failed once more.
    later: Vec<Deferred>,
}

/// What taking up one item did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Done {
    /// Off the list: done, or nothing left to do.
    Off,
    /// Buildkite deferred it again (its rate limit, a create not sent or unconfirmed): the
    /// batch stops, the item back at the front.
    Again,
    /// Not due before then (its create is held).
    NotBefore(Millis),
    /// It failed (logged).
    Failed,
}

/// Where an item goes after `done`.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    Off,
    /// Back at the front, and the batch stops.
    Stop(Deferred),
    /// To the list's end, and the batch goes on.
    Later(Deferred),
    /// Dropped: failed too often (the sweep finds its job by age).
    Dropped(Deferred),
}

/// The first wait after a failure; each further failure doubles it.
const FAILED_WAIT_MS: Millis = 30_000;

/// The pure decision: where `item` goes after `done` at `now`.
fn next_of(mut item: Deferred, done: Done, now: Millis) -> Next {
    match done {
        Done::Off => Next::Off,
        Done::Again => Next::Stop(item),
        Done::NotBefore(at) => {
            item.not_before = item.not_before.max(at);
            Next::Later(item)
        }
        Done::Failed if item.attempts.saturating_add(1) >= MAX_ATTEMPTS => Next::Dropped(item),
        Done::Failed => {
            item.not_before = now.saturating_add(FAILED_WAIT_MS << item.attempts.min(8));
            item.attempts += 1;
            Next::Later(item)
        }
    }
}

impl Batch {
    /// `queue`'s next items (finishes first, then creates; creates only for a job's end,
    /// whose own finish path this is), while this instance's window has room for them.
    pub(crate) async fn take(d: &Deps, queue: &Queue, creates_only: bool) -> Option<Self> {
        let taken = claimed(d, queue, creates_only).await?;
        Some(Self {
            queue: queue.clone(),
            left: taken.into(),
            later: Vec::new(),
        })
    }

    /// Does the next item within `deadline` (what it owes left to `effects`); whether to go
    /// on with the rest.
    pub(crate) async fn do_next(
        &mut self,
        d: &Deps,
        deadline: Deadline,
        effects: &mut Effects,
    ) -> bool {
        if deadline.remaining() < TIME_FLOOR {
            return false;
        }
        let Some(item) = self.left.pop_front() else {
            return false;
        };
        let done = match item.work {
            Work::Finish => finish_one(d, &item, deadline, effects).await,
            Work::Create => create_one(d, &item, deadline, effects).await,
        };
        match next_of(item, logged(&self.queue, done), d.clock.now()) {
            Next::Off => {}
            Next::Stop(item) => {
                self.left.push_front(item);
                return false;
            }
            Next::Later(item) => self.later.push(item),
            Next::Dropped(item) => {
                warn!(run_id = %item.run_id, work = ?item.work, attempts = MAX_ATTEMPTS,
                    "deferred work dropped after failing; the sweep finds its job by age");
                d.metrics.put(&[], &[("DeferredDropped", Unit::Count, 1.0)]);
            }
        }
        !self.left.is_empty()
    }

    /// Puts what was not done back: the untried at the front of the list, in their order
    /// (they are older than what came since), the rest at its end.
    pub(crate) async fn put_back(self, d: &Deps) {
        let left: Vec<Deferred> = self.left.into();
        put(d, &self.queue, &left, true).await;
        put(d, &self.queue, &self.later, false).await;
    }
}

/// The deferred creates of `queue`, taken up after one of its jobs ended (what their jobs
/// owe left to `effects`).
pub(crate) async fn take_up_creates(
    d: &Deps,
    queue: &Queue,
    deadline: Deadline,
    effects: &mut Effects,
) {
    let Some(mut batch) = Batch::take(d, queue, true).await else {
        return;
    };
    while batch.do_next(d, deadline, effects).await {}
    batch.put_back(d).await;
}

/// What taking up an item did, its failure logged.
fn logged(queue: &Queue, done: Result<Done, (RunId, DispatchError)>) -> Done {
    match done {
        Ok(done) => done,
        Err((run_id, e)) => {
            warn!(error = %e, %run_id, %queue, "deferred work failed; tried again later");
            Done::Failed
        }
    }
}

/// The next items, taken off `queue`'s list; `None` when the window has no room or the
/// list cannot be read (logged).
async fn claimed(d: &Deps, queue: &Queue, creates_only: bool) -> Option<Vec<Deferred>> {
    if !d.buildkite.allows(Priority::Create) {
        return None;
    }
    claim(d, queue, creates_only)
        .await
        .inspect_err(|e| warn!(error = %e, %queue, "deferred work is left to the sweep"))
        .ok()
}

/// The job of `item`, while it is open; `None` when there is nothing left to do.
async fn open_job(d: &Deps, item: &Deferred) -> Result<Option<Job>, DispatchError> {
    Ok(d.store
        .get(&item.run_id)
        .await?
        .filter(|j| !j.state.is_terminal()))
}

/// A deferred finish taken up.
async fn finish_one(
    d: &Deps,
    item: &Deferred,
    deadline: Deadline,
    effects: &mut Effects,
) -> Result<Done, (RunId, DispatchError)> {
    let failed = |e| (item.run_id.clone(), e);
    let Some(job) = open_job(d, item).await.map_err(failed)? else {
        return Ok(Done::Off);
    };
    match look_at_build(d, &job, &mut PipelineSeen::default(), deadline, effects).await {
        Ok(_) => {
            info!(run_id = %item.run_id, "deferred finish taken up");
            Ok(Done::Off)
        }
        Err(e) if rate_limited(&e) => Ok(Done::Again),
        Err(e) => Err(failed(e)),
    }
}

/// A deferred create taken up: one whose create is held (another instance's claim, a
/// reset Buildkite gave) goes back with its time rather than holding back the list.
async fn create_one(
    d: &Deps,
    item: &Deferred,
    deadline: Deadline,
    effects: &mut Effects,
) -> Result<Done, (RunId, DispatchError)> {
    let failed = |e| (item.run_id.clone(), e);
    let job = open_job(d, item).await.map_err(failed)?;
    let Some(job) = job.filter(|j| j.build.is_none() && !j.waiting) else {
        return Ok(Done::Off);
    };
    if let Some(after) = job.creation.as_ref().map(|c| c.after)
        && after > d.clock.now()
    {
        return Ok(Done::NotBefore(after));
    }
    match create_if_due(d, &job, d.buildkite_deadline(deadline), effects).await {
        Ok((_, Tried::Created)) => {
            info!(run_id = %item.run_id, "deferred create taken up");
            Ok(Done::Off)
        }
        Ok((_, Tried::Deferred)) => Ok(Done::Again),
        // Not sent for the pass's budget: the window may have room for the next caller.
        Ok((_, Tried::Nothing)) if d.buildkite.over_budget() => Ok(Done::Again),
        // Nothing made: nothing left to do, or another instance claimed it meanwhile.
        Ok((_, Tried::Nothing)) => still_to_do(d, item).await.map_err(failed),
        Err(e) if rate_limited(&e) => Ok(Done::Again),
        // Refused for good: the job failed and its report is owed; nothing left to do.
        Err(DispatchError::BuildRefused { .. }) => Ok(Done::Off),
        Err(e) => Err(failed(e)),
    }
}

/// After a create try that made nothing: off the list when nothing is left to do; else
/// (another instance's claim holds it) back with the time that claim lasts, so that the
/// create is not left to the sweep alone should that instance die.
async fn still_to_do(d: &Deps, item: &Deferred) -> Result<Done, DispatchError> {
    let job = open_job(d, item).await?;
    // A job without its creation is the sweep's to end (its queue deadline), not ours.
    let held = job.filter(|j| j.build.is_none() && !j.waiting);
    Ok(match held.and_then(|j| j.creation) {
        None => Done::Off,
        Some(creation) => Done::NotBefore(creation.after),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(attempts: u32, not_before: Millis) -> Deferred {
        Deferred {
            run_id: "r1".parse().expect("a run id"),
            work: Work::Create,
            user: None,
            not_before,
            attempts,
        }
    }

    #[test]
    fn one_item_holds_back_no_other() {
        let now = 1_000;
        // (item, what taking it did, where it goes)
        let cases = [
            (item(0, 0), Done::Off, Next::Off),
            (item(2, 5), Done::Again, Next::Stop(item(2, 5))),
            (item(0, 5), Done::NotBefore(90), Next::Later(item(0, 90))),
            (item(0, 95), Done::NotBefore(90), Next::Later(item(0, 95))),
            (item(0, 0), Done::Failed, Next::Later(item(1, 31_000))),
            (item(1, 0), Done::Failed, Next::Later(item(2, 61_000))),
            (item(2, 0), Done::Failed, Next::Later(item(3, 121_000))),
            (item(3, 0), Done::Failed, Next::Dropped(item(3, 0))),
        ];
        for (i, done, expected) in cases {
            let before = i.clone();
            assert_eq!(next_of(i, done, now), expected, "{before:?} after {done:?}");
        }
        assert_eq!(
            MAX_ATTEMPTS, 4,
            "the table above drops at the fourth failure"
        );
    }
}
