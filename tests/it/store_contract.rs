//! One contract, two stores: the embedded SQLite file and DynamoDB (on a moto server, with
//! the table built from `template.yaml`).

use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue;
use kernelbot_dispatch::devstack::moto;
use kernelbot_dispatch::devstack::units::CountingStore;
use serde_json::json;

use crate::support::{StoreKind, inflated_result, open_store};
use kernelbot_dispatch::jobs::{
    BuildRef, CacheEntry, CallbackOutbox, Created, Creation, Cursor, DeliveryStatus, DynamoStore,
    Job, JobState, JobStore, Listed, Listing, OpenJob, Queue, Replaced, RunId, Shard, SharedKey,
    SqliteStore, StoreError, Target, Transition, Updated, View, WebhookAddress, next_version,
    shared, update, update_from, update_seen,
};
use kernelbot_dispatch::result::{EvalResult, FullResult, Outcome, RunResult};

fn job(id: &str, created_at: i64) -> Job {
    let discord = Target::Webhook(WebhookAddress {
        webhook_id: "1".into(),
        token: "secret-token".into(),
        thread_id: Some("42".into()),
    });
    Job::new(
        id.parse().unwrap(),
        "H100_BK".into(),
        "h100".into(),
        Some("t".into()),
        Some(discord),
        created_at,
    )
}

/// A transition through the store's compare-and-swap: the job after it, if it moved.
async fn advance(
    store: &dyn JobStore,
    run_id: &RunId,
    t: &Transition,
) -> Result<Option<Job>, StoreError> {
    Ok(match update(store, run_id, |j| j.apply(t)).await? {
        Updated::Written(j) => Some(j),
        _ => None,
    })
}

fn id(s: &str) -> RunId {
    s.parse().unwrap()
}

fn build() -> BuildRef {
    BuildRef {
        id: "b-1".into(),
        number: 7,
        web_url: "https://buildkite.com/o/p/builds/7".into(),
    }
}

async fn create_is_idempotent_per_run_id(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    let j = job("c1", 1_000);
    assert_eq!(store.create(&j).await.unwrap(), Created::New);
    let mut other = job("c1", 2_000);
    other.gpu = "B200_BK".into();
    match store.create(&other).await.unwrap() {
        Created::Existing(existing) => assert_eq!(*existing, j, "the first job is kept unchanged"),
        Created::New => panic!("a second job with the same run id was created"),
    }
    assert_eq!(store.get(&id("c1")).await.unwrap(), Some(j));
    assert_eq!(store.get(&id("missing")).await.unwrap(), None);
}

async fn advance_only_moves_forward(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    store.create(&job("a1", 1_000)).await.unwrap();
    let scheduled = advance(
        store.as_ref(),
        &id("a1"),
        &Transition::to(JobState::Scheduled, 2_000).with_build(build()),
    )
    .await
    .unwrap()
    .expect("forward");
    assert_eq!(
        (
            scheduled.state,
            scheduled.build.clone(),
            scheduled.updated_at
        ),
        (JobState::Scheduled, Some(build()), 2_000)
    );
    assert!(
        advance(
            store.as_ref(),
            &id("a1"),
            &Transition::to(JobState::Scheduled, 3_000)
        )
        .await
        .unwrap()
        .is_none()
    );
    assert!(
        advance(
            store.as_ref(),
            &id("a1"),
            &Transition::to(JobState::Submitted, 3_000)
        )
        .await
        .unwrap()
        .is_none()
    );
    let outcome = Outcome::judge(
        "passed",
        Some(FullResult {
            success: true,
            ..Default::default()
        }),
        None,
    );
    let finished = advance(
        store.as_ref(),
        &id("a1"),
        &Transition::to(JobState::Finished, 4_000).with_outcome(outcome.clone()),
    )
    .await
    .unwrap()
    .expect("forward");
    assert_eq!(finished.outcome.as_deref(), Some(&outcome));
    assert!(
        advance(
            store.as_ref(),
            &id("a1"),
            &Transition::to(JobState::Failed, 5_000)
        )
        .await
        .unwrap()
        .is_none()
    );
    let stored = store.get(&id("a1")).await.unwrap().unwrap();
    assert_eq!(stored, finished);
    assert!(
        advance(
            store.as_ref(),
            &id("nobody"),
            &Transition::to(JobState::Running, 1)
        )
        .await
        .unwrap()
        .is_none()
    );
}

