//! Fair share as the functions run it: a submission waits in the store while its user has
//! `USER_MAX_IN_FLIGHT` builds on the queue; waiting jobs are released (round-robin over
//! users, oldest first: [`fair`](super::rules::fair)) by whoever holds the queue's short
//! lease in the store, when a submission arrives, when a job of the queue ends, and on every
//! sweep pass. The lease keeps two instances from both filling one user's last slot; the
//! job's own compare-and-swap (its creation's claim) keeps a build from being made twice.
//! Also each job's standing on its queue, for the API and its status message.

use std::time::Duration;

use tracing::{info, warn};

use super::create::create_if_due;
use super::queues::cached_agents;
use super::rules::fair;
pub(crate) use super::rules::fair::Standing;
use super::{Deps, DispatchError, deliver};
use crate::jobs::{CacheEntry, Job, JobState, OpenJob, RunId, StoreError, Updated, update_seen};
use crate::retry::Deadline;
use crate::time::Millis;

/// How long a queue's lease is held at most (a holder that dies frees it this late).
const LEASE_MS: Millis = 5_000;
/// How long to wait for a queue's lease another instance holds.
const LEASE_WAIT: Duration = Duration::from_secs(3);
/// Recent run times kept per queue, for the expected start's median.
const RUNS_KEPT: usize = 50;

fn lease_key(queue: &str) -> String {
    format!("~fair/{queue}")
}

fn runs_key(queue: &str) -> String {
    format!("~runs/{queue}")
}

/// The jobs a release let go: the submitter's own (which it creates itself), and others.
#[derive(Debug, Default)]
pub(crate) struct Released {
    pub(crate) mine: Option<Job>,
    pub(crate) others: Vec<Job>,
}

/// Releases the queue's waiting jobs that fair share lets go now. `mine`: the job of the
/// submit calling, whose creation it holds.
pub(crate) async fn release(
    d: &Deps,
    queue: &str,
    mine: Option<&RunId>,
) -> Result<Released, StoreError> {
    let limit = d.config.user_max_in_flight;
    if limit == 0 {
        return Ok(Released::default());
    }
    let Some(lease) = take_lease(d, queue).await? else {
        warn!(
            queue,
            "the queue's fair-share lease stayed taken; released next time"
        );
        return Ok(Released::default());
    };
    let released = release_held(d, queue, mine, limit).await;
    give_back(d, queue, lease).await;
    released
}

async fn release_held(
    d: &Deps,
    queue: &str,
    mine: Option<&RunId>,
    limit: usize,
) -> Result<Released, StoreError> {
    let open = d.store.open_in_queue(queue).await?;
    let now = d.clock.now();
    let mut out = Released::default();
    for o in fair::releases(&open, limit) {
        let Ok(run_id) = o.run_id.parse::<RunId>() else {
            continue;
        };
        let Some(job) = d.store.get(&run_id).await? else {
            continue;
        };
        let held = mine == Some(&run_id);
        let written = update_seen(d.store.as_ref(), &job, |j| fair::release_job(j, now, held));
        if let Updated::Written(job) = written.await? {
            info!(run_id = %job.run_id, queue, "released by fair share");
            if held {
                out.mine = Some(job);
            } else {
                out.others.push(job);
            }
        }
    }
    Ok(out)
}

