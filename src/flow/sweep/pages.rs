//! The outbox a page at a time, in bookmark order from where the last pass's deliveries
//! stopped round to it again. A pass lists another page only when it has room to send
//! more, so a receiver that hangs on the first page never keeps the rest of the outbox
//! waiting, and a pass never holds more than a few pages of listings.

use super::super::{Deps, DispatchError};
use super::SWEEP_BATCH;
use super::order::{bookmark, created_at_of};
use super::report::SweepReport;
use crate::jobs::{Listed, Shard};

/// Pages one pass lists at most.
pub(super) const MAX_PAGES: usize = 10;

pub(super) struct Pages {
    /// Where the last pass stopped (`None`: the outbox's start).
    mark: Option<String>,
    /// Where the next page starts (`None` once past the end: the outbox's start).
    next: Option<String>,
    /// Past the end, listing from the start up to `mark`.
    wrapped: bool,
    /// Come round to `mark`: every job has been listed once.
    round: bool,
    listed: usize,
}

impl Pages {
    pub(super) fn from(mark: Option<String>) -> Self {
        Self {
            next: mark.clone(),
            wrapped: mark.is_none(),
            mark,
            round: false,
            listed: 0,
        }
    }

    /// Whether another page may be listed.
    pub(super) fn more(&self) -> bool {
        !self.round && self.listed < MAX_PAGES
    }

    /// The next page, in order (empty once round); records that cannot be read are counted
    /// in `report`.
    pub(super) async fn next(
        &mut self,
        d: &Deps,
        report: &mut SweepReport,
    ) -> Result<Vec<Listed>, DispatchError> {
        if !self.more() {
            return Ok(Vec::new());
        }
        self.listed += 1;
        let from = self.next.take();
        let since = from.as_deref().map_or(0, created_at_of);
        let listing = d.store.list(Shard::Outbox, since, SWEEP_BATCH + 1).await?;
        report.errors += listing.unreadable;
        let full = listing.len() > SWEEP_BATCH;
        let mut jobs = listing.jobs;
        if full {
            self.next = jobs.pop().map(|j| bookmark(&j));
        }
        if let Some(from) = &from {
            // The same millisecond may hold jobs before the mark: they come at the end.
            jobs.retain(|j| bookmark(j).as_str() >= from.as_str());
        }
        if self.wrapped
            && let Some(mark) = &self.mark
            && jobs.iter().any(|j| bookmark(j).as_str() >= mark.as_str())
        {
            jobs.retain(|j| bookmark(j).as_str() < mark.as_str());
            self.round = true;
        } else if !full {
            self.round = self.wrapped;
            self.wrapped = true;
        }
        Ok(jobs)
    }

    /// Where the next pass goes on if this one started every delivery it listed.
    pub(super) fn resume(&self) -> Option<String> {
        if self.round { None } else { self.next.clone() }
    }
}