async fn concurrent_advances_have_exactly_one_winner(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    store.create(&job("race", 1_000)).await.unwrap();
    let tries = (0..8).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            advance(
                store.as_ref(),
                &id("race"),
                &Transition::to(JobState::Finished, 2_000 + i),
            )
            .await
        })
    });
    let mut winners = 0;
    for t in tries {
        if t.await.unwrap().unwrap().is_some() {
            winners += 1;
        }
    }
    assert_eq!(winners, 1);
}

async fn large_results_survive_the_round_trip(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    store.create(&job("big", 1_000)).await.unwrap();
    let mut result = FullResult {
        success: true,
        ..Default::default()
    };
    for name in ["test", "benchmark", "leaderboard"] {
        let run = RunResult {
            stdout: "line of benchmark output\n".repeat(600),
            ..Default::default()
        };
        result.runs.insert(
            name.into(),
            EvalResult {
                run: Some(run),
                ..Default::default()
            },
        );
    }
    let outcome = Outcome::judge("passed", Some(result), None);
    advance(
        store.as_ref(),
        &id("big"),
        &Transition::to(JobState::Finished, 2_000).with_outcome(outcome.clone()),
    )
    .await
    .unwrap();
    let stored = store.get(&id("big")).await.unwrap().unwrap();
    assert_eq!(stored.outcome.as_deref(), Some(&outcome));
}

/// An outcome too large to keep whole is cut before it is written, so the job a writer goes
/// on with (to report it) is the job a resend later reads back.
async fn cut_outcomes_are_reported_as_stored(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    store.create(&job("cut", 1_000)).await.unwrap();
    let mut rng = fastrand::Rng::with_seed(9);
    let noise: String = (0..400_000).map(|_| rng.alphanumeric()).collect();
    let run = RunResult {
        stdout: noise,
        ..Default::default()
    };
    let mut result = FullResult {
        success: true,
        ..Default::default()
    };
    result.runs.insert(
        "test".into(),
        EvalResult {
            run: Some(run),
            ..Default::default()
        },
    );
    let t = Transition::to(JobState::Finished, 2_000).with_outcome(Outcome::judge(
        "passed",
        Some(result),
        None,
    ));
    let written = advance(store.as_ref(), &id("cut"), &t)
        .await
        .unwrap()
        .expect("written");
    let stored = store.get(&id("cut")).await.unwrap().unwrap();
    assert_eq!(written.outcome, stored.outcome);
    let kept = stored
        .outcome
        .and_then(|o| o.result.clone())
        .expect("result kept");
    assert!(
        kept.runs["test"]
            .run
            .as_ref()
            .unwrap()
            .stdout
            .starts_with("[dropped")
    );
}

async fn stale_writes_lose_and_retried_writes_are_recognised(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    store.create(&job("d1", 1_000)).await.unwrap();
    let stored = store.get(&id("d1")).await.unwrap().unwrap();
    let mut next = stored.clone();
    next.version = stored.version + 1;
    next.discord.as_mut().unwrap().message_id = Some("m-1".into());
    assert_eq!(
        store.replace(&next, "w-1").await.unwrap(),
        Replaced::Written
    );
    // The same write again (an SDK retry whose first answer was lost) is recognised as ours.
    assert_eq!(
        store.replace(&next, "w-1").await.unwrap(),
        Replaced::Written
    );
    // Another writer computing from the old version loses, and learns the job as it is.
    let mut stale = stored.clone();
    stale.version = stored.version + 1;
    stale.discord.as_mut().unwrap().delivery.status = DeliveryStatus::Gone;
    match store.replace(&stale, "w-2").await.unwrap() {
        Replaced::Conflict(Some(now)) => assert_eq!(*now, next),
        other => panic!("a stale write must not win: {other:?}"),
    }
    let j = store.get(&id("d1")).await.unwrap().unwrap();
    assert_eq!(j, next);
    let outbox = j.discord.unwrap();
    let Some(Target::Webhook(hook)) = outbox.target else {
        panic!("the named webhook: {:?}", outbox.target);
    };
    assert_eq!(hook.thread_id.as_deref(), Some("42"));
    let mut ghost = job("nobody", 1);
    ghost.version = 1;
    assert_eq!(
        store.replace(&ghost, "w-3").await.unwrap(),
        Replaced::Conflict(None)
    );
}

