//! kernelbot's full report as a text file, attached to the final Discord message of a run
//! that did not pass: each test's spec and status with the failing ones' messages, the
//! compiler's output, a crashed run's output, each capped, so the message stays short.

use std::fmt::Write as _;

use crate::result::{CompileResult, FullResult, Outcome, RunResult, Verdict};
use crate::text::truncate;
/// Characters kept of one captured output (compiler output, stdout, stderr).
const MAX_OUTPUT: usize = 8 * 1024;
/// Characters kept of one test's spec or message.
const MAX_LINE: usize = 2 * 1024;
/// Tests listed per run at most (a run may claim any number).
const MAX_TESTS: usize = 200;

/// The report for `outcome`, or `None` when there is nothing to attach (a pass, or no result).
pub(crate) fn attachment(outcome: &Outcome) -> Option<String> {
    let result = outcome.result.as_ref()?;
    (outcome.verdict != Verdict::Passed).then(|| full_report(outcome, result))
}

fn full_report(outcome: &Outcome, result: &FullResult) -> String {
    let mut out = format!(
        "verdict: {}\nbuild: {}\n",
        outcome.verdict.as_str(),
        outcome.build_state
    );
    if let Some(e) = outcome.error.as_deref().filter(|e| !e.is_empty()) {
        let _ = writeln!(out, "error: {}", truncate(e, MAX_LINE));
    }
    let s = &result.system;
    let _ = writeln!(out, "system: {} ({}, {})", s.gpu, s.runtime, s.platform);
    for (name, eval) in result.ordered_runs() {
        let _ = write!(out, "\n== {name} ==\n");
        if let Some(c) = eval.compilation.as_ref() {
            compilation(&mut out, c);
        }
        if let Some(r) = eval.run.as_ref() {
            run(&mut out, r);
        }
    }
    out
}

fn compilation(out: &mut String, c: &CompileResult) {
    if c.success {
        out.push_str("compilation: ok\n");
        return;
    }
    if !c.nvcc_found {
        out.push_str("compilation: failed (nvcc not found)\n");
    } else {
        let _ = writeln!(out, "compilation: failed (exit code {})", c.exit_code);
    }
    section(out, "command", &c.command);
    section(out, "compiler stdout", &c.stdout);
    section(out, "compiler stderr", &c.stderr);
}

fn run(out: &mut String, r: &RunResult) {
    let _ = writeln!(
        out,
        "run: {} (exit code {}, {:.2} s)",
        match (r.success, r.passed) {
            (true, true) => "passed".to_owned(),
            (true, false) => "failed".to_owned(),
            (false, _) => format!("crashed{}", r.fail_reason()),
        },
        r.exit_code,
        r.duration
    );
    for kind in ["test", "benchmark"] {
        cases(out, r, kind);
    }
    if !(r.success && r.passed) {
        section(out, "stdout", &r.stdout);
        section(out, "stderr", &r.stderr);
    }
}

/// One line per `<kind>.<i>` the run reported, with its spec and, when it failed, why.
fn cases(out: &mut String, r: &RunResult, kind: &str) {
    let mut indices: Vec<u64> = r
        .result
        .keys()
        .filter_map(|k| k.strip_prefix(kind)?.strip_prefix('.')?.split_once('.'))
        .filter_map(|(i, _)| i.parse().ok())
        .collect();
    indices.sort_unstable();
    indices.dedup();
    for i in indices.iter().take(MAX_TESTS) {
        let value = |field: &str| r.value(&format!("{kind}.{i}.{field}"));
        let status = value("status").unwrap_or_else(|| "?".into());
        let spec = value("spec").unwrap_or_default();
        let _ = writeln!(out, "{kind} {i}: {status}  {}", truncate(&spec, MAX_LINE));
        for field in ["error", "message"] {
            if let Some(text) = value(field).filter(|t| !t.is_empty()) {
                let _ = writeln!(out, "  {field}: {}", truncate(&text, MAX_LINE));
            }
        }
    }
    if indices.len() > MAX_TESTS {
        let _ = writeln!(out, "… {} more", indices.len() - MAX_TESTS);
    }
}

