//! The job's path through the system, one module per arrow of the flow (see
//! `docs/architecture.md`), each a few functions over the shared [`Deps`]:
//!
//! - [`submit`]: record a job, then create its build ([`create`]) or leave that to the sweep;
//! - [`events`]: a signed Buildkite webhook moves the job forward;
//! - [`deliver`]: the Discord and callback outboxes, until nothing is owed;
//! - [`follow`]: the sweep reads a build the webhooks said nothing about;
//! - [`sweep`]: one pass that finishes whatever the others left undone;
//! - [`cancel`]: a user no longer wants a run;
//! - [`resend`]: an operator sends an ended job's report and callback again;
//! - [`queues`]: who can run a queue's jobs and how many wait;
//! - [`catch_up`]: a job's end takes up the creates Buildkite's rate limit deferred.
//!
//! Moving a job forward is [`advance`]; reading a finished build's result is [`outcome`].
//! The decisions they act on are pure functions in [`rules`]; what people and programs are
//! shown of a job is [`present`]. Data flows one way: http → flow → (buildkite | discord |
//! callback | jobs).

mod advance;
pub mod cancel;
mod catch_up;
mod clicks;
mod create;
pub mod deliver;
mod deps;
pub mod events;
pub(crate) mod fair;
pub mod fleet;
mod follow;
mod outcome;
pub mod present;
pub mod profiles;
pub mod queues;
pub mod resend;
pub mod rules;
pub mod status;
pub mod submission;
pub mod submit;
pub mod sweep;

pub use deps::{Deps, StartError};

use crate::buildkite::BuildkiteError;
use crate::jobs::{Job, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Buildkite refused to create the build (4xx other than 429); the job is `failed`.
    #[error("Buildkite did not create the build: {source}")]
    BuildRefused {
        job: Box<Job>,
        #[source]
        source: BuildkiteError,
    },
    /// Buildkite could not be reached to read a build; the sweep will try again.
    #[error("Buildkite unavailable: {0}")]
    Buildkite(#[from] BuildkiteError),
    /// The pipeline itself is unreachable (token, org or slug wrong): nothing was changed.
    #[error(
        "the Buildkite pipeline cannot be read ({0}); check BUILDKITE_ORG, BUILDKITE_PIPELINE and the token"
    )]
    Pipeline(#[source] BuildkiteError),
}
