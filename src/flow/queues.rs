//! `GET /queues/{gpu}`: who can run a queue's jobs and how many wait. Agents come from
//! Buildkite's agents API through a cache every instance shares in the store: a burst of
//! calls across instances costs at most one listing every 50 s. Open jobs come from the store's
//! queue index.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Deps;
use crate::buildkite::{Agent, BuildkiteError};
use crate::jobs::{CacheEntry, JobState, OpenJob, Queue, SharedKey, StoreError, next_version};
use crate::retry::Deadline;
use crate::time::Millis;

/// The store key of the shared agents list.
pub(crate) fn agents_key() -> String {
    SharedKey::Agents.key()
}
/// The agents list is refreshed at most this often, by one instance: while releases come
/// (each refreshes it when jobs wait) it stays younger than [`FRESH_MS`].
pub(crate) const REFRESH_MS: Millis = 50_000;
/// The oldest list fair share fills idle GPUs by: an agent idle a minute ago may have taken
/// work since.
pub(crate) const FRESH_MS: Millis = 60_000;
/// A list this old is not served: the agents API has been failing for minutes.
pub(crate) const MAX_STALE_MS: Millis = 10 * 60_000;
/// While another instance fetches the first list, wait this long for it at most.
const WAIT_FOR_FIRST: Duration = Duration::from_secs(3);
/// How old this instance's view of the agents list may be where no Buildkite call is made.
const SEEN_MS: Millis = 5_000;

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("unknown gpu {gpu:?}; known: {known}")]
    UnknownGpu { gpu: String, known: String },
    /// The agents API refused or failed.
    #[error("the Buildkite agents API failed: {0}")]
    Buildkite(#[source] BuildkiteError),
    /// Another instance is fetching the first agents list; try again shortly.
    #[error("the agents list is being fetched; try again shortly")]
    Pending,
    /// The last list is too old to serve and this instance may not refresh it yet.
    #[error("the agents list could not be refreshed for {0} minutes")]
    Stale(i64),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An agent as the cache keeps it: connected agents only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SeenAgent {
    pub(crate) name: String,
    pub(crate) queue: Queue,
    pub(crate) busy: bool,
    /// Paused, as the agents API says (and its note).
    #[serde(default)]
    pub(crate) paused: bool,
    #[serde(default)]
    pub(crate) paused_note: Option<String>,
}

/// One of the queue's agents.
#[derive(Debug, PartialEq)]
pub struct AgentSeen {
    pub name: String,
    pub busy: bool,
    /// Paused (after an infrastructure failure, or by hand): takes no new job.
    pub paused: bool,
}

/// The queue's connected agents, by name.
#[derive(Debug, PartialEq)]
pub struct Agents {
    pub total: usize,
    /// Neither busy nor paused: ready for the next job.
    pub idle: usize,
    pub busy: usize,
    pub paused: usize,
    pub list: Vec<AgentSeen>,
}

/// The queue's open jobs.
#[derive(Debug, PartialEq)]
pub struct Jobs {
    /// `submitted` and `scheduled`, background jobs still waiting left out.
    pub queued: usize,
    pub running: usize,
    /// Background jobs waiting for an idle agent.
    pub background: usize,
}

/// Who can run a queue's jobs and how many wait.
#[derive(Debug, PartialEq)]
pub struct QueueStatus {
    pub gpu: String,
    pub queue: String,
    pub agents: Agents,
    pub jobs: Jobs,
    /// How long the oldest queued job has waited; `None` when none waits.
    pub oldest_queued_secs: Option<u64>,
}

/// The queue's status from the agents seen and its open jobs, at `now`.
pub(crate) fn summarize(
    gpu: &str,
    queue: &str,
    agents: &[SeenAgent],
    open: &[OpenJob],
    now: Millis,
) -> QueueStatus {
    let mut list: Vec<AgentSeen> = agents
        .iter()
        .filter(|a| a.queue == queue)
        .map(|a| AgentSeen {
            name: a.name.clone(),
            busy: a.busy,
            paused: a.paused,
        })
        .collect();
    list.sort_by(|a, b| a.name.cmp(&b.name));
    let busy = list.iter().filter(|a| a.busy).count();
    let paused = list.iter().filter(|a| a.paused && !a.busy).count();
    let queued = || {
        open.iter()
            .filter(|j| matches!(j.state, JobState::Submitted | JobState::Scheduled))
            .filter(|j| !(j.background && j.waiting))
    };
    QueueStatus {
        gpu: gpu.to_owned(),
        queue: queue.to_owned(),
        agents: Agents {
            total: list.len(),
            idle: list.len() - busy - paused,
            busy,
            paused,
            list,
        },
        jobs: Jobs {
            queued: queued().count(),
            running: open.iter().filter(|j| j.state == JobState::Running).count(),
            background: open.iter().filter(|j| j.background && j.waiting).count(),
        },
        oldest_queued_secs: queued()
            .map(|j| j.created_at)
            .min()
            .map(|oldest| ((now - oldest).max(0) / 1000) as u64),
    }
}

/// What the cache keeps of the agents API's answer.
pub(crate) fn seen(agents: &[Agent]) -> Vec<SeenAgent> {
    agents
        .iter()
        .filter(|a| a.is_connected())
        .map(|a| SeenAgent {
            name: a.name.clone(),
            queue: Queue::new(a.queue()),
            busy: a.is_busy(),
            paused: a.paused,
            paused_note: a.paused_note.clone(),
        })
        .collect()
}

/// Whether a cached list is young enough to serve in place of a fresh one.
fn usable(entry: &Option<CacheEntry>, list: &Option<Vec<SeenAgent>>, now: Millis) -> bool {
    list.is_some()
        && entry
            .as_ref()
            .is_some_and(|e| now - e.fetched_at < MAX_STALE_MS)
}

fn parse(entry: &CacheEntry) -> Option<Vec<SeenAgent>> {
    serde_json::from_str(entry.value.as_deref()?).ok()
}

/// When the cached agents list was read from Buildkite, if there is one.
pub(crate) async fn agents_read_at(d: &Deps) -> Result<Option<Millis>, StoreError> {
    let entry = d.store.cached(&agents_key()).await?;
    Ok(entry.filter(|e| e.value.is_some()).map(|e| e.fetched_at))
}

/// The agents list as last cached, however old (no Buildkite call): empty before the first.
pub(crate) async fn cached_agents(d: &Deps) -> Result<Vec<SeenAgent>, StoreError> {
    Ok(listed_agents(d)
        .await?
        .map(|(list, _)| list)
        .unwrap_or_default())
}

/// The agents list as last cached and when Buildkite gave it (no Buildkite call): what fair
/// share counts idle GPUs by while it is younger than [`FRESH_MS`]. The entry as this
/// instance saw it less than [`SEEN_MS`] before serves (it changes once in [`REFRESH_MS`],
/// and this instance's own refresh is seen at once).
pub(crate) async fn listed_agents(
    d: &Deps,
) -> Result<Option<(Vec<SeenAgent>, Millis)>, StoreError> {
    let key = (SharedKey::Agents, d.clock.now());
    let entry = d.seen.entry_within(d.store.as_ref(), key, SEEN_MS).await?;
    Ok(entry.and_then(|e| Some((parse(&e)?, e.fetched_at))))
}

/// `GET /queues/{gpu}`: the queue's agents and open jobs.
pub async fn status(d: &Deps, gpu: &str, deadline: Deadline) -> Result<QueueStatus, QueueError> {
    let queues = &d.config.queues;
    let queue = queues
        .queue_for(gpu)
        .ok_or_else(|| QueueError::UnknownGpu {
            gpu: gpu.to_owned(),
            known: queues.known(),
        })?
        .to_owned();
    let agents = agents(d, deadline).await?;
    let open = d.store.open_in_queue(&queue).await?;
    Ok(summarize(gpu, &queue, &agents, &open, d.clock.now()))
}

/// The agents list: the cached one while under 50 s old; else whoever claims the
/// refresh first lists the agents, and everyone else serves the last list meanwhile.
pub(crate) async fn agents(d: &Deps, deadline: Deadline) -> Result<Vec<SeenAgent>, QueueError> {
    let now = d.clock.now();
    let entry = d.store.cached(&agents_key()).await?;
    d.seen.keep(&agents_key(), entry.clone(), now);
    let cached = entry.as_ref().and_then(parse);
    if let (Some(e), Some(list)) = (&entry, &cached)
        && now - e.fetched_at < REFRESH_MS
    {
        return Ok(list.clone());
    }
    if entry
        .as_ref()
        .is_none_or(|e| now - e.claimed_at >= REFRESH_MS)
    {
        let expected = entry.as_ref().map(|e| e.version);
        let claim = CacheEntry {
            value: entry.as_ref().and_then(|e| e.value.clone()),
            fetched_at: entry.as_ref().map_or(0, |e| e.fetched_at),
            claimed_at: now,
            version: next_version(expected, now),
            expires_at: SharedKey::Agents.expires(now),
        };
        if d.store.put_cached(&agents_key(), &claim, expected).await? {
            return match refresh_agents(d, &claim, deadline).await {
                // Buildkite's window is kept for creates and finishes: the last list serves.
                Err(QueueError::Buildkite(BuildkiteError::RateLimited { .. }))
                    if usable(&entry, &cached, now) =>
                {
                    Ok(cached.unwrap_or_default())
                }
                other => other,
            };
        }
    }
    match (cached, entry.map(|e| now - e.fetched_at)) {
        (Some(list), Some(age)) if age < MAX_STALE_MS => Ok(list),
        (Some(_), Some(age)) => Err(QueueError::Stale(age / 60_000)),
        _ => wait_for_agents(d, deadline).await,
    }
}

/// Lists the agents (this instance holds the minute's `claim`).
async fn refresh_agents(
    d: &Deps,
    claim: &CacheEntry,
    deadline: Deadline,
) -> Result<Vec<SeenAgent>, QueueError> {
    let agents = d
        .buildkite
        .list_agents(deadline)
        .await
        .map_err(QueueError::Buildkite)?;
    let list = seen(&agents);
    let now = d.clock.now();
    let entry = CacheEntry {
        value: serde_json::to_string(&list).ok(),
        fetched_at: now,
        claimed_at: claim.claimed_at,
        version: next_version(Some(claim.version), now),
        expires_at: SharedKey::Agents.expires(now),
    };
    // Lost only to a later claim, whose list is as good.
    if d.store
        .put_cached(&agents_key(), &entry, Some(claim.version))
        .await?
    {
        d.seen.keep(&agents_key(), Some(entry), now);
    }
    Ok(list)
}

/// The first list, fetched by another instance.
async fn wait_for_agents(d: &Deps, deadline: Deadline) -> Result<Vec<SeenAgent>, QueueError> {
    let until = Deadline::after(WAIT_FOR_FIRST.min(deadline.remaining()));
    while until.remaining() > Duration::ZERO {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Some(list) = d
            .store
            .cached(&agents_key())
            .await?
            .as_ref()
            .and_then(parse)
        {
            return Ok(list);
        }
    }
    Err(QueueError::Pending)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(name: &str, queue: &str, busy: bool) -> SeenAgent {
        SeenAgent {
            name: name.into(),
            queue: queue.into(),
            busy,
            paused: false,
            paused_note: None,
        }
    }

    fn open_job(state: JobState, created_at: Millis) -> OpenJob {
        OpenJob {
            run_id: format!("r{created_at}").parse().expect("a run id"),
            state,
            created_at,
            user: None,
            waiting: false,
            background: false,
            scheduled_at: None,
            queue_position: None,
        }
    }

    #[test]
    fn counts_only_this_queues_agents_and_open_jobs() {
        let agents = [
            agent("h100-gpu1", "h100", true),
            agent("h100-gpu0", "h100", false),
            agent("b200-gpu0", "b200", true),
        ];
        let open = [
            open_job(JobState::Submitted, 10_000),
            open_job(JobState::Scheduled, 4_000),
            open_job(JobState::Running, 1_000),
        ];
        let status = summarize("H100_BK", "h100", &agents, &open, 65_000);
        assert_eq!(
            (status.agents.total, status.agents.idle, status.agents.busy),
            (2, 1, 1)
        );
        assert_eq!(status.agents.list[0].name, "h100-gpu0", "sorted by name");
        assert_eq!((status.jobs.queued, status.jobs.running), (2, 1));
        assert_eq!(
            status.oldest_queued_secs,
            Some(61),
            "the running job is not waiting"
        );
        let running = [open_job(JobState::Running, 0)];
        let empty = summarize("H100_BK", "h100", &[], &running, 9_000);
        assert_eq!(empty.oldest_queued_secs, None);
        assert_eq!(empty.agents.total, 0);
    }

    #[test]
    fn only_connected_agents_are_kept_with_their_queue_tag() {
        let agents: Vec<Agent> = serde_json::from_value(serde_json::json!([
            {"name": "a", "connection_state": "connected", "meta_data": ["queue=h100", "gpu=0"], "job": {"id": "j"}},
            {"name": "b", "connection_state": "disconnected", "meta_data": ["queue=h100"], "job": null},
            {"name": "c", "connection_state": "connected", "meta_data": [], "job": null},
            {"name": "d", "connection_state": "lost", "meta_data": ["queue=h100"]}
        ]))
        .unwrap();
        assert_eq!(
            seen(&agents),
            [agent("a", "h100", true), agent("c", "default", false)]
        );
    }
}