/// Starting from a job as once seen saves a read, never a decision: a stale view's write is
/// refused and decided again on the stored job, and its "no change" is checked against a
/// fresh read.
async fn updates_from_a_stale_view_decide_on_the_stored_job(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    store.create(&job("s1", 1_000)).await.unwrap();
    let seen = store.get(&id("s1")).await.unwrap().unwrap();
    let running = Transition::to(JobState::Running, 2_000);
    assert!(
        advance(store.as_ref(), &id("s1"), &running)
            .await
            .unwrap()
            .is_some()
    );

    // A change that applies to the stale view: its write loses, and it is decided again.
    let mut saw = Vec::new();
    let written = update_seen(store.as_ref(), &seen, |j| {
        saw.push(j.state);
        let mut next = j.clone();
        next.queue = format!("{}+{}", j.queue, j.state).into();
        Some(next)
    })
    .await
    .unwrap();
    assert_eq!(saw, [JobState::Submitted, JobState::Running]);
    let Updated::Written(after) = written else {
        panic!("the change was not written: {written:?}");
    };
    assert_eq!(
        after.queue, "h100+running",
        "decided on the stored job, not the stale one"
    );
    assert_eq!(store.get(&id("s1")).await.unwrap(), Some(after.clone()));

    // A change the stale view declines but the stored job needs: read again, and written.
    let finished = Transition::to(JobState::Finished, 3_000);
    let declined = update_seen(store.as_ref(), &seen, |j| {
        (j.state == JobState::Running)
            .then(|| j.apply(&finished))
            .flatten()
    })
    .await
    .unwrap();
    assert!(
        matches!(&declined, Updated::Written(j) if j.state == JobState::Finished),
        "a stale 'no change' must be checked on a fresh read: {declined:?}"
    );

    // Seen as just written, the write goes through at once; a declined change is Unchanged.
    let Updated::Written(fresh) = declined else {
        unreachable!()
    };
    let again = update_seen(store.as_ref(), &fresh, |j| j.apply(&running))
        .await
        .unwrap();
    assert_eq!(again, Updated::Unchanged(fresh.clone()));

    // The caller's own view is trusted as a read would be: its "no change" is taken as it
    // stands (no read), though another writer has since moved the job; a change still goes
    // by the version check.
    let s1 = id("s1");
    let other = update(store.as_ref(), &s1, |j| {
        let mut next = j.clone();
        next.queue = "moved".into();
        Some(next)
    });
    let Updated::Written(later) = other.await.unwrap() else {
        panic!("another writer moved it");
    };
    let kept = update_from(store.as_ref(), &fresh, View::Own, |j| j.apply(&running))
        .await
        .unwrap();
    assert_eq!(kept, Updated::Unchanged(fresh.clone()), "no read was made");
    let mut saw = Vec::new();
    let moved = update_from(store.as_ref(), &fresh, View::Own, |j| {
        saw.push(j.state);
        let mut next = j.clone();
        next.queue = format!("{}!", j.queue).into();
        Some(next)
    })
    .await
    .unwrap();
    assert_eq!(
        saw,
        [JobState::Finished; 2],
        "decided again on the stored job"
    );
    assert!(
        matches!(&moved, Updated::Written(j) if j.queue == "moved!" && j.version == later.version + 1),
        "{moved:?}"
    );

    // A job that is gone is Missing, whatever the view said.
    let mut ghost = job("ghost", 1);
    ghost.version = 3;
    let gone = update_seen(store.as_ref(), &ghost, |j| j.apply(&running))
        .await
        .unwrap();
    assert_eq!(gone, Updated::Missing);
}

async fn oversize_records_are_refused_for_good(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    store.create(&job("huge", 1_000)).await.unwrap();
    let mut big = store.get(&id("huge")).await.unwrap().unwrap();
    big.version += 1;
    // A failure reason is not slimmed by the record: 500 KB of it cannot be stored.
    big.failure = Some("x".repeat(500 * 1024));
    assert!(matches!(
        store.replace(&big, "w").await,
        Err(StoreError::TooLarge)
    ));
}

