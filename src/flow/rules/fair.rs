//! Fair share on a queue, as pure functions of its open jobs: which waiting jobs get their
//! builds now (the user with the fewest in flight first, a batch bigger than the queue's
//! GPUs last among equals, oldest first within a user; at most a limit of each user's jobs
//! in flight and of the queue's beyond its GPUs), the order the queue's jobs are expected to
//! start in, and where one stands: its position and an expected start from the queue's
//! agents and recent run times.

use std::collections::{BTreeMap, HashMap};

use crate::jobs::{Job, JobState, OpenJob, RunId, UserId};
use crate::time::Millis;

/// Whose job it is: its user, or the job itself when the submission named none.
pub(crate) fn user_of(job: &OpenJob) -> &str {
    job.user
        .as_ref()
        .map_or(job.run_id.as_str(), UserId::as_str)
}

/// Whether `user` may have one more job waiting on a queue whose open jobs are `open`, at
/// most `limit` of theirs waiting (0: no limit): `Err` with how many wait when they may not.
/// Background jobs wait for idle GPUs by design and are not counted.
pub(crate) fn may_wait(open: &[OpenJob], user: &str, limit: usize) -> Result<(), usize> {
    let waiting = open
        .iter()
        .filter(|j| j.waiting && !j.background && user_of(j) == user)
        .count();
    if limit == 0 || waiting < limit {
        Ok(())
    } else {
        Err(waiting)
    }
}

/// When a user refused for waiting too much may try again: about when the queue's next
/// run ends (its median run time; a minute before it has one), 1 s to an hour.
pub(crate) fn retry_waiting_after(median_run: Option<Millis>) -> u64 {
    let ms = median_run.unwrap_or(60_000).max(0);
    u64::try_from(ms.saturating_add(999) / 1000)
        .unwrap_or(1)
        .clamp(1, 3600)
}

/// Builds a queue's GPUs may have queued ahead of them at most, beyond one each: a quarter
/// of the GPUs, 2 at least. Enough that a freed GPU finds its next build already made while
/// the end that freed it releases another; few enough that a run released now starts within
/// about one run, by share, not behind a long first-in-first-out line in Buildkite.
pub(crate) fn queued_beyond(gpus: usize) -> usize {
    gpus.div_ceil(4).max(2)
}

/// The most jobs of a queue in flight at once: its GPUs and [`queued_beyond`] them; no bound
/// with no agents listed, nor without a limit per user (fair share off: first come, first
/// served, jobs left waiting included).
fn bound(agents: Agents, limit: usize) -> usize {
    match agents.taking {
        0 => usize::MAX,
        _ if limit == usize::MAX => usize::MAX,
        gpus => gpus + queued_beyond(gpus),
    }
}

/// The queue's jobs in flight as the bound counts them: those running no more than the
/// agents that take jobs (a node that died leaves its runs open until Buildkite says they
/// were lost; they hold none of the GPUs listed), and every other one.
fn occupying(open: &[OpenJob], agents: Agents) -> usize {
    let flying = open.iter().filter(|j| !j.waiting);
    let running = flying
        .clone()
        .filter(|j| j.state == JobState::Running)
        .count();
    flying.count() - running + running.min(agents.taking)
}

/// Whether the queue's bound holds its waiting jobs back now: jobs wait and it is reached.
pub(crate) fn bounded(open: &[OpenJob], limit: usize, agents: Agents) -> bool {
    open.iter().any(|j| j.waiting) && occupying(open, agents) >= bound(agents, limit)
}

/// Each user's jobs in flight (open and not waiting: a build made, being made or running).
fn in_flight(open: &[OpenJob]) -> HashMap<&str, usize> {
    let mut by_user: HashMap<&str, usize> = HashMap::new();
    for job in open.iter().filter(|j| !j.waiting) {
        *by_user.entry(user_of(job)).or_default() += 1;
    }
    by_user
}

/// The waiting jobs in the order fair share releases them: fewest in flight first. A
/// user's `k`-th oldest waiting job goes in round `k` plus the user's jobs in flight. Within
/// a round, a user with more jobs waiting than the queue's `gpus` (a batch bigger than the
/// queue can start at once; none such with `gpus` 0, unknown) comes after the others, and
/// otherwise users come in the order of their oldest waiting job. So the next free GPU goes
/// to the user with the least of the queue, and a batch's sender, whose oldest job is the
/// oldest of all, does not win every tie against users sending one at a time. Background
/// jobs come after all the others, oldest first.
pub(crate) fn waiting_order(open: &[OpenJob], gpus: usize) -> Vec<&OpenJob> {
    let mut order = fair_order(open, gpus);
    let mut background: Vec<&OpenJob> = open.iter().filter(|j| j.waiting && j.background).collect();
    background.sort_by_key(|j| (j.created_at, j.run_id.clone()));
    order.extend(background);
    order
}

