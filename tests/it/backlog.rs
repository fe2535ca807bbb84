//! A busy competition's backlog: what a sweep pass holds in memory does not grow with it,
//! a receiver that hangs holds back only its own jobs, and every owed report is tried within
//! a bounded number of passes.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{HOOK_URL, StoreKind, TestApp, inflated_result, submission};
use kernelbot_dispatch::devstack::discord::Outage;
use kernelbot_dispatch::flow::sweep::{self, PASS_RESERVE, SweepReport};
use kernelbot_dispatch::jobs::{
    Channel, Cursor, Job, JobRecord, JobState, SqliteStore, Target, Transition, WebhookAddress,
};
use kernelbot_dispatch::result::{FullResult, Outcome};
use kernelbot_dispatch::retry::Deadline;
use serde_json::{Value, json};

/// The webhook of [`HOOK_URL`], and a second one.
const HOOK_ID: &str = "111111111111111111";
const OTHER_ID: &str = "222222222222222222";
const OTHER_URL: &str = "https://discord.com/api/webhooks/222222222222222222/hook-token_2";
const CALLBACKS: &[(&str, &str)] = &[("CALLBACK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")];

fn to_webhook(run_id: &str, url: &str) -> Value {
    let mut body = submission(run_id);
    body["discord"] = json!({ "webhook_url": url });
    body
}

/// One pass that starts new work for `starting` (then lets what it started end).
async fn pass(app: &TestApp, starting: Duration) -> SweepReport {
    let deadline = Deadline::after(PASS_RESERVE + starting);
    let report = sweep::sweep(&app.sweeper, deadline).await;
    report.expect("the pass completes")
}

fn tries(job: &Job) -> u32 {
    job.delivery(Channel::Discord).map_or(0, |d| d.attempts)
}

/// While one Discord webhook hangs, the reports of another go out in the same pass, and the
/// callbacks too once their receiver answers; while the receiver hangs, Discord reports are
/// not held back either.
async fn a_hung_receiver_holds_back_only_its_own_jobs(kind: StoreKind) {
    let app = TestApp::spawn_tuned(kind, CALLBACKS, Duration::from_millis(200)).await;
    // Interleaved, so a pass that walked one job at a time would meet a hung one first.
    let runs: Vec<(String, bool)> = (0..8).map(|i| (format!("r{i}"), i % 2 == 0)).collect();
    app.receiver.set_delay(Some(Duration::from_secs(30)));
    for (run, hung) in &runs {
        let url = if *hung { HOOK_URL } else { OTHER_URL };
        app.submit(&to_webhook(run, url)).await;
    }
    // The evaluations start while both webhooks fail: each status message owes an edit
    // (retried, as an edit is, until its slice of the pass ends), and every callback is owed.
    app.discord.outage(HOOK_ID, Some(Outage::Answers(503)));
    app.discord.outage(OTHER_ID, Some(Outage::Answers(503)));
    for number in 1..=runs.len() as u64 {
        app.buildkite.start_eval(number);
        app.event("job.started", number).await;
    }
    app.discord.outage(HOOK_ID, Some(Outage::Hung));
    app.discord.outage(OTHER_ID, None);

    pass(&app, Duration::from_secs(3)).await;
    for (run, hung) in &runs {
        let job = app.job(run).await;
        assert_eq!(job.state, JobState::Running, "{run}");
        assert_eq!(job.owes(Channel::Discord), *hung, "{run}: {job:?}");
        assert!(job.owes(Channel::Callback), "{run}: the receiver hangs");
    }

    app.receiver.set_delay(None);
    pass(&app, Duration::from_secs(3)).await;
    for (run, hung) in &runs {
        let job = app.job(run).await;
        assert!(!job.owes(Channel::Callback), "{run}: {job:?}");
        assert_eq!(job.owes(Channel::Discord), *hung, "{run}");
    }
}

