//! Kernelbot's `result.json` (`FullResult`) and the verdict we draw from it.
//!
//! Parsing is tolerant: every field has a default and unknown fields are ignored, so a
//! runner that adds fields (or an older one that lacks some) still yields a report.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
    pub trace: String,
    pub download_url: Option<String>,
}

impl FullResult {
    /// Parses `result.json`, capping captured logs so the stored job stays small.
    pub fn parse(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        let mut parsed: Self = serde_json::from_slice(bytes)?;
        for eval in parsed.runs.values_mut() {
            if let Some(c) = eval.compilation.as_mut() {
                cap(&mut c.stdout);
                cap(&mut c.stderr);
            }
            if let Some(r) = eval.run.as_mut() {
                cap(&mut r.stdout);
                cap(&mut r.stderr);
            }
        }
        Ok(parsed)
    }

    /// Runs in the order kernelbot performs them, then any others by name.
    pub fn ordered_runs(&self) -> Vec<(&str, &EvalResult)> {
        let rank = |name: &str| match name {
            "test" => 0,
            "benchmark" => 1,
            n if n.starts_with("profile") => 2,
            "leaderboard" => 3,
            _ => 4,
        };
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

    /// `(passed, total)` from the test entries, when the run reported any.
    pub fn test_counts(&self) -> Option<(usize, usize)> {
        let total: usize = self.value("test-count")?.trim().parse().ok()?;
        let passed = (0..total)
            .filter(|i| self.value(&format!("test.{i}.status")).as_deref() == Some("pass"))
            .count();
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

fn cap(s: &mut String) {
    if s.len() > MAX_LOG_CHARS {
        let mut end = MAX_LOG_CHARS;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("\n[… output truncated]");
    }
}

/// Whether the submission passed, as users read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Passed,
    Failed,
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
}

impl Outcome {
    /// Draws the verdict. A passed build can still hold failed tests (kernelbot's runner exits
    /// 0 whenever the evaluation ran), and a failed build is never a pass.
    pub fn judge(
        build_state: &str,
        result: Option<FullResult>,
        fetch_error: Option<String>,
    ) -> Self {
        let passed =
            build_state == "passed" && result.as_ref().is_some_and(|r| r.success && r.all_passed());
        let error = match &result {
            Some(r) if !r.error.is_empty() => Some(r.error.clone()),
            _ if build_state != "passed" => Some(format!("Build {build_state}")),
            Some(r) if !r.success => Some("the runner reported failure".to_owned()),
            Some(_) => None,
            None => Some(fetch_error.unwrap_or_else(|| "result.json missing".to_owned())),
        };
        Self {
            build_state: build_state.to_owned(),
            verdict: if passed {
                Verdict::Passed
            } else {
                Verdict::Failed
            },
            error,
            result,
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
        assert_eq!(canceled.error.as_deref(), Some("Build canceled"));
        let missing = Outcome::judge("passed", None, Some("no result.json artifact".into()));
        assert_eq!(
            (missing.verdict, missing.error.as_deref()),
            (Verdict::Failed, Some("no result.json artifact"))
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
