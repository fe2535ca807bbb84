//! Fair share through the local stack, on both stores: a user's builds in flight per queue
//! are capped (`USER_MAX_IN_FLIGHT`) and a queue's at its GPUs and a few queued, the rest
//! wait in the store and start, the user with the fewest in flight first, as builds of the
//! queue end; cancel and the queue deadline reach waiting jobs; each
//! job's place and expected start show in the API and in its message.

use std::time::Duration;

use kernelbot_dispatch::devstack::buildkite::sample_result;
use kernelbot_dispatch::devstack::discord::DiscordCall;
use kernelbot_dispatch::jobs::{CacheEntry, JobState};
use kernelbot_dispatch::result::Verdict;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{StoreKind, TestApp, submission};

/// `run_id` from `user`.
fn from(user: &str, run_id: &str) -> Value {
    let mut body = submission(run_id);
    body["user"] = user.into();
    body
}

async fn submit(app: &TestApp, user: &str, run_id: &str) -> Value {
    let (status, answer) = app.submit(&from(user, run_id)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    answer
}

/// The run ids of the builds created so far, in the order Buildkite got them.
fn built(app: &TestApp) -> Vec<String> {
    app.buildkite
        .builds()
        .iter()
        .map(|b| b.meta_data.get("run_id").cloned().unwrap_or_default())
        .collect()
}

/// The verdict `run_id` ended with, once it has.
async fn verdict(app: &TestApp, run_id: &str) -> Option<Verdict> {
    let job = app.job(run_id).await;
    job.state
        .is_terminal()
        .then(|| job.outcome.map(|o| o.verdict))
        .flatten()
}

async fn build_of(app: &TestApp, run_id: &str) -> u64 {
    app.job(run_id).await.build.expect("a build").number
}

/// The current text of `run_id`'s Discord message (by the message id its job keeps).
async fn message_of(app: &TestApp, run_id: &str) -> String {
    let job = app.job(run_id).await;
    let id = job.discord.and_then(|o| o.message_id).expect("a message");
    app.discord.messages()[&id]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Another instance takes queue h100's lease for 5 s (its entry's `version` from the
/// version before) and stops there; until when it holds it.
async fn hold_lease(app: &TestApp, version: impl Fn(Option<i64>) -> i64) -> i64 {
    let lease = "~fair/h100";
    let until = app.clock.now() + 5_000;
    let before = app.store.cached(lease).await.unwrap().map(|e| e.version);
    let held = CacheEntry {
        value: Some(json!({ "until": until }).to_string()),
        fetched_at: 0,
        claimed_at: 7,
        version: version(before),
        expires_at: None,
    };
    assert!(app.store.put_cached(lease, &held, before).await.unwrap());
    until
}

/// A user's third submission waits while two of theirs have builds, and gets its build when
/// one of them ends; another user is not held back by them.
async fn a_third_submission_waits_while_two_run(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    for run_id in ["a1", "a2"] {
        let answer = submit(&app, "alice", run_id).await;
        assert_eq!(answer["state"], "scheduled", "{answer}");
    }
    let third = submit(&app, "alice", "a3").await;
    assert_eq!(third["state"], "submitted", "{third}");
    assert_eq!(third["waiting"], "user_limit", "{third}");
    let bob = submit(&app, "bob", "b1").await;
    assert_eq!(
        bob["state"], "scheduled",
        "another user is not held back: {bob}"
    );
    assert_eq!(built(&app), ["a1", "a2", "b1"]);
    let (_, shown) = app.status("a3").await;
    assert_eq!(shown["waiting"], "user_limit", "{shown}");
    assert_eq!(
        shown["queue_position"], 4,
        "behind the three builds: {shown}"
    );
    let text = message_of(&app, "a3").await;
    assert!(text.contains("Waiting for its turn"), "{text}");
    // One of alice's ends: her third gets its build at once, from the webhook.
    let a1 = build_of(&app, "a1").await;
    app.finish(a1, "passed", Some(sample_result(false))).await;
    assert_eq!(built(&app), ["a1", "a2", "b1", "a3"]);
    let job = app.job("a3").await;
    assert_eq!((job.state, job.waiting), (JobState::Scheduled, false));
    let text = message_of(&app, "a3").await;
    assert!(
        text.contains("Queued on `h100`"),
        "its message was edited: {text}"
    );
}

/// Waiting jobs of several users get their builds round-robin over users, oldest first
/// within a user, not in the order they came.
async fn waiting_jobs_start_round_robin_over_users(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    submit(&app, "zed", "z1").await;
    // While another instance holds the queue's lease, submissions wait (as when two arrive
    // at once); the lease here is held past the submits' patience.
    let held = CacheEntry {
        value: Some(i64::MAX.to_string()),
        fetched_at: 0,
        claimed_at: 99,
        version: 99,
        expires_at: None,
    };
    let lease = "~fair/h100";
    let before = app.store.cached(lease).await.unwrap().map(|e| e.version);
    assert!(app.store.put_cached(lease, &held, before).await.unwrap());
    for (user, run_id) in [
        ("alice", "a1"),
        ("alice", "a2"),
        ("bob", "b1"),
        ("carol", "c1"),
    ] {
        let answer = submit(&app, user, run_id).await;
        assert_eq!(answer["waiting"], "user_limit", "{answer}");
    }
    let asked = app.store.cached(lease).await.unwrap().expect("the lease");
    assert!(
        asked.version != 99,
        "each waiting submission asked the holder to release again: {asked:?}"
    );
    let free = CacheEntry {
        value: None,
        fetched_at: 0,
        claimed_at: 100,
        version: asked.version + 1,
        expires_at: None,
    };
    let freed = app.store.put_cached(lease, &free, Some(asked.version));
    assert!(freed.await.unwrap());
    // A build of the queue ends: every waiting job with a slot is created, fairly ordered.
    let z1 = build_of(&app, "z1").await;
    app.finish(z1, "passed", Some(sample_result(false))).await;
    assert_eq!(built(&app), ["z1", "a1", "b1", "c1", "a2"]);
}

/// Two builds ending at once (two webhook instances) create each waiting job once.
async fn two_finishes_at_once_create_each_waiting_job_once(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("USER_MAX_IN_FLIGHT", "1")]).await;
    for (user, run_id) in [
        ("alice", "a1"),
        ("alice", "a2"),
        ("bob", "b1"),
        ("bob", "b2"),
    ] {
        submit(&app, user, run_id).await;
    }
    assert_eq!(built(&app), ["a1", "b1"]);
    let (a1, b1) = (build_of(&app, "a1").await, build_of(&app, "b1").await);
    app.buildkite
        .upload(a1, "result.json", sample_result(false), "finished", false);
    app.buildkite
        .upload(b1, "result.json", sample_result(false), "finished", false);
    app.buildkite.set_state(a1, "passed");
    app.buildkite.set_state(b1, "passed");
    // Each finish twice, all four at once.
    let (w, x, y, z) = tokio::join!(
        app.event("build.finished", a1),
        app.event("build.finished", b1),
        app.event("build.finished", a1),
        app.event("build.finished", b1),
    );
    assert!([w, x, y, z].iter().all(|s| s.is_success()));
    let mut made = built(&app);
    made.sort();
    assert_eq!(
        made,
        ["a1", "a2", "b1", "b2"],
        "each waiting job built once"
    );
    // A sweep pass finds nothing more to create.
    app.sweep().await;
    assert_eq!(app.buildkite.builds().len(), 4);
}