/// A backlog on a hung webhook is worked through from where each pass stopped: no report
/// waits behind others that keep failing.
async fn every_owed_report_is_tried_within_a_bounded_number_of_passes(kind: StoreKind) {
    let app = TestApp::spawn_tuned(kind, &[], Duration::from_millis(200)).await;
    app.discord.outage(HOOK_ID, Some(Outage::Answers(503)));
    let runs: Vec<String> = (0..24).map(|i| format!("r{i:02}")).collect();
    for run in &runs {
        app.submit(&submission(run)).await;
    }
    app.discord.outage(HOOK_ID, Some(Outage::Hung));
    let mut before = Vec::new();
    for run in &runs {
        before.push(tries(&app.job(run).await));
    }
    // A receiver's lane has two sends in flight, so each pass that starts any tries at
    // least two of its reports: 24 need 12 passes at most.
    for _ in 0..12 {
        pass(&app, Duration::from_secs(1)).await;
    }
    for (run, tried) in runs.iter().zip(before) {
        let job = app.job(run).await;
        assert!(tries(&job) > tried, "{run} was never tried: {job:?}");
        assert!(job.owes(Channel::Discord));
    }
}

/// A finished job owing its report to webhook `webhook_id`, as a long outage leaves it.
fn owing_report(i: usize, webhook_id: &str, created_at: i64) -> Job {
    let target = Target::Webhook(WebhookAddress {
        webhook_id: webhook_id.into(),
        token: "hook-token".into(),
        thread_id: None,
    });
    let job = Job::new(
        format!("owed-{i:05}").parse().expect("run id"),
        "H100_BK".into(),
        "h100".into(),
        Some("vectoradd".into()),
        Some(target),
        created_at,
    );
    let outcome = Outcome::judge("passed", Some(FullResult::default()), None);
    let t = Transition::to(JobState::Finished, created_at).with_outcome(outcome);
    job.apply(&t).expect("it finishes")
}

/// More reports owed to a hung webhook than one listing holds, and a few to another webhook
/// after them: the pass lists on while its lanes have room, so those few are tried at once,
/// and the next pass goes on with the hung webhook's where it stopped.
async fn a_long_backlog_on_a_hung_webhook_keeps_nobody_after_it_waiting(kind: StoreKind) {
    let app = TestApp::spawn_tuned(kind, &[], Duration::from_millis(200)).await;
    app.discord.outage(HOOK_ID, Some(Outage::Hung));
    app.discord.outage(OTHER_ID, Some(Outage::Answers(503)));
    let (hung, after) = (sweep::SWEEP_BATCH + 50, 5);
    let now = app.clock.now();
    for i in 0..hung + after {
        let webhook = if i < hung { HOOK_ID } else { OTHER_ID };
        let job = owing_report(i, webhook, now + i as i64);
        app.store.create(&job).await.expect("recorded");
    }
    // Time enough to list a thousand jobs, on moto too, and then some.
    pass(&app, Duration::from_secs(8)).await;
    for i in hung..hung + after {
        let job = app.job(&format!("owed-{i:05}")).await;
        assert!(
            tries(&job) > 0,
            "owed-{i:05} waited behind the hung webhook"
        );
    }
    let mark = app.store.cursor(Cursor::Outbox).await.expect("read");
    let mut first_untried = None;
    for i in 0..hung {
        if tries(&app.job(&format!("owed-{i:05}")).await) == 0 {
            first_untried = Some(i);
            break;
        }
    }
    let first_untried = first_untried.expect("the hung webhook holds the rest back");
    let expected = format!("{:020}:owed-{first_untried:05}", now + first_untried as i64);
    assert_eq!(
        mark,
        Some(expected),
        "the next pass goes on where this one stopped"
    );
}

on_both_stores!(
    a_hung_receiver_holds_back_only_its_own_jobs,
    every_owed_report_is_tried_within_a_bounded_number_of_passes,
    a_long_backlog_on_a_hung_webhook_keeps_nobody_after_it_waiting,
);

/// The stored record of a finished job that owes its report, with an inflated result.
fn owed_record() -> Value {
    let target = Target::Webhook(WebhookAddress {
        webhook_id: HOOK_ID.into(),
        token: "hook-token_1".into(),
        thread_id: None,
    });
    let job = Job::new(
        "template".parse().expect("run id"),
        "H100_BK".into(),
        "h100".into(),
        Some("vectoradd".into()),
        Some(target),
        1_000,
    );
    let outcome = Outcome::judge("passed", Some(inflated_result()), None);
    let t = Transition::to(JobState::Finished, 2_000).with_outcome(outcome);
    let finished = job.apply(&t).expect("it finishes");
    let kept = finished.outcome.as_ref().and_then(|o| o.result.as_ref());
    assert!(kept.is_some(), "the whole result is kept");
    let record = JobRecord::from_job(&finished, "w");
    assert!(
        record.stored_outcome_bytes() < 64 * 1024,
        "stored compressed"
    );
    serde_json::to_value(&record).expect("a record")
}

