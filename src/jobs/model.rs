//! A job: one submission's life from `submitted` to `finished` (or `failed`).
//!
//! The state machine is pure: [`Job::apply`] decides whether a transition moves the job
//! forward. The stores enforce the same rule atomically with conditional writes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::discord::target::DiscordTarget;
use crate::result::Outcome;

/// A run id: the idempotency key of a submission, `[A-Za-z0-9_.-]{1,64}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RunId(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("run_id must be 1-64 characters of A-Z, a-z, 0-9, '_', '.', '-'")]
pub struct InvalidRunId;

impl RunId {
    /// A fresh random id for submissions that bring none.
    pub fn generate() -> Self {
        Self(format!("run-{}", uuid::Uuid::new_v4().simple()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for RunId {
    type Err = InvalidRunId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = (1..=64).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidRunId)
        }
    }
}

impl TryFrom<String> for RunId {
    type Error = InvalidRunId;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<RunId> for String {
    fn from(id: RunId) -> Self {
        id.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a job is in its life. The order of the variants is the order of progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Submitted,
    Scheduled,
    Running,
    Finished,
    Failed,
}

impl JobState {
    /// A job only ever moves to a higher rank. `finished` and `failed` share the top rank:
    /// neither can follow the other.
    pub fn rank(self) -> u8 {
        match self {
            Self::Submitted => 0,
            Self::Scheduled => 1,
            Self::Running => 2,
            Self::Finished | Self::Failed => 3,
        }
    }

    pub fn is_terminal(self) -> bool {
        self.rank() == 3
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Submitted => "submitted",
            Self::Scheduled => "scheduled",
            Self::Running => "running",
            Self::Finished => "finished",
            Self::Failed => "failed",
        }
    }
}

impl FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "submitted" => Self::Submitted,
            "scheduled" => Self::Scheduled,
            "running" => Self::Running,
            "finished" => Self::Finished,
            "failed" => Self::Failed,
            other => return Err(format!("unknown job state {other:?}")),
        })
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The Buildkite build that runs a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildRef {
    pub id: String,
    pub number: u64,
    pub web_url: String,
}

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

pub fn now_millis() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}

/// `ms` as an RFC 3339 UTC time with milliseconds.
pub fn rfc3339(ms: Millis) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// How long a job is kept before the table's TTL removes it.
pub const RETENTION_SECS: i64 = 90 * 24 * 3600;

/// Where a job's Discord delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Renders may still be owed (see [`Outbox::owes`]).
    Active,
    /// Discord accepted the final report; nothing more is ever sent.
    Delivered,
    /// The webhook was deleted or its token revoked; nothing more can be sent.
    Gone,
    /// The final report could not be delivered (24 h of failures, or refused for good).
    GivenUp,
}

impl DeliveryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Delivered => "delivered",
            Self::Gone => "gone",
            Self::GivenUp => "given_up",
        }
    }
}

impl FromStr for DeliveryStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "active" => Self::Active,
            "delivered" => Self::Delivered,
            "gone" => Self::Gone,
            "given_up" => Self::GivenUp,
            other => return Err(format!("unknown delivery status {other:?}")),
        })
    }
}

/// A sender's exclusive hold on a job's Discord message: one sender at a time, so an older
/// render can never land after a newer one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub owner: String,
    pub until: Millis,
}

/// The job's Discord outbox: the one status message and what it still owes.
#[derive(Clone, Debug, PartialEq)]
pub struct Outbox {
    /// `None` once nothing more will be sent: the webhook token is not kept longer than needed.
    pub target: Option<DiscordTarget>,
    pub message_id: Option<String>,
    /// Rank of the newest job state whose render Discord accepted.
    pub shown: Option<u8>,
    pub status: DeliveryStatus,
    /// Failed tries of the render now owed.
    pub attempts: u32,
    /// When the render now owed first failed (the 24 h give-up clock).
    pub pending_since: Option<Millis>,
    pub last_error: Option<String>,
    /// Discord refused the render of this rank for good (a 4xx): not retried until the job
    /// moves on.
    pub refused: Option<u8>,
    pub lease: Option<Lease>,
}

impl Outbox {
    pub fn new(target: DiscordTarget) -> Self {
        Self {
            target: Some(target),
            message_id: None,
            shown: None,
            status: DeliveryStatus::Active,
            attempts: 0,
            pending_since: None,
            last_error: None,
            refused: None,
            lease: None,
        }
    }

    /// Whether a render of a job in `state` is still owed.
    pub fn owes(&self, state: JobState) -> bool {
        let rank = state.rank();
        self.status == DeliveryStatus::Active
            && self.target.is_some()
            && self.shown.is_none_or(|s| s < rank)
            && self.refused != Some(rank)
    }
}