async fn only_unfinished_jobs_are_listed_for_the_sweep(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    for (name, at) in [
        ("o3", 3_000),
        ("o1", 1_000),
        ("o2", 2_000),
        ("young", 9_000),
        ("done", 500),
    ] {
        store.create(&job(name, at)).await.unwrap();
    }
    advance(
        store.as_ref(),
        &id("o2"),
        &Transition::to(JobState::Running, 4_000),
    )
    .await
    .unwrap();
    advance(
        store.as_ref(),
        &id("done"),
        &Transition::to(JobState::Finished, 4_000),
    )
    .await
    .unwrap();
    let ids = |listed: Listing| -> Vec<String> {
        assert_eq!(listed.unreadable, 0);
        listed.jobs.iter().map(|j| j.run_id.to_string()).collect()
    };
    let open = store.list(Shard::Open, 0, 10).await.unwrap();
    assert_eq!(ids(open), ["o1", "o2", "o3", "young"]);
    let from = store.list(Shard::Open, 2_000, 10).await.unwrap();
    assert_eq!(ids(from), ["o2", "o3", "young"], "from a creation time on");
    assert_eq!(
        ids(store.list(Shard::Open, 0, 2).await.unwrap()),
        ["o1", "o2"]
    );
    // The finished job still owes its report: it waits in the outbox partition.
    let owing = store.list(Shard::Outbox, 0, 10).await.unwrap();
    assert_eq!(ids(owing), ["done"]);
}

/// A queue's open jobs as its index shows them: every field fair share and placing decide
/// on, as last written (the place a job's message showed included), and no ended job.
async fn a_queue_s_open_jobs_show_what_placing_decides_on(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    let mut waiting = job("waiting", 1_000);
    waiting.user = Some("alice".into());
    waiting.waiting = true;
    waiting.queue_position = Some(7);
    store.create(&waiting).await.unwrap();
    let mut built = job("built", 2_000);
    built.scheduled_at = Some(2_500);
    store.create(&built).await.unwrap();
    store.create(&job("ended", 500)).await.unwrap();
    advance(
        store.as_ref(),
        &id("ended"),
        &Transition::to(JobState::Finished, 3_000),
    )
    .await
    .unwrap();
    let mut open = store.open_in_queue("h100").await.unwrap();
    open.sort_by_key(|j| j.created_at);
    assert_eq!(
        open,
        [OpenJob::from(&waiting), OpenJob::from(&built)],
        "user, waiting, build time and place as written"
    );
    assert_eq!(open[0].queue_position, Some(7));
    assert_eq!(open[1].queue_position, None);
    assert!(store.open_in_queue("b200").await.unwrap().is_empty());
}

/// A listing shows everything the sweep decides on, and never a job's large parts (its
/// result, its build payload), so its size does not grow with what the jobs hold.
async fn a_listing_shows_a_job_without_its_large_parts(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    let mut waiting = job("waiting", 1_000);
    waiting.creation = Some(Creation {
        payload: "p".repeat(100_000),
        after: 1_500,
        look_up_first: true,
    });
    waiting.max_queue_secs = Some(60);
    store.create(&waiting).await.unwrap();
    let mut done = job("done", 2_000);
    done.callback = Some(CallbackOutbox::new(2_000));
    done.cancel_requested = true;
    store.create(&done).await.unwrap();
    let t = Transition::to(JobState::Finished, 3_000)
        .with_build(BuildRef {
            id: "b".into(),
            number: 7,
            web_url: "https://buildkite.com/o/p/builds/7".into(),
        })
        .with_outcome(Outcome::judge("passed", Some(inflated_result()), None));
    let done = advance(store.as_ref(), &id("done"), &t)
        .await
        .unwrap()
        .unwrap();
    assert!(
        done.outcome.as_ref().unwrap().result.is_some(),
        "stored whole"
    );
    let open = store.list(Shard::Open, 0, 10).await.unwrap();
    assert_eq!(open.jobs, [Listed::from(&waiting)]);
    let owing = store.list(Shard::Outbox, 0, 10).await.unwrap();
    assert_eq!(owing.jobs, [Listed::from(&done)]);
}

