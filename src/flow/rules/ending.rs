//! When a job ends without its build's word: a deadline passed, a user canceled it, or its
//! result's reads never came back.

use crate::jobs::{Job, JobState, Timeline, Transition};
use crate::result::{Outcome, Verdict};
use crate::time::Millis;

/// A deadline an open job has passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Overdue {
    /// Its evaluation did not start in time after its build was created.
    QueueTimeout,
    /// It is older than the deployment's maximum job age.
    Expired,
}

/// Which deadline, if any, `job` has passed at `now`. `queue_timeout_ms` applies unless the
/// submission set its own.
pub(crate) fn overdue(
    job: Timeline,
    now: Millis,
    queue_timeout_ms: Millis,
    max_age_ms: Millis,
) -> Option<Overdue> {
    if job.state.is_terminal() {
        return None;
    }
    if now - job.created_at >= max_age_ms {
        return Some(Overdue::Expired);
    }
    let limit = job
        .max_queue_secs
        .map_or(queue_timeout_ms, |s| s as Millis * 1000);
    let waiting_since = job.scheduled_at?;
    (job.state == JobState::Scheduled && now - waiting_since >= limit)
        .then_some(Overdue::QueueTimeout)
}

/// Reads of its ended build's result a job gets. One that never comes back (its function
/// crashed or ran out of time on it) is tried again by the next webhook or pass, but not
/// for ever: the job then ends without it.
pub(crate) const MAX_FINISH_ATTEMPTS: u32 = 3;

/// `job` with one more read of its result counted, written before the read begins; `None`
/// when it has ended, or its reads are spent (it then ends as [`unread_outcome`] says).
pub(crate) fn count_attempt(job: &Job) -> Option<Job> {
    if job.state.is_terminal() || job.finish_attempts >= MAX_FINISH_ATTEMPTS {
        return None;
    }
    let mut next = job.clone();
    next.finish_attempts += 1;
    Some(next)
}

/// `job` with a counted read given back: it failed in a way to try again (Buildkite
/// unreachable, the pass's budget spent), which says nothing about the result itself.
pub(crate) fn give_back_attempt(job: &Job) -> Option<Job> {
    if job.state.is_terminal() || job.finish_attempts == 0 {
        return None;
    }
    let mut next = job.clone();
    next.finish_attempts -= 1;
    Some(next)
}

/// How a job ends whose reads of its result are spent.
pub(crate) fn unread_outcome(build_state: &str) -> Outcome {
    Outcome::decided(build_state, Verdict::Error, "its result could not be read")
}

/// What asking to cancel `job` does to it: `None` when it has ended (or was already asked).
pub(crate) fn request_cancel(job: &Job, now: Millis) -> Option<Job> {
    if job.state.is_terminal() || job.cancel_requested {
        return None;
    }
    let mut next = job.clone();
    next.cancel_requested = true;
    next.updated_at = now;
    if job.build.is_none() {
        // No build to wait for: it ends here (a build created later is canceled on sight).
        let outcome = Outcome::decided(
            "not_created",
            Verdict::Canceled,
            "canceled before its build was created",
        );
        return next.apply(&Transition::to(JobState::Finished, now).with_outcome(outcome));
    }
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{build, job};
    use super::*;

    #[test]
    fn deadlines_run_from_creation_and_from_the_build() {
        let mut j = job(JobState::Scheduled);
        j.scheduled_at = Some(1_000);
        assert_eq!(overdue(j.timeline(), 900_999, 900_000, 21_600_000), None);
        assert_eq!(
            overdue(j.timeline(), 901_000, 900_000, 21_600_000),
            Some(Overdue::QueueTimeout)
        );
        j.max_queue_secs = Some(3600);
        assert_eq!(
            overdue(j.timeline(), 901_000, 900_000, 21_600_000),
            None,
            "its own deadline"
        );
        let running = Job {
            state: JobState::Running,
            ..j.clone()
        };
        assert_eq!(
            overdue(running.timeline(), 3_700_000, 900_000, 21_600_000),
            None,
            "it started"
        );
        assert_eq!(
            overdue(running.timeline(), 21_600_000, 900_000, 21_600_000),
            Some(Overdue::Expired)
        );
        let done = Job {
            state: JobState::Finished,
            ..j
        };
        assert_eq!(overdue(done.timeline(), i64::MAX, 0, 0), None);
    }

    #[test]
    fn a_cancel_ends_a_buildless_job_at_once_and_marks_one_with_a_build() {
        let buildless = request_cancel(&job(JobState::Submitted), 5).unwrap();
        assert_eq!(buildless.state, JobState::Finished);
        assert_eq!(buildless.outcome.unwrap().verdict, Verdict::Canceled);
        let mut scheduled = job(JobState::Scheduled);
        scheduled.build = Some(build());
        let asked = request_cancel(&scheduled, 5).unwrap();
        assert_eq!(
            (asked.state, asked.cancel_requested),
            (JobState::Scheduled, true)
        );
        assert_eq!(request_cancel(&asked, 6), None, "asked once");
        assert_eq!(request_cancel(&job(JobState::Finished), 6), None);
    }

    #[test]
    fn a_result_is_read_a_bounded_number_of_times() {
        // (state, reads counted so far, counted after one more begins; None: none begins)
        for (state, counted, next) in [
            (JobState::Running, 0, Some(1)),
            (JobState::Running, 2, Some(3)),
            (JobState::Running, 3, None),
            (JobState::Scheduled, 7, None),
            (JobState::Finished, 0, None),
        ] {
            let mut j = job(state);
            j.finish_attempts = counted;
            let after = count_attempt(&j).map(|j| j.finish_attempts);
            assert_eq!(after, next, "{state:?}, {counted}");
        }
        // (state, reads counted, counted once one is given back)
        for (state, counted, next) in [
            (JobState::Running, 2, Some(1)),
            (JobState::Running, 0, None),
            (JobState::Failed, 2, None),
        ] {
            let mut j = job(state);
            j.finish_attempts = counted;
            let after = give_back_attempt(&j).map(|j| j.finish_attempts);
            assert_eq!(after, next, "{state:?}, {counted}");
        }
        let spent = unread_outcome("passed");
        assert_eq!(spent.verdict, Verdict::Error);
        assert_eq!(spent.error.as_deref(), Some("its result could not be read"));
    }

    #[test]
    fn a_submission_fails_only_before_its_build_exists() {
        let mut scheduled = job(JobState::Scheduled);
        scheduled.build = Some(build());
        assert_eq!(scheduled.apply(&Transition::to(JobState::Failed, 1)), None);
        assert!(
            job(JobState::Submitted)
                .apply(&Transition::to(JobState::Failed, 1))
                .is_some()
        );
    }
}
