//! kernelbot's short report of a result: one line per phase, benchmark timings, the
//! machine it ran on, and times as people read them.

use crate::result::{Conditions, FullResult, GpuReading, RunResult, Timings};
use crate::text::{plain, span, truncate};

/// kernelbot's phases in order: the run's key, its noun, what it does, and its name.
const PHASES: [(&str, &str, &str, &str); 3] = [
    ("test", "tests", "Testing", "Tests"),
    ("benchmark", "benchmarks", "Benchmarking", "Benchmarks"),
    (
        "leaderboard",
        "leaderboard",
        "Leaderboard run",
        "Leaderboard",
    ),
];

/// "Queued for 2 s, ran for 45.5 s", from what Buildkite's timestamps gave.
pub(super) fn timing_line(t: &Timings) -> Option<String> {
    let parts: Vec<String> = [("Queued for", t.queued_secs), ("ran for", t.ran_secs)]
        .into_iter()
        .filter_map(|(what, secs)| secs.map(|s| format!("{what} {}", format_secs(s))))
        .collect();
    (!parts.is_empty()).then(|| capitalised(&parts.join(", ")))
}

/// The GPU's conditions while the submission was timed, in one line: the leaderboard run's
/// (else a benchmark's) reading after it ran, and whether a slowdown was active.
pub(super) fn conditions_line(result: &FullResult) -> Option<String> {
    let timed = |name: &str| result.runs.get(name).and_then(|r| r.conditions.as_ref());
    let c: &Conditions = timed("leaderboard")
        .or_else(|| timed("benchmark"))
        .or_else(|| result.runs.values().find_map(|r| r.conditions.as_ref()))?;
    let r: &GpuReading = c.after.first().or(c.before.first())?;
    let mut parts = Vec::new();
    if let Some(mhz) = r.sm_clock_mhz {
        parts.push(format!("SM {mhz} MHz"));
    }
    if let Some(t) = r.temperature_c {
        parts.push(format!("{t:.0} °C"));
    }
    if let Some(w) = r.power_w {
        parts.push(format!("{w:.0} W"));
    }
    // A driver that names no clock-event reasons (nor AMD's status) cannot say.
    let unread = c.after.iter().chain(&c.before).all(|g| {
        g.clock_event_reasons.is_none() && g.clock_events.is_empty() && g.throttled.is_none()
    });
    let slowed: Vec<String> = c
        .after
        .iter()
        .chain(&c.before)
        .flat_map(|g| g.slowdowns())
        .collect();
    parts.push(match (c.throttled, slowed.first()) {
        (true, Some(_)) => {
            let mut names = slowed.clone();
            names.sort();
            names.dedup();
            format!("slowed down ({})", plain(&names.join(", ")))
        }
        (true, None) => "slowed down".into(),
        (false, _) if unread => "slowdowns not readable on this driver".into(),
        (false, _) => "no slowdown".into(),
    });
    if c.power_capped {
        // Every healthy GPU of its kind caps a kernel that draws its full power: a fact of
        // the run, not a fault.
        parts.push("held at its power limit (its real speed)".into());
    }
    let again = if c.attempts > 1 {
        ", measured again after a cool-down"
    } else {
        ""
    };
    Some(format!("GPU while timed: {}{again}", parts.join(", ")))
}

/// A wait or run time as people read it: `45.5 s`, `3 min 7 s`, `2 h 5 min`.
pub fn format_secs(secs: f64) -> String {
    let secs = secs.max(0.0);
    if secs < 60.0 {
        let text = format!("{secs:.1}");
        return format!("{} s", text.trim_end_matches(".0"));
    }
    let whole = secs.round() as u64;
    if whole < 3600 {
        format!("{} min {} s", whole / 60, whole % 60)
    } else {
        format!("{} h {} min", whole / 3600, (whole % 3600) / 60)
    }
}

