//! The fault suite: each everyday failure of Buildkite, Discord or the network, injected
//! through the stand-ins' documented wire formats, and what the user then sees: the Discord
//! message's final text, the job's state, the builds and calls made. Every scenario runs on
//! both stores.

use std::time::Duration;

use crate::support::{SECRET, StoreKind, TestApp, submission};
use kernelbot_dispatch::devstack::buildkite::{deliver, sample_result, unix_now};
use kernelbot_dispatch::flow::{DispatchError, deliver, sweep};
use kernelbot_dispatch::jobs::{
    Channel, DeliveryStatus, Job, JobState, Lease, RunId, Transition, Updated, View, update,
};
use kernelbot_dispatch::result::Verdict;
use kernelbot_dispatch::retry::Deadline;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Discord calls that Discord accepted and that show a final report.
fn final_reports(app: &TestApp) -> usize {
    app.discord_calls()
        .iter()
        .filter(|c| c.status == 200)
        .filter(|c| {
            c.body["content"]
                .as_str()
                .is_some_and(|t| t.contains("✅ success") || t.contains("❌ failure"))
        })
        .count()
}

fn delivery(view: &Value) -> &str {
    view["delivery"]["discord"]["status"].as_str().unwrap_or("")
}

/// Discord answers 5xx on every try while `build.finished` is handled: the job is finished,
/// its report pending, and the next sweep (or `sweep --run-id`) delivers it, once.
async fn discord_5xx_while_finishing_is_delivered_by_the_sweep(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("dc-down")).await;
    app.discord.fail_next(&[500, 502, 503, 500]);
    assert_eq!(
        app.finish(1, "passed", Some(sample_result(false))).await,
        StatusCode::OK
    );
    let job = app.job("dc-down").await;
    assert_eq!(job.state, JobState::Finished);
    assert!(
        !app.discord_text().contains("✅ success"),
        "{}",
        app.discord_text()
    );
    let (_, view) = app.status("dc-down").await;
    assert_eq!(delivery(&view), "pending", "{view}");
    assert_eq!(view["delivery"]["discord"]["attempts"], 1);

    let run_id: RunId = "dc-down".parse().unwrap();
    let report = sweep::sweep_run(
        &app.sweeper,
        &run_id,
        Deadline::after(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    assert_eq!(report.reports_sent, 1, "{report}");
    assert!(
        app.discord_text().contains("✅ success"),
        "{}",
        app.discord_text()
    );
    let (_, view) = app.status("dc-down").await;
    assert_eq!(delivery(&view), "delivered", "{view}");

    let calls = app.discord_calls().len();
    let again = app.sweep().await;
    assert_eq!((again.reports_sent, again.reports_pending), (0, 0));
    let pending: Vec<f64> = app
        .metric("ReportsPending")
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(pending.last(), Some(&0.0));
    assert_eq!(app.discord_calls().len(), calls, "nothing is sent twice");
    assert_eq!(final_reports(&app), 1);
    // The webhook token is not kept once nothing more will be sent.
    assert!(app.job("dc-down").await.discord.unwrap().target.is_none());
}

/// A `running` edit held back by a 429 while the build finishes: the message still ends on
/// the final report.
async fn a_running_edit_held_back_by_429_never_replaces_the_final_report(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("held")).await;
    app.discord.rate_limit_next(1, 1.0);
    app.buildkite.start_eval(1);
    let body = app.buildkite.webhook_body("job.started", 1);
    let url = app.webhook_url.clone();
    let running = tokio::spawn(async move {
        deliver(&url, SECRET, "job.started", body, unix_now())
            .await
            .map(|r| r.status())
    });
    // The running render is now waiting out its 429.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        app.finish(1, "passed", Some(sample_result(false))).await,
        StatusCode::OK
    );
    assert_eq!(running.await.unwrap().unwrap(), StatusCode::OK);
    assert!(
        app.discord_calls().iter().any(|c| c.status == 429),
        "the running render was held back"
    );

    let accepted: Vec<String> = app
        .discord_calls()
        .iter()
        .filter(|c| c.status == 200)
        .map(|c| c.body["content"].as_str().unwrap_or("").to_owned())
        .collect();
    let last = accepted.last().expect("some call was accepted");
    assert!(last.contains("✅ success"), "last accepted render: {last}");
    assert!(
        app.discord_text().contains("✅ success"),
        "{}",
        app.discord_text()
    );
    assert_eq!(app.discord.messages().len(), 1);
    let outbox = app.job("held").await.discord.unwrap();
    assert_eq!(outbox.delivery.status, DeliveryStatus::Delivered);
}

