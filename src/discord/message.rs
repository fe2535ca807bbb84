//! What we send to Discord: one message per job, rendered from the job's current state and
//! fitted to Discord's limits.

use serde::Serialize;

use crate::jobs::model::{Job, JobState};
use crate::result::{FullResult, Outcome, RunResult, Verdict};

/// Discord's documented limits (counted in characters).
pub mod limits {
    pub const CONTENT: usize = 2000;
    pub const EMBEDS: usize = 10;
    pub const TITLE: usize = 256;
    pub const DESCRIPTION: usize = 4096;
    pub const FIELDS: usize = 25;
    pub const FIELD_NAME: usize = 256;
    pub const FIELD_VALUE: usize = 1024;
    pub const FOOTER: usize = 2048;
    pub const EMBED_TOTAL: usize = 6000;
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Message {
    pub content: String,
    pub embeds: Vec<Embed>,
    /// Always sent, edits too: an edit without it falls back to Discord's default parsing,
    /// and user-supplied text (titles, test names) must never ping anyone.
    pub allowed_mentions: AllowedMentions,
    /// The report file's text, sent as the `files[0]` part; the JSON lists it under
    /// `attachments` (its id and name, never its text).
    #[serde(
        rename = "attachments",
        skip_serializing_if = "Option::is_none",
        serialize_with = "attachment_entries"
    )]
    pub file: Option<String>,
}