/// The builds' bookmark and the deliveries' are kept apart.
async fn each_bookmark_is_kept_on_its_own(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    assert_eq!(store.cursor(Cursor::Builds).await.unwrap(), None);
    store.set_cursor(Cursor::Builds, Some("b")).await.unwrap();
    store.set_cursor(Cursor::Outbox, Some("d")).await.unwrap();
    assert_eq!(
        store.cursor(Cursor::Builds).await.unwrap().as_deref(),
        Some("b")
    );
    store.set_cursor(Cursor::Builds, None).await.unwrap();
    assert_eq!(store.cursor(Cursor::Builds).await.unwrap(), None);
    assert_eq!(
        store.cursor(Cursor::Outbox).await.unwrap().as_deref(),
        Some("d")
    );
    assert!(store.list(Shard::Open, 0, 10).await.unwrap().is_empty());
}

/// Writers of one shared entry at once: every change lands (each loser decides again on what
/// the winner wrote), one write made the entry, an unchanged value is not written, and the
/// entry is kept under the key earlier versions used.
async fn concurrent_changes_to_a_shared_entry_all_land(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    let queue = Queue::new("h100");
    let key = SharedKey::Deferred(&queue);
    let writers = (0..6u32).map(|i| {
        let (store, queue) = (store.clone(), queue.clone());
        tokio::spawn(async move {
            let add = |v: &mut Vec<u32>| v.push(i);
            let key = SharedKey::Deferred(&queue);
            shared::update(store.as_ref(), key, 1_000, Vec::new, add).await
        })
    });
    let mut made = 0;
    for w in writers {
        let changed = w.await.unwrap().expect("six writers fit within the tries");
        assert!(changed.wrote.is_some(), "{changed:?}");
        made += usize::from(changed.wrote == Some(shared::First::Yes));
    }
    assert_eq!(made, 1, "one write made the entry");
    let (value, writes) = shared::read::<Vec<u32>>(store.as_ref(), key, 2_000)
        .await
        .unwrap();
    let mut value = value.expect("a value");
    value.sort_unstable();
    assert_eq!(value, [0, 1, 2, 3, 4, 5]);
    // The entry's first write counts from the time (1,000), each later one by one.
    assert_eq!(writes, Some(1_005));

    let count = |v: &mut Vec<u32>| v.len();
    let kept = shared::update(store.as_ref(), key, 2_000, Vec::new, count).await;
    assert_eq!(
        kept.unwrap(),
        shared::Changed {
            said: 6,
            wrote: None
        }
    );
    let (_, writes) = shared::read::<Vec<u32>>(store.as_ref(), key, 2_000)
        .await
        .unwrap();
    assert_eq!(
        writes,
        Some(1_005),
        "nothing written for an unchanged value"
    );
    assert!(store.cached("~deferred/h100").await.unwrap().is_some());
}

/// A shared entry lives as long as its kind's lifetime after its last write: past it, a
/// reader finds nothing (whether or not the store has forgotten it yet), the next write makes
/// the value anew, and the embedded store forgets it at the sweep's asking. DynamoDB keeps
/// the expiry in the table's TTL attribute in whole seconds, rounded up. The sweep's
/// bookmarks are never forgotten.
async fn an_expired_shared_entry_is_gone_and_forgotten(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    let key = SharedKey::Agent("node1-gpu0");
    let day = 24 * 60 * 60 * 1000;
    let add = |v: &mut Vec<u32>| v.push(1);
    let made = shared::update(store.as_ref(), key, 1_500, Vec::new, add).await;
    assert_eq!(made.unwrap().wrote, Some(shared::First::Yes));
    let entry = store
        .cached("~agent/node1-gpu0")
        .await
        .unwrap()
        .expect("kept");
    let expiry = match kind {
        StoreKind::Sqlite => 1_500 + 30 * day,
        StoreKind::Dynamo => 2_000 + 30 * day,
    };
    assert_eq!(entry.expires_at, Some(expiry));
    store.set_cursor(Cursor::Builds, Some("b")).await.unwrap();
    store.set_cursor(Cursor::Outbox, Some("123")).await.unwrap();

    let (value, _) = shared::read::<Vec<u32>>(store.as_ref(), key, expiry - 1)
        .await
        .unwrap();
    assert_eq!(value, Some(vec![1]), "alive until its expiry");
    let (value, writes) = shared::read::<Vec<u32>>(store.as_ref(), key, expiry)
        .await
        .unwrap();
    assert_eq!(
        (value, writes),
        (None, Some(1_500)),
        "gone, its count of writes kept"
    );

    let forgotten = store.forget_expired(expiry + 1).await.unwrap();
    let left = store.cached("~agent/node1-gpu0").await.unwrap();
    match kind {
        StoreKind::Sqlite => assert_eq!((forgotten, left), (1, None)),
        StoreKind::Dynamo => assert_eq!(forgotten, 0, "the table's TTL forgets it"),
    }
    let builds = store.cursor(Cursor::Builds).await.unwrap();
    assert_eq!(builds.as_deref(), Some("b"));
    let outbox = store.cursor(Cursor::Outbox).await.unwrap();
    assert_eq!(outbox.as_deref(), Some("123"));
    let again = shared::update(store.as_ref(), key, expiry + 2, Vec::new, add).await;
    assert_eq!(again.unwrap().wrote, Some(shared::First::Yes), "made anew");
    let (value, _) = shared::read::<Vec<u32>>(store.as_ref(), key, expiry + 2)
        .await
        .unwrap();
    assert_eq!(value, Some(vec![1]));
}

