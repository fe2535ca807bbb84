//! Fair share as the functions run it: a submission waits in the store while its user has
//! `USER_MAX_IN_FLIGHT` builds on the queue; waiting jobs are released (round-robin over
//! users, oldest first: [`fair`](super::rules::fair)) by whoever holds the queue's short
//! lease in the store, when a submission arrives, when a job of the queue ends, and on every
//! sweep pass. The lease keeps two instances from both filling one user's last slot; the
//! job's own compare-and-swap (its creation's claim) keeps a build from being made twice.
//! Also each job's standing on its queue, for the API and its status message.

use std::collections::HashMap;
use std::time::Duration;

use tracing::{info, warn};

use super::create::create_if_due;
use super::effects::Effects;
use super::queues::{cached_agents, recent_agents};
use super::rules::fair;
pub(crate) use super::rules::fair::Standing;
use super::rules::stats::{Ended, QueueRecord};
use super::{Deps, DispatchError};
use crate::discord::Priority;
use crate::jobs::{
    CacheEntry, Job, JobState, OpenJob, Queue, RunId, SharedKey, StoreError, Updated, next_version,
    shared, update_seen,
};
use crate::result::Verdict;
use crate::retry::Deadline;
use crate::time::Millis;

/// How long a queue's lease is held at most (a holder that dies frees it this late).
const LEASE_MS: Millis = 5_000;
/// Messages one end edits at most for places that moved (Discord allows a webhook about five
/// requests per two seconds; the next end or sweep pass goes on).
const MAX_PLACE_EDITS: usize = 8;
/// How long to wait for a queue's lease another instance holds.
const LEASE_WAIT: Duration = Duration::from_secs(3);
/// The longest a release waits for the agents list.
const AGENTS_WAIT: Duration = Duration::from_secs(2);

fn lease_key(queue: &Queue) -> String {
    SharedKey::FairLease(queue).key()
}

/// The jobs a release let go: the submitter's own (which it creates itself), and others.
#[derive(Debug, Default)]
pub(crate) struct Released {
    pub(crate) mine: Option<Job>,
    pub(crate) others: Vec<Job>,
    /// Jobs of the queue still wait.
    pub(crate) waiting_left: bool,
}

/// What a release knows that the queue index may not show yet (a global index lags its
/// table): the submit's own new job, or the job that just ended.
#[derive(Clone, Copy, Default)]
pub(crate) struct Fresh<'a> {
    /// The job of the submit calling, whose creation it holds.
    pub(crate) mine: Option<&'a Job>,
    /// A job of the queue that has just ended: no longer in flight.
    pub(crate) ended: Option<&'a RunId>,
}

/// Releases the queue's waiting jobs that fair share lets go now. With no limit (0), every
/// waiting job goes (jobs left waiting when fair share was turned off included).
pub(crate) async fn release(
    d: &Deps,
    queue: &Queue,
    fresh: Fresh<'_>,
) -> Result<Released, StoreError> {
    let limit = match d.config.user_max_in_flight {
        0 => usize::MAX,
        n => n,
    };
    let Some(lease) = take_lease(d, queue).await? else {
        warn!(
            %queue,
            "the queue's fair-share lease stayed taken; released next time"
        );
        return Ok(Released::default());
    };
    let released = release_held(d, queue, fresh, limit).await;
    give_back(d, queue, lease).await;
    if released.as_ref().is_ok_and(|r| r.waiting_left) {
        // Whether GPUs would idle is read from the agents list: kept at most a minute old
        // while jobs wait (a call a minute, none when Buildkite's window is low), outside
        // the lease, for the next release.
        if let Err(e) = super::queues::agents(d, Deadline::after(AGENTS_WAIT)).await {
            warn!(error = %e, %queue, "the agents list could not be read; the last one serves");
        }
    }
    released
}

/// The queue's open jobs as the index shows them, corrected by what this caller knows.
async fn open_jobs(d: &Deps, queue: &Queue, fresh: Fresh<'_>) -> Result<Vec<OpenJob>, StoreError> {
    let mut open = d.store.open_in_queue(queue).await?;
    if let Some(ended) = fresh.ended {
        open.retain(|j| &j.run_id != ended);
    }
    if let Some(mine) = fresh.mine
        && !open.iter().any(|j| j.run_id == mine.run_id)
    {
        open.push(OpenJob::from(mine));
    }
    Ok(open)
}

