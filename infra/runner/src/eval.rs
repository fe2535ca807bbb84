//! Kernelbot's evaluation flow (`run_config` / `run_evaluation`): write the sources to a
//! fresh directory, compile (CUDA) or warm up (Python), run the harness once per mode with the
//! mode's cases and timeout, and gate each mode on the previous one passing.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use super::gpu::measure;
use super::gpu::watch::Watch;
use super::process::run_program;
use super::profile::{self, Profiler};
use super::sandbox::{Sandbox, Scratch};
use super::system::{self, python_command};
use kernelbot_protocol::config::{COMPILE_TIMEOUT_SECS, EvalConfig, safe_name};
use kernelbot_protocol::result::{
    CompileResult, EvalResult, FullResult, ProfileResult, RunResult, SystemInfo, Throttled,
};

/// Kernelbot's `CUDA_FLAGS` (`consts.py`), the same on every runner, so a kernel's numbers
/// here compare with the same kernel's on Modal or GitHub. A config's own `compile_flags`
/// come after them.
pub(super) const CUDA_FLAGS: &[&str] = &[
    "--std=c++20",
    "-DNDEBUG",
    "-Xcompiler=-Wno-psabi",
    "-Xcompiler=-fno-strict-aliasing",
    "--expt-extended-lambda",
    "--expt-relaxed-constexpr",
    "-forward-unknown-to-host-compiler",
    "-O3",
    "-Xnvlink=--verbose",
    "-Xptxas=--verbose",
    "-Xptxas=--warn-on-spills",
];

/// Interpreters tried, in order, for Python submissions: the first the sandboxed user can run.
const PYTHONS: &[&str] = &["python", "python3", "/usr/bin/python3"];

/// Where a profile run's profiler writes, in its work directory.
const PROFILE_DIR: &str = "profile_data";
/// How long `ncu --import` may take to print a report's tables.
const TABLES_TIMEOUT_SECS: u64 = 120;

/// What every program of one evaluation shares: the sandbox, the time left, the interpreter,
/// and where `result.json` (and a profile run's zip) goes.
pub(super) struct Evaluation<'a> {
    pub sandbox: &'a Sandbox,
    /// When the whole evaluation's budget runs out.
    pub until: Instant,
    python: String,
    out_dir: PathBuf,
    /// On a GPU node: what reads the GPUs around timed runs.
    watch: Option<Watch>,
}

impl<'a> Evaluation<'a> {
    pub(super) fn new(sandbox: &'a Sandbox, budget: Duration, out_dir: &Path) -> Self {
        let until = Instant::now() + budget;
        let mut e = Self {
            sandbox,
            until,
            python: python_command(),
            out_dir: out_dir.to_owned(),
            watch: None,
        };
        e.python = e.find_python();
        e
    }

    /// Reads the GPUs around timed runs with `watch` (none: a machine without GPU tools).
    pub(super) fn watching(mut self, watch: Option<Watch>) -> Self {
        self.watch = watch;
        self
    }

    /// `timeout`, or less when the budget has less left.
    fn clamp(&self, timeout: Duration) -> Duration {
        timeout.min(self.until.saturating_duration_since(Instant::now()))
    }

    fn run(
        &self,
        args: &[String],
        dir: &Path,
        env: &[(&str, String)],
        timeout: Duration,
    ) -> RunResult {
        run_program(self.sandbox, args, dir, env, self.clamp(timeout))
    }

    /// The configured interpreter if the sandbox can run it, else the first of [`PYTHONS`]
    /// that it can (a root-only install is out of a sandboxed program's reach).
    fn find_python(&self) -> String {
        let Ok(scratch) = self.sandbox.scratch() else {
            return self.python.clone();
        };
        let _ = self.sandbox.hand_over(&scratch.work);
        std::iter::once(self.python.as_str())
            .chain(PYTHONS.iter().copied())
            .find(|p| {
                let args = [(*p).to_owned(), "--version".to_owned()];
                run_program(
                    self.sandbox,
                    &args,
                    &scratch.work,
                    &[],
                    Duration::from_secs(20),
                )
                .exit_code
                    == 0
            })
            .unwrap_or(&self.python)
            .to_owned()
    }
}

