//! `result.json` read within its caps as it streams. A string is copied only up to its cap;
//! runs and `result` entries beyond their caps are skipped as they come (their JSON checked,
//! nothing of them held); each kept `result` value becomes its capped text as it is read
//! ([`render`]). The types are `FullResult`'s own, read through shadows of them (serde's
//! `remote`) that differ only in how each capped field is read.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

use super::render::{self, Text};
use super::{
    CompileResult, Conditions, EvalResult, FullResult, InfraFailure, Preflight, ProfileResult,
    RunResult, SystemInfo, Throttled, WrittenBy, cap, caps, is_report, rank,
};

/// Reads `bytes` as a [`FullResult`] within its caps (see [`FullResult::parse`]).
pub(super) fn parse(bytes: &[u8]) -> Result<FullResult, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let result = Full::deserialize(&mut de)?;
    de.end()?;
    Ok(result)
}

#[derive(Deserialize)]
#[serde(
    remote = "FullResult",
    rename = "FullResult",
    default = "FullResult::default"
)]
struct Full {
    success: bool,
    #[serde(deserialize_with = "text")]
    error: String,
    #[serde(with = "System")]
    system: SystemInfo,
    #[serde(deserialize_with = "runs")]
    runs: BTreeMap<String, EvalResult>,
    #[serde(deserialize_with = "infra")]
    infra: Option<InfraFailure>,
    #[serde(deserialize_with = "preflight")]
    preflight: Option<Preflight>,
    #[serde(deserialize_with = "throttled")]
    throttled: Option<Throttled>,
    #[serde(deserialize_with = "written_by")]
    written_by: Option<WrittenBy>,
}

#[derive(Deserialize)]
#[serde(
    remote = "SystemInfo",
    rename = "SystemInfo",
    default = "SystemInfo::default"
)]
struct System {
    #[serde(deserialize_with = "short")]
    gpu: String,
    device_count: i64,
    #[serde(deserialize_with = "short")]
    cpu: String,
    #[serde(deserialize_with = "short")]
    runtime: String,
    #[serde(deserialize_with = "short")]
    platform: String,
    #[serde(deserialize_with = "short")]
    torch: String,
    #[serde(deserialize_with = "short")]
    hostname: String,
}

#[derive(Deserialize)]
#[serde(
    remote = "EvalResult",
    rename = "EvalResult",
    default = "EvalResult::default"
)]
struct Eval {
    #[serde(deserialize_with = "opt_short")]
    start: Option<String>,
    #[serde(deserialize_with = "opt_short")]
    end: Option<String>,
    #[serde(deserialize_with = "compilation")]
    compilation: Option<CompileResult>,
    #[serde(deserialize_with = "run")]
    run: Option<RunResult>,
    #[serde(deserialize_with = "profile")]
    profile: Option<ProfileResult>,
    #[serde(deserialize_with = "conditions")]
    conditions: Option<Conditions>,
}

#[derive(Deserialize)]
#[serde(
    remote = "CompileResult",
    rename = "CompileResult",
    default = "CompileResult::default"
)]
struct Compile {
    nvcc_found: bool,
    #[serde(deserialize_with = "short")]
    nvcc_version: String,
    success: bool,
    #[serde(deserialize_with = "text")]
    command: String,
    #[serde(deserialize_with = "log")]
    stdout: String,
    #[serde(deserialize_with = "log")]
    stderr: String,
    exit_code: i64,
}

#[derive(Deserialize)]
#[serde(
    remote = "RunResult",
    rename = "RunResult",
    default = "RunResult::default"
)]
struct Run {
    success: bool,
    passed: bool,
    #[serde(deserialize_with = "text")]
    command: String,
    #[serde(deserialize_with = "log")]
    stdout: String,
    #[serde(deserialize_with = "log")]
    stderr: String,
    exit_code: i64,
    duration: f64,
    #[serde(deserialize_with = "entries")]
    result: BTreeMap<String, Value>,
}

#[derive(Deserialize)]
#[serde(
    remote = "ProfileResult",
    rename = "ProfileResult",
    default = "ProfileResult::default"
)]
struct Profile {
    #[serde(deserialize_with = "short")]
    profiler: String,
    #[serde(deserialize_with = "opt_log")]
    trace: Option<String>,
    #[serde(deserialize_with = "opt_text")]
    download_url: Option<String>,
}

