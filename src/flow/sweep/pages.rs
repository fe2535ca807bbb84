//! The outbox a page at a time, in bookmark order from where the last pass's deliveries
//! stopped round to it again. A pass lists another page only when its lanes have room and
//! nothing to start, so a receiver that hangs on the first page never keeps the rest of
//! the outbox waiting; past the first page it goes on from its frontier (where the last
//! pass's listing got to), so even a hung receiver with more jobs than a pass lists keeps
//! nobody after them waiting. Pure: the pass makes each listing [`Pages::since`] asks for
//! and hands it to [`Pages::take`].

use super::order::bookmark;
use crate::jobs::{Listed, Listing};
use crate::time::Millis;

/// Jobs one page holds (a listing asks for one more, to know whether there is more).
pub(super) const PAGE: usize = super::SWEEP_BATCH;
/// Pages one pass lists at most.
pub(super) const MAX_PAGES: usize = 10;

pub(super) struct Pages {
    /// Where the last pass's first unstarted send was (`None`: the outbox's start).
    mark: Option<String>,
    /// Where the last pass's listing got to, if it got past its first page.
    frontier: Option<String>,
    /// Where the next page starts (`None`: the outbox's start).
    next: Option<String>,
    /// Past the outbox's end: listing from its start up to `mark`.
    wrapped: bool,
    /// Come round to `mark`: every job has been listed.
    round: bool,
    listed: usize,
}

/// A bookmark before every job created at `ms`.
fn start_of(ms: Millis) -> String {
    format!("{:020}:", ms.max(0))
}

impl Pages {
    pub(super) fn new(mark: Option<String>, frontier: Option<String>) -> Self {
        Self {
            next: mark.clone(),
            wrapped: mark.is_none(),
            mark,
            frontier,
            round: false,
            listed: 0,
        }
    }

    /// Whether another page may be listed.
    pub(super) fn more(&self) -> bool {
        !self.round && self.listed < MAX_PAGES
    }

    /// The creation time the next listing starts at (it asks for `PAGE + 1` jobs).
    pub(super) fn since(&self) -> Millis {
        self.next.as_deref().map_or(0, super::order::created_at_of)
    }

