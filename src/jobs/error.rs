//! How a store fails.

use crate::error::{BoxError, chain};

use super::id::RunId;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or did not finish the call: a later try may pass.
    #[error("job store unavailable: {}", chain(.0.as_ref()))]
    Unavailable(#[source] BoxError),
    /// A stored record this version cannot read.
    #[error("stored job is unreadable: {}", chain(.0.as_ref()))]
    Corrupt(#[source] BoxError),
    /// The record is over the store's item size limit: retrying the same write cannot help.
    #[error("job record exceeds the store's item size limit")]
    TooLarge,
}

impl StoreError {
    pub(crate) fn unavailable(e: impl Into<BoxError>) -> Self {
        Self::Unavailable(e.into())
    }

    pub(crate) fn corrupt(e: impl Into<BoxError>) -> Self {
        Self::Corrupt(e.into())
    }

    /// One job's writers kept overtaking each other: that job's trouble, not the store's.
    pub(crate) fn is_contention(&self) -> bool {
        matches!(self, Self::Unavailable(e) if e.is::<KeptChanging>())
    }
}

/// Another writer won every round: the job is changing faster than it can be decided on.
#[derive(Debug, thiserror::Error)]
#[error("job {0} kept changing under {1} tries")]
pub(crate) struct KeptChanging(pub(crate) RunId, pub(crate) usize);
