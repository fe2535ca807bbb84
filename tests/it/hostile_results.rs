//! Hostile `result.json` files, each as large as an artifact may be: the real `webhook` and
//! `sweep` binaries finish such a job within a few tens of MB (each process's own peak,
//! `VmHWM`), and the next job still gets its report. A job whose result's reads never come
//! back (the pass killed while reading, pass after pass) ends as `error` after a few and
//! holds back no other job. On both stores.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kernelbot_dispatch::devstack::buildkite::{deliver, sample_result, unix_now};
use kernelbot_dispatch::jobs::JobState;
use kernelbot_dispatch::result::Verdict;
use reqwest::StatusCode;

use crate::support::{SECRET, StoreKind, TestApp, high_water_kib, run_measured, submission};

/// The largest artifact the functions download (`MAX_ARTIFACT_BYTES`).
const MAX_ARTIFACT: usize = 8 * 1024 * 1024;

/// The most a function may peak at, in KiB, finishing any result (before: 455 MB).
const PEAK_KIB: i64 = 64 * 1024;

/// `head`, then `item(0)`, `item(1)`, … comma-separated while they fit, then `tail`: as much
/// as [`MAX_ARTIFACT`] holds.
fn filled(head: &str, item: impl Fn(usize) -> String, tail: &str) -> Vec<u8> {
    let mut json = head.to_owned();
    for i in 0.. {
        let next = item(i);
        if json.len() + 1 + next.len() + tail.len() > MAX_ARTIFACT {
            break;
        }
        if i > 0 {
            json.push(',');
        }
        json.push_str(&next);
    }
    json.push_str(tail);
    json.into_bytes()
}

/// A name for `i`, as short as distinct names can be: digits and letters.
fn short_name(mut i: usize) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut name = String::new();
    loop {
        name.push(char::from(DIGITS[i % DIGITS.len()]));
        i /= DIGITS.len();
        if i == 0 {
            return name;
        }
    }
}