/// Cancel ends a waiting job, which then never gets a build; the queue deadline ends one
/// that waited too long, saying why.
async fn cancel_and_the_queue_deadline_reach_waiting_jobs(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("USER_MAX_IN_FLIGHT", "1")]).await;
    for run_id in ["a1", "a2", "a3"] {
        submit(&app, "alice", run_id).await;
    }
    let (status, answer) = app.cancel("a2").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let a2 = app.job("a2").await;
    assert!(a2.state.is_terminal(), "{:?}", a2.state);
    let record = app.store.cached("~queue/h100").await.expect("readable");
    assert!(
        record.is_none(),
        "a waiting job's cancel ends no run on the queue's record: {record:?}"
    );
    assert!(app.job("a3").await.waiting, "nor frees a slot");
    // Past the queue deadline (15 min by default), a sweep ends the one still waiting.
    app.advance_clock(Duration::from_secs(16 * 60));
    app.sweep().await;
    let a3 = app.job("a3").await;
    assert_eq!(a3.state, JobState::Failed, "{a3:?}");
    assert!(
        a3.failure
            .as_deref()
            .unwrap()
            .contains("waited for its turn"),
        "{a3:?}"
    );
    assert_eq!(built(&app), ["a1"], "neither got a build");
}

/// A canceled job that held its user's slot lets the next one go: at once when it had no
/// build yet (its create had failed), and when its canceled build's `build.finished` comes
/// when it had one.
async fn a_cancel_of_a_job_holding_a_slot_releases_the_next_one(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("USER_MAX_IN_FLIGHT", "1")]).await;
    // Buildkite unavailable for a1's create: released, deferred, no build.
    app.buildkite.fail_creates(&[(503, false)], 30);
    submit(&app, "alice", "a1").await;
    submit(&app, "alice", "a2").await;
    submit(&app, "alice", "a3").await;
    let a1 = app.job("a1").await;
    assert!(
        !a1.waiting && a1.build.is_none(),
        "a1 holds the slot: {a1:?}"
    );
    assert!(app.job("a2").await.waiting, "a2 waits behind it");
    let (status, answer) = app.cancel("a1").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(verdict(&app, "a1").await, Some(Verdict::Canceled));
    assert_eq!(built(&app), ["a2"], "a1's slot went to a2 at once");
    assert!(app.job("a3").await.waiting, "one slot, one release");
    // a2 has a build: its cancel ends it when Buildkite says the build was canceled.
    let (status, answer) = app.cancel("a2").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert!(app.job("a3").await.waiting, "a2 still holds its slot");
    let a2 = build_of(&app, "a2").await;
    assert_eq!(
        app.buildkite.build(a2).expect("a2's build").state,
        "canceled"
    );
    assert_eq!(app.event("build.finished", a2).await, StatusCode::OK);
    assert_eq!(verdict(&app, "a2").await, Some(Verdict::Canceled));
    assert_eq!(built(&app), ["a2", "a3"], "then a3");
}