/// A store holding `jobs` finished jobs whose reports are owed, written straight into its
/// file (one encoded record, copied under new run ids), as a long Discord outage leaves it.
fn store_with_backlog(jobs: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    drop(SqliteStore::open(dir.path()).expect("the store opens"));
    let mut conn = rusqlite::Connection::open(dir.path().join("jobs.sqlite3")).expect("opens");
    let tx = conn.transaction().expect("a transaction");
    let mut record = owed_record();
    for i in 0..jobs {
        let (run_id, created_at) = (format!("owed-{i:05}"), 1_000 + i as i64);
        record["run_id"] = json!(run_id);
        record["created_at"] = json!(created_at);
        // Reports to many webhooks, so the pass has every send it may have in flight.
        record["discord_webhook_id"] = json!(format!("3000000000000000{:02}", i % 16));
        tx.execute(
            "INSERT INTO jobs (run_id, shard, created_at, record) VALUES (?1, 'outbox', ?2, ?3)",
            rusqlite::params![run_id, created_at, record.to_string()],
        )
        .expect("inserted");
    }
    tx.commit().expect("committed");
    dir
}

/// Reports the pass tried (each read whole to be sent).
fn tried_in(dir: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(dir.join("jobs.sqlite3")).expect("opens");
    let sql = "SELECT count(*) FROM jobs WHERE json_extract(record, '$.discord_attempts') > 0";
    conn.query_row(sql, [], |r| r.get(0)).expect("counted")
}

/// One pass of the `sweep` binary over `dir` with Discord unreachable: its peak resident
/// memory in KiB, and its summary line.
#[expect(
    clippy::zombie_processes,
    reason = "reaped by wait4, which also reports its peak memory"
)]
fn sweep_peak_rss(dir: &std::path::Path) -> (i64, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sweep"))
        .env_clear()
        .env("KERNELBOT_DATA_DIR", dir)
        .env("BUILDKITE_ORG", "o")
        .env("BUILDKITE_PIPELINE", "p")
        .env("BUILDKITE_API_TOKEN", "t")
        // Nothing listens on the discard port: every send fails at once.
        .env("DISCORD_API_URL", "http://127.0.0.1:9/api/v10")
        .env("SWEEP_PASS_SECS", "14")
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("sweep starts");
    let mut summary = String::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_string(&mut summary).expect("its output");
    }
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: `rusage` is plain data, written by the kernel; `wait4` reaps our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(reaped, pid, "the sweep was reaped");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{summary}"
    );
    (usage.ru_maxrss, summary)
}

/// A pass reads its backlog as a listing without results, then each job whole only to send
/// it, a few at a time: its memory is the same for 2,000 owed jobs and for 4,000, and far
/// inside a 256 MB function, though each job's result is 3 MiB decompressed.
#[test]
fn a_sweep_pass_s_memory_stays_flat_as_its_backlog_doubles() {
    let mut peaks = Vec::new();
    for jobs in [2_000, 4_000] {
        let dir = store_with_backlog(jobs);
        let (peak_kib, summary) = sweep_peak_rss(dir.path());
        assert!(summary.contains("reports pending"), "{summary}");
        let tried = tried_in(dir.path());
        assert!(
            tried >= 8,
            "the pass read jobs whole and tried them: {tried}"
        );
        eprintln!("{jobs} owed jobs: peak {peak_kib} KiB, {tried} tried");
        peaks.push(peak_kib);
    }
    let (small, large) = (peaks[0], peaks[1]);
    // Which sends' reads coincide varies from run to run by some tens of MB: doubling the
    // backlog may move the peak by no more than that (before, it held 3 MiB a listed job).
    let noise = 32 * 1024;
    assert!(
        large <= small + noise,
        "twice the backlog: {small} KiB, then {large} KiB"
    );
    assert!(large < 192 * 1024, "{large} KiB at the peak");
}
