//! The harness: the library's local stack (`devstack::stack`), with the conveniences a test
//! wants: a stack that does not start, a job that is not there or a sweep pass that fails
//! is the test's failure, said at once.

use std::io::Read;
use std::ops::Deref;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use kernelbot_dispatch::devstack::stack::{self, Stack};
pub(crate) use kernelbot_dispatch::devstack::stack::{
    API_TOKEN, BK_TOKEN, HOOK_URL, SECRET, StoreKind, submission,
};
use kernelbot_dispatch::devstack::units::CountingStore;
use kernelbot_dispatch::flow::sweep::SweepReport;
use kernelbot_dispatch::jobs::{Job, JobStore};
use kernelbot_dispatch::result::{EvalResult, FullResult, RunResult};
use kernelbot_dispatch::time::Clock;
use reqwest::StatusCode;
use serde_json::Value;

pub(crate) struct TestApp(Stack);

impl Deref for TestApp {
    type Target = Stack;

    fn deref(&self) -> &Stack {
        &self.0
    }
}

impl TestApp {
    pub(crate) async fn spawn(kind: StoreKind) -> Self {
        Self(Stack::spawn(kind).await.expect("the local stack starts"))
    }

    pub(crate) async fn spawn_with(kind: StoreKind, vars: &[(&str, &str)]) -> Self {
        let stack = Stack::spawn_with(kind, vars).await;
        Self(stack.expect("the local stack starts"))
    }

    /// As `spawn_with`, the functions' store counted as DynamoDB would bill its calls.
    pub(crate) async fn spawn_counted(
        kind: StoreKind,
        vars: &[(&str, &str)],
    ) -> (Self, Arc<CountingStore>) {
        let (timeout, clock) = (Duration::from_secs(5), Clock::default());
        let stack = Stack::spawn_counted(kind, vars, timeout, clock).await;
        let (stack, counted) = stack.expect("the local stack starts");
        (Self(stack), counted)
    }

    pub(crate) async fn spawn_tuned(
        kind: StoreKind,
        vars: &[(&str, &str)],
        timeout: Duration,
    ) -> Self {
        let stack = Stack::spawn_tuned(kind, vars, timeout).await;
        Self(stack.expect("the local stack starts"))
    }

    /// `POST /submissions` with the test token: the answer's status and body.
    pub(crate) async fn submit(&self, body: &Value) -> (StatusCode, Value) {
        self.0.submit(body).await.expect("the submit API answers")
    }

    pub(crate) async fn submit_raw(
        &self,
        body: Vec<u8>,
        token: Option<&str>,
    ) -> (StatusCode, Value) {
        let answer = self.0.submit_raw(body, token).await;
        answer.expect("the submit API answers")
    }

    pub(crate) async fn cancel(&self, run_id: &str) -> (StatusCode, Value) {
        self.0.cancel(run_id).await.expect("the submit API answers")
    }

    /// `GET /submissions/{run_id}`: the answer's status and body.
    pub(crate) async fn status(&self, run_id: &str) -> (StatusCode, Value) {
        self.0.status(run_id).await.expect("the submit API answers")
    }

    /// The job as stored.
    pub(crate) async fn job(&self, run_id: &str) -> Job {
        self.0.job(run_id).await.expect("the job exists")
    }

    /// Sends a signed webhook; its answer's status.
    pub(crate) async fn event(&self, event: &str, number: u64) -> StatusCode {
        self.0
            .event(event, number)
            .await
            .expect("the webhook answers")
    }

    /// Ends a build (with `result` uploaded) and sends `build.finished`; the answer's status.
    pub(crate) async fn finish(
        &self,
        number: u64,
        state: &str,
        result: Option<Vec<u8>>,
    ) -> StatusCode {
        let answer = self.0.finish(number, state, result).await;
        answer.expect("the webhook answers")
    }

    /// The timings build `number` shows, from the stand-in's record of when it was created,
    /// its evaluation started and it ended: `(queued_secs, ran_secs)`.
    pub(crate) fn timings(&self, number: u64) -> (f64, f64) {
        let b = self.buildkite.build(number).expect("the build exists");
        let started = b.started_at.expect("the evaluation started");
        let finished = b.finished_at.expect("the build ended");
        let secs = |ms: i64| ms as f64 / 1000.0;
        (secs(started - b.created_at), secs(finished - started))
    }

    /// Build `number`'s timings, asserted to be 2 s in the queue and 45.5 s on the GPU on the
    /// stack's clock, to within the real time each span took here (`in_queue`, `on_gpu`
    /// seconds: the clock runs on with it; its stamps are whole milliseconds, so a span of
    /// them can read 1 ms long).
    pub(crate) fn timings_of_2_and_45_5(
        &self,
        number: u64,
        (in_queue, on_gpu): (f64, f64),
    ) -> (f64, f64) {
        let (queued, ran) = self.timings(number);
        let (in_queue, on_gpu) = (in_queue + 0.001, on_gpu + 0.001);
        assert!(
            (2.0..=2.0 + in_queue).contains(&queued) && (45.5..=45.5 + on_gpu).contains(&ran),
            "{queued} {ran}, {in_queue} s and {on_gpu} s of real time"
        );
        (queued, ran)
    }

    /// One sweep pass, which must not fail.
    pub(crate) async fn sweep(&self) -> SweepReport {
        self.0.sweep().await.expect("sweep pass")
    }
}

/// A fresh, empty store of `kind` (and the temp dir it lives in).
pub(crate) async fn open_store(kind: StoreKind) -> (Arc<dyn JobStore>, Option<tempfile::TempDir>) {
    stack::open_store(kind).await.expect("the store opens")
}

/// A result as large as a submission can make its runner write: 512 lines of 2 KiB on the
/// result pipe in each of three runs (3 MiB as JSON, some 30 KB stored).
pub(crate) fn inflated_result() -> FullResult {
    let mut result = FullResult {
        success: true,
        ..Default::default()
    };
    for name in ["test", "benchmark", "leaderboard"] {
        let mut run = RunResult::default();
        for i in 0..512 {
            let mut line = format!("{name}.{i} ").repeat(2048 / 8);
            line.truncate(2048);
            run.result.insert(format!("{name}.{i}.spec"), line.into());
        }
        let eval = EvalResult {
            run: Some(run),
            ..Default::default()
        };
        result.runs.insert(name.into(), eval);
    }
    result
}

/// The high-water mark of resident memory of process `pid`, in KiB, while it lives.
pub(crate) fn high_water_kib(pid: u32) -> Option<i64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs `command` to its end: its peak resident memory in KiB, whether it succeeded, and
/// what it printed.
///
/// The peak is the process's own `VmHWM`, read until it exits: `wait4`'s `ru_maxrss` would
/// also count the test process, whose memory a spawned child shares until it execs.
pub(crate) fn run_measured(mut command: Command) -> (i64, bool, String) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the binary starts");
    let pid = child.id();
    let mut out = child.stdout.take().expect("its output");
    let reader = std::thread::spawn(move || {
        let mut printed = String::new();
        out.read_to_string(&mut printed).map(|_| printed)
    });
    // The mark only rises: the last reading before the process exits is its peak, but for
    // what it does in its last millisecond (print its summary).
    let mut peak = 0;
    while child.try_wait().expect("it is waited on").is_none() {
        peak = peak.max(high_water_kib(pid).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(1));
    }
    let printed = reader.join().expect("read").expect("its output");
    let succeeded = child.wait().expect("it exited").success();
    (peak, succeeded, printed)
}
