//! `GET /queues/{gpu}` through real HTTP: agents from the Buildkite stand-in's agents API
//! (connected or not, busy or idle, paged), cached in the store so instances share one
//! listing a minute, and the queue's open jobs from the store's queue index. Every scenario
//! runs against both stores.

use std::time::Duration;

use crate::support::{API_TOKEN, StoreKind, TestApp, submission};
use kernelbot_dispatch::devstack::buildkite::sample_result;
use kernelbot_dispatch::flow::queues;
use kernelbot_dispatch::retry::Deadline;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn queue(app: &TestApp, gpu: &str) -> (StatusCode, Value) {
    let resp = app
        .client
        .get(format!("{}/queues/{gpu}", app.submit_url))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .expect("the submit API answers");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn on_b200(run_id: &str) -> Value {
    let mut body = submission(run_id);
    body["gpu"] = json!("B200_BK");
    body
}

async fn counts_agents_and_open_jobs_of_the_queue_only(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.buildkite.set_agents(&[
        ("h100-gpu1", "h100", "connected", true),
        ("h100-gpu0", "h100", "connected", false),
        ("h100-gpu2", "h100", "disconnected", false),
        ("h100-gpu3", "h100", "lost", true),
        ("b200-gpu0", "b200", "connected", true),
    ]);
    // Build 1 waits, build 2 runs, build 3 has finished; build 4 is another queue's.
    for id in ["q-waiting", "q-running", "q-done"] {
        assert_eq!(app.submit(&submission(id)).await.0, StatusCode::ACCEPTED);
    }
    assert_eq!(app.submit(&on_b200("q-b200")).await.0, StatusCode::ACCEPTED);
    app.buildkite.start_eval(2);
    app.event("job.started", 2).await;
    app.buildkite.start_eval(3);
    app.finish(3, "passed", Some(sample_result(false))).await;
    app.advance_clock(Duration::from_secs(90));

    let (status, body) = queue(&app, "H100_BK").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["agents"],
        json!({"total": 2, "idle": 1, "busy": 1, "paused": 0, "list": [
            {"name": "h100-gpu0", "busy": false, "paused": false},
            {"name": "h100-gpu1", "busy": true, "paused": false}]})
    );
    assert_eq!(
        body["jobs"],
        json!({"queued": 1, "running": 1, "background": 0})
    );
    assert_eq!(
        (body["gpu"].as_str(), body["queue"].as_str()),
        (Some("H100_BK"), Some("h100"))
    );
    let waited = body["oldest_queued_secs"].as_u64().expect("a job waits");
    assert!((90..100).contains(&waited), "{waited}");

    let (_, b200) = queue(&app, "B200_BK").await;
    assert_eq!(b200["agents"]["total"], 1);
    assert_eq!(
        b200["jobs"],
        json!({"queued": 1, "running": 0, "background": 0})
    );
    let (_, mi300) = queue(&app, "MI300_BK").await;
    assert_eq!(mi300["agents"]["total"], 0);
    assert_eq!(
        mi300["jobs"],
        json!({"queued": 0, "running": 0, "background": 0})
    );
    assert!(mi300["oldest_queued_secs"].is_null());
}

async fn every_page_of_agents_is_read(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let names: Vec<String> = (0..250).map(|i| format!("h100-{i:03}")).collect();
    let agents: Vec<(&str, &str, &str, bool)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), "h100", "connected", i % 5 == 0))
        .collect();
    app.buildkite.set_agents(&agents);
    let (status, body) = queue(&app, "H100_BK").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&body["agents"]["total"], &body["agents"]["busy"]),
        (&json!(250), &json!(50))
    );
    assert_eq!(app.buildkite.agent_calls(), 3, "three pages of 100");
}

