//! Property tests for every parser of outside input: the signature header, webhook bodies,
//! `result.json` (through the report and the stored record), the build payload and the
//! submission body. None may panic, and what each produces stays bounded whatever it is fed.

use std::collections::BTreeMap;

use kernelbot_dispatch::buildkite::{WebhookAuth, WebhookEvent, sign};
use kernelbot_dispatch::config::QueueMap;
use kernelbot_dispatch::discord::limits;
use kernelbot_dispatch::flow::present::render;
use kernelbot_dispatch::flow::rules;
use kernelbot_dispatch::flow::submission;
use kernelbot_dispatch::jobs::{BuildRef, Job, JobState, Transition};
use kernelbot_dispatch::jobs::{JobRecord, MAX_STORED_OUTCOME};
use kernelbot_dispatch::payload;
use kernelbot_dispatch::result::{FullResult, Outcome};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|n| json!(n)),
        ".{0,24}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            btree_map(".{0,10}", inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Values the evaluation writes to its pipe: counts, times, statuses, absurd numbers, noise.
fn pipe_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("pass")),
        Just(json!("fail")),
        Just(json!("1000000000000")),
        Just(json!("18446744073709551616")),
        Just(json!("-1")),
        Just(json!("NaN")),
        (0u64..10_000).prop_map(|n| json!(n.to_string())),
        any::<f64>().prop_map(|n| json!(n.to_string())),
        ".{0,64}".prop_map(Value::String),
        "[a-z]{0,10}".prop_map(|s| json!(s.repeat(400))),
        any_json(),
    ]
}

fn pipe_key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("check".to_owned()),
        Just("test-count".to_owned()),
        Just("benchmark-count".to_owned()),
        (
            0u64..12,
            prop_oneof![Just("status"), Just("spec"), Just("message")]
        )
            .prop_map(|(i, k)| format!("test.{i}.{k}")),
        (
            0u64..12,
            prop_oneof![Just("mean"), Just("err"), Just("spec"), Just("status")]
        )
            .prop_map(|(i, k)| format!("benchmark.{i}.{k}")),
        ".{0,20}",
    ]
}

/// `result.json` shaped like kernelbot's, with anything in its fields.
fn result_json() -> impl Strategy<Value = Value> {
    let run = (
        any::<bool>(),
        any::<bool>(),
        any::<i64>(),
        btree_map(pipe_key(), pipe_value(), 0..24),
        ".{0,64}",
    )
        .prop_map(|(success, passed, code, result, stdout)| {
            json!({"success": success, "passed": passed, "exit_code": code, "result": result,
                   "stdout": stdout, "duration": 1.5})
        });
    let compilation = prop_oneof![
        Just(Value::Null),
        (any::<bool>(), any::<bool>(), any::<i64>()).prop_map(|(found, ok, code)| {
            json!({"nvcc_found": found, "success": ok, "exit_code": code, "stderr": "e"})
        }),
    ];
    let eval = (run, compilation).prop_map(|(run, compilation)| {
        json!({"start": "2026-01-01T00:00:00", "run": run, "compilation": compilation})
    });
    let name = prop_oneof![
        Just("test".to_owned()),
        Just("benchmark".to_owned()),
        Just("leaderboard".to_owned()),
        (0u8..4).prop_map(|i| format!("profile.{i}")),
        ".{0,12}",
    ];
    (
        any::<bool>(),
        ".{0,40}",
        btree_map(name, eval, 0..5),
        any_json(),
    )
        .prop_map(|(success, error, runs, system)| {
            json!({"success": success, "error": error, "runs": runs, "system": system})
        })
}

fn job() -> Job {
    let mut job = Job::new(
        "prop-run".parse().unwrap(),
        "H100_BK".into(),
        "h100".into(),
        Some("prop".into()),
        None,
        0,
    );
    job.build = Some(BuildRef {
        id: "b".into(),
        number: 1,
        web_url: "https://buildkite.com/o/p/builds/1".into(),
    });
    job
}

/// Where the code span Discord's client would start at `at` ends (the index past its closing
/// backticks), by its inline-code rule (simple-markdown's `^(`+)([\s\S]*?[^`])\1(?!`)`,
/// with a regex engine's backtracking): an opening run of backticks (the whole run first,
/// then shorter ones), at least one character, the last not a backtick, then a run of
/// exactly as many. `None`: no span starts there.
fn code_span_at(chars: &[char], at: usize) -> Option<usize> {
    let run = chars[at..].iter().take_while(|c| **c == '`').count();
    (1..=run).rev().find_map(|r| {
        let closes = |j: usize| {
            chars[j - 1] != '`'
                && chars
                    .get(j..j + r)
                    .is_some_and(|c| c.iter().all(|c| *c == '`'))
                && chars.get(j + r) != Some(&'`')
        };
        (at + r + 1..chars.len())
            .find(|&j| closes(j))
            .map(|j| j + r)
    })
}

