//! Jobs: the model, and where they are kept.

pub mod dynamo;
pub mod model;
pub mod record;
pub mod sqlite;
pub mod store;

pub use model::{BuildRef, Job, JobState, RunId, Transition};
pub use store::{Created, JobStore, StoreError};
