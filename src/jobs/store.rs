//! The job store: a small trait with two real implementations, DynamoDB in production
//! (`dynamo.rs`) and an embedded SQLite file for local runs (`sqlite.rs`). One contract test
//! suite runs against both.
//!
//! Every change is a compare-and-swap on the job's `version`: read, decide (pure), write if
//! nobody wrote in between, else decide again on what they wrote (`update.rs`).
//! Concurrent or repeated webhooks therefore cannot both win, and no rule lives in a store.

use async_trait::async_trait;

use super::error::StoreError;
use super::id::{RunId, UserId};
use super::listed::Listing;
use super::model::Job;
use super::state::JobState;
use crate::time::Millis;

/// What [`JobStore::create`] did.
#[derive(Debug, PartialEq)]
pub enum Created {
    New,
    /// A job with this run id already exists; it is returned unchanged.
    Existing(Box<Job>),
}

/// What [`JobStore::replace`] did.
#[derive(Debug, PartialEq)]
pub enum Replaced {
    Written,
    /// Someone else wrote first: the job as it is now (`None` if it does not exist).
    Conflict(Option<Box<Job>>),
}

/// The sweep's partitions of the store (a sparse index in DynamoDB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shard {
    /// Jobs not yet finished.
    Open,
    /// Finished jobs whose final report is still owed.
    Outbox,
    /// Finished jobs whose final report or callback was given up: what an operator may
    /// replay (`kernelbot-dispatch replay --given-up`). The sweep never lists them.
    GivenUp,
}

impl Shard {
    /// The sparse index's key for the partition, as stored.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Outbox => "outbox",
            Self::GivenUp => "given_up",
        }
    }
}

/// An open job of a queue, as the queue index shows it: what fair share and queue positions
/// are computed from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenJob {
    pub run_id: RunId,
    pub state: JobState,
    pub created_at: Millis,
    /// Its submitter, where the submission named one.
    pub user: Option<UserId>,
    /// Held back by its user's limit: no build yet.
    pub waiting: bool,
    /// A background job waiting for an idle agent ([`crate::jobs::Job::background`]); once
    /// released it counts as any job in flight.
    pub background: bool,
    /// When its build was recorded: Buildkite runs its queue in that order.
    pub scheduled_at: Option<Millis>,
    /// The place its message last showed (placing edits only those whose place moved).
    pub queue_position: Option<u32>,
}

/// A run id as an index holds it; `None` (logged) for one this version cannot read, so that
/// one bad row of a listing holds back no other.
pub(crate) fn readable_run_id(text: String) -> Option<RunId> {
    match text.parse() {
        Ok(run_id) => Some(run_id),
        Err(e) => {
            tracing::warn!(error = %e, run_id = %text, "an open job's run id cannot be read");
            None
        }
    }
}

impl From<&Job> for OpenJob {
    /// The job as the queue index would show it (a caller that has just written it knows
    /// it before the index does).
    fn from(job: &Job) -> Self {
        Self {
            run_id: job.run_id.clone(),
            state: job.state,
            created_at: job.created_at,
            user: job.user.clone(),
            waiting: job.waiting,
            background: job.background && job.waiting,
            scheduled_at: job.scheduled_at,
            queue_position: job.queue_position,
        }
    }
}

/// A shared cached value: what was fetched and when, when a refresh was last claimed (the
/// claim is what limits refreshes across instances), and its version, which every write
/// changes and [`JobStore::put_cached`] compares.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CacheEntry {
    pub value: Option<String>,
    pub fetched_at: Millis,
    pub claimed_at: Millis,
    /// The entry's count of writes: one more at each write (see [`next_version`]). An entry
    /// an earlier release wrote has none and reads as 0.
    #[serde(default)]
    pub version: Millis,
    /// When the store may forget the entry (`None`: never). A reader treats a value past it
    /// as gone; DynamoDB deletes the item by its TTL, the embedded store at the sweep's
    /// [`JobStore::forget_expired`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Millis>,
}

