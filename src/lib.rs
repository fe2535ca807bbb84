//! kernelbot-dispatch: a webhook-driven control plane for GPU kernel competitions.
//!
//! `submit` records a job and creates its Buildkite build; Buildkite's webhooks move the job
//! forward; on `build.finished` the `result.json` artifact becomes the job's result and the
//! final Discord report. See `README.md` for the flow and `DESIGN` contracts.

pub mod buildkite;
pub mod callback;
pub mod config;
pub mod devstack;
pub mod discord;
pub mod flow;
pub mod http;
pub mod jobs;
pub mod payload;
pub mod result;
pub mod retry;
pub mod runner;
pub mod secrets;
pub mod server;
pub mod submission;
pub mod telemetry;
mod tls;
