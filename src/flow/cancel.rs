//! Cancel: a user no longer wants a run. Its build is canceled and the job ends as
//! `canceled` when `build.finished` says so, or at once when it has no build yet.

use tracing::warn;

use super::{DispatchError, Dispatcher, rules};
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

impl Dispatcher {
    pub async fn cancel(
        &self,
        run_id: &RunId,
        deadline: Deadline,
    ) -> Result<Canceled, DispatchError> {
        let now = self.clock.now();
        let job = match update(self.store.as_ref(), run_id, |j| {
            rules::request_cancel(j, now)
        })
        .await?
        {
            Updated::Missing => return Ok(Canceled::Unknown),
            Updated::Unchanged(j) if j.state.is_terminal() && !j.cancel_requested => {
                return Ok(Canceled::AlreadyFinished(j));
            }
            Updated::Unchanged(j) | Updated::Written(j) => j,
        };
        match &job.build {
            Some(b) if !job.state.is_terminal() => {
                self.cancel_build(b.number, self.buildkite_deadline(deadline))
                    .await;
            }
            _ => {
                self.deliver(&job, deadline).await?;
            }
        }
        Ok(Canceled::Accepted(job))
    }

    /// Cancels a build; a failure is logged and left to the sweep, which cancels the builds
    /// of canceled and overdue jobs on every pass.
    pub(crate) async fn cancel_build(&self, number: u64, deadline: Deadline) -> bool {
        match self.buildkite.cancel_build(number, deadline).await {
            Ok(()) => true,
            Err(e) => {
                warn!(build = number, error = %e, "could not cancel the build; the sweep will");
                false
            }
        }
    }
}