/// A state an event writes while another sender holds the job's message costs the event no
/// second read of the job: its own write shows the message held, and the holder sends the
/// new state next (here the holder is a stand-in that never comes back: the sweep's, once
/// its lease ends).
async fn a_message_another_sender_holds_costs_an_event_no_second_read(kind: StoreKind) {
    let (app, counted) = TestApp::spawn_counted(kind, &[]).await;
    let (status, answer) = app.submit(&submission("held-by")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let id: RunId = "held-by".parse().unwrap();
    let until = app.clock.now() + 600_000;
    let hold = |j: &Job| {
        let mut next = j.clone();
        let lease = Lease {
            owner: "another-sender".into(),
            until,
        };
        next.discord.as_mut()?.delivery.lease = Some(lease);
        Some(next)
    };
    let held = update(app.store.as_ref(), &id, hold).await.unwrap();
    assert!(matches!(held, Updated::Written(_)), "{held:?}");
    let (before, posts) = (counted.reads_of("held-by"), app.discord_calls().len());

    app.buildkite.start_eval(1);
    assert_eq!(app.event("job.started", 1).await, StatusCode::OK);
    let reads = counted.reads_of("held-by") - before;
    assert_eq!(reads, 1, "the event read the job once");
    let job = app.job("held-by").await;
    assert_eq!(job.state, JobState::Running);
    assert!(job.owes(Channel::Discord), "owed, for the holder to send");
    let outbox = job.discord.expect("a Discord outbox");
    assert_eq!(
        outbox.delivery.lease.map(|l| l.owner).as_deref(),
        Some("another-sender")
    );
    assert_eq!(
        app.discord_calls().len(),
        posts,
        "nothing sent past the holder"
    );

    app.advance_clock(Duration::from_secs(601));
    app.sweep().await;
    let job = app.job("held-by").await;
    assert!(!job.owes(Channel::Discord), "sent once the lease ended");
    assert!(
        app.discord_text().contains("🏃 Running"),
        "{}",
        app.discord_text()
    );
}

/// Discord posts the status message, then its answer is lost (a 500): the message may
/// exist, so the call does not post it again; the sweep takes it from there.
async fn a_post_whose_answer_was_lost_is_not_posted_again_in_the_same_call(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.discord.lose_post_answers(1);
    let (status, answer) = app.submit(&submission("lost-post")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let posts = app
        .discord_calls()
        .iter()
        .filter(|c| c.method == "POST")
        .count();
    assert_eq!(posts, 1, "one post in the call");
    assert_eq!(app.discord.messages().len(), 1);
    let job = app.job("lost-post").await;
    assert!(job.owes(Channel::Discord), "still owed, for the sweep");
    let error = job.discord.unwrap().delivery.last_error.unwrap_or_default();
    assert!(error.contains("may have posted"), "{error}");
}

/// Discord rate-limits a render again and again: the tries stop while there is still time
/// to record what they did, so a function stopped at its deadline loses nothing.
async fn every_try_leaves_time_to_record_what_it_did(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("reserved")).await;
    // The job moves on without Discord being told (written straight to the store).
    let id: RunId = "reserved".parse().unwrap();
    let running = Transition::to(JobState::Running, app.clock.now());
    update(app.store.as_ref(), &id, |j| j.apply(&running))
        .await
        .unwrap();
    app.discord.rate_limit_next(10, 3.5);
    let deadline = Deadline::after(Duration::from_millis(7_600));
    let job = app.job("reserved").await;
    deliver::deliver(&app.sweeper, (&job, View::Own), deadline)
        .await
        .unwrap();
    let left = deadline.remaining();
    assert!(left >= Duration::from_secs(2), "{left:?} left to record");
    let outbox = app.job("reserved").await.discord.unwrap();
    assert_eq!(outbox.delivery.attempts, 1, "the failure was recorded");
}

/// A moderator deleted the status message: the final report is posted as a new message.
async fn a_deleted_status_message_gets_the_final_report_in_a_new_one(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("deleted")).await;
    let first = app
        .job("deleted")
        .await
        .discord
        .unwrap()
        .message_id
        .unwrap();
    app.discord.delete_message(&first);
    app.finish(1, "passed", Some(sample_result(false))).await;

    let outbox = app.job("deleted").await.discord.unwrap();
    assert_eq!(outbox.delivery.status, DeliveryStatus::Delivered);
    let second = outbox.message_id.unwrap();
    assert_ne!(second, first);
    let messages = app.discord.messages();
    assert_eq!(messages.len(), 1);
    assert!(
        messages[&second]["content"]
            .as_str()
            .unwrap()
            .contains("✅ success")
    );
    let edits_of_deleted = app
        .discord_calls()
        .iter()
        .filter(|c| c.message_id.as_deref() == Some(&first) && c.status == 404)
        .count();
    assert_eq!(edits_of_deleted, 1, "the deleted message is tried once");
}

/// `test-count: 1000000000000` is reported at once, not counted to.
async fn an_absurd_test_count_is_reported_at_once(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("count")).await;
    let mut result: Value = serde_json::from_slice(&sample_result(false)).unwrap();
    result["runs"]["test"]["run"]["result"]["test-count"] = json!("1000000000000");
    let finished = tokio::time::timeout(
        Duration::from_secs(30),
        app.finish(1, "passed", Some(serde_json::to_vec(&result).unwrap())),
    )
    .await
    .expect("rendering is bounded");
    assert_eq!(finished, StatusCode::OK);
    let text = app.discord_text();
    assert!(text.contains("Passed 3/1000000000000 tests"), "{text}");
    assert_eq!(app.job("count").await.state, JobState::Finished);
}

fn noise(len: usize, seed: u64) -> String {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.alphanumeric()).collect()
}