/// Naive timestamps like Python's `datetime.isoformat()`, in UTC.
fn now_iso() -> String {
    humantime::format_rfc3339_micros(SystemTime::now())
        .to_string()
        .trim_end_matches('Z')
        .to_owned()
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
pub(super) fn run_config(config: &EvalConfig, eval: &Evaluation) -> FullResult {
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
    if config.mode != "profile" {
        return modes(eval, config, system);
    }
    let Some(profiler) = Profiler::for_runtime(&system.runtime) else {
        return FullResult {
            success: false,
            error: "profile mode needs a CUDA GPU (Nsight Compute) or a ROCm one \
                    (rocprofv3); this machine has neither"
                .into(),
            system,
            ..Default::default()
        };
    };
    let runs = profile_runs(eval, config, profiler, system.device_count);
    FullResult {
        success: true,
        error: String::new(),
        system,
        runs,
        ..Default::default()
    }
}

/// The config's modes, each timed one (benchmark, leaderboard) with the GPUs' readings
/// around it; a leaderboard run throttled on both its measurements is no ranked time.
fn modes(eval: &Evaluation, config: &EvalConfig, system: SystemInfo) -> FullResult {
    let mut throttled: Option<Throttled> = None;
    let runs = run_evaluation(&config.mode, |mode| {
        let run = || {
            let (cases, timeout) = config.cases_for(mode);
            let step = Step {
                mode,
                cases,
                timeout,
                profile: None,
            };
            evaluate(eval, config, step, system.device_count)
        };
        match eval.watch.as_ref().filter(|_| measure::is_timed(mode)) {
            Some(watch) => {
                let (result, slowed) = watch.timed(mode, eval.until, run);
                throttled = throttled.take().or(slowed);
                result
            }
            None => run(),
        }
    });
    FullResult {
        success: throttled.is_none(),
        error: throttled
            .as_ref()
            .map(Throttled::sentence)
            .unwrap_or_default(),
        system,
        runs,
        throttled,
        ..Default::default()
    }
}

/// Profile mode: each benchmark once under `profiler`, as `profile.<i>`.
fn profile_runs(
    eval: &Evaluation,
    config: &EvalConfig,
    profiler: Profiler,
    device_count: i64,
) -> BTreeMap<String, EvalResult> {
    let cases = config.profile_cases();
    cases
        .into_iter()
        .map(|(i, cases, timeout)| {
            let step = Step {
                mode: "profile",
                cases,
                timeout,
                profile: Some((profiler, i)),
            };
            (
                format!("profile.{i}"),
                evaluate(eval, config, step, device_count),
            )
        })
        .collect()
}

/// One run of the harness: its mode, its cases and timeout, and the profiler it runs under
/// with the run's index.
struct Step<'a> {
    mode: &'a str,
    cases: String,
    timeout: u64,
    profile: Option<(Profiler, usize)>,
}

