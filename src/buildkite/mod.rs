//! Buildkite: the REST client we call, and the webhooks it sends us. It speaks Buildkite's
//! wire format only: builds, artifacts, agents, signed events; it knows nothing of jobs.

mod budget;
mod client;
mod error;
mod gate;
mod model;
mod webhook;

pub(crate) use budget::CallBudget;
pub use client::BuildkiteClient;
pub use error::BuildkiteError;
pub(crate) use error::MAX_ARTIFACT_BYTES;
pub(crate) use gate::Priority;
pub(crate) use model::{Agent, Artifact, NewBuild, beside, pick_result};
pub use model::{Build, BuildJob, JobAgent, TERMINAL_STATES};
pub(crate) use webhook::{EVENT_HEADER, SIGNATURE_HEADER, TOKEN_HEADER};
pub use webhook::{PipelineRef, VerifyError, WebhookAuth, WebhookEvent, sign};