/// An incompressible ~2 MB `result.json`: stored (slimmed to fit an item), reported, and
/// never downloaded again.
async fn an_incompressible_2mb_result_is_stored_reported_and_read_once(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("verbose")).await;
    let mut result: Value = serde_json::from_slice(&sample_result(false)).unwrap();
    let entries = &mut result["runs"]["test"]["run"]["result"];
    for i in 0..3 {
        entries[format!("test.{i}.message")] = json!(noise(700_000, i));
    }
    result["runs"]["test"]["run"]["stdout"] = json!(noise(100_000, 9));
    let bytes = serde_json::to_vec(&result).unwrap();
    assert!(bytes.len() > 2_000_000);
    assert_eq!(app.finish(1, "passed", Some(bytes)).await, StatusCode::OK);

    let job = app.job("verbose").await;
    assert_eq!(job.state, JobState::Finished);
    assert_eq!(job.outcome.unwrap().verdict, Verdict::Passed);
    assert!(
        app.discord_text().contains("✅ success"),
        "{}",
        app.discord_text()
    );
    let (status, view) = app.status("verbose").await;
    assert_eq!(
        (status, view["verdict"].as_str()),
        (StatusCode::OK, Some("passed"))
    );
    app.sweep().await;
    assert_eq!(app.buildkite.storage_downloads(), 1);
}

/// Storage refuses the download with its own error document: the report says which status,
/// and nothing of the document reaches Discord.
async fn a_storage_error_body_never_reaches_discord(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("expired-link")).await;
    app.buildkite.fail_storage(
        403,
        "<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message>Request has expired</Message><RequestId>9F2B7C</RequestId><HostId>internal-bucket-host</HostId></Error>",
    );
    assert_eq!(
        app.finish(1, "passed", Some(sample_result(false))).await,
        StatusCode::OK
    );
    let job = app.job("expired-link").await;
    assert_eq!(job.state, JobState::Finished);
    assert_eq!(job.outcome.as_ref().unwrap().verdict, Verdict::Error);
    let text = app.discord_text();
    assert!(
        text.contains(
            "result.json could not be downloaded: artifact storage refused the download (HTTP 403)"
        ),
        "{text}"
    );
    for leaked in [
        "AccessDenied",
        "expired",
        "9F2B7C",
        "internal-bucket-host",
        "<Error",
    ] {
        assert!(!text.contains(leaked), "{leaked:?} reached Discord: {text}");
    }

    // Buildkite's own error page on the download: its status, not its HTML.
    app.submit(&submission("error-page")).await;
    app.buildkite.fail_download_page(
        410,
        "<html><body><h1>Gone</h1><p>artifact purged by retention policy at edge-node-7</p></body></html>",
    );
    assert_eq!(
        app.finish(2, "passed", Some(sample_result(false))).await,
        StatusCode::OK
    );
    let text = app.discord_text();
    assert!(
        text.contains(
            "result.json could not be downloaded: Buildkite refused the request (HTTP 410)"
        ),
        "{text}"
    );
    for leaked in ["<html", "Gone", "retention", "edge-node-7"] {
        assert!(!text.contains(leaked), "{leaked:?} reached Discord: {text}");
    }
}

/// A `private` run: every Discord message is its verdict line and build link, with no number
/// and unit anywhere; the status API still holds the whole result.
async fn a_private_run_shows_only_its_verdict_in_discord(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let mut body = submission("private-1");
    body["config"]["mode"] = json!("private");
    assert_eq!(app.submit(&body).await.0, StatusCode::ACCEPTED);
    assert!(app.job("private-1").await.private, "stored with the job");
    app.buildkite.start_eval(1);
    app.event("job.started", 1).await;
    assert_eq!(
        app.finish(1, "passed", Some(sample_result(false))).await,
        StatusCode::OK
    );
    let messages = app.discord.messages();
    assert_eq!(messages.len(), 1);
    let message = messages.values().next().unwrap();
    let content = message["content"].as_str().unwrap();
    assert!(
        content.contains("✅ Passed: every run succeeded."),
        "{content}"
    );
    assert!(content.contains("Build [#1]"), "{content}");
    assert!(
        message["embeds"].as_array().is_none_or(|e| e.is_empty()),
        "{message}"
    );
    let text = app.discord_text();
    for unit in ["⏱", " ms", " µs", " ns", " s ", "Passed 3/3"] {
        assert!(!text.contains(unit), "{unit:?} shown: {text}");
    }
    let (_, view) = app.status("private-1").await;
    assert!(view["result"]["result"]["runs"].is_object(), "{view}");
}

