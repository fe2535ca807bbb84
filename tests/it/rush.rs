//! A small rush against Buildkite's REST limit, enforced by the stand-in as Buildkite does
//! (calls a minute per token, `RateLimit-*` headers, 429 past it): the creates and the
//! finishes that do not fit are deferred to later webhooks and sweep passes, and nothing is
//! lost or built twice.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kernelbot_dispatch::devstack::buildkite::sample_result;
use kernelbot_dispatch::jobs::{Channel, JobState, RunId, update};
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
    let windows = app.buildkite.rate_limit_windows();
    assert_eq!(
        windows.iter().max().copied(),
        Some(CALLS_A_MINUTE),
        "the rush met the limit (else it shows nothing): {windows:?}"
    );
    // A function instance meets a 429 only before it has been told the window is spent:
    // at most once a window for each of the three functions.
    assert!(
        app.buildkite.rate_limited_calls() <= 3 * windows.len(),
        "{} 429s in {} windows",
        app.buildkite.rate_limited_calls(),
        windows.len()
    );
}

/// `GET /queues/H100_BK` with the API token: its status.
async fn queue_status(app: &TestApp) -> StatusCode {
    app.client
        .get(format!("{}/queues/H100_BK", app.submit_url))
        .bearer_auth(crate::support::API_TOKEN)
        .send()
        .await
        .expect("the submit API answers")
        .status()
}

/// Buildkite's window as the functions were told it: creates leave its last calls to a
/// finish (the agents list is served from its cache meanwhile), and a call past it is never
/// sent; what was deferred is created in the next window.
async fn a_told_limit_is_kept_and_creates_come_first(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("SWEEP_MIN_AGE_SECS", "0")]).await;
    app.buildkite.add_agent("h100-gpu0", "h100", &[]);
    app.buildkite.enforce_rate_limit(20);
    assert_eq!(queue_status(&app).await, StatusCode::OK);
    assert_eq!(app.buildkite.agent_calls(), 1, "the agents list, cached");
    // A window of its own, so the cached list is stale before the window ends.
    app.advance_clock(Duration::from_secs(30));
    app.buildkite.enforce_rate_limit(20);
    let submitting = Instant::now();
    for i in 0..21 {
        let (status, answer) = app.submit(&submission(&format!("told-{i}"))).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    }
    assert_eq!(
        app.buildkite.builds().len(),
        17,
        "creates leave the window's last 3 calls to a finish"
    );
    let last = app.job("told-20").await;
    assert!(
        last.build.is_none() && last.creation.is_some(),
        "the 21st create waits for the next window: {last:?}"
    );
    // 3 calls left, kept for finishes: the stale agents list serves. 30 s into the window
    // (or later, had the submissions taken that long in real time, the clock running on
    // with them): the list is 60 s old, past its refresh, and the window open 30 s more.
    let spent = submitting.elapsed();
    let rest = Duration::from_secs(30).saturating_sub(spent);
    app.advance_clock(rest.max(Duration::from_secs(1)));
    assert_eq!(queue_status(&app).await, StatusCode::OK, "from the cache");
    assert_eq!(
        app.buildkite.agent_calls(),
        1,
        "no agents call in a low window"
    );
    // A finish takes them: the build read back, its artifacts, the download.
    app.buildkite.start_eval(1);
    app.finish(1, "passed", Some(sample_result(false))).await;
    let first = app.job("told-0").await;
    assert_eq!(first.state, JobState::Finished, "{first:?}");
    assert_eq!(
        app.buildkite.rate_limited_calls(),
        0,
        "no function called past what it was told"
    );
    app.advance_clock(Duration::from_secs(61));
    app.sweep().await;
    let runs: BTreeSet<String> = app
        .buildkite
        .builds()
        .iter()
        .map(|b| b.meta_data["run_id"].clone())
        .collect();
    assert_eq!(
        (runs.len(), app.buildkite.builds().len()),
        (21, 21),
        "each built once"
    );
}

/// Discord's per-webhook bucket (5 calls per 2 s here, as Discord's): a burst of first
/// messages to one channel waits for the bucket's reset rather than meeting a 429, and
/// every message is posted once.
async fn a_burst_to_one_webhook_keeps_to_its_bucket(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.discord.enforce_rate_limit(5, Duration::from_secs(2));
    let runs: Vec<String> = (0..12).map(|i| format!("burst-{i}")).collect();
    for run_id in &runs {
        let (status, answer) = app.submit(&submission(run_id)).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    }
    for run_id in &runs {
        // Sent within the submit call or just after it: waited for, not assumed.
        let mut job = app.job(run_id).await;
        for _ in 0..100 {
            if !job.owes(Channel::Discord) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            job = app.job(run_id).await;
        }
        assert!(
            !job.owes(Channel::Discord),
            "{run_id}'s first message went out: {job:?}"
        );
    }
    let posts = app
        .discord_calls()
        .iter()
        .filter(|c| c.method == "POST" && c.status == 200)
        .count();
    assert_eq!(posts, runs.len(), "one message each");
    let (refused, busiest) = app.discord.rate_limit_seen();
    assert_eq!(refused, 0, "no call past the bucket it was told");
    // First messages leave a bucket's last call to final reports; where the two ends of a
    // window fall at Discord and here differ by an answer's way back, one window may hold
    // the last of one and the first of the next.
    assert!(
        (4..=5).contains(&busiest),
        "the burst filled the bucket (else it shows nothing): {busiest}"
    );
}