// The shadows as types of their own, for `Option`s and map values (`with` takes neither).
#[derive(Deserialize)]
#[serde(transparent)]
struct EvalOf(#[serde(with = "Eval")] EvalResult);

#[derive(Deserialize)]
#[serde(transparent)]
struct CompileOf(#[serde(with = "Compile")] CompileResult);

#[derive(Deserialize)]
#[serde(transparent)]
struct RunOf(#[serde(with = "Run")] RunResult);

#[derive(Deserialize)]
#[serde(transparent)]
struct ProfileOf(#[serde(with = "Profile")] ProfileResult);

/// The runner's own reports (`infra`, `throttled`, `conditions`) are a few readings per GPU: one larger
/// than this is not the runner's, and is left out unread.
const MAX_HEALTH_BYTES: usize = 64 * 1024;

/// A value of at most [`MAX_HEALTH_BYTES`] of JSON, read whole; a larger one skipped.
fn small<'de, D: Deserializer<'de>, T: de::DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    let raw: Option<&'de RawValue> = Option::deserialize(d)?;
    Ok(raw
        .filter(|r| r.get().len() <= MAX_HEALTH_BYTES)
        .and_then(|r| serde_json::from_str(r.get()).ok()))
}

fn infra<'de, D: Deserializer<'de>>(d: D) -> Result<Option<InfraFailure>, D::Error> {
    let mut infra: Option<InfraFailure> = small(d)?;
    if let Some(i) = infra.as_mut() {
        i.cap();
    }
    Ok(infra)
}

fn written_by<'de, D: Deserializer<'de>>(d: D) -> Result<Option<WrittenBy>, D::Error> {
    let mut by: Option<WrittenBy> = small(d)?;
    if let Some(b) = by.as_mut() {
        b.cap();
    }
    Ok(by)
}

fn preflight<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Preflight>, D::Error> {
    let mut preflight: Option<Preflight> = small(d)?;
    if let Some(p) = preflight.as_mut() {
        p.cap();
    }
    Ok(preflight)
}

fn throttled<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Throttled>, D::Error> {
    let mut throttled: Option<Throttled> = small(d)?;
    if let Some(t) = throttled.as_mut() {
        t.cap();
    }
    Ok(throttled)
}

fn conditions<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Conditions>, D::Error> {
    let mut conditions: Option<Conditions> = small(d)?;
    if let Some(c) = conditions.as_mut() {
        c.cap();
    }
    Ok(conditions)
}

fn compilation<'de, D: Deserializer<'de>>(d: D) -> Result<Option<CompileResult>, D::Error> {
    Ok(Option::<CompileOf>::deserialize(d)?.map(|c| c.0))
}

fn run<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RunResult>, D::Error> {
    Ok(Option::<RunOf>::deserialize(d)?.map(|r| r.0))
}

fn profile<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ProfileResult>, D::Error> {
    Ok(Option::<ProfileOf>::deserialize(d)?.map(|p| p.0))
}

/// A string cut to `MAX` bytes as it is read.
struct Capped<const MAX: usize>(String);

impl<'de, const MAX: usize> Deserialize<'de> for Capped<MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_string(CappedVisitor(MAX)).map(Self)
    }
}

struct CappedVisitor(usize);

impl Visitor<'_> for CappedVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<String, E> {
        Ok(render::capped(s, self.0))
    }
}

fn short<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Capped::<{ caps::SHORT }>::deserialize(d)?.0)
}

fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Capped::<{ caps::TEXT }>::deserialize(d)?.0)
}

fn log<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Capped::<{ caps::LOG }>::deserialize(d)?.0)
}

fn opt_short<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<Capped<{ caps::SHORT }>>::deserialize(d)?.map(|s| s.0))
}

fn opt_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<Capped<{ caps::TEXT }>>::deserialize(d)?.map(|s| s.0))
}

fn opt_log<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<Capped<{ caps::LOG }>>::deserialize(d)?.map(|s| s.0))
}

/// The `max` smallest keys seen, with their values: a key that cannot be among them is not
/// wanted, and its value need not be read.
struct Smallest<K, V> {
    map: BTreeMap<K, V>,
    max: usize,
}

impl<K: Ord, V> Smallest<K, V> {
    fn new(max: usize) -> Self {
        Self {
            map: BTreeMap::new(),
            max,
        }
    }

    /// Whether `key` is among the smallest so far (a key seen again replaces its value, as
    /// in a map). One that is not never will be: there are already `max` smaller.
    fn wants(&self, key: &K) -> bool {
        self.map.len() < self.max
            || self.map.contains_key(key)
            || self
                .map
                .last_key_value()
                .is_some_and(|(last, _)| key < last)
    }

