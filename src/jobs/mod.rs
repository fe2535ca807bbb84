//! Jobs: the model, and where they are kept.

pub mod dynamo;
pub mod model;
pub mod record;
pub mod sqlite;
pub mod store;

pub use model::{BuildRef, Creation, DeliveryStatus, Job, JobState, Outbox, RunId, Transition};
pub use store::{Created, JobStore, Replaced, Shard, StoreError, Updated, update};
