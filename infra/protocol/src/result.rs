//! Kernelbot's `result.json` (`FullResult`) and the verdict we draw from it.
//!
//! Parsing is tolerant: every field has a default and unknown fields are ignored, so a
//! runner that adds fields (or an older one that lacks some) still yields a report. It is
//! bounded: [`FullResult::parse`] keeps each field within its cap ([`caps`]) as the file is
//! read ([`capped`]), so no file, whatever it holds, costs more than its caps keep.

mod capped;
#[cfg(test)]
mod oracle;
mod render;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub mod health;
pub use health::{Conditions, GpuProcess, GpuReading, InfraFailure, Preflight, Throttled};

/// Largest captured stdout/stderr we keep per run, as kernelbot's `_limit_length` does.
pub const MAX_LOG_CHARS: usize = 16 * 1024;

/// Kernelbot's exit codes for evaluation runs.
pub mod exit_code {
    pub const CUDA_FAIL: i64 = 110;
    pub const PIPE_FAILED: i64 = 111;
    pub const VALIDATE_FAIL: i64 = 112;
    pub const TEST_SPEC: i64 = 113;
    pub const TIMEOUT_EXPIRED: i64 = 114;
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FullResult {
    pub success: bool,
    pub error: String,
    pub system: SystemInfo,
    pub runs: BTreeMap<String, EvalResult>,
    /// Ours, not kernelbot's: set when the GPU node, not the submission, stopped the job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub infra: Option<InfraFailure>,
    /// Ours: what the pre-flight read before the submission ran (the runner writes it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preflight: Option<Preflight>,
    /// Ours: a timed run the GPU slowed down on every try it got, so no time is ranked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttled: Option<Throttled>,
    /// Ours: the try that wrote this file, so a copy of it read from the build's meta-data
    /// (which every try of a build shares) says whose it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub written_by: Option<WrittenBy>,
}

/// The Buildkite job a `result.json` came from, and which try of the step it was.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WrittenBy {
    /// `BUILDKITE_JOB_ID`.
    pub job_id: String,
    /// `BUILDKITE_RETRY_COUNT`: 0 on the step's first try.
    pub retry_count: u32,
}