/// An entry written before entries had an expiry gets one at its next read-modify-write,
/// even when its value does not change.
async fn an_older_entry_gets_its_expiry_at_its_next_change(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    // No expiry, as written before entries had one (for an entry without a version, see
    // `an_entry_an_earlier_release_wrote_goes_on_from_its_claim`).
    let old = CacheEntry {
        value: Some("[1]".into()),
        fetched_at: 10,
        claimed_at: 3,
        version: 0,
        expires_at: None,
    };
    assert!(store.put_cached("~queue/h100", &old, None).await.unwrap());
    let queue = Queue::new("h100");
    let key = SharedKey::QueueRecord(&queue);
    let same = |v: &mut Vec<u32>| v.len();
    let changed = shared::update(store.as_ref(), key, 5_000, Vec::new, same).await;
    assert_eq!(changed.unwrap().wrote, Some(shared::First::No));
    let entry = store.cached("~queue/h100").await.unwrap().expect("kept");
    assert_eq!((entry.value.as_deref(), entry.version), (Some("[1]"), 1));
    assert!(entry.expires_at.is_some_and(|at| at > 5_000), "{entry:?}");
}

/// A store of `kind` with the entry under `key` as the release before versions wrote it:
/// a value, its fetch and claim times, no version and no expiry.
async fn store_with_unversioned(
    kind: StoreKind,
    key: &str,
    value: &str,
    claimed_at: i64,
) -> (Arc<dyn JobStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a directory");
    match kind {
        StoreKind::Sqlite => {
            let store = SqliteStore::open(dir.path()).expect("the store opens");
            let conn = rusqlite::Connection::open(dir.path().join("jobs.sqlite3")).expect("opens");
            let old = json!({"value": value, "fetched_at": 10, "claimed_at": claimed_at});
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)",
                rusqlite::params![key, old.to_string()],
            )
            .expect("written");
            (Arc::new(store), dir)
        }
        StoreKind::Dynamo => {
            let client = moto::client().expect("a client");
            let table = format!("jobs-{}", uuid::Uuid::new_v4().simple());
            moto::create_table(&client, &table).await.expect("created");
            let n = |v: i64| AttributeValue::N(v.to_string());
            client
                .put_item()
                .table_name(&table)
                .item("run_id", AttributeValue::S(key.into()))
                .item("cache_value", AttributeValue::S(value.into()))
                .item("fetched_at", n(10))
                .item("claimed_at", n(claimed_at))
                .send()
                .await
                .expect("written");
            (Arc::new(DynamoStore::new(client, table)), dir)
        }
    }
}

