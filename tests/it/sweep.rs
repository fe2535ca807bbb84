//! The sweep: jobs whose webhooks never came are finished from Buildkite's own view.

use std::time::Duration;

use crate::support::{StoreKind, TestApp, submission};
use kernelbot_dispatch::devstack::buildkite::sample_result;
use kernelbot_dispatch::flow::sweep::SweepReport;
use kernelbot_dispatch::jobs::{BuildRef, Creation, Job, JobState};
use kernelbot_dispatch::result::Verdict;
use kernelbot_dispatch::time::now_millis;

/// The sweep checks every open job, whatever its age.
const ANY_AGE: &[(&str, &str)] = &[("SWEEP_MIN_AGE_SECS", "0")];

async fn a_job_whose_webhook_never_came_is_finished(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, ANY_AGE).await;
    app.submit(&submission("lost")).await;
    app.buildkite
        .upload(1, "result.json", sample_result(false), "finished", false);
    app.buildkite.set_state(1, "passed");

    let report = app.sweep().await;
    assert_eq!(
        report,
        SweepReport {
            checked: 1,
            finished: 1,
            // Live builds, ended builds, the artifact list, the download.
            buildkite_calls: 4,
            ..Default::default()
        }
    );
    let job = app.job("lost").await;
    assert_eq!(job.state, JobState::Finished);
    assert_eq!(job.outcome.unwrap().verdict, Verdict::Passed);
    assert!(
        app.discord_text().contains("✅ success"),
        "{}",
        app.discord_text()
    );

    // A second pass finds nothing left to do, and a late webhook changes nothing.
    assert_eq!(app.sweep().await.checked, 0);
    let calls = app.discord_calls().len();
    app.event("build.finished", 1).await;
    assert_eq!(app.discord_calls().len(), calls);
}

async fn young_jobs_are_left_alone(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("young")).await;
    app.buildkite.set_state(1, "passed");
    let report = app.sweep().await;
    assert_eq!(report.checked, 0);
    assert_eq!(app.job("young").await.state, JobState::Scheduled);
}

async fn running_builds_are_followed_and_buildless_jobs_fail(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, ANY_AGE).await;
    app.submit(&submission("busy")).await;
    app.buildkite.start_eval(1);
    // A job whose build was deleted in Buildkite.
    let mut vanished = Job::new(
        "vanished".parse().unwrap(),
        "H100_BK".into(),
        "h100".into(),
        None,
        None,
        now_millis() - 2,
    );
    vanished.build = Some(BuildRef {
        id: "gone".into(),
        number: 99,
        web_url: "https://buildkite.com/o/p/builds/99".into(),
    });
    app.store.create(&vanished).await.unwrap();
    // A job recorded by a submit that stopped before creating its build.
    let orphan = Job::new(
        "orphan".parse().unwrap(),
        "H100_BK".into(),
        "h100".into(),
        None,
        None,
        now_millis() - 1,
    );
    app.store.create(&orphan).await.unwrap();

    let report = app.sweep().await;
    assert_eq!(
        report,
        SweepReport {
            checked: 2,
            advanced: 1,
            failed: 1,
            finished: 1,
            // The orphan's lookup, live builds, ended builds, the vanished build's GET.
            buildkite_calls: 4,
            ..Default::default()
        }
    );
    let vanished = app.job("vanished").await.outcome.unwrap();
    assert_eq!(
        vanished.error.as_deref(),
        Some("the build no longer exists in Buildkite")
    );
    assert_eq!(app.job("busy").await.state, JobState::Running);
    let orphan = app.job("orphan").await;
    assert_eq!(orphan.state, JobState::Failed);
    assert!(orphan.failure.unwrap().contains("no Buildkite build"));

    let again = app.sweep().await;
    assert_eq!(
        again,
        SweepReport {
            checked: 1,
            unchanged: 1,
            buildkite_calls: 1,
            ..Default::default()
        }
    );
}

async fn one_unreachable_build_does_not_stop_the_pass(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, ANY_AGE).await;
    app.submit(&submission("first")).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    app.submit(&submission("second")).await;
    app.buildkite.set_state(1, "passed");
    app.buildkite.set_state(2, "canceled");
    // Every read of the oldest job's build (its artifacts) fails, every retry.
    app.buildkite.fail_build_reads(1, &[500, 500, 500, 500]);
    let report = app.sweep().await;
    assert_eq!(
        (report.checked, report.finished, report.errors),
        (2, 1, 1),
        "{report}"
    );
    assert_eq!(app.job("first").await.state, JobState::Scheduled);
    assert_eq!(
        app.job("second").await.outcome.unwrap().build_state,
        "canceled"
    );
}

/// A job no webhook finished is reached behind more open jobs than one pass lists: a
/// thousand older ones waiting their turn take one pass's page, the next pass goes on.
async fn a_lost_finish_behind_a_page_of_waiting_jobs_is_reached(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, ANY_AGE).await;
    let now = app.clock.now();
    let waiting = kernelbot_dispatch::flow::sweep::SWEEP_BATCH;
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..waiting {
        let mut job = Job::new(
            format!("waiting-{i:04}").parse().expect("a run id"),
            "H100_BK".into(),
            "h100".into(),
            None,
            None,
            now - 10_000 + i as i64,
        );
        (job.user, job.waiting) = (Some("heavy".into()), true);
        job.creation = Some(Creation {
            payload: "a held submission".into(),
            after: now,
            look_up_first: false,
        });
        let store = app.store.clone();
        writes.spawn(async move { store.create(&job).await.expect("written") });
        if writes.len() == 32 {
            writes.join_next().await;
        }
    }
    writes.join_all().await;
    app.submit(&submission("lost")).await;
    let lost = app.job("lost").await.build.expect("a build").number;
    app.buildkite
        .upload(lost, "result.json", sample_result(false), "finished", false);
    app.buildkite.set_state(lost, "passed");
    let mut passes = 0;
    while app.job("lost").await.state != JobState::Finished && passes < 3 {
        app.sweep().await;
        passes += 1;
    }
    assert_eq!(app.job("lost").await.state, JobState::Finished);
    assert_eq!(
        passes, 2,
        "the first pass's page is the thousand older jobs"
    );
}

on_both_stores!(
    a_lost_finish_behind_a_page_of_waiting_jobs_is_reached,
    a_job_whose_webhook_never_came_is_finished,
    young_jobs_are_left_alone,
    running_builds_are_followed_and_buildless_jobs_fail,
    one_unreachable_build_does_not_stop_the_pass,
);
