//! Kernelbot's evaluation config, as `build_task_config` makes it and `run_config` reads it.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

pub use crate::invalid::InvalidConfig;
use crate::profile_options::ProfileOptions;

/// Kernelbot's default per-mode timeout (seconds).
pub(super) const DEFAULT_TIMEOUT_SECS: u64 = 180;
/// How long one compile (nvcc, or the warm-up run of a Python submission) may take.
pub const COMPILE_TIMEOUT_SECS: u64 = 300;
/// No single timeout is longer than the whole evaluation's budget; a larger one is clamped
/// (and would otherwise overflow the clock).
pub(super) const MAX_TIMEOUT_SECS: u64 = crate::EVALUATION_BUDGET.as_secs();

#[derive(Clone, Debug, PartialEq)]
pub struct EvalConfig {
    pub lang: String,
    pub mode: String,
    /// File name → content. Kernelbot's key is `sources`; the older `files` is accepted.
    pub sources: BTreeMap<String, String>,
    /// Python: the file to run.
    pub main: Option<String>,
    /// CUDA: headers written next to the sources but not compiled.
    pub headers: BTreeMap<String, String>,
    pub tests: Vec<Map<String, Value>>,
    pub benchmarks: Vec<Map<String, Value>>,
    pub test_timeout: u64,
    pub benchmark_timeout: u64,
    pub ranked_timeout: u64,
    pub ranking_by: String,
    pub seed: Option<i64>,
    pub multi_gpu: bool,
    /// CUDA: `sm_XX` number; `None` compiles for the local GPU.
    pub arch: Option<String>,
    pub defines: BTreeMap<String, Option<String>>,
    pub include_dirs: Vec<String>,
    pub libraries: Vec<String>,
    pub compile_flags: Vec<String>,
    /// Profile mode only: the benchmark, kernels and launches profiled.
    pub profile_options: ProfileOptions,
}

const MODES: &[&str] = &["test", "benchmark", "profile", "leaderboard", "private"];

/// A name from the config as an error shows it: at most 64 characters, so an answer stays
/// small whatever was sent.
fn shown(name: &str) -> String {
    let mut cut: String = name.chars().take(64).collect();
    if cut.len() < name.len() {
        cut.push('…');
    }
    cut
}

fn bad(field: impl Into<String>, message: impl Into<String>) -> InvalidConfig {
    InvalidConfig {
        field: field.into(),
        message: message.into(),
    }
}

fn files(v: Option<&Value>, key: &str) -> Result<BTreeMap<String, String>, InvalidConfig> {
    match v {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(bad(
                    format!("{key}.{}", shown(k)),
                    format!("{key}.{} must be a string", shown(k)),
                )),
            })
            .collect(),
        Some(_) => Err(bad(
            key,
            format!("{key} must be an object of file name to content"),
        )),
    }
}

fn cases(v: Option<&Value>, key: &str) -> Result<Vec<Map<String, Value>>, InvalidConfig> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_object()
                    .cloned()
                    .ok_or_else(|| bad(key, format!("each entry of {key} must be an object")))
            })
            .collect(),
        Some(_) => Err(bad(key, format!("{key} must be a list"))),
    }
}

fn strings(v: Option<&Value>, key: &str) -> Result<Vec<String>, InvalidConfig> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| bad(key, format!("{key} must be a list of strings")))
            })
            .collect(),
        Some(_) => Err(bad(key, format!("{key} must be a list of strings"))),
    }
}

fn timeout(obj: &Map<String, Value>, key: &str) -> Result<u64, InvalidConfig> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(DEFAULT_TIMEOUT_SECS),
        Some(v) => v
            .as_u64()
            .or_else(|| {
                v.as_f64()
                    .filter(|f| *f >= 0.0)
                    .map(|f| f.ceil().min(MAX_TIMEOUT_SECS as f64) as u64)
            })
            .filter(|t| *t > 0)
            .map(|t| t.min(MAX_TIMEOUT_SECS))
            .ok_or_else(|| bad(key, format!("{key} must be a positive number of seconds"))),
    }
}

/// Source names must stay inside the work directory (kernelbot asserts the same).
pub fn safe_name(name: &str) -> bool {
    let p = std::path::Path::new(name);
    !name.is_empty()
        && p.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// Python's `str()` of a JSON value, as kernelbot's f-strings print test parameters.
pub(super) fn python_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Null => "None".into(),
        other => other.to_string(),
    }
}