/// The queue's lease, taken (its version), or `None` when another held it all along.
async fn take_lease(d: &Deps, queue: &str) -> Result<Option<Millis>, StoreError> {
    let key = lease_key(queue);
    let until = Deadline::after(LEASE_WAIT);
    loop {
        let now = d.clock.now();
        let entry = d.store.cached(&key).await?;
        let held_until = entry
            .as_ref()
            .and_then(|e| e.value.as_deref()?.parse::<Millis>().ok());
        if held_until.is_none_or(|t| t <= now) {
            let version = entry.as_ref().map(|e| e.claimed_at);
            let next = CacheEntry {
                value: Some((now + LEASE_MS).to_string()),
                fetched_at: now,
                claimed_at: version.unwrap_or(0) + 1,
            };
            if d.store.put_cached(&key, &next, version).await? {
                return Ok(Some(next.claimed_at));
            }
            continue;
        }
        if until.remaining().is_zero() {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn give_back(d: &Deps, queue: &str, version: Millis) {
    let free = CacheEntry {
        value: None,
        fetched_at: d.clock.now(),
        claimed_at: version + 1,
    };
    if let Err(e) = d
        .store
        .put_cached(&lease_key(queue), &free, Some(version))
        .await
    {
        warn!(error = %e, queue, "the fair-share lease could not be given back; it expires");
    }
}

/// After a job of `job.queue` ended (written by this instance): its run time noted, the
/// waiting jobs its slot lets go released and created, and the waiting jobs whose standing
/// moved to another band shown it. Trouble here is logged: the job itself has ended.
pub(crate) async fn after_end(d: &Deps, job: &Job, deadline: Deadline) {
    if let Some(ran) = job.outcome.as_ref().and_then(|o| o.timings?.ran_secs)
        && let Err(e) = note_run(d, &job.queue, (ran * 1000.0) as Millis).await
    {
        warn!(error = %e, "the run time could not be noted");
    }
    if let Err(e) = release_and_create(d, &job.queue, deadline).await {
        warn!(error = %e, queue = %job.queue, "waiting jobs could not be released");
    }
    if let Err(e) = place_all(d, &job.queue, deadline).await {
        warn!(error = %e, queue = %job.queue, "waiting jobs could not be shown their place");
    }
}

/// Releases the queue's waiting jobs fair share lets go, and creates their builds.
pub(crate) async fn release_and_create(
    d: &Deps,
    queue: &str,
    deadline: Deadline,
) -> Result<(), DispatchError> {
    for job in release(d, queue, None).await?.others {
        create_if_due(d, &job, d.buildkite_deadline(deadline)).await?;
    }
    Ok(())
}

/// Adds a run time to the queue's recent ones.
async fn note_run(d: &Deps, queue: &str, ran_ms: Millis) -> Result<(), StoreError> {
    let key = runs_key(queue);
    for _ in 0..5 {
        let entry = d.store.cached(&key).await?;
        let mut runs = runs_in(entry.as_ref());
        runs.push(ran_ms);
        let over = runs.len().saturating_sub(RUNS_KEPT);
        runs.drain(..over);
        let version = entry.as_ref().map(|e| e.claimed_at);
        let next = CacheEntry {
            value: serde_json::to_string(&runs).ok(),
            fetched_at: d.clock.now(),
            claimed_at: version.unwrap_or(0) + 1,
        };
        if d.store.put_cached(&key, &next, version).await? {
            return Ok(());
        }
    }
    Ok(())
}

fn runs_in(entry: Option<&CacheEntry>) -> Vec<Millis> {
    entry
        .and_then(|e| serde_json::from_str(e.value.as_deref()?).ok())
        .unwrap_or_default()
}

/// What a standing is computed from, besides the queue's open jobs: its connected agents
/// (the cached list; no Buildkite call) and the median of its recent run times.
async fn queue_facts(d: &Deps, queue: &str) -> Result<(usize, Option<Millis>), StoreError> {
    let agents = cached_agents(d)
        .await?
        .iter()
        .filter(|a| a.queue == queue)
        .count();
    let runs = runs_in(d.store.cached(&runs_key(queue)).await?.as_ref());
    Ok((agents, fair::median(&runs)))
}

/// Where `job` stands on its queue now; `None` once it runs (or has ended).
pub(crate) async fn standing(d: &Deps, job: &Job) -> Result<Option<Standing>, StoreError> {
    if job.state.rank() >= JobState::Running.rank() {
        return Ok(None);
    }
    let open = d.store.open_in_queue(&job.queue).await?;
    let (agents, median) = queue_facts(d, &job.queue).await?;
    let now = d.clock.now();
    Ok(fair::standing(
        &open,
        job.run_id.as_str(),
        agents,
        median,
        now,
    ))
}

/// Notes `job`'s standing on it (for its status message), when its band changed.
pub(crate) async fn place(d: &Deps, job: &Job) -> Result<Job, StoreError> {
    let Some(s) = standing(d, job).await? else {
        return Ok(job.clone());
    };
    let now = d.clock.now();
    let written = update_seen(d.store.as_ref(), job, |j| fair::placed(j, s, now)).await?;
    Ok(written.job().unwrap_or_else(|| job.clone()))
}

/// Every job of the queue not yet running whose standing moved to another band: noted, and
/// its message edited.
async fn place_all(d: &Deps, queue: &str, deadline: Deadline) -> Result<(), DispatchError> {
    let open: Vec<OpenJob> = d.store.open_in_queue(queue).await?;
    let (agents, median) = queue_facts(d, queue).await?;
    let now = d.clock.now();
    for o in fair::queue_order(&open) {
        let Some(s) = fair::standing(&open, &o.run_id, agents, median, now) else {
            continue;
        };
        let Ok(run_id) = o.run_id.parse::<RunId>() else {
            continue;
        };
        let Some(job) = d.store.get(&run_id).await? else {
            continue;
        };
        if job.queue_position.map(fair::band) == Some(fair::band(s.position)) {
            continue;
        }
        let written = update_seen(d.store.as_ref(), &job, |j| fair::placed(j, s, now)).await?;
        if let Updated::Written(job) = written {
            deliver::deliver(d, &job, deadline).await?;
        }
    }
    Ok(())
}
