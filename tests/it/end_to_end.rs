//! The whole event path through real HTTP: submit → Buildkite stand-in → signed webhooks →
//! result.json through a 302 → Discord stand-in. Every scenario runs against both stores.

use crate::support::{HOOK_URL, StoreKind, TestApp, submission};
use kernelbot_dispatch::devstack::buildkite::{
    StepOutcome, StepRunner, deliver, sample_result, unix_now,
};
use kernelbot_dispatch::flow::present::summary::format_secs;
use kernelbot_dispatch::jobs::{Channel, Job, JobRecord, JobState, Target};
use kernelbot_dispatch::payload;
use reqwest::StatusCode;
use serde_json::json;
use std::time::{Duration, Instant};

/// Every Discord call must disable mentions, edits included.
fn assert_mentions_disabled(app: &TestApp) {
    for call in app.discord_calls() {
        assert_eq!(
            call.body["allowed_mentions"],
            json!({"parse": []}),
            "{call:?}"
        );
    }
}

fn final_edits(app: &TestApp) -> usize {
    app.discord_calls()
        .iter()
        .filter(|c| c.method == "PATCH" && c.status == 200)
        .filter(|c| {
            c.body["content"]
                .as_str()
                .is_some_and(|t| t.contains("✅ success") || t.contains("❌ failure"))
        })
        .count()
}

async fn happy_path_ends_with_one_edited_report(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let body = submission("happy-1");

    // The stand-in times builds on the stack's clock, which runs on in real time between
    // the moves below: each span is known to within the real time it took here.
    let submitted = Instant::now();
    let (status, answer) = app.submit(&body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["state"], "scheduled");
    assert_eq!(answer["build"]["number"], 1);

    // The build carries the contract's env and meta-data.
    let build = app.buildkite.build(1).expect("build created");
    assert_eq!(build.env["KERNELBOT_RUN_ID"], "happy-1");
    assert_eq!(build.env["KERNELBOT_QUEUE"], "h100");
    assert!(build.env.contains_key("KERNELBOT_IMAGE"));
    assert_eq!(
        payload::decode(&build.env["KERNELBOT_PAYLOAD"]).unwrap(),
        body["config"]
    );
    assert_eq!(build.meta_data["run_id"], "happy-1");
    assert_eq!(build.meta_data["queue"], "h100");

    // The first Discord message was posted with wait=true.
    let calls = app.discord_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].method, calls[0].query.as_deref()),
        ("POST", Some("wait=true"))
    );
    assert!(
        app.discord_text().contains("Queued on `h100`"),
        "{}",
        app.discord_text()
    );

    assert_eq!(app.event("build.scheduled", 1).await, StatusCode::OK);
    // Two seconds in the queue, 45.5 s on the GPU, on the clock the stand-in times builds by.
    app.advance_clock(Duration::from_secs(2));
    let started = Instant::now();
    app.buildkite.start_eval(1);
    let in_queue = submitted.elapsed().as_secs_f64();
    assert_eq!(app.event("job.started", 1).await, StatusCode::OK);
    assert_eq!(app.job("happy-1").await.state, JobState::Running);
    assert!(app.discord_text().contains("Running on `h100`"));

    app.advance_clock(Duration::from_millis(45_500));
    let finish = app.finish(1, "passed", Some(sample_result(false)));
    let (finished, on_gpu) = (finish.await, started.elapsed().as_secs_f64());
    assert_eq!(finished, StatusCode::OK);
    let job = app.job("happy-1").await;
    assert_eq!(job.state, JobState::Finished);
    let outcome = job.outcome.expect("outcome stored");
    assert_eq!(outcome.build_state, "passed");
    assert_eq!(
        outcome.result.as_ref().expect("result stored").system.gpu,
        "NVIDIA H100 80GB HBM3"
    );

    // One message, edited to the final report; the result came through the 302 without
    // our token reaching storage.
    assert_eq!(app.discord.messages().len(), 1);
    let text = app.discord_text();
    assert!(
        text.contains("✅ success") && text.contains("Passed 3/3 tests"),
        "{text}"
    );
    // Waited from the build's creation to the evaluation's start, ran until it ended, as
    // Buildkite's timestamps say.
    let (queued, ran) = app.timings_of_2_and_45_5(1, (in_queue, on_gpu));
    let shown = format!(
        "⏱ Queued for {}, ran for {}",
        format_secs(queued),
        format_secs(ran)
    );
    assert!(text.contains(&shown), "{shown} in {text}");
    assert_eq!(final_edits(&app), 1);
    assert_eq!(app.buildkite.storage_downloads(), 1);
    assert_eq!(app.buildkite.storage_auth_rejections(), 0);
    assert_mentions_disabled(&app);

    let (status, view) = app.status("happy-1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (view["state"].as_str(), view["result"]["verdict"].as_str()),
        (Some("finished"), Some("passed"))
    );
    assert_eq!(
        view["result"]["timings"],
        json!({"queued_secs": queued, "ran_secs": ran})
    );
    assert_eq!(view["build"]["number"], 1);
}