/// A queue has no more builds at once than its GPUs and a few queued (2 beyond one GPU):
/// past that a submission waits whatever its user's share, and the next GPU that frees goes
/// to the user with the fewest builds on the queue, not to the one who waited longest.
async fn a_queue_s_builds_stop_at_its_gpus_and_a_few_queued(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.buildkite
        .set_agents(&[("h100-gpu0", "h100", "connected", false)]);
    for run_id in ["a1", "a2", "a3"] {
        submit(&app, "alice", run_id).await;
    }
    assert!(app.job("a3").await.waiting, "alice's share is two");
    submit(&app, "bob", "b1").await;
    assert_eq!(built(&app), ["a1", "a2", "b1"], "one GPU, two queued");
    let carol = submit(&app, "carol", "c1").await;
    assert_eq!(carol["waiting"], "user_limit", "the queue is full: {carol}");
    submit(&app, "bob", "b2").await;
    assert_eq!(
        built(&app).len(),
        3,
        "nothing more while all three are open"
    );
    let a1 = build_of(&app, "a1").await;
    app.buildkite.start_eval(a1);
    app.finish(a1, "passed", Some(sample_result(false))).await;
    assert_eq!(
        built(&app),
        ["a1", "a2", "b1", "c1"],
        "carol, with nothing on the queue, before alice and bob, who waited longer"
    );
    for run_id in ["a3", "b2"] {
        assert!(app.job(run_id).await.waiting, "{run_id} waits its turn");
    }
}

