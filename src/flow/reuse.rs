//! Answering a submission from an earlier run: a `test` or `benchmark` job that ends with its
//! own verdict is noted under its identity (one entry per identity, the latest end), and a
//! later submission of the same identity finds it with one read of that entry and one of the
//! run it names (`rules::reuse` decides whether it may answer).

use serde::{Deserialize, Serialize};

use super::Deps;
use super::rules::reuse::may_answer;
use crate::jobs::{CacheEntry, Job, RunId, StoreError, next_version};
use crate::time::Millis;

/// Where an identity's entry is kept: `~` is never in a run id.
fn key(identity: &str) -> String {
    format!("~result#{identity}")
}

/// What an identity's entry says: the run that answers it and when that run ended.
#[derive(Serialize, Deserialize)]
struct Noted {
    run_id: String,
    ended_at: Millis,
}

fn ttl_ms(d: &Deps) -> Millis {
    Millis::try_from(d.config.result_cache_secs.saturating_mul(1000)).unwrap_or(Millis::MAX)
}

/// The earlier run that may answer a submission of `identity` now, if any.
pub(crate) async fn earlier(d: &Deps, identity: &str) -> Result<Option<Job>, StoreError> {
    let ttl = ttl_ms(d);
    if ttl == 0 {
        return Ok(None);
    }
    let entry = d.store.cached(&key(identity)).await?;
    let Some(noted) = entry
        .and_then(|e| e.value)
        .and_then(|v| serde_json::from_str::<Noted>(&v).ok())
    else {
        return Ok(None);
    };
    let now = d.clock.now();
    // Too old: the run need not be read.
    if now.saturating_sub(noted.ended_at) > ttl {
        return Ok(None);
    }
    let Ok(run_id) = noted.run_id.parse::<RunId>() else {
        return Ok(None);
    };
    let Some(job) = d.store.get(&run_id).await? else {
        return Ok(None);
    };
    Ok(may_answer(&job, identity, noted.ended_at, now, ttl).then_some(job))
}

/// Notes `job`, which just ended at `ended_at`, as the answer to its identity's next
/// submissions when it may be one. Two ends of one identity at once: either entry answers.
pub(crate) async fn note(d: &Deps, job: &Job, ended_at: Millis) -> Result<(), StoreError> {
    let ttl = ttl_ms(d);
    let Some(identity) = job.identity.as_deref() else {
        return Ok(());
    };
    if !may_answer(job, identity, ended_at, ended_at, ttl) {
        return Ok(());
    }
    let key = key(identity);
    let version = d.store.cached(&key).await?.map(|e| e.version);
    let noted = Noted {
        run_id: job.run_id.to_string(),
        ended_at,
    };
    let value = serde_json::to_string(&noted).ok();
    let expires_at = Some(ended_at.saturating_add(ttl));
    let entry = CacheEntry::unclaimed(value, ended_at, next_version(version, ended_at), expires_at);
    d.store.put_cached(&key, &entry, version).await?;
    Ok(())
}
