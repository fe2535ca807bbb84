//! Fair share as the functions run it: a submission waits in the store while its user has
//! `USER_MAX_IN_FLIGHT` builds on the queue, or the queue as many builds as its GPUs and a
//! few queued; waiting jobs are released (the user with the fewest in flight first, a batch
//! bigger than the queue's GPUs last among equals, oldest first: [`fair`](super::rules::fair)) by whoever holds the queue's short
//! lease in the store, when a submission arrives, when a job of the queue ends, and on every
//! sweep pass. The lease keeps two instances from both filling one user's last slot; the
//! job's own compare-and-swap (its creation's claim) keeps a build from being made twice.
//! Also each job's standing on its queue, for the API and its status message.

use std::collections::HashMap;
use std::time::Duration;

use tracing::{info, warn};

use super::create::create_if_due;
use super::effects::Effects;
use super::lease::{self, Taken};
use super::queues::{FRESH_MS, MAX_STALE_MS, REFRESH_MS, cached_agents, listed_agents};
use super::rules::fair;
pub(crate) use super::rules::fair::Standing;
use super::rules::lease::Asked;
use super::rules::stats::{Ended, QueueRecord};
use super::{Deps, DispatchError};
use crate::discord::Priority;
use crate::jobs::{
    Job, JobState, OpenJob, Queue, RunId, SharedKey, StoreError, Updated, View, update_seen,
};
use crate::result::Verdict;
use crate::retry::Deadline;
use crate::time::Millis;

/// Messages one end edits at most for places that moved (Discord allows a webhook about five
/// requests per two seconds; the next end or sweep pass goes on).
const MAX_PLACE_EDITS: usize = 8;
/// Rounds one holder releases at most before it lets go (asks left for the next holder).
const MAX_ROUNDS: usize = 4;
/// How old a queue's record seen by this instance may be for a standing shown.
const RECORD_SEEN_MS: Millis = 5_000;
/// How old a queue's deferred list seen by this instance may be when releasing by it: a
/// finish deferred meanwhile counts in flight that much longer.
const DEFERRED_SEEN_MS: Millis = 5_000;
/// The longest a release waits for the agents list.
const AGENTS_WAIT: Duration = Duration::from_secs(2);
/// Jobs one end reads at most to place them: those whose place the queue index shows
/// moved (it may lag a write, so a few turn out not to have), less those whose webhook
/// this instance knows has no room (read once to learn it, then passed by unread while it
/// has none). Those past it come at a later end: a webhook's bucket is a couple of seconds
/// long, and a wider cap costs every end its reads while it is spent (measured in the
/// rush: 16 → 32 raised read units a job from 52 to 66).
const MAX_PLACE_READS: usize = 2 * MAX_PLACE_EDITS;

/// The jobs a release let go: the submitter's own (which it creates itself), and others.
#[derive(Debug, Default)]
pub(crate) struct Released {
    pub(crate) mine: Option<Job>,
    pub(crate) others: Vec<Job>,
    /// Jobs of the queue still wait.
    pub(crate) waiting_left: bool,
    /// When Buildkite gave the agents list the release went by (0: there was none).
    pub(crate) agents_listed_at: Millis,
    /// The queue as the last round saw it, its releases noted: what placing goes by,
    /// without reading the queue again.
    pub(crate) seen: Option<Seen>,
}

