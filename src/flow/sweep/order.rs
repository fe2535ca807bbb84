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
    // The index orders by time alone: a full listing may hold only some of its last
    // millisecond's jobs, so the page ends before it and the next starts at its start
    // (unless the whole page is that one millisecond).
    if let Some((ms, _)) = last.as_ref().filter(|_| full)
        && jobs.iter().any(|j| j.created_at < *ms)
    {
        jobs.retain(|j| j.created_at < *ms);
        return (jobs, Some(format!("{:020}:", (*ms).max(0))));
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
        // A full listing: the page ends before its last millisecond, the next starts there.
        let (jobs, next) = open_page(listing(&[("b", 20), ("a", 10), ("c", 30)], 0), None, 2);
        assert_eq!(ids(jobs), ["a", "b"]);
        let at_30 = "00000000000000000030:";
        assert_eq!(next.as_deref(), Some(at_30), "the next starts at 30 ms");
        let (jobs, next) = open_page(listing(&[("c", 30), ("d", 40)], 0), next.as_deref(), 2);
        assert_eq!(
            (ids(jobs), next),
            (vec!["c".into(), "d".into()], None),
            "the last page"
        );
        // As DynamoDB may list them: of 30 ms's three jobs, the listing's limit cut "c"
        // off. None of that millisecond is on this page; the next lists all three.
        let read = listing(&[("a", 10), ("e", 30), ("d", 30)], 0);
        let (jobs, next) = open_page(read, None, 2);
        assert_eq!(
            (ids(jobs), next.as_deref()),
            (vec!["a".into()], Some(at_30))
        );
        let read = listing(&[("e", 30), ("c", 30), ("d", 30)], 0);
        let (jobs, next) = open_page(read, next.as_deref(), 5);
        assert_eq!(
            (ids(jobs), next),
            (vec!["c".into(), "d".into(), "e".into()], None)
        );
        // The whole page one millisecond: cut by run id, the next starts at the first left.
        let read = listing(&[("b", 30), ("a", 30), ("c", 30)], 0);
        let (jobs, next) = open_page(read, None, 2);
        assert_eq!(ids(jobs), ["a", "b"]);
        assert_eq!(next.as_deref(), Some("00000000000000000030:c"));
        // Jobs of the mark's millisecond before it were the last page's.
        let mark = "00000000000000000030:c";
        let read = listing(&[("a", 30), ("c", 30), ("e", 50)], 0);
        let (jobs, next) = open_page(read, Some(mark), 5);
        assert_eq!((ids(jobs), next), (vec!["c".into(), "e".into()], None));
        // An unreadable record counts as read: the listing was full.
        let (jobs, next) = open_page(listing(&[("a", 10), ("b", 20)], 1), None, 2);
        assert_eq!(ids(jobs), ["a"]);
        assert_eq!(next.as_deref(), Some("00000000000000000020:"));
        let (jobs, next) = open_page(listing(&[], 0), Some(mark), 2);
        assert_eq!(
            (jobs.len(), next),
            (0, None),
            "past the end: round to the first"
        );
    }
}