/// A run that did not pass: its final message carries kernelbot's full report as
/// `report.txt`, with each failing test's message; a private one carries none, and no timing.
async fn a_failing_run_attaches_the_full_report(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    assert_eq!(
        app.submit(&submission("report-1")).await.0,
        StatusCode::ACCEPTED
    );
    let mut private = submission("report-private");
    private["config"]["mode"] = json!("private");
    assert_eq!(app.submit(&private).await.0, StatusCode::ACCEPTED);
    for number in [1, 2] {
        app.buildkite.start_eval(number);
        app.event("job.started", number).await;
        app.finish(number, "passed", Some(sample_result(true)))
            .await;
    }
    let messages: Vec<serde_json::Value> = app.discord.messages().into_values().collect();
    assert_eq!(messages.len(), 2);
    let shown = |m: &serde_json::Value| format!("{}{}", m["content"], m["embeds"]);
    let is_public = |m: &&serde_json::Value| shown(m).contains("Passed 2/3");
    let public = messages
        .iter()
        .find(is_public)
        .expect("the public run's message");
    let attachments = public["attachments"].as_array().expect("attachments");
    assert_eq!(attachments.len(), 1, "{public}");
    assert_eq!(attachments[0]["filename"], "report.txt");
    let report = attachments[0]["content"].as_str().unwrap_or_default();
    assert!(report.contains("test 2: fail  size: 16384"), "{report}");
    assert!(
        report.contains("  error: mismatch at index 7: 0.5 != 0.25"),
        "each failing test's message: {report}"
    );
    assert!(report.contains("test 0: pass  size: 1024"), "{report}");
    // The message itself stays the short report.
    assert!(!shown(public).contains("mismatch"), "{public}");

    let private = messages
        .iter()
        .find(|m| !is_public(m))
        .expect("the private run's message");
    assert!(
        private["attachments"]
            .as_array()
            .is_none_or(|a| a.is_empty()),
        "{private}"
    );
    let text = shown(private);
    for unit in ["⏱", " s ", "Passed 2/3", "mismatch"] {
        assert!(!text.contains(unit), "{unit:?} shown: {text}");
    }
}

/// A signed `build.running` replayed with the header `build.finished`: refused, nothing moves.
async fn an_event_header_that_disagrees_with_the_signed_body_is_refused(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("forged")).await;
    app.buildkite.start_eval(1);
    app.event("job.started", 1).await;
    let before = app.job("forged").await;
    let reads = app.buildkite.api_calls().len();
    let body = app.buildkite.webhook_body("build.running", 1);
    let resp = deliver(&app.webhook_url, SECRET, "build.finished", body, unix_now())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"], "event_mismatch");
    assert_eq!(app.job("forged").await, before);
    assert_eq!(app.buildkite.api_calls().len(), reads);
}

/// Buildkite answers 429 to the create call: the submission is accepted and deferred, and
/// the first sweep after the reset creates exactly one build.
async fn a_rate_limited_create_is_deferred_and_created_once(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.buildkite.fail_creates(&[(429, false)], 30);
    let (status, answer) = app.submit(&submission("later")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(
        (answer["state"].as_str(), &answer["build"]),
        (Some("submitted"), &Value::Null)
    );
    assert!(
        app.discord_text().contains("Submitting"),
        "{}",
        app.discord_text()
    );

    app.sweep().await;
    assert_eq!(app.buildkite.builds().len(), 0, "not before the reset");
    app.advance_clock(Duration::from_secs(31));
    let report = app.sweep().await;
    assert_eq!(report.created, 1, "{report}");
    assert_eq!(app.buildkite.builds().len(), 1);
    let job = app.job("later").await;
    assert_eq!(job.state, JobState::Scheduled);
    assert!(
        job.creation.is_none(),
        "the payload is not kept once the build exists"
    );
    assert!(
        app.discord_text().contains("Queued on `h100`"),
        "{}",
        app.discord_text()
    );
    app.advance_clock(Duration::from_secs(120));
    app.sweep().await;
    assert_eq!(app.buildkite.builds().len(), 1, "never two builds");
}

/// A create whose answer is lost (5xx) is looked up, never repeated blindly: found at once
/// when Buildkite did create it, else created once by a sweep a minute later.
async fn unconfirmed_creates_are_looked_up_never_built_twice(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.buildkite.fail_creates(&[(502, true)], 30);
    let (status, answer) = app.submit(&submission("made")).await;
    assert_eq!(
        (status, answer["build"]["number"].as_u64()),
        (StatusCode::ACCEPTED, Some(1))
    );

    app.buildkite.fail_creates(&[(503, false)], 30);
    let (status, answer) = app.submit(&submission("lost")).await;
    assert_eq!(
        (status, &answer["build"]),
        (StatusCode::ACCEPTED, &Value::Null)
    );
    assert_eq!(app.buildkite.builds().len(), 1);
    app.sweep().await;
    assert_eq!(
        app.buildkite.builds().len(),
        1,
        "not before a minute has passed"
    );
    app.advance_clock(Duration::from_secs(61));
    app.sweep().await;
    app.advance_clock(Duration::from_secs(120));
    app.sweep().await;
    let builds = app.buildkite.builds();
    assert_eq!(builds.len(), 2, "one build per run");
    assert_eq!(builds[1].meta_data["run_id"], "lost");
    assert_eq!(app.job("lost").await.state, JobState::Scheduled);
}

/// The pipeline was renamed (every call 404): the sweep changes nothing and fails the pass.
async fn a_renamed_pipeline_changes_nothing_and_fails_the_pass(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("SWEEP_MIN_AGE_SECS", "0")]).await;
    app.submit(&submission("a")).await;
    app.submit(&submission("b")).await;
    let calls = app.discord_calls().len();
    app.buildkite.rename_pipeline("renamed");
    let err = sweep::sweep(&app.sweeper, Deadline::after(Duration::from_secs(30)))
        .await
        .unwrap_err();
    assert!(matches!(err, DispatchError::Pipeline(_)), "{err}");
    assert!(err.to_string().contains("BUILDKITE_PIPELINE"), "{err}");
    let failed = app.metric("SweepFailed");
    assert_eq!(
        failed.last().map(|(_, v)| *v),
        Some(1.0),
        "the alarm's metric"
    );
    for id in ["a", "b"] {
        assert_eq!(app.job(id).await.state, JobState::Scheduled);
    }
    assert_eq!(app.discord_calls().len(), calls, "no reports sent");
}