/// An entry the release before versions wrote reads its claim as its version: a writer
/// that read it wins once on that, the count goes on from there (never back to the start,
/// where that release's own writers count), and a stale one loses.
async fn an_entry_an_earlier_release_wrote_goes_on_from_its_claim(kind: StoreKind) {
    let (store, _dir) = store_with_unversioned(kind, "~fair/q", "123", 41).await;
    let read = store.cached("~fair/q").await.unwrap().expect("kept");
    assert_eq!((read.value.as_deref(), read.version), (Some("123"), 41));
    let next = CacheEntry {
        value: None,
        fetched_at: 50,
        claimed_at: 42,
        version: next_version(Some(read.version), 50),
        expires_at: None,
    };
    let put = |expected| store.put_cached("~fair/q", &next, expected);
    assert!(!put(Some(0)).await.unwrap(), "not 0");
    assert!(!put(Some(40)).await.unwrap(), "stale");
    assert!(put(Some(41)).await.unwrap());
    assert!(!put(Some(41)).await.unwrap(), "once");
    let kept = store.cached("~fair/q").await.unwrap().expect("kept");
    assert_eq!((kept.value, kept.version), (None, 42));

    // The read-modify-write on such an entry goes on from its claim too.
    let (store, _dir) = store_with_unversioned(kind, "~queue/h100", "[1]", 3).await;
    let queue = Queue::new("h100");
    let key = SharedKey::QueueRecord(&queue);
    let add = |v: &mut Vec<u32>| v.push(2);
    let changed = shared::update(store.as_ref(), key, 5_000, Vec::new, add).await;
    assert_eq!(changed.unwrap().wrote, Some(shared::First::No));
    let entry = store.cached("~queue/h100").await.unwrap().expect("kept");
    assert_eq!((entry.value.as_deref(), entry.version), (Some("[1,2]"), 4));
}

/// A shared entry's compare-and-swap is on its version, never on its times: a writer naming
/// the claim's time, or a version since passed, loses; the version read wins once.
async fn a_shared_entry_is_swapped_on_its_version_alone(kind: StoreKind) {
    let (store, _dir) = open_store(kind).await;
    let key = "~agents";
    let entry = |value: &str, claimed_at, version| CacheEntry {
        value: Some(value.into()),
        fetched_at: 1_000,
        claimed_at,
        version,
        expires_at: None,
    };
    assert!(
        store
            .put_cached(key, &entry("a", 1_000, 5), None)
            .await
            .unwrap()
    );
    assert!(
        !store
            .put_cached(key, &entry("b", 1_000, 6), None)
            .await
            .unwrap(),
        "made twice"
    );
    // The claim's time is not the version, whatever it holds.
    assert!(
        !store
            .put_cached(key, &entry("b", 1_000, 6), Some(1_000))
            .await
            .unwrap()
    );
    assert!(
        store
            .put_cached(key, &entry("b", 1_000, 6), Some(5))
            .await
            .unwrap()
    );
    assert!(
        !store
            .put_cached(key, &entry("c", 2_000, 6), Some(5))
            .await
            .unwrap(),
        "a stale version lost"
    );
    let kept = store.cached(key).await.unwrap().expect("kept");
    assert_eq!((kept.value.as_deref(), kept.version), (Some("b"), 6));
}

/// A change made from this instance's last view of a shared entry: while nobody else writes
/// it costs no read; once another instance wrote, the refusal brings their entry and the
/// change lands on it (nothing of theirs lost), still without a read; a change to nothing is
/// trusted only on the entry as it stands, which it reads. Reads are counted as DynamoDB
/// bills them.
async fn a_change_from_a_stale_view_lands_on_the_entry_as_it_stands(kind: StoreKind) {
    let (inner, _dir) = open_store(kind).await;
    let store = CountingStore::new(inner.clone());
    let queue = Queue::new("h100");
    let key = SharedKey::Deferred(&queue);
    let push = |n: u32| move |v: &mut Vec<u32>| v.push(n);
    let reads = || {
        store
            .units_by_kind()
            .iter()
            .map(|(k, u)| if k.starts_with("read") { u.calls } else { 0 })
            .sum::<u64>()
    };

    let (_, seen) = shared::update_seen(&store, key, (1_000, None), Vec::new, push(1))
        .await
        .unwrap();
    assert_eq!(reads(), 1, "a first change reads");
    let (_, seen) = shared::update_seen(&store, key, (1_000, seen), Vec::new, push(2))
        .await
        .unwrap();
    assert_eq!(
        reads(),
        1,
        "a change from the entry as this instance left it reads nothing"
    );

    // Another instance writes.
    shared::update(inner.as_ref(), key, 1_000, Vec::new, push(3))
        .await
        .unwrap();
    let (changed, seen) = shared::update_seen(&store, key, (1_000, seen), Vec::new, push(4))
        .await
        .unwrap();
    assert!(changed.wrote.is_some());
    assert_eq!(reads(), 1, "the refusal brought the entry that refused it");
    let stored = |seen: &Option<CacheEntry>| -> Vec<u32> {
        serde_json::from_str(seen.as_ref().and_then(|e| e.value.as_deref()).unwrap()).unwrap()
    };
    assert_eq!(stored(&seen), [1, 2, 3, 4]);
    let (value, _) = shared::read::<Vec<u32>>(inner.as_ref(), key, 1_000)
        .await
        .unwrap();
    assert_eq!(value, Some(vec![1, 2, 3, 4]), "nothing of the other's lost");

    shared::update(inner.as_ref(), key, 1_000, Vec::new, push(5))
        .await
        .unwrap();
    let count = |v: &mut Vec<u32>| v.len();
    let (changed, _) = shared::update_seen(&store, key, (1_000, seen), Vec::new, count)
        .await
        .unwrap();
    assert_eq!(
        changed.said, 5,
        "decided on the entry as it stands, not as last seen"
    );
    assert_eq!(reads(), 2, "a change to nothing read the entry");
}