impl WrittenBy {
    pub(super) fn cap(&mut self) {
        cap(&mut self.job_id, caps::SHORT);
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SystemInfo {
    pub gpu: String,
    pub device_count: i64,
    pub cpu: String,
    pub runtime: String,
    pub platform: String,
    pub torch: String,
    pub hostname: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvalResult {
    pub start: Option<String>,
    pub end: Option<String>,
    pub compilation: Option<CompileResult>,
    pub run: Option<RunResult>,
    pub profile: Option<ProfileResult>,
    /// Ours, not kernelbot's: the GPUs' clocks, temperature and power around a timed run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Conditions>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CompileResult {
    pub nvcc_found: bool,
    pub nvcc_version: String,
    pub success: bool,
    pub command: String,
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunResult {
    pub success: bool,
    pub passed: bool,
    pub command: String,
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i64,
    pub duration: f64,
    /// `key: value` pairs the evaluation wrote to its `POPCORN_FD` pipe.
    pub result: BTreeMap<String, serde_json::Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProfileResult {
    pub profiler: String,
    /// kernelbot's runners put the profiler's files here, zipped and base64-encoded; ours
    /// leave them as a build artifact (`null` here) and `download_url` links to them.
    pub trace: Option<String>,
    pub download_url: Option<String>,
}

impl FullResult {
    /// Parses `result.json`, capping every field the evaluated program could fill as it is
    /// read, so no file (whatever it claims) makes the stored job, the report or the reading
    /// itself unbounded. What it keeps is what reading the whole file and then cutting each
    /// field to its cap would keep.
    pub fn parse(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        capped::parse(bytes)
    }

    /// Drops what is bulky but not needed to report: captured logs and profiler traces.
    pub fn drop_logs(&mut self) {
        const DROPPED: &str = "[dropped: too large to store]";
        for eval in self.runs.values_mut() {
            if let Some(c) = eval.compilation.as_mut() {
                c.stdout = DROPPED.into();
                c.stderr.clear();
            }
            if let Some(r) = eval.run.as_mut() {
                r.stdout = DROPPED.into();
                r.stderr.clear();
            }
            if let Some(p) = eval.profile.as_mut() {
                p.trace = None;
            }
        }
    }

    /// Runs in the order kernelbot performs them, then any others by name.
    pub fn ordered_runs(&self) -> Vec<(&str, &EvalResult)> {
        let mut runs: Vec<_> = self.runs.iter().map(|(k, v)| (k.as_str(), v)).collect();
        runs.sort_by_key(|(name, _)| rank(name));
        runs
    }

    /// True when every run compiled, ran and passed.
    pub fn all_passed(&self) -> bool {
        !self.runs.is_empty()
            && self.runs.values().all(|e| {
                e.compilation.as_ref().is_none_or(|c| c.success)
                    && e.run.as_ref().is_some_and(|r| r.success && r.passed)
            })
    }
}

impl RunResult {
    pub fn value(&self, key: &str) -> Option<String> {
        self.result.get(key).map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }

    /// `(passed, total)` from the test entries, when the run reported any. Counts the
    /// entries present rather than looping to the claimed total, which may be anything.
    pub fn test_counts(&self) -> Option<(u64, u64)> {
        let total: u64 = self.value("test-count")?.trim().parse().ok()?;
        let passed = self
            .result
            .iter()
            .filter(|(k, v)| {
                k.strip_prefix("test.")
                    .and_then(|rest| rest.strip_suffix(".status"))
                    .and_then(|i| i.parse::<u64>().ok())
                    .is_some_and(|i| i < total)
                    && v.as_str() == Some("pass")
            })
            .count() as u64;
        Some((passed, total))
    }

    /// `(spec, mean_ns, err_ns)` per benchmark the run reported.
    pub fn benchmarks(&self) -> Vec<(String, Option<f64>, Option<f64>)> {
        let count: usize = self
            .value("benchmark-count")
            .and_then(|c| c.trim().parse().ok())
            .unwrap_or(0);
        (0..count.min(100))
            .map(|i| {
                let num = |k: &str| {
                    self.value(&format!("benchmark.{i}.{k}"))
                        .and_then(|v| v.trim().parse().ok())
                };
                let spec = self
                    .value(&format!("benchmark.{i}.spec"))
                    .unwrap_or_default();
                (spec, num("mean"), num("err"))
            })
            .collect()
    }

    /// Kernelbot's `_short_fail_reason`.
    pub fn fail_reason(&self) -> String {
        match self.exit_code {
            exit_code::TIMEOUT_EXPIRED => " (timeout)".into(),
            exit_code::CUDA_FAIL => " (cuda api error)".into(),
            exit_code::VALIDATE_FAIL => String::new(),
            code => format!(" (internal error {code})"),
        }
    }
}

/// Limits on what a `result.json` may hold, per field (characters of text, entries of maps).
pub mod caps {
    /// Captured stdout/stderr, as kernelbot's `_limit_length` does.
    pub const LOG: usize = super::MAX_LOG_CHARS;
    /// Commands, error texts, traces' neighbours.
    pub const TEXT: usize = 4 * 1024;
    /// Short descriptive strings (GPU name, versions, timestamps).
    pub const SHORT: usize = 256;
    /// Run names and `result` keys.
    pub const NAME: usize = 128;
    /// One `result` value (a test's message can be long; kernelbot's are a few lines).
    pub const VALUE: usize = 2 * 1024;
    /// Entries of one run's `result` map.
    pub const ENTRIES: usize = 512;
    /// The profiler's reports (`benchmark.<i>.report`, base64 of Nsight's tables) of one run,
    /// together: each kept whole while they fit, never cut (a cut one would not decode).
    pub const REPORTS: usize = 64 * 1024;
    /// Runs in one result.
    pub const RUNS: usize = 32;
}

/// Where a run comes in kernelbot's order (then by name): its own runs first.
fn rank(name: &str) -> u8 {
    match name {
        "test" => 0,
        "benchmark" => 1,
        n if n.starts_with("profile") => 2,
        "leaderboard" => 3,
        _ => 4,
    }
}

/// `benchmark.<i>.report`: a profiler's tables, base64 (kernelbot's key).
fn is_report(key: &str) -> bool {
    key.strip_prefix("benchmark.")
        .and_then(|rest| rest.strip_suffix(".report"))
        .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
}

const TRUNCATED: &str = "\n[… output truncated]";

/// Cuts `s` to at most `max` bytes (on a character boundary), marking the cut.
fn cap(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max.saturating_sub(TRUNCATED.len());
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str(TRUNCATED);
    }
}

/// How a finished job ended, as users read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Passed,
    /// A test, benchmark or compile failed, or the build failed.
    Failed,
    Canceled,
    Skipped,
    /// No agent started the evaluation step in time.
    QueueTimeout,
    /// The job outlived its maximum age.
    Expired,
    /// No usable result (artifact missing, unreadable, too large).
    Error,
    /// The GPU node, not the submission, failed its pre-flight on every try: never the
    /// user's failure, never a ranked time.
    Infra,
    /// The GPU slowed down (heat, a hardware slowdown, a power brake) while a timed run was
    /// measured, on every try: the run's results stand, its time is not ranked.
    Throttled,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::Skipped => "skipped",
            Self::QueueTimeout => "queue_timeout",
            Self::Expired => "expired",
            Self::Error => "error",
            Self::Infra => "infra",
            Self::Throttled => "throttled",
        }
    }
}

/// How long a run waited for an agent and ran, in seconds, when Buildkite said.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_secs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran_secs: Option<f64>,
}

