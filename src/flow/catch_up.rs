//! Taking up work that Buildkite's rate limit deferred ([`super::deferred`]'s lists) by the
//! next webhook of its queue rather than the sweep's next pass: in a rush an event comes
//! every few seconds, the sweep every five minutes (and it leaves young jobs to their
//! webhooks), while Buildkite's window resets every minute. Any function instance whose
//! window has room takes up to a few of them, finishes first. A create is claimed in the
//! store first ([`create_if_due`]) and a finish is a forward-only write, so whoever takes
//! one up does it once.

use std::time::Duration;

use tracing::{info, warn};

use super::create::{Tried, create_if_due};
use super::deferred::{Deferred, Work, claim, put, rate_limited};
use super::effects::Effects;
use super::follow::{PipelineSeen, look_at_build};
use super::{Deps, DispatchError};
use crate::buildkite::Priority;
use crate::jobs::{Job, Queue};
use crate::retry::Deadline;

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
}

impl Batch {
    /// `queue`'s next items (finishes first, then creates; creates only for a job's end,
    /// whose own finish path this is), while this instance's window has room for them.
    pub(crate) async fn take(d: &Deps, queue: &Queue, creates_only: bool) -> Option<Self> {
        let taken = claimed(d, queue, creates_only).await?;
        Some(Self {
            queue: queue.clone(),
            left: taken.into(),
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
        let Some(item) = self.left.front() else {
            return false;
        };
        let done = match item.work {
            Work::Finish => finish_one(d, item, deadline, effects).await,
            Work::Create => create_one(d, item, deadline, effects).await,
        };
        let on = carry_on(item, done);
        if on {
            self.left.pop_front();
        }
        on && !self.left.is_empty()
    }

    /// Puts what was not done back at the front of the list.
    pub(crate) async fn put_back(self, d: &Deps) {
        let left: Vec<Deferred> = self.left.into();
        put(d, &self.queue, &left, true).await;
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

/// Whether to go on after `item`: it is off the list; else it was deferred again or failed
/// (logged), and it and the rest go back.
fn carry_on(item: &Deferred, done: Result<bool, DispatchError>) -> bool {
    match done {
        Ok(true) => {
            info!(run_id = %item.run_id, work = ?item.work, "deferred work taken up");
            true
        }
        Ok(false) => false,
        Err(e) => {
            warn!(error = %e, run_id = %item.run_id, "deferred work is left to the sweep");
            false
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

/// A deferred finish: `Ok(true)` when it is off the list, `Ok(false)` when the window
/// deferred it again.
async fn finish_one(
    d: &Deps,
    item: &Deferred,
    deadline: Deadline,
    effects: &mut Effects,
) -> Result<bool, DispatchError> {
    let Some(job) = open_job(d, item).await? else {
        return Ok(true);
    };
    match look_at_build(d, &job, &mut PipelineSeen::default(), deadline, effects).await {
        Ok(_) => Ok(true),
        Err(e) if rate_limited(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// A deferred create, as [`finish_one`].
async fn create_one(
    d: &Deps,
    item: &Deferred,
    deadline: Deadline,
    effects: &mut Effects,
) -> Result<bool, DispatchError> {
    let Some(job) = open_job(d, item).await?.filter(|j| j.build.is_none()) else {
        return Ok(true);
    };
    match create_if_due(d, &job, d.buildkite_deadline(deadline), effects).await {
        Ok((_, tried)) => Ok(tried == Tried::Created),
        Err(e) if rate_limited(&e) => Ok(false),
        Err(e) => Err(e),
    }
}
