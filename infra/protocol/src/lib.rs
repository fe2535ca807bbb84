//! What the service and the GPU-node runner agree on, and nothing else: the build's payload
//! ([`payload`]), the evaluation config and the rules it must pass ([`config`]), the
//! `result.json` the runner writes and the bounded reader and renderer the service reads it
//! with ([`result`]), and the runner's exit codes ([`exit`]), which the pipeline's retry rules
//! and the service's reading of a try both name; and how `result.json` rides the build's
//! meta-data ([`riding`]).
//!
//! A library with no binary and no I/O of its own: `submit` checks a config with the same
//! rules the runner applies, and each side links only this of the other.

pub mod config;
mod invalid;
pub mod payload;
pub mod profile_options;
pub mod result;
pub mod riding;

use std::time::Duration;

pub use config::{EvalConfig, InvalidConfig};
pub use profile_options::ProfileOptions;

/// The whole evaluation's time: every compile and run of every mode together. The pipeline
/// step's `timeout_in_minutes` leaves room beyond it for the image pull, cleanup and upload.
pub const EVALUATION_BUDGET: Duration = Duration::from_secs(16 * 60);

/// The file the runner writes its result to, in the step's directory (the pipeline uploads
/// it as an artifact of that name).
pub const RESULT_FILE: &str = "result.json";

/// The file the agent's post-command hook reads its note from (`setup-node.sh`): a first
/// line `pause` or `retry`, then one printable line saying why.
pub const INFRA_FILE: &str = "infra.txt";

/// The runner's exit codes.
pub mod exit {
    /// The evaluation ran (pass or fail is in `result.json`), or there was no payload.
    pub const OK: i32 = 0;
    /// The payload could not be read; `result.json` says why.
    pub const BAD_PAYLOAD: i32 = 2;
    /// `result.json` could not be written.
    pub const CANNOT_WRITE_RESULT: i32 = 3;
    /// The GPU node, not the submission, failed (`EX_TEMPFAIL`): the pre-flight refused the
    /// GPUs before any of the submission's code ran. `result.json` holds `infra` with the
    /// stage, reason and readings; the pipeline retries the job automatically on this code.
    pub const INFRA: i32 = 75;
    /// A timed run stayed throttled on this GPU after the submission ran: it may be the
    /// kernel's own heat, so the agent is not paused and the pipeline tries the job once more
    /// (its limit for this code is 1). `result.json` holds `throttled`, which is the
    /// submission's outcome when no retry follows.
    pub const THROTTLED: i32 = 76;
}
