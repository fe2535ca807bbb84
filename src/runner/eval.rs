//! Kernelbot's evaluation flow (`run_config` / `run_evaluation`): write the sources to a
//! fresh directory, compile (CUDA) or warm up (Python), run the harness once per mode with the
//! mode's cases and timeout, and gate each mode on the previous one passing.

use std::collections::BTreeMap;
use std::path::{Component, Path};
use std::time::{Duration, SystemTime};

use super::config::{COMPILE_TIMEOUT_SECS, EvalConfig};
use super::process::run_program;
use super::system::{self, python_command};
use crate::result::{CompileResult, EvalResult, FullResult, RunResult};

/// nvcc flags used when the config names none.
pub const DEFAULT_CUDA_FLAGS: &[&str] = &[
    "-std=c++20",
    "-O3",
    "--use_fast_math",
    "-Xcompiler=-Wno-psabi",
];

/// Naive timestamps like Python's `datetime.isoformat()`, in UTC.
fn now_iso() -> String {
    humantime::format_rfc3339_micros(SystemTime::now())
        .to_string()
        .trim_end_matches('Z')
        .to_owned()
}

/// Source names must stay inside the work directory (kernelbot asserts the same).
fn safe_name(name: &str) -> bool {
    let p = Path::new(name);
    !name.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)))
}

fn write_files(dir: &Path, files: &BTreeMap<String, String>) -> Result<(), String> {
    for (name, content) in files {
        if !safe_name(name) {
            return Err(format!(
                "file name {name:?} must be a relative path inside the work directory"
            ));
        }
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{name}: {e}"))?;
        }
        std::fs::write(&path, content).map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(())
}

/// Runs the whole config and returns what `result.json` holds.
pub fn run_config(config: &EvalConfig) -> FullResult {
    let system = system::detect();
    for name in config.sources.keys().chain(config.headers.keys()) {
        if !safe_name(name) {
            return FullResult {
                success: false,
                error: format!(
                    "file name {name:?} must be a relative path inside the work directory"
                ),
                system,
                ..Default::default()
            };
        }
    }
    let device_count = system.device_count;
    let runs = run_evaluation(&config.mode, |mode| evaluate(config, mode, device_count));
    FullResult {
        success: true,
        error: String::new(),
        system,
        runs,
    }
}

/// Which modes run, in order, each gated on the previous one passing.
pub fn run_evaluation(
    mode: &str,
    mut call: impl FnMut(&str) -> EvalResult,
) -> BTreeMap<String, EvalResult> {
    let mut results = BTreeMap::new();
    let passed = |r: &EvalResult| r.run.as_ref().is_some_and(|r| r.passed);
    match mode {
        "private" | "leaderboard" => {
            for step in ["test", "benchmark", "leaderboard"] {
                let r = call(step);
                let ok = passed(&r);
                results.insert(step.to_owned(), r);
                if !ok {
                    break;
                }
            }
        }
        other => {
            results.insert(other.to_owned(), call(other));
        }
    }
    results
}