impl CacheEntry {
    /// An entry nobody claims (a lease, a count, a shared list), written at `version`: its
    /// claim time mirrors the version, which is what the release before versions compared,
    /// so that release's instances still meet this write mid-upgrade.
    pub fn unclaimed(
        value: Option<String>,
        fetched_at: Millis,
        version: Millis,
        expires_at: Option<Millis>,
    ) -> Self {
        Self {
            value,
            fetched_at,
            claimed_at: version,
            version,
            expires_at,
        }
    }
}

/// The version an entry's next write carries, given the version read (`None`: no entry):
/// one more, or for an entry made anew the time, so a writer who read an earlier entry of
/// that key, since expired and forgotten, cannot match the new one's.
pub fn next_version(read: Option<Millis>, now: Millis) -> Millis {
    read.map_or(now.max(1), |v| v.saturating_add(1))
}

/// The sweep's bookmarks: where a pass whose time or budget ran out stopped, so the next
/// one goes on from there and every job is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cursor {
    /// Following open jobs' builds.
    Builds,
    /// Sending what open jobs owe: the first send a pass did not start.
    OpenSends,
    /// Sending what the outbox owes: the first send a pass did not start.
    Outbox,
    /// How far the last pass's listing of the outbox got.
    Frontier,
    /// Where the next pass's page of open jobs starts.
    OpenPage,
}

impl Cursor {
    /// The key it is kept under: `~` is not allowed in a run id, so it never meets a job.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Self::Builds => "~sweep-cursor",
            Self::OpenSends => "~open-sends-cursor",
            Self::Outbox => "~outbox-cursor",
            Self::Frontier => "~outbox-frontier",
            Self::OpenPage => "~open-page-cursor",
        }
    }
}

#[async_trait]
pub trait JobStore: Send + Sync {
    /// Records `job` unless its run id is taken.
    async fn create(&self, job: &Job) -> Result<Created, StoreError>;

    async fn get(&self, run_id: &RunId) -> Result<Option<Job>, StoreError>;

    /// Writes `job` if the stored job is still at version `job.version - 1`. `write_id` is
    /// unique to this write: a retry of a write that landed is recognised as written.
    async fn replace(&self, job: &Job, write_id: &str) -> Result<Replaced, StoreError>;

    /// Up to `limit` jobs of `shard` created at or after `from`, oldest first, as a listing
    /// shows them: never their large parts, so a listing's size depends on `limit` alone. A
    /// record this version cannot read is counted, not fatal.
    async fn list(&self, shard: Shard, from: Millis, limit: usize) -> Result<Listing, StoreError>;

    /// Every open job of `queue` (an index, not a scan), in no particular order.
    async fn open_in_queue(&self, queue: &str) -> Result<Vec<OpenJob>, StoreError>;

    /// A value every instance shares (the agents list), kept under `key`.
    async fn cached(&self, key: &str) -> Result<Option<CacheEntry>, StoreError>;

    /// Writes `entry` under `key` if the entry there is still at version `expected` (`None`:
    /// there is none; `Some(0)`: one an earlier release wrote, without a version); whether it
    /// was written. `entry.version` is the caller's ([`next_version`]).
    async fn put_cached(
        &self,
        key: &str,
        entry: &CacheEntry,
        expected: Option<Millis>,
    ) -> Result<bool, StoreError>;

    /// As [`JobStore::put_cached`], and where the write is refused, the entry that refused
    /// it (`None`: there is none), so a compare-and-swap goes again without a read of its
    /// own. A store that cannot answer with the entry reads it.
    async fn swap_cached(
        &self,
        key: &str,
        entry: &CacheEntry,
        expected: Option<Millis>,
    ) -> Result<Result<(), Option<CacheEntry>>, StoreError> {
        if self.put_cached(key, entry, expected).await? {
            return Ok(Ok(()));
        }
        Ok(Err(self.cached(key).await?))
    }

    /// Where the last sweep pass stopped `which` work, if it stopped short.
    async fn cursor(&self, which: Cursor) -> Result<Option<String>, StoreError>;

    async fn set_cursor(&self, which: Cursor, at: Option<&str>) -> Result<(), StoreError>;

    /// Forgets the shared entries expired at `now`, where the store does not do so itself;
    /// how many it forgot.
    async fn forget_expired(&self, now: Millis) -> Result<usize, StoreError>;
}