fn section(out: &mut String, title: &str, text: &str) {
    let text = text.trim_end();
    if text.is_empty() {
        return;
    }
    let _ = write!(out, "--- {title} ---\n{}\n", truncate(text, MAX_OUTPUT));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::EvalResult;
    use serde_json::json;

    fn outcome(result: FullResult) -> Outcome {
        Outcome::judge("passed", Some(result), None)
    }

    fn with_run(name: &str, run: RunResult, compilation: Option<CompileResult>) -> FullResult {
        let mut result = FullResult {
            success: true,
            ..Default::default()
        };
        result.runs.insert(
            name.into(),
            EvalResult {
                run: Some(run),
                compilation,
                ..Default::default()
            },
        );
        result
    }

    #[test]
    fn a_failing_test_run_lists_every_test_and_each_failures_message() {
        let mut run = RunResult {
            success: true,
            passed: false,
            exit_code: 112,
            stderr: "warning: slow path".into(),
            ..Default::default()
        };
        for (k, v) in [
            ("test-count", json!(3)),
            ("test.0.spec", json!("size: 1024; seed: 1")),
            ("test.0.status", json!("pass")),
            ("test.1.spec", json!("size: 4096; seed: 2")),
            ("test.1.status", json!("fail")),
            ("test.1.error", json!("mismatch at index 17: 0.5 != 0.25")),
            ("test.2.spec", json!("size: 16384; seed: 3")),
            ("test.2.status", json!("fail")),
            ("test.2.error", json!("max error 3.1e-2 > 1e-3")),
        ] {
            run.result.insert(k.into(), v);
        }
        let text = attachment(&outcome(with_run("test", run, None))).expect("a failure");
        assert!(text.contains("verdict: failed"), "{text}");
        assert!(text.contains("test 0: pass  size: 1024; seed: 1"), "{text}");
        assert!(
            text.contains(
                "test 1: fail  size: 4096; seed: 2\n  error: mismatch at index 17: 0.5 != 0.25"
            ),
            "{text}"
        );
        assert!(text.contains("  error: max error 3.1e-2 > 1e-3"), "{text}");
        assert!(
            text.contains("--- stderr ---\nwarning: slow path"),
            "{text}"
        );
    }

    #[test]
    fn a_compile_error_shows_the_compilers_output_capped() {
        let compile = CompileResult {
            nvcc_found: true,
            success: false,
            exit_code: 1,
            command: "nvcc -O3 submission.cu".into(),
            stderr: format!(
                "submission.cu(3): error: expected a ';'\n{}",
                "x".repeat(50_000)
            ),
            ..Default::default()
        };
        let mut result = with_run("test", RunResult::default(), Some(compile));
        result.runs.get_mut("test").unwrap().run = None;
        let text = attachment(&outcome(result)).expect("a failure");
        assert!(text.contains("compilation: failed (exit code 1)"), "{text}");
        assert!(text.contains("--- compiler stderr ---\nsubmission.cu(3): error: expected a ';'"));
        assert!(text.len() < 12 * 1024, "capped: {}", text.len());
    }

    #[test]
    fn a_crash_shows_its_output_and_a_pass_attaches_nothing() {
        let crashed = RunResult {
            success: false,
            exit_code: 114,
            stdout: "started".into(),
            stderr: "Traceback: boom".into(),
            ..Default::default()
        };
        let text = attachment(&outcome(with_run("benchmark", crashed, None))).unwrap();
        assert!(
            text.contains("run: crashed (timeout) (exit code 114"),
            "{text}"
        );
        assert!(text.contains("--- stderr ---\nTraceback: boom"), "{text}");

        let passed = RunResult {
            success: true,
            passed: true,
            ..Default::default()
        };
        let mut ok = outcome(with_run("test", passed, None));
        assert_eq!(ok.verdict, Verdict::Passed);
        assert_eq!(attachment(&ok), None);
        ok.result = None;
        ok.verdict = Verdict::Error;
        assert_eq!(attachment(&ok), None, "no result, nothing to attach");
    }
}