    /// Where the pass's order puts `mark`: after the bookmark, or (`true`) before it.
    fn position<'a>(&self, mark: &'a str) -> (bool, &'a str) {
        (self.mark.as_deref().is_some_and(|m| mark < m), mark)
    }

    /// The next page from the listing made at [`Self::since`], in order.
    pub(super) fn take(&mut self, listing: Listing) -> Vec<Listed> {
        self.listed += 1;
        let since = self.since();
        let from = self.next.take();
        let full = listing.len() > PAGE;
        let mut jobs = listing.jobs;
        jobs.sort_by_cached_key(bookmark);
        if let Some(from) = &from {
            // The same millisecond may hold jobs before `from`: they come round later.
            jobs.retain(|j| bookmark(j).as_str() >= from.as_str());
        }
        if full && let Some((ms, run_id)) = listing.last {
            // The last record read may be one of many in its millisecond (the index orders
            // by time alone): the next page starts at that millisecond's start, unless the
            // whole page is that one millisecond.
            let cut = if ms > since {
                start_of(ms)
            } else {
                format!("{}{run_id}", start_of(ms))
            };
            jobs.retain(|j| bookmark(j) < cut);
            self.next = Some(cut);
        }
        self.stop_at_mark(&mut jobs, full);
        if self.listed == 1 && !self.round {
            self.jump_to_frontier();
        }
        jobs
    }

    /// Past the end the listing goes on from the start, up to the bookmark it began at.
    fn stop_at_mark(&mut self, jobs: &mut Vec<Listed>, full: bool) {
        if self.wrapped
            && let Some(mark) = self.mark.clone()
        {
            let past = |b: &str| b >= mark.as_str();
            if jobs.iter().any(|j| past(&bookmark(j))) || self.next.as_deref().is_some_and(past) {
                jobs.retain(|j| !past(&bookmark(j)));
                self.round = true;
                self.next = None;
                return;
            }
        }
        if !full {
            self.round = self.wrapped;
            self.wrapped = true;
            self.next = None;
        }
    }

    /// After the first page, the listing goes on where the last pass's got to, when that is
    /// further on: what lies between was listed then.
    fn jump_to_frontier(&mut self) {
        let Some(frontier) = self.frontier.clone() else {
            return;
        };
        let here = match &self.next {
            Some(next) => self.position(next),
            None if self.wrapped => (true, ""),
            None => return,
        };
        let there = self.position(&frontier);
        if there > here {
            self.wrapped = there.0;
            self.next = Some(frontier);
        }
    }

    /// Where the listing got to: the next pass's frontier (`None`: it came round).
    pub(super) fn reached(&self) -> Option<String> {
        if self.round { None } else { self.next.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::Job;

    fn job(ms: Millis, run_id: &str) -> Listed {
        let id = run_id.parse().expect("run id");
        Listed::from(&Job::new(id, "g".into(), "q".into(), None, None, ms))
    }

    /// An outbox of `n` jobs, one a millisecond, as a store lists it from `since`.
    fn outbox(n: usize) -> Vec<Listed> {
        (0..n)
            .map(|i| job(i as Millis, &format!("j{i:05}")))
            .collect()
    }

    fn list(all: &[Listed], since: Millis) -> Listing {
        let mut listing = Listing::default();
        let from = all.iter().filter(|j| j.created_at >= since);
        for j in from.take(PAGE + 1) {
            listing.push(j.created_at, j.run_id.as_str(), Ok(j.clone()));
        }
        listing
    }

    /// The run ids of every page a pass lists.
    fn pass(all: &[Listed], pages: &mut Pages) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        while pages.more() {
            let page = pages.take(list(all, pages.since()));
            out.push(page.iter().map(|j| j.run_id.to_string()).collect());
        }
        out
    }

    fn mark(i: usize) -> String {
        bookmark(&job(i as Millis, &format!("j{i:05}")))
    }

    #[test]
    fn a_pass_lists_the_outbox_once_round_from_its_bookmark() {
        let all = outbox(2_500);
        let mut pages = Pages::new(None, None);
        let sizes: Vec<usize> = pass(&all, &mut pages).iter().map(Vec::len).collect();
        assert_eq!(sizes, [1000, 1000, 500]);
        assert_eq!(pages.reached(), None, "round");

        let mut pages = Pages::new(Some(mark(2_200)), None);
        let seen = pass(&all, &mut pages);
        let sizes: Vec<usize> = seen.iter().map(Vec::len).collect();
        assert_eq!(sizes, [300, 1000, 1000, 200], "from the mark, round to it");
        assert_eq!(seen[0][0], "j02200");
        assert_eq!(seen[3].last().map(String::as_str), Some("j02199"));

        let mut empty = Pages::new(Some(mark(7)), None);
        assert_eq!(pass(&[], &mut empty), vec![Vec::<String>::new(); 2]);
    }

    #[test]
    fn a_pass_lists_at_most_its_pages_and_the_next_goes_on_from_there() {
        let all = outbox(12_000);
        let mut pages = Pages::new(None, None);
        assert_eq!(pass(&all, &mut pages).len(), MAX_PAGES);
        assert_eq!(pages.reached(), Some(start_of(10_000)));
    }

    #[test]
    fn past_its_first_page_a_pass_goes_on_from_the_frontier() {
        let all = outbox(30_000);
        // A hung receiver holds the bookmark at job 100; the last pass listed up to 10,100.
        let mut pages = Pages::new(Some(mark(100)), Some(start_of(10_100)));
        let seen = pass(&all, &mut pages);
        assert_eq!(seen[0][0], "j00100");
        assert_eq!(seen[1][0], "j10100", "between was listed last pass");
        assert_eq!(pages.reached(), Some(start_of(19_100)));
        // A frontier the first page has passed is no jump.
        let mut pages = Pages::new(Some(mark(100)), Some(start_of(500)));
        assert_eq!(pass(&all, &mut pages)[1][0], "j01100");
    }

    #[test]
    fn jobs_sharing_a_millisecond_across_a_page_boundary_are_all_listed() {
        // 1,200 jobs in ten milliseconds: pages end on a millisecond's start.
        let all: Vec<Listed> = (0..1_200)
            .map(|i| job(i as Millis / 120, &format!("t{:05}", 1_199 - i)))
            .collect();
        let mut pages = Pages::new(None, None);
        let seen: Vec<String> = pass(&all, &mut pages).concat();
        assert_eq!(seen.len(), 1_200, "each job once");
        let unique: std::collections::HashSet<&String> = seen.iter().collect();
        assert_eq!(unique.len(), 1_200);
    }

    #[test]
    fn an_unreadable_record_at_a_page_end_is_passed_over_not_stuck_on() {
        let all = outbox(1_001);
        let mut listing = list(&all, 0);
        listing.jobs.truncate(1); // every record after the first is unreadable
        listing.unreadable = 1_000;
        let mut pages = Pages::new(None, None);
        let page = pages.take(listing);
        assert_eq!(page.len(), 1);
        assert_eq!(pages.since(), 1_000, "the next page starts past them");
    }
}