/// The waiting jobs but background ones, in fair order (see [`waiting_order`]).
fn fair_order(open: &[OpenJob], gpus: usize) -> Vec<&OpenJob> {
    let flying = in_flight(open);
    let mut by_user: BTreeMap<&str, Vec<&OpenJob>> = BTreeMap::new();
    for job in open.iter().filter(|j| j.waiting && !j.background) {
        by_user.entry(user_of(job)).or_default().push(job);
    }
    // Each job's place: (round, batch, its user's oldest waiting job).
    type Place<'a> = (usize, bool, Millis, &'a RunId);
    let mut order: Vec<(Place, &OpenJob)> = Vec::new();
    for (user, mut jobs) in by_user {
        jobs.sort_by_key(|j| (j.created_at, j.run_id.clone()));
        let batch = gpus > 0 && jobs.len() > gpus;
        let (first, first_id) = (jobs[0].created_at, &jobs[0].run_id);
        let base = flying.get(user).copied().unwrap_or(0);
        order.extend(
            jobs.into_iter()
                .enumerate()
                .map(|(k, j)| ((base + k, batch, first, first_id), j)),
        );
    }
    order.sort_by(|a, b| a.0.cmp(&b.0));
    order.into_iter().map(|(_, j)| j).collect()
}

/// A queue's agents as a recent agents list showed them: those that take jobs (connected,
/// not paused; however old the list), those of them idle (0 when the list is too old to
/// fill GPUs by), and when the list was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Agents {
    pub(crate) taking: usize,
    pub(crate) idle: usize,
    pub(crate) listed_at: Millis,
}

/// The waiting jobs to release now: in waiting order, each whose user has fewer than
/// `limit` jobs in flight (open and not waiting), counting those released before it, while
/// the queue has fewer jobs in flight than its GPUs and [`queued_beyond`] them (no such
/// bound with no agents listed: builds then wait in Buildkite for agents to come). Then,
/// while the queue has agents that are idle and more agents than jobs in flight, the next
/// in waiting order whatever their user's count: a GPU left idle helps no one, and a job
/// released this way is running (not queued ahead of anyone) by the time another user's
/// next job comes. Only agents listed idle count: one busy with work the store does not
/// hold (a build started by hand) takes nothing, and every build made since the list, or
/// queued still, has taken (or takes first) one of those it listed idle. Background jobs go
/// last, only onto idle agents left over once no other job waits: so one delays a job
/// submitted after it by one run at most.
pub(crate) fn releases(open: &[OpenJob], limit: usize, agents: Agents) -> Vec<&OpenJob> {
    let mut flying = in_flight(open);
    let cap = bound(agents, limit);
    let mut busy = occupying(open, agents);
    let mut released = Vec::new();
    let mut held = Vec::new();
    for job in fair_order(open, agents.taking) {
        if busy >= cap {
            // Past the bound no agent is spare either: nothing more goes.
            break;
        }
        let n = flying.entry(user_of(job)).or_default();
        if *n < limit {
            *n += 1;
            busy += 1;
            released.push(job);
        } else {
            held.push(job);
        }
    }
    let taken = open
        .iter()
        .filter(|j| !j.waiting)
        .filter(|j| {
            j.state != JobState::Running || j.scheduled_at.is_none_or(|t| t >= agents.listed_at)
        })
        .count()
        + released.len();
    let spare = (agents.taking.saturating_sub(busy)).min(agents.idle.saturating_sub(taken));
    let left = spare.saturating_sub(held.len());
    released.extend(held.into_iter().take(spare));
    // Idle agents still over once every other waiting job went (none stopped by the bound
    // or held by its user's share) take background jobs, oldest first.
    let others = open.iter().filter(|j| j.waiting && !j.background).count();
    if released.len() == others && left > 0 {
        let mut background: Vec<&OpenJob> =
            open.iter().filter(|j| j.waiting && j.background).collect();
        background.sort_by_key(|j| (j.created_at, j.run_id.clone()));
        released.extend(background.into_iter().take(left));
    }
    released
}

