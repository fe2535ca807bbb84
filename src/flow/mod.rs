//! The job's path through the system, one module per arrow of the flow (see
//! `docs/architecture.md`), each a few functions over the shared [`Deps`]. An arrow calls
//! only arrows below it; what its write owes (the job's messages, the fleet's notes of its
//! tries, its queue's slot when it ended the job) it records in an [`effects::Effects`] that
//! its caller hands to [`settle`].
//!
//! - [`submit`]: record a job, then create its build ([`create`]) or leave that to the sweep,
//!   or end it at once with an earlier identical run's outcome ([`reuse`]); a user past their
//!   daily GPU time ([`budget`]) is refused;
//! - [`events`]: a signed Buildkite webhook moves the job forward;
//! - [`advance`]: a transition written by compare-and-swap, and what it owes;
//! - [`ridden`]: each try's `job.finished` noted, and a finish whose result rides the event;
//! - [`deliver`]: the Discord and callback outboxes, until nothing is owed;
//! - [`follow`]: the sweep reads a build the webhooks said nothing about;
//! - [`sweep`]: one pass that finishes whatever the others left undone;
//! - [`cancel`]: a user no longer wants a run; [`stop`]: a build that must not hold a GPU;
//! - [`resend`]: an operator sends an ended job's report and callback again;
//! - [`queues`]: who can run a queue's jobs and how many wait;
//! - [`fair`]: fair share's waiting jobs, released as slots free, by the holder of the
//!   queue's [`lease`] (a caller that finds it held asks the holder to release again);
//! - [`deferred`]: the creates and finishes Buildkite's rate limit deferred, per queue;
//! - [`catch_up`]: a webhook or a job's end takes that deferred work up;
//! - [`settle`]: the one place that runs what the arrows owe (their [`effects`]): deliveries
//!   with the fleet's notes, then fair share's release after an end;
//! - [`fleet`]: the agents' records, incidents, and the operators told once;
//! - [`profiles`], [`clicks`], [`status`]: profile reports, Discord's buttons, the status page.
//!
//! Reading a finished build's result is [`outcome`]; a validated submission is [`submission`].
//! The decisions they act on are pure functions in [`rules`]; what people and programs are
//! shown of a job is [`present`]. Data flows one way: http → flow → (buildkite | discord |
//! callback | jobs).

mod advance;
pub mod budget;
pub mod cancel;
mod catch_up;
mod clicks;
mod create;
mod deferred;
pub mod deliver;
pub(crate) mod deployment;
mod deps;
mod effects;
pub mod events;
pub(crate) mod fair;
pub mod fleet;
mod follow;
pub mod keys;
mod lease;
mod outcome;
mod place_buckets;
pub mod present;
pub mod profiles;
pub mod queues;
mod quiet_lists;
pub mod resend;
mod reuse;
mod ridden;
pub mod rules;
mod settle;
pub mod status;
mod stop;
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
