//! A user's daily GPU budget (`USER_GPU_SECONDS_PER_DAY`), on both stores: evaluation time
//! only (Buildkite's job times, not the wait in the queue) is counted; past the budget a
//! user's submission gets 429 with `Retry-After` and nothing is recorded, while another
//! user's is taken; `GET /users/{user}/usage` shows it; a day later the user is back.

use std::time::{Duration, Instant};

use kernelbot_dispatch::devstack::buildkite::sample_result;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{API_TOKEN, StoreKind, TestApp, submission};

fn of(user: &str, run_id: &str) -> Value {
    let mut body = submission(run_id);
    body["user"] = json!(user);
    body
}

/// Submits, waits `queued` for an agent, runs `ran` on the GPU and finishes passed.
async fn run(app: &TestApp, body: &Value, number: u64, queued: u64, ran: u64) {
    let (status, answer) = app.submit(body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["build"]["number"], number, "{answer}");
    app.advance_clock(Duration::from_secs(queued));
    app.buildkite.start_eval(number);
    app.event("job.started", number).await;
    app.advance_clock(Duration::from_secs(ran));
    let finished = app
        .finish(number, "passed", Some(sample_result(false)))
        .await;
    assert_eq!(finished, StatusCode::OK);
}

async fn usage(app: &TestApp, user: &str) -> (StatusCode, Value) {
    let answer = app
        .client
        .get(format!("{}/users/{user}/usage", app.submit_url))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .expect("the submit API answers");
    let status = answer.status();
    (status, answer.json().await.unwrap_or(Value::Null))
}

async fn a_user_past_the_budget_waits_and_no_one_else(kind: StoreKind) {
    let vars = [
        ("USER_GPU_SECONDS_PER_DAY", "600"),
        ("USER_MAX_IN_FLIGHT", "0"),
    ];
    let app = TestApp::spawn_with(kind, &vars).await;
    // 10 minutes in the queue, 5 on the GPU: 300 s counted, not 900. The stack's clock runs
    // on in real time too: what follows is known to within the real time it takes here.
    let real = Instant::now();
    run(&app, &of("ada", "a1"), 1, 600, 300).await;
    let ran = app.timings(1).1;
    let (status, used) = usage(&app, "ada").await;
    assert_eq!(status, StatusCode::OK, "{used}");
    assert!(
        (used["used_secs"].as_f64().unwrap() - ran).abs() < 0.2,
        "{used} vs {ran}"
    );
    assert_eq!(used["limit_secs"], 600);
    assert_eq!(used["window_secs"], 86_400);
    assert_eq!(used.get("retry_after_secs"), None, "{used}");
    // Under the budget a run is taken, whatever it will use: then she is past it.
    app.advance_clock(Duration::from_secs(3600));
    run(&app, &of("ada", "a2"), 2, 10, 400).await;
    let asked = Instant::now();
    let refused = app
        .client
        .post(format!("{}/submissions", app.submit_url))
        .bearer_auth(API_TOKEN)
        .json(&of("ada", "a3"))
        .send()
        .await
        .expect("the submit API answers");
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = refused.headers()[reqwest::header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // The first run leaves the window a day after it ended; then 400 of 600 remain. Whole
    // seconds, rounded up; less the real time since it ended.
    let expected = 86_400 - 3600 - 410;
    let since = real.elapsed().as_secs_f64().ceil() as u64;
    assert!(
        (expected - since - 1..=expected).contains(&retry_after),
        "{retry_after} vs {expected}, {since} s of real time"
    );
    let body: Value = refused.json().await.expect("a JSON error");
    assert_eq!(body["error"], "rate_limited", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("600 GPU seconds"),
        "{body}"
    );
    let (status, _) = app.status("a3").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing of a3 recorded");
    let (_, shown) = usage(&app, "ada").await;
    // The same wait, less the real time between the two answers (whole seconds, rounded up).
    let gap = asked.elapsed().as_secs_f64().ceil() as u64;
    let shown_wait = shown["retry_after_secs"].as_u64().expect("a wait");
    assert!(
        (retry_after.saturating_sub(gap)..=retry_after).contains(&shown_wait),
        "{shown} vs {retry_after}, {gap} s apart"
    );
    // Another user is not held back; a retry of a recorded run is answered as before.
    let (status, _) = app.submit(&of("bob", "b1")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, _) = app.submit(&of("ada", "a2")).await;
    assert_eq!(status, StatusCode::OK);
    // Once the first run has left the window, she is back.
    app.advance_clock(Duration::from_secs(retry_after + 1));
    let (status, answer) = app.submit(&of("ada", "a4")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    // A user id the API would refuse in a body is refused in the path.
    let (status, _) = usage(&app, &"x".repeat(65)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// Without a budget nothing is counted and nobody is refused.
async fn without_a_budget_nothing_is_counted(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("USER_MAX_IN_FLIGHT", "0")]).await;
    run(&app, &of("ada", "a1"), 1, 5, 600).await;
    let (status, answer) = app.submit(&of("ada", "a2")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let (_, used) = usage(&app, "ada").await;
    assert_eq!(used["used_secs"], 0.0, "{used}");
    assert_eq!(used["limit_secs"], 0);
}

on_both_stores!(
    a_user_past_the_budget_waits_and_no_one_else,
    without_a_budget_nothing_is_counted,
);