/// The queue's jobs not yet running, in the order they are expected to start: those with a
/// build in the order the builds were made, as Buildkite runs its queue (those about to
/// have one after them), then the waiting ones in waiting order.
pub(crate) fn queue_order(open: &[OpenJob], gpus: usize) -> Vec<&OpenJob> {
    let mut ahead: Vec<&OpenJob> = open
        .iter()
        .filter(|j| !j.waiting && j.state != JobState::Running)
        .collect();
    ahead.sort_by_key(|j| {
        let made = j.scheduled_at.unwrap_or(Millis::MAX);
        (made, j.created_at, j.run_id.clone())
    });
    ahead.extend(waiting_order(open, gpus));
    ahead
}

/// Where a job stands on its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Standing {
    /// 1: the next to start.
    pub(crate) position: u32,
    /// When it is expected to start; `None` until the queue has run times to go by.
    pub(crate) expected_start: Option<Millis>,
}

/// Where `run_id` stands among `open` (its queue's open jobs) at `now`, with `agents`
/// agents on the queue and a median run time of `median_ms`; `None` once it runs.
pub(crate) fn standing(
    open: &[OpenJob],
    run_id: &RunId,
    agents: usize,
    median_ms: Option<Millis>,
    now: Millis,
) -> Option<Standing> {
    let order = queue_order(open, agents);
    let ahead = order.iter().position(|j| &j.run_id == run_id)?;
    let queue = Line::of(open, agents, median_ms, now);
    Some(queue.standing(ahead, order[ahead].waiting))
}

/// Every job of `open` not yet running with its standing, in queue order, from one sort of
/// the queue: what a job's end places them all by.
pub(crate) fn standings(
    open: &[OpenJob],
    agents: usize,
    median_ms: Option<Millis>,
    now: Millis,
) -> Vec<(&OpenJob, Standing)> {
    let queue = Line::of(open, agents, median_ms, now);
    queue_order(open, agents)
        .into_iter()
        .enumerate()
        .map(|(ahead, j)| (j, queue.standing(ahead, j.waiting)))
        .collect()
}

/// Whether `s` puts `job` in another band than the place its message last showed (or it
/// showed none): only then is the job read and its message edited.
pub(crate) fn moved(job: &OpenJob, s: Standing) -> bool {
    job.queue_position.map(band) != Some(band(s.position))
}

/// A queue as every standing on it is computed from.
struct Line {
    running: usize,
    agents: usize,
    median_ms: Option<Millis>,
    now: Millis,
}

impl Line {
    fn of(open: &[OpenJob], agents: usize, median_ms: Option<Millis>, now: Millis) -> Self {
        Self {
            running: open.iter().filter(|j| j.state == JobState::Running).count(),
            agents: agents.max(1),
            median_ms,
            now,
        }
    }

    /// The standing of the job with `ahead` jobs before it in queue order.
    fn standing(&self, ahead: usize, waiting: bool) -> Standing {
        // The jobs that take an agent before it: those running and those ahead of it.
        let before = self.running + ahead;
        let agents = self.agents;
        let expected_start = self.median_ms.map(|m| {
            let turns = if before < agents {
                0
            } else {
                (before - agents) / agents + 1
            };
            // A waiting job goes when a run of its queue ends, free agents or not.
            let turns = if waiting { turns.max(1) } else { turns };
            self.now + m * turns as Millis
        });
        Standing {
            position: u32::try_from(ahead + 1).unwrap_or(u32::MAX),
            expected_start,
        }
    }
}

/// The band a position falls in (1, 2–3, 4–7, 8–15, …): a job's message is edited when its
/// band changes, not at every move of the queue.
pub(crate) fn band(position: u32) -> u32 {
    position.max(1).ilog2()
}

/// The job with its standing `s` noted, when that moves it to another band (or it had none);
/// a message already showing its state is owed again, so it is edited with the new place.
pub(crate) fn placed(job: &Job, s: Standing, now: Millis) -> Option<Job> {
    if job.state.rank() >= JobState::Running.rank()
        || job.queue_position.map(band) == Some(band(s.position))
    {
        return None;
    }
    let mut next = job.clone();
    next.queue_position = Some(s.position);
    next.expected_start = s.expected_start;
    let rank = job.state.rank();
    if let Some(o) = next.discord.as_mut()
        && o.delivery.accepted == Some(rank)
    {
        o.delivery.accepted = rank.checked_sub(1);
        o.delivery.restart();
    }
    next.updated_at = now;
    Some(next)
}