on_both_stores!(
    an_entry_an_earlier_release_wrote_goes_on_from_its_claim,
    a_change_from_a_stale_view_lands_on_the_entry_as_it_stands,
    an_older_entry_gets_its_expiry_at_its_next_change,
    a_shared_entry_is_swapped_on_its_version_alone,
    an_expired_shared_entry_is_gone_and_forgotten,
    concurrent_changes_to_a_shared_entry_all_land,
    create_is_idempotent_per_run_id,
    advance_only_moves_forward,
    concurrent_advances_have_exactly_one_winner,
    large_results_survive_the_round_trip,
    cut_outcomes_are_reported_as_stored,
    stale_writes_lose_and_retried_writes_are_recognised,
    updates_from_a_stale_view_decide_on_the_stored_job,
    oversize_records_are_refused_for_good,
    only_unfinished_jobs_are_listed_for_the_sweep,
    a_listing_shows_a_job_without_its_large_parts,
    a_queue_s_open_jobs_show_what_placing_decides_on,
    each_bookmark_is_kept_on_its_own,
);

#[tokio::test]
async fn two_processes_share_one_file() {
    // Two stores on one directory stand for two local function processes.
    let dir = tempfile::tempdir().unwrap();
    let a = kernelbot_dispatch::jobs::SqliteStore::open(dir.path()).unwrap();
    let b = kernelbot_dispatch::jobs::SqliteStore::open(dir.path()).unwrap();
    a.create(&job("shared", 1)).await.unwrap();
    assert!(
        advance(&b, &id("shared"), &Transition::to(JobState::Running, 2))
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        a.get(&id("shared")).await.unwrap().unwrap().state,
        JobState::Running
    );
}

/// The DynamoDB calls each function makes (every write a conditional put) are granted to it
/// in `template.yaml`, and nothing it no longer calls.
#[test]
fn the_template_grants_each_function_the_calls_the_store_makes() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/template.yaml"))
        .expect("template.yaml");
    let template: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("parses");
    for (function, needs) in [
        (
            "SubmitFunction",
            &["dynamodb:GetItem", "dynamodb:PutItem"][..],
        ),
        ("WebhookFunction", &["dynamodb:GetItem", "dynamodb:PutItem"]),
        (
            "SweepFunction",
            &["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query"],
        ),
    ] {
        let policies = &template["Resources"][function]["Properties"]["Policies"];
        let granted: Vec<String> = policies
            .as_sequence()
            .into_iter()
            .flatten()
            .flat_map(|p| p["Statement"].as_sequence().cloned().unwrap_or_default())
            .flat_map(|s| s["Action"].as_sequence().cloned().unwrap_or_default())
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect();
        for action in needs {
            assert!(
                granted.iter().any(|g| g == action),
                "{function} lacks {action}"
            );
        }
        assert!(
            !granted.iter().any(|g| g == "dynamodb:UpdateItem"),
            "{function} is granted a call it never makes"
        );
    }
}