/// The hostile results, by what makes them so: 8 MiB each, which the caps cut to a few KB.
fn hostile_results() -> [(&'static str, Vec<u8>); 3] {
    let run = r#"{"success":true,"runs":{"test":{"run":{"success":true,"passed":true,"result":{"#;
    let object = r#"{"a":[1,2.5,"s",null,true]}"#;
    [
        (
            "some 800,000 empty runs",
            filled(
                r#"{"success":true,"runs":{"#,
                |i| format!("\"{}\":{{}}", short_name(i)),
                "}}",
            ),
        ),
        (
            "one result value of 8 MiB",
            filled(
                &format!("{run}\"check\":\"pass\",\"nested\":["),
                |_| object.to_owned(),
                "]}}}}}",
            ),
        ),
        (
            "some 900,000 result entries",
            filled(run, |i| format!("\"{}\":0", short_name(i)), "}}}}}"),
        ),
    ]
}

/// A stack with two jobs whose builds have ended: `first` (build 1) with `result`, then
/// `next` (build 2) with a passing one. No webhook has said so yet.
async fn two_jobs(kind: StoreKind, first: &str, result: Vec<u8>) -> TestApp {
    let app = TestApp::spawn(kind).await;
    for run_id in [first, "next"] {
        let (status, answer) = app.submit(&submission(run_id)).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    }
    for (number, result) in [(1, result), (2, sample_result(false))] {
        app.buildkite
            .upload(number, "result.json", result, "finished", false);
        app.buildkite.set_state(number, "passed");
    }
    app
}

/// The hostile job ended with its result (capped), and the next job's report was shown.
async fn both_reported(app: &TestApp, what: &str) {
    let job = app.job("hostile").await;
    assert_eq!(job.state, JobState::Finished, "{what}");
    let outcome = job.outcome.expect("an outcome");
    assert!(outcome.result.is_some(), "{what}: {:?}", outcome.error);
    let (_, next) = app.status("next").await;
    assert_eq!(next["verdict"], "passed", "{what}: {next}");
    assert_eq!(
        next["delivery"]["discord"]["status"], "delivered",
        "{what}: {next}"
    );
}

/// The `webhook` binary serving on a free port, with the stack's environment.
struct WebhookProcess {
    child: Child,
    url: String,
}

impl WebhookProcess {
    async fn start(app: &TestApp) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_webhook"))
            .env_clear()
            .envs(&app.env)
            .env("LISTEN_ADDR", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("webhook starts");
        let listening = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(Instant::now() < listening, "the webhook did not listen");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let url = format!("http://127.0.0.1:{port}/webhooks/buildkite");
        Self { child, url }
    }

    /// Sends `build.finished` for build `number` as Buildkite would; the answer's status.
    async fn finished(&self, app: &TestApp, number: u64) -> StatusCode {
        let body = app.buildkite.webhook_body("build.finished", number);
        let sent = deliver(&self.url, SECRET, "build.finished", body, unix_now()).await;
        sent.expect("the webhook answers").status()
    }

    /// Its peak resident memory so far, in KiB.
    fn peak_kib(&self) -> i64 {
        high_water_kib(self.child.id()).expect("it runs")
    }
}

impl Drop for WebhookProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `sweep` binary beside the stack, every job due for a look whatever its age.
fn sweep_command(app: &TestApp) -> Command {
    let mut sweep = Command::new(env!("CARGO_BIN_EXE_sweep"));
    sweep
        .env_clear()
        .envs(&app.env)
        .env("SWEEP_MIN_AGE_SECS", "0")
        .env("RUST_LOG", "error");
    sweep
}

/// One pass of the `sweep` binary, which must succeed: its peak resident memory in KiB.
async fn sweep_pass(app: &TestApp) -> i64 {
    let sweep = sweep_command(app);
    let run = tokio::task::spawn_blocking(move || run_measured(sweep));
    let (peak, succeeded, summary) = run.await.expect("the pass ran");
    assert!(succeeded, "{summary}");
    peak
}

/// Each hostile result, its job's `build.finished` through the real `webhook` binary, then
/// the next job's: the process peaks under 64 MB, and both jobs are reported.
async fn a_hostile_result_costs_the_webhook_a_few_mb_and_the_next_job_gets_its_report(
    kind: StoreKind,
) {
    for (what, result) in hostile_results() {
        let app = two_jobs(kind, "hostile", result).await;
        let webhook = WebhookProcess::start(&app).await;
        for number in [1, 2] {
            let status = webhook.finished(&app, number).await;
            assert_eq!(status, StatusCode::OK, "{what}, build {number}");
        }
        let peak = webhook.peak_kib();
        eprintln!("{kind:?}, webhook, {what}: peak {peak} KiB");
        both_reported(&app, what).await;
        assert!(peak < PEAK_KIB, "{what}: the webhook peaked at {peak} KiB");
    }
}

/// Each hostile result, its job's webhook lost: one pass of the real `sweep` binary finishes
/// it and then the next job, peaking under 64 MB, and both jobs are reported.
async fn a_hostile_result_costs_the_sweep_a_few_mb_and_the_next_job_gets_its_report(
    kind: StoreKind,
) {
    for (what, result) in hostile_results() {
        let app = two_jobs(kind, "hostile", result).await;
        let peak = sweep_pass(&app).await;
        eprintln!("{kind:?}, sweep, {what}: peak {peak} KiB");
        both_reported(&app, what).await;
        assert!(peak < PEAK_KIB, "{what}: the sweep peaked at {peak} KiB");
    }
}

/// The downloads of build `number`'s artifacts asked for so far.
fn downloads_of(app: &TestApp, number: u64) -> usize {
    let build = format!("/builds/{number}/");
    let calls = app.buildkite.api_calls();
    calls
        .iter()
        .filter(|c| c.contains(&build) && c.ends_with("/download"))
        .count()
}

/// A pass of the `sweep` binary that dies (killed) once it has begun reading the result of
/// build `number`.
async fn pass_killed_reading(app: &TestApp, number: u64) {
    let before = downloads_of(app, number);
    let mut sweep = sweep_command(app);
    let mut child = sweep
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sweep starts");
    let reading = Instant::now() + Duration::from_secs(30);
    while downloads_of(app, number) == before {
        assert!(Instant::now() < reading, "the pass never read the result");
        let ended = child.try_wait().expect("it is waited on");
        assert!(ended.is_none(), "the pass ended before reading: {ended:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    child.kill().expect("killed");
    child.wait().expect("reaped");
}

/// The first job's result never arrives: each pass is killed while reading it. Every read
/// is counted before it begins; from the second pass on, the next job goes first and gets
/// its report; after three reads the first job ends as `error` without a fourth.
async fn a_result_whose_reads_never_come_back_ends_as_error_and_holds_back_no_other(
    kind: StoreKind,
) {
    let app = two_jobs(kind, "stuck", sample_result(false)).await;
    app.buildkite.stall_downloads(1, true);
    for pass in 1..=3 {
        pass_killed_reading(&app, 1).await;
        assert_eq!(app.job("stuck").await.finish_attempts, pass);
        let (_, next) = app.status("next").await;
        let shown = next["delivery"]["discord"]["status"] == "delivered";
        assert_eq!(shown, pass > 1, "pass {pass}: {next}");
    }
    sweep_pass(&app).await;
    let job = app.job("stuck").await;
    let outcome = job.outcome.expect("an outcome");
    assert_eq!(
        (job.state, outcome.verdict),
        (JobState::Finished, Verdict::Error)
    );
    assert_eq!(
        outcome.error.as_deref(),
        Some("its result could not be read")
    );
    assert_eq!(downloads_of(&app, 1), 3, "no fourth read");
    let (_, stuck) = app.status("stuck").await;
    assert_eq!(
        stuck["delivery"]["discord"]["status"], "delivered",
        "{stuck}"
    );
}

on_both_stores!(
    a_hostile_result_costs_the_webhook_a_few_mb_and_the_next_job_gets_its_report,
    a_hostile_result_costs_the_sweep_a_few_mb_and_the_next_job_gets_its_report,
    a_result_whose_reads_never_come_back_ends_as_error_and_holds_back_no_other,
);
