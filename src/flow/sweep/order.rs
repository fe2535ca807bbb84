//! A pass's order: jobs by creation time (then run id), the bookmarks that let the next
//! pass go on where one stopped, and the page of open jobs each pass goes over.

use crate::jobs::{Listed, Listing};
use crate::time::Millis;

/// A job's place in the order, in the bookmark's stored form.
pub(super) fn bookmark(job: &Listed) -> String {
    format!("{:020}:{}", job.created_at.max(0), job.run_id)
}

/// The creation time a bookmark starts at (0 for one this version cannot read).
pub(super) fn created_at_of(mark: &str) -> Millis {
    mark.split(':')
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

/// Sorts `jobs` in order, starting at `mark`: those before it go last.
pub(super) fn rotate_to(jobs: &mut [&Listed], mark: Option<&str>) {
    jobs.sort_by_cached_key(|j| bookmark(j));
    if let Some(mark) = mark {
        let at = jobs.partition_point(|j| bookmark(j).as_str() < mark);
        jobs.rotate_left(at);
    }
}

/// The open jobs a pass goes over: at most `page` of them in order from `mark` (where the
/// last pass's page ended; `None`: the first), from `listing` (the open jobs listed from
/// `mark`'s creation time, `page + 1` at most); and where the next pass's page starts
/// (`None`: at the first again, this page having reached the last). However many jobs are
/// open, every one is on some pass's page: the sweep reaches jobs no webhook finished even
/// behind a thousand older ones waiting for their turn.
pub(super) fn open_page(
    listing: Listing,
    mark: Option<&str>,
    page: usize,
) -> (Vec<Listed>, Option<String>) {
    let full = listing.len() > page;
    let last = listing.last;
    let mut jobs = listing.jobs;
    jobs.sort_by_cached_key(bookmark);
    if let Some(mark) = mark {
        // The same millisecond may hold jobs before the mark: the last page had them.
        jobs.retain(|j| bookmark(j).as_str() >= mark);
    }
    if jobs.len() > page {
        let next = bookmark(&jobs[page]);
        jobs.truncate(page);
        return (jobs, Some(next));
    }
    // More were read than this page shows (some before the mark, some unreadable): the next
    // page starts at the last one read.
    let next = last
        .filter(|_| full)
        .map(|(ms, run_id)| format!("{:020}:{run_id}", ms.max(0)));
    (jobs, next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::Job;

    fn listed(run_id: &str, created_at: Millis) -> Listed {
        let job = Job::new(
            run_id.parse().expect("run id"),
            "g".into(),
            "q".into(),
            None,
            None,
            created_at,
        );
        Listed::from(&job)
    }

    #[test]
    fn a_pass_starts_at_the_bookmark_and_comes_round_to_the_rest() {
        let jobs = [
            listed("c", 20),
            listed("a", 10),
            listed("b", 20),
            listed("d", 30),
        ];
        let ids = |mark: Option<&str>| {
            let mut order: Vec<&Listed> = jobs.iter().collect();
            rotate_to(&mut order, mark);
            order
                .iter()
                .map(|j| j.run_id.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(None), ["a", "b", "c", "d"]);
        let mark = bookmark(&jobs[0]);
        assert_eq!(ids(Some(&mark)), ["c", "d", "a", "b"]);
        assert_eq!(created_at_of(&mark), 20);
        assert_eq!(ids(Some("99999999999999999999:z")), ["a", "b", "c", "d"]);
        assert_eq!(created_at_of("not a bookmark"), 0);
    }

    fn listing(jobs: &[(&str, Millis)], unreadable: usize) -> Listing {
        let jobs: Vec<Listed> = jobs.iter().map(|(id, at)| listed(id, *at)).collect();
        let last = jobs
            .iter()
            .map(|j| (j.created_at, j.run_id.to_string()))
            .max();
        Listing {
            jobs,
            unreadable,
            last,
        }
    }

    #[test]
    fn every_open_job_is_on_some_pass_s_page() {
        let ids = |jobs: Vec<Listed>| -> Vec<String> {
            jobs.iter().map(|j| j.run_id.to_string()).collect()
        };
        // (listed, unreadable, mark, page) -> (page's jobs, next mark)
        let (jobs, next) = open_page(listing(&[("b", 20), ("a", 10), ("c", 30)], 0), None, 2);
        assert_eq!(ids(jobs), ["a", "b"]);
        assert_eq!(
            next.as_deref(),
            Some("00000000000000000030:c"),
            "c starts the next"
        );
        let (jobs, next) = open_page(listing(&[("c", 30), ("d", 40)], 0), next.as_deref(), 2);
        assert_eq!(
            (ids(jobs), next),
            (vec!["c".into(), "d".into()], None),
            "the last page"
        );
        // Jobs of the mark's millisecond before it were the last page's; with them read,
        // the listing is full though this page is not: the next starts past what was read.
        let mark = "00000000000000000030:c";
        let read = listing(&[("a", 30), ("c", 30), ("e", 50)], 0);
        let (jobs, next) = open_page(read, Some(mark), 2);
        assert_eq!(ids(jobs), ["c", "e"]);
        assert_eq!(next.as_deref(), Some("00000000000000000050:e"));
        // An unreadable record counts as read: the listing was full.
        let (jobs, next) = open_page(listing(&[("a", 10), ("b", 20)], 1), None, 2);
        assert_eq!(ids(jobs), ["a", "b"]);
        assert!(next.is_some(), "more may follow the unreadable one");
        let (jobs, next) = open_page(listing(&[], 0), Some(mark), 2);
        assert_eq!(
            (jobs.len(), next),
            (0, None),
            "past the end: round to the first"
        );
    }
}
