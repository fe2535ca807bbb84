//! A user's daily GPU budget (`USER_GPU_SECONDS_PER_DAY`): each run's end adds its evaluation
//! time to its user's record in the store (one entry per user, written by compare-and-swap),
//! and a submission of a user past the budget is refused until enough of the last 24 hours'
//! use has left the window (`rules::budget` decides).

use serde::Serialize;
use tracing::warn;

use super::Deps;
use super::rules::budget::{Use, WINDOW_MS, frees_in, noted, used, used_by};
use crate::jobs::{CacheEntry, Job, StoreError, UserId, next_version};
use crate::time::Millis;

/// How often a run's end tries to note its use against other ends of the same user.
const NOTE_TRIES: usize = 4;

fn key(user: &UserId) -> String {
    format!("~usage#{user}")
}

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

async fn runs(d: &Deps, user: &UserId) -> Result<(Vec<Use>, Option<Millis>), StoreError> {
    let entry = d.store.cached(&key(user)).await?;
    let version = entry.as_ref().map(|e| e.version);
    let runs = entry
        .and_then(|e| e.value)
        .and_then(|v| serde_json::from_str(&v).ok())
        .unwrap_or_default();
    Ok((runs, version))
}

/// `user`'s use now (one read).
pub async fn usage(d: &Deps, user: &UserId) -> Result<Usage, StoreError> {
    let limit = d.config.user_gpu_seconds_per_day;
    let now = d.clock.now();
    let (runs, _) = runs(d, user).await?;
    Ok(Usage {
        user: user.to_string(),
        used_secs: (used(&runs, now) * 10.0).round() / 10.0,
        limit_secs: limit,
        window_secs: u64::try_from(WINDOW_MS / 1000).unwrap_or(0),
        retry_after_secs: (limit > 0).then(|| frees_in(&runs, now, limit)).flatten(),
    })
}

/// Adds `job`'s use, which just ended at `ended_at`, to its user's record (nothing without a
/// budget, or for a run that counts nothing). Another end of the same user writing at the
/// same moment makes it read again and retry.
pub(crate) async fn note(d: &Deps, job: &Job, ended_at: Millis) -> Result<(), StoreError> {
    let (Some(user), Some(secs)) = (job.user.as_ref(), used_by(job)) else {
        return Ok(());
    };
    if d.config.user_gpu_seconds_per_day == 0 {
        return Ok(());
    }
    let key = key(user);
    for _ in 0..NOTE_TRIES {
        let (runs, version) = runs(d, user).await?;
        let now = d.clock.now();
        let run = job.run_id.to_string();
        let runs = noted(
            runs,
            Use {
                run,
                at: ended_at,
                secs,
            },
            now,
        );
        let value = serde_json::to_string(&runs).ok();
        let expires_at = Some(now.saturating_add(WINDOW_MS));
        let entry = CacheEntry::unclaimed(value, now, next_version(version, now), expires_at);
        if d.store.put_cached(&key, &entry, version).await? {
            return Ok(());
        }
    }
    warn!(user = %user, secs, "a run's GPU time could not be noted on its user's budget");
    Ok(())
}
