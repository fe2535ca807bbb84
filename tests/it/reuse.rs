//! Answers from an earlier run (`RESULT_CACHE_SECS`), on both stores: a `test` submission
//! identical to one that ended with its own verdict makes no build and reports that run's
//! verdict, naming it, with its own callback; a changed byte, `"cache": false`, a
//! leaderboard run, and a copy of a run that ended in error each make a build.

use std::time::Duration;

use kernelbot_dispatch::devstack::buildkite::sample_result;
use kernelbot_dispatch::jobs::JobState;
use kernelbot_dispatch::result::Verdict;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{StoreKind, TestApp, submission};

const CALLBACK_KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

async fn app(kind: StoreKind) -> TestApp {
    let vars = [
        ("RESULT_CACHE_SECS", "86400"),
        ("CALLBACK_SECRET", CALLBACK_KEY),
    ];
    TestApp::spawn_with(kind, &vars).await
}

/// A kernel as kernelbot sends one: the task's files and the user's.
fn kernel(run_id: &str) -> Value {
    let mut body = submission(run_id);
    body["config"]["sources"] = json!({
        "eval.py": "import submission\nprint(submission.add(1, 2))\n",
        "submission.py": "def add(a, b):\n    return a + b\n",
    });
    body
}

/// Submits `body` and runs its build (the next number) to `state` with `result`.
async fn run(app: &TestApp, body: &Value, number: u64, state: &str, result: Option<Vec<u8>>) {
    let (status, answer) = app.submit(body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["build"]["number"], number, "{answer}");
    app.buildkite.start_eval(number);
    app.advance_clock(Duration::from_secs(30));
    assert_eq!(app.finish(number, state, result).await, StatusCode::OK);
}

/// The callbacks the receiver took for `run_id`, as JSON.
fn callbacks_for(app: &TestApp, run_id: &str) -> Vec<Value> {
    let received = app.receiver.received();
    let bodies = received.iter().map(|r| r.json());
    bodies.filter(|b| b["data"]["run_id"] == run_id).collect()
}

async fn an_identical_test_is_answered_from_the_first_run(kind: StoreKind) {
    let app = app(kind).await;
    run(
        &app,
        &kernel("first"),
        1,
        "failed",
        Some(sample_result(true)),
    )
    .await;
    let first = app.job("first").await;
    assert_eq!(first.outcome.as_ref().unwrap().verdict, Verdict::Failed);

    // The same code with its keys in another order, another title: the same submission.
    let mut again = kernel("second");
    again["title"] = json!("vectoradd, once more");
    let reordered: Value = serde_json::from_str(&again["config"].to_string()).unwrap();
    let mut config = serde_json::Map::new();
    for (k, v) in reordered.as_object().unwrap().iter().rev() {
        config.insert(k.clone(), v.clone());
    }
    again["config"] = Value::Object(config);
    let (status, answer) = app.submit(&again).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["state"], "finished", "{answer}");
    assert_eq!(answer["cached_from"], "first", "{answer}");
    assert_eq!(answer["verdict"], "failed");
    assert_eq!(answer["build"], Value::Null);
    assert_eq!(app.buildkite.builds().len(), 1, "no build for the copy");

    let second = app.job("second").await;
    assert_eq!(second.state, JobState::Finished);
    assert_eq!(
        second.cached_from.as_ref().map(|r| r.as_str()),
        Some("first")
    );
    let (mine, theirs) = (second.outcome.unwrap(), first.outcome.unwrap());
    assert_eq!(
        mine.result, theirs.result,
        "the first run's result, as stored"
    );
    // The API names the run; the report says so in its own message; a callback of its own.
    let (_, shown) = app.status("second").await;
    assert_eq!(shown["cached_from"], "first");
    assert_eq!(shown["verdict"], "failed");
    let messages = app.discord.messages();
    assert_eq!(
        messages.len(),
        2,
        "the copy's report is a message of its own"
    );
    let report = messages
        .values()
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .find(|c| c.contains("nswered from run `first`"))
        .unwrap_or_else(|| panic!("{messages:?}"));
    assert!(report.contains("❌ failure"), "{report}");
    let sent = callbacks_for(&app, "second");
    let finished = sent.iter().find(|b| b["type"] == "job.finished");
    let finished = finished.unwrap_or_else(|| panic!("{sent:?}"));
    assert_eq!(finished["data"]["cached_from"], "first");
    assert_eq!(finished["data"]["verdict"], "failed");
    // A run answered from another answers nobody in its turn: the first one does.
    let (_, third) = app.submit(&kernel("third")).await;
    assert_eq!(third["cached_from"], "first", "{third}");
}

async fn what_may_not_be_answered_runs(kind: StoreKind) {
    let app = app(kind).await;
    run(
        &app,
        &kernel("first"),
        1,
        "passed",
        Some(sample_result(false)),
    )
    .await;
    let mut changed = kernel("one-byte");
    changed["config"]["sources"]["submission.py"] = json!("def add(a, b):\n    return a + b \n");
    let mut opted_out = kernel("opted-out");
    opted_out["cache"] = json!(false);
    let mut ranked = kernel("ranked");
    ranked["config"]["mode"] = json!("leaderboard");
    let mut elsewhere = kernel("elsewhere");
    elsewhere["gpu"] = json!("MI300_BK");
    for (number, body) in [(2, changed), (3, opted_out), (4, ranked), (5, elsewhere)] {
        let (status, answer) = app.submit(&body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
        assert_eq!(answer["build"]["number"], number, "{body}: {answer}");
        assert_eq!(answer.get("cached_from"), None);
    }
    // A run that left no usable result (a build that passed without result.json) answers
    // nobody.
    let mut broken = kernel("broken");
    broken["config"]["sources"]["submission.py"] = json!("def add(a, b):\n    return a - b\n");
    run(&app, &broken, 6, "passed", None).await;
    let verdict = app.job("broken").await.outcome.unwrap().verdict;
    assert_eq!(verdict, Verdict::Error);
    broken["run_id"] = json!("broken-again");
    let (_, answer) = app.submit(&broken).await;
    assert_eq!(answer["build"]["number"], 7, "{answer}");
    // A bad `cache` is the caller's error.
    let mut bad = kernel("bad-cache");
    bad["cache"] = json!("no");
    let (status, answer) = app.submit(&bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(answer.to_string().contains("cache"), "{answer}");
}

/// Past `RESULT_CACHE_SECS` the same code runs again.
async fn an_answer_is_given_only_within_the_cache_s_time(kind: StoreKind) {
    let vars = [("RESULT_CACHE_SECS", "3600")];
    let app = TestApp::spawn_with(kind, &vars).await;
    run(
        &app,
        &kernel("first"),
        1,
        "passed",
        Some(sample_result(false)),
    )
    .await;
    app.advance_clock(Duration::from_secs(3000));
    let (_, answer) = app.submit(&kernel("within")).await;
    assert_eq!(answer["cached_from"], "first", "{answer}");
    app.advance_clock(Duration::from_secs(700));
    let (_, answer) = app.submit(&kernel("past")).await;
    assert_eq!(answer["build"]["number"], 2, "{answer}");
}

on_both_stores!(
    an_identical_test_is_answered_from_the_first_run,
    what_may_not_be_answered_runs,
    an_answer_is_given_only_within_the_cache_s_time,
);
