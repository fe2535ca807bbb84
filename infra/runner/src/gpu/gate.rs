//! The pre-flight as the runner runs it: find the vendor's tool, read the GPUs and their
//! processes, and decide. What it found goes into `result.json` either way.

use serde::Serialize;

use super::preflight::{self, Thresholds};
use super::probe;
use super::watch::{DEFAULT_COOLDOWN, Watch};
use crate::result::{GpuReading, InfraFailure};

/// What the pre-flight did, as `result.json`'s `preflight` says it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Report {
    /// `passed`, `skipped` or `failed`.
    pub(crate) status: &'static str,
    /// Why it was skipped or failed; empty when it passed.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(crate) detail: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) readings: Vec<GpuReading>,
}

/// The outcome: go ahead (with the report and, on a GPU node, what reads the GPUs around
/// timed runs), or stop for this infrastructure failure.
pub(crate) enum Gate {
    Go(Report, Option<Watch>),
    Stop(InfraFailure),
}

fn stop(reason: &str, detail: String, readings: Vec<GpuReading>) -> Gate {
    Gate::Stop(InfraFailure {
        stage: "preflight".into(),
        reason: reason.into(),
        detail,
        readings,
        processes: Vec::new(),
    })
}

const COOLDOWN_VAR: &str = "KERNELBOT_COOLDOWN_SECS";

/// The cool-down before a throttled leaderboard run's second try.
fn cooldown(lookup: &dyn Fn(&str) -> Option<String>) -> Result<std::time::Duration, String> {
    match lookup(COOLDOWN_VAR).filter(|v| !v.trim().is_empty()) {
        None => Ok(DEFAULT_COOLDOWN),
        Some(v) => v
            .trim()
            .parse()
            .map(std::time::Duration::from_secs)
            .map_err(|_| format!("{COOLDOWN_VAR}={v:?} is not a whole number of seconds")),
    }
}

/// Runs the pre-flight, unless this machine has no GPU tool to run it with.
pub(crate) fn preflight(lookup: &dyn Fn(&str) -> Option<String>) -> Gate {
    let Some((vendor, tool)) = probe::vendor(lookup) else {
        let report = Report {
            status: "skipped",
            detail: "no nvidia-smi or amd-smi on PATH: not a GPU node, nothing to check".into(),
            readings: Vec::new(),
        };
        return Gate::Go(report, None);
    };
    let (limits, cooldown) =
        match Thresholds::from_env(lookup).and_then(|l| Ok((l, cooldown(lookup)?))) {
            Ok(read) => read,
            Err(e) => return stop("bad_threshold", e, Vec::new()),
        };
    let readings = match probe::readings(vendor, &tool) {
        Ok(r) => r,
        Err(e) => return stop(e.reason(), e.to_string(), Vec::new()),
    };
    let processes = match probe::processes(vendor, &tool) {
        Ok(p) => p,
        Err(e) => return stop(e.reason(), e.to_string(), readings),
    };
    let given = probe::given_devices(vendor, lookup);
    match preflight::decide(given.as_deref(), &readings, &processes, &limits) {
        Ok(()) => {
            let report = Report {
                status: "passed",
                detail: String::new(),
                readings,
            };
            let watch = Watch {
                vendor,
                tool,
                cooldown,
            };
            Gate::Go(report, Some(watch))
        }
        Err(refusal) => Gate::Stop(InfraFailure {
            stage: "preflight".into(),
            reason: refusal.reason.into(),
            detail: refusal.message,
            readings,
            processes,
        }),
    }
}