/// The job released: no longer waiting, its build due now (or, when `held`, still held by
/// the submit that is about to create it).
pub(crate) fn release_job(job: &Job, now: Millis, held: bool) -> Option<Job> {
    if !job.waiting || job.state != JobState::Submitted || job.build.is_some() {
        return None;
    }
    let mut next = job.clone();
    next.waiting = false;
    if !held && let Some(c) = next.creation.as_mut() {
        c.after = c.after.min(now);
        // No create was ever sent for a job that waited: nothing to look up first.
        c.look_up_first = false;
    }
    next.updated_at = now;
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_may_wait_up_to_the_limit() {
        let o = |run_id: &str, user: &str, waiting: bool| {
            open(run_id, user, 0, JobState::Submitted, waiting)
        };
        let queue = [
            o("a1", "ann", false),
            o("a2", "ann", true),
            o("a3", "ann", true),
            o("b1", "ben", true),
        ];
        // (user, limit, expected)
        let cases = [
            ("ann", 3, Ok(())),
            ("ann", 2, Err(2)),
            ("ann", 1, Err(2)),
            ("ann", 0, Ok(())),
            ("ben", 1, Err(1)),
            ("ben", 2, Ok(())),
            ("cy", 1, Ok(())),
        ];
        for (user, limit, expected) in cases {
            assert_eq!(may_wait(&queue, user, limit), expected, "{user} at {limit}");
        }
        assert_eq!(may_wait(&[], "ann", 1), Ok(()));
    }

    #[test]
    fn a_refused_user_is_told_to_come_back_about_one_run_later() {
        let cases = [
            (None, 60),
            (Some(30_000), 30),
            (Some(30_001), 31),
            (Some(0), 1),
            (Some(-5), 1),
            (Some(99_000_000), 3600),
            (Some(Millis::MAX), 3600),
        ];
        for (median, expected) in cases {
            assert_eq!(retry_waiting_after(median), expected, "{median:?}");
        }
    }

    fn open(
        run_id: &str,
        user: &str,
        created_at: Millis,
        state: JobState,
        waiting: bool,
    ) -> OpenJob {
        OpenJob {
            run_id: run_id.parse().expect("a run id"),
            state,
            created_at,
            user: (!user.is_empty()).then(|| user.into()),
            waiting,
            background: false,
            scheduled_at: (!waiting && state != JobState::Submitted).then_some(created_at),
            queue_position: None,
        }
    }

    fn ids(jobs: &[&OpenJob]) -> Vec<String> {
        jobs.iter().map(|j| j.run_id.to_string()).collect()
    }

    fn background(run_id: &str, created_at: Millis) -> OpenJob {
        let mut job = open(run_id, "", created_at, JobState::Submitted, true);
        job.background = true;
        job
    }

    #[test]
    fn a_background_job_takes_only_an_idle_gpu_no_other_job_wants() {
        let agents = |taking, idle| Agents {
            taking,
            idle,
            listed_at: 0,
        };
        let none: Vec<String> = Vec::new();
        // Two idle GPUs, one job waiting: it goes first, the oldest background job next.
        let q = [
            background("z1", 1),
            background("z2", 2),
            open("a1", "alice", 3, JobState::Submitted, true),
        ];
        assert_eq!(ids(&releases(&q, 2, agents(2, 2))), ["a1", "z1"]);
        assert_eq!(
            ids(&waiting_order(&q, 2)),
            ["a1", "z1", "z2"],
            "last in line"
        );
        // No idle agent (or no list fresh enough to say): none, though the bound has room.
        assert_eq!(ids(&releases(&q[..2], 2, agents(2, 0))), none);
        assert_eq!(ids(&releases(&q[..2], 2, Agents::default())), none);
        // A job its user's share holds back takes the one idle GPU before any background
        // job; with two idle, each gets one.
        let q = [
            open("r1", "alice", 1, JobState::Running, false),
            open("a1", "alice", 2, JobState::Submitted, true),
            background("z1", 0),
        ];
        assert_eq!(ids(&releases(&q, 1, agents(3, 2))), ["a1"]);
        assert_eq!(ids(&releases(&q, 1, agents(3, 3))), ["a1", "z1"]);
        // A queue at its bound: nothing goes, background least of all.
        let full = [
            open("r1", "bob", 1, JobState::Running, false),
            open("s1", "carol", 2, JobState::Scheduled, false),
            open("s2", "dan", 3, JobState::Scheduled, false),
            background("z1", 0),
        ];
        assert_eq!(ids(&releases(&full, 2, agents(1, 1))), none);
        // Background jobs wait by design: they never count against a user's waiting limit.
        let mut mine = background("z9", 9);
        mine.user = Some("ops".into());
        assert_eq!(may_wait(&[mine], "ops", 1), Ok(()));
    }

    #[test]
    fn a_user_s_third_job_waits_while_two_run() {
        let q = [
            open("a1", "alice", 1, JobState::Running, false),
            open("a2", "alice", 2, JobState::Scheduled, false),
            open("a3", "alice", 3, JobState::Submitted, true),
            open("b1", "bob", 4, JobState::Submitted, true),
        ];
        let none = Agents::default();
        assert_eq!(ids(&releases(&q, 2, none)), ["b1"]);
        // One of alice's finished: her third goes, bob's too (bob, with none in flight,
        // first).
        assert_eq!(ids(&releases(&q[1..], 2, none)), ["b1", "a3"]);
        // With a limit of one, alice's third waits still.
        assert_eq!(ids(&releases(&q[1..], 1, none)), ["b1"]);
    }

    #[test]
    fn idle_gpus_take_waiting_jobs_past_their_user_s_share() {
        let q = [
            open("h1", "heavy", 1, JobState::Running, false),
            open("h2", "heavy", 2, JobState::Running, false),
            open("h3", "heavy", 3, JobState::Submitted, true),
            open("h4", "heavy", 4, JobState::Submitted, true),
            open("h5", "heavy", 5, JobState::Submitted, true),
            open("l1", "light", 6, JobState::Submitted, true),
        ];
        // (agents taking jobs, idle, released): the light job first by share, then the
        // heavy user's next ones while GPUs would idle, never more than there are GPUs nor
        // more than the agents listed idle.
        let cases: [(usize, usize, &[&str]); 8] = [
            (0, 0, &["l1"]),
            (2, 0, &["l1"]),
            (3, 1, &["l1"]),
            (5, 3, &["l1", "h3", "h4"]),
            (9, 7, &["l1", "h3", "h4", "h5"]),
            (5, 1, &["l1"]),
            (5, 2, &["l1", "h3"]),
            (9, 2, &["l1", "h3"]),
        ];
        for (taking, idle, expected) in cases {
            let agents = Agents {
                taking,
                idle,
                listed_at: 100,
            };
            assert_eq!(ids(&releases(&q, 2, agents)), expected, "{agents:?}");
        }
    }

    #[test]
    fn agents_listed_idle_are_filled_once_not_again_when_their_jobs_start() {
        // 8 agents, 4 of them busy with builds started by hand, listed at 100.
        let listed = Agents {
            taking: 8,
            idle: 4,
            listed_at: 100,
        };
        let mut q: Vec<OpenJob> = (1..=8)
            .map(|i| open(&format!("h{i}"), "heavy", i, JobState::Submitted, true))
            .collect();
        assert_eq!(
            ids(&releases(&q, 0, listed)),
            ["h1", "h2", "h3", "h4"],
            "the four idle GPUs"
        );
        // Those four built after the list, and running now: the list's idle agents are
        // theirs, whatever it still says.
        for (i, j) in q.iter_mut().take(4).enumerate() {
            (j.waiting, j.state, j.scheduled_at) = (false, JobState::Running, Some(150 + i as i64));
        }
        assert_eq!(ids(&releases(&q, 0, listed)), Vec::<String>::new());
        let fresh = Agents {
            taking: 12,
            idle: 4,
            listed_at: 200,
        };
        assert_eq!(
            ids(&releases(&q, 0, fresh)),
            ["h5", "h6", "h7", "h8"],
            "a list made after they started: four more agents, idle"
        );
    }

    #[test]
    fn waiting_jobs_start_round_robin_over_users_oldest_first() {
        let q = [
            open("h1", "heavy", 1, JobState::Submitted, true),
            open("h2", "heavy", 2, JobState::Submitted, true),
            open("h3", "heavy", 3, JobState::Submitted, true),
            open("l1", "light", 5, JobState::Submitted, true),
            open("m1", "mid", 4, JobState::Submitted, true),
            open("m2", "mid", 6, JobState::Submitted, true),
            open("anon", "", 7, JobState::Submitted, true),
            open("anon2", "", 0, JobState::Submitted, true),
        ];
        assert_eq!(
            ids(&waiting_order(&q, 0)),
            ["anon2", "h1", "m1", "l1", "anon", "h2", "m2", "h3"],
            "each job without a user is a user of its own"
        );
        assert_eq!(
            ids(&releases(&q, 1, Agents::default())),
            ["anon2", "h1", "m1", "l1", "anon"]
        );
    }

    #[test]
    fn the_next_free_gpu_goes_to_the_user_with_fewest_in_flight() {
        // heavy waited longest but has two in flight; l1 one, l2 none.
        let q = [
            open("h1", "heavy", 1, JobState::Running, false),
            open("h2", "heavy", 2, JobState::Scheduled, false),
            open("l1a", "l1", 3, JobState::Running, false),
            open("h3", "heavy", 4, JobState::Submitted, true),
            open("h4", "heavy", 5, JobState::Submitted, true),
            open("l1b", "l1", 6, JobState::Submitted, true),
            open("l1c", "l1", 7, JobState::Submitted, true),
            open("l2a", "l2", 8, JobState::Submitted, true),
            open("l2b", "l2", 9, JobState::Submitted, true),
        ];
        assert_eq!(
            ids(&waiting_order(&q, 3)),
            ["l2a", "l1b", "l2b", "h3", "l1c", "h4"],
            "rounds from each user's jobs in flight; within one, the longest waiting user first"
        );
        // 3 GPUs listed none idle: 3 in flight and at most 2 queued beyond them.
        let full = Agents {
            taking: 3,
            idle: 0,
            listed_at: 100,
        };
        assert_eq!(ids(&releases(&q, 4, full)), ["l2a", "l1b"]);
        assert_eq!(
            ids(&releases(&q, 1, full)),
            ["l2a"],
            "each user's limit holds"
        );
    }

    #[test]
    fn a_batch_bigger_than_the_queue_s_gpus_loses_ties_not_rounds() {
        // batch sent four at the start; l1 and l2 one at a time later. Each has one in flight.
        let mut q = vec![
            open("b0", "batch", 0, JobState::Running, false),
            open("l1a", "l1", 5, JobState::Running, false),
            open("l2a", "l2", 6, JobState::Running, false),
            open("l1b", "l1", 7, JobState::Submitted, true),
            open("l2b", "l2", 8, JobState::Submitted, true),
        ];
        for (i, id) in ["b1", "b2", "b3", "b4"].into_iter().enumerate() {
            q.push(open(
                id,
                "batch",
                1 + i as Millis,
                JobState::Submitted,
                true,
            ));
        }
        let table: [(usize, &[&str], &str); 4] = [
            (
                0,
                &["b1", "l1b", "l2b", "b2", "b3", "b4"],
                "GPUs unknown: oldest first",
            ),
            (
                4,
                &["b1", "l1b", "l2b", "b2", "b3", "b4"],
                "four waiting on four GPUs",
            ),
            (
                3,
                &["l1b", "l2b", "b1", "b2", "b3", "b4"],
                "four waiting on three GPUs",
            ),
            (1, &["l1b", "l2b", "b1", "b2", "b3", "b4"], "one GPU"),
        ];
        for (gpus, order, why) in table {
            assert_eq!(ids(&waiting_order(&q, gpus)), order, "{why}");
        }
        // A round still goes before the next: with l1 two in flight, batch's b1 (round 1)
        // comes before l1's next (round 2).
        q[3].waiting = false;
        q.push(open("l1c", "l1", 9, JobState::Submitted, true));
        assert_eq!(
            ids(&waiting_order(&q, 3)),
            ["l2b", "b1", "l1c", "b2", "b3", "b4"]
        );
        let two = Agents {
            taking: 3,
            idle: 0,
            listed_at: 100,
        };
        assert_eq!(
            ids(&releases(&q, 2, two)),
            ["l2b"],
            "the bound: 3 GPUs and 2 more"
        );
    }

    #[test]
    fn runs_on_agents_no_longer_listed_hold_no_place_under_the_bound() {
        // Four runs open; a node with two of the GPUs died, its runs not yet ended.
        let mut q: Vec<OpenJob> = (0..4)
            .map(|i| {
                open(
                    &format!("r{i}"),
                    &format!("u{i}"),
                    i,
                    JobState::Running,
                    false,
                )
            })
            .collect();
        q.push(open("w", "v", 9, JobState::Submitted, true));
        let two_left = Agents {
            taking: 2,
            idle: 0,
            listed_at: 50,
        };
        assert!(
            !bounded(&q, 2, two_left),
            "2 running on 2 GPUs, 2 may queue"
        );
        assert_eq!(ids(&releases(&q, 2, two_left)), ["w"]);
        // The same four queued rather than running hold their places.
        for j in q.iter_mut().take(4) {
            j.state = JobState::Scheduled;
        }
        assert!(bounded(&q, 2, two_left));
        assert!(releases(&q, 2, two_left).is_empty());
    }

    #[test]
    fn builds_queued_ahead_of_the_gpus_are_bounded_by_their_number() {
        // (GPUs, builds queued beyond one each at most)
        let cases = [(1, 2), (4, 2), (8, 2), (9, 3), (16, 4), (32, 8), (100, 25)];
        for (gpus, queued) in cases {
            assert_eq!(queued_beyond(gpus), queued, "{gpus} GPUs");
        }
        // 16 GPUs all busy with 16 users' runs; 30 users wait, one job each.
        let mut q: Vec<OpenJob> = (0..16)
            .map(|i| {
                open(
                    &format!("r{i}"),
                    &format!("u{i}"),
                    i,
                    JobState::Running,
                    false,
                )
            })
            .collect();
        q.extend((0..30).map(|i| {
            let id = format!("w{i}");
            open(&id, &format!("v{i}"), 100 + i, JobState::Submitted, true)
        }));
        let busy = Agents {
            taking: 16,
            idle: 0,
            listed_at: 50,
        };
        let first = releases(&q, 2, busy);
        assert_eq!(ids(&first), ["w0", "w1", "w2", "w3"], "the oldest four");
        // No agents list at all: nothing to bound by, each user's limit alone.
        assert_eq!(releases(&q, 2, Agents::default()).len(), 30);
        // Those four made and queued: nothing more until a run ends.
        let made: Vec<RunId> = first.iter().map(|j| j.run_id.clone()).collect();
        for j in q.iter_mut().filter(|j| made.contains(&j.run_id)) {
            (j.waiting, j.state) = (false, JobState::Scheduled);
        }
        assert!(releases(&q, 2, busy).is_empty());
        assert_eq!(
            releases(&q, usize::MAX, busy).len(),
            26,
            "fair share off: no bound, jobs left waiting all go"
        );
        assert!(
            bounded(&q, 2, busy),
            "20 in flight of 16 GPUs and 4 queued, 26 waiting"
        );
        assert!(
            !bounded(&q, 2, Agents::default()),
            "no agents listed: no bound"
        );
        q.retain(|j| j.run_id.as_str() != "r0");
        assert!(!bounded(&q, 2, busy), "one ended: room for one");
        assert_eq!(ids(&releases(&q, 2, busy)), ["w4"], "one ended: one goes");
    }
    #[test]
    fn position_and_expected_start_come_from_the_queue_s_agents_and_run_times() {
        let q = [
            open("r1", "a", 1, JobState::Running, false),
            open("r2", "b", 2, JobState::Running, false),
            open("s1", "c", 3, JobState::Scheduled, false),
            open("w1", "a", 0, JobState::Submitted, true),
            open("w2", "d", 9, JobState::Submitted, true),
        ];
        let at = |id: &str, agents| {
            let id: RunId = id.parse().expect("a run id");
            standing(&q, &id, agents, Some(30_000), 1_000_000)
        };
        assert_eq!(at("r1", 2), None, "running: no position");
        assert_eq!(
            at("s1", 2),
            Some(Standing {
                position: 1,
                expected_start: Some(1_030_000)
            })
        );
        // d has nothing in flight and a has one running: d's goes first, though a's waited longer.
        assert_eq!(
            at("w2", 2),
            Some(Standing {
                position: 2,
                expected_start: Some(1_030_000)
            })
        );
        assert_eq!(
            at("w1", 2),
            Some(Standing {
                position: 3,
                expected_start: Some(1_060_000)
            })
        );
        assert_eq!(
            at("w2", 8).and_then(|s| s.expected_start),
            Some(1_030_000),
            "free agents, but a waiting job waits for one of its user's runs"
        );
        assert_eq!(at("s1", 8).and_then(|s| s.expected_start), Some(1_000_000));
        assert_eq!(
            standing(&q, &"w2".parse().expect("a run id"), 0, None, 5).map(|s| s.expected_start),
            Some(None)
        );
    }

    #[test]
    fn one_pass_places_every_job_as_one_standing_at_a_time_does() {
        let q = [
            open("r1", "a", 1, JobState::Running, false),
            open("s1", "c", 3, JobState::Scheduled, false),
            open("w1", "a", 0, JobState::Submitted, true),
            open("w2", "d", 9, JobState::Submitted, true),
            open("w3", "a", 4, JobState::Submitted, true),
        ];
        for agents in [0, 1, 2, 8] {
            let all = standings(&q, agents, Some(30_000), 1_000);
            let ids: Vec<&str> = all.iter().map(|(j, _)| j.run_id.as_str()).collect();
            assert_eq!(
                ids,
                ["s1", "w2", "w1", "w3"],
                "queue order (d, with nothing in flight, before a), not the running one"
            );
            for (j, s) in all {
                assert_eq!(
                    Some(s),
                    standing(&q, &j.run_id, agents, Some(30_000), 1_000)
                );
            }
        }
    }

    #[test]
    fn only_a_job_whose_band_moved_is_read_again() {
        let at = |position| Standing {
            position,
            expected_start: None,
        };
        let shown = |place: Option<u32>| {
            let mut j = open("w", "a", 1, JobState::Submitted, true);
            j.queue_position = place;
            j
        };
        // (place last shown, standing now, moved)
        let cases = [
            (None, 5, true),
            (Some(9), 8, false),
            (Some(8), 7, true),
            (Some(4), 7, false),
            (Some(2), 1, true),
            (Some(1), 1, false),
        ];
        for (place, now, expected) in cases {
            assert_eq!(
                moved(&shown(place), at(now)),
                expected,
                "{place:?} -> {now}"
            );
        }
    }

    #[test]
    fn builds_go_in_the_order_they_were_made_not_submitted() {
        // Submitted first, but waited its turn: its build was made after the other's.
        let mut late = open("late", "a", 1, JobState::Scheduled, false);
        late.scheduled_at = Some(50);
        let mut early = open("early", "b", 10, JobState::Scheduled, false);
        early.scheduled_at = Some(20);
        let creating = open("creating", "c", 5, JobState::Submitted, false);
        let q = [late, early, creating];
        assert_eq!(ids(&queue_order(&q, 2)), ["early", "late", "creating"]);
    }

    #[test]
    fn bands_and_medians() {
        let bands: Vec<u32> = [1, 2, 3, 4, 7, 8, 100].into_iter().map(band).collect();
        assert_eq!(bands, [0, 1, 1, 2, 2, 3, 6]);
        use super::super::stats::median;
        assert_eq!(median(&[30, 10, 20]), Some(20));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn a_new_band_is_noted_and_shown_a_new_place_within_one_is_not() {
        let target = crate::jobs::Target::Default;
        let mut j = Job::new(
            "r".parse().unwrap(),
            "g".into(),
            "q".into(),
            None,
            Some(target),
            0,
        );
        let at = |position| Standing {
            position,
            expected_start: Some(5),
        };
        let first = placed(&j, at(9), 1).unwrap();
        assert_eq!(first.queue_position, Some(9));
        assert_eq!(first.discord.as_ref().unwrap().delivery.accepted, None);
        j = first;
        j.discord.as_mut().unwrap().delivery.accepted = Some(0);
        assert_eq!(placed(&j, at(8), 2), None, "8 and 9 share a band");
        let moved = placed(&j, at(7), 3).unwrap();
        assert_eq!(moved.queue_position, Some(7));
        assert!(
            moved.owes(crate::jobs::Channel::Discord),
            "its message is edited"
        );
        j.state = JobState::Running;
        assert_eq!(placed(&j, at(1), 4), None, "a running job has no place");
    }

    #[test]
    fn a_job_is_released_once_and_only_while_waiting() {
        let mut j = Job::new("r".parse().unwrap(), "g".into(), "q".into(), None, None, 0);
        j.waiting = true;
        j.creation = Some(crate::jobs::Creation {
            payload: "p".into(),
            after: 90_000,
            look_up_first: false,
        });
        let released = release_job(&j, 10, false).unwrap();
        assert!(!released.waiting);
        assert_eq!(released.creation.as_ref().unwrap().after, 10, "due now");
        let held = release_job(&j, 10, true).unwrap();
        assert_eq!(
            held.creation.as_ref().unwrap().after,
            90_000,
            "its submit creates it"
        );
        assert_eq!(release_job(&released, 20, false), None, "once");
    }
}
