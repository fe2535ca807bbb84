//! A job as people and programs are shown it: its Discord status message ([`discord`], with
//! kernelbot's short report from [`summary`] and the full one attached from [`report`]) and
//! its signed callback's body ([`callback`]). Pure functions of the job.

pub(crate) mod callback;
pub mod discord;
mod profile;
mod report;
pub mod summary;

pub use discord::{render, verdict_sentence};