/// `[{"id": 0, "filename": "report.txt"}]`: the entry naming the `files[0]` part.
fn attachment_entries<S: serde::Serializer>(_: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Entry {
        id: u32,
        filename: &'static str,
    }
    [Entry {
        id: 0,
        filename: super::report::FILENAME,
    }]
    .serialize(s)
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AllowedMentions {
    pub parse: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Embed {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub color: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<Field>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Field {
    pub name: String,
    pub value: String,
    pub inline: bool,
}

const GREEN: u32 = 0x2e_cc_71;
const RED: u32 = 0xe7_4c_3c;

/// Shortens `s` to at most `max` characters, marking the cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

impl Message {
    /// Cuts every part to Discord's limits, so a valid job never yields a rejected message.
    pub fn fit(mut self) -> Self {
        self.content = truncate(&self.content, limits::CONTENT);
        self.embeds.truncate(limits::EMBEDS);
        let mut budget = limits::EMBED_TOTAL;
        for embed in &mut self.embeds {
            embed.fields.truncate(limits::FIELDS);
            embed.title = embed
                .title
                .take()
                .map(|t| truncate(&t, limits::TITLE.min(budget)));
            budget -= embed.title.as_ref().map_or(0, |t| t.chars().count());
            for field in &mut embed.fields {
                field.name = truncate(&field.name, limits::FIELD_NAME);
                field.value = truncate(&field.value, limits::FIELD_VALUE);
            }
            // Fields are kept while they fit; the description gets what is left.
            let mut kept = Vec::new();
            for field in embed.fields.drain(..) {
                let size = field.name.chars().count() + field.value.chars().count();
                if size + 1 > budget {
                    break;
                }
                budget -= size;
                kept.push(field);
            }
            embed.fields = kept;
            embed.description = embed
                .description
                .take()
                .map(|d| truncate(&d, limits::DESCRIPTION.min(budget)))
                .filter(|d| !d.is_empty());
            budget -= embed.description.as_ref().map_or(0, |d| d.chars().count());
        }
        self
    }

    /// The total Discord counts against its 6000-character embed limit.
    pub fn embed_chars(&self) -> usize {
        self.embeds
            .iter()
            .map(|e| {
                e.title.as_ref().map_or(0, |t| t.chars().count())
                    + e.description.as_ref().map_or(0, |d| d.chars().count())
                    + e.fields
                        .iter()
                        .map(|f| f.name.chars().count() + f.value.chars().count())
                        .sum::<usize>()
            })
            .sum()
    }
}

fn build_link(job: &Job) -> String {
    match &job.build {
        Some(b) => format!("build [#{}](<{}>)", b.number, b.web_url),
        None => "build pending".to_owned(),
    }
}

/// The message for a job as it is now.
pub fn render(job: &Job) -> Message {
    let title = job
        .title
        .clone()
        .unwrap_or_else(|| format!("Run {}", job.run_id));
    let head = format!("**{}** on `{}`", title, job.gpu);
    let (content, embeds) = match job.state {
        JobState::Submitted => (
            format!("{head}\n> ⏳ Submitting to queue `{}`", job.queue),
            vec![],
        ),
        JobState::Scheduled => (
            format!(
                "{head}\n> ⏳ Queued on `{}`, {}",
                job.queue,
                build_link(job)
            ),
            vec![],
        ),
        JobState::Running => (
            format!(
                "{head}\n> 🏃 Running on `{}`, {}",
                job.queue,
                build_link(job)
            ),
            vec![],
        ),
        JobState::Failed => (
            format!(
                "{head} ❌ failure\n> Submission failed: {}",
                job.failure.as_deref().unwrap_or("unknown reason")
            ),
            vec![],
        ),
        JobState::Finished => match &job.outcome {
            // A private run shows one verdict line and the build link: no timing, no report.
            Some(outcome) if job.private => (
                format!(
                    "{head}\n> {}\n> {}",
                    verdict_sentence(outcome.verdict, &job.queue),
                    capitalised(&build_link(job))
                ),
                vec![],
            ),
            Some(outcome) => final_report(job, &head, outcome),
            None => (
                format!("{head} ❌ failure\n> Finished without an outcome"),
                vec![],
            ),
        },
    };
    // A run that did not pass carries kernelbot's full report (never a private one).
    let file = match (&job.outcome, job.state, job.private) {
        (Some(outcome), JobState::Finished, false) => super::report::attachment(outcome),
        _ => None,
    };
    Message {
        content,
        embeds,
        allowed_mentions: AllowedMentions::default(),
        file,
    }
    .fit()
}

/// The one sentence Discord shows for each verdict. Fixed texts: nothing a third party wrote
/// reaches the channel through them.
pub fn verdict_sentence(verdict: Verdict, queue: &str) -> String {
    match verdict {
        Verdict::Passed => "✅ Passed: every run succeeded.".into(),
        Verdict::Failed => {
            "❌ Failed: a test, benchmark or compile step failed, or the build failed.".into()
        }
        Verdict::Canceled => "❌ Canceled: the build was canceled.".into(),
        Verdict::Skipped => "❌ Skipped: Buildkite skipped the build.".into(),
        Verdict::QueueTimeout => {
            format!("❌ Timed out in the queue: no agent on queue `{queue}` started it in time.")
        }
        Verdict::Expired => "❌ Expired: the job ran past its maximum age and was stopped.".into(),
        Verdict::Error => "❌ Error: the build left no usable result.".into(),
    }
}

fn final_report(job: &Job, head: &str, outcome: &Outcome) -> (String, Vec<Embed>) {
    let passed = outcome.verdict == Verdict::Passed;
    let mut content = format!(
        "{head} {}\n> {}\n> {} ({})",
        if passed { "✅ success" } else { "❌ failure" },
        verdict_sentence(outcome.verdict, &job.queue),
        capitalised(&build_link(job)),
        outcome.build_state
    );
    if let Some(line) = outcome.timings.as_ref().and_then(timing_line) {
        content.push_str(&format!("\n> ⏱ {line}"));
    }
    let mut lines = Vec::new();
    if let Some(error) = &outcome.error {
        lines.push(format!("❌ {error}"));
    }
    let mut fields = Vec::new();
    if let Some(result) = &outcome.result {
        lines.extend(short_report(result));
        if let Some(system) = system_lines(result) {
            fields.push(Field {
                name: "Running on".into(),
                value: system,
                inline: false,
            });
        }
    }
    let embed = Embed {
        title: Some(format!("Report for {}", job.run_id)),
        url: job.build.as_ref().map(|b| b.web_url.clone()),
        description: Some(lines.join("\n")),
        color: Some(if passed { GREEN } else { RED }),
        fields,
    };
    (content, vec![embed])
}

/// "Queued for 2 s, ran for 45.5 s", from what Buildkite's timestamps gave.
fn timing_line(t: &crate::result::Timings) -> Option<String> {
    let parts: Vec<String> = [("Queued for", t.queued_secs), ("ran for", t.ran_secs)]
        .into_iter()
        .filter_map(|(what, secs)| secs.map(|s| format!("{what} {}", format_secs(s))))
        .collect();
    (!parts.is_empty()).then(|| capitalised(&parts.join(", ")))
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

fn capitalised(s: &str) -> String {
    let mut chars = s.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// Kernelbot's short report: one ✅/❌ line per phase, stopping at the first failure, with
/// test counts and benchmark timings where the run reported them.
pub fn short_report(result: &FullResult) -> Vec<String> {
    let mut lines = Vec::new();
    let full = result.runs.contains_key("leaderboard");
    if let Some(first) = result.ordered_runs().first().map(|(_, e)| e)
        && let Some(c) = &first.compilation
    {
        if !c.success {
            lines.push(if c.nvcc_found {
                format!("❌ Compilation failed (exit code {})", c.exit_code)
            } else {
                "❌ Compilation failed (nvcc not found)".to_owned()
            });
            return lines;
        }
        lines.push("✅ Compilation successful".to_owned());
    }
    let phases = [
        ("test", "tests", "Testing", "Tests"),
        ("benchmark", "benchmarks", "Benchmarking", "Benchmarks"),
        (
            "leaderboard",
            "leaderboard",
            "Leaderboard run",
            "Leaderboard",
        ),
    ];
    for (key, noun, doing, missing) in phases {
        let Some(run) = result.runs.get(key).and_then(|e| e.run.as_ref()) else {
            if full {
                lines.push(format!("❌ {missing} missing"));
            }
            continue;
        };
        if !run.success {
            lines.push(format!("❌ Running {noun} failed{}", run.fail_reason()));
            return lines;
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
            return lines;
        }
    }
    for (name, eval) in result.runs.iter().filter(|(k, _)| k.starts_with("profile")) {
        if eval.run.as_ref().is_some_and(|r| r.success) {
            lines.push(format!("✅ Profiling successful ({name})"));
        } else {
            lines.push(format!("❌ Profiling failed ({name})"));
        }
    }
    lines
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
                "`{}` ⏱ {}{err}",
                truncate(&spec, 120),
                format_ns(mean)
            ))
        })
        .collect()
}

/// Formats nanoseconds with a readable unit and three significant digits.
pub fn format_ns(ns: f64) -> String {
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

fn system_lines(result: &FullResult) -> Option<String> {
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
        .map(|(k, v)| format!("* {k}: `{v}`"))
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::model::{BuildRef, Transition};

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
    fn fit_keeps_every_part_within_discord_limits() {
        let msg = Message {
            file: None,
            content: "x".repeat(5000),
            embeds: vec![Embed {
                title: Some("t".repeat(400)),
                description: Some("d".repeat(9000)),
                fields: (0..40)
                    .map(|i| Field {
                        name: format!("{i}{}", "n".repeat(300)),
                        value: "v".repeat(2000),
                        inline: false,
                    })
                    .collect(),
                ..Default::default()
            }],
            allowed_mentions: AllowedMentions::default(),
        }
        .fit();
        assert_eq!(msg.content.chars().count(), limits::CONTENT);
        assert!(msg.content.ends_with('…'));
        let e = &msg.embeds[0];
        assert!(e.title.as_ref().unwrap().chars().count() <= limits::TITLE);
        assert!(e.fields.len() <= limits::FIELDS);
        assert!(
            e.fields
                .iter()
                .all(|f| f.value.chars().count() <= limits::FIELD_VALUE
                    && f.name.chars().count() <= limits::FIELD_NAME)
        );
        assert!(
            msg.embed_chars() <= limits::EMBED_TOTAL,
            "{}",
            msg.embed_chars()
        );
    }

    #[test]
    fn every_state_renders_with_mentions_disabled() {
        let mut job = Job::new(
            "r1".parse().unwrap(),
            "H100_BK".into(),
            "h100".into(),
            Some("@everyone".into()),
            None,
            0,
        );
        let json = serde_json::to_value(render(&job)).unwrap();
        assert_eq!(json["allowed_mentions"], serde_json::json!({"parse": []}));
        job = job
            .apply(&Transition::to(JobState::Running, 1).with_build(BuildRef {
                id: "i".into(),
                number: 9,
                web_url: "https://bk/9".into(),
            }))
            .unwrap();
        assert!(
            render(&job)
                .content
                .contains("Running on `h100`, build [#9](<https://bk/9>)")
        );
        let outcome = Outcome::judge("canceled", None, None);
        job = job
            .apply(&Transition::to(JobState::Finished, 2).with_outcome(outcome))
            .unwrap();
        let msg = render(&job);
        assert!(msg.content.contains("❌ failure"));
        assert_eq!(
            msg.embeds[0].description.as_deref(),
            Some("❌ Build canceled")
        );
    }

    #[test]
    fn formats_waits_and_runs() {
        assert_eq!(format_secs(2.0), "2 s");
        assert_eq!(format_secs(45.5), "45.5 s");
        assert_eq!(format_secs(187.4), "3 min 7 s");
        assert_eq!(format_secs(7_500.0), "2 h 5 min");
        assert_eq!(format_secs(-1.0), "0 s");
        let t = crate::result::Timings {
            queued_secs: Some(2.0),
            ran_secs: None,
        };
        assert_eq!(timing_line(&t).as_deref(), Some("Queued for 2 s"));
        assert_eq!(timing_line(&crate::result::Timings::default()), None);
    }

    #[test]
    fn formats_durations() {
        assert_eq!(format_ns(950.0), "950 ns");
        assert_eq!(format_ns(12_345.0), "12.3 µs");
        assert_eq!(format_ns(2.5e9), "2.50 s");
    }
}