/// A report Discord refuses for a whole day is given up, shown so, and not tried again.
async fn a_report_refused_for_a_day_is_given_up(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("never")).await;
    app.discord.fail_next(&[503; 4]);
    app.finish(1, "passed", Some(sample_result(false))).await;
    app.advance_clock(Duration::from_secs(25 * 3600));
    app.discord.fail_next(&[503; 4]);
    let report = app.sweep().await;
    assert_eq!(report.reports_pending, 0, "{report}");
    let (_, view) = app.status("never").await;
    assert_eq!(delivery(&view), "given_up", "{view}");
    let given_up = app.metric("ReportsGivenUp");
    assert_eq!(
        given_up.last().map(|(_, v)| *v),
        Some(1.0),
        "given up and counted"
    );
    // Counted once where it happened, for the alarm that sums every function's.
    let counted = app.metric("DeliveriesGivenUp");
    assert_eq!(counted.len(), 1, "{counted:?}");
    assert_eq!(
        (
            &counted[0].0["Function"],
            &counted[0].0["Channel"],
            counted[0].1
        ),
        (&json!("sweep"), &json!("discord"), 1.0)
    );
    let calls = app.discord_calls().len();
    app.sweep().await;
    assert_eq!(app.discord_calls().len(), calls);
}

/// A final report Discord refuses for good is given up by the webhook function at once,
/// and counted there: no sweep pass sees it.
async fn a_report_refused_for_good_in_the_webhook_reaches_the_alarm(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("refused")).await;
    app.discord.fail_next(&[400]);
    app.finish(1, "passed", Some(sample_result(false))).await;
    let (_, view) = app.status("refused").await;
    assert_eq!(delivery(&view), "given_up", "{view}");
    let counted = app.metric("DeliveriesGivenUp");
    assert_eq!(counted.len(), 1, "{counted:?}");
    assert_eq!(
        (&counted[0].0["Function"], &counted[0].0["Channel"]),
        (&json!("webhook"), &json!("discord"))
    );
}

/// A GPU that failed its pre-flight (the runner's `infra` report, exit 75, every retry spent)
/// ends the job as an infrastructure failure: verdict `infra`, and a report that says it was
/// not the submission's code.
async fn a_gpu_that_failed_its_preflight_is_not_the_user_s_failure(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("bad-gpu")).await;
    let result = json!({"success": false, "error": "not your code", "runs": {},
        "infra": {"stage": "preflight", "reason": "ecc",
            "detail": "GPU 0 has 3 uncorrected ECC errors", "readings": [], "processes": []}});
    app.finish(1, "failed", Some(result.to_string().into_bytes()))
        .await;
    let (_, view) = app.status("bad-gpu").await;
    assert_eq!(view["verdict"], "infra", "{view}");
    let text = app.discord_text();
    assert!(text.contains("not your code"), "{text}");
    assert!(text.contains("3 uncorrected ECC errors"), "{text}");
}

/// A create in doubt past the queue timeout is looked up before the job is given up: the
/// build Buildkite did make is kept, not abandoned on a GPU.
async fn a_create_in_doubt_past_the_queue_timeout_is_looked_up_not_failed(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.buildkite.fail_creates(&[(502, true)], 30);
    // The immediate lookup fails too: submit cannot tell whether the build exists.
    app.buildkite.fail_reads(&[500, 500, 500, 500]);
    let (status, answer) = app.submit(&submission("doubt")).await;
    assert_eq!(
        (status, &answer["build"]),
        (StatusCode::ACCEPTED, &Value::Null)
    );
    app.advance_clock(Duration::from_secs(901));
    app.sweep().await;
    let job = app.job("doubt").await;
    assert_eq!(job.state, JobState::Scheduled, "{:?}", job.failure);
    assert_eq!(job.build.unwrap().number, 1);
    assert_eq!(app.buildkite.builds().len(), 1);
}

/// A deferred create that Buildkite then refuses for the pipeline's sake (403: a token
/// without `write_builds`) fails the pass and no job.
async fn a_misconfigured_deferred_create_fails_the_pass_not_the_job(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.buildkite.fail_creates(&[(429, false)], 30);
    app.submit(&submission("waiting")).await;
    app.buildkite.fail_create(
        403,
        json!({"message": "Forbidden: missing scope write_builds"}),
    );
    app.advance_clock(Duration::from_secs(31));
    let err = sweep::sweep(&app.sweeper, Deadline::after(Duration::from_secs(30)))
        .await
        .unwrap_err();
    assert!(matches!(err, DispatchError::Pipeline(_)), "{err}");
    assert_eq!(app.job("waiting").await.state, JobState::Submitted);
}

