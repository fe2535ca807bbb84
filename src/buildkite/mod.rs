//! Buildkite: the REST client we call, and the webhooks it sends us.

pub mod client;
pub mod model;
pub mod webhook;

pub use client::{BuildkiteClient, BuildkiteError};
pub use model::{Agent, Artifact, Build, NewBuild};