/// A queue's open jobs and the agents that take them, as one release read them.
#[derive(Debug)]
pub(crate) struct Seen {
    pub(crate) open: Vec<OpenJob>,
    pub(crate) agents: usize,
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
/// waiting job goes (jobs left waiting when fair share was turned off included). Another
/// instance holding the queue's lease is asked to release again (this caller's fresh
/// knowledge with it) rather than waited for; the holder does so before letting go.
pub(crate) async fn release(
    d: &Deps,
    queue: &Queue,
    fresh: Fresh<'_>,
) -> Result<Released, StoreError> {
    let mut out = release_rounds(d, queue, fresh).await?;
    let age = d.clock.now() - out.agents_listed_at;
    if !out.waiting_left || age < REFRESH_MS {
        return Ok(out);
    }
    // Whether GPUs would idle is read from the agents list: kept under a minute old while
    // jobs wait (refreshed once 50 s old, one call for every instance, none when Buildkite's
    // window is low), outside the lease. A release that found it a minute old or more (a
    // quiet queue, a sweep pass) goes again with the new one: else idle GPUs would wait for
    // the next end.
    match super::queues::agents(d, Deadline::after(AGENTS_WAIT)).await {
        Ok(_) if age >= FRESH_MS => match release_rounds(d, queue, fresh).await {
            Ok(again) => out.add(again),
            Err(e) => warn!(error = %e, %queue, "idle GPUs wait for the next release"),
        },
        Ok(_) => {}
        Err(e) => {
            warn!(error = %e, %queue, "the agents list could not be read; the last one serves")
        }
    }
    Ok(out)
}

/// [`release`] under the queue's lease: a round, and another for each ask that came while
/// it was held.
async fn release_rounds(d: &Deps, queue: &Queue, fresh: Fresh<'_>) -> Result<Released, StoreError> {
    let limit = match d.config.user_max_in_flight {
        0 => usize::MAX,
        n => n,
    };
    let (mut held, mut asked) = match lease::take(d, queue, &fresh.knew()).await? {
        Taken::Held(held, asked) => (held, asked),
        Taken::Asked => {
            info!(%queue, "the queue's lease is held: its holder releases again");
            return Ok(Released::default());
        }
    };
    let mut out = Released::default();
    for round in 1..=MAX_ROUNDS {
        let released = release_held(d, queue, (fresh, &asked), limit).await;
        let last = round == MAX_ROUNDS || released.is_err();
        let again = lease::leave(d, queue, held, last).await;
        out.add(released?);
        match again {
            Ok(Some((h, a))) => (held, asked) = (h, a),
            Ok(None) => break,
            Err(e) => {
                warn!(error = %e, %queue, "the fair-share lease could not be given back; it expires");
                break;
            }
        }
    }
    Ok(out)
}

impl Released {
    /// Adds a later round's releases (its word on what still waits is the latest; its view
    /// of the queue, which the index may show before this one's releases, gets them).
    fn add(&mut self, mut later: Released) {
        if let Some(seen) = later.seen.as_mut() {
            for job in self.mine.iter().chain(&self.others) {
                if let Some(o) = seen.open.iter_mut().find(|o| o.run_id == job.run_id) {
                    *o = OpenJob::from(job);
                }
            }
        }
        self.mine = self.mine.take().or(later.mine);
        self.others.extend(later.others);
        self.waiting_left = later.waiting_left;
        self.agents_listed_at = later.agents_listed_at;
        self.seen = later.seen.or(self.seen.take());
    }
}

impl Fresh<'_> {
    /// What this caller knows, as a lease's ask carries it.
    fn knew(&self) -> Asked {
        Asked {
            ended: self.ended.into_iter().cloned().collect(),
            new: self.mine.map(|j| j.run_id.clone()).into_iter().collect(),
        }
    }
}

