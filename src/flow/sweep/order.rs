//! A pass's order: jobs by creation time (then run id), and the bookmarks that let the
//! next pass go on where one stopped.

use crate::jobs::Listed;
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
}
