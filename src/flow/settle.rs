//! The one place that runs what the arrows left ([`Effects`]), in this order, for each job
//! an arrow ended, in the order they ended:
//!
//! 1. its run time noted on its queue's record;
//! 2. the waiting jobs its slot lets go released, the creates Buildkite's rate limit
//!    deferred taken up first (they are older), then the released jobs' builds created;
//! 3. the waiting jobs whose place moved shown their new place.
//!
//! (All three are [`fair::after_end`]; the job's own report went out before, in the arrow.)
//! What runs here records no effects of its own (a create it makes that Buildkite refuses
//! fails its job as at submit; the sweep's next release covers that slot). Trouble is
//! logged: the jobs themselves have ended.

use super::effects::Effects;
use super::{Deps, fair};
use crate::retry::Deadline;

/// Runs `effects` within `deadline`.
pub(crate) async fn settle(d: &Deps, mut effects: Effects, deadline: Deadline) {
    for job in effects.take_ended() {
        fair::after_end(d, &job, deadline).await;
    }
}