async fn a_passed_build_with_a_failing_test_reports_failure(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("fail-test")).await;
    app.finish(1, "passed", Some(sample_result(true))).await;
    let outcome = app.job("fail-test").await.outcome.unwrap();
    assert_eq!(outcome.verdict, kernelbot_dispatch::result::Verdict::Failed);
    let text = app.discord_text();
    assert!(
        text.contains("❌ failure") && text.contains("❌ Testing failed — Passed 2/3 tests"),
        "{text}"
    );
}

async fn failed_and_canceled_builds_report_why(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("crashed")).await;
    app.submit(&submission("stopped")).await;
    app.finish(1, "failed", None).await;
    app.finish(2, "canceled", None).await;
    let crashed = app.job("crashed").await.outcome.unwrap();
    let stopped = app.job("stopped").await.outcome.unwrap();
    assert_eq!(
        (crashed.build_state.as_str(), crashed.error.as_deref()),
        ("failed", Some("Build failed"))
    );
    assert_eq!(
        (stopped.build_state.as_str(), stopped.error.as_deref()),
        ("canceled", Some("Build canceled"))
    );
    let text = app.discord_text();
    assert!(
        text.contains("❌ Build failed") && text.contains("❌ Build canceled"),
        "{text}"
    );
    assert_eq!(final_edits(&app), 2);
}

async fn duplicate_build_finished_posts_to_discord_once(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("dup")).await;
    app.buildkite
        .upload(1, "result.json", sample_result(false), "finished", false);
    app.buildkite.set_state(1, "passed");
    // Three deliveries at once, then once more later: one wins, the rest change nothing.
    let (a, b, c) = tokio::join!(
        app.event("build.finished", 1),
        app.event("build.finished", 1),
        app.event("build.finished", 1)
    );
    assert_eq!([a, b, c], [StatusCode::OK; 3]);
    let calls_after = app.discord_calls().len();
    assert_eq!(app.event("build.finished", 1).await, StatusCode::OK);
    assert_eq!(final_edits(&app), 1);
    assert_eq!(app.discord_calls().len(), calls_after);
    assert_eq!(app.job("dup").await.state, JobState::Finished);
}

async fn build_running_after_finished_does_not_regress(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("late")).await;
    app.finish(1, "passed", Some(sample_result(false))).await;
    let before = app.job("late").await;
    let calls = app.discord_calls().len();
    assert_eq!(app.event("build.running", 1).await, StatusCode::OK);
    assert_eq!(app.event("build.scheduled", 1).await, StatusCode::OK);
    assert_eq!(app.job("late").await, before);
    assert_eq!(app.discord_calls().len(), calls);
}