/// Which modes run, in order, each gated on the previous one passing.
pub(super) fn run_evaluation(
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

/// Writes the sources and headers into the scratch's work directory, hands it to the
/// sandboxed user, and writes the mode's cases file; the cases file's path.
fn prepare(
    eval: &Evaluation,
    scratch: &Scratch,
    config: &EvalConfig,
    step: &Step,
) -> Result<PathBuf, String> {
    let work = scratch.work.as_path();
    write_files(work, &config.sources)?;
    write_files(work, &config.headers)?;
    if step.profile.is_some() {
        std::fs::create_dir(work.join(PROFILE_DIR))
            .map_err(|e| format!("cannot create the profiler's directory: {e}"))?;
    }
    eval.sandbox
        .hand_over(work)
        .map_err(|e| format!("cannot hand the work directory over: {e}"))?;
    scratch
        .read_only_file("cases.txt", &step.cases)
        .map_err(|e| format!("cannot write the cases file: {e}"))
}

/// The variables kernelbot's harness reads: the seed, and the GPUs of a multi-GPU task.
fn harness_env(config: &EvalConfig, device_count: i64) -> Vec<(&'static str, String)> {
    let mut env = Vec::new();
    if let Some(seed) = config.seed {
        env.push(("POPCORN_SEED", seed.to_string()));
    }
    if config.multi_gpu {
        env.push(("POPCORN_GPUS", device_count.to_string()));
    }
    env
}

/// The program to run (compiled first for CUDA, whose sources go before it runs, as in
/// kernelbot) and its compilation; a failed compile instead.
fn build_program(
    eval: &Evaluation,
    config: &EvalConfig,
    work: &Path,
) -> Result<(Option<CompileResult>, Vec<String>), CompileResult> {
    if config.lang != "cu" {
        let program = vec![eval.python.clone(), config.main.clone().unwrap_or_default()];
        return Ok((warm_up(eval, config, work), program));
    }
    let compiled = compile_cuda(eval, config, work);
    let sources: Vec<_> = config
        .sources
        .keys()
        .chain(config.headers.keys())
        .map(|name| work.join(name))
        .collect();
    eval.sandbox.remove_files(&sources);
    if !compiled.success {
        return Err(compiled);
    }
    Ok((Some(compiled), vec!["./eval.out".to_owned()]))
}

/// One evaluation of one mode in a fresh scratch directory.
fn evaluate(eval: &Evaluation, config: &EvalConfig, step: Step, device_count: i64) -> EvalResult {
    let start = now_iso();
    let scratch = match eval.sandbox.scratch() {
        Ok(s) => s,
        Err(e) => return infra_failure(start, format!("cannot create a work directory: {e}")),
    };
    let work = scratch.work.as_path();
    let cases_path = match prepare(eval, &scratch, config, &step) {
        Ok(p) => p,
        Err(e) => return infra_failure(start, e),
    };
    let (compilation, mut args) = match build_program(eval, config, work) {
        Ok(built) => built,
        Err(failed) => {
            return EvalResult {
                start: Some(start),
                end: Some(now_iso()),
                compilation: Some(failed),
                run: None,
                profile: None,
                conditions: None,
            };
        }
    };
    args.push(step.mode.to_owned());
    args.push(cases_path.to_string_lossy().into_owned());
    let mut env = harness_env(config, device_count);
    let out = work.join(PROFILE_DIR);
    if let Some((profiler, _)) = step.profile {
        env.push(profiler.env());
        args = profiler.wrap(&out, &config.profile_options, &args);
    }
    let mut run = eval.run(&args, work, &env, Duration::from_secs(step.timeout));
    let profile = step
        .profile
        .and_then(|(profiler, i)| eval.keep_profile(profiler, i, work, &mut run));
    EvalResult {
        start: Some(start),
        end: Some(now_iso()),
        compilation,
        run: Some(run),
        profile,
        conditions: None,
    }
}

impl Evaluation<'_> {
    /// Moves what the profiler left beside the program (rocprofv3's code objects) into its
    /// directory, as kernelbot does, so the zip holds them too.
    fn gather(&self, profiler: Profiler, work: &Path, out: &Path) {
        // `work` itself cannot be swapped (its parent is root's): listing it is safe.
        let Ok(entries) = std::fs::read_dir(work) else {
            return;
        };
        let moves: Vec<(PathBuf, PathBuf)> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| profiler.keeps(name))
            .map(|name| (work.join(&name), out.join(&name)))
            .collect();
        self.sandbox.move_files(&moves);
    }

    /// After a profile run: Nsight's tables in the run's `benchmark.0.report` (base64, as
    /// kernelbot puts them), and, if the run succeeded, the profiler's files zipped beside
    /// `result.json` as `profile.<index>.zip`. A zip refused is said in the run's stderr.
    fn keep_profile(
        &self,
        profiler: Profiler,
        index: usize,
        work: &Path,
        run: &mut RunResult,
    ) -> Option<ProfileResult> {
        let out = work.join(PROFILE_DIR);
        if let Some(command) = profiler.tables_command(&out) {
            // The report was written by the program: it is read inside the sandbox too.
            let tables = self.run(
                &command,
                work,
                &[],
                Duration::from_secs(TABLES_TIMEOUT_SECS),
            );
            if tables.exit_code == 0 {
                let report = STANDARD.encode(profile::filter_ncu_report(&tables.stdout));
                run.result
                    .insert("benchmark.0.report".into(), report.into());
            }
        }
        if !run.success {
            return None;
        }
        self.gather(profiler, work, &out);
        let zip = self.out_dir.join(format!("profile.{index}.zip"));
        match profile::zip_dir(&out, self.sandbox.program_uid(), &zip) {
            Ok(_) => Some(ProfileResult {
                profiler: profiler.name().into(),
                trace: None,
                download_url: None,
            }),
            Err(e) => {
                run.stderr
                    .push_str(&format!("\n{e}: they are not kept for download."));
                None
            }
        }
    }
}

