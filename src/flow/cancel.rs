//! Cancel: a user no longer wants a run. Its build is canceled and the job ends as
//! `canceled` when `build.finished` says so, or at once when it has no build yet.

use tracing::warn;

use super::rules::ending::request_cancel;
use super::{Deps, DispatchError, deliver};
use crate::jobs::{Job, RunId, Updated, update};
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
    let job = match update(d.store.as_ref(), run_id, |j| request_cancel(j, now)).await? {
        Updated::Missing => return Ok(Canceled::Unknown),
        Updated::Unchanged(j) if j.state.is_terminal() && !j.cancel_requested => {
            return Ok(Canceled::AlreadyFinished(j));
        }
        Updated::Unchanged(j) | Updated::Written(j) => j,
    };
    match &job.build {
        Some(b) if !job.state.is_terminal() => {
            stop_build(d, b.number, d.buildkite_deadline(deadline)).await;
        }
        _ => {
            deliver::deliver(d, &job, deadline).await?;
        }
    }
    Ok(Canceled::Accepted(job))
}

/// Cancels a build; a failure is logged and left to the sweep, which cancels the builds of
/// canceled and overdue jobs on every pass. Whether it is canceled.
pub(crate) async fn stop_build(d: &Deps, number: u64, deadline: Deadline) -> bool {
    match d.buildkite.cancel_build(number, deadline).await {
        Ok(()) => true,
        Err(e) => {
            warn!(build = number, error = %e, "could not cancel the build; the sweep will");
            false
        }
    }
}
