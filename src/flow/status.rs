//! The public status page's figures (`GET /status`): per queue, its agents busy, idle and
//! paused (the cached agents list), its jobs waiting and running (the queue index), the
//! median wait and run time of the last hour and the jobs and infrastructure failures of the
//! last 24 hours (the queue's record, kept as jobs end). Counts only: nothing of any job
//! (run id, user, title, config) and no secret, and no Buildkite call.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::queues::cached_agents;
use super::{Deps, fair};
use crate::jobs::{JobState, Queue, StoreError};
use crate::time::Millis;

const HOUR_MS: Millis = 3_600_000;

/// One queue, as the page shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueueHealth {
    pub queue: String,
    /// The GPU names submissions use for it (`GPU_QUEUES`).
    pub gpus: Vec<String>,
    pub agents_busy: usize,
    pub agents_idle: usize,
    pub agents_paused: usize,
    /// Jobs not yet running: waiting for their turn or for an agent (background ones apart).
    pub jobs_waiting: usize,
    /// Background jobs waiting for an idle agent.
    pub jobs_background: usize,
    pub jobs_running: usize,
    pub median_wait_secs_last_hour: Option<f64>,
    pub median_run_secs_last_hour: Option<f64>,
    pub jobs_last_24h: u32,
    pub infra_failures_last_24h: u32,
}

/// The whole page.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StatusPage {
    /// When the figures were read (ms since the epoch).
    pub generated_at: Millis,
    /// How old the agents list is (ms), `None` before the first.
    pub agents_age_ms: Option<Millis>,
    pub queues: Vec<QueueHealth>,
}

/// Reads the page's figures from the store.
pub async fn page(d: &Deps) -> Result<StatusPage, StoreError> {
    let now = d.clock.now();
    let agents = cached_agents(d).await?;
    let agents_age_ms = d
        .store
        .cached(&super::queues::agents_key())
        .await?
        .filter(|e| e.value.is_some())
        .map(|e| now - e.fetched_at);
    let mut queues: Vec<(Queue, Vec<String>)> = Vec::new();
    for gpu in d.config.queues.gpus() {
        let Some(queue) = d.config.queues.queue_for(gpu) else {
            continue;
        };
        match queues.iter_mut().find(|(q, _)| q == queue) {
            Some((_, gpus)) => gpus.push(gpu.to_owned()),
            None => queues.push((Queue::new(queue), vec![gpu.to_owned()])),
        }
    }
    let mut out = Vec::new();
    for (queue, gpus) in queues {
        let open = d.store.open_in_queue(&queue).await?;
        let record = fair::queue_record(d, &queue).await?;
        let ours = agents.iter().filter(|a| a.queue == queue);
        let busy = ours.clone().filter(|a| a.busy).count();
        let paused = ours.clone().filter(|a| a.paused && !a.busy).count();
        let (wait, run) = record.medians_since(now - HOUR_MS);
        let (jobs, infra) = record.last_day(now);
        let secs = |ms: Option<Millis>| ms.map(crate::time::secs_of);
        out.push(QueueHealth {
            agents_idle: ours.count() - busy - paused,
            agents_busy: busy,
            agents_paused: paused,
            jobs_waiting: open
                .iter()
                .filter(|j| j.state != JobState::Running && !(j.background && j.waiting))
                .count(),
            jobs_background: open.iter().filter(|j| j.background && j.waiting).count(),
            jobs_running: open.iter().filter(|j| j.state == JobState::Running).count(),
            median_wait_secs_last_hour: secs(wait),
            median_run_secs_last_hour: secs(run),
            jobs_last_24h: jobs,
            infra_failures_last_24h: infra,
            queue: queue.to_string(),
            gpus,
        });
    }
    Ok(StatusPage {
        generated_at: now,
        agents_age_ms,
        queues: out,
    })
}

/// How long one instance serves a page it read: a crowd refreshing it costs the store one
/// read of each queue every few seconds.
pub const PAGE_FRESH: Duration = Duration::from_secs(5);

/// A page, and when it was read.
type Kept = Option<(Instant, Arc<StatusPage>)>;

/// The last page an instance read, and when.
#[derive(Clone, Default)]
pub(crate) struct PageCache(Arc<Mutex<Kept>>);

/// The page, read afresh at most every [`PAGE_FRESH`] by this instance.
pub async fn cached_page(d: &Deps) -> Result<Arc<StatusPage>, StoreError> {
    let kept = |cache: &PageCache| {
        let held = cache.0.lock().unwrap_or_else(|p| p.into_inner());
        held.as_ref()
            .filter(|(at, _)| at.elapsed() < PAGE_FRESH)
            .map(|(_, page)| page.clone())
    };
    if let Some(page) = kept(&d.status_page) {
        return Ok(page);
    }
    let page = Arc::new(page(d).await?);
    *d.status_page.0.lock().unwrap_or_else(|p| p.into_inner()) =
        Some((Instant::now(), page.clone()));
    Ok(page)
}