/// Kernelbot runs `submission.py` once before the evaluation to fill `load_inline`'s build
/// cache; when that compiled an extension, its output is the compilation result.
fn warm_up(eval: &Evaluation, config: &EvalConfig, dir: &Path) -> Option<CompileResult> {
    if !config.sources.contains_key("submission.py") {
        return None;
    }
    let args = vec![eval.python.clone(), "submission.py".to_owned()];
    let run = eval.run(
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

/// nvcc's `--version`, asked in the sandbox too (after a program has run, root never runs
/// anything it could reach); a failed compile when it is missing or does not answer.
fn nvcc_version(eval: &Evaluation, nvcc: &str, dir: &Path) -> Result<String, CompileResult> {
    let probe = eval.run(
        &[nvcc.to_owned(), "--version".to_owned()],
        dir,
        &[],
        Duration::from_secs(30),
    );
    match probe.exit_code {
        0 => Ok(probe.stdout),
        127 => Err(nvcc_failure(
            "nvcc --version",
            "nvcc was not found on this node".into(),
            127,
            false,
        )),
        // It is there but did not answer (a timeout, the budget, permissions): say so.
        code => Err(nvcc_failure(
            "nvcc --version",
            format!("nvcc --version failed (exit {code}): {}", probe.stderr),
            code,
            true,
        )),
    }
}

/// Kernelbot's flags, then the config's: its flags, include dirs, libraries and defines,
/// each checked so nothing becomes an input file or an unintended option.
fn nvcc_flags(config: &EvalConfig) -> Result<Vec<String>, CompileResult> {
    let mut flags: Vec<String> = CUDA_FLAGS.iter().map(|f| (*f).to_owned()).collect();
    flags.extend(config.compile_flags.iter().cloned());
    flags.extend(config.include_dirs.iter().map(|d| format!("-I{d}")));
    flags.extend(config.libraries.iter().map(|l| format!("-l{l}")));
    for (name, value) in &config.defines {
        let ident = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ident {
            let why = format!("define {name:?} is not a valid identifier");
            return Err(nvcc_failure("nvcc", why, 1, true));
        }
        flags.push(match value {
            Some(v) => format!("-D{name}={v}"),
            None => format!("-D{name}"),
        });
    }
    if let Some(bad) = flags.iter().find(|f| !f.starts_with('-')) {
        let why = format!("flag {bad:?} should start with a dash");
        return Err(nvcc_failure("nvcc", why, 1, true));
    }
    Ok(flags)
}

/// Compiles the CUDA sources to `eval.out` with nvcc, if nvcc is there.
fn compile_cuda(eval: &Evaluation, config: &EvalConfig, dir: &Path) -> CompileResult {
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let version = match nvcc_version(eval, &nvcc, dir) {
        Ok(v) => v,
        Err(failed) => return failed,
    };
    let flags = match nvcc_flags(config) {
        Ok(f) => f,
        Err(failed) => return failed,
    };
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
    let run = eval.run(&args, dir, &[], Duration::from_secs(COMPILE_TIMEOUT_SECS));
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
