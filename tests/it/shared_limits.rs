//! Limits every instance spends together: two instances of the submit function (each with
//! its own view of every rate limit, as two Lambda instances have) over one store keep one
//! Buildkite token's window and one Discord webhook's bucket between them, as the stand-ins
//! enforce them, where each alone would learn the limit only from its own answers and meet
//! the other's 429s.

use std::collections::BTreeSet;
use std::time::Duration;

use kernelbot_dispatch::jobs::Channel;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::{API_TOKEN, StoreKind, TestApp, submission};

/// The GPUs of the default queues.
const GPUS: [&str; 4] = ["H100_BK", "B200_BK", "MI300_BK", "L40S_BK"];

/// `count` submissions named `prefix-i`, each of a user of its own (so none waits for its
/// turn) and the queues in turn, through the submit functions at `bases` in turn, all at once.
async fn burst(app: &TestApp, bases: &[&str], prefix: &str, count: usize) -> Vec<String> {
    let runs: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
    let mut sends = tokio::task::JoinSet::new();
    for (i, run_id) in runs.iter().enumerate() {
        let mut body: Value = submission(run_id);
        body["user"] = format!("user-{prefix}-{i}").into();
        // Each queue's creates take its lease in turn: four queues, four at once.
        body["gpu"] = GPUS[i % GPUS.len()].into();
        let base = bases[i % bases.len()];
        let request = app
            .client
            .post(format!("{base}/submissions"))
            .bearer_auth(API_TOKEN)
            .json(&body);
        sends.spawn(async move {
            let resp = request.send().await.expect("the submit API answers");
            (resp.status(), resp.text().await.unwrap_or_default())
        });
    }
    for (status, answer) in sends.join_all().await {
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    }
    runs
}

/// Discord's bucket of one webhook (5 calls per 2 s): a burst of first messages through two
/// instances at once never goes past it, and each message is posted once.
async fn two_instances_keep_one_webhook_s_bucket_together(kind: StoreKind) {
    keep_one_bucket(kind, None).await;
}

/// The same with each call reaching Discord 0.4 s after it was taken (a fifth of a window,
/// as on a loaded network): calls still on their way at a reset count in the next window,
/// whichever instance took them.
async fn calls_on_their_way_at_a_reset_count_for_the_other_instance_too(kind: StoreKind) {
    keep_one_bucket(kind, Some(Duration::from_millis(400))).await;
}

/// A burst of first messages through two instances, each call reaching Discord `late`.
async fn keep_one_bucket(kind: StoreKind, late: Option<Duration>) {
    let app = TestApp::spawn_with(kind, &[("SWEEP_MIN_AGE_SECS", "0")]).await;
    app.discord.enforce_rate_limit(5, Duration::from_secs(2));
    app.discord.set_delay(late);
    let other = app
        .another_submit()
        .await
        .expect("a second instance starts");
    // One answer tells the bucket; from then on both instances spend it.
    let mut runs = burst(&app, &[&app.submit_url], "told", 1).await;
    runs.extend(burst(&app, &[&app.submit_url, &other], "burst", 16).await);
    let mut owed = runs.len();
    for round in 0..60 {
        owed = 0;
        for run_id in &runs {
            owed += usize::from(app.job(run_id).await.owes(Channel::Discord));
        }
        if owed == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        if round % 4 == 3 {
            // What a submit could not send in its own time, the sweep sends.
            app.sweep().await;
        }
    }
    assert_eq!(owed, 0, "every first message went out within 30 s");
    let posted = app
        .discord_calls()
        .iter()
        .filter(|c| c.method == "POST" && c.status == 200)
        .count();
    assert_eq!(posted, runs.len(), "one first message each, none twice");
    let (refused, busiest) = app.discord.rate_limit_seen();
    assert_eq!(refused, 0, "no call past the bucket the two spent together");
    // First messages leave a bucket's last call to final reports; where the two ends of a
    // window fall at Discord and here differ by an answer's way back, one window may hold
    // the last of one and the first of the next.
    assert!(
        (4..=5).contains(&busiest),
        "the burst filled the bucket (else it shows nothing): {busiest}"
    );
}

/// Buildkite's window of one token (20 calls a minute here): creates through two instances
/// at once never go past it together; what did not fit is created in later windows, each
/// build once.
async fn two_instances_keep_one_token_s_window_together(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("SWEEP_MIN_AGE_SECS", "0")]).await;
    app.buildkite.enforce_rate_limit(20);
    let other = app
        .another_submit()
        .await
        .expect("a second instance starts");
    // One instance spends most of the window one call at a time; the other, which has
    // made no call yet, then bursts: only the window they share tells it what is left.
    let mut runs = Vec::new();
    for i in 0..17 {
        runs.extend(burst(&app, &[&app.submit_url], &format!("first-{i}"), 1).await);
    }
    // Answers a little slow, as Buildkite's are under load: the other's creates overlap.
    app.buildkite.set_delay(Some(Duration::from_millis(300)));
    runs.extend(burst(&app, &[&other], "burst", 12).await);
    app.buildkite.set_delay(None);
    for _ in 0..6 {
        if app.buildkite.builds().len() >= runs.len() {
            break;
        }
        app.advance_clock(Duration::from_secs(61));
        app.sweep().await;
    }
    assert_eq!(
        app.buildkite.rate_limited_calls(),
        0,
        "no call past the window the two spent together: {:?}",
        app.buildkite.rate_limit_windows()
    );
    let windows = app.buildkite.rate_limit_windows();
    assert!(windows.iter().all(|used| *used <= 20), "{windows:?}");
    assert!(
        windows.len() >= 2,
        "the burst needed more than one window: {windows:?}"
    );
    let built: BTreeSet<String> = app
        .buildkite
        .builds()
        .iter()
        .map(|b| b.meta_data["run_id"].clone())
        .collect();
    assert_eq!(built.len(), runs.len(), "every run built");
    assert_eq!(app.buildkite.builds().len(), runs.len(), "each built once");
}

on_both_stores!(
    two_instances_keep_one_webhook_s_bucket_together,
    calls_on_their_way_at_a_reset_count_for_the_other_instance_too,
    two_instances_keep_one_token_s_window_together
);
