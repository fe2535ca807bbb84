//! The pre-flight as the runner runs it: find the vendor's tool, read the GPUs and their
//! processes, wait out a GPU still hot from the previous job, and decide. What it found goes
//! into `result.json` either way.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::preflight::{self, Refusal, Thresholds};
use super::probe::{self, Reader};
use super::watch::{DEFAULT_COOLDOWN, Watch};
use kernelbot_protocol::result::{GpuProcess, GpuReading, InfraFailure};

/// What the pre-flight did, as `result.json`'s `preflight` says it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Report {
    /// `passed`, `skipped` or `failed`.
    pub(crate) status: &'static str,
    /// Why it was skipped, what it waited for, what the driver could not say; empty when it
    /// passed at once on a current driver.
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
const RETRY_VAR: &str = "BUILDKITE_RETRY_COUNT";

/// The cool-down: before a throttled leaderboard run's second try, and the most the
/// pre-flight waits for a GPU still hot or slowed down from the previous job.
fn cooldown(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Duration, String> {
    match lookup(COOLDOWN_VAR).filter(|v| !v.trim().is_empty()) {
        None => Ok(DEFAULT_COOLDOWN),
        Some(v) => v
            .trim()
            .parse()
            .map(Duration::from_secs)
            .map_err(|_| format!("{COOLDOWN_VAR}={v:?} is not a whole number of seconds")),
    }
}

/// Which try of the job this is (Buildkite's `BUILDKITE_RETRY_COUNT`, 0 on the first); a
/// value that is not a count is taken as the first try.
pub(crate) fn retry_count(lookup: &dyn Fn(&str) -> Option<String>) -> u32 {
    lookup(RETRY_VAR)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// No vendor tool on this machine: a CPU-only one has nothing to check, but one that was
/// given GPUs must not run unchecked.
fn without_tool(lookup: &dyn Fn(&str) -> Option<String>) -> Gate {
    match probe::assigned(lookup) {
        Some((var, value, vendor)) => stop(
            "tool_missing",
            format!(
                "{var}={value} gives this agent GPUs, but {} is not on PATH in the runner's \
                 image, so they cannot be checked",
                vendor.tool()
            ),
            Vec::new(),
        ),
        None => Gate::Go(
            Report {
                status: "skipped",
                detail: "no nvidia-smi or amd-smi on PATH and no GPU given to this agent: \
                         not a GPU node, nothing to check"
                    .into(),
                readings: Vec::new(),
            },
            None,
        ),
    }
}

/// Runs the pre-flight, unless this machine has no GPU to check.
pub(crate) fn preflight(lookup: &dyn Fn(&str) -> Option<String>) -> Gate {
    let Some((vendor, tool)) = probe::vendor(lookup) else {
        return without_tool(lookup);
    };
    let (limits, cooldown) =
        match Thresholds::from_env(lookup).and_then(|l| Ok((l, cooldown(lookup)?))) {
            Ok(read) => read,
            Err(e) => return stop("bad_threshold", e, Vec::new()),
        };
    let (reader, readings) = match Reader::open(vendor, tool) {
        Ok(opened) => opened,
        Err(e) => return stop(e.reason(), e.to_string(), Vec::new()),
    };
    let processes = match reader.processes() {
        Ok(p) => p,
        Err(e) => return stop(e.reason(), e.to_string(), readings),
    };
    let given = probe::given_devices(vendor, lookup);
    let checked = Checked {
        reader: &reader,
        given: given.as_deref(),
        processes: &processes,
        limits: &limits,
    };
    match checked.decide_within(cooldown, readings) {
        (Ok(()), readings, waited) => {
            let report = Report {
                status: "passed",
                detail: passed_detail(waited, reader.note()),
                readings,
            };
            let watch = Watch {
                reader,
                cooldown,
                retry: retry_count(lookup),
            };
            Gate::Go(report, Some(watch))
        }
        (Err(refusal), readings, waited) => Gate::Stop(InfraFailure {
            stage: "preflight".into(),
            reason: refusal.reason.into(),
            detail: refused_detail(refusal, waited, cooldown),
            readings,
            processes,
        }),
    }
}

/// What the pre-flight checks the GPUs' readings against.
struct Checked<'a> {
    reader: &'a Reader,
    given: Option<&'a [String]>,
    processes: &'a [GpuProcess],
    limits: &'a Thresholds,
}

impl Checked<'_> {
    /// The decision on `readings`; a GPU still hot or slowed down is read again until it
    /// passes or the cool-down is over. The decision, the last readings and the time waited
    /// (zero when it was decided on the first reading).
    fn decide_within(
        &self,
        cooldown: Duration,
        mut readings: Vec<GpuReading>,
    ) -> (Result<(), Refusal>, Vec<GpuReading>, Duration) {
        let start = Instant::now();
        let mut waited = Duration::ZERO;
        loop {
            let decision = preflight::decide(self.given, &readings, self.processes, self.limits);
            let wait = match &decision {
                Err(refusal) => {
                    preflight::wait_before_reading_again(refusal, start.elapsed(), cooldown)
                }
                Ok(()) => None,
            };
            let Some(wait) = wait else {
                return (decision, readings, waited);
            };
            std::thread::sleep(wait);
            waited = start.elapsed();
            match self.reader.readings() {
                Ok(again) => readings = again,
                Err(e) => {
                    let refusal = Refusal {
                        reason: e.reason(),
                        message: e.to_string(),
                    };
                    return (Err(refusal), readings, waited);
                }
            }
        }
    }
}

