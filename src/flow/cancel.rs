//! Cancel: a user no longer wants a run. Its build is canceled and the job ends as
//! `canceled` when `build.finished` says so, or at once when it has no build yet (and then
//! its slot on the queue is free at once).

use super::effects::Effects;
use super::rules::ending::request_cancel;
use super::settle::settle;
use super::stop::stop_build;
use super::{Deps, DispatchError};
use crate::jobs::{Job, RunId, Updated, View, update};
use crate::retry::Deadline;

/// What a cancel request found.
#[derive(Debug)]
pub enum Canceled {
    /// Asked (now or before); the job as it is.
    Accepted(Job),
    /// The job had ended on its own.
    AlreadyFinished(Job),
    Unknown,
}

pub async fn cancel(
    d: &Deps,
    run_id: &RunId,
    deadline: Deadline,
) -> Result<Canceled, DispatchError> {
    let now = d.clock.now();
    // Whether the job waited, as stored when the cancel was written (ending it clears it).
    let mut was_waiting = false;
    let cancel = |j: &Job| {
        was_waiting = j.waiting;
        request_cancel(j, now)
    };
    let (job, freed_slot) = match update(d.store.as_ref(), run_id, cancel).await? {
        Updated::Missing => return Ok(Canceled::Unknown),
        Updated::Unchanged(j) if j.state.is_terminal() && !j.cancel_requested => {
            return Ok(Canceled::AlreadyFinished(j));
        }
        Updated::Written(j) => {
            // A waiting job held no slot: ending it frees none (and notes no run).
            let freed = j.state.is_terminal() && !was_waiting;
            (j, freed)
        }
        Updated::Unchanged(j) => (j, false),
    };
    match &job.build {
        Some(b) if !job.state.is_terminal() => {
            stop_build(d, b.number, d.buildkite_deadline(deadline)).await;
        }
        _ => {
            let mut effects = Effects::default();
            if freed_slot {
                // A job released to run held its user's slot, even without a build yet: the
                // next one goes now, not at the next end on the queue.
                effects.ended(job.clone());
            } else {
                effects.deliver(job.clone(), View::Own);
            }
            settle(d, effects, deadline).await?;
        }
    }
    Ok(Canceled::Accepted(job))
}