async fn unknown_builds_and_events_get_200_and_change_nothing(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("mine")).await;
    let calls = app.discord_calls().len();
    let before = app.job("mine").await;
    // A build that is not ours (no run_id meta-data) and one whose run id we never saw.
    for build in [
        json!({"id": "x", "number": 77, "state": "passed", "meta_data": {}}),
        json!({"id": "y", "number": 78, "state": "passed", "meta_data": {"run_id": "never-submitted"}}),
    ] {
        let body = serde_json::to_vec(&json!({"event": "build.finished", "build": build})).unwrap();
        let resp = deliver(
            &app.webhook_url,
            crate::support::SECRET,
            "build.finished",
            body,
            unix_now(),
        )
        .await
        .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
    // ping and unknown events too.
    let ping = serde_json::to_vec(&json!({"event": "ping", "service": {}})).unwrap();
    let resp = deliver(
        &app.webhook_url,
        crate::support::SECRET,
        "ping",
        ping,
        unix_now(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(app.event("agent.lost", 1).await, StatusCode::OK);
    assert_eq!(app.job("mine").await, before);
    assert_eq!(app.discord_calls().len(), calls);
    assert!(
        !app.buildkite
            .api_calls()
            .iter()
            .any(|c| c.contains("/builds/77") || c.contains("/builds/78"))
    );
}

async fn bad_signatures_get_401_and_change_nothing(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("sig")).await;
    app.buildkite.set_state(1, "passed");
    let before = app.job("sig").await;
    let calls = app.discord_calls().len();
    let body = app.buildkite.webhook_body("build.finished", 1);
    let wrong = deliver(
        &app.webhook_url,
        "not-the-secret",
        "build.finished",
        body.clone(),
        unix_now(),
    )
    .await
    .unwrap();
    let stale = deliver(
        &app.webhook_url,
        crate::support::SECRET,
        "build.finished",
        body.clone(),
        unix_now() - 3600,
    )
    .await
    .unwrap();
    let unsigned = app
        .client
        .post(&app.webhook_url)
        .header("x-buildkite-event", "build.finished")
        .body(body)
        .send()
        .await
        .unwrap();
    for resp in [wrong, stale, unsigned] {
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        let err: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(err["error"], "unauthorized");
    }
    assert_eq!(app.job("sig").await, before);
    assert_eq!(app.discord_calls().len(), calls);
    // The old secret is still accepted during a rotation.
    let body = app.buildkite.webhook_body("build.running", 1);
    let resp = deliver(
        &app.webhook_url,
        "old-secret",
        "build.running",
        body,
        unix_now(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

async fn oversize_payload_gets_413_and_creates_no_build(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let mut rng = fastrand::Rng::with_seed(3);
    let noise: String = (0..250_000).map(|_| rng.alphanumeric()).collect();
    let mut body = submission("huge");
    body["config"]["sources"]["submission.py"] = json!(noise);
    let (status, err) = app.submit(&body).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{err}");
    assert_eq!(err["error"], "too_large");
    assert!(app.buildkite.builds().is_empty());
    assert_eq!(app.status("huge").await.0, StatusCode::NOT_FOUND);
    // A body over the request cap is refused too.
    let (status, _) = app
        .submit_raw(vec![b' '; 2 * 1024 * 1024], Some(crate::support::API_TOKEN))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(app.discord_calls().is_empty());
}

async fn buildkite_422_gives_502_and_a_failed_job(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.buildkite.fail_create(
        422,
        json!({"message": "Validation Failed", "errors": ["<html>branch not found in org-internal-repo</html>"]}),
    );
    let (status, err) = app.submit(&submission("refused")).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{err}");
    assert_eq!(err["error"], "buildkite_error");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("Validation Failed"),
        "{err}"
    );
    let job = app.job("refused").await;
    assert_eq!(job.state, JobState::Failed);
    assert!(job.failure.as_deref().unwrap().contains("422"));
    // Discord gets a fixed text with the status; Buildkite's own words stay in the logs.
    let text = app.discord_text();
    assert!(
        text.contains("Submission failed: Buildkite refused the build (HTTP 422)"),
        "{text}"
    );
    assert!(
        !text.contains("Validation") && !text.contains("org-internal-repo"),
        "{text}"
    );
    assert_eq!(app.status("refused").await.1["state"], "failed");
}

async fn discord_429_is_retried_after_retry_after(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.discord.rate_limit_next(2, 0.2);
    let started = std::time::Instant::now();
    let (status, _) = app.submit(&submission("limited")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let statuses: Vec<u16> = app.discord_calls().iter().map(|c| c.status).collect();
    assert_eq!(statuses, vec![429, 429, 200]);
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(400),
        "retry_after was not waited for"
    );
    assert!(
        app.job("limited")
            .await
            .discord
            .unwrap()
            .message_id
            .is_some()
    );
}

async fn a_repeated_run_id_returns_the_existing_job(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let (first, _) = app.submit(&submission("same")).await;
    let (second, answer) = app.submit(&submission("same")).await;
    assert_eq!((first, second), (StatusCode::ACCEPTED, StatusCode::OK));
    assert_eq!(answer["run_id"], "same");
    assert_eq!(answer["build"]["number"], 1);
    assert_eq!(app.buildkite.builds().len(), 1);
    assert_eq!(app.discord.messages().len(), 1);
}

async fn a_deleted_discord_webhook_is_not_used_again(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("gone")).await;
    app.discord.delete_webhook("111111111111111111");
    app.buildkite.start_eval(1);
    app.event("job.started", 1).await;
    assert_eq!(
        app.job("gone").await.discord.unwrap().delivery.status,
        kernelbot_dispatch::jobs::DeliveryStatus::Gone
    );
    let calls = app.discord_calls().len();
    app.finish(1, "passed", Some(sample_result(false))).await;
    assert_eq!(app.job("gone").await.state, JobState::Finished);
    assert_eq!(
        app.discord_calls().len(),
        calls,
        "a deleted webhook must not be called again"
    );
}

async fn buildkite_5xx_on_reads_is_retried(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("flaky")).await;
    app.buildkite.fail_reads(&[502, 503]);
    app.finish(1, "passed", Some(sample_result(false))).await;
    let job = app.job("flaky").await;
    assert_eq!(
        job.outcome.unwrap().verdict,
        kernelbot_dispatch::result::Verdict::Passed
    );
}

async fn a_slow_buildkite_create_is_confirmed_not_repeated(kind: StoreKind) {
    let app = TestApp::spawn_tuned(kind, &[], Duration::from_millis(300)).await;
    app.buildkite.slow_create(Duration::from_millis(900));
    let (status, answer) = app.submit(&submission("slow-bk")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["build"]["number"], 1);
    assert_eq!(
        app.buildkite.builds().len(),
        1,
        "a timed-out create is never repeated"
    );
    assert!(
        app.buildkite
            .api_calls()
            .iter()
            .any(|c| c.starts_with("GET") && c.ends_with("/builds"))
    );
    assert_eq!(app.job("slow-bk").await.state, JobState::Scheduled);
}

async fn a_slow_discord_never_blocks_the_job(kind: StoreKind) {
    // A timeout a loaded machine's answers stay well within, and a Discord far slower.
    let app = TestApp::spawn_tuned(kind, &[], Duration::from_secs(2)).await;
    app.discord.set_delay(Some(Duration::from_secs(10)));
    let (status, _) = app.submit(&submission("slow-dc")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert!(app.job("slow-dc").await.owes(Channel::Discord));
    // Discord recovers: the final report is still delivered, as a message of its own.
    app.discord.set_delay(None);
    assert_eq!(
        app.finish(1, "passed", Some(sample_result(false))).await,
        StatusCode::OK
    );
    let job = app.job("slow-dc").await;
    assert_eq!(job.state, JobState::Finished);
    assert!(job.discord.unwrap().message_id.is_some());
    assert!(
        app.discord_text().contains("✅ success"),
        "{}",
        app.discord_text()
    );
}

async fn huge_reports_are_fitted_to_discord_limits(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("wordy")).await;
    let mut result: serde_json::Value = serde_json::from_slice(&sample_result(false)).unwrap();
    let run = &mut result["runs"]["test"]["run"]["result"];
    run["benchmark-count"] = json!("100");
    for i in 0..100 {
        run[format!("benchmark.{i}.spec")] = json!(format!("@everyone {}", "n=4096; ".repeat(20)));
        run[format!("benchmark.{i}.mean")] = json!("123456.7");
        run[format!("benchmark.{i}.err")] = json!("12.5");
    }
    result["system"]["gpu"] = json!("G".repeat(3000));
    app.finish(1, "passed", Some(serde_json::to_vec(&result).unwrap()))
        .await;
    let last = app.discord_calls().pop().unwrap();
    assert_eq!(
        (last.method, last.status),
        ("PATCH", 200),
        "{:?}",
        last.body
    );
    let description = last.body["embeds"][0]["description"].as_str().unwrap();
    assert!(description.ends_with('…'), "{description}");
}

async fn the_latest_retried_jobs_result_is_the_one_reported(kind: StoreKind) {
    // The agent was lost mid-run and Buildkite retried the job: the build has two jobs, each
    // with a result.json. The latest job's is the one that counts.
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("retried")).await;
    app.buildkite
        .upload(1, "result.json", sample_result(true), "finished", false);
    app.buildkite
        .upload(1, "result.json", b"{partial".to_vec(), "error", true);
    app.buildkite
        .upload(1, "result.json", sample_result(false), "finished", false);
    app.finish(1, "passed", None).await;
    let outcome = app.job("retried").await.outcome.unwrap();
    assert_eq!(outcome.verdict, kernelbot_dispatch::result::Verdict::Passed);
    assert!(
        app.discord_text().contains("Passed 3/3 tests"),
        "{}",
        app.discord_text()
    );
}

