//! The GPU-node side: what runs inside the pipeline step. Decodes `KERNELBOT_PAYLOAD`, runs
//! the submission the way kernelbot's harness does, and writes `result.json` in kernelbot's
//! `FullResult` shape for the webhook function to read.
//!
//! Exit codes (see [`exit`]): 0 whenever the evaluation ran, whatever its verdict (the
//! verdict is in `result.json`), and when there is no payload at all (a push build); non-zero
//! only when the infrastructure failed, so a failed build means "look at the node".
//!
//! Before any of the submission's code runs, a GPU node's GPUs pass a pre-flight ([`gpu`]);
//! a failed one runs nothing, says why in `result.json`'s `infra`, and exits
//! [`exit::INFRA`], which the pipeline retries on another agent. What shows only after the
//! submission ran (a timed run the GPU slowed down, perhaps by the kernel's own heat) is
//! never the node's fault at first sight: it exits [`exit::THROTTLED`], which the pipeline
//! retries once elsewhere; throttled there too, `result.json`'s `throttled` is the
//! submission's outcome.
//!
//! A crate of its own, so the runner image builds it without the service's dependencies.
//! What it shares with the service (the payload, the config's rules, `result.json`, the exit
//! codes) is the protocol crate's (`kernelbot_protocol`); neither side links the other.

mod affinity;
mod eval;
mod gpu;
mod process;
mod profile;
mod sandbox;
mod system;

use std::io::Write;
use std::path::Path;

use kernelbot_protocol::payload::{self, PayloadError};
use kernelbot_protocol::result::{FullResult, InfraFailure, Throttled, WrittenBy};
use kernelbot_protocol::riding::{self, RESULT_META_FILE};
use kernelbot_protocol::{
    EVALUATION_BUDGET, EvalConfig, INFRA_FILE, InvalidConfig, RESULT_FILE, exit,
};

use crate::gpu::gate::{self, Gate};
use sandbox::{Sandbox, SandboxReport};

/// Payload variables, newest name first (`SUBMISSION_PAYLOAD` is the older one).
pub(crate) const PAYLOAD_VARS: &[&str] = &[payload::PAYLOAD_VAR, "SUBMISSION_PAYLOAD"];