/// A release asked while another instance holds the queue's lease is not lost: the caller
/// marks the lease with the job that just ended and answers without waiting for it; a
/// holder that never lets go leaves the mark, and whoever takes the lease next releases for
/// it. (A holder that lets go releases again first: `two_finishes_at_once_...` meets it.)
async fn a_lease_contender_s_release_is_not_lost(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("USER_MAX_IN_FLIGHT", "1")]).await;
    submit(&app, "alice", "a1").await;
    submit(&app, "alice", "a2").await;
    assert_eq!(built(&app), ["a1"], "a2 waits");
    // Another instance takes the queue's lease, and stops there.
    let lease = "~fair/h100";
    let until = hold_lease(&app, |_| 7).await;
    let a1 = build_of(&app, "a1").await;
    let status = app.finish(a1, "passed", Some(sample_result(false))).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        app.job("a2").await.waiting,
        "the holder releases, not the caller"
    );
    let value = |e: Option<CacheEntry>| -> Value {
        serde_json::from_str(e.and_then(|e| e.value).as_deref().unwrap_or("null")).unwrap()
    };
    let marked = value(app.store.cached(lease).await.unwrap());
    assert_eq!(
        (&marked["until"], &marked["asked"], &marked["knew"]["ended"]),
        (&json!(until), &json!(true), &json!(["a1"])),
        "asked, with the job that ended: {marked}"
    );
    // The holder's time passes without its letting go: the next to take the lease (a
    // submission of another user) releases for the mark, a2 included.
    app.advance_clock(Duration::from_secs(6));
    submit(&app, "bob", "b1").await;
    let mut made = built(&app);
    made.sort();
    assert_eq!(made, ["a1", "a2", "b1"], "a2's slot was not lost");
    let after = value(app.store.cached(lease).await.unwrap());
    assert_eq!(
        after["asked"],
        json!(false),
        "the mark was taken up: {after}"
    );
}

/// The queue's lease is taken and let go from its entry as this instance last saw it: a run
/// of submissions to one instance reads it once; a holder elsewhere still turns the next
/// take into an ask, decided on the holder's entry, which the refusal brought (no read).
async fn an_instance_takes_the_lease_from_the_entry_it_last_saw(kind: StoreKind) {
    let (app, counted) = TestApp::spawn_counted(kind, &[("USER_MAX_IN_FLIGHT", "1")]).await;
    let lease_reads = || {
        let by_kind = counted.units_by_kind();
        let reads = by_kind.iter().find(|(k, _)| k == "read ~fair");
        reads.map_or(0, |(_, u)| u.calls)
    };
    for run_id in ["a1", "a2", "a3", "a4"] {
        submit(&app, "alice", run_id).await;
    }
    assert_eq!(built(&app), ["a1"], "the others wait");
    assert_eq!(
        lease_reads(),
        1,
        "read once, then taken from the entry left"
    );

    // Another instance takes the lease, and holds it.
    let lease = "~fair/h100";
    let until = hold_lease(&app, |before| before.unwrap_or(0) + 1).await;
    submit(&app, "bob", "b1").await;
    let entry = app.store.cached(lease).await.unwrap();
    let marked: Value = serde_json::from_str(entry.and_then(|e| e.value).as_deref().unwrap())
        .expect("the lease's value");
    assert_eq!(
        (&marked["until"], &marked["asked"], &marked["knew"]["new"]),
        (&json!(until), &json!(true), &json!(["b1"])),
        "the holder is asked, with the new job: {marked}"
    );
    assert_eq!(lease_reads(), 1, "the refusal brought the holder's entry");
}

/// At most `USER_MAX_WAITING` of a user's jobs wait on a queue: the next is refused with
/// 429 and `Retry-After`, and nothing of it is recorded; a retry of one already recorded is
/// answered as before, another user is not held back, and once one of the user's jobs
/// starts the user may submit again.
async fn a_user_past_the_waiting_limit_is_refused_and_no_one_else(kind: StoreKind) {
    let vars = [("USER_MAX_IN_FLIGHT", "1"), ("USER_MAX_WAITING", "2")];
    let app = TestApp::spawn_with(kind, &vars).await;
    for run_id in ["a1", "a2", "a3"] {
        submit(&app, "alice", run_id).await;
    }
    let refused = app
        .client
        .post(format!("{}/submissions", app.submit_url))
        .bearer_auth(crate::support::API_TOKEN)
        .json(&from("alice", "a4"))
        .send()
        .await
        .expect("the submit API answers");
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after = refused.headers()[reqwest::header::RETRY_AFTER]
        .to_str()
        .unwrap();
    assert_eq!(retry_after, "60", "no run times yet: a minute");
    let body: Value = refused.json().await.expect("a JSON error");
    assert_eq!(body["error"], "rate_limited", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("2 submissions waiting"), "{body}");
    let (status, _) = app.status("a4").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing of a4 recorded");
    let (status, again) = app.submit(&from("alice", "a2")).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a retry of a2 is answered as before: {again}"
    );
    assert_eq!(again["run_id"], "a2", "{again}");
    submit(&app, "bob", "b1").await;
    let a1 = build_of(&app, "a1").await;
    app.buildkite.start_eval(a1);
    app.finish(a1, "passed", Some(sample_result(false))).await;
    assert!(!app.job("a2").await.waiting, "a2 took a1's slot");
    let answer = submit(&app, "alice", "a4").await;
    assert_eq!(answer["waiting"], "user_limit", "a4 waits now: {answer}");
}

