//! A user's daily GPU budget (`USER_GPU_SECONDS_PER_DAY`): each run's end adds its evaluation
//! time to its user's record in the store (one entry per user, written by compare-and-swap),
//! and a submission of a user past the budget is refused until enough of the last 24 hours'
//! use has left the window (`rules::budget` decides).

use serde::Serialize;

use super::Deps;
use super::rules::budget::{Use, WINDOW_MS, frees_in, noted, used, used_by};
use crate::jobs::shared::{self, SharedKey};
use crate::jobs::{Job, StoreError, UserId};
use crate::time::Millis;

/// A user's use of their budget now, as `GET /users/{user}/usage` shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Usage {
    pub user: String,
    pub used_secs: f64,
    /// 0: no budget.
    pub limit_secs: u64,
    pub window_secs: u64,
    /// When a submission is taken again, while use is at or past the limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u64>,
}

impl Usage {
    /// Past the budget: a submission is refused.
    pub fn exhausted(&self) -> bool {
        self.retry_after_secs.is_some()
    }
}

/// `user`'s use now (one read).
pub async fn usage(d: &Deps, user: &UserId) -> Result<Usage, StoreError> {
    let limit = d.config.user_gpu_seconds_per_day;
    let now = d.clock.now();
    let (runs, _) = shared::read::<Vec<Use>>(d.store.as_ref(), SharedKey::Usage(user), now).await?;
    let runs = runs.unwrap_or_default();
    Ok(Usage {
        user: user.to_string(),
        used_secs: (used(&runs, now) * 10.0).round() / 10.0,
        limit_secs: limit,
        window_secs: u64::try_from(WINDOW_MS / 1000).unwrap_or(0),
        retry_after_secs: (limit > 0).then(|| frees_in(&runs, now, limit)).flatten(),
    })
}

/// Adds `job`'s use, which just ended at `ended_at`, to its user's record (nothing without a
/// budget, or for a run that counts nothing), by the shared entries' read-modify-write: another
/// end of the same user writing at the same moment makes it read again and retry.
pub(crate) async fn note(d: &Deps, job: &Job, ended_at: Millis) -> Result<(), StoreError> {
    let (Some(user), Some(secs)) = (job.user.as_ref(), used_by(job)) else {
        return Ok(());
    };
    if d.config.user_gpu_seconds_per_day == 0 {
        return Ok(());
    }
    let (now, run) = (d.clock.now(), job.run_id.to_string());
    let key = SharedKey::Usage(user);
    shared::update(
        d.store.as_ref(),
        key,
        now,
        Vec::new,
        |runs: &mut Vec<Use>| {
            let added = Use {
                run: run.clone(),
                at: ended_at,
                secs,
            };
            *runs = noted(std::mem::take(runs), added, now);
        },
    )
    .await?;
    Ok(())
}
