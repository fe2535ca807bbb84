//! Changing a stored job: a pure decision applied by compare-and-swap, decided again on
//! whatever another writer wrote first.

use super::error::{KeptChanging, StoreError};
use super::id::RunId;
use super::model::Job;
use super::store::{JobStore, Replaced};

/// What [`update`] did.
#[derive(Debug, PartialEq)]
pub enum Updated {
    /// The change was written; the job as written.
    Written(Job),
    /// The change declined (nothing to do); the job as it is.
    Unchanged(Job),
    Missing,
}

impl Updated {
    /// The job as it is after the update, whichever way it went.
    pub fn job(self) -> Option<Job> {
        match self {
            Self::Written(j) | Self::Unchanged(j) => Some(j),
            Self::Missing => None,
        }
    }
}

/// Concurrent writers to one job are a handful of webhooks and a sweep; this many rounds
/// means something is wrong.
const MAX_ROUNDS: usize = 16;

/// Applies `change` (a pure decision: the next job, or `None` for no change) to the job as
/// stored, deciding again whenever another writer got there first.
pub async fn update(
    store: &dyn JobStore,
    run_id: &RunId,
    change: impl FnMut(&Job) -> Option<Job> + Send,
) -> Result<Updated, StoreError> {
    match store.get(run_id).await? {
        Some(job) => decide(store, job, true, change).await,
        None => Ok(Updated::Missing),
    }
}

/// How a caller came by the job it starts a change from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// Its own read or write of the job, just made: a decision of no change on it is
    /// trusted as one on a read would be (whoever writes after it acts on what it wrote,
    /// as after a read).
    Own,
    /// Seen earlier or elsewhere (a listing, a cache): a decision of no change on it is
    /// checked on a fresh read.
    Earlier,
}

/// [`update`], starting from `seen`: the job as this caller last read or wrote it, saving
/// the read when nobody wrote since. A stale `seen` costs nothing in safety: its write is
/// refused by the version check and the change decided again on the job as stored, and a
/// decision of no change is only trusted on a fresh read.
pub async fn update_seen(
    store: &dyn JobStore,
    seen: &Job,
    change: impl FnMut(&Job) -> Option<Job> + Send,
) -> Result<Updated, StoreError> {
    update_from(store, seen, View::Earlier, change).await
}

/// [`update_seen`], trusting a decision of no change on `seen` when it is the caller's
/// [own](View::Own) view.
pub async fn update_from(
    store: &dyn JobStore,
    seen: &Job,
    view: View,
    change: impl FnMut(&Job) -> Option<Job> + Send,
) -> Result<Updated, StoreError> {
    decide(store, seen.clone(), view == View::Own, change).await
}

async fn decide(
    store: &dyn JobStore,
    mut job: Job,
    mut fresh: bool,
    mut change: impl FnMut(&Job) -> Option<Job> + Send,
) -> Result<Updated, StoreError> {
    let run_id = job.run_id.clone();
    for _ in 0..MAX_ROUNDS {
        let Some(mut next) = change(&job) else {
            if fresh {
                return Ok(Updated::Unchanged(job));
            }
            fresh = true;
            match store.get(&run_id).await? {
                Some(stored) => job = stored,
                None => return Ok(Updated::Missing),
            }
            continue;
        };
        next.version = job.version + 1;
        let write_id = uuid::Uuid::new_v4().simple().to_string();
        match store.replace(&next, &write_id).await? {
            Replaced::Written => return Ok(Updated::Written(next)),
            Replaced::Conflict(Some(latest)) => (job, fresh) = (*latest, true),
            Replaced::Conflict(None) => return Ok(Updated::Missing),
        }
    }
    Err(StoreError::unavailable(KeptChanging(run_id, MAX_ROUNDS)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job whose writers kept overtaking each other is told apart from a store that
    /// cannot be reached: the sweep counts the one and stops for the other.
    #[test]
    fn contention_is_one_job_s_and_unavailability_the_store_s() {
        let run_id: RunId = "r1".parse().unwrap();
        assert!(StoreError::unavailable(KeptChanging(run_id, MAX_ROUNDS)).is_contention());
        assert!(!StoreError::unavailable("connection refused").is_contention());
        assert!(!StoreError::TooLarge.is_contention());
    }
}