/// With run times to go by, the place and the expected start show in the API and in the
/// first message, in Discord's self-updating time markup.
async fn the_place_and_expected_start_show_in_the_api_and_the_message(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("USER_MAX_IN_FLIGHT", "1")]).await;
    submit(&app, "zed", "z1").await;
    let z1 = build_of(&app, "z1").await;
    app.buildkite.start_eval(z1);
    app.advance_clock(Duration::from_secs(40));
    app.finish(z1, "passed", Some(sample_result(false))).await;
    submit(&app, "alice", "a1").await;
    let waiting = submit(&app, "alice", "a2").await;
    assert_eq!(waiting["queue_position"], 2, "{waiting}");
    let expected = waiting["expected_start"]
        .as_str()
        .expect("an expected start");
    let at = |text: &str| {
        let t = humantime::parse_rfc3339_weak(text).unwrap();
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
    };
    let (_, shown) = app.status("a2").await;
    assert_eq!(shown["queue_position"], 2, "{shown}");
    // Computed afresh: the same within the moments between the two reads.
    let now_expected = at(shown["expected_start"].as_str().expect("an expected start"));
    assert!(
        (now_expected - at(expected)).abs() < 5_000,
        "{shown} vs {expected}"
    );
    // One run of 40 s ahead of it on a queue of one agent.
    let submitted = at(shown["created_at"].as_str().unwrap());
    assert!(
        (at(expected) - submitted - 40_000).abs() < 5_000,
        "{expected} vs {shown}"
    );
    let secs = at(expected) / 1000;
    let text = message_of(&app, "a2").await;
    assert!(
        text.contains(&format!("2nd in line, expected to start <t:{secs}:R>")),
        "{text}"
    );
    let (_, running) = app.status("z1").await;
    assert!(
        running.get("queue_position").is_none(),
        "an ended job has no place: {running}"
    );
}

/// A build whose `build.finished` never came: the sweep pass that ends its job lets the
/// user's waiting job go in that same pass (the pass released nothing when it began, while
/// both builds were open).
async fn a_job_the_sweep_ends_lets_a_waiting_one_go_in_the_same_pass(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    for run_id in ["a1", "a2", "a3"] {
        submit(&app, "alice", run_id).await;
    }
    assert_eq!(built(&app), ["a1", "a2"]);
    let a1 = build_of(&app, "a1").await;
    let buildkite = &app.buildkite;
    buildkite.upload(a1, "result.json", sample_result(false), "finished", false);
    buildkite.set_state(a1, "passed");
    // Past the age the sweep leaves to webhooks, within the queue deadline of the one waiting.
    app.advance_clock(Duration::from_secs(11 * 60));
    app.sweep().await;
    assert_eq!(app.job("a1").await.state, JobState::Finished);
    assert_eq!(built(&app), ["a1", "a2", "a3"]);
    let job = app.job("a3").await;
    assert_eq!((job.state, job.waiting), (JobState::Scheduled, false));
}

/// GPUs that came up while a user's jobs waited take them at the next sweep pass, though
/// the agents list the pass finds is minutes old: the release reads it again and goes on.
async fn idle_gpus_take_waiting_jobs_though_the_list_was_old(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let gpu = |name| (name, "h100", "connected", false);
    app.buildkite
        .set_agents(&[gpu("h100-gpu0"), gpu("h100-gpu1")]);
    for run_id in ["a1", "a2", "a3", "a4"] {
        submit(&app, "alice", run_id).await;
    }
    assert_eq!(built(&app), ["a1", "a2"], "two GPUs, both taken");
    let four = ["h100-gpu0", "h100-gpu1", "h100-gpu2", "h100-gpu3"];
    app.buildkite.set_agents(&four.map(gpu));
    app.advance_clock(Duration::from_secs(5 * 60));
    app.sweep().await;
    let mut all = built(&app);
    all.sort();
    assert_eq!(all, ["a1", "a2", "a3", "a4"], "the two new GPUs filled");
    for run_id in ["a3", "a4"] {
        assert!(!app.job(run_id).await.waiting, "{run_id} released");
    }
}