/// A build no agent picks up: canceled once the queue deadline passes, reported as such,
/// and Buildkite's own `build.finished` for it changes nothing.
async fn a_build_nobody_picks_up_is_canceled_at_its_queue_deadline(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("idle")).await;
    let mut quick = submission("quick");
    quick["max_queue_secs"] = json!(60);
    app.submit(&quick).await;
    app.advance_clock(Duration::from_secs(61));
    app.sweep().await;
    assert_eq!(
        app.buildkite.build(2).unwrap().state,
        "canceled",
        "its own deadline"
    );
    assert_eq!(app.buildkite.build(1).unwrap().state, "scheduled");
    app.advance_clock(Duration::from_secs(840));
    app.sweep().await;

    assert_eq!(app.buildkite.build(1).unwrap().state, "canceled");
    let job = app.job("idle").await;
    assert_eq!(job.state, JobState::Finished);
    assert_eq!(job.outcome.unwrap().verdict, Verdict::QueueTimeout);
    let text = app.discord_text();
    assert!(
        text.contains("Timed out in the queue: no agent on queue `h100` started it in time"),
        "{text}"
    );
    let calls = app.discord_calls().len();
    assert_eq!(app.event("build.finished", 1).await, StatusCode::OK);
    assert_eq!(app.discord_calls().len(), calls);
    assert_eq!(
        app.job("idle").await.outcome.unwrap().verdict,
        Verdict::QueueTimeout
    );
}

/// A job still running past the maximum age: its build is canceled, the job expires.
async fn a_job_past_its_maximum_age_is_canceled_and_expires(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("forever")).await;
    app.buildkite.start_eval(1);
    app.event("job.started", 1).await;
    app.advance_clock(Duration::from_secs(6 * 3600));
    app.sweep().await;
    assert_eq!(app.buildkite.build(1).unwrap().state, "canceled");
    let job = app.job("forever").await;
    assert_eq!(job.outcome.unwrap().verdict, Verdict::Expired);
    assert!(
        app.discord_text().contains("Expired"),
        "{}",
        app.discord_text()
    );
}

/// `POST /submissions/{run_id}/cancel`: the build is canceled and the job ends as canceled;
/// a repeat is accepted, an unknown run is 404, a finished one 409; a job without a build
/// ends at once and never gets one.
async fn cancel_stops_the_build_and_ends_the_job(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("stop")).await;
    let (status, answer) = app.cancel("stop").await;
    assert_eq!(
        (status, answer["state"].as_str()),
        (StatusCode::ACCEPTED, Some("scheduled"))
    );
    assert_eq!(app.buildkite.build(1).unwrap().state, "canceled");
    assert_eq!(app.cancel("stop").await.0, StatusCode::ACCEPTED, "a repeat");
    app.event("build.finished", 1).await;
    let job = app.job("stop").await;
    assert_eq!(job.outcome.unwrap().verdict, Verdict::Canceled);
    assert!(
        app.discord_text()
            .contains("Canceled: the build was canceled"),
        "{}",
        app.discord_text()
    );

    assert_eq!(app.cancel("nobody").await.0, StatusCode::NOT_FOUND);
    app.submit(&submission("done")).await;
    app.finish(2, "passed", Some(sample_result(false))).await;
    let (status, err) = app.cancel("done").await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::CONFLICT, Some("already_finished"))
    );

    app.buildkite.fail_creates(&[(429, false)], 30);
    app.submit(&submission("unbuilt")).await;
    let (status, answer) = app.cancel("unbuilt").await;
    assert_eq!(
        (status, answer["state"].as_str()),
        (StatusCode::ACCEPTED, Some("finished"))
    );
    app.advance_clock(Duration::from_secs(31));
    app.sweep().await;
    assert_eq!(
        app.buildkite.builds().len(),
        2,
        "no build for a canceled job"
    );
    assert_eq!(
        app.job("unbuilt").await.outcome.unwrap().verdict,
        Verdict::Canceled
    );
}

/// A busy competition: 300 open jobs whose builds run cost a few listings, not a GET each;
/// once they end, each pass stays within `SWEEP_MAX_CALLS` and the next goes on where it
/// stopped until every job is finished and reported. Passes are given all the time they
/// want: what bounds them here is the call budget, not a loaded machine's speed.
async fn a_busy_competition_costs_the_sweep_a_bounded_number_of_calls(kind: StoreKind) {
    let vars = [("SWEEP_MIN_AGE_SECS", "0"), ("SWEEP_PASS_SECS", "600")];
    let app = TestApp::spawn_with(kind, &vars).await;
    let jobs = 300;
    for i in 0..jobs {
        app.submit(&submission(&format!("busy-{i}"))).await;
        app.buildkite.start_eval(i + 1);
    }
    let report = app.sweep().await;
    assert_eq!(report.advanced, 300, "{report}");
    assert!(report.buildkite_calls <= 12, "{report}");

    for n in 1..=jobs {
        app.buildkite
            .upload(n, "result.json", sample_result(false), "finished", false);
        app.buildkite.set_state(n, "passed");
    }
    let mut passes = 0;
    loop {
        let report = app.sweep().await;
        passes += 1;
        assert!(report.buildkite_calls <= 40, "{report}");
        if report.finished == 0 {
            break;
        }
        assert!(passes < 25, "the sweep does not get through: {report}");
    }
    for i in 0..jobs {
        let job = app.job(&format!("busy-{i}")).await;
        assert_eq!(job.state, JobState::Finished);
        assert!(!job.owes(Channel::Discord));
    }
    assert_eq!(final_reports(&app), jobs as usize);
}