    fn insert(&mut self, key: K, value: V) {
        self.map.insert(key, value);
        if self.map.len() > self.max {
            self.map.pop_last();
        }
    }
}

/// A run's name or a `result` key; `None`, never copied, when longer than [`caps::NAME`].
struct Name;

impl<'de> DeserializeSeed<'de> for Name {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_string(self)
    }
}

impl Visitor<'_> for Name {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok((s.len() <= caps::NAME).then(|| s.to_owned()))
    }
}

fn runs<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, EvalResult>, D::Error> {
    d.deserialize_map(Runs)
}

/// The runs: the [`caps::RUNS`] first in `ordered_runs`' order (kernelbot's own first),
/// among those with short names.
struct Runs;

impl<'de> Visitor<'de> for Runs {
    type Value = BTreeMap<String, EvalResult>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = Smallest::new(caps::RUNS);
        while let Some(name) = map.next_key_seed(Name)? {
            match name.map(|n| (rank(&n), n)).filter(|key| kept.wants(key)) {
                Some(key) => kept.insert(key, map.next_value::<EvalOf>()?.0),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(kept
            .map
            .into_iter()
            .map(|((_, n), eval)| (n, eval))
            .collect())
    }
}

fn entries<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, Value>, D::Error> {
    d.deserialize_map(Entries)
}

/// A run's `result`: the [`caps::ENTRIES`] smallest short keys, each value read as text.
struct Entries;

impl<'de> Visitor<'de> for Entries {
    type Value = BTreeMap<String, Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = Smallest::new(caps::ENTRIES);
        while let Some(key) = map.next_key_seed(Name)? {
            let Some(key) = key.filter(|k| kept.wants(k)) else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            // Borrowed from the file: its text is read next, within the entry's cap.
            let raw: &'de RawValue = map.next_value()?;
            let entry = Entry::read(&key, raw).map_err(de::Error::custom)?;
            kept.insert(key, entry);
        }
        Ok(kept_entries(kept.map))
    }
}

/// A kept `result` entry's value, as far as the report needs it.
enum Entry {
    /// Text cut to [`caps::VALUE`].
    Value(String),
    /// A profiler's report, whole: kept while the run's budget for reports lasts.
    Report(String),
    /// A report longer than the whole budget, by its length: only its note will be kept.
    LargeReport(usize),
}

impl Entry {
    fn read(key: &str, raw: &RawValue) -> Result<Self, serde_json::Error> {
        if !is_report(key) {
            let mut text = render::text(raw, caps::VALUE)?.start;
            cap(&mut text, caps::VALUE);
            return Ok(Self::Value(text));
        }
        let Text { start, len } = render::text(raw, caps::REPORTS)?;
        Ok(if len <= caps::REPORTS {
            Self::Report(start)
        } else {
            Self::LargeReport(len)
        })
    }
}

/// The entries as the report keeps them, in key order: every value as text, the reports
/// whole while [`caps::REPORTS`] lasts and each one past it dropped with a note in
/// `<key>_dropped`.
fn kept_entries(entries: BTreeMap<String, Entry>) -> BTreeMap<String, Value> {
    let mut reports_left = caps::REPORTS;
    let mut kept = BTreeMap::new();
    for (key, entry) in entries {
        let len = match entry {
            Entry::Report(text) if text.len() <= reports_left => {
                reports_left -= text.len();
                kept.insert(key, Value::String(text));
                continue;
            }
            Entry::Value(text) => {
                kept.insert(key, Value::String(text));
                continue;
            }
            Entry::Report(text) => text.len(),
            Entry::LargeReport(len) => len,
        };
        let note = format!("{len} bytes: over the {} KiB kept", caps::REPORTS / 1024);
        kept.insert(format!("{key}_dropped"), Value::String(note));
    }
    kept
}

#[cfg(test)]
mod tests {
    use proptest::collection::{btree_map, vec};
    use proptest::prelude::*;
    use serde_json::json;

    use super::super::oracle;
    use super::*;

    /// The streaming read and the old one (the whole file, then capped) agree on `bytes`:
    /// the same result, or both refuse it.
    fn agree(bytes: &[u8]) -> Result<(), TestCaseError> {
        let text = String::from_utf8_lossy(bytes);
        match (parse(bytes), oracle::parse(bytes)) {
            (Ok(new), Ok(old)) => prop_assert_eq!(new, old, "{}", text),
            (Err(_), Err(_)) => {}
            (new, old) => prop_assert!(false, "{text}\nnew: {new:?}\nold: {old:?}"),
        }
        Ok(())
    }