pub(super) fn capitalised(s: &str) -> String {
    let mut chars = s.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// Kernelbot's short report: one ✅/❌ line per phase, stopping at the first failure, with
/// test counts and benchmark timings where the run reported them.
pub(crate) fn short_report(result: &FullResult) -> Vec<String> {
    let mut lines = Vec::new();
    if compilation(result, &mut lines) && phases(result, &mut lines) {
        lines.extend(profiles(result));
    }
    lines
}

/// The compile step's line, if the first run compiled anything; whether to go on.
fn compilation(result: &FullResult, lines: &mut Vec<String>) -> bool {
    let first = result.ordered_runs().first().map(|(_, e)| *e);
    let Some(c) = first.and_then(|e| e.compilation.as_ref()) else {
        return true;
    };
    if c.success {
        lines.push("✅ Compilation successful".to_owned());
    } else if c.nvcc_found {
        lines.push(format!("❌ Compilation failed (exit code {})", c.exit_code));
    } else {
        lines.push("❌ Compilation failed (nvcc not found)".to_owned());
    }
    c.success
}

/// One line per phase (and its benchmarks); whether every phase passed.
fn phases(result: &FullResult, lines: &mut Vec<String>) -> bool {
    let full = result.runs.contains_key("leaderboard");
    for (key, noun, doing, missing) in PHASES {
        let Some(run) = result.runs.get(key).and_then(|e| e.run.as_ref()) else {
            if full {
                lines.push(format!("❌ {missing} missing"));
            }
            continue;
        };
        if !run.success {
            lines.push(format!("❌ Running {noun} failed{}", run.fail_reason()));
            return false;
        }
        let ok = run.passed;
        let mut line = format!(
            "{} {doing} {}",
            if ok { "✅" } else { "❌" },
            if ok { "successful" } else { "failed" }
        );
        if let Some((passed, total)) = run.test_counts() {
            line.push_str(&format!(" — Passed {passed}/{total} tests"));
        }
        lines.push(line);
        lines.extend(benchmark_lines(run));
        if !ok {
            return false;
        }
    }
    true
}

fn profiles(result: &FullResult) -> impl Iterator<Item = String> + '_ {
    result
        .runs
        .iter()
        .filter(|(k, _)| k.starts_with("profile"))
        .map(|(name, eval)| {
            if eval.run.as_ref().is_some_and(|r| r.success) {
                format!("✅ Profiling successful ({})", plain(name))
            } else {
                format!("❌ Profiling failed ({})", plain(name))
            }
        })
}

fn benchmark_lines(run: &RunResult) -> Vec<String> {
    run.benchmarks()
        .into_iter()
        .filter_map(|(spec, mean, err)| {
            let mean = mean?;
            let err = err
                .map(|e| format!(" ± {}", format_ns(e)))
                .unwrap_or_default();
            Some(format!(
                "{} ⏱ {}{err}",
                span(&truncate(&spec, 120)),
                format_ns(mean)
            ))
        })
        .collect()
}

/// Formats nanoseconds with a readable unit and three significant digits.
pub(crate) fn format_ns(ns: f64) -> String {
    let (value, unit) = match ns.abs() {
        v if v >= 1e9 => (ns / 1e9, "s"),
        v if v >= 1e6 => (ns / 1e6, "ms"),
        v if v >= 1e3 => (ns / 1e3, "µs"),
        _ => (ns, "ns"),
    };
    let decimals = match value.abs() {
        v if v >= 100.0 => 0,
        v if v >= 10.0 => 1,
        _ => 2,
    };
    format!("{value:.decimals$} {unit}")
}