/// The markdown a message's text acts on, in order, as Discord's client reads it: every
/// unescaped markdown character and line break outside code spans, and each code span as
/// `` ` `` (what is inside a span is shown as it is). A run of backticks that opens no span
/// is text, as the client's text rule takes it.
fn markdown_of(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let (mut out, mut i) = (String::new(), 0);
    while i < chars.len() {
        match chars[i] {
            // An escape comes first: `\`` is a backtick, never a span.
            '\\' => i += 1,
            '`' => match code_span_at(&chars, i) {
                Some(end) => {
                    out.push('`');
                    i = end - 1;
                }
                None => {
                    let run = chars[i..].iter().take_while(|c| **c == '`').count();
                    out.push_str(&"!".repeat(run));
                    i += run - 1;
                }
            },
            c @ ('*' | '_' | '~' | '|' | '>' | '#' | '[' | ']' | '<' | '@' | '\n') => out.push(c),
            // A bare link: an unescaped `://`.
            ':' if chars[i + 1..].starts_with(&['/', '/']) => out.push(':'),
            _ => {}
        }
        i += 1;
    }
    out
}

/// A finished job whose title, benchmark specs (one line each), error and GPU name are
/// `title`, `specs`, `error` and `gpu`, as its final Discord message shows it.
fn report_text(title: &str, specs: &[&str], error: &str, gpu: &str) -> String {
    let mut result = serde_json::Map::new();
    result.insert("benchmark-count".into(), json!(specs.len().to_string()));
    for (i, spec) in specs.iter().enumerate() {
        result.insert(format!("benchmark.{i}.spec"), json!(spec));
        result.insert(format!("benchmark.{i}.mean"), json!("1000"));
    }
    let value = json!({"success": true, "error": error, "system": {"gpu": gpu},
        "runs": {"benchmark": {"run": {"success": true, "passed": true, "result": result}}}});
    let result = FullResult::parse(value.to_string().as_bytes()).unwrap();
    let mut job = job();
    job.title = Some(title.to_owned());
    let outcome = Outcome::judge("passed", Some(result), None);
    let finished = job
        .apply(&Transition::to(JobState::Finished, 1).with_outcome(outcome))
        .unwrap();
    let message = render(&finished);
    let embeds = message.embeds.iter().map(|e| {
        let fields: Vec<String> = e
            .fields
            .iter()
            .map(|f| format!("{}\n{}", f.name, f.value))
            .collect();
        format!(
            "{}\n{}",
            e.description.clone().unwrap_or_default(),
            fields.join("\n")
        )
    });
    std::iter::once(message.content)
        .chain(embeds)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_submitted_link_shows_as_text() {
    let hostile = "x` [Claim credits](https://evil.example) `y";
    let text = report_text(hostile, &[hostile], hostile, hostile);
    assert_eq!(
        markdown_of(&text),
        markdown_of(&report_text("x", &["x"], "x", "x")),
        "{text}"
    );
}

/// What a value's template looks like without the value's own text: a blank value may be
/// left out (an empty error shows no error line), anything else is as good as `x`.
fn neutral(value: &str) -> &str {
    if value.trim().is_empty() { value } else { "x" }
}

/// An empty spec would open a span that closes lines later, at the next spec's opening
/// backtick, leaving that spec's text as markdown: a link in the bot's own report.
#[test]
fn an_empty_value_opens_no_span() {
    let link = "[Claim your prize](https://evil.example)";
    let text = report_text("t", &["", link], "", "g");
    assert_eq!(
        markdown_of(&text),
        markdown_of(&report_text("t", &["x", "x"], "", "g")),
        "{text}"
    );
    // And the rule itself sees the attack on text made the old way.
    assert_eq!(markdown_of("`` ⏱ 1 µs\n`[a](b)` ⏱ 2 µs"), "`[]!");
    assert_eq!(markdown_of("`(empty)` ⏱ 1 µs\n`[a](b)` ⏱ 2 µs"), "`\n`");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn text_someone_else_wrote_never_becomes_markdown(
        title in ".{1,40}",
        specs in vec(".{0,40}", 1..4),
        error in ".{0,40}",
        gpu in ".{0,40}",
    ) {
        let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
        let shown = report_text(&title, &specs, &error, &gpu);
        let n: Vec<&str> = specs.iter().map(|s| neutral(s)).collect();
        let plain = report_text(neutral(&title), &n, neutral(&error), neutral(&gpu));
        prop_assert_eq!(markdown_of(&shown), markdown_of(&plain), "{}", shown);
    }

    #[test]
    fn any_signature_header_is_accepted_or_refused_without_panic(
        header in ".{0,160}",
        body in vec(any::<u8>(), 0..200),
        now in any::<i64>(),
    ) {
        let auth = WebhookAuth::new(vec!["k".into()], true);
        let _ = auth.verify(Some(&header), Some(&header), &body, now);
    }

    #[test]
    fn a_signature_verifies_only_its_own_body(body in vec(any::<u8>(), 0..200), ts in 0i64..4_000_000_000) {
        let auth = WebhookAuth::new(vec!["k".into()], false);
        let header = format!("timestamp={ts},signature={}", sign("k", &ts.to_string(), &body));
        prop_assert!(auth.verify(Some(&header), None, &body, ts).is_ok());
        let mut other = body.clone();
        other.push(b'x');
        prop_assert!(auth.verify(Some(&header), None, &other, ts).is_err());
    }

    #[test]
    fn any_webhook_body_parses_or_is_refused(body in vec(any::<u8>(), 0..300), value in any_json()) {
        let _ = serde_json::from_slice::<WebhookEvent>(&body);
        if let Ok(event) = serde_json::from_value::<WebhookEvent>(value) {
            let _ = rules::signal_of(&event.event, event.job.as_ref());
            if let Some(build) = &event.build {
                let _ = (build.run_id(), rules::progress_of(build));
            }
        }
    }

    #[test]
    fn any_result_json_becomes_a_bounded_report_and_record(value in result_json(), state in prop_oneof![
        Just("passed"), Just("failed"), Just("canceled"), Just("skipped"), Just("blocked"), Just("weird")]) {
        let bytes = serde_json::to_vec(&value).unwrap();
        let result = FullResult::parse(&bytes).ok();
        let outcome = Outcome::judge(state, result, None);
        let finished = job()
            .apply(&Transition::to(JobState::Finished, 1).with_outcome(outcome.clone()))
            .unwrap();
        let message = render(&finished);
        prop_assert!(message.content.chars().count() <= limits::CONTENT);
        prop_assert!(message.embed_chars() <= limits::EMBED_TOTAL);
        let record = JobRecord::from_job(&finished, "w");
        let stored = record.stored_outcome_bytes();
        prop_assert!(stored <= MAX_STORED_OUTCOME);
        let back = record.into_job().unwrap();
        prop_assert_eq!(back.outcome.unwrap().verdict, outcome.verdict);
    }

    #[test]
    fn any_payload_decodes_or_is_refused(text in ".{0,200}", bytes in vec(any::<u8>(), 0..200)) {
        let _ = payload::decode(&text);
        let _ = payload::unpack(&text);
        let _ = payload::decode(&base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &bytes));
    }

    #[test]
    fn any_submission_body_is_validated_with_a_bounded_answer(value in any_json(), raw in vec(any::<u8>(), 0..200)) {
        let queues = QueueMap::parse("H100_BK=h100").unwrap();
        for body in [serde_json::to_vec(&value).unwrap(), raw] {
            if let Err(e) = submission::parse(&body, &queues, false) {
                prop_assert!(e.to_string().len() < 2_000, "{}", e);
            }
        }
        let shaped = json!({"gpu": "H100_BK", "config": value, "title": "t",
            "discord": {"webhook_url": "https://discord.com/api/webhooks/1/t"}});
        let _ = submission::parse(&serde_json::to_vec(&shaped).unwrap(), &queues, false);
    }
}

#[test]
fn a_kernelbot_like_result_keeps_its_counts_through_the_caps() {
    let mut entries = BTreeMap::new();
    entries.insert("test-count".to_owned(), json!("1000000000000"));
    entries.insert("test.0.status".to_owned(), json!("pass"));
    let value = json!({"success": true, "runs": {"test": {"run": {"success": true, "passed": true,
        "result": entries}}}});
    let r = FullResult::parse(value.to_string().as_bytes()).unwrap();
    let run = r.runs["test"].run.as_ref().unwrap();
    assert_eq!(run.test_counts(), Some((1, 1_000_000_000_000)));
}