fn infra_failure(start: String, message: String) -> EvalResult {
    EvalResult {
        start: Some(start),
        end: Some(now_iso()),
        run: Some(RunResult {
            success: false,
            stderr: message,
            exit_code: -1,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// One evaluation of one mode in a fresh work directory.
fn evaluate(config: &EvalConfig, mode: &str, device_count: i64) -> EvalResult {
    let start = now_iso();
    let (work, cases_dir) = match (tempfile::tempdir(), tempfile::tempdir()) {
        (Ok(w), Ok(c)) => (w, c),
        (Err(e), _) | (_, Err(e)) => {
            return infra_failure(start, format!("cannot create a work directory: {e}"));
        }
    };
    if let Err(e) = write_files(work.path(), &config.sources)
        .and_then(|()| write_files(work.path(), &config.headers))
    {
        return infra_failure(start, e);
    }
    let (cases, timeout) = config.cases_for(mode);
    let cases_path = cases_dir.path().join("cases.txt");
    if let Err(e) = std::fs::write(&cases_path, cases) {
        return infra_failure(start, format!("cannot write the cases file: {e}"));
    }
    let mut env: Vec<(&str, String)> = Vec::new();
    if let Some(seed) = config.seed {
        env.push(("POPCORN_SEED", seed.to_string()));
    }
    if config.multi_gpu {
        env.push(("POPCORN_GPUS", device_count.to_string()));
    }
    let (compilation, program) = if config.lang == "cu" {
        let compiled = compile_cuda(config, work.path());
        // Sources go before the user's program runs, as in kernelbot.
        for name in config.sources.keys().chain(config.headers.keys()) {
            let _ = std::fs::remove_file(work.path().join(name));
        }
        if !compiled.success {
            return EvalResult {
                start: Some(start),
                end: Some(now_iso()),
                compilation: Some(compiled),
                run: None,
                profile: None,
            };
        }
        (Some(compiled), vec!["./eval.out".to_owned()])
    } else {
        let python = python_command();
        (
            warm_up(config, work.path(), &python),
            vec![python, config.main.clone().unwrap_or_default()],
        )
    };
    let mut args = program;
    args.push(mode.to_owned());
    args.push(cases_path.to_string_lossy().into_owned());
    let run = run_program(&args, work.path(), &env, Duration::from_secs(timeout));
    EvalResult {
        start: Some(start),
        end: Some(now_iso()),
        compilation,
        run: Some(run),
        profile: None,
    }
}

/// Kernelbot runs `submission.py` once before the evaluation to fill `load_inline`'s build
/// cache; when that compiled an extension, its output is the compilation result.
fn warm_up(config: &EvalConfig, dir: &Path, python: &str) -> Option<CompileResult> {
    if !config.sources.contains_key("submission.py") {
        return None;
    }
    let args = vec![python.to_owned(), "submission.py".to_owned()];
    let run = run_program(
        &args,
        dir,
        &[("POPCORN_SEED", "1".into())],
        Duration::from_secs(COMPILE_TIMEOUT_SECS),
    );
    run.stdout
        .contains("-DTORCH_EXTENSION_NAME")
        .then(|| CompileResult {
            nvcc_found: true,
            nvcc_version: String::new(),
            success: true,
            command: run.command,
            stdout: run.stdout,
            stderr: run.stderr,
            exit_code: run.exit_code,
        })
}

fn nvcc_failure(command: &str, stderr: String, exit_code: i64, nvcc_found: bool) -> CompileResult {
    CompileResult {
        nvcc_found,
        success: false,
        command: command.into(),
        stderr,
        exit_code,
        ..Default::default()
    }
}

/// Compiles the CUDA sources to `eval.out` with nvcc, if nvcc is there.
fn compile_cuda(config: &EvalConfig, dir: &Path) -> CompileResult {
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let version = match std::process::Command::new(&nvcc).arg("--version").output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        _ => {
            return nvcc_failure(
                "nvcc --version",
                "nvcc was not found on this node".into(),
                127,
                false,
            );
        }
    };
    let mut flags: Vec<String> = if config.compile_flags.is_empty() {
        DEFAULT_CUDA_FLAGS.iter().map(|f| (*f).to_owned()).collect()
    } else {
        config.compile_flags.clone()
    };
    flags.extend(config.include_dirs.iter().map(|d| format!("-I{d}")));
    flags.extend(config.libraries.iter().map(|l| format!("-l{l}")));
    for (name, value) in &config.defines {
        let ident = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ident {
            return nvcc_failure(
                "nvcc",
                format!("define {name:?} is not a valid identifier"),
                1,
                true,
            );
        }
        flags.push(match value {
            Some(v) => format!("-D{name}={v}"),
            None => format!("-D{name}"),
        });
    }
    if let Some(bad) = flags.iter().find(|f| !f.starts_with('-')) {
        return nvcc_failure(
            "nvcc",
            format!("flag {bad:?} should start with a dash"),
            1,
            true,
        );
    }
    let arch = match &config.arch {
        Some(a) => format!("-gencode=arch=compute_{a},code=sm_{a}"),
        None => "-arch=native".into(),
    };
    let mut args = vec![nvcc];
    args.extend(flags);
    args.extend(
        config
            .sources
            .keys()
            .filter(|k| k.ends_with(".cu") || k.ends_with(".cpp"))
            .cloned(),
    );
    args.extend([arch, "-o".into(), "eval.out".into()]);
    let run = run_program(&args, dir, &[], Duration::from_secs(COMPILE_TIMEOUT_SECS));
    CompileResult {
        nvcc_found: true,
        nvcc_version: version,
        success: run.exit_code == 0,
        command: run.command,
        stdout: run.stdout,
        stderr: run.stderr,
        exit_code: run.exit_code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(passed: bool) -> EvalResult {
        EvalResult {
            run: Some(RunResult {
                success: true,
                passed,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn leaderboard_modes_stop_at_the_first_failure() {
        let mut seen = Vec::new();
        let runs = run_evaluation("leaderboard", |m| {
            seen.push(m.to_owned());
            result(m != "benchmark")
        });
        assert_eq!(seen, ["test", "benchmark"]);
        assert_eq!(runs.keys().collect::<Vec<_>>(), ["benchmark", "test"]);
        let all = run_evaluation("private", |_| result(true));
        assert_eq!(all.len(), 3);
        assert_eq!(
            run_evaluation("benchmark", |_| result(false))
                .keys()
                .collect::<Vec<_>>(),
            ["benchmark"]
        );
    }

    #[test]
    fn file_names_stay_inside_the_work_directory() {
        for ok in ["eval.py", "sub/dir/k.cu"] {
            assert!(safe_name(ok), "{ok}");
        }
        for bad in ["", "/etc/passwd", "../x.py", "a/../../b", "./x"] {
            assert!(!safe_name(bad), "{bad}");
        }
    }
}
