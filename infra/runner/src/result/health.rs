//! What the runner reports about the GPUs themselves, beside kernelbot's fields: the
//! readings a pre-flight or a timed run took, and the infrastructure failure that stopped a
//! job. Kernelbot ignores these fields; the service keeps them for operators and reports.

use serde::{Deserialize, Serialize};

use super::{cap, caps};

/// One GPU as its vendor's tool reported it. `None` where the tool printed `[N/A]` (or
/// `N/A`): the value is unsupported on that GPU, not zero.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuReading {
    /// The tool's index, as the container numbers its GPUs.
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub temperature_c: Option<f64>,
    pub power_w: Option<f64>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub max_sm_clock_mhz: Option<u32>,
    /// NVIDIA's clock-event reasons mask (`clocks_event_reasons.active`).
    pub clock_event_reasons: Option<u64>,
    /// The names of the reasons set in the mask, or of AMD's violations, for readers.
    pub clock_events: Vec<String>,
    /// AMD's `throttle_status` (NVIDIA says the same through the mask).
    pub throttled: Option<bool>,
    pub ecc_uncorrected: Option<u64>,
    pub retired_pages_pending: Option<bool>,
}

/// A compute process on a GPU, as `--query-compute-apps` or `amd-smi process` lists it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuProcess {
    pub pid: u64,
    pub name: String,
    /// NVIDIA names the GPU by UUID, AMD by index: whichever the tool gave.
    pub gpu_uuid: String,
    pub gpu_index: Option<u32>,
    pub used_memory_mib: Option<u64>,
}

/// Why a job stopped before (or while) measuring, through no fault of the submission.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct InfraFailure {
    /// `preflight` or `measurement`.
    pub stage: String,
    /// A short machine-readable cause (`ecc_errors`, `foreign_process`, `gpu_mismatch`, ...).
    pub reason: String,
    /// The sentence said in `error`, and the tool's raw line where its output was unreadable.
    pub detail: String,
    pub readings: Vec<GpuReading>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<GpuProcess>,
}

/// What the pre-flight found, as `result.json`'s `preflight` says it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Preflight {
    /// `passed`, `skipped` or `failed`.
    pub status: String,
    pub detail: String,
    pub readings: Vec<GpuReading>,
}

impl Preflight {
    pub(super) fn cap(&mut self) {
        cap(&mut self.status, caps::SHORT);
        cap(&mut self.detail, caps::TEXT);
        cap_readings(&mut self.readings);
    }
}

/// The GPUs' state around one timed run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Conditions {
    pub before: Vec<GpuReading>,
    pub after: Vec<GpuReading>,
    /// A thermal or power slowdown was active before or after the run.
    pub throttled: bool,
    /// How many times the run was made: a throttled leaderboard run gets a second, after a
    /// cool-down, and these are the last one's conditions.
    pub attempts: u32,
}

/// At most this many GPUs or processes are kept per list: a node has 8 GPUs.
const MAX_ENTRIES: usize = 64;

impl GpuReading {
    pub(super) fn cap(&mut self) {
        cap(&mut self.uuid, caps::SHORT);
        cap(&mut self.name, caps::SHORT);
        self.clock_events.truncate(MAX_ENTRIES);
        for e in &mut self.clock_events {
            cap(e, caps::SHORT);
        }
    }
}

fn cap_readings(readings: &mut Vec<GpuReading>) {
    readings.truncate(MAX_ENTRIES);
    readings.iter_mut().for_each(GpuReading::cap);
}

/// Pre-flight findings that outlast the job: the agent takes itself out of its queue for
/// them. A hot or slowed-down GPU may be the last job's doing, and a throttled measurement
/// the submission's own, so those are retried elsewhere without a pause: a submission must
/// not be able to take agents out of the queue.
const LASTING: &[&str] = &[
    "no_gpu",
    "gpu_missing",
    "gpu_not_given",
    "foreign_process",
    "ecc_errors",
    "retired_pages_pending",
    "max_clock_low",
    "tool_failed",
    "tool_output_unreadable",
    "bad_threshold",
];

/// Whether an infrastructure failure's `reason` is a lasting fault (only pre-flights find
/// those): what the agent's hook paused it for.
pub fn is_lasting(reason: &str) -> bool {
    LASTING.contains(&reason)
}

impl InfraFailure {
    /// Whether the node's fault outlasts the job, so its agent should pause itself.
    pub fn pauses_agent(&self) -> bool {
        self.stage == "preflight" && is_lasting(&self.reason)
    }

    /// The `error` sentence of a job this stopped: the blame where it belongs.
    pub fn sentence(&self) -> String {
        let what = match self.stage.as_str() {
            "preflight" => "The GPU failed its pre-flight check, so nothing of the submission ran",
            _ => "The GPU could not be measured under fair conditions",
        };
        format!(
            "{what} (infrastructure failure, not your code): {}",
            self.detail
        )
    }

    pub(super) fn cap(&mut self) {
        cap(&mut self.stage, caps::SHORT);
        cap(&mut self.reason, caps::SHORT);
        cap(&mut self.detail, caps::TEXT);
        cap_readings(&mut self.readings);
        self.processes.truncate(MAX_ENTRIES);
        for p in &mut self.processes {
            cap(&mut p.name, caps::SHORT);
            cap(&mut p.gpu_uuid, caps::SHORT);
        }
    }
}

impl Conditions {
    pub(super) fn cap(&mut self) {
        cap_readings(&mut self.before);
        cap_readings(&mut self.after);
    }
}

#[cfg(test)]
mod tests {
    use crate::result::{FullResult, InfraFailure};

    #[test]
    fn infra_is_kept_when_present_and_absent_otherwise() {
        let plain = serde_json::to_value(FullResult::default()).unwrap();
        assert!(plain.get("infra").is_none(), "{plain}");
        let failed = FullResult {
            infra: Some(InfraFailure {
                stage: "preflight".into(),
                reason: "ecc_errors".into(),
                detail: "x".repeat(10_000),
                ..Default::default()
            }),
            ..Default::default()
        };
        let bytes = serde_json::to_vec(&failed).unwrap();
        let back = FullResult::parse(&bytes).unwrap();
        let infra = back.infra.unwrap();
        assert_eq!(
            (infra.stage.as_str(), infra.reason.as_str()),
            ("preflight", "ecc_errors")
        );
        assert!(infra.detail.len() <= super::caps::TEXT, "capped");
    }
}
