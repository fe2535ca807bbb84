//! Jobs: the model, and where they are kept. Nothing here knows Discord, Buildkite or the
//! flow: a job keeps what it was told as data.

mod dynamo;
mod error;
mod id;
mod listed;
mod model;
mod outbox;
mod outcome;
mod record;
mod seen;
pub mod shared;
#[cfg(feature = "embedded-store")]
mod sqlite;
mod state;
mod store;
mod update;
mod windows;

use std::sync::Arc;

pub use dynamo::DynamoStore;
#[cfg(feature = "devstack")]
pub(crate) use dynamo::{cache_item, item_from_record};
pub use error::StoreError;
pub use id::{InvalidRunId, Queue, RunId, UserId};
pub use listed::{Listed, Listing};
pub(crate) use model::MAX_SEEN_TRIES;
pub use model::{BuildRef, Creation, Job, SeenTry, Timeline, Transition};
pub use outbox::{
    CallbackOutbox, Channel, Delivery, DeliveryStatus, DiscordOutbox, Lease, Target, WebhookAddress,
};
pub use outcome::MAX_STORED_OUTCOME;
pub use record::JobRecord;
pub use shared::SharedKey;
#[cfg(feature = "embedded-store")]
pub use sqlite::SqliteStore;
pub use state::JobState;
pub use store::{CacheEntry, Created, Cursor, JobStore, OpenJob, Replaced, Shard, next_version};

pub(crate) use seen::SeenEntries;
pub use update::{Updated, View, update, update_from, update_seen};
pub(crate) use windows::StoreWindows;

use crate::config::StoreConfig;

/// Opens the store the configuration names.
pub async fn open(config: &StoreConfig) -> Result<Arc<dyn JobStore>, StoreError> {
    Ok(match config {
        StoreConfig::Dynamo { table } => Arc::new(DynamoStore::from_env(table.clone()).await),
        #[cfg(feature = "embedded-store")]
        StoreConfig::Embedded { dir } => Arc::new(SqliteStore::open(dir)?),
        // Configuration never names it in such a build; kept total for the type's sake.
        #[cfg(not(feature = "embedded-store"))]
        StoreConfig::Embedded { .. } => {
            return Err(StoreError::unavailable(
                "this build has no embedded store: set JOBS_TABLE",
            ));
        }
    })
}
