//! The routers driven by real-shaped Lambda events (function URL and API Gateway v2), parsed
//! by `lambda_http` exactly as the runtime does.

use crate::support::{SECRET, StoreKind, TestApp};
use base64::Engine as _;
use kernelbot_dispatch::buildkite::sign;
use kernelbot_dispatch::devstack::buildkite::unix_now;
use kernelbot_dispatch::jobs::JobState;
use lambda_http::tower::ServiceExt;
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("fixture is JSON")
}

async fn call(router: &axum::Router, event: &Value) -> (u16, Value) {
    let request =
        lambda_http::request::from_str(&event.to_string()).expect("lambda_http parses the event");
    let response = router.clone().oneshot(request).await.expect("infallible");
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn function_url_events_reach_the_submit_routes() {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    let (status, created) = call(
        &app.submit_router,
        &fixture("function_url_post_submission.json"),
    )
    .await;
    assert_eq!(status, 202, "{created}");
    assert_eq!(created["run_id"], "fixture-1");
    assert_eq!(
        app.buildkite.build(1).unwrap().meta_data["run_id"],
        "fixture-1"
    );

    let (status, view) = call(
        &app.submit_router,
        &fixture("function_url_get_submission.json"),
    )
    .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["state"], "scheduled");

    let mut unauthorized = fixture("function_url_get_submission.json");
    unauthorized["headers"]
        .as_object_mut()
        .unwrap()
        .remove("authorization");
    assert_eq!(call(&app.submit_router, &unauthorized).await.0, 401);
}

#[tokio::test]
async fn a_base64_api_gateway_webhook_is_verified_over_its_raw_bytes() {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    call(
        &app.submit_router,
        &fixture("function_url_post_submission.json"),
    )
    .await;
    app.buildkite.start_eval(1);

    let body = app.buildkite.webhook_body("job.started", 1);
    let ts = unix_now().to_string();
    let mut event = fixture("apigw_v2_buildkite_webhook.json");
    event["body"] = base64::engine::general_purpose::STANDARD
        .encode(&body)
        .into();
    event["headers"]["x-buildkite-signature"] =
        format!("timestamp={ts},signature={}", sign(SECRET, &ts, &body)).into();
    let (status, answer) = call(&app.webhook_router, &event).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(app.job("fixture-1").await.state, JobState::Running);

    // The same event with one byte of the body changed is refused.
    let mut tampered = body.clone();
    let last = tampered.len() - 2;
    tampered[last] = b' ';
    event["body"] = base64::engine::general_purpose::STANDARD
        .encode(&tampered)
        .into();
    assert_eq!(call(&app.webhook_router, &event).await.0, 401);
}
