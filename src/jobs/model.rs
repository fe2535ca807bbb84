//! A job: one submission's life from `submitted` to `finished` (or `failed`).
//!
//! The state machine is pure: [`Job::apply`] decides whether a transition moves the job
//! forward. The stores enforce the same rule atomically with conditional writes.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::id::{Queue, RunId, UserId};
use super::outbox::{
    CallbackOutbox, Channel, Delivery, DeliveryStatus, DiscordOutbox, Target, delivery, owes,
};
use super::state::JobState;
use crate::result::Outcome;
use crate::time::Millis;

/// The Buildkite build that runs a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildRef {
    pub id: String,
    pub number: u64,
    pub web_url: String,
}

/// A try of the build's evaluation step as its `job.finished` event told it: with the result
/// that rides `build.finished`, it stands in for the build's jobs as the API would list them.
/// Its field names are the stored format.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenTry {
    /// The Buildkite job's id.
    pub job_id: String,
    /// The agent's name (cut as tries' names are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i64>,
    /// RFC 3339, as Buildkite wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

/// A build's tries beyond this many are not noted: the pipeline retries a step a few times.
pub(crate) const MAX_SEEN_TRIES: usize = 8;

/// How long a job is kept before the table's TTL removes it.
pub(crate) const RETENTION_SECS: i64 = 90 * 24 * 3600;

/// A build still to be created: the payload waits in the job until its build exists.
#[derive(Clone, Debug, PartialEq)]
pub struct Creation {
    /// `KERNELBOT_PAYLOAD` for the build.
    pub payload: String,
    /// No one tries before this: a create in flight (or a rate limit) holds it until then.
    pub after: Millis,
    /// An earlier create may have landed without an answer: look the build up before
    /// creating one, so a run never gets two builds.
    pub look_up_first: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub run_id: RunId,
    pub state: JobState,
    pub gpu: String,
    pub queue: Queue,
    pub title: Option<String>,
    /// Where status is shown; `None` when the job reports to no Discord webhook.
    pub discord: Option<DiscordOutbox>,
    /// Signed callbacks owed; `None` when the deployment sends none.
    pub callback: Option<CallbackOutbox>,
    pub build: Option<BuildRef>,
    /// The build still to be created (`submitted` jobs without a build only).
    pub creation: Option<Creation>,
    /// When the job's build was first recorded (its queue deadline runs from there).
    pub scheduled_at: Option<Millis>,
    /// The submission's own queue deadline (`max_queue_secs`), else the deployment's.
    pub max_queue_secs: Option<u64>,
    /// Someone asked to cancel the job; its build is canceled until it ends.
    pub cancel_requested: bool,
    /// Reads of its ended build's result begun and not given back: each is counted before it
    /// begins, so one that never came back (its function crashed or ran out of time) stays
    /// counted, and a job whose reads keep dying ends without one.
    pub finish_attempts: u32,
    /// The evaluation step's tries its build's `job.finished` events told of, oldest first.
    pub tries_seen: Vec<SeenTry>,
    /// A `private` run (`config.mode`): Discord shows its verdict and build link only.
    pub private: bool,
    /// Who submitted it (opaque, the submission's `user`): fair share counts per user, and a
    /// job without one counts as its own user.
    pub user: Option<UserId>,
    /// What makes a `test` or `benchmark` submission the same as another (see
    /// `flow::rules::reuse`): set when it may be answered from an earlier run, or answer one.
    pub identity: Option<String>,
    /// The earlier run this job was answered from, without a build of its own.
    pub cached_from: Option<RunId>,
    /// `"priority": "background"`: it takes a GPU only when its queue has an idle agent and
    /// no other job waiting (see `flow::rules::fair::releases`).
    pub background: bool,
    /// Held back by its user's limit on builds in flight: no build is created until fair
    /// share releases it (see `flow::fair`).
    pub waiting: bool,
    /// Where it stood on its queue when last shown (1: next to start) and when it was
    /// expected to start, for the status message; the API computes both afresh.
    pub queue_position: Option<u32>,
    pub expected_start: Option<Millis>,
    /// Why a submission failed (`failed` only).
    pub failure: Option<String>,
    /// The build's end and what its `result.json` said (`finished` only). Shared: a result
    /// can be megabytes, and a job is copied at every compare-and-swap.
    pub outcome: Option<Arc<Outcome>>,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// Bumped by every write: a write applies only to the version it was computed from.
    pub version: u64,
}