    /// Text about `cap` bytes long, in characters of every width and ones to escape.
    fn around(cap: usize) -> impl Strategy<Value = String> {
        let unit = prop_oneof![
            Just("x"),
            Just("é"),
            Just("€"),
            Just("😀"),
            Just("\""),
            Just("\u{1}")
        ];
        let len = cap.saturating_sub(24)..cap + 24;
        (".{0,3}", unit, len).prop_map(|(head, unit, len)| head + &unit.repeat(len / unit.len()))
    }

    fn text(cap: usize) -> impl Strategy<Value = String> {
        prop_oneof![".{0,40}", around(cap)]
    }

    /// Any JSON value, a few levels deep, some longer than a `result` value's cap.
    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_map(|n| json!(n)),
            text(caps::VALUE).prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..6).prop_map(Value::Array),
                btree_map(".{0,10}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Keys the evaluation writes, reports and their notes' keys among them, and keys at
    /// and past the cap.
    fn pipe_key() -> impl Strategy<Value = String> {
        prop_oneof![
            (
                0u8..12,
                prop_oneof![Just("status"), Just("spec"), Just("mean")]
            )
                .prop_map(|(i, k)| format!("test.{i}.{k}")),
            (0u8..12, prop_oneof![Just("report"), Just("report_dropped")])
                .prop_map(|(i, k)| format!("benchmark.{i}.{k}")),
            ".{0,20}",
            (caps::NAME - 1..caps::NAME + 2).prop_map(|n| "k".repeat(n)),
        ]
    }

    /// Values: text about each cap, JSON, and reports' base64 whose sums cross their budget.
    fn pipe_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            text(caps::VALUE).prop_map(Value::String),
            any_json(),
            (0usize..40 * 1024).prop_map(|n| json!("QUJD".repeat(n / 4))),
            (0usize..80 * 1024).prop_map(|n| json!(vec!["QUJD"; n / 7])),
        ]
    }

    /// A run's `result`: a few entries, or more than its cap keeps.
    fn entries() -> impl Strategy<Value = BTreeMap<String, Value>> {
        let many = (caps::ENTRIES - 20..caps::ENTRIES + 80, any::<u64>()).prop_map(|(n, seed)| {
            let mut rng = fastrand::Rng::with_seed(seed);
            (0..n)
                .map(|_| (format!("k{}", rng.u32(..10_000)), json!(rng.u32(..))))
                .collect()
        });
        prop_oneof![
            4 => btree_map(pipe_key(), pipe_value(), 0..12),
            1 => many,
        ]
    }

    fn eval() -> impl Strategy<Value = Value> {
        let run = (any::<bool>(), text(caps::TEXT), text(caps::LOG), entries()).prop_map(
            |(passed, command, stdout, result)| {
                json!({"success": true, "passed": passed, "command": command, "stdout": stdout,
                       "stderr": "", "exit_code": 0, "duration": 1.5, "result": result})
            },
        );
        let compilation = prop_oneof![
            Just(Value::Null),
            (text(caps::SHORT), text(caps::LOG)).prop_map(|(version, stderr)| {
                json!({"nvcc_found": true, "nvcc_version": version, "success": true,
                       "stderr": stderr, "exit_code": 0})
            }),
        ];
        let profile = prop_oneof![
            Just(Value::Null),
            (text(caps::LOG), text(caps::TEXT)).prop_map(|(trace, url)| {
                json!({"profiler": "ncu", "trace": trace, "download_url": url})
            }),
        ];
        (text(caps::SHORT), run, compilation, profile).prop_map(|(start, run, c, p)| {
            json!({"start": start, "end": null, "run": run, "compilation": c, "profile": p})
        })
    }

    /// Run names: kernelbot's, others, long ones; a few, or more than the cap keeps.
    fn runs() -> impl Strategy<Value = BTreeMap<String, Value>> {
        let name = prop_oneof![
            Just("test".to_owned()),
            Just("benchmark".to_owned()),
            Just("leaderboard".to_owned()),
            (0u8..4).prop_map(|i| format!("profile.{i}")),
            ".{0,12}",
            (caps::NAME..caps::NAME + 2).prop_map(|n| "r".repeat(n)),
        ];
        let many = (caps::RUNS - 4..caps::RUNS + 12).prop_map(|n| {
            (0..n)
                .map(|i| (format!("r{}", n - i), json!({"start": "s"})))
                .collect()
        });
        prop_oneof![4 => btree_map(name, eval(), 0..5), 1 => many]
    }

    /// `result.json` shaped like kernelbot's, with anything in its fields.
    fn result_json() -> impl Strategy<Value = Value> {
        let system = prop_oneof![
            (text(caps::SHORT), text(caps::SHORT))
                .prop_map(|(gpu, host)| json!({"gpu": gpu, "device_count": 1, "hostname": host})),
            any_json(),
        ];
        (any::<bool>(), text(caps::TEXT), system, runs()).prop_map(
            |(success, error, system, runs)| {
                json!({"success": success, "error": error, "system": system, "runs": runs})
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn the_streaming_read_keeps_what_the_whole_read_then_capped_kept(
            value in result_json(),
            pretty in any::<bool>(),
        ) {
            let bytes = if pretty {
                serde_json::to_vec_pretty(&value)
            } else {
                serde_json::to_vec(&value)
            };
            agree(&bytes.expect("any value is written"))?;
        }
    }

    /// Nested `depth` arrays deep, as a `result` value.
    fn nested_value(depth: usize) -> String {
        let value = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        format!(r#"{{"runs": {{"t": {{"run": {{"result": {{"v": {value}}}}}}}}}}}"#)
    }

    #[test]
    fn files_no_generator_writes_are_read_as_before() {
        let large = |n: usize| format!("[{}]", vec!["1E2, \"é\\n\", {\"a\": -0}"; n].join(", "));
        for json in [
            // Repeated keys: a run, an entry, a key of a nested value, small and large.
            r#"{"runs": {"a": {}, "a": {"start": "x"}, "b": {"start": "y"}}}"#.to_owned(),
            r#"{"runs": {"t": {"run": {"result": {"k": 1, "k": "two", "j": 3}}}}}"#.to_owned(),
            r#"{"runs": {"t": {"run": {"result": {"k": {"a": 1, "b": 2, "a": [3]}}}}}}"#.to_owned(),
            format!(r#"{{"runs": {{"t": {{"run": {{"result": {{"k": {{"a": "{}", "b": 2, "a": 3}}}}}}}}}}}}"#, "x".repeat(3000)),
            r#"{"error": "a", "error": "b"}"#.to_owned(),
            // Structs written as arrays, nulls, wrong types.
            r#"[true, "e", {}, {"t": [null, null, null, [true, true, "c", "o", "e", 0, 1.5, {"k": [1]}], null]}]"#.to_owned(),
            r#"{"runs": {"t": {"start": null, "run": null}}}"#.to_owned(),
            r#"{"error": null}"#.to_owned(),
            r#"{"runs": null}"#.to_owned(),
            r#"{"runs": {"t": {"run": {"result": []}}}}"#.to_owned(),
            r#"{"runs": {"t": {"run": {"result": {"k": 1e400}}}}}"#.to_owned(),
            r#"{"runs": {"t": {"run": {"result": {"s": "\ud800"}}}}}"#.to_owned(),
            r#"{"runs": {"t": {"run": {"result": {"n": [-0, 1E2, 1e9, 0.1e1, 18446744073709551616, -9223372036854775809]}}}}}"#.to_owned(),
            r#"{"runs": {"t": {"run": {"result": {"s": "\u00e9\ud83d\ude00\n\"\/"}}}}}"#.to_owned(),
            r#"{} x"#.to_owned(),
            format!(r#"{{"x": {}}}"#, "[".repeat(200) + &"]".repeat(200)),
            // As deep as a value may nest, and one deeper.
            nested_value(122),
            nested_value(123),
            // Values of more JSON than is read whole: a value and reports, cut or dropped.
            format!(r#"{{"runs": {{"t": {{"run": {{"result": {{"v": {}, "benchmark.0.report": {}, "benchmark.1.report": {}}}}}}}}}}}"#,
                large(5_000), large(2_500), large(1_000)),
        ] {
            agree(json.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn the_smallest_keys_are_kept_and_no_other_is_wanted() {
        // (key, wanted when it comes, the keys kept after it)
        let steps = [
            ("d", true, "d"),
            ("b", true, "bd"),
            ("e", true, "bde"),
            ("f", false, "bde"),
            ("c", true, "bcd"),
            ("e", false, "bcd"),
            ("d", true, "bcd"),
            ("a", true, "abc"),
        ];
        let mut kept = Smallest::new(3);
        for (key, wanted, after) in steps {
            assert_eq!(kept.wants(&key), wanted, "{key}");
            if wanted {
                kept.insert(key, ());
            }
            assert_eq!(kept.map.keys().copied().collect::<String>(), after, "{key}");
        }
    }
}