pub(super) fn system_lines(result: &FullResult) -> Option<String> {
    let s = &result.system;
    let rows = [
        ("GPU", s.gpu.clone()),
        ("CPU", s.cpu.clone()),
        (
            "Device count",
            if s.device_count > 0 {
                s.device_count.to_string()
            } else {
                String::new()
            },
        ),
        ("Runtime", s.runtime.clone()),
        ("Platform", s.platform.clone()),
        ("Torch", s.torch.clone()),
        ("Hostname", s.hostname.clone()),
    ];
    let lines: Vec<String> = rows
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("* {k}: {}", span(&v)))
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_s_conditions_read_in_one_line() {
        // Read as AMD reads them: named events, and a throttle status.
        let reading = |sm: u32, events: &[&str]| GpuReading {
            sm_clock_mhz: Some(sm),
            temperature_c: Some(61.4),
            power_w: Some(402.2),
            clock_events: events.iter().map(|e| (*e).to_owned()).collect(),
            throttled: Some(false),
            ..GpuReading::default()
        };
        let with = |name: &str, c: Conditions| {
            let mut r = FullResult::default();
            r.runs.insert(
                name.into(),
                crate::result::EvalResult {
                    conditions: Some(c),
                    ..Default::default()
                },
            );
            r
        };
        let calm = Conditions {
            before: vec![reading(1980, &[])],
            after: vec![reading(1755, &[])],
            throttled: false,
            power_capped: false,
            attempts: 1,
        };
        let capped = Conditions {
            after: vec![reading(1755, &["SwPowerCap"])],
            power_capped: true,
            ..calm.clone()
        };
        let hot_and_capped = Conditions {
            after: vec![reading(1200, &["SwPowerCap", "SwThermalSlowdown"])],
            throttled: true,
            power_capped: true,
            ..calm.clone()
        };
        let cooled = Conditions {
            attempts: 2,
            ..calm.clone()
        };
        let hot = Conditions {
            after: vec![reading(1200, &["HwThermalSlowdown"])],
            throttled: true,
            ..calm.clone()
        };
        let table = [
            (
                with("leaderboard", calm.clone()),
                Some("GPU while timed: SM 1755 MHz, 61 °C, 402 W, no slowdown"),
            ),
            (
                with("benchmark", cooled),
                Some(
                    "GPU while timed: SM 1755 MHz, 61 °C, 402 W, no slowdown, measured again after a cool-down",
                ),
            ),
            (
                with("leaderboard", hot),
                Some("GPU while timed: SM 1200 MHz, 61 °C, 402 W, slowed down (HwThermalSlowdown)"),
            ),
            (
                with("leaderboard", capped),
                Some(
                    "GPU while timed: SM 1755 MHz, 61 °C, 402 W, no slowdown, held at its power limit (its real speed)",
                ),
            ),
            (
                with("leaderboard", hot_and_capped),
                Some(
                    "GPU while timed: SM 1200 MHz, 61 °C, 402 W, slowed down (SwThermalSlowdown), held at its power limit (its real speed)",
                ),
            ),
            (
                with(
                    "benchmark",
                    Conditions {
                        before: vec![GpuReading::default()],
                        after: vec![GpuReading {
                            sm_clock_mhz: Some(1755),
                            ..GpuReading::default()
                        }],
                        ..calm.clone()
                    },
                ),
                Some("GPU while timed: SM 1755 MHz, slowdowns not readable on this driver"),
            ),
            (FullResult::default(), None),
        ];
        for (result, line) in table {
            assert_eq!(conditions_line(&result).as_deref(), line);
        }
    }

    fn result(json: &str) -> FullResult {
        FullResult::parse(json.as_bytes()).unwrap()
    }

    fn run_json(success: bool, passed: bool, code: i64, extra: &str) -> String {
        format!(
            r#"{{"success": {success}, "passed": {passed}, "exit_code": {code}, "result": {{{extra}}}}}"#
        )
    }

    #[test]
    fn reports_tests_and_benchmarks_like_kernelbot() {
        let r = result(&format!(
            r#"{{"success": true, "system": {{"gpu": "H100", "runtime": "CUDA"}}, "runs": {{
                "test": {{"run": {}}},
                "benchmark": {{"run": {}}}}}}}"#,
            run_json(
                true,
                true,
                0,
                r#""test-count": "3", "test.0.status": "pass", "test.1.status": "pass", "test.2.status": "pass""#
            ),
            run_json(
                true,
                true,
                0,
                r#""benchmark-count": "1", "benchmark.0.spec": "n=4096", "benchmark.0.mean": "1234567", "benchmark.0.err": "2500""#
            ),
        ));
        assert_eq!(
            short_report(&r),
            vec![
                "✅ Testing successful — Passed 3/3 tests",
                "✅ Benchmarking successful",
                "`n=4096` ⏱ 1.23 ms ± 2.50 µs",
            ]
        );
    }

    #[test]
    fn stops_at_the_first_failure_with_its_reason() {
        let timeout = result(&format!(
            r#"{{"runs": {{"test": {{"run": {}}}}}}}"#,
            run_json(false, false, 114, "")
        ));
        assert_eq!(
            short_report(&timeout),
            vec!["❌ Running tests failed (timeout)"]
        );
        let compile = result(
            r#"{"runs": {"test": {"compilation": {"nvcc_found": true, "success": false, "exit_code": 2}}}}"#,
        );
        assert_eq!(
            short_report(&compile),
            vec!["❌ Compilation failed (exit code 2)"]
        );
        let failing = result(&format!(
            r#"{{"runs": {{"test": {{"run": {}}}, "leaderboard": {{}}}}}}"#,
            run_json(
                true,
                false,
                112,
                r#""test-count": "2", "test.0.status": "pass", "test.1.status": "fail""#
            )
        ));
        assert_eq!(
            short_report(&failing),
            vec!["❌ Testing failed — Passed 1/2 tests"]
        );
    }

    #[test]
    fn formats_waits_and_runs() {
        assert_eq!(format_secs(2.0), "2 s");
        assert_eq!(format_secs(45.5), "45.5 s");
        assert_eq!(format_secs(187.4), "3 min 7 s");
        assert_eq!(format_secs(7_500.0), "2 h 5 min");
        assert_eq!(format_secs(-1.0), "0 s");
        let t = Timings {
            queued_secs: Some(2.0),
            ran_secs: None,
        };
        assert_eq!(timing_line(&t).as_deref(), Some("Queued for 2 s"));
        assert_eq!(timing_line(&Timings::default()), None);
    }

    #[test]
    fn formats_durations() {
        assert_eq!(format_ns(950.0), "950 ns");
        assert_eq!(format_ns(12_345.0), "12.3 µs");
        assert_eq!(format_ns(2.5e9), "2.50 s");
    }
}