/// A second Discord webhook, with a bucket of its own.
const OTHER_ID: &str = "222222222222222222";
const OTHER_URL: &str = "https://discord.com/api/webhooks/222222222222222222/hook-token_2";

/// A waiting job whose place moved while its webhook's bucket had no room is read once, to
/// learn which bucket that is, then passed by unread at every end while the bucket stays
/// full; once the bucket has room again, the next end shows the places that moved.
async fn a_place_a_full_bucket_cannot_show_is_not_read_at_every_end(kind: StoreKind) {
    let (app, counted) = TestApp::spawn_counted(kind, &[("USER_MAX_IN_FLIGHT", "1")]).await;
    // Bob's runs end one after another; Ann's wait behind her first (which never ends), and
    // their messages go to the second webhook.
    for i in 0..4 {
        submit(&app, "bob", &format!("bob-{i}")).await;
    }
    let ann: Vec<String> = (0..8).map(|i| format!("ann-{i}")).collect();
    for run_id in &ann {
        let mut body = from("ann", run_id);
        body["discord"] = json!({ "webhook_url": OTHER_URL });
        let (status, answer) = app.submit(&body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    }
    // The webhook function meets the second webhook's 429 (its bucket empty for 10 minutes).
    let first = build_of(&app, "ann-0").await;
    app.buildkite.start_eval(first);
    app.discord.rate_limit_next(1, 600.0);
    assert_eq!(app.event("job.started", first).await, StatusCode::OK);
    let told = app
        .discord_calls()
        .last()
        .map(|c| (c.status, c.webhook_id.clone()));
    assert_eq!(told, Some((429, OTHER_ID.to_owned())));

    // Reads of each waiting job of Ann's so far.
    let reads = || -> Vec<u64> { ann[1..].iter().map(|id| counted.reads_of(id)).collect() };
    let since = |before: &[u64]| -> Vec<u64> {
        reads()
            .iter()
            .zip(before)
            .map(|(now, then)| now - then)
            .collect()
    };
    let edits = || {
        let calls = app.discord_calls();
        let to_other = |c: &&DiscordCall| c.webhook_id == OTHER_ID && c.method == "PATCH";
        calls
            .iter()
            .filter(to_other)
            .filter(|c| c.status == 200)
            .count()
    };
    let end = |n: usize| {
        let app = &app;
        async move {
            let build = build_of(app, &format!("bob-{n}")).await;
            let ended = app
                .finish(build, "passed", Some(sample_result(false)))
                .await;
            assert_eq!(ended, StatusCode::OK, "bob-{n}");
        }
    };
    let (before, shown) = (reads(), edits());
    end(0).await;
    let learned = since(&before);
    assert!(
        learned.iter().any(|&n| n > 0),
        "the places that moved were read"
    );
    // Those still show their old place (so the index shows them moved at every end).
    end(1).await;
    end(2).await;
    let three_ends = since(&before);
    assert!(
        three_ends.iter().all(|&n| n <= 1),
        "each read once at most while the bucket is full: {three_ends:?}"
    );
    assert_eq!(edits(), shown, "no place shown without room");

    app.advance_clock(Duration::from_secs(601));
    end(3).await;
    let read_again = since(&before)
        .iter()
        .zip(&three_ends)
        .any(|(n, then)| n > then);
    assert!(read_again, "read again once the bucket has room");
    assert!(edits() > shown, "and the places that moved shown");
}

/// A re-evaluation for the operators, run only on GPUs nobody else wants.
fn background(run_id: &str) -> Value {
    let mut body = submission(run_id);
    body["priority"] = "background".into();
    body
}

/// The queue's agents as the agents API lists them next: `busy` says which work.
fn agents(app: &TestApp, busy: [bool; 2]) {
    let gpus = [("h100-gpu0", busy[0]), ("h100-gpu1", busy[1])];
    app.buildkite
        .set_agents(&gpus.map(|(name, busy)| (name, "h100", "connected", busy)));
    // Past the list's refresh age, so the next release reads it.
    app.advance_clock(Duration::from_secs(60));
}

async fn end(app: &TestApp, run_id: &str) {
    let number = build_of(app, run_id).await;
    app.buildkite.start_eval(number);
    app.finish(number, "passed", Some(sample_result(false)))
        .await;
}

/// A background job takes a GPU only when one is idle and no other job waits: while a
/// user's job waits its turn the background one waits too, and it starts once an agent is
/// idle with nothing else waiting. The API and `GET /queues/{gpu}` say it is background.
async fn a_background_job_runs_only_on_a_gpu_nobody_else_wants(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    agents(&app, [false, false]);
    let (status, z1) = app.submit(&background("z1")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(
        z1["build"]["number"], 1,
        "two idle GPUs, nothing else waiting: {z1}"
    );
    submit(&app, "alice", "a1").await;
    agents(&app, [true, true]);
    let (_, z2) = app.submit(&background("z2")).await;
    assert_eq!(z2["waiting"], "background", "no idle GPU: {z2}");
    for run_id in ["a2", "a3"] {
        submit(&app, "alice", run_id).await;
    }
    assert_eq!(
        built(&app),
        ["z1", "a1", "a2"],
        "a3 waits for alice's share"
    );
    let queue = app
        .client
        .get(format!("{}/queues/H100_BK", app.submit_url))
        .bearer_auth(crate::support::API_TOKEN)
        .send()
        .await
        .expect("the submit API answers");
    let queue: Value = queue.json().await.expect("JSON");
    assert_eq!(queue["jobs"]["background"], 1, "{queue}");
    // z1 ends with one GPU idle: a1 and a2 hold both, nothing goes.
    agents(&app, [false, true]);
    end(&app, "z1").await;
    assert_eq!(built(&app), ["z1", "a1", "a2"]);
    // a1 ends: alice's a3 goes, not the older background job.
    agents(&app, [false, true]);
    end(&app, "a1").await;
    assert_eq!(built(&app), ["z1", "a1", "a2", "a3"]);
    assert!(app.job("z2").await.waiting, "z2 waits while a3 waited");
    // a2 ends with both GPUs idle and nothing else waiting: z2 takes the spare one.
    agents(&app, [false, false]);
    end(&app, "a2").await;
    assert_eq!(built(&app), ["z1", "a1", "a2", "a3", "z2"]);
    let (_, shown) = app.status("z2").await;
    assert_eq!(shown.get("waiting"), None, "{shown}");
}

/// A background job waits for an idle GPU past the queue deadline (it is not a user's run
/// held back), until the job's maximum age ends it saying why.
async fn a_background_job_waits_past_the_queue_deadline(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    agents(&app, [true, true]);
    app.submit(&background("z1")).await;
    app.advance_clock(Duration::from_secs(20 * 60));
    app.sweep().await;
    let job = app.job("z1").await;
    assert_eq!(
        (job.state, job.waiting),
        (JobState::Submitted, true),
        "{job:?}"
    );
    app.advance_clock(Duration::from_secs(6 * 3600));
    app.sweep().await;
    let job = app.job("z1").await;
    assert_eq!(job.state, JobState::Failed);
    let failure = job.failure.unwrap_or_default();
    assert!(
        failure.contains("background job") && failure.contains("maximum age"),
        "{failure}"
    );
    assert!(built(&app).is_empty());
}

on_both_stores!(
    an_instance_takes_the_lease_from_the_entry_it_last_saw,
    a_background_job_waits_past_the_queue_deadline,
    a_background_job_runs_only_on_a_gpu_nobody_else_wants,
    a_place_a_full_bucket_cannot_show_is_not_read_at_every_end,
    idle_gpus_take_waiting_jobs_though_the_list_was_old,
    a_job_the_sweep_ends_lets_a_waiting_one_go_in_the_same_pass,
    a_third_submission_waits_while_two_run,
    a_queue_s_builds_stop_at_its_gpus_and_a_few_queued,
    waiting_jobs_start_round_robin_over_users,
    two_finishes_at_once_create_each_waiting_job_once,
    cancel_and_the_queue_deadline_reach_waiting_jobs,
    a_cancel_of_a_job_holding_a_slot_releases_the_next_one,
    a_lease_contender_s_release_is_not_lost,
    a_user_past_the_waiting_limit_is_refused_and_no_one_else,
    the_place_and_expected_start_show_in_the_api_and_the_message,
);
