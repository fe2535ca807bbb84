//! Signed completion callbacks (`CALLBACK_URL`), end to end through real HTTP: one per
//! state change, signed per Standard Webhooks (checked with the Python `standardwebhooks`
//! package, an implementation independent of ours), redelivered by the sweep with the same
//! `webhook-id` and body until accepted, stopped by a 410, never sent twice once accepted.
//! Every scenario runs against both stores.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{StoreKind, TestApp, submission};
use base64::Engine as _;
use kernelbot_dispatch::devstack::buildkite::sample_result;
use kernelbot_dispatch::devstack::receiver::Received;
use kernelbot_dispatch::jobs::Channel;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The spec's example secret, and a second one for rotations.
const KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const NEW_KEY: &str = "whsec_bmV3LWNhbGxiYWNrLWtleS1mb3Itcm90YXRpb24=";

/// Whether the Python `standardwebhooks` package accepts each callback under `secret`.
fn python_verifies(secret: &str, received: &[Received]) -> Vec<bool> {
    const SCRIPT: &str = r#"
import base64, json, sys
from standardwebhooks import Webhook
out = []
for c in json.load(sys.stdin):
    try:
        Webhook(c["secret"]).verify(base64.b64decode(c["body"]), {
            "webhook-id": c["id"], "webhook-timestamp": c["ts"], "webhook-signature": c["sig"]})
        out.append(True)
    except Exception:
        out.append(False)
print(json.dumps(out))
"#;
    let input: Vec<Value> = received
        .iter()
        .map(|r| {
            json!({"secret": secret, "id": r.id, "ts": r.timestamp, "sig": r.signature,
                   "body": base64::engine::general_purpose::STANDARD.encode(&r.body)})
        })
        .collect();
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input_json(&input).as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("python3 ends");
    assert!(
        out.status.success(),
        "standardwebhooks is needed (scripts/test.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a list of booleans")
}

fn input_json(v: &[Value]) -> String {
    serde_json::to_string(v).expect("json")
}

fn ids(received: &[Received]) -> Vec<String> {
    received.iter().map(|r| r.id.clone()).collect()
}

async fn app_with(kind: StoreKind, secret: &str) -> TestApp {
    TestApp::spawn_with(kind, &[("CALLBACK_SECRET", secret)]).await
}

/// Submits `run_id` and runs its build to the evaluation's start, 2 s after its creation on
/// the stack's clock: the real time that took too (the stand-in's clock runs on with it) and
/// when the evaluation started.
async fn run_to_running(app: &TestApp, run_id: &str) -> (f64, Instant) {
    let submitted = Instant::now();
    let (status, answer) = app.submit(&submission(run_id)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    app.advance_clock(Duration::from_secs(2));
    let started = Instant::now();
    app.buildkite.start_eval(1);
    let in_queue = submitted.elapsed().as_secs_f64();
    assert_eq!(app.event("job.started", 1).await, StatusCode::OK);
    (in_queue, started)
}

async fn every_state_is_called_back_once_and_signed(kind: StoreKind) {
    let app = app_with(kind, KEY).await;
    let (in_queue, started) = run_to_running(&app, "cb-1").await;
    app.advance_clock(Duration::from_millis(45_500));
    assert_eq!(
        app.finish(1, "passed", Some(sample_result(false))).await,
        StatusCode::OK
    );
    let on_gpu = started.elapsed().as_secs_f64();
    // Repeats and late events change nothing and send nothing.
    assert_eq!(app.event("build.finished", 1).await, StatusCode::OK);
    assert_eq!(app.event("job.started", 1).await, StatusCode::OK);
    app.sweep().await;

    let got = app.receiver.received();
    assert_eq!(
        ids(&got),
        [
            "msg_scheduled_cb-1",
            "msg_running_cb-1",
            "msg_finished_cb-1"
        ]
    );
    assert_eq!(python_verifies(KEY, &got), [true, true, true]);
    assert_eq!(
        python_verifies(NEW_KEY, &got),
        [false, false, false],
        "a wrong key must not verify"
    );

    let types: Vec<Value> = got.iter().map(|r| r.json()["type"].clone()).collect();
    assert_eq!(types, ["job.scheduled", "job.running", "job.finished"]);
    let finished = got[2].json();
    let data = &finished["data"];
    assert_eq!(data["run_id"], "cb-1");
    assert_eq!(
        (data["gpu"].as_str(), data["queue"].as_str()),
        (Some("H100_BK"), Some("h100"))
    );
    assert_eq!(data["verdict"], "passed");
    assert_eq!(data["build_state"], "passed");
    assert_eq!(data["build"]["number"], 1);
    let (queued, ran) = app.timings_of_2_and_45_5(1, (in_queue, on_gpu));
    assert_eq!(
        data["timings"],
        json!({"queued_secs": queued, "ran_secs": ran})
    );
    assert_eq!(data["result"]["system"]["gpu"], "NVIDIA H100 80GB HBM3");
    assert_eq!(data["result"]["runs"]["test"]["run"]["passed"], true);
    // The earlier states carry no result and unknown timings as null.
    let running = got[1].json();
    assert!(running["data"]["result"].is_null() && running["data"]["verdict"].is_null());
    assert!(running["data"]["timings"]["ran_secs"].is_null());
    // The timestamp is when the state changed, not when it was sent.
    let job = app.job("cb-1").await;
    assert_eq!(
        finished["timestamp"],
        kernelbot_dispatch::time::rfc3339(job.updated_at)
    );

    let (_, view) = app.status("cb-1").await;
    assert_eq!(
        view["delivery"]["callback"],
        json!({"status": "delivered", "delivered": "finished", "attempts": 0,
               "pending_since": null, "last_error": null})
    );
}

async fn a_refused_callback_is_redelivered_with_the_same_id_and_body(kind: StoreKind) {
    let app = app_with(kind, KEY).await;
    run_to_running(&app, "cb-500").await;
    // A redirect is not followed (it would carry the result elsewhere): tried again later.
    app.receiver.answer_with(&[307, 503]);
    app.finish(1, "passed", Some(sample_result(false))).await;
    let (_, view) = app.status("cb-500").await;
    assert_eq!(view["delivery"]["callback"]["status"], "pending");
    assert_eq!(view["delivery"]["callback"]["attempts"], 1);
    assert_eq!(
        view["delivery"]["callback"]["last_error"],
        "the callback receiver redirected (307): set CALLBACK_URL to the final URL"
    );

    let first = app.sweep().await;
    assert_eq!((first.callbacks_sent, first.callbacks_pending), (0, 1));
    app.advance_clock(Duration::from_secs(3600));
    let second = app.sweep().await;
    assert_eq!((second.callbacks_sent, second.callbacks_pending), (1, 0));
    // Accepted: later passes send nothing more.
    app.advance_clock(Duration::from_secs(3600));
    let third = app.sweep().await;
    assert_eq!((third.callbacks_sent, third.callbacks_pending), (0, 0));

    let finished: Vec<Received> = app
        .receiver
        .received()
        .into_iter()
        .filter(|r| r.id == "msg_finished_cb-500")
        .collect();
    let statuses: Vec<u16> = finished.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [307, 503, 204]);
    assert!(
        finished.windows(2).all(|w| w[0].body == w[1].body),
        "every attempt sends the same body"
    );
    assert_eq!(python_verifies(KEY, &finished), [true, true, true]);
    let (_, view) = app.status("cb-500").await;
    assert_eq!(view["delivery"]["callback"]["status"], "delivered");
}