/// How a finished job ended: the build's own final state and what `result.json` said.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Buildkite's final build state (`passed`, `failed`, `canceled`, `blocked`, ...).
    pub build_state: String,
    pub verdict: Verdict,
    /// Why the job failed when no run says so itself (build canceled, artifact missing, ...).
    pub error: Option<String>,
    pub result: Option<FullResult>,
    /// Queued and ran for, from the build's timestamps (absent in records from before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
    /// Each profile run's zip (`profile.<i>` → its artifact), found when the build finished
    /// beside the `result.json` read, so a click on its link costs one Buildkite call.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub profile_zips: BTreeMap<String, ArtifactRef>,
    /// Every try of the evaluation step, oldest first, where Buildkite retried it: on which
    /// agent, and why a try that was retried ended. Empty for a build of one try.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tries: Vec<Try>,
}

/// One try of the evaluation step (one job of the build).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Try {
    pub job_id: String,
    pub agent: String,
    pub exit_status: Option<i64>,
    /// The GPU node, not the submission, ended it (the runner's infrastructure exit code).
    pub infra: bool,
    /// A timed run stayed throttled on its GPU after the submission ran (the runner's exit
    /// code for it, or the result read said so): perhaps the kernel's own heat, never a
    /// pause.
    pub throttled: bool,
    /// Its fault outlasts the job, so its agent paused itself (see [`health::is_lasting`]).
    pub paused: bool,
    /// The try whose `result.json` was read.
    pub result: bool,
    /// Why it ended as it did, in a few words (the agent's note after an infrastructure
    /// failure); empty for the try that gave the result.
    pub reason: String,
    /// When it ended (ms since the epoch), as Buildkite says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
}

impl Outcome {
    /// The reasons of the tries that failed before the one whose result was read (before the
    /// last, when none was).
    pub fn retried_reasons(&self) -> Vec<&str> {
        let last = self.tries.len().saturating_sub(1);
        let read = self.tries.iter().position(|t| t.result).unwrap_or(last);
        self.tries[..read]
            .iter()
            .filter(|t| !t.reason.is_empty())
            .map(|t| t.reason.as_str())
            .collect()
    }
}

/// A build artifact, by its job and id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactRef {
    pub job_id: String,
    pub artifact_id: String,
}

