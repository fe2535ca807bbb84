//! Jobs: the model, and where they are kept.

pub mod dynamo;
pub mod model;
pub mod record;
#[cfg(feature = "embedded-store")]
pub mod sqlite;
pub mod store;

pub use model::{
    BuildRef, CallbackOutbox, Creation, DeliveryStatus, Job, JobState, Outbox, RunId, Transition,
};
pub use store::{
    CacheEntry, Created, JobStore, Replaced, Shard, StoreError, Updated, update, update_seen,
};