/// A receiver that answers too slowly, then one that rate-limits: the job still finishes and
/// its Discord report is shown; the callback is redelivered, unchanged, until accepted.
async fn a_slow_or_rate_limiting_receiver_never_holds_the_job_back(kind: StoreKind) {
    // A timeout a loaded machine's answers stay well within, and a receiver far slower.
    let app = TestApp::spawn_tuned(kind, &[("CALLBACK_SECRET", KEY)], Duration::from_secs(2)).await;
    run_to_running(&app, "cb-slow").await;
    app.receiver.set_delay(Some(Duration::from_secs(10)));
    assert_eq!(
        app.finish(1, "passed", Some(sample_result(false))).await,
        StatusCode::OK
    );
    assert_eq!(
        app.job("cb-slow").await.state,
        kernelbot_dispatch::jobs::JobState::Finished
    );
    assert!(
        app.discord_text().contains("✅ success"),
        "{}",
        app.discord_text()
    );
    let (_, view) = app.status("cb-slow").await;
    assert_eq!(view["delivery"]["callback"]["status"], "pending");
    assert!(
        view["delivery"]["callback"]["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("the callback receiver did not answer")),
        "{view}"
    );
    app.receiver.set_delay(None);
    app.receiver.answer_with(&[429]);
    assert_eq!(
        app.sweep().await.callbacks_pending,
        1,
        "429: tried again later"
    );
    assert_eq!(app.sweep().await.callbacks_sent, 1);
    let finished: Vec<Received> = app
        .receiver
        .received()
        .into_iter()
        .filter(|r| r.id == "msg_finished_cb-slow")
        .collect();
    assert_eq!(finished.len(), 3, "slow, 429, accepted");
    assert!(finished.windows(2).all(|w| w[0].body == w[1].body));
    let (_, view) = app.status("cb-slow").await;
    assert_eq!(view["delivery"]["callback"]["status"], "delivered");
}

async fn a_410_stops_redelivery(kind: StoreKind) {
    let app = app_with(kind, KEY).await;
    run_to_running(&app, "cb-410").await;
    app.receiver.answer_with(&[410]);
    app.finish(1, "passed", Some(sample_result(false))).await;
    for _ in 0..3 {
        app.advance_clock(Duration::from_secs(600));
        let pass = app.sweep().await;
        assert_eq!(pass.callbacks_pending, 0);
    }
    let finished = app
        .receiver
        .received()
        .iter()
        .filter(|r| r.id == "msg_finished_cb-410")
        .count();
    assert_eq!(finished, 1, "410 means no more");
    let (_, view) = app.status("cb-410").await;
    assert_eq!(view["delivery"]["callback"]["status"], "gone");
    let job = app.job("cb-410").await;
    assert!(!job.owes(Channel::Callback));
}

async fn redelivery_gives_up_after_a_day(kind: StoreKind) {
    let app = app_with(kind, KEY).await;
    run_to_running(&app, "cb-day").await;
    app.receiver.answer_with(&[500; 8]);
    app.finish(1, "passed", Some(sample_result(false))).await;
    app.advance_clock(Duration::from_secs(12 * 3600));
    assert_eq!(
        app.sweep().await.callbacks_pending,
        1,
        "still trying at 12 h"
    );
    app.advance_clock(Duration::from_secs(12 * 3600 + 1));
    let pass = app.sweep().await;
    assert_eq!((pass.callbacks_pending, pass.callbacks_given_up), (0, 1));
    let tries = app.receiver.received().len();
    app.advance_clock(Duration::from_secs(3600));
    app.sweep().await;
    assert_eq!(
        app.receiver.received().len(),
        tries,
        "given up: nothing more"
    );
    let (_, view) = app.status("cb-day").await;
    assert_eq!(view["delivery"]["callback"]["status"], "given_up");
    let given_up: Vec<f64> = app
        .metric("CallbacksGivenUp")
        .iter()
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(given_up, [0.0, 1.0, 0.0], "one per pass");
}

async fn a_pending_earlier_state_is_dropped_once_a_later_one_is_delivered(kind: StoreKind) {
    let app = app_with(kind, KEY).await;
    let (status, _) = app.submit(&submission("cb-drop")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // `running` is refused; the build then finishes and `finished` is accepted.
    app.receiver.answer_with(&[500]);
    app.buildkite.start_eval(1);
    app.event("job.started", 1).await;
    app.finish(1, "passed", Some(sample_result(false))).await;
    app.advance_clock(Duration::from_secs(3600));
    app.sweep().await;
    let got: Vec<(String, u16)> = app
        .receiver
        .received()
        .iter()
        .map(|r| (r.id.clone(), r.status))
        .collect();
    assert_eq!(
        got,
        [
            ("msg_scheduled_cb-drop".to_owned(), 204),
            ("msg_running_cb-drop".to_owned(), 500),
            ("msg_finished_cb-drop".to_owned(), 204),
        ]
    );
}

async fn concurrent_webhooks_send_the_final_callback_once(kind: StoreKind) {
    let app = app_with(kind, KEY).await;
    run_to_running(&app, "cb-race").await;
    // A slow receiver keeps the first sender busy while the duplicates arrive.
    app.receiver.set_delay(Some(Duration::from_millis(300)));
    app.buildkite
        .upload(1, "result.json", sample_result(false), "finished", false);
    app.buildkite.set_state(1, "passed");
    let (a, b, c, d) = tokio::join!(
        app.event("build.finished", 1),
        app.event("build.finished", 1),
        app.event("build.finished", 1),
        app.event("build.finished", 1)
    );
    assert_eq!([a, b, c, d], [StatusCode::OK; 4]);
    app.sweep().await;
    let finals = app
        .receiver
        .received()
        .iter()
        .filter(|r| r.id == "msg_finished_cb-race")
        .count();
    assert_eq!(finals, 1);
}

async fn during_a_rotation_each_secret_signs(kind: StoreKind) {
    let both = format!("{KEY} {NEW_KEY}");
    let app = app_with(kind, &both).await;
    let (status, _) = app.submit(&submission("cb-rot")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let got = app.receiver.received();
    assert_eq!(ids(&got), ["msg_scheduled_cb-rot"]);
    assert_eq!(got[0].signature.split(' ').count(), 2);
    assert_eq!(
        python_verifies(KEY, &got),
        [true],
        "old receivers still verify"
    );
    assert_eq!(
        python_verifies(NEW_KEY, &got),
        [true],
        "new receivers verify"
    );
}

async fn no_callback_url_sends_nothing_and_stores_no_outbox(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    run_to_running(&app, "cb-none").await;
    app.finish(1, "passed", Some(sample_result(false))).await;
    app.sweep().await;
    assert!(app.receiver.received().is_empty());
    assert!(app.job("cb-none").await.callback.is_none());
    let (_, view) = app.status("cb-none").await;
    assert!(view["delivery"]["callback"].is_null());
}

on_both_stores!(
    every_state_is_called_back_once_and_signed,
    a_refused_callback_is_redelivered_with_the_same_id_and_body,
    a_slow_or_rate_limiting_receiver_never_holds_the_job_back,
    a_410_stops_redelivery,
    redelivery_gives_up_after_a_day,
    a_pending_earlier_state_is_dropped_once_a_later_one_is_delivered,
    concurrent_webhooks_send_the_final_callback_once,
    during_a_rotation_each_secret_signs,
    no_callback_url_sends_nothing_and_stores_no_outbox,
);