impl Outcome {
    /// Draws the verdict. A passed build can still hold failed tests (kernelbot's runner exits
    /// 0 whenever the evaluation ran), and a failed build is never a pass.
    pub fn judge(
        build_state: &str,
        result: Option<FullResult>,
        fetch_error: Option<String>,
    ) -> Self {
        let verdict = match (build_state, &result) {
            // Whatever the build's state: the node said it, not the submission, failed.
            (_, Some(r)) if r.infra.is_some() => Verdict::Infra,
            // Only a run whose results all passed is "not ranked": a failure stays a failure.
            (_, Some(r)) if r.throttled.is_some() && r.all_passed() => Verdict::Throttled,
            ("passed", Some(r)) if r.success && r.all_passed() => Verdict::Passed,
            ("passed", Some(_)) | ("failed" | "blocked", _) => Verdict::Failed,
            ("passed", None) => Verdict::Error,
            ("canceled" | "canceling", _) => Verdict::Canceled,
            ("skipped" | "not_run", _) => Verdict::Skipped,
            _ => Verdict::Error,
        };
        let error = match &result {
            Some(r) if r.infra.is_some() => r.infra.as_ref().map(InfraFailure::sentence),
            Some(r) if r.throttled.is_some() && r.all_passed() => {
                r.throttled.as_ref().map(Throttled::sentence)
            }
            Some(r) if !r.error.is_empty() => Some(r.error.clone()),
            _ if build_state != "passed" => Some(format!("Build {build_state}")),
            Some(r) if !r.success => Some("the runner reported failure".to_owned()),
            Some(_) => None,
            None => Some(fetch_error.unwrap_or_else(|| "result.json missing".to_owned())),
        };
        Self {
            build_state: build_state.to_owned(),
            verdict,
            error,
            result,
            timings: None,
            profile_zips: BTreeMap::new(),
            tries: Vec::new(),
        }
    }

    /// The same ending with the build's timings.
    pub fn with_timings(mut self, timings: Timings) -> Self {
        self.timings = (timings != Timings::default()).then_some(timings);
        self
    }

    /// An ending decided by us rather than by a build's result (deadlines, vanished builds).
    pub fn decided(build_state: &str, verdict: Verdict, reason: impl Into<String>) -> Self {
        Self {
            build_state: build_state.to_owned(),
            verdict,
            error: Some(reason.into()),
            result: None,
            timings: None,
            profile_zips: BTreeMap::new(),
            tries: Vec::new(),
        }
    }