/// The queue's open jobs as the index shows them, corrected by what this caller knows and
/// what the asks of the lease knew.
async fn open_jobs(
    d: &Deps,
    queue: &Queue,
    (fresh, asked): (Fresh<'_>, &Asked),
) -> Result<Vec<OpenJob>, StoreError> {
    let mut open = d.store.open_in_queue(queue).await?;
    let ended = fresh.ended.into_iter().chain(&asked.ended);
    for gone in ended {
        open.retain(|j| &j.run_id != gone);
    }
    if let Some(mine) = fresh.mine
        && !open.iter().any(|j| j.run_id == mine.run_id)
    {
        open.push(OpenJob::from(mine));
    }
    for new in &asked.new {
        if open.iter().any(|j| &j.run_id == new) {
            continue;
        }
        if let Some(job) = d.store.get(new).await?
            && !job.state.is_terminal()
        {
            open.push(OpenJob::from(&job));
        }
    }
    Ok(open)
}

async fn release_held(
    d: &Deps,
    queue: &Queue,
    (fresh, asked): (Fresh<'_>, &Asked),
    limit: usize,
) -> Result<Released, StoreError> {
    let mut open = open_jobs(d, queue, (fresh, asked)).await?;
    let now = d.clock.now();
    let (agents, taking, listed_at) = agents_for_release(d, queue, now).await?;
    if fair::bounded(&open, limit, agents) {
        without_ended_builds(d, queue, &mut open).await;
    }
    let releases: Vec<RunId> = fair::releases(&open, limit, agents)
        .into_iter()
        .map(|o| o.run_id.clone())
        .collect();
    let mut out = Released {
        waiting_left: open.iter().filter(|j| j.waiting).count() > releases.len(),
        agents_listed_at: listed_at,
        ..Released::default()
    };
    for run_id in &releases {
        let Some(job) = read_waiting(d, run_id).await? else {
            continue;
        };
        let held = fresh.mine.is_some_and(|m| &m.run_id == run_id);
        let written = update_seen(d.store.as_ref(), &job, |j| fair::release_job(j, now, held));
        if let Updated::Written(job) = written.await? {
            info!(run_id = %job.run_id, %queue, "released by fair share");
            if let Some(o) = open.iter_mut().find(|o| o.run_id == job.run_id) {
                *o = OpenJob::from(&job);
            }
            if held {
                out.mine = Some(job);
            } else {
                out.others.push(job);
            }
        }
    }
    // Standings go by the list however old, as a job's own place does.
    out.seen = Some(Seen {
        open,
        agents: taking,
    });
    Ok(out)
}

/// `open` less the jobs whose builds ended with their results not yet read (a finish
/// Buildkite's rate limit deferred): they hold no GPU, and counted in flight they would
/// keep the queue's bound shut while its GPUs idle. Trouble reading the list is logged: the
/// bound then counts them.
async fn without_ended_builds(d: &Deps, queue: &Queue, open: &mut Vec<OpenJob>) {
    match super::deferred::finishes_seen(d, queue, DEFERRED_SEEN_MS).await {
        Ok(ended) => open.retain(|j| !ended.contains(&j.run_id)),
        Err(e) => warn!(error = %e, %queue, "deferred finishes could not be read"),
    }
}

/// The queue's agents as the cached list shows them: what a release may fill idle GPUs by
/// (nothing from a list [`FRESH_MS`] old or more), how many take jobs however old it is
/// (what standings go by), and when Buildkite gave it. A paused agent takes no job.
async fn agents_for_release(
    d: &Deps,
    queue: &Queue,
    now: Millis,
) -> Result<(fair::Agents, usize, Millis), StoreError> {
    let (listed, listed_at) = listed_agents(d).await?.unwrap_or_default();
    let taking: Vec<_> = listed
        .iter()
        .filter(|a| &a.queue == queue && !a.paused)
        .collect();
    let stale = now - listed_at >= FRESH_MS;
    // A list a minute old still bounds the builds queued (agents come and go rarely); it
    // fills no idle GPU. One [`MAX_STALE_MS`] old bounds nothing: GPUs that came since
    // would idle by it.
    let agents = fair::Agents {
        taking: if now - listed_at < MAX_STALE_MS {
            taking.len()
        } else {
            0
        },
        idle: if stale {
            0
        } else {
            taking.iter().filter(|a| !a.busy).count()
        },
        listed_at,
    };
    Ok((agents, taking.len(), listed_at))
}

/// A job of the queue as stored, to release or place it; `None` when it is gone or its
/// record cannot be read (logged: one such record holds back no other).
async fn read_waiting(d: &Deps, run_id: &RunId) -> Result<Option<Job>, StoreError> {
    match d.store.get(run_id).await {
        Err(e @ StoreError::Corrupt(_)) => {
            warn!(error = %e, %run_id, "a waiting job could not be read");
            Ok(None)
        }
        read => read,
    }
}

/// After a job of `job.queue` ended (written by this instance): its run time noted, the
/// waiting jobs its slot lets go released and created, and the waiting jobs whose standing
/// moved to another band marked; what they owe (their messages) is left to `effects`.
/// Trouble here is logged: the job itself has ended.
pub(crate) async fn after_end(d: &Deps, job: &Job, deadline: Deadline, effects: &mut Effects) {
    let median = match note_end(d, job).await {
        Ok(record) => record.map(|r| r.median_run()),
        Err(e) => {
            warn!(error = %e, "the ended job could not be noted on its queue's record");
            None
        }
    };
    let fresh = Fresh {
        mine: None,
        ended: Some(&job.run_id),
    };
    let seen = match release(d, &job.queue, fresh).await {
        Ok(released) => {
            // Creates the rate limit deferred are older than these: they go first.
            super::catch_up::take_up_creates(d, &job.queue, deadline, effects).await;
            create_released(d, released.others, deadline, effects).await;
            released.seen
        }
        Err(e) => {
            warn!(error = %e, queue = %job.queue, "waiting jobs could not be released");
            None
        }
    };
    if let Err(e) = place_all(d, &job.queue, (seen, median), effects).await {
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
/// failed it): what the status page and the expected start read. The record as written.
async fn note_end(d: &Deps, job: &Job) -> Result<Option<QueueRecord>, StoreError> {
    let Some(outcome) = job.outcome.as_deref() else {
        return Ok(None);
    };
    let ms = |secs: Option<f64>| secs.map(crate::time::millis_in);
    let ended = Ended {
        at: d.clock.now(),
        waited_ms: ms(outcome.timings.and_then(|t| t.queued_secs)),
        ran_ms: ms(outcome.timings.and_then(|t| t.ran_secs)),
    };
    let infra = outcome.verdict == Verdict::Infra;
    let key = SharedKey::QueueRecord(&job.queue);
    let now = d.clock.now();
    let note = |record: &mut QueueRecord| {
        record.note(ended.clone(), infra);
        record.clone()
    };
    let store = d.store.as_ref();
    let changed = d.seen.update(store, (key, now), QueueRecord::default, note);
    Ok(Some(changed.await?.said))
}

/// A queue's record of its ended jobs, as last written (or as this instance saw it less
/// than [`RECORD_SEEN_MS`] before: the median run time it gives is shown, not decided by).
pub(crate) async fn queue_record(d: &Deps, queue: &Queue) -> Result<QueueRecord, StoreError> {
    let key = (SharedKey::QueueRecord(queue), d.clock.now());
    let record = d.seen.read_within(d.store.as_ref(), key, RECORD_SEEN_MS);
    Ok(record.await?.unwrap_or_default())
}

/// What a standing is computed from, besides the queue's open jobs: its connected agents
/// (the cached list; no Buildkite call) and the median of its recent run times.
async fn queue_facts(d: &Deps, queue: &Queue) -> Result<(usize, Option<Millis>), StoreError> {
    let agents = queue_agents(d, queue).await?;
    Ok((agents, queue_record(d, queue).await?.median_run()))
}

/// The queue's agents that take jobs, from the cached list (no Buildkite call): a paused
/// agent takes no job, so it does not shorten anyone's wait.
async fn queue_agents(d: &Deps, queue: &Queue) -> Result<usize, StoreError> {
    Ok(cached_agents(d)
        .await?
        .iter()
        .filter(|a| &a.queue == queue && !a.paused)
        .count())
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
/// `seen`, a release's view of the queue that holds the job, spares reading it again.
pub(crate) async fn place(d: &Deps, job: &Job, seen: Option<&Seen>) -> Result<Job, StoreError> {
    let known = seen.filter(|s| s.open.iter().any(|o| o.run_id == job.run_id));
    let s = match known {
        _ if job.state.rank() >= JobState::Running.rank() => None,
        Some(seen) => {
            // The job as it is now (its build made since the release, perhaps).
            let mut open = seen.open.clone();
            open.retain(|o| o.run_id != job.run_id);
            open.push(OpenJob::from(job));
            let median = queue_record(d, &job.queue).await?.median_run();
            let now = d.clock.now();
            fair::standing(&open, &job.run_id, seen.agents, median, now)
        }
        None => standing(d, job).await?,
    };
    let Some(s) = s else {
        return Ok(job.clone());
    };
    let now = d.clock.now();
    let written = update_seen(d.store.as_ref(), job, |j| fair::placed(j, s, now)).await?;
    Ok(written.job().unwrap_or_else(|| job.clone()))
}

/// Every job of the queue not yet running whose standing moved to another band: noted, and
/// its message's edit left to `effects`, while its webhook's bucket has room for a place
/// edit (the reports, first messages and starts come first; a place not shown now is shown
/// by a later end or pass). Goes by what the end already read (`known`: the release's view
/// of the queue, the record's median run time) and reads only the jobs whose place the
/// index shows moved: an end's reads do not grow with the jobs waiting.
async fn place_all(
    d: &Deps,
    queue: &Queue,
    known: (Option<Seen>, Option<Option<Millis>>),
    effects: &mut Effects,
) -> Result<(), DispatchError> {
    let (seen, median) = known;
    let Seen { open, agents } = match seen {
        Some(seen) => seen,
        None => Seen {
            open: d.store.open_in_queue(queue).await?,
            agents: queue_agents(d, queue).await?,
        },
    };
    let median = match median {
        Some(median) => median,
        None => queue_record(d, queue).await?.median_run(),
    };
    let now = d.clock.now();
    d.place_buckets.keep_open(queue, &open);
    let moved = fair::standings(&open, agents, median, now)
        .into_iter()
        .filter(|&(o, s)| fair::moved(o, s));
    let mut placing = Placing::default();
    for (o, s) in moved {
        if placing.edits == MAX_PLACE_EDITS || placing.reads == MAX_PLACE_READS {
            // The rest move on at the next end (or pass): a few edits per invocation.
            break;
        }
        if placing.full(d, &o.run_id) {
            continue;
        }
        placing.reads += 1;
        if let Some(job) = place_one(d, (queue, &o.run_id, s), &mut placing.promised).await? {
            placing.edits += 1;
            effects.deliver(job, View::Own);
        }
    }
    Ok(())
}

/// What one end's placing has done so far: jobs read, edits made, and edits promised to
/// each webhook's bucket.
#[derive(Default)]
struct Placing {
    reads: usize,
    edits: usize,
    promised: HashMap<String, i64>,
}

impl Placing {
    /// Whether `run_id`'s message goes to a bucket this instance knows has no room left for
    /// a place edit (then the job is not read).
    fn full(&self, d: &Deps, run_id: &RunId) -> bool {
        let Some(Some(bucket)) = d.place_buckets.bucket(run_id) else {
            return false;
        };
        let promised = self.promised.get(&bucket).copied().unwrap_or(0);
        d.discord.bucket_room(&bucket, Priority::Place) <= promised
    }
}

/// Reads a waiting job whose place moved and notes its standing `s` on it, while its
/// webhook's bucket has room for the edit (counted in `promised`); the job as written.
async fn place_one(
    d: &Deps,
    (queue, run_id, s): (&Queue, &RunId, Standing),
    promised: &mut HashMap<String, i64>,
) -> Result<Option<Job>, StoreError> {
    let Some(job) = read_waiting(d, run_id).await? else {
        return Ok(None);
    };
    let room = d.discord_room(&job, Priority::Place);
    let bucket = room.as_ref().map(|(webhook, _)| webhook.clone());
    d.place_buckets.note(run_id, queue, bucket);
    if job.queue_position.map(fair::band) == Some(fair::band(s.position)) {
        return Ok(None);
    }
    if let Some((webhook, room)) = room {
        let edits_to = promised.entry(webhook).or_default();
        if *edits_to >= room {
            return Ok(None);
        }
        *edits_to += 1;
    }
    let now = d.clock.now();
    let written = update_seen(d.store.as_ref(), &job, |j| fair::placed(j, s, now)).await?;
    Ok(match written {
        Updated::Written(job) => Some(job),
        _ => None,
    })
}
