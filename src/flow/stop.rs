//! Stopping a build that must not hold a GPU (a user canceled it, its job is overdue, or no
//! job reads its result): asked once, and left to the sweep when Buildkite does not answer.

use tracing::warn;

use super::Deps;
use crate::retry::Deadline;

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