    /// The same ending without its result, for when the result cannot be stored: the verdict,
    /// drawn from the whole result, is kept.
    pub fn without_result(&self, reason: &str) -> Self {
        Self {
            build_state: self.build_state.clone(),
            verdict: self.verdict,
            error: Some(match &self.error {
                Some(e) => format!("{e}; {reason}"),
                None => reason.to_owned(),
            }),
            result: None,
            timings: self.timings,
            profile_zips: BTreeMap::new(),
            tries: self.tries.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSING: &str = r#"{"success": true, "error": "", "extra": 1,
      "system": {"gpu": "NVIDIA H100", "device_count": 1, "future_field": "x"},
      "runs": {"test": {"start": "2026-01-29T10:33:59.123456", "end": "2026-01-29T10:34:01",
        "compilation": null,
        "run": {"success": true, "passed": true, "command": "python eval.py test", "stdout": "",
                "stderr": "", "exit_code": 0, "duration": 1.5,
                "result": {"check": "pass", "test-count": "2", "test.0.status": "pass",
                           "test.1.status": "pass"}},
        "profile": null}}}"#;

    #[test]
    fn parses_kernelbot_results_and_ignores_unknown_fields() {
        let r = FullResult::parse(PASSING.as_bytes()).expect("parses");
        assert_eq!(r.system.gpu, "NVIDIA H100");
        let run = r.runs["test"].run.as_ref().unwrap();
        assert_eq!(run.test_counts(), Some((2, 2)));
        assert!(r.all_passed());
    }

    #[test]
    fn caps_huge_logs() {
        let mut r: FullResult = serde_json::from_str(PASSING).unwrap();
        r.runs.get_mut("test").unwrap().run.as_mut().unwrap().stdout = "é".repeat(20_000);
        let reparsed = FullResult::parse(&serde_json::to_vec(&r).unwrap()).unwrap();
        let stdout = &reparsed.runs["test"].run.as_ref().unwrap().stdout;
        assert!(stdout.len() <= MAX_LOG_CHARS + 40);
        assert!(stdout.ends_with("[… output truncated]"));
    }

    #[test]
    fn a_passed_build_with_a_failing_test_is_a_failure() {
        let mut r: FullResult = serde_json::from_str(PASSING).unwrap();
        let run = r.runs.get_mut("test").unwrap().run.as_mut().unwrap();
        run.passed = false;
        run.result.insert("test.1.status".into(), "fail".into());
        assert_eq!(run.test_counts(), Some((1, 2)));
        let outcome = Outcome::judge("passed", Some(r), None);
        assert_eq!(outcome.verdict, Verdict::Failed);
        assert_eq!(outcome.error, None);
    }

    #[test]
    fn verdicts_follow_the_build_and_the_result() {
        let r: FullResult = serde_json::from_str(PASSING).unwrap();
        assert_eq!(
            Outcome::judge("passed", Some(r.clone()), None).verdict,
            Verdict::Passed
        );
        let failed = Outcome::judge("failed", Some(r), None);
        assert_eq!(
            (failed.verdict, failed.error.as_deref()),
            (Verdict::Failed, Some("Build failed"))
        );
        let canceled = Outcome::judge("canceled", None, None);
        assert_eq!(
            (canceled.verdict, canceled.error.as_deref()),
            (Verdict::Canceled, Some("Build canceled"))
        );
        for state in ["skipped", "not_run"] {
            assert_eq!(Outcome::judge(state, None, None).verdict, Verdict::Skipped);
        }
        assert_eq!(
            Outcome::judge("blocked", None, None).verdict,
            Verdict::Failed
        );
        let missing = Outcome::judge("passed", None, Some("no result.json artifact".into()));
        assert_eq!(
            (missing.verdict, missing.error.as_deref()),
            (Verdict::Error, Some("no result.json artifact"))
        );
        let empty = FullResult {
            success: true,
            ..Default::default()
        };
        assert_eq!(
            Outcome::judge("passed", Some(empty), None).verdict,
            Verdict::Failed
        );
    }

    #[test]
    fn a_claimed_test_count_costs_nothing_to_report() {
        let mut r: FullResult = serde_json::from_str(PASSING).unwrap();
        let run = r.runs.get_mut("test").unwrap().run.as_mut().unwrap();
        run.result
            .insert("test-count".into(), "1000000000000".into());
        assert_eq!(run.test_counts(), Some((2, 1_000_000_000_000)));
    }

    #[test]
    fn every_field_the_program_fills_is_capped() {
        let huge = "x".repeat(100_000);
        let mut result = serde_json::json!({"success": true, "error": huge,
            "system": {"gpu": huge, "hostname": huge},
            "runs": {"test": {"start": huge, "run": {"command": huge, "stdout": huge,
                "result": {"test.0.message": huge, "nested": [1, [2, {"a": huge}]]}},
                "profile": {"trace": huge, "download_url": huge}}}});
        for i in 0..100 {
            result["runs"][format!("extra{i}")] = serde_json::json!({});
        }
        result["runs"][huge.clone()] = serde_json::json!({});
        let r = FullResult::parse(result.to_string().as_bytes()).unwrap();
        assert!(r.runs.len() <= caps::RUNS);
        assert!(r.error.len() <= caps::TEXT && r.system.gpu.len() <= caps::SHORT);
        let eval = &r.runs["test"];
        let run = eval.run.as_ref().unwrap();
        assert!(run.command.len() <= caps::TEXT && run.stdout.len() <= caps::LOG);
        assert!(
            run.result
                .values()
                .all(|v| v.as_str().is_some_and(|s| s.len() <= caps::VALUE))
        );
        assert!(eval.start.as_ref().unwrap().len() <= caps::SHORT);
        let trace = eval.profile.as_ref().unwrap().trace.as_ref().unwrap();
        assert!(trace.len() <= caps::LOG);
        assert!(serde_json::to_vec(&r).unwrap().len() < 200_000);
    }

    #[test]
    fn profiler_reports_are_kept_whole_within_their_budget_and_never_cut() {
        let report = |n: usize| "QUJD".repeat(n / 4);
        let result = serde_json::json!({"runs": {"profile.0": {"run": {"result": {
            "benchmark.0.report": report(40 * 1024),
            "benchmark.1.report": report(30 * 1024),
            "benchmark.2.report": report(20 * 1024),
            "benchmark.x.report": report(8 * 1024),
            "benchmark.0.spec": report(8 * 1024),
        }}}}});
        let r = FullResult::parse(result.to_string().as_bytes()).unwrap();
        let kept = &r.runs["profile.0"].run.as_ref().unwrap().result;
        let len = |k: &str| kept.get(k).and_then(|v| v.as_str()).map(str::len);
        // (key, what is kept): whole while the 64 KiB last, then dropped with a note.
        for (key, expected) in [
            ("benchmark.0.report", Some(40 * 1024)),
            ("benchmark.1.report", None),
            ("benchmark.2.report", Some(20 * 1024)),
            ("benchmark.x.report", Some(caps::VALUE)),
            ("benchmark.0.spec", Some(caps::VALUE)),
        ] {
            assert_eq!(len(key), expected, "{key}");
        }
        let note = kept["benchmark.1.report_dropped"].as_str().unwrap();
        assert_eq!(note, "30720 bytes: over the 64 KiB kept");
        assert!(!kept.contains_key("benchmark.0.report_dropped"));
    }

    #[test]
    fn a_node_s_failure_is_never_the_submission_s() {
        let infra = serde_json::json!({"success": false, "error": "x", "runs": {},
            "infra": {"stage": "preflight", "reason": "foreign_process",
                "detail": "pid 4242 is on GPU 0"}});
        let result = FullResult::parse(infra.to_string().as_bytes()).unwrap();
        for state in ["failed", "passed"] {
            let outcome = Outcome::judge(state, Some(result.clone()), None);
            assert_eq!(outcome.verdict, Verdict::Infra, "{state}");
            let error = outcome.error.unwrap();
            assert!(
                error.contains("not your code") && error.contains("pid 4242"),
                "{error}"
            );
        }
        assert_eq!(Verdict::Infra.as_str(), "infra");
    }

    #[test]
    fn a_run_throttled_on_every_try_is_not_ranked_and_not_the_node_s_failure() {
        let throttled = serde_json::json!({"success": false, "error": "Not ranked", "runs": {
            "leaderboard": {"run": {"success": true, "passed": true}}},
            "throttled": {"mode": "leaderboard", "slowdowns": ["SwThermalSlowdown"], "retry": 1,
                "cooldown_secs": 30, "readings": [{"index": 0, "temperature_c": 91.0}]}});
        let result = FullResult::parse(throttled.to_string().as_bytes()).unwrap();
        let t = result.throttled.clone().unwrap();
        assert_eq!((t.retry, t.readings[0].temperature_c), (1, Some(91.0)));
        let outcome = Outcome::judge("passed", Some(result), None);
        assert_eq!(outcome.verdict, Verdict::Throttled);
        let error = outcome.error.unwrap();
        assert!(
            error.starts_with("Not ranked")
                && error.contains("SwThermalSlowdown")
                && error.contains("after a 30 s cool-down")
                && !error.contains("not your code"),
            "{error}"
        );
        // A run that failed is a failure, whatever the GPU did.
        let mut failing = throttled.clone();
        failing["runs"]["leaderboard"]["run"]["passed"] = serde_json::json!(false);
        let result = FullResult::parse(failing.to_string().as_bytes()).unwrap();
        assert_eq!(
            Outcome::judge("passed", Some(result), None).verdict,
            Verdict::Failed
        );
        assert_eq!(Verdict::Throttled.as_str(), "throttled");
        // An oversized report is not the runner's: left out, the rest read.
        let huge = serde_json::json!({"success": true, "runs": {},
            "throttled": {"mode": "x".repeat(100_000)}});
        let read = FullResult::parse(huge.to_string().as_bytes()).unwrap();
        assert!(read.throttled.is_none() && read.success);
    }

    #[test]
    fn fail_reasons_match_kernelbot() {
        let run = |code| RunResult {
            exit_code: code,
            ..Default::default()
        };
        assert_eq!(run(114).fail_reason(), " (timeout)");
        assert_eq!(run(110).fail_reason(), " (cuda api error)");
        assert_eq!(run(112).fail_reason(), "");
        assert_eq!(run(1).fail_reason(), " (internal error 1)");
    }
}
