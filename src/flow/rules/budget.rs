//! A user's daily GPU budget (`USER_GPU_SECONDS_PER_DAY`): what a run's end adds to its
//! user's use, how much of the last 24 hours' use counts now, and when enough of it frees
//! for a submission past the budget to be taken.

use serde::{Deserialize, Serialize};

use crate::jobs::Job;
use crate::result::Verdict;
use crate::time::{Millis, millis_in, secs_of};

/// The rolling window a budget covers.
pub(crate) const WINDOW_MS: Millis = 24 * 3600 * 1000;
/// The most runs a user's record keeps (the oldest merge into the next): its size stays
/// bounded whatever the user sends.
pub(crate) const MAX_RUNS: usize = 2_000;

/// One run's use of a GPU: which run, when it ended and for how long its evaluation ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Use {
    #[serde(default)]
    pub(crate) run: String,
    pub(crate) at: Millis,
    pub(crate) secs: f64,
}

/// What `job`, just ended, used of its user's budget: its evaluation's run time, from
/// Buildkite's job times. An infrastructure failure (the node, not the submission) and an
/// answer from an earlier run count nothing, nor does a job of no user.
pub(crate) fn used_by(job: &Job) -> Option<f64> {
    job.user.as_ref()?;
    if job.cached_from.is_some() {
        return None;
    }
    let outcome = job.outcome.as_deref()?;
    if outcome.verdict == Verdict::Infra {
        return None;
    }
    let secs = outcome.timings?.ran_secs?;
    (secs.is_finite() && secs > 0.0).then_some(secs)
}

/// `runs` with `added` noted at its time (once: a run noted already is not counted again),
/// those out of the window at `now` dropped, and the oldest merged into their successor past
/// [`MAX_RUNS`].
pub(crate) fn noted(mut runs: Vec<Use>, added: Use, now: Millis) -> Vec<Use> {
    if !runs.iter().any(|u| u.run == added.run) {
        runs.push(added);
    }
    runs.retain(|u| now.saturating_sub(u.at) < WINDOW_MS);
    runs.sort_by_key(|u| u.at);
    while runs.len() > MAX_RUNS {
        let oldest = runs.remove(0);
        let merged = millis(runs[0].secs).saturating_add(millis(oldest.secs));
        runs[0].secs = secs_of(merged);
    }
    runs
}

/// A run's seconds in whole milliseconds: use is summed in them, so that runs which add up
/// to the limit reach it (as floats, 1414.435 + 202.177 + 183.388 is 1799.9999999999998).
/// A corrupt record's NaN or negative counts nothing.
fn millis(secs: f64) -> Millis {
    millis_in(secs).max(0)
}

/// The milliseconds used within the window at `now`.
fn used_ms(runs: &[Use], now: Millis) -> Millis {
    runs.iter()
        .filter(|u| now.saturating_sub(u.at) < WINDOW_MS)
        .map(|u| millis(u.secs))
        .fold(0, Millis::saturating_add)
}

/// The seconds used within the window at `now`.
pub(crate) fn used(runs: &[Use], now: Millis) -> f64 {
    secs_of(used_ms(runs, now))
}