/// The job's signed callbacks (`CALLBACK_URL`): the newest state the receiver accepted, and
/// how the state now owed is going. Like the Discord outbox, only the current state is owed:
/// an earlier one still pending is dropped once a later one is delivered.
#[derive(Clone, Debug, PartialEq)]
pub struct CallbackOutbox {
    /// When the job entered its current state: the callback's `timestamp`.
    pub entered_at: Millis,
    /// Rank of the newest state the receiver accepted (2xx).
    pub delivered: Option<u8>,
    /// `Active` while callbacks may be owed; `Delivered` once the last one was accepted;
    /// `Gone` after a 410; `GivenUp` after 24 h of failures.
    pub status: DeliveryStatus,
    pub attempts: u32,
    pub pending_since: Option<Millis>,
    pub last_error: Option<String>,
    pub lease: Option<Lease>,
}

impl CallbackOutbox {
    pub fn new(now: Millis) -> Self {
        Self {
            entered_at: now,
            delivered: None,
            status: DeliveryStatus::Active,
            attempts: 0,
            pending_since: None,
            last_error: None,
            lease: None,
        }
    }

    /// Whether the callback of a job in `state` is still owed (`submitted` sends none).
    pub fn owes(&self, state: JobState) -> bool {
        state != JobState::Submitted
            && self.status == DeliveryStatus::Active
            && self.delivered.is_none_or(|d| d < state.rank())
    }
}

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
    pub queue: String,
    pub title: Option<String>,
    /// Where status is shown; `None` when the job reports to no Discord webhook.
    pub discord: Option<Outbox>,
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
    /// A `private` run (`config.mode`): Discord shows its verdict and build link only.
    pub private: bool,
    /// Why a submission failed (`failed` only).
    pub failure: Option<String>,
    /// The build's end and what its `result.json` said (`finished` only).
    pub outcome: Option<Outcome>,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// Bumped by every write: a write applies only to the version it was computed from.
    pub version: u64,
}

impl Job {
    pub fn new(
        run_id: RunId,
        gpu: String,
        queue: String,
        title: Option<String>,
        discord: Option<DiscordTarget>,
        now: Millis,
    ) -> Self {
        Self {
            run_id,
            state: JobState::Submitted,
            gpu,
            queue,
            title,
            discord: discord.map(Outbox::new),
            callback: None,
            build: None,
            creation: None,
            scheduled_at: None,
            max_queue_secs: None,
            cancel_requested: false,
            private: false,
            failure: None,
            outcome: None,
            created_at: now,
            updated_at: now,
            version: 0,
        }
    }

    /// Seconds since the epoch at which the store may forget the job.
    pub fn expires_at(&self) -> i64 {
        self.created_at / 1000 + RETENTION_SECS
    }

    /// Whether a Discord render is owed for the job as it is now.
    pub fn owes_discord(&self) -> bool {
        self.discord.as_ref().is_some_and(|o| o.owes(self.state))
    }

    /// Whether a callback is owed for the job as it is now.
    pub fn owes_callback(&self) -> bool {
        self.callback.as_ref().is_some_and(|c| c.owes(self.state))
    }

    /// Whether either outbox still owes something for the job as it is now.
    pub fn owes_delivery(&self) -> bool {
        self.owes_discord() || self.owes_callback()
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
        if let Some(o) = next.discord.as_mut() {
            // A new state owes a new render: its own tries and its own 24 hours.
            o.attempts = 0;
            o.pending_since = None;
        }
        if let Some(c) = next.callback.as_mut() {
            // A new state: a new callback with its own time, tries and 24 hours.
            c.entered_at = t.at;
            c.attempts = 0;
            c.pending_since = None;
            c.last_error = None;
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
            // The build exists (or never will): nothing is left to create.
            next.creation = None;
        }
        if t.failure.is_some() {
            next.failure.clone_from(&t.failure);
        }
        if t.outcome.is_some() {
            next.outcome.clone_from(&t.outcome);
        }
        Some(next)
    }
}

/// A step forward in a job's life, with what the step learned.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    pub to: JobState,
    pub at: Millis,
    pub build: Option<BuildRef>,
    pub failure: Option<String>,
    pub outcome: Option<Outcome>,
}

impl Transition {
    pub fn to(state: JobState, at: Millis) -> Self {
        Self {
            to: state,
            at,
            build: None,
            failure: None,
            outcome: None,
        }
    }

    pub fn with_build(mut self, build: BuildRef) -> Self {
        self.build = Some(build);
        self
    }

    pub fn with_failure(mut self, reason: impl Into<String>) -> Self {
        self.failure = Some(reason.into());
        self
    }

    /// Cut to what the store can keep (see [`fit_outcome`](super::record::fit_outcome)), so the
    /// job a writer goes on with is the job as stored.
    pub fn with_outcome(mut self, outcome: Outcome) -> Self {
        self.outcome = Some(super::record::fit_outcome(&outcome).unwrap_or(outcome));
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
    fn run_ids_are_validated() {
        assert!("sub-42_H100.v2".parse::<RunId>().is_ok());
        assert!("a".repeat(64).parse::<RunId>().is_ok());
        assert_eq!("".parse::<RunId>(), Err(InvalidRunId));
        assert_eq!("a".repeat(65).parse::<RunId>(), Err(InvalidRunId));
        assert_eq!("a/b".parse::<RunId>(), Err(InvalidRunId));
        assert_eq!("ünï".parse::<RunId>(), Err(InvalidRunId));
        assert!(RunId::generate().as_str().parse::<RunId>().is_ok());
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