impl Job {
    pub fn new(
        run_id: RunId,
        gpu: String,
        queue: Queue,
        title: Option<String>,
        discord: Option<Target>,
        now: Millis,
    ) -> Self {
        Self {
            run_id,
            state: JobState::Submitted,
            gpu,
            queue,
            title,
            discord: discord.map(DiscordOutbox::new),
            callback: None,
            build: None,
            creation: None,
            scheduled_at: None,
            max_queue_secs: None,
            cancel_requested: false,
            finish_attempts: 0,
            tries_seen: Vec::new(),
            private: false,
            user: None,
            identity: None,
            cached_from: None,
            background: false,
            waiting: false,
            queue_position: None,
            expected_start: None,
            failure: None,
            outcome: None,
            created_at: now,
            updated_at: now,
            version: 0,
        }
    }

    /// Seconds since the epoch at which the store may forget the job.
    pub(crate) fn expires_at(&self) -> i64 {
        self.created_at / 1000 + RETENTION_SECS
    }

    /// How the job's message to `channel` is going; `None` when it reports to no such
    /// receiver.
    pub fn delivery(&self, channel: Channel) -> Option<&Delivery> {
        delivery(self.discord.as_ref(), self.callback.as_ref(), channel)
    }

    pub(crate) fn delivery_mut(&mut self, channel: Channel) -> Option<&mut Delivery> {
        match channel {
            Channel::Discord => self.discord.as_mut().map(|o| &mut o.delivery),
            Channel::Callback => self.callback.as_mut().map(|c| &mut c.delivery),
        }
    }

    /// Whether a message to `channel` is owed for the job as it is now.
    pub fn owes(&self, channel: Channel) -> bool {
        owes(
            self.discord.as_ref(),
            self.callback.as_ref(),
            self.state,
            channel,
        )
    }

    /// What the job's deadlines are measured from.
    pub(crate) fn timeline(&self) -> Timeline {
        Timeline {
            state: self.state,
            created_at: self.created_at,
            scheduled_at: self.scheduled_at,
            max_queue_secs: self.max_queue_secs,
        }
    }

    /// Whether either outbox still owes something for the job as it is now.
    pub(crate) fn owes_delivery(&self) -> bool {
        Channel::ALL.into_iter().any(|c| self.owes(c))
    }

    /// Whether a final message of the job was given up.
    pub fn given_up(&self) -> bool {
        Channel::ALL.into_iter().any(|c| {
            self.delivery(c)
                .is_some_and(|d| d.status == DeliveryStatus::GivenUp)
        })
    }

    /// The job after `t`, or `None` when `t` would not move it forward (a duplicate or a
    /// late event): the caller then changes nothing and sends nothing.
    pub fn apply(&self, t: &Transition) -> Option<Job> {
        if t.to.rank() <= self.state.rank() {
            return None;
        }
        // A submission fails only before its build exists; a build's end is `finished`.
        if t.to == JobState::Failed && (self.state != JobState::Submitted || self.build.is_some()) {
            return None;
        }
        let mut next = self.clone();
        for channel in Channel::ALL {
            if let Some(d) = next.delivery_mut(channel) {
                d.restart();
            }
        }
        if let Some(c) = next.callback.as_mut() {
            c.entered_at = t.at;
        }
        next.state = t.to;
        next.updated_at = t.at;
        if t.build.is_some() {
            if next.build.is_none() {
                next.scheduled_at = Some(t.at);
            }
            next.build.clone_from(&t.build);
        }
        if next.build.is_some() || next.state.is_terminal() {
            // The build exists (or never will): nothing is left to create, or to wait for.
            next.creation = None;
            next.waiting = false;
        }
        if t.failure.is_some() {
            next.failure.clone_from(&t.failure);
        }
        if t.outcome.is_some() {
            next.outcome.clone_from(&t.outcome);
        }
        if t.cached_from.is_some() {
            next.cached_from.clone_from(&t.cached_from);
        }
        Some(next)
    }
}