/// Kernelbot's `build_test_string`: one line per case, `key: value` pairs joined by `; `.
pub(super) fn build_test_string(cases: &[Map<String, Value>]) -> String {
    cases
        .iter()
        .map(|case| {
            let pairs: Vec<String> = case
                .iter()
                .map(|(k, v)| format!("{k}: {}", python_str(v)))
                .collect();
            format!("{}\n", pairs.join("; "))
        })
        .collect()
}

/// `lang` and `mode`, each one of the values the runner knows.
fn lang_and_mode(text: impl Fn(&str) -> Option<String>) -> Result<(String, String), InvalidConfig> {
    let lang = text("lang").ok_or_else(|| bad("lang", "lang is required (\"py\" or \"cu\")"))?;
    if !matches!(lang.as_str(), "py" | "cu") {
        return Err(bad(
            "lang",
            format!("lang must be \"py\" or \"cu\", not {:?}", shown(&lang)),
        ));
    }
    let mode = text("mode").ok_or_else(|| bad("mode", "mode is required"))?;
    if !MODES.contains(&mode.as_str()) {
        return Err(bad(
            "mode",
            format!(
                "mode must be one of {}, not {:?}",
                MODES.join(", "),
                shown(&mode)
            ),
        ));
    }
    Ok((lang, mode))
}

/// File name → content.
type Files = BTreeMap<String, String>;

/// The sources (`sources`, else the older `files`) and headers, every name a relative path
/// inside the work directory.
fn sources_and_headers(obj: &Map<String, Value>) -> Result<(Files, Files), InvalidConfig> {
    let mut sources = files(obj.get("sources"), "sources")?;
    if sources.is_empty() {
        sources = files(obj.get("files"), "files")?;
    }
    if sources.is_empty() {
        return Err(bad("sources", "sources is required (file name → content)"));
    }
    let headers = files(obj.get("headers"), "headers")?;
    for (key, names) in [("sources", &sources), ("headers", &headers)] {
        if let Some(name) = names.keys().find(|n| !safe_name(n)).map(|n| shown(n)) {
            return Err(bad(
                format!("{key}.{name}"),
                format!("file name {name:?} must be a relative path inside the work directory"),
            ));
        }
    }
    Ok((sources, headers))
}

/// Python runs `main`, which must be one of the sources.
fn check_main(lang: &str, main: Option<&str>, sources: &Files) -> Result<(), InvalidConfig> {
    match main {
        _ if lang != "py" => Ok(()),
        Some(m) if sources.contains_key(m) => Ok(()),
        Some(m) => Err(bad(
            "main",
            format!("main {:?} is not one of the sources", shown(m)),
        )),
        None => Err(bad("main", "main is required for Python submissions")),
    }
}

fn defines(v: Option<&Value>) -> Result<BTreeMap<String, Option<String>>, InvalidConfig> {
    match v {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => Ok(m
            .iter()
            .map(|(k, v)| (k.clone(), (!v.is_null()).then(|| python_str(v))))
            .collect()),
        Some(_) => Err(bad("defines", "defines must be an object")),
    }
}

impl EvalConfig {
    pub fn from_json(value: &Value) -> Result<Self, InvalidConfig> {
        let Value::Object(obj) = value else {
            return Err(bad("", "config must be a JSON object"));
        };
        let text = |key: &str| obj.get(key).and_then(Value::as_str).map(str::to_owned);
        let (lang, mode) = lang_and_mode(text)?;
        let (sources, headers) = sources_and_headers(obj)?;
        let main = text("main");
        check_main(&lang, main.as_deref(), &sources)?;
        let defines = defines(obj.get("defines"))?;
        let benchmarks = cases(obj.get("benchmarks"), "benchmarks")?;
        let profile_options =
            ProfileOptions::from_json(obj.get("profile_options"), benchmarks.len())?;
        Ok(Self {
            lang,
            mode,
            sources,
            main,
            headers,
            tests: cases(obj.get("tests"), "tests")?,
            benchmarks,
            test_timeout: timeout(obj, "test_timeout")?,
            benchmark_timeout: timeout(obj, "benchmark_timeout")?,
            ranked_timeout: timeout(obj, "ranked_timeout")?,
            ranking_by: text("ranking_by").unwrap_or_else(|| "last".into()),
            seed: obj.get("seed").and_then(Value::as_i64),
            multi_gpu: obj
                .get("multi_gpu")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            arch: obj.get("arch").filter(|a| !a.is_null()).map(python_str),
            defines,
            include_dirs: strings(obj.get("include_dirs"), "include_dirs")?,
            libraries: strings(obj.get("libraries"), "libraries")?,
            compile_flags: strings(obj.get("compile_flags"), "compile_flags")?,
            profile_options,
        })
    }

