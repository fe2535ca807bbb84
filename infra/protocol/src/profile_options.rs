//! kernelbot's profile options (`POST /profile`'s `ProfileOptions`): which benchmark to
//! profile, which kernels Nsight Compute measures and how many launches. Read from the
//! submission's `config.profile_options`; a bad one is refused naming its field.

use serde_json::{Map, Value};

use crate::invalid::InvalidConfig;

/// Launches `ncu` measures when the submission says nothing (kernelbot's `-c 10`).
pub const DEFAULT_LAUNCH_COUNT: u64 = 10;
/// At most this many launches: each is replayed many times under the profiler.
const MAX_LAUNCH_COUNT: u64 = 100;
/// `ncu --kernel-name-base`'s values.
const NAME_BASES: &[&str] = &["function", "demangled", "mangled"];
/// A kernel name or `regex:` filter of at most this many characters.
const MAX_NAME: usize = 512;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProfileOptions {
    /// Profile only this benchmark (an index into `benchmarks`).
    pub benchmark_index: Option<usize>,
    /// `ncu -k`: the kernels to measure (a name, or `regex:<pattern>`).
    pub kernel_name: Option<String>,
    /// `ncu --kernel-name-base`: which name `kernel_name` matches.
    pub kernel_name_base: Option<String>,
    /// `ncu -c`: launches to measure.
    pub launch_count: Option<u64>,
}

fn field(key: &str) -> String {
    format!("profile_options.{key}")
}

fn bad(key: &str, message: &str) -> InvalidConfig {
    InvalidConfig {
        field: field(key),
        message: format!("profile_options.{key} {message}"),
    }
}

impl ProfileOptions {
    /// `config.profile_options`, checked against the config's `benchmarks` count.
    pub fn from_json(value: Option<&Value>, benchmarks: usize) -> Result<Self, InvalidConfig> {
        let obj = match value {
            None | Some(Value::Null) => return Ok(Self::default()),
            Some(Value::Object(obj)) => obj,
            Some(_) => {
                return Err(InvalidConfig {
                    field: "profile_options".into(),
                    message: "profile_options must be an object".into(),
                });
            }
        };
        if let Some(unknown) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(bad(
                &unknown.chars().take(64).collect::<String>(),
                "is not a profile option",
            ));
        }
        let index = count(obj, "benchmark_index")?;
        if index.is_some_and(|i| i >= benchmarks as u64) {
            return Err(bad(
                "benchmark_index",
                &format!("must name one of the {benchmarks} benchmarks"),
            ));
        }
        let launch_count = count(obj, "ncu_launch_count")?;
        if launch_count.is_some_and(|c| c == 0 || c > MAX_LAUNCH_COUNT) {
            return Err(bad(
                "ncu_launch_count",
                &format!("must be 1 to {MAX_LAUNCH_COUNT}"),
            ));
        }
        let kernel_name_base = text(obj, "ncu_kernel_name_base")?;
        if kernel_name_base
            .as_deref()
            .is_some_and(|b| !NAME_BASES.contains(&b))
        {
            return Err(bad(
                "ncu_kernel_name_base",
                "must be function, demangled or mangled",
            ));
        }
        Ok(Self {
            benchmark_index: index.map(|i| i as usize),
            kernel_name: text(obj, "ncu_kernel_name")?,
            kernel_name_base,
            launch_count,
        })
    }

    /// `ncu`'s options for the kernels and launches measured.
    pub fn ncu_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(name) = &self.kernel_name {
            args.extend(["-k".to_owned(), name.clone()]);
        }
        if let Some(base) = &self.kernel_name_base {
            args.extend(["--kernel-name-base".to_owned(), base.clone()]);
        }
        let count = self.launch_count.unwrap_or(DEFAULT_LAUNCH_COUNT);
        args.extend(["-c".to_owned(), count.to_string()]);
        args
    }
}

const KEYS: &[&str] = &[
    "benchmark_index",
    "ncu_kernel_name",
    "ncu_kernel_name_base",
    "ncu_launch_count",
];

fn count(obj: &Map<String, Value>, key: &str) -> Result<Option<u64>, InvalidConfig> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(key, "must be a whole number, 0 or more")),
    }
}

fn text(obj: &Map<String, Value>, key: &str) -> Result<Option<String>, InvalidConfig> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_NAME && !s.contains('\0') => {
            Ok(Some(s.clone()))
        }
        Some(_) => Err(bad(
            key,
            &format!("must be text of 1 to {MAX_NAME} characters"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn options_are_read_or_refused_naming_the_field() {
        let ok = |v: Value| ProfileOptions::from_json(Some(&v), 3).unwrap();
        assert_eq!(ok(json!({})), ProfileOptions::default());
        assert_eq!(
            ok(
                json!({"benchmark_index": 2, "ncu_kernel_name": "regex:gemm.*",
                "ncu_kernel_name_base": "demangled", "ncu_launch_count": 3})
            ),
            ProfileOptions {
                benchmark_index: Some(2),
                kernel_name: Some("regex:gemm.*".into()),
                kernel_name_base: Some("demangled".into()),
                launch_count: Some(3),
            }
        );
        // (options, the field named)
        for (options, field) in [
            (json!([1]), "profile_options"),
            (
                json!({"benchmark_index": 3}),
                "profile_options.benchmark_index",
            ),
            (
                json!({"benchmark_index": -1}),
                "profile_options.benchmark_index",
            ),
            (
                json!({"benchmark_index": "0"}),
                "profile_options.benchmark_index",
            ),
            (
                json!({"ncu_launch_count": 0}),
                "profile_options.ncu_launch_count",
            ),
            (
                json!({"ncu_launch_count": 101}),
                "profile_options.ncu_launch_count",
            ),
            (
                json!({"ncu_kernel_name": ""}),
                "profile_options.ncu_kernel_name",
            ),
            (
                json!({"ncu_kernel_name": 7}),
                "profile_options.ncu_kernel_name",
            ),
            (
                json!({"ncu_kernel_name_base": "short"}),
                "profile_options.ncu_kernel_name_base",
            ),
            (
                json!({"ncu_sections": "all"}),
                "profile_options.ncu_sections",
            ),
        ] {
            let err = ProfileOptions::from_json(Some(&options), 3).unwrap_err();
            assert_eq!(err.field, field, "{options}");
            assert!(err.message.starts_with(field), "{}", err.message);
        }
    }

    #[test]
    fn ncu_measures_what_the_options_say() {
        assert_eq!(ProfileOptions::default().ncu_args(), ["-c", "10"]);
        let chosen = ProfileOptions {
            kernel_name: Some("gemm".into()),
            kernel_name_base: Some("function".into()),
            launch_count: Some(1),
            ..Default::default()
        };
        assert_eq!(
            chosen.ncu_args(),
            ["-k", "gemm", "--kernel-name-base", "function", "-c", "1"]
        );
    }
}