/// The used calls of Buildkite's current window (the stand-in's count).
fn used_now(app: &TestApp) -> u32 {
    app.buildkite
        .rate_limit_windows()
        .last()
        .copied()
        .unwrap_or(0)
}

/// Submits runs of nobody in particular until `used` calls of the window are spent.
async fn fill_window_to(app: &TestApp, used: u32) {
    for i in 0..40 {
        if used_now(app) >= used {
            return;
        }
        // On another queue: the window is the token's, not the queue's, and the fair-share
        // queue's builds in flight stay its own.
        let mut body = submission(&format!("anyone-{i}"));
        body["gpu"] = "B200_BK".into();
        let (status, answer) = app.submit(&body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    }
    panic!("the window fills: {:?}", app.buildkite.rate_limit_windows());
}

/// A window spent to its last call, then quiet past its end: the next answer, whatever the
/// call (the agents list's too), tells a new window, and the sweep's pass goes on to create
/// the build of the job fair share released while the window was spent. (The rush once
/// stalled here for an hour: the agents list answered the old window's 0, and each pass
/// stopped its Buildkite work at its first call.)
async fn a_window_that_ended_quietly_holds_back_no_pass(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("SWEEP_MIN_AGE_SECS", "0")]).await;
    app.buildkite.add_agent("h100-gpu0", "h100", &[]);
    app.buildkite.enforce_rate_limit(20);
    for i in 0..4 {
        let mut body = submission(&format!("heavy-{i}"));
        body["user"] = "heavy".into();
        let (status, answer) = app.submit(&body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    }
    assert_eq!(
        app.buildkite.builds().len(),
        2,
        "two in flight, two waiting"
    );
    // Runs of nobody in particular take the window down to the 3 calls kept for a finish.
    fill_window_to(&app, 17).await;
    app.buildkite.start_eval(1);
    app.finish(1, "passed", Some(sample_result(false))).await;
    assert_eq!(app.job("heavy-0").await.state, JobState::Finished);
    assert_eq!(
        used_now(&app),
        20,
        "the finish took the window's last calls"
    );
    let released = app.job("heavy-2").await;
    assert!(
        !released.waiting && released.build.is_none(),
        "released, its create left for a window with room: {released:?}"
    );
    // Nobody calls until well past the window's end; then one pass.
    app.advance_clock(Duration::from_secs(120));
    let calls_before = app.buildkite.api_calls().len();
    app.sweep().await;
    let created = app.job("heavy-2").await;
    assert!(created.build.is_some(), "the pass created it: {created:?}");
    let pass_calls = app.buildkite.api_calls()[calls_before..].to_vec();
    assert!(
        pass_calls.iter().any(|c| c.ends_with("/agents")),
        "the pass read the agents list (fair share counts idle GPUs by it): {pass_calls:?}"
    );
    assert_eq!(
        used_now(&app) as usize,
        pass_calls.len(),
        "each of the pass's calls counted in a new window, the agents list's too: {pass_calls:?}"
    );
    assert_eq!(
        app.buildkite.rate_limited_calls(),
        0,
        "nothing called past the window"
    );
}

/// Two creates the rate limit deferred; the first one's create is then held (another
/// instance claimed it and has not finished): the next webhook of the queue creates the
/// second rather than stop at the first, and the first is kept on the list for when its
/// hold has passed.
async fn a_held_create_holds_back_no_deferred_create_behind_it(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    submit_ok(&app, "first-built").await;
    // One 429 with a 30 s reset: the submit function defers this create and the next.
    app.buildkite.fail_creates(&[(429, false)], 30);
    submit_ok(&app, "held").await;
    submit_ok(&app, "behind").await;
    for run_id in ["held", "behind"] {
        assert!(app.job(run_id).await.build.is_none(), "{run_id} deferred");
    }
    app.advance_clock(Duration::from_secs(31));
    // Claimed by another instance, as a create is claimed, for 90 s.
    let id: RunId = "held".parse().unwrap();
    let until = app.clock.now() + 90_000;
    update(app.store.as_ref(), &id, |j| {
        let mut next = j.clone();
        next.creation.as_mut()?.after = until;
        Some(next)
    })
    .await
    .unwrap();
    assert_eq!(app.event("build.running", 1).await, StatusCode::OK);
    assert!(
        app.job("behind").await.build.is_some(),
        "the second was created"
    );
    assert!(
        app.job("held").await.build.is_none(),
        "the held one waits its hold"
    );
    app.advance_clock(Duration::from_secs(90));
    assert_eq!(app.event("build.running", 1).await, StatusCode::OK);
    assert!(
        app.job("held").await.build.is_some(),
        "kept on the list and created once its hold passed"
    );
    assert_eq!(app.buildkite.builds().len(), 3, "each built once");
}

async fn submit_ok(app: &TestApp, run_id: &str) {
    let (status, answer) = app.submit(&submission(run_id)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
}

on_both_stores!(
    a_held_create_holds_back_no_deferred_create_behind_it,
    twelve_runs_of_three_users_fit_a_small_limit_and_none_is_lost,
    a_told_limit_is_kept_and_creates_come_first,
    a_burst_to_one_webhook_keeps_to_its_bucket,
    a_window_that_ended_quietly_holds_back_no_pass
);