    /// The cases file for one evaluation mode and its timeout, as kernelbot's
    /// `run_single_evaluation` chooses them.
    /// Profile mode's runs: one per benchmark (or only `profile_options.benchmark_index`),
    /// each its own cases file, with the benchmark timeout (as kernelbot profiles), by the
    /// benchmark's index.
    pub fn profile_cases(&self) -> Vec<(usize, String, u64)> {
        let only = self.profile_options.benchmark_index;
        build_test_string(&self.benchmarks)
            .split_inclusive('\n')
            .enumerate()
            .filter(|(i, _)| only.is_none_or(|o| o == *i))
            .map(|(i, line)| (i, line.to_owned(), self.benchmark_timeout))
            .collect()
    }

    pub fn cases_for(&self, mode: &str) -> (String, u64) {
        match mode {
            "test" => (build_test_string(&self.tests), self.test_timeout),
            _ => {
                let all = build_test_string(&self.benchmarks);
                let cases = if self.ranking_by == "last" {
                    all.split_inclusive('\n')
                        .next_back()
                        .unwrap_or_default()
                        .to_owned()
                } else {
                    all
                };
                let timeout = if mode == "leaderboard" {
                    self.ranked_timeout
                } else {
                    self.benchmark_timeout
                };
                (cases, timeout)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn test_strings_match_kernelbot() {
        let cases: Vec<Map<String, Value>> = serde_json::from_value(json!([
            {"size": 1024, "seed": 5, "scale": 1.5, "causal": true, "name": "a b"},
            {"size": 16}
        ]))
        .unwrap();
        assert_eq!(
            build_test_string(&cases),
            "size: 1024; seed: 5; scale: 1.5; causal: True; name: a b\nsize: 16\n"
        );
    }

    #[test]
    fn reads_kernelbot_configs_and_the_older_files_key() {
        let c = EvalConfig::from_json(&json!({"lang": "py", "mode": "leaderboard", "main": "eval.py",
            "files": {"eval.py": "x"}, "benchmarks": [{"n": 1}, {"n": 2}], "ranked_timeout": 30, "seed": 7}))
        .unwrap();
        assert_eq!(c.sources.keys().collect::<Vec<_>>(), ["eval.py"]);
        assert_eq!(c.cases_for("leaderboard"), ("n: 2\n".to_owned(), 30));
        assert_eq!(
            c.cases_for("benchmark"),
            ("n: 2\n".to_owned(), DEFAULT_TIMEOUT_SECS)
        );
        assert_eq!(c.seed, Some(7));
    }

    #[test]
    fn timeouts_are_clamped_to_the_budget() {
        let c = EvalConfig::from_json(
            &json!({"lang": "cu", "mode": "test", "sources": {"a.cu": ""},
            "test_timeout": u64::MAX, "benchmark_timeout": 1e300, "ranked_timeout": 0.5}),
        )
        .unwrap();
        assert_eq!(c.test_timeout, MAX_TIMEOUT_SECS);
        assert_eq!(c.benchmark_timeout, MAX_TIMEOUT_SECS);
        assert_eq!(c.ranked_timeout, 1);
    }

    #[test]
    fn refuses_configs_it_cannot_run() {
        for (v, msg) in [
            (json!([]), "config must be a JSON object"),
            (json!({"mode": "test"}), "lang is required"),
            (json!({"lang": "rs", "mode": "test"}), "lang must be"),
            (json!({"lang": "py", "mode": "fast"}), "mode must be one of"),
            (json!({"lang": "py", "mode": "test"}), "sources is required"),
            (
                json!({"lang": "py", "mode": "test", "sources": {"a.py": ""}}),
                "main is required",
            ),
            (
                json!({"lang": "py", "mode": "test", "main": "b.py", "sources": {"a.py": ""}}),
                "is not one of the sources",
            ),
            (
                json!({"lang": "cu", "mode": "test", "sources": {"a.cu": ""}, "test_timeout": -1}),
                "test_timeout must be",
            ),
        ] {
            let err = EvalConfig::from_json(&v).unwrap_err();
            assert!(err.message.contains(msg), "{v}: {err}");
        }
    }
}
