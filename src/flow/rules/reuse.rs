//! When a submission is answered from an earlier run instead of a GPU: which submissions may
//! be (a `test` or `benchmark` one that did not opt out), what makes two the same (the GPU
//! and the config, sources included, in a canonical form: key order and whitespace do not
//! matter, a byte of a source does), and which earlier ends may answer (the submission's own
//! verdict, with its result, within the deployment's `RESULT_CACHE_SECS`).

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::jobs::Job;
use crate::result::Verdict;
use crate::time::Millis;

/// The modes whose answer depends only on the code and the GPU: leaderboard runs rank (a
/// time is measured each time), profile runs hand out files of their own.
const REUSABLE_MODES: &[&str] = &["test", "benchmark"];

/// The identity of a submission that may be answered from an earlier run, or `None` when it
/// must run (its mode, or `"cache": false`).
pub(crate) fn identity(gpu: &str, config: &Value, cache: bool) -> Option<String> {
    let mode = config.get("mode").and_then(Value::as_str)?;
    if !cache || !REUSABLE_MODES.contains(&mode) {
        return None;
    }
    let mut text = String::new();
    canonical(
        &serde_json::json!({"gpu": gpu, "config": config}),
        &mut text,
    );
    Some(hex::encode(Sha256::digest(text.as_bytes())))
}

/// `identity` as the runner `image` evaluates it: a new runner (a fix deployed) answers
/// nothing an older one ran.
pub(crate) fn on_runner(identity: &str, image: &str) -> String {
    hex::encode(Sha256::digest(format!("{identity}\n{image}").as_bytes()))
}

/// `value` as JSON with every object's keys sorted and no whitespace.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Whether `earlier`, ended at `ended_at`, may answer a submission of the same identity at
/// `now`: it ended with the submission's own verdict (passed or failed, never an error, an
/// infrastructure failure, a throttled GPU, a cancel or a deadline), its result kept, within
/// `ttl_ms`; and it was itself run, not answered from another.
pub(crate) fn may_answer(
    earlier: &Job,
    identity: &str,
    ended_at: Millis,
    now: Millis,
    ttl_ms: Millis,
) -> bool {
    let Some(outcome) = earlier.outcome.as_deref() else {
        return false;
    };
    earlier.identity.as_deref() == Some(identity)
        && earlier.cached_from.is_none()
        && earlier.state.is_terminal()
        && matches!(outcome.verdict, Verdict::Passed | Verdict::Failed)
        && outcome.result.is_some()
        && now.saturating_sub(ended_at) <= ttl_ms
        && ttl_ms > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::JobState;
    use crate::result::Outcome;
    use serde_json::json;
    use std::sync::Arc;

    fn config() -> Value {
        json!({"lang": "py", "mode": "test", "main": "eval.py",
               "sources": {"eval.py": "print(1)\n", "submission.py": "def f(x):\n    return x\n"}})
    }

    #[test]
    fn the_identity_ignores_key_order_and_whitespace_and_sees_every_byte() {
        let base = identity("H100_BK", &config(), true).unwrap();
        assert_eq!(base.len(), 64);
        let reordered: Value = serde_json::from_str(
            r#"{ "sources": {"submission.py": "def f(x):\n    return x\n", "eval.py": "print(1)\n"},
                 "main": "eval.py",   "mode": "test", "lang": "py" }"#,
        )
        .unwrap();
        assert_eq!(
            identity("H100_BK", &reordered, true).as_deref(),
            Some(base.as_str())
        );
        let mut one_byte = config();
        one_byte["sources"]["submission.py"] = json!("def f(x):\n    return x \n");
        let mut benchmark = config();
        benchmark["mode"] = json!("benchmark");
        assert_ne!(
            on_runner(&base, "runner:1"),
            on_runner(&base, "runner:2"),
            "the runner"
        );
        assert_eq!(on_runner(&base, "runner:1"), on_runner(&base, "runner:1"));
        for (gpu, other, why) in [
            ("H100_BK", one_byte, "a source's byte"),
            ("MI300_BK", config(), "the GPU"),
            ("H100_BK", benchmark, "the mode"),
        ] {
            let id = identity(gpu, &other, true).expect("reusable");
            assert_ne!(id, base, "{why} changes the identity");
        }
    }

    #[test]
    fn only_tests_and_benchmarks_that_did_not_opt_out_may_be_answered() {
        for (mode, cache, reusable) in [
            ("test", true, true),
            ("benchmark", true, true),
            ("test", false, false),
            ("benchmark", false, false),
            ("leaderboard", true, false),
            ("profile", true, false),
            ("private", true, false),
        ] {
            let mut c = config();
            c["mode"] = json!(mode);
            assert_eq!(
                identity("H100_BK", &c, cache).is_some(),
                reusable,
                "{mode} cache={cache}"
            );
        }
        assert_eq!(identity("H100_BK", &json!({"lang": "py"}), true), None);
    }

    fn ended(verdict: Verdict, with_result: bool) -> Job {
        let mut job = Job::new(
            "first".parse().unwrap(),
            "H100_BK".into(),
            "h100".into(),
            None,
            None,
            0,
        );
        job.state = JobState::Finished;
        job.identity = Some("id".into());
        let mut outcome = Outcome::decided("passed", verdict, "x");
        if with_result {
            outcome.result = Some(crate::result::FullResult::default());
        }
        job.outcome = Some(Arc::new(outcome));
        job
    }

    #[test]
    fn only_the_submission_s_own_verdict_with_its_result_and_in_time_answers() {
        const TTL: Millis = 86_400_000;
        for (verdict, answers) in [
            (Verdict::Passed, true),
            (Verdict::Failed, true),
            (Verdict::Error, false),
            (Verdict::Infra, false),
            (Verdict::Throttled, false),
            (Verdict::Canceled, false),
            (Verdict::QueueTimeout, false),
            (Verdict::Expired, false),
            (Verdict::Skipped, false),
        ] {
            assert_eq!(
                may_answer(&ended(verdict, true), "id", 1_000, 2_000, TTL),
                answers,
                "{verdict:?}"
            );
        }
        let passed = ended(Verdict::Passed, true);
        assert!(
            !may_answer(&passed, "other", 1_000, 2_000, TTL),
            "another identity"
        );
        assert!(
            !may_answer(&passed, "id", 1_000, 1_000 + TTL + 1, TTL),
            "too old"
        );
        assert!(
            may_answer(&passed, "id", 1_000, 1_000 + TTL, TTL),
            "just in time"
        );
        assert!(!may_answer(&passed, "id", 1_000, 2_000, 0), "the cache off");
        assert!(
            !may_answer(&ended(Verdict::Passed, false), "id", 1_000, 2_000, TTL),
            "no result kept"
        );
        let mut copy = ended(Verdict::Passed, true);
        copy.cached_from = Some("zeroth".parse().unwrap());
        assert!(
            !may_answer(&copy, "id", 1_000, 2_000, TTL),
            "a copy answers nobody"
        );
        let mut running = ended(Verdict::Passed, true);
        running.state = JobState::Running;
        assert!(!may_answer(&running, "id", 1_000, 2_000, TTL));
    }
}
