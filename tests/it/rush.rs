//! A small rush against Buildkite's REST limit, enforced by the stand-in as Buildkite does
//! (calls a minute per token, `RateLimit-*` headers, 429 past it): the creates and the
//! finishes that do not fit are deferred to later webhooks and sweep passes, and nothing is
//! lost or built twice.

use std::collections::BTreeSet;
use std::time::Duration;

use kernelbot_dispatch::devstack::buildkite::sample_result;
use kernelbot_dispatch::jobs::{Channel, JobState};
use kernelbot_dispatch::result::Verdict;
use reqwest::StatusCode;

use crate::support::{StoreKind, TestApp, submission};

/// Buildkite allows a token this many calls a minute here (50 in production): the rush
/// below needs about 50.
const CALLS_A_MINUTE: u32 = 20;

async fn twelve_runs_of_three_users_fit_a_small_limit_and_none_is_lost(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("SWEEP_MIN_AGE_SECS", "0")]).await;
    app.buildkite.enforce_rate_limit(CALLS_A_MINUTE);
    let runs: Vec<String> = (0..12).map(|i| format!("rush-{i}")).collect();
    for (i, run_id) in runs.iter().enumerate() {
        let mut body = submission(run_id);
        body["user"] = ["ann", "ben", "cy"][i % 3].into();
        let (status, answer) = app.submit(&body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    }
    // Builds end as fast as they are made; each minute, a sweep pass picks up what the
    // limit deferred.
    for _ in 0..40 {
        for number in 1..=app.buildkite.builds().len() as u64 {
            let b = app.buildkite.build(number).unwrap();
            if b.state != "passed" {
                app.buildkite.start_eval(number);
                app.finish(number, "passed", Some(sample_result(false)))
                    .await;
            }
        }
        let mut done = true;
        for run_id in &runs {
            let job = app.job(run_id).await;
            done &= job.state.is_terminal() && !job.owes(Channel::Discord);
        }
        if done {
            break;
        }
        app.advance_clock(Duration::from_secs(61));
        app.sweep().await;
    }
    let mut built = BTreeSet::new();
    for b in app.buildkite.builds() {
        assert!(
            built.insert(b.meta_data["run_id"].clone()),
            "{} built twice",
            b.meta_data["run_id"]
        );
    }
    assert_eq!(built.len(), runs.len(), "every run got its build");
    for run_id in &runs {
        let job = app.job(run_id).await;
        assert_eq!(job.state, JobState::Finished, "{run_id}: {job:?}");
        assert_eq!(
            job.outcome.as_ref().map(|o| o.verdict),
            Some(Verdict::Passed),
            "{run_id}"
        );
        assert!(!job.owes(Channel::Discord), "{run_id}: its report went out");
    }
    assert!(
        app.buildkite.rate_limited_calls() > 0,
        "the rush met the limit (else it shows nothing)"
    );
}

on_both_stores!(twelve_runs_of_three_users_fit_a_small_limit_and_none_is_lost);
