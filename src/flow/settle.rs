//! The one place that runs what the arrows left ([`Effects`]), oldest first:
//!
//! - a job owed its messages ([`deliver`]): an ended job's tries noted on the fleet's records
//!   first (once), then its Discord report and its callback side by side, then the incidents
//!   those notes decided told to the operators;
//! - a job ended by this instance ([`fair::after_end`]): its run time noted on its queue's
//!   record; the waiting jobs its slot lets go released, the creates Buildkite's rate limit
//!   deferred taken up first (they are older), then the released jobs' builds created; the
//!   waiting jobs whose place moved marked. What that owes (the released jobs' and the moved
//!   ones' messages) joins the end of the list and is run in turn.
//!
//! A job's report is always tried before its slot is given to another ([`Effects::ended`]
//! owes the delivery first). A failure to record a delivery the arrows owed is the caller's
//! to return (the sweep sends the message later); trouble with what the ends owed is logged:
//! the jobs themselves have ended.

use tracing::warn;

use super::deliver as outboxes;
use super::effects::{Effect, Effects};
use super::{Deps, DispatchError, fair, fleet};
use crate::jobs::{Channel, Job, StoreError, View};
use crate::retry::Deadline;

/// Runs `effects` within `deadline`; the first failure to record a delivery they owed.
pub(crate) async fn settle(
    d: &Deps,
    mut effects: Effects,
    deadline: Deadline,
) -> Result<(), StoreError> {
    let mut result = Ok(());
    // The arrows' own effects; what running them owes comes after.
    let own = effects.len();
    let mut run = 0;
    while let Some(effect) = effects.next() {
        run += 1;
        match effect {
            Effect::Deliver(job, view) => match deliver(d, (&job, view), deadline).await {
                Err(e) if run <= own && result.is_ok() => result = Err(e),
                Err(e) => {
                    warn!(error = %e, run_id = %job.run_id, "a message is left to the sweep")
                }
                Ok(_) => {}
            },
            Effect::Ended(job) => fair::after_end(d, &job, deadline, &mut effects).await,
        }
    }
    result
}

/// Runs `effects` after the work that left them ended with `result`: the work's own failure
/// is returned first, else a failure to record a delivery it owed.
pub(crate) async fn settle_after<T>(
    d: &Deps,
    effects: Effects,
    deadline: Deadline,
    result: Result<T, DispatchError>,
) -> Result<T, DispatchError> {
    let settled = settle(d, effects, deadline).await;
    match (result, settled) {
        (Ok(done), Ok(())) => Ok(done),
        (Ok(_), Err(e)) => Err(e.into()),
        (Err(failed), settled) => {
            if let Err(e) = settled {
                warn!(error = %e, "a message is left to the sweep");
            }
            Err(failed)
        }
    }
}

/// Sends what `job` owes both its receivers within `deadline`, starting from `job` as last
/// read or written (and how); returns the job as last seen. An ended job's tries are noted
/// on the fleet's records first, once (whether or not it owes anything: a job without a
/// report counts too), and what that decided is told to the operators after the sends.
pub(crate) async fn deliver(
    d: &Deps,
    (job, view): (&Job, View),
    deadline: Deadline,
) -> Result<Option<Job>, StoreError> {
    let noted = fleet::note_finish(d, job).await;
    let delivered = outboxes::deliver(d, (job, view), deadline).await;
    fleet::tell_noted(d, noted, deadline).await;
    delivered
}

/// Sends what `job` owes `channel` (the sweep's send of one owed message). Before what an
/// ended job owes goes out, its tries are noted on the fleet's records (if the function that
/// ended it was stopped before it could: a no-op otherwise), and what that decided is told
/// after the send.
pub(crate) async fn drain(
    d: &Deps,
    channel: Channel,
    job: &Job,
    deadline: Deadline,
) -> Result<Option<Job>, StoreError> {
    let ends = job.outcome.is_some() && job.owes(channel);
    let noted = if ends {
        fleet::note_finish(d, job).await
    } else {
        Vec::new()
    };
    let drained = outboxes::drain(d, channel, (job, View::Earlier), deadline).await;
    fleet::tell_noted(d, noted, deadline).await;
    drained
}