/// A pass stops calling Buildkite before the organisation's or token's last requests.
async fn the_sweep_stops_before_buildkites_rate_limit(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("SWEEP_MIN_AGE_SECS", "0")]).await;
    for i in 0..3 {
        app.submit(&submission(&format!("rl-{i}"))).await;
        app.buildkite.upload(
            i + 1,
            "result.json",
            sample_result(false),
            "finished",
            false,
        );
        app.buildkite.set_state(i + 1, "passed");
    }
    app.buildkite.rate_limit_remaining(11);
    let report = app.sweep().await;
    // 11, 10 and 9 requests left: the third answer says stop.
    assert_eq!(report.buildkite_calls, 3, "{report}");
    assert!(report.budget_spent);
    // The quota left, as the dashboard shows it.
    let left = app.metric("BuildkiteRateLimitRemaining");
    assert_eq!(left.last().map(|(_, n)| *n), Some(9.0), "{left:?}");
    assert_eq!(app.job("rl-2").await.state, JobState::Scheduled);
}

/// A report pending for over 15 minutes and a webhook answering 5xx both show in the
/// metrics the alarms watch.
async fn pending_reports_and_webhook_errors_reach_the_alarms_metrics(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("watched")).await;
    // Buildkite cannot be read when the build finishes (the build and its artifacts are read
    // side by side, each tried four times): the webhook answers 503.
    app.buildkite.fail_reads(&[500; 8]);
    assert_eq!(
        app.finish(1, "passed", Some(sample_result(false))).await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let errors: Vec<(Value, f64)> = app.metric("WebhookRequests");
    assert!(
        errors
            .iter()
            .any(|(m, v)| m["Outcome"] == "error" && m["Function"] == "webhook" && *v == 1.0),
        "{errors:?}"
    );
    // Discord down while the sweep finishes it (each of the pass's two sends fails every
    // try), then 20 minutes later still down.
    app.discord.fail_next(&[503; 8]);
    app.advance_clock(Duration::from_secs(601));
    app.sweep().await;
    app.advance_clock(Duration::from_secs(1200));
    app.discord.fail_next(&[503; 8]);
    let report = app.sweep().await;
    assert!(report.oldest_pending_secs >= 1200, "{report}");
    let oldest = app.metric("OldestPendingReportAge");
    assert!(oldest.last().is_some_and(|(m, v)| *v > 900.0
        && m["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "KernelbotDispatch"));
}

on_both_stores!(
    discord_5xx_while_finishing_is_delivered_by_the_sweep,
    a_running_edit_held_back_by_429_never_replaces_the_final_report,
    a_message_another_sender_holds_costs_an_event_no_second_read,
    a_deleted_status_message_gets_the_final_report_in_a_new_one,
    a_post_whose_answer_was_lost_is_not_posted_again_in_the_same_call,
    every_try_leaves_time_to_record_what_it_did,
    an_absurd_test_count_is_reported_at_once,
    an_incompressible_2mb_result_is_stored_reported_and_read_once,
    a_failing_run_attaches_the_full_report,
    a_private_run_shows_only_its_verdict_in_discord,
    a_storage_error_body_never_reaches_discord,
    an_event_header_that_disagrees_with_the_signed_body_is_refused,
    a_rate_limited_create_is_deferred_and_created_once,
    unconfirmed_creates_are_looked_up_never_built_twice,
    a_renamed_pipeline_changes_nothing_and_fails_the_pass,
    a_create_in_doubt_past_the_queue_timeout_is_looked_up_not_failed,
    a_misconfigured_deferred_create_fails_the_pass_not_the_job,
    a_build_nobody_picks_up_is_canceled_at_its_queue_deadline,
    a_job_past_its_maximum_age_is_canceled_and_expires,
    cancel_stops_the_build_and_ends_the_job,
    a_busy_competition_costs_the_sweep_a_bounded_number_of_calls,
    the_sweep_stops_before_buildkites_rate_limit,
    pending_reports_and_webhook_errors_reach_the_alarms_metrics,
    a_report_refused_for_a_day_is_given_up,
    a_gpu_that_failed_its_preflight_is_not_the_user_s_failure,
    a_report_refused_for_good_in_the_webhook_reaches_the_alarm,
);

mod review {
    //! Cases found by reading the code as an attacker and a flaky network would.
    use super::*;
    use kernelbot_dispatch::jobs::{BuildRef, Job};

    /// A pass whose call budget runs out mid-way defers its creates; it fails no job.
    async fn a_spent_budget_defers_creates_and_fails_no_job(kind: StoreKind) {
        // Three calls: a lookup and a create for the first job, a lookup for the second.
        let app = TestApp::spawn_with(kind, &[("SWEEP_MAX_CALLS", "3")]).await;
        app.buildkite.fail_creates(&[(429, false)], 30);
        for i in 0..3 {
            app.submit(&submission(&format!("later-{i}"))).await;
        }
        // The first create met the 429; the window it told held the others, never sent.
        let creates = app
            .buildkite
            .api_calls()
            .iter()
            .filter(|c| c.starts_with("POST") && c.ends_with("/builds"))
            .count();
        assert_eq!(creates, 1, "{:?}", app.buildkite.api_calls());
        app.advance_clock(Duration::from_secs(31));
        for _ in 0..6 {
            let report = app.sweep().await;
            assert!(report.buildkite_calls <= 3, "{report}");
        }
        for i in 0..3 {
            let job = app.job(&format!("later-{i}")).await;
            assert_eq!(
                job.state,
                JobState::Scheduled,
                "later-{i}: {:?}",
                job.failure
            );
        }
        assert_eq!(app.buildkite.builds().len(), 3);
    }

    /// A second build of one run (made outside our create call) is canceled on its first
    /// event; the job keeps its own build.
    async fn a_second_build_of_a_run_is_canceled(kind: StoreKind) {
        let app = TestApp::spawn(kind).await;
        app.submit(&submission("twice")).await;
        let resp = app
            .client
            .post(format!(
                "{}/organizations/{}/pipelines/{}/builds",
                app.buildkite.api_url, app.buildkite.org, app.buildkite.pipeline
            ))
            .bearer_auth(crate::support::BK_TOKEN)
            .json(&json!({"commit": "HEAD", "branch": "main", "meta_data": {"run_id": "twice"}}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED);
        assert_eq!(app.event("build.scheduled", 2).await, StatusCode::OK);
        assert_eq!(app.buildkite.build(2).unwrap().state, "canceled");
        assert_eq!(app.job("twice").await.build.unwrap().number, 1);
        assert_eq!(app.buildkite.build(1).unwrap().state, "scheduled");
    }

    /// Build numbers start again when a pipeline is recreated: a job never takes another
    /// build that has its build's number.
    async fn a_reused_build_number_is_never_taken_for_the_jobs_build(kind: StoreKind) {
        let app = TestApp::spawn_with(kind, &[("SWEEP_MIN_AGE_SECS", "0")]).await;
        let mut old = Job::new(
            "old-pipeline".parse().unwrap(),
            "H100_BK".into(),
            "h100".into(),
            None,
            None,
            app.clock.now(),
        );
        old.state = JobState::Scheduled;
        old.build = Some(BuildRef {
            id: "from-the-old-pipeline".into(),
            number: 1,
            web_url: String::new(),
        });
        app.store.create(&old).await.unwrap();
        app.submit(&submission("new")).await;
        app.finish(1, "passed", Some(sample_result(true))).await;
        app.sweep().await;
        let job = app.job("old-pipeline").await;
        assert_eq!(job.state, JobState::Scheduled, "{:?}", job.outcome);
        // Its own deadlines still end it, and the build that has its number is not touched.
        app.buildkite.set_state(1, "running");
        app.advance_clock(Duration::from_secs(21_601));
        app.sweep().await;
        let job = app.job("old-pipeline").await;
        assert_eq!(job.state, JobState::Finished);
        assert_eq!(job.build.unwrap().id, "from-the-old-pipeline");
        assert_eq!(job.outcome.unwrap().verdict, Verdict::Expired);
        assert_eq!(
            app.buildkite.build(1).unwrap().state,
            "running",
            "not canceled"
        );
    }

    /// A signed event of another pipeline (the notification service set to every pipeline)
    /// that names one of our run ids changes nothing: our build under its number is not
    /// canceled, a job without a build does not adopt it. It is answered 200 and counted.
    async fn an_event_of_another_pipeline_changes_nothing(kind: StoreKind) {
        let app = TestApp::spawn(kind).await;
        app.submit(&submission("ours")).await;
        app.buildkite.fail_creates(&[(429, false)], 30);
        app.submit(&submission("waiting")).await;
        for run_id in ["ours", "waiting"] {
            let mut body: Value =
                serde_json::from_slice(&app.buildkite.webhook_body("build.scheduled", 1)).unwrap();
            body["pipeline"]["slug"] = json!("staging-kernelbot");
            body["build"]["id"] = json!(format!("foreign-{run_id}"));
            body["build"]["meta_data"]["run_id"] = json!(run_id);
            let answer = deliver(
                &app.webhook_url,
                SECRET,
                "build.scheduled",
                serde_json::to_vec(&body).unwrap(),
                unix_now(),
            )
            .await
            .unwrap();
            assert_eq!(answer.status(), StatusCode::OK);
        }
        assert_eq!(
            app.buildkite.build(1).unwrap().state,
            "scheduled",
            "not canceled"
        );
        let ours = app.job("ours").await;
        assert_eq!(ours.build.unwrap().number, 1);
        let waiting = app.job("waiting").await;
        assert_eq!((waiting.state, waiting.build), (JobState::Submitted, None));
        let counted = app.metric("WebhookRequests");
        let foreign = counted
            .iter()
            .filter(|(m, _)| m["Outcome"] == "foreign")
            .count();
        assert_eq!(foreign, 2, "{counted:?}");
    }

    on_both_stores!(
        a_spent_budget_defers_creates_and_fails_no_job,
        a_second_build_of_a_run_is_canceled,
        a_reused_build_number_is_never_taken_for_the_jobs_build,
        an_event_of_another_pipeline_changes_nothing,
    );
}