/// What a job's deadlines are measured from: its state and the times they run from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeline {
    pub state: JobState,
    pub created_at: Millis,
    /// When its build was first recorded: the queue deadline runs from there.
    pub scheduled_at: Option<Millis>,
    /// The submission's own queue deadline, if it set one.
    pub max_queue_secs: Option<u64>,
}

/// A step forward in a job's life, with what the step learned.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    pub to: JobState,
    pub at: Millis,
    pub build: Option<BuildRef>,
    pub failure: Option<String>,
    pub outcome: Option<Arc<Outcome>>,
    /// The job ends with an earlier run's outcome, taken from that run.
    pub cached_from: Option<RunId>,
}

impl Transition {
    pub fn to(state: JobState, at: Millis) -> Self {
        Self {
            to: state,
            at,
            build: None,
            failure: None,
            outcome: None,
            cached_from: None,
        }
    }

    /// Ends the job with `earlier`'s outcome, saying so.
    pub(crate) fn answered_from(mut self, earlier: &Job) -> Self {
        self.outcome.clone_from(&earlier.outcome);
        self.cached_from = Some(earlier.run_id.clone());
        self
    }

    pub fn with_build(mut self, build: BuildRef) -> Self {
        self.build = Some(build);
        self
    }

    pub(crate) fn with_failure(mut self, reason: impl Into<String>) -> Self {
        self.failure = Some(reason.into());
        self
    }

    /// Cut to what the store can keep (see [`fit_outcome`](super::outcome::fit_outcome)), so
    /// the job a writer goes on with is the job as stored.
    pub fn with_outcome(mut self, outcome: Outcome) -> Self {
        let fitted = super::outcome::fit_outcome(&outcome).unwrap_or(outcome);
        self.outcome = Some(Arc::new(fitted));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job::new(
            "r1".parse().unwrap(),
            "H100_BK".into(),
            "h100".into(),
            None,
            None,
            1_000,
        )
    }

    #[test]
    fn a_job_moves_forward_and_keeps_what_it_learned() {
        let build = BuildRef {
            id: "b".into(),
            number: 7,
            web_url: "u".into(),
        };
        let scheduled = job()
            .apply(&Transition::to(JobState::Scheduled, 2_000).with_build(build.clone()))
            .expect("forward");
        let running = scheduled
            .apply(&Transition::to(JobState::Running, 3_000))
            .expect("forward");
        assert_eq!(running.state, JobState::Running);
        assert_eq!(running.build, Some(build));
        assert_eq!(running.updated_at, 3_000);
    }

    #[test]
    fn duplicates_and_late_events_change_nothing() {
        let running = job()
            .apply(&Transition::to(JobState::Running, 2_000))
            .unwrap();
        assert_eq!(
            running.apply(&Transition::to(JobState::Running, 3_000)),
            None
        );
        assert_eq!(
            running.apply(&Transition::to(JobState::Scheduled, 3_000)),
            None
        );
        let finished = running
            .apply(&Transition::to(JobState::Finished, 4_000))
            .unwrap();
        assert_eq!(
            finished.apply(&Transition::to(JobState::Failed, 5_000)),
            None
        );
        assert_eq!(
            finished.apply(&Transition::to(JobState::Finished, 5_000)),
            None
        );
    }

    #[test]
    fn a_submission_can_fail_only_before_it_ends() {
        let failed = job()
            .apply(&Transition::to(JobState::Failed, 2_000).with_failure("422 from Buildkite"))
            .unwrap();
        assert_eq!(failed.failure.as_deref(), Some("422 from Buildkite"));
        assert_eq!(
            failed.apply(&Transition::to(JobState::Finished, 3_000)),
            None
        );
    }
}