#[derive(Debug, thiserror::Error)]
pub(crate) enum RunnerError {
    #[error("{0}")]
    Payload(#[from] PayloadError),
    #[error("invalid config: {0}")]
    Config(#[from] InvalidConfig),
}

/// A failed run's result: no runs, the reason in `error`.
pub fn failure(error: impl Into<String>) -> FullResult {
    FullResult {
        success: false,
        error: error.into(),
        system: system::detect(),
        ..Default::default()
    }
}

/// An infrastructure failure's result: no runs, `infra` saying what failed, and a sentence
/// that puts the blame where it belongs.
pub(crate) fn infra_failure(infra: InfraFailure) -> FullResult {
    FullResult {
        success: false,
        error: infra.sentence(),
        system: system::detect(),
        infra: Some(infra),
        ..Default::default()
    }
}

/// The pre-flight, then (if the GPUs passed) the evaluation: the result, the pre-flight's
/// report, and the exit code.
fn checked_evaluation(
    lookup: &dyn Fn(&str) -> Option<String>,
    config: &EvalConfig,
    sandbox: &Sandbox,
    out_dir: &Path,
) -> (FullResult, Option<gate::Report>, i32) {
    match gate::preflight(lookup) {
        Gate::Stop(infra) => {
            eprintln!("Pre-flight failed ({}): {}", infra.reason, infra.detail);
            (infra_failure(infra), None, exit::INFRA)
        }
        Gate::Go(report, watch) => {
            println!("Pre-flight {}. {}", report.status, report.detail);
            println!("Evaluating: lang={} mode={}", config.lang, config.mode);
            let evaluation =
                eval::Evaluation::new(sandbox, EVALUATION_BUDGET, out_dir).watching(watch);
            let result = eval::run_config(config, &evaluation);
            let code = exit_code(&result);
            (result, Some(report), code)
        }
    }
}

/// The exit code of an evaluation that ran: the node's fault, and a timed run that stayed
/// throttled, each have their own (the pipeline retries the first twice and the second once:
/// its limit, not this try's count, decides, as a retry may follow another fault); anything
/// else is the submission's outcome.
pub(crate) fn exit_code(result: &FullResult) -> i32 {
    match (&result.infra, &result.throttled) {
        (Some(_), _) => exit::INFRA,
        (None, Some(_)) => exit::THROTTLED,
        _ => exit::OK,
    }
}

/// Decodes and validates the payload.
pub(crate) fn read_config(encoded: &str) -> Result<EvalConfig, RunnerError> {
    let value = payload::decode(encoded)?;
    Ok(EvalConfig::from_json(&value)?)
}

/// The whole runner: `lookup` reads the environment, `out_dir` receives `result.json`.
/// Returns the process exit code.
pub fn run(lookup: &dyn Fn(&str) -> Option<String>, out_dir: &Path) -> i32 {
    let Some(encoded) = PAYLOAD_VARS
        .iter()
        .find_map(|v| lookup(v).filter(|p| !p.trim().is_empty()))
    else {
        println!(
            "No {} in the environment: nothing to evaluate (not a kernelbot build).",
            payload::PAYLOAD_VAR
        );
        return exit::OK;
    };
    if let Some(cpuset) = lookup("KERNELBOT_CPUSET").filter(|c| !c.trim().is_empty()) {
        // A CPU set we cannot apply is reported but does not stop the evaluation.
        match affinity::parse_cpuset(&cpuset)
            .and_then(|cpus| affinity::pin(&cpus).map_err(|e| e.to_string()))
        {
            Ok(()) => println!("Pinned to CPUs {cpuset}."),
            Err(e) => eprintln!("Cannot pin to KERNELBOT_CPUSET={cpuset}: {e}"),
        }
    }
    let sandbox = Sandbox::new(lookup);
    let (result, preflight, code) = match read_config(&encoded) {
        Ok(config) => checked_evaluation(lookup, &config, &sandbox, out_dir),
        Err(e) => {
            eprintln!("Cannot read the payload: {e}");
            let why = format!("cannot read the submission payload: {e}");
            (failure(why), None, exit::BAD_PAYLOAD)
        }
    };
    let mut result = result;
    result.written_by = written_by(lookup);
    let path = out_dir.join(RESULT_FILE);
    match write_result(out_dir, &result, &sandbox.report(), preflight.as_ref()) {
        Ok(()) => {
            println!("Wrote {} (success: {}).", path.display(), result.success);
            code
        }
        Err(e) => {
            eprintln!("Cannot write {}: {e}", path.display());
            exit::CANNOT_WRITE_RESULT
        }
    }
}

/// Writes `result.json`: kernelbot's `FullResult` with the sandbox's and the pre-flight's
/// reports beside it. Written to a new file and renamed into place, so a symlink or file
/// already there is replaced, never followed or appended to.
fn write_result(
    out_dir: &Path,
    result: &FullResult,
    sandbox: &SandboxReport,
    preflight: Option<&gate::Report>,
) -> std::io::Result<()> {
    let mut value = serde_json::to_value(result)?;
    if let Some(object) = value.as_object_mut() {
        object.insert("sandbox".into(), serde_json::to_value(sandbox)?);
        if let Some(report) = preflight {
            object.insert("preflight".into(), serde_json::to_value(report)?);
        }
    }
    let json = serde_json::to_vec_pretty(&value)?;
    let mut file = tempfile::Builder::new()
        .prefix(".result-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .tempfile_in(out_dir)?;
    file.write_all(&json)?;
    file.as_file().sync_all()?;
    file.persist(out_dir.join(RESULT_FILE))?;
    if let Some(infra) = &result.infra {
        let action = if infra.pauses_agent() {
            "pause"
        } else {
            "retry"
        };
        write_infra_line(
            out_dir,
            action,
            &format!("{}: {}", infra.reason, infra.detail),
        )?;
    } else if let Some(t) = &result.throttled {
        // Never a pause: the kernel may have heated the GPU itself.
        write_infra_line(out_dir, "retry", &throttled_line(t))?;
    }
    // Only a shortcut for the service (it reads the artifact without it): never the run's
    // failure, nor in the way of the hook's note.
    if let Err(e) = write_meta(out_dir, &json) {
        eprintln!("Cannot write {RESULT_META_FILE} (the service reads result.json instead): {e}");
    }
    Ok(())
}

/// The try this is, from the job's environment (`None` outside Buildkite).
fn written_by(lookup: &dyn Fn(&str) -> Option<String>) -> Option<WrittenBy> {
    let job_id = lookup("BUILDKITE_JOB_ID").filter(|j| !j.trim().is_empty())?;
    Some(WrittenBy {
        job_id: job_id.trim().to_owned(),
        retry_count: gate::retry_count(lookup),
    })
}

/// `result.meta`: `result.json` packed for the build's meta-data, which the hook sets so the
/// result rides `build.finished`. Not written (and any old one removed) when it is too long.
fn write_meta(out_dir: &Path, json: &[u8]) -> std::io::Result<()> {
    let path = out_dir.join(RESULT_META_FILE);
    let Some(packed) = riding::pack_result(json) else {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    };
    let mut file = tempfile::Builder::new()
        .prefix(".result-meta-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .tempfile_in(out_dir)?;
    file.write_all(packed.as_bytes())?;
    file.as_file().sync_all()?;
    file.persist(path)?;
    Ok(())
}

/// The hook's note of a run throttled after the submission ran.
fn throttled_line(t: &Throttled) -> String {
    format!(
        "throttled: the {} run was slowed down ({}) on both its measurements on this GPU",
        t.mode,
        t.slowdowns.join(", ")
    )
}

/// `infra.txt`, for the agent's hook (which reads no JSON): a first line `pause` (a fault
/// that outlasts the job: the agent takes itself out of the queue) or `retry` (the job is
/// retried elsewhere, the agent stays), then one printable line saying why.
fn write_infra_line(out_dir: &Path, action: &str, why: &str) -> std::io::Result<()> {
    let line: String = why
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(280)
        .collect();
    let mut file = tempfile::Builder::new()
        .prefix(".infra-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .tempfile_in(out_dir)?;
    writeln!(file, "{action}\n{line}")?;
    file.persist(out_dir.join(INFRA_FILE))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_s_fault_and_a_throttled_run_have_their_own_exit_codes() {
        let infra = Some(InfraFailure::default());
        let throttled = |retry| {
            Some(Throttled {
                retry,
                ..Throttled::default()
            })
        };
        let cases = [
            (None, None, exit::OK),
            (infra.clone(), None, exit::INFRA),
            (None, throttled(0), exit::THROTTLED),
            (None, throttled(1), exit::THROTTLED),
            (infra, throttled(0), exit::INFRA),
        ];
        for (infra, throttled, want) in cases {
            let result = FullResult {
                infra,
                throttled,
                ..FullResult::default()
            };
            assert_eq!(exit_code(&result), want, "{result:?}");
        }
    }

    /// The result names its try, and `result.meta` holds the same file packed for the hook.
    #[test]
    fn the_result_names_its_try_and_is_packed_beside_it_for_the_hook() {
        let out = tempfile::tempdir().unwrap();
        let env = [
            ("KERNELBOT_PAYLOAD", "not a payload"),
            ("BUILDKITE_JOB_ID", "0194b7c2-job"),
            ("BUILDKITE_RETRY_COUNT", "2"),
        ];
        let lookup = |name: &str| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        };
        assert_eq!(run(&lookup, out.path()), exit::BAD_PAYLOAD);
        let json = std::fs::read(out.path().join(RESULT_FILE)).unwrap();
        let written = FullResult::parse(&json).unwrap();
        assert_eq!(
            written.written_by,
            Some(WrittenBy {
                job_id: "0194b7c2-job".into(),
                retry_count: 2
            })
        );
        let packed = std::fs::read_to_string(out.path().join(RESULT_META_FILE)).unwrap();
        assert!(packed.len() < json.len(), "{packed}");
        assert_eq!(riding::unpack_result(&packed, 1 << 20).unwrap(), written);
        // A result.meta that cannot be written is no failure of the run.
        let blocked = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(blocked.path().join(RESULT_META_FILE).join("in-the-way")).unwrap();
        assert_eq!(run(&lookup, blocked.path()), exit::BAD_PAYLOAD);
        assert!(blocked.path().join(RESULT_FILE).is_file());
        // Outside Buildkite there is no try to name.
        let bare = tempfile::tempdir().unwrap();
        run(
            &|n| (n == "KERNELBOT_PAYLOAD").then(|| "x".into()),
            bare.path(),
        );
        let json = std::fs::read(bare.path().join(RESULT_FILE)).unwrap();
        assert_eq!(FullResult::parse(&json).unwrap().written_by, None);
    }
}
