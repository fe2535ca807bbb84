//! How a Buildkite call fails, and what each failure means for the caller.

use std::time::Duration;

use crate::error::{BoxError, chain};
use crate::retry::{Again, Transient};

/// Largest `result.json` we accept.
pub(crate) const MAX_ARTIFACT_BYTES: u64 = 8 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum BuildkiteError {
    /// A 4xx about this call (a build, an artifact): the request itself was refused.
    /// `message` is Buildkite's own words, for logs (see [`BuildkiteError::public`]).
    #[error("Buildkite refused the request ({status}): {message}")]
    Rejected { status: u16, message: String },
    /// The pipeline cannot be used: a 401 or 403 to any call, or a 404 to a call on the
    /// pipeline itself. The token, organization or slug is wrong, not one build. The client
    /// decides this once, where each call's scope is known.
    #[error("Buildkite refused the request ({status}): {message}")]
    Misconfigured { status: u16, message: String },
    /// 429; `reset` is when the window resets, if Buildkite said.
    #[error("Buildkite rate limit exceeded")]
    RateLimited { reset: Option<Duration> },
    /// No answer, or a 5xx, to a call that may be repeated.
    #[error("Buildkite unavailable: {}", chain(.0.as_ref()))]
    Unavailable(#[source] BoxError),
    /// A create call whose answer was lost (timeout, 5xx): the build may exist.
    #[error("Buildkite did not confirm the build: {}", chain(.0.as_ref()))]
    Unconfirmed(#[source] BoxError),
    /// An answer that could not be read.
    #[error("unexpected response from Buildkite: {}", chain(.0.as_ref()))]
    Protocol(#[source] BoxError),
    #[error("artifact is larger than {MAX_ARTIFACT_BYTES} bytes")]
    TooLarge,
    /// The sweep pass's call budget is spent, or Buildkite's rate limit is nearly reached:
    /// the rest waits for the next pass.
    #[error("Buildkite call budget of this pass is spent")]
    OverBudget,
    /// Artifact storage refused the download (e.g. an expired link).
    #[error("artifact storage refused the download (HTTP {status})")]
    Storage { status: u16 },
}

/// A non-success answer, with the message Buildkite's body gave.
#[derive(Debug, thiserror::Error)]
#[error("HTTP {status}: {message}")]
pub(crate) struct Answered {
    pub(crate) status: reqwest::StatusCode,
    pub(crate) message: String,
}

impl BuildkiteError {
    pub(crate) fn unavailable(e: impl Into<BoxError>) -> Self {
        Self::Unavailable(e.into())
    }

    pub(crate) fn protocol(e: impl Into<BoxError>) -> Self {
        Self::Protocol(e.into())
    }

    /// A fixed sentence for people (Discord): a status code at most, never the other side's
    /// text (error pages, storage error bodies), which stays in the logs.
    pub(crate) fn public(&self) -> String {
        match self {
            Self::Rejected { status, .. } | Self::Misconfigured { status, .. } => {
                format!("Buildkite refused the request (HTTP {status})")
            }
            Self::RateLimited { .. } => "Buildkite's rate limit was reached".into(),
            Self::Unavailable(_) => "Buildkite could not be reached".into(),
            Self::Unconfirmed(_) => "Buildkite did not confirm the build".into(),
            Self::Protocol(_) => "Buildkite gave an answer that could not be read".into(),
            Self::TooLarge | Self::OverBudget | Self::Storage { .. } => self.to_string(),
        }
    }

    /// The HTTP status of a refusal.
    pub(crate) fn refused_with(&self) -> Option<u16> {
        match self {
            Self::Rejected { status, .. } | Self::Misconfigured { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the error says the pipeline (token, org or slug) is wrong rather than one build.
    pub(crate) fn is_misconfiguration(&self) -> bool {
        matches!(self, Self::Misconfigured { .. })
    }
}

impl Transient for BuildkiteError {
    fn again(&self) -> Again {
        match self {
            Self::RateLimited { reset } => Again::After(*reset),
            Self::Unavailable(_) => Again::After(None),
            _ => Again::Never,
        }
    }
}