async fn webhooks_that_race_the_create_answer_are_kept(kind: StoreKind) {
    // Buildkite's webhooks for a new build can arrive before its create call has answered:
    // the job is already recorded, so they move it forward, and submit's first message shows
    // the state they reached.
    // The create answers 5 s late (the webhooks before the step have that long, however
    // slow the machine), well within the clients' timeout; the step ends once submit has
    // answered, so the order is the scenario's, not the machine's.
    let app = TestApp::spawn_tuned(kind, &[], Duration::from_secs(30)).await;
    app.buildkite.slow_create(Duration::from_secs(5));
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let wait = std::sync::Mutex::new(wait);
    let step: StepRunner = std::sync::Arc::new(move |_| {
        let wait = wait.lock().unwrap_or_else(|p| p.into_inner());
        // Released by the test (or at once, should it have ended).
        let _ = wait.recv_timeout(Duration::from_secs(60));
        StepOutcome::passed(sample_result(false))
    });
    app.buildkite
        .autorun(&app.webhook_url, crate::support::SECRET, step);

    let (status, answer) = app.submit(&submission("racy")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["state"], "running", "the webhooks got there first");
    assert!(
        app.discord_text().contains("Running on `h100`"),
        "{}",
        app.discord_text()
    );
    go.send(()).expect("the step waits");

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    // Finished, and its report delivered (the state is written before Discord is told).
    loop {
        let job = app.job("racy").await;
        if job.state == JobState::Finished && !job.owes(Channel::Discord) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "job never finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(app.discord.messages().len(), 1, "still one message per job");
    assert!(
        app.discord_text().contains("✅ success"),
        "{}",
        app.discord_text()
    );
    assert_eq!(final_edits(&app), 1);
}

/// A submission that names no Discord target reports to the deployment's default webhook,
/// whose token stays in the deployment's secret: no job record holds it, while the report
/// still reaches that webhook.
async fn the_default_webhooks_token_is_never_stored(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("DISCORD_WEBHOOK_URL", HOOK_URL)]).await;
    let mut body = submission("defaulted");
    body.as_object_mut().unwrap().remove("discord");
    let (status, answer) = app.submit(&body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let token = HOOK_URL.rsplit('/').next().unwrap();
    let stored = |job: &Job| serde_json::to_string(&JobRecord::from_job(job, "w")).unwrap();
    let job = app.job("defaulted").await;
    assert!(!stored(&job).contains(token), "{}", stored(&job));
    assert_eq!(job.discord.unwrap().target, Some(Target::Default));
    app.finish(1, "passed", Some(sample_result(false))).await;
    let calls = app.discord_calls();
    assert_eq!(
        calls
            .iter()
            .map(|c| (c.method, c.status))
            .collect::<Vec<_>>(),
        [("POST", 200), ("PATCH", 200)]
    );
    assert!(calls.iter().all(|c| c.webhook_id == "111111111111111111"));
    assert!(
        app.discord_text().contains("✅ success"),
        "{}",
        app.discord_text()
    );
    let job = app.job("defaulted").await;
    assert!(!stored(&job).contains(token), "{}", stored(&job));
}

