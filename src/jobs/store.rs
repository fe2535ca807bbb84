//! The job store: a small trait with two real implementations, DynamoDB in production and
//! an embedded SQLite file for local runs. One contract test suite runs against both.
//!
//! Every change is a conditional write in the store itself, never a read followed by a
//! write, so concurrent or repeated webhooks cannot both win.

use std::sync::Arc;

use async_trait::async_trait;

use super::model::{Job, Millis, RunId, Transition};
use crate::config::StoreConfig;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("job store unavailable: {0}")]
    Unavailable(String),
    #[error("stored job is unreadable: {0}")]
    Corrupt(String),
}

/// What [`JobStore::create`] did.
#[derive(Debug, PartialEq)]
pub enum Created {
    New,
    /// A job with this run id already exists; it is returned unchanged.
    Existing(Box<Job>),
}

#[async_trait]
pub trait JobStore: Send + Sync {
    /// Records `job` unless its run id is taken.
    async fn create(&self, job: &Job) -> Result<Created, StoreError>;

    async fn get(&self, run_id: &RunId) -> Result<Option<Job>, StoreError>;

    /// Applies `t` when it moves the job forward and returns the job after it; `None` when
    /// the job is unknown or already at or past `t.to`.
    async fn advance(&self, run_id: &RunId, t: &Transition) -> Result<Option<Job>, StoreError>;

    /// Records the id of the job's Discord message unless one is recorded already; returns
    /// the job as it is now, or `None` when the id was not recorded.
    async fn set_discord_message(
        &self,
        run_id: &RunId,
        message_id: &str,
    ) -> Result<Option<Job>, StoreError>;

    /// Records that the job's Discord webhook answered 404 and must not be used again.
    async fn mark_discord_gone(&self, run_id: &RunId) -> Result<(), StoreError>;

    /// Unfinished jobs created before `created_before`, oldest first.
    async fn list_open(&self, created_before: Millis, limit: usize)
    -> Result<Vec<Job>, StoreError>;
}

/// Opens the store the configuration names.
pub async fn open(config: &StoreConfig) -> Result<Arc<dyn JobStore>, StoreError> {
    Ok(match config {
        StoreConfig::Dynamo { table } => {
            Arc::new(super::dynamo::DynamoStore::from_env(table.clone()).await)
        }
        StoreConfig::Embedded { dir } => Arc::new(super::sqlite::SqliteStore::open(dir)?),
    })
}
