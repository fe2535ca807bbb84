//! The job store: a small trait with two real implementations, DynamoDB in production and
//! an embedded SQLite file for local runs. One contract test suite runs against both.
//!
//! Every change is a compare-and-swap on the job's `version`: read, decide (pure), write if
//! nobody wrote in between, else decide again on what they wrote. Concurrent or repeated
//! webhooks therefore cannot both win, and no rule lives in a store.

use std::sync::Arc;

use async_trait::async_trait;

use super::model::{Job, JobState, Millis, RunId};
use crate::config::StoreConfig;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("job store unavailable: {0}")]
    Unavailable(String),
    #[error("stored job is unreadable: {0}")]
    Corrupt(String),
    /// The record is over the store's item size limit: retrying the same write cannot help.
    #[error("job record exceeds the store's item size limit")]
    TooLarge,
}

/// Largest record either store accepts (DynamoDB's item limit); the embedded store enforces
/// it too, so both fail alike.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;

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
}

impl Shard {
    pub fn key(self) -> &'static str {
        match self {
            Self::Open => super::record::OPEN,
            Self::Outbox => super::record::OUTBOX,
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

    /// Up to `limit` jobs of `shard` created before `created_before`, oldest first.
    async fn list(
        &self,
        shard: Shard,
        created_before: Millis,
        limit: usize,
    ) -> Result<Vec<Job>, StoreError>;

    /// The state and creation time of every open job of `queue` (an index, not a scan).
    async fn open_in_queue(&self, queue: &str) -> Result<Vec<(JobState, Millis)>, StoreError>;

    /// A value every instance shares (the agents list), kept under `key`.
    async fn cached(&self, key: &str) -> Result<Option<CacheEntry>, StoreError>;

    /// Writes `entry` under `key` if the entry there is still the one claimed at `expected`
    /// (`None`: there is none); whether it was written.
    async fn put_cached(
        &self,
        key: &str,
        entry: &CacheEntry,
        expected: Option<Millis>,
    ) -> Result<bool, StoreError>;

    /// Where the last sweep pass stopped following builds (its budget ran out), if it did.
    async fn sweep_cursor(&self) -> Result<Option<String>, StoreError>;

    async fn set_sweep_cursor(&self, cursor: Option<&str>) -> Result<(), StoreError>;
}

/// A shared cached value: what was fetched and when, and when a refresh was last claimed
/// (the claim is what limits refreshes across instances).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CacheEntry {
    pub value: Option<String>,
    pub fetched_at: Millis,
    pub claimed_at: Millis,
}

/// The key the sweep's bookmark is kept under: `~` is not allowed in a run id, so it never
/// meets a job.
pub const CURSOR_KEY: &str = "~sweep-cursor";

/// What [`update`] did.
#[derive(Debug, PartialEq)]
pub enum Updated {
    /// The change was written; the job as written.
    Written(Job),
    /// The change declined (nothing to do); the job as it is.
    Unchanged(Job),
    Missing,
}

impl Updated {
    /// The job as it is after the update, whichever way it went.
    pub fn job(self) -> Option<Job> {
        match self {
            Self::Written(j) | Self::Unchanged(j) => Some(j),
            Self::Missing => None,
        }
    }
}

/// Concurrent writers to one job are a handful of webhooks and a sweep; this many rounds
/// means something is wrong.
const MAX_ROUNDS: usize = 16;

/// Applies `change` (a pure decision: the next job, or `None` for no change) to the job as
/// stored, deciding again whenever another writer got there first.
pub async fn update(
    store: &dyn JobStore,
    run_id: &RunId,
    change: impl FnMut(&Job) -> Option<Job> + Send,
) -> Result<Updated, StoreError> {
    match store.get(run_id).await? {
        Some(job) => decide(store, job, true, change).await,
        None => Ok(Updated::Missing),
    }
}

/// [`update`], starting from `seen`: the job as this caller last read or wrote it, saving
/// the read when nobody wrote since. A stale `seen` costs nothing in safety: its write is
/// refused by the version check and the change decided again on the job as stored, and a
/// decision of no change is only trusted on a fresh read.
pub async fn update_seen(
    store: &dyn JobStore,
    seen: &Job,
    change: impl FnMut(&Job) -> Option<Job> + Send,
) -> Result<Updated, StoreError> {
    decide(store, seen.clone(), false, change).await
}

async fn decide(
    store: &dyn JobStore,
    mut job: Job,
    mut fresh: bool,
    mut change: impl FnMut(&Job) -> Option<Job> + Send,
) -> Result<Updated, StoreError> {
    let run_id = job.run_id.clone();
    for _ in 0..MAX_ROUNDS {
        let Some(mut next) = change(&job) else {
            if fresh {
                return Ok(Updated::Unchanged(job));
            }
            fresh = true;
            match store.get(&run_id).await? {
                Some(stored) => job = stored,
                None => return Ok(Updated::Missing),
            }
            continue;
        };
        next.version = job.version + 1;
        let write_id = uuid::Uuid::new_v4().simple().to_string();
        match store.replace(&next, &write_id).await? {
            Replaced::Written => return Ok(Updated::Written(next)),
            Replaced::Conflict(Some(latest)) => (job, fresh) = (*latest, true),
            Replaced::Conflict(None) => return Ok(Updated::Missing),
        }
    }
    Err(StoreError::Unavailable(format!(
        "job {run_id} kept changing under {MAX_ROUNDS} tries"
    )))
}

/// Opens the store the configuration names.
pub async fn open(config: &StoreConfig) -> Result<Arc<dyn JobStore>, StoreError> {
    Ok(match config {
        StoreConfig::Dynamo { table } => {
            Arc::new(super::dynamo::DynamoStore::from_env(table.clone()).await)
        }
        #[cfg(feature = "embedded-store")]
        StoreConfig::Embedded { dir } => Arc::new(super::sqlite::SqliteStore::open(dir)?),
        // Configuration never names it in such a build; kept total for the type's sake.
        #[cfg(not(feature = "embedded-store"))]
        StoreConfig::Embedded { .. } => {
            return Err(StoreError::Unavailable(
                "this build has no embedded store: set JOBS_TABLE".into(),
            ));
        }
    })
}