on_both_stores!(
    happy_path_ends_with_one_edited_report,
    a_passed_build_with_a_failing_test_reports_failure,
    failed_and_canceled_builds_report_why,
    duplicate_build_finished_posts_to_discord_once,
    build_running_after_finished_does_not_regress,
    unknown_builds_and_events_get_200_and_change_nothing,
    bad_signatures_get_401_and_change_nothing,
    oversize_payload_gets_413_and_creates_no_build,
    buildkite_422_gives_502_and_a_failed_job,
    discord_429_is_retried_after_retry_after,
    a_repeated_run_id_returns_the_existing_job,
    a_deleted_discord_webhook_is_not_used_again,
    a_slow_buildkite_create_is_confirmed_not_repeated,
    a_slow_discord_never_blocks_the_job,
    huge_reports_are_fitted_to_discord_limits,
    the_latest_retried_jobs_result_is_the_one_reported,
    webhooks_that_race_the_create_answer_are_kept,
    the_default_webhooks_token_is_never_stored,
    buildkite_5xx_on_reads_is_retried,
);

/// On `build.finished` the build is read back and its artifacts listed side by side, so the
/// report reaches Discord a round trip sooner (with a Buildkite that takes 300 ms to answer).
#[tokio::test]
async fn a_finished_build_is_read_and_its_artifacts_listed_side_by_side() {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    app.submit(&submission("side-by-side")).await;
    app.buildkite.set_delay(Some(Duration::from_millis(300)));
    assert_eq!(
        app.finish(1, "passed", Some(sample_result(false))).await,
        StatusCode::OK
    );
    let spans = app.buildkite.call_spans();
    let span = |suffix: &str| {
        spans
            .iter()
            .rfind(|(call, _, _)| call.starts_with("GET ") && call.ends_with(suffix))
            .map(|(_, arrived, answered)| (*arrived, *answered))
            .unwrap_or_else(|| panic!("no call to {suffix}: {spans:?}"))
    };
    let (build, artifacts) = (span("/builds/1"), span("/builds/1/artifacts"));
    assert!(
        build.0 < artifacts.1 && artifacts.0 < build.1,
        "the two calls overlap: {build:?} {artifacts:?}"
    );
    assert_eq!(app.job("side-by-side").await.state, JobState::Finished);
}