/// How long until use falls below `limit` seconds (`None`: it is below now), in whole seconds
/// rounded up: the oldest runs leave the window first.
pub(crate) fn frees_in(runs: &[Use], now: Millis, limit: u64) -> Option<u64> {
    let mut left = used_ms(runs, now);
    let limit = Millis::try_from(limit)
        .unwrap_or(Millis::MAX)
        .saturating_mul(1000);
    if left < limit {
        return None;
    }
    let mut in_window: Vec<&Use> = runs
        .iter()
        .filter(|u| now.saturating_sub(u.at) < WINDOW_MS)
        .collect();
    in_window.sort_by_key(|u| u.at);
    for u in in_window {
        left = left.saturating_sub(millis(u.secs));
        if left < limit {
            let ms = u.at.saturating_add(WINDOW_MS).saturating_sub(now).max(0);
            return Some(u64::try_from(ms).unwrap_or(0).div_ceil(1000).max(1));
        }
    }
    Some(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::{JobState, UserId};
    use crate::result::{Outcome, Timings};
    use std::sync::Arc;

    const H: Millis = 3600 * 1000;

    fn ended(verdict: Verdict, ran: Option<f64>) -> Job {
        let mut job = Job::new(
            "r".parse().unwrap(),
            "H100_BK".into(),
            "h100".into(),
            None,
            None,
            0,
        );
        job.state = JobState::Finished;
        job.user = Some(UserId::new("ada"));
        let mut outcome = Outcome::decided("passed", verdict, "x");
        outcome.timings = Some(Timings {
            queued_secs: Some(5.0),
            ran_secs: ran,
        });
        job.outcome = Some(Arc::new(outcome));
        job
    }

    #[test]
    fn a_run_counts_its_evaluation_time_unless_the_node_failed_or_it_did_not_run() {
        for (verdict, ran, counts) in [
            (Verdict::Passed, Some(42.5), Some(42.5)),
            (Verdict::Failed, Some(3.0), Some(3.0)),
            (Verdict::Throttled, Some(90.0), Some(90.0)),
            (Verdict::Canceled, Some(7.0), Some(7.0)),
            (Verdict::Infra, Some(60.0), None),
            (Verdict::QueueTimeout, None, None),
            (Verdict::Passed, Some(f64::NAN), None),
        ] {
            assert_eq!(used_by(&ended(verdict, ran)), counts, "{verdict:?}");
        }
        let mut answered = ended(Verdict::Passed, Some(42.5));
        answered.cached_from = Some("first".parse().unwrap());
        assert_eq!(used_by(&answered), None, "an answer from an earlier run");
        let mut nobody = ended(Verdict::Passed, Some(42.5));
        nobody.user = None;
        assert_eq!(used_by(&nobody), None);
    }

    fn u(run: &str, at: Millis, secs: f64) -> Use {
        Use {
            run: run.into(),
            at,
            secs,
        }
    }

    #[test]
    fn use_rolls_off_after_a_day_and_frees_when_the_oldest_leave() {
        let now = 30 * H;
        let runs = vec![
            u("r0", 5 * H, 500.0), // 25 h ago: out of the window
            u("r1", 10 * H, 300.0),
            u("r2", 20 * H, 200.0),
            u("r3", 29 * H, 100.0),
        ];
        assert_eq!(used(&runs, now), 600.0);
        assert_eq!(frees_in(&runs, now, 601), None, "under the budget");
        // At 600 of 600: the run at 10 h leaves at 34 h, 4 h from now.
        assert_eq!(frees_in(&runs, now, 600), Some(4 * 3600));
        // At 600 of 250: both the 10 h and the 20 h runs must leave (44 h).
        assert_eq!(frees_in(&runs, now, 250), Some(14 * 3600));
    }

    #[test]
    fn runs_that_add_up_to_the_limit_reach_it() {
        let now = 30 * H;
        // Evaluation times as Buildkite's millisecond stamps give them; as floats they sum
        // to a hair under 1,800.
        let runs = vec![
            u("r1", 10 * H, 1414.435),
            u("r2", 20 * H, 202.177),
            u("r3", 29 * H, 183.388),
        ];
        assert_eq!(used(&runs, now), 1800.0);
        // At 1,800 of 1,800: the run at 10 h leaves at 34 h, 4 h from now.
        assert_eq!(frees_in(&runs, now, 1800), Some(4 * 3600));
        assert_eq!(frees_in(&runs, now, 1801), None);
    }

    #[test]
    fn a_record_keeps_the_window_a_bounded_size_and_each_run_once() {
        let now = 30 * H;
        let kept = noted(vec![u("old", 5 * H, 1.0)], u("new", now, 2.0), now);
        assert_eq!(kept, vec![u("new", now, 2.0)]);
        let again = noted(kept.clone(), u("new", now + 5, 2.0), now + 5);
        assert_eq!(
            again, kept,
            "a run noted twice (a retried write) counts once"
        );
        let many: Vec<Use> = (0..MAX_RUNS as Millis)
            .map(|i| u(&format!("r{i}"), now - i, 1.0))
            .collect();
        let kept = noted(many, u("last", now, 1.0), now);
        assert_eq!(kept.len(), MAX_RUNS);
        assert_eq!(used(&kept, now), (MAX_RUNS + 1) as f64, "merged, not lost");
    }
}