/// The passed report's detail: the cool-down it waited, and what the driver cannot say.
fn passed_detail(waited: Duration, note: Option<String>) -> String {
    let mut parts = Vec::new();
    if !waited.is_zero() {
        parts.push(format!(
            "waited {} s for the GPU to cool down from the previous job",
            waited.as_secs_f64().round()
        ));
    }
    parts.extend(note);
    parts.join("; ")
}

/// A refusal's detail, saying that the cool-down was given to a GPU that might have cooled
/// (a tool that failed while it was read again says only that).
fn refused_detail(refusal: Refusal, waited: Duration, cooldown: Duration) -> String {
    if waited.is_zero() || !preflight::may_pass(refusal.reason) {
        refusal.message
    } else {
        format!(
            "{}, still after a {} s cool-down",
            refusal.message,
            cooldown.as_secs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_count_is_buildkites_or_the_first_try() {
        let cases = [
            (None, 0),
            (Some("0"), 0),
            (Some("1"), 1),
            (Some(" 2 "), 2),
            (Some("x"), 0),
        ];
        for (value, want) in cases {
            let lookup = |k: &str| (k == RETRY_VAR).then(|| value.map(str::to_owned)).flatten();
            assert_eq!(retry_count(&lookup), want, "{value:?}");
        }
    }

    #[test]
    fn details_say_what_was_waited_for_and_what_the_driver_cannot_tell() {
        let s = Duration::from_secs;
        assert_eq!(passed_detail(s(0), None), "");
        assert_eq!(
            passed_detail(s(4), Some("old driver".into())),
            "waited 4 s for the GPU to cool down from the previous job; old driver"
        );
        let refusal = |reason, message: &str| Refusal {
            reason,
            message: message.into(),
        };
        let hot = "GPU 0 is at 90 °C";
        assert_eq!(refused_detail(refusal("too_hot", hot), s(0), s(30)), hot);
        assert_eq!(
            refused_detail(refusal("too_hot", hot), s(31), s(30)),
            "GPU 0 is at 90 °C, still after a 30 s cool-down"
        );
        // The tool failed while the GPU was read again: that, not the cool-down, is why.
        assert_eq!(
            refused_detail(refusal("tool_failed", "nvidia-smi hung"), s(6), s(30)),
            "nvidia-smi hung"
        );
    }

    #[test]
    fn gpus_given_without_a_tool_to_read_them_stop_the_job() {
        type Vars = &'static [(&'static str, &'static str)];
        let cases: &[(Vars, Option<&str>)] = &[
            (&[("PATH", "/nowhere")], None),
            (
                &[("PATH", "/nowhere"), ("CUDA_VISIBLE_DEVICES", "0")],
                Some("nvidia-smi"),
            ),
            (
                &[("PATH", "/nowhere"), ("ROCR_VISIBLE_DEVICES", "0,1")],
                Some("amd-smi"),
            ),
            (&[("PATH", "/nowhere"), ("CUDA_VISIBLE_DEVICES", "")], None),
        ];
        for (vars, missing) in cases {
            let lookup = |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            };
            match (preflight(&lookup), missing) {
                (Gate::Go(report, None), None) => assert_eq!(report.status, "skipped"),
                (Gate::Stop(infra), Some(tool)) => {
                    assert_eq!(infra.reason, "tool_missing");
                    assert!(infra.detail.contains(tool), "{}", infra.detail);
                    assert!(
                        !kernelbot_protocol::result::health::is_lasting(&infra.reason),
                        "the image's fault, not the agent's: no pause"
                    );
                }
                _ => panic!("{vars:?}: not as expected"),
            }
        }
    }
}
