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
    /// The board's power limit as set, and its default (NVIDIA's `power.limit`,
    /// `power.default_limit`): a kernel held at a limit set below the default is not
    /// measured at its real speed.
    pub power_limit_w: Option<f64>,
    pub default_power_limit_w: Option<f64>,
}

/// NVML's clock-event reasons (`nvmlClocksEventReasons`), bit and name.
const CLOCK_EVENTS: &[(u64, &str)] = &[
    (0x1, "GpuIdle"),
    (0x2, "ApplicationsClocksSetting"),
    (0x4, "SwPowerCap"),
    (0x8, "HwSlowdown"),
    (0x10, "SyncBoost"),
    (0x20, "SwThermalSlowdown"),
    (0x40, "HwThermalSlowdown"),
    (0x80, "HwPowerBrakeSlowdown"),
    (0x100, "DisplayClockSetting"),
];

/// `SwPowerCap`: the board held at its power limit. A kernel that draws the board's full
/// power is capped on every healthy GPU of its type, so this is its real speed: recorded with
/// the run, never a fault.
const POWER_CAP: u64 = 0x4;

/// The reasons that mean the GPU runs below what its kind runs at: heat (`SwThermalSlowdown`,
/// `HwThermalSlowdown`), a hardware slowdown (`HwSlowdown`) or a power brake. An idle GPU
/// (0x1) downclocks by design; application clocks (0x2), sync boost and the display clock
/// are settings; the power cap is the kernel's own speed ([`POWER_CAP`]).
const SLOWDOWNS: u64 = 0x8 | 0x20 | 0x40 | 0x80;

/// AMD's name for its power limit's violation (package power tracking): its power cap.
pub const AMD_POWER_CAP: &str = "PowerViolation";

/// The active slowdowns of a reading ([`SLOWDOWNS`], or AMD's violations but its power
/// limit's). Empty when the GPU runs free, idles, or is only held at its power limit.
fn slowdowns(r: &GpuReading) -> Vec<String> {
    let mut names = match r.clock_event_reasons {
        Some(mask) => clock_event_names(mask & SLOWDOWNS),
        // No mask (AMD): the names are its violations; NVIDIA's names of settings and of the
        // power cap are left out should a reading carry them without the mask.
        None => {
            let not_slowdowns = clock_event_names(!SLOWDOWNS & 0x1ff);
            let mut names = r.clock_events.clone();
            names.retain(|n| !not_slowdowns.contains(n) && n != AMD_POWER_CAP);
            names
        }
    };
    // AMD's throttle status with no violation but the power limit's is the cap, not a fault.
    if r.throttled == Some(true) && names.is_empty() && !power_capped(r) {
        names.push("Throttled".into());
    }
    names
}

/// Whether the board was held at its power limit when read.
fn power_capped(r: &GpuReading) -> bool {
    r.clock_event_reasons.is_some_and(|m| m & POWER_CAP != 0)
        || r.clock_events.iter().any(|n| n == AMD_POWER_CAP)
}

/// The names of the reasons set in `mask`; an unknown bit by its value.
pub fn clock_event_names(mask: u64) -> Vec<String> {
    let known: u64 = CLOCK_EVENTS.iter().map(|(bit, _)| bit).sum();
    let mut names: Vec<String> = CLOCK_EVENTS
        .iter()
        .filter(|(bit, _)| mask & bit != 0)
        .map(|(_, name)| (*name).to_owned())
        .collect();
    let unknown = mask & !known;
    if unknown != 0 {
        names.push(format!("Unknown({unknown:#x})"));
    }
    names
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
    /// A thermal slowdown, a hardware slowdown or a power brake was active before or after
    /// the run: its time is not a fair one.
    pub throttled: bool,
    /// The board was held at its power limit (NVIDIA's `SwPowerCap`, AMD's PPT): a kernel
    /// that draws full power is capped on every healthy GPU of its type, so this is its real
    /// speed, recorded and never a fault.
    pub power_capped: bool,
    /// How many times the run was made: a throttled leaderboard run gets a second, after a
    /// cool-down, and these are the last one's conditions.
    pub attempts: u32,
}

