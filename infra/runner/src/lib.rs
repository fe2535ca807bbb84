//! The GPU-node side: what runs inside the pipeline step. Decodes `KERNELBOT_PAYLOAD`, runs
//! the submission the way kernelbot's harness does, and writes `result.json` in kernelbot's
//! `FullResult` shape for the webhook function to read.
//!
//! Exit codes (see [`exit`]): 0 whenever the evaluation ran, whatever its verdict (the
//! verdict is in `result.json`), and when there is no payload at all (a push build); non-zero
//! only when the infrastructure failed, so a failed build means "look at the node".
//!
//! A crate of its own, so the runner image builds it without the service's dependencies.
//! [`payload`] and [`result`] are the formats both sides share: the service re-exports them.

mod affinity;
mod config;
mod eval;
pub mod payload;
mod process;
mod profile;
mod profile_options;
pub mod result;
mod sandbox;
mod system;

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use crate::payload::PayloadError;
use crate::result::FullResult;

pub use config::{EvalConfig, InvalidConfig};
pub use profile_options::ProfileOptions;
use sandbox::{Sandbox, SandboxReport};

/// The whole evaluation's time: every compile and run of every mode together. The pipeline
/// step's `timeout_in_minutes` leaves room beyond it for the image pull, cleanup and upload.
pub const EVALUATION_BUDGET: Duration = Duration::from_secs(16 * 60);

/// The runner's exit codes.
pub mod exit {
    /// The evaluation ran (pass or fail is in `result.json`), or there was no payload.
    pub const OK: i32 = 0;
    /// The payload could not be read; `result.json` says why.
    pub(crate) const BAD_PAYLOAD: i32 = 2;
    /// `result.json` could not be written.
    pub(crate) const CANNOT_WRITE_RESULT: i32 = 3;
}

/// Payload variables, newest name first (`SUBMISSION_PAYLOAD` is the older one).
pub(crate) const PAYLOAD_VARS: &[&str] = &[payload::PAYLOAD_VAR, "SUBMISSION_PAYLOAD"];
pub(crate) const RESULT_FILE: &str = "result.json";

#[derive(Debug, thiserror::Error)]
pub(crate) enum RunnerError {
    #[error("{0}")]
    Payload(#[from] PayloadError),
    #[error("invalid config: {0}")]
    Config(#[from] config::InvalidConfig),
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
    let (result, code) = match read_config(&encoded) {
        Ok(config) => {
            println!("Evaluating: lang={} mode={}", config.lang, config.mode);
            let evaluation = eval::Evaluation::new(&sandbox, EVALUATION_BUDGET, out_dir);
            (eval::run_config(&config, &evaluation), exit::OK)
        }
        Err(e) => {
            eprintln!("Cannot read the payload: {e}");
            (
                failure(format!("cannot read the submission payload: {e}")),
                exit::BAD_PAYLOAD,
            )
        }
    };
    let path = out_dir.join(RESULT_FILE);
    match write_result(out_dir, &result, &sandbox.report()) {
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

/// Writes `result.json`: kernelbot's `FullResult` with the sandbox's report beside it. Written
/// to a new file and renamed into place, so a symlink or file already there is replaced, never
/// followed or appended to.
fn write_result(
    out_dir: &Path,
    result: &FullResult,
    sandbox: &SandboxReport,
) -> std::io::Result<()> {
    let mut value = serde_json::to_value(result)?;
    if let Some(object) = value.as_object_mut() {
        object.insert("sandbox".into(), serde_json::to_value(sandbox)?);
    }
    let json = serde_json::to_vec_pretty(&value)?;
    let mut file = tempfile::Builder::new()
        .prefix(".result-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .tempfile_in(out_dir)?;
    file.write_all(&json)?;
    file.as_file().sync_all()?;
    file.persist(out_dir.join(RESULT_FILE))?;
    Ok(())
}