async fn instances_share_one_listing_every_50_s(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.buildkite
        .set_agents(&[("h100-gpu0", "h100", "connected", false)]);
    // A burst through the API and, as a second instance, the sweep function's dispatcher.
    let deadline = Deadline::after(Duration::from_secs(10));
    let (a, b, c, d) = tokio::join!(
        queue(&app, "H100_BK"),
        queue(&app, "H100_BK"),
        queues::status(&app.sweeper, "H100_BK", deadline),
        queues::status(&app.sweeper, "B200_BK", deadline),
    );
    assert_eq!((a.0, b.0), (StatusCode::OK, StatusCode::OK));
    assert_eq!(a.1["agents"]["total"], 1);
    assert_eq!(c.expect("second instance").agents.total, 1);
    assert_eq!(d.expect("second instance").agents.total, 0);
    assert_eq!(app.buildkite.agent_calls(), 1);

    // Changes show after 50 s (a list a release fills idle GPUs by is under a minute old),
    // not before.
    app.buildkite.set_agents(&[
        ("h100-gpu0", "h100", "connected", true),
        ("h100-gpu1", "h100", "connected", false),
    ]);
    app.advance_clock(Duration::from_secs(40));
    assert_eq!(queue(&app, "H100_BK").await.1["agents"]["total"], 1);
    assert_eq!(app.buildkite.agent_calls(), 1);
    app.advance_clock(Duration::from_secs(11));
    let (_, fresh) = queue(&app, "H100_BK").await;
    assert_eq!(
        (&fresh["agents"]["total"], &fresh["agents"]["busy"]),
        (&json!(2), &json!(1))
    );
    assert_eq!(app.buildkite.agent_calls(), 2);
}

async fn a_refused_agents_api_is_a_502_and_is_not_hammered(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.buildkite.fail_agents(Some(403));
    let (status, body) = queue(&app, "H100_BK").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error"], "buildkite_error");
    assert!(
        !body.to_string().contains("read_agents scope"),
        "Buildkite's own words stay in the log: {body}"
    );
    // Within the minute nobody calls again; with no list yet, the answer says to retry.
    let (status, _) = queue(&app, "H100_BK").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(app.buildkite.agent_calls(), 1);
    // After it, the API is asked again and its list served.
    app.buildkite.fail_agents(None);
    app.buildkite
        .set_agents(&[("h100-gpu0", "h100", "connected", false)]);
    app.advance_clock(Duration::from_secs(61));
    let (status, body) = queue(&app, "H100_BK").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["agents"]["idle"], 1);
    // A later failure keeps serving the last list rather than failing everyone.
    app.buildkite.fail_agents(Some(500));
    app.advance_clock(Duration::from_secs(61));
    let (first, _) = queue(&app, "H100_BK").await;
    assert_eq!(
        first,
        StatusCode::BAD_GATEWAY,
        "the instance that tried says so"
    );
    let (status, body) = queue(&app, "H100_BK").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["agents"]["idle"], 1);
    // Not for ever: a list ten minutes old is not served.
    app.advance_clock(Duration::from_secs(9 * 60));
    let (first, _) = queue(&app, "H100_BK").await;
    assert_eq!(first, StatusCode::BAD_GATEWAY);
    let (status, body) = queue(&app, "H100_BK").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or("")
            .contains("could not be refreshed"),
        "{body}"
    );
}

/// A rate-limited agents API: retried within the call, then a 502 that names the rate
/// limit; nobody asks again within the minute.
async fn a_rate_limited_agents_api_is_a_502(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.buildkite.fail_agents(Some(429));
    let (status, body) = queue(&app, "H100_BK").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or("")
            .contains("rate limit"),
        "{body}"
    );
    let calls = app.buildkite.agent_calls();
    assert!(calls > 1, "a 429 is retried within the call: {calls}");
    assert_eq!(
        queue(&app, "H100_BK").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(app.buildkite.agent_calls(), calls);
}

async fn unknown_gpus_and_missing_tokens_are_refused(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let (status, body) = queue(&app, "V100").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        body["message"].as_str().unwrap_or("").contains("H100_BK"),
        "{body}"
    );
    let resp = app
        .client
        .get(format!("{}/queues/H100_BK", app.submit_url))
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(app.buildkite.agent_calls(), 0);
}

on_both_stores!(
    counts_agents_and_open_jobs_of_the_queue_only,
    every_page_of_agents_is_read,
    instances_share_one_listing_every_50_s,
    a_refused_agents_api_is_a_502_and_is_not_hammered,
    a_rate_limited_agents_api_is_a_502,
    unknown_gpus_and_missing_tokens_are_refused,
);