async fn release_held(
    d: &Deps,
    queue: &Queue,
    fresh: Fresh<'_>,
    limit: usize,
) -> Result<Released, StoreError> {
    let open = open_jobs(d, queue, fresh).await?;
    let now = d.clock.now();
    // A paused agent takes no job; a list past its age is not counted on.
    let agents = recent_agents(d)
        .await?
        .iter()
        .filter(|a| &a.queue == queue && !a.paused)
        .count();
    let releases = fair::releases(&open, limit, agents);
    let mut out = Released {
        waiting_left: open.iter().filter(|j| j.waiting).count() > releases.len(),
        ..Released::default()
    };
    for o in releases {
        let run_id = &o.run_id;
        let job = match d.store.get(run_id).await {
            Ok(Some(job)) => job,
            Ok(None) => continue,
            // One record this version cannot read holds back no other.
            Err(e @ StoreError::Corrupt(_)) => {
                warn!(error = %e, %run_id, "a waiting job could not be read");
                continue;
            }
            Err(e) => return Err(e),
        };
        let held = fresh.mine.is_some_and(|m| &m.run_id == run_id);
        let written = update_seen(d.store.as_ref(), &job, |j| fair::release_job(j, now, held));
        if let Updated::Written(job) = written.await? {
            info!(run_id = %job.run_id, %queue, "released by fair share");
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
async fn take_lease(d: &Deps, queue: &Queue) -> Result<Option<Millis>, StoreError> {
    let key = lease_key(queue);
    let until = Deadline::after(LEASE_WAIT);
    loop {
        let now = d.clock.now();
        let entry = d.store.cached(&key).await?;
        let held_until = entry
            .as_ref()
            .and_then(|e| e.value.as_deref()?.parse::<Millis>().ok());
        if held_until.is_none_or(|t| t <= now) {
            let version = entry.as_ref().map(|e| e.version);
            let next = lease_entry(Some(now + LEASE_MS), queue, next_version(version, now), now);
            if d.store.put_cached(&key, &next, version).await? {
                return Ok(Some(next.version));
            }
            continue;
        }
        if until.remaining().is_zero() {
            return Ok(None);
        }
        // Jittered, so instances waiting for one lease do not all ask at once.
        tokio::time::sleep(Duration::from_millis(40 + fastrand::u64(0..40))).await;
    }
}

/// The queue's lease entry at `version`: held until `until`, or free.
fn lease_entry(until: Option<Millis>, queue: &Queue, version: Millis, now: Millis) -> CacheEntry {
    let expires_at = SharedKey::FairLease(queue).expires(now);
    CacheEntry::unclaimed(until.map(|t| t.to_string()), now, version, expires_at)
}

async fn give_back(d: &Deps, queue: &Queue, version: Millis) {
    let now = d.clock.now();
    let free = lease_entry(None, queue, next_version(Some(version), now), now);
    if let Err(e) = d
        .store
        .put_cached(&lease_key(queue), &free, Some(version))
        .await
    {
        warn!(error = %e, %queue, "the fair-share lease could not be given back; it expires");
    }
}

/// After a job of `job.queue` ended (written by this instance): its run time noted, the
/// waiting jobs its slot lets go released and created, and the waiting jobs whose standing
/// moved to another band marked; what they owe (their messages) is left to `effects`.
/// Trouble here is logged: the job itself has ended.
pub(crate) async fn after_end(d: &Deps, job: &Job, deadline: Deadline, effects: &mut Effects) {
    if let Err(e) = note_end(d, job).await {
        warn!(error = %e, "the ended job could not be noted on its queue's record");
    }
    let fresh = Fresh {
        mine: None,
        ended: Some(&job.run_id),
    };
    match release(d, &job.queue, fresh).await {
        Ok(released) => {
            // Creates the rate limit deferred are older than these: they go first.
            super::catch_up::take_up_creates(d, &job.queue, deadline, effects).await;
            create_released(d, released.others, deadline, effects).await;
        }
        Err(e) => warn!(error = %e, queue = %job.queue, "waiting jobs could not be released"),
    }
    if let Err(e) = place_all(d, &job.queue, effects).await {
        warn!(error = %e, queue = %job.queue, "waiting jobs could not be shown their place");
    }
}

/// Creates the builds of jobs a release let go, one after another (what they owe left to
/// `effects`); one that fails is left to the sweep (its creation is due) and holds back no
/// other.
pub(crate) async fn create_released(
    d: &Deps,
    jobs: Vec<Job>,
    deadline: Deadline,
    effects: &mut Effects,
) {
    for job in jobs {
        let bk_deadline = d.buildkite_deadline(deadline);
        if let Err(e) = create_if_due(d, &job, bk_deadline, effects).await {
            warn!(error = %e, run_id = %job.run_id, "a released job's build is left to the sweep");
        }
    }
}

/// Notes an ended job on its queue's record (its wait and run time, whether the node
/// failed it): what the status page and the expected start read.
async fn note_end(d: &Deps, job: &Job) -> Result<(), StoreError> {
    let Some(outcome) = job.outcome.as_deref() else {
        return Ok(());
    };
    let ms = |secs: Option<f64>| secs.map(|s| (s * 1000.0) as Millis);
    let ended = Ended {
        at: d.clock.now(),
        waited_ms: ms(outcome.timings.and_then(|t| t.queued_secs)),
        ran_ms: ms(outcome.timings.and_then(|t| t.ran_secs)),
    };
    let infra = outcome.verdict == Verdict::Infra;
    let key = SharedKey::QueueRecord(&job.queue);
    let now = d.clock.now();
    let note = |record: &mut QueueRecord| record.note(ended.clone(), infra);
    shared::update(d.store.as_ref(), key, now, QueueRecord::default, note).await?;
    Ok(())
}

/// A queue's record of its ended jobs, as last written.
pub(crate) async fn queue_record(d: &Deps, queue: &Queue) -> Result<QueueRecord, StoreError> {
    let key = SharedKey::QueueRecord(queue);
    let (record, _) = shared::read(d.store.as_ref(), key, d.clock.now()).await?;
    Ok(record.unwrap_or_default())
}

/// What a standing is computed from, besides the queue's open jobs: its connected agents
/// (the cached list; no Buildkite call) and the median of its recent run times.
async fn queue_facts(d: &Deps, queue: &Queue) -> Result<(usize, Option<Millis>), StoreError> {
    // A paused agent takes no job: it does not shorten anyone's wait.
    let agents = cached_agents(d)
        .await?
        .iter()
        .filter(|a| &a.queue == queue && !a.paused)
        .count();
    Ok((agents, queue_record(d, queue).await?.median_run()))
}

/// Where `job` stands on its queue now; `None` once it runs (or has ended).
pub(crate) async fn standing(d: &Deps, job: &Job) -> Result<Option<Standing>, StoreError> {
    if job.state.rank() >= JobState::Running.rank() {
        return Ok(None);
    }
    let open = d.store.open_in_queue(&job.queue).await?;
    let (agents, median) = queue_facts(d, &job.queue).await?;
    let now = d.clock.now();
    Ok(fair::standing(&open, &job.run_id, agents, median, now))
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
/// its message's edit left to `effects`, while its webhook's bucket has room for a place
/// edit (the reports, first messages and starts come first; a place not shown now is shown
/// by a later end or pass).
async fn place_all(d: &Deps, queue: &Queue, effects: &mut Effects) -> Result<(), DispatchError> {
    let open: Vec<OpenJob> = d.store.open_in_queue(queue).await?;
    let (agents, median) = queue_facts(d, queue).await?;
    let now = d.clock.now();
    let (mut edits, mut promised) = (0, HashMap::<String, i64>::new());
    for o in fair::queue_order(&open) {
        if edits == MAX_PLACE_EDITS {
            // The rest move on at the next end (or pass): a few edits per invocation.
            break;
        }
        let Some(s) = fair::standing(&open, &o.run_id, agents, median, now) else {
            continue;
        };
        let Some(job) = d.store.get(&o.run_id).await? else {
            continue;
        };
        if job.queue_position.map(fair::band) == Some(fair::band(s.position)) {
            continue;
        }
        if let Some((webhook, room)) = d.discord_room(&job, Priority::Place) {
            let edits_to = promised.entry(webhook).or_default();
            if *edits_to >= room {
                continue;
            }
            *edits_to += 1;
        }
        let written = update_seen(d.store.as_ref(), &job, |j| fair::placed(j, s, now)).await?;
        if let Updated::Written(job) = written {
            edits += 1;
            effects.deliver(job);
        }
    }
    Ok(())
}
