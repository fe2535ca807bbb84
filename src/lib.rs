//! kernelbot-dispatch: a webhook-driven control plane for GPU kernel competitions.
//!
//! `submit` records a job and creates its Buildkite build; Buildkite's webhooks move the job
//! forward; on `build.finished` the `result.json` artifact becomes the job's result, the
//! final Discord report and a signed callback. `docs/architecture.md` draws the layers
//! (each module uses only those below it) and names the module of each arrow of the flow:
//!
//! ```text
//! bin → {server, http, ops} → flow → {buildkite, discord, callback, jobs, runner, secrets, stack}
//!     → {retry, telemetry, tls, window} → {config, time, text, token, mac, error, payload, result}
//! ```

pub mod buildkite;
mod callback;
pub mod config;
#[cfg(feature = "devstack")]
pub mod devstack;
pub mod discord;
pub mod error;
pub mod flow;
pub mod http;
pub mod jobs;
mod mac;
pub mod ops;
mod profile_link;
pub mod retry;
pub mod secrets;
pub mod server;
#[cfg(feature = "stack")]
pub mod stack;
pub mod telemetry;
mod text;
pub mod time;
mod tls;
mod token;
mod window;

// What the service and the GPU node's runner agree on (the payload, config rules,
// result.json, exit codes) is a crate of its own (infra/protocol) that both link.
pub use kernelbot_protocol as protocol;
pub use kernelbot_protocol::{payload, result};