/// A timed run the GPU slowed down on both its measurements on one agent (the second after a
/// cool-down): no time of it is ranked. It showed only after the submission's code ran, and a
/// kernel can heat its own GPU, so it is never the node's fault at first sight: the job is
/// tried once more (the pipeline's one retry for it), and throttled there too it is the
/// submission's outcome.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Throttled {
    /// The run that was slowed down (`leaderboard`).
    pub mode: String,
    /// The slowdowns seen (`SwThermalSlowdown`, `HwSlowdown`, ...).
    pub slowdowns: Vec<String>,
    /// Which try of the job this was (`BUILDKITE_RETRY_COUNT`, 0 on the first).
    pub retry: u32,
    /// The cool-down given between the two measurements, in seconds.
    pub cooldown_secs: u64,
    /// The GPUs' readings after the last measurement.
    pub readings: Vec<GpuReading>,
}

impl Throttled {
    /// The `error` sentence: what happened, that nothing was ranked, and that the code's
    /// results stand.
    pub fn sentence(&self) -> String {
        format!(
            "Not ranked: the GPU slowed down ({}) while the {} run was timed, again after a {} s \
             cool-down. A kernel can heat its own GPU; its results stand, but its time could \
             not be measured fairly",
            self.slowdowns.join(", "),
            self.mode,
            self.cooldown_secs
        )
    }

    pub(super) fn cap(&mut self) {
        cap(&mut self.mode, caps::SHORT);
        self.slowdowns.truncate(MAX_ENTRIES);
        for s in &mut self.slowdowns {
            cap(s, caps::SHORT);
        }
        cap_readings(&mut self.readings);
    }
}

/// At most this many GPUs or processes are kept per list: a node has 8 GPUs.
const MAX_ENTRIES: usize = 64;

impl GpuReading {
    /// The slowdowns active when it was read: heat, a hardware slowdown, a power brake. The
    /// power cap is none of them.
    pub fn slowdowns(&self) -> Vec<String> {
        slowdowns(self)
    }

    /// Whether the board was held at its power limit when it was read.
    pub fn power_capped(&self) -> bool {
        power_capped(self)
    }

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
/// them. A GPU still hot or slowed down after its cool-down may be the last job's doing, so
/// it is retried elsewhere without a pause: a submission must not be able to take agents out
/// of the queue. Nor is a tool missing from the runner's image (`tool_missing`) the agent's
/// fault: every agent would pause, and stay paused after the image is fixed.
const LASTING: &[&str] = &[
    "power_limit_low",
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
    use super::{GpuReading, clock_event_names};
    use crate::result::{FullResult, InfraFailure};

    #[test]
    fn the_power_cap_is_recorded_and_only_heat_brakes_and_hardware_slow_a_gpu() {
        let nvidia = |mask: u64| GpuReading {
            clock_event_reasons: Some(mask),
            clock_events: clock_event_names(mask),
            ..GpuReading::default()
        };
        let amd = |names: &[&str], throttled: bool| GpuReading {
            clock_events: names.iter().map(|n| (*n).to_owned()).collect(),
            throttled: Some(throttled),
            ..GpuReading::default()
        };
        let cases: Vec<(GpuReading, &[&str], bool)> = vec![
            (nvidia(0x1), &[], false),
            (nvidia(0x4), &[], true),
            (nvidia(0x5), &[], true),
            (nvidia(0x8), &["HwSlowdown"], false),
            (nvidia(0x24), &["SwThermalSlowdown"], true),
            (
                nvidia(0xc4),
                &["HwThermalSlowdown", "HwPowerBrakeSlowdown"],
                true,
            ),
            (nvidia(0x113), &[], false),
            (amd(&[], false), &[], false),
            (amd(&["PowerViolation"], true), &[], true),
            (
                amd(&["PowerViolation", "SocketThermalViolation"], true),
                &["SocketThermalViolation"],
                true,
            ),
            (amd(&[], true), &["Throttled"], false),
            (
                amd(&["ProchotViolation"], false),
                &["ProchotViolation"],
                false,
            ),
        ];
        for (reading, want, capped) in cases {
            assert_eq!(reading.slowdowns(), want, "{reading:?}");
            assert_eq!(reading.power_capped(), capped, "{reading:?}");
        }
    }

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
