//! The pre-flight decision, pure: given the GPUs the agent was given, the tools' readings and
//! compute processes, and the thresholds, may a submission run on these GPUs?

use std::time::Duration;

use kernelbot_protocol::result::{GpuProcess, GpuReading};

/// Above this temperature (°C) a GPU is not handed a submission: it would throttle within
/// seconds of load. `KERNELBOT_PREFLIGHT_MAX_TEMP_C` overrides it.
pub(crate) const DEFAULT_MAX_TEMP_C: f64 = 85.0;
/// A GPU whose maximum SM clock reads below this (MHz) is misconfigured: every data-centre
/// GPU's is above 1 GHz. Only the maximum is checked, never the current clock, which an
/// idle GPU lowers by design. `KERNELBOT_PREFLIGHT_MIN_MAX_SM_CLOCK_MHZ` overrides it.
pub(crate) const DEFAULT_MIN_MAX_SM_CLOCK_MHZ: u32 = 500;

/// The least share of its default power limit a GPU may be set to: the power cap is the
/// kernel's real speed only at the board's own limit (a vendor may round it a little).
const MIN_POWER_LIMIT_SHARE: f64 = 0.95;

const MAX_TEMP_VAR: &str = "KERNELBOT_PREFLIGHT_MAX_TEMP_C";
const MIN_MAX_SM_CLOCK_VAR: &str = "KERNELBOT_PREFLIGHT_MIN_MAX_SM_CLOCK_MHZ";

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Thresholds {
    pub(crate) max_temp_c: f64,
    pub(crate) min_max_sm_clock_mhz: u32,
}

impl Thresholds {
    /// The thresholds from the environment; a value that is not a number names its variable.
    pub(crate) fn from_env(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, String> {
        fn number<T: std::str::FromStr>(
            lookup: &dyn Fn(&str) -> Option<String>,
            name: &str,
            default: T,
        ) -> Result<T, String> {
            match lookup(name).filter(|v| !v.trim().is_empty()) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse()
                    .map_err(|_| format!("{name}={v:?} is not a number")),
            }
        }
        Ok(Self {
            max_temp_c: number(lookup, MAX_TEMP_VAR, DEFAULT_MAX_TEMP_C)?,
            min_max_sm_clock_mhz: number(
                lookup,
                MIN_MAX_SM_CLOCK_VAR,
                DEFAULT_MIN_MAX_SM_CLOCK_MHZ,
            )?,
        })
    }
}

/// Why the GPUs may not take a submission: a short cause and a sentence.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Refusal {
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

fn refuse(reason: &'static str, message: String) -> Result<(), Refusal> {
    Err(Refusal { reason, message })
}

/// Does the `given` device (a `CUDA_VISIBLE_DEVICES` entry: an index or a UUID, CUDA taking
/// a UUID's unique prefix) name this GPU?
fn names(given: &str, gpu: &GpuReading) -> bool {
    given == gpu.index.to_string()
        || (given.starts_with("GPU-") && !gpu.uuid.is_empty() && gpu.uuid.starts_with(given))
        || (!gpu.uuid.is_empty() && given == gpu.uuid)
}

fn listed(gpus: &[GpuReading]) -> String {
    let all: Vec<String> = gpus.iter().map(|g| g.index.to_string()).collect();
    if all.is_empty() {
        "none".into()
    } else {
        all.join(", ")
    }
}

/// Exactly the given devices are visible. `None`: nothing says which were given (a local
/// run), so every visible GPU is the agent's.
fn check_visible(given: Option<&[String]>, gpus: &[GpuReading]) -> Result<(), Refusal> {
    if gpus.is_empty() {
        return refuse("no_gpu", "no GPU is visible to the runner".into());
    }
    let Some(given) = given else { return Ok(()) };
    if let Some(missing) = given.iter().find(|d| !gpus.iter().any(|g| names(d, g))) {
        let why = format!(
            "GPU {missing} was given to this agent but is not visible (visible: {})",
            listed(gpus)
        );
        return refuse("gpu_missing", why);
    }
    if let Some(extra) = gpus.iter().find(|g| !given.iter().any(|d| names(d, g))) {
        let why = format!(
            "GPU {} is visible but was not given to this agent (given: {})",
            extra.index,
            given.join(", ")
        );
        return refuse("gpu_not_given", why);
    }
    Ok(())
}

/// No compute process is on the agent's GPUs: nothing of the submission runs yet.
fn check_processes(gpus: &[GpuReading], processes: &[GpuProcess]) -> Result<(), Refusal> {
    for p in processes {
        let on = gpus.iter().find(|g| {
            (!p.gpu_uuid.is_empty() && p.gpu_uuid == g.uuid) || p.gpu_index == Some(g.index)
        });
        if let Some(g) = on {
            let memory = p
                .used_memory_mib
                .map(|m| format!(", {m} MiB"))
                .unwrap_or_default();
            let why = format!(
                "another process (pid {}{memory}) is using GPU {}",
                p.pid, g.index
            );
            return refuse("foreign_process", why);
        }
    }
    Ok(())
}

/// One GPU's own health: memory errors, temperature, clocks.
fn check_gpu(g: &GpuReading, limits: &Thresholds) -> Result<(), Refusal> {
    let i = g.index;
    if let Some(n) = g.ecc_uncorrected.filter(|n| *n > 0) {
        return refuse(
            "ecc_errors",
            format!("GPU {i} has {n} uncorrected ECC errors"),
        );
    }
    if g.retired_pages_pending == Some(true) {
        return refuse(
            "retired_pages_pending",
            format!("GPU {i} has memory pages waiting to be retired (it needs a reset)"),
        );
    }
    if let Some(t) = g.temperature_c.filter(|t| *t >= limits.max_temp_c) {
        return refuse(
            "too_hot",
            format!(
                "GPU {i} is at {t} °C, at or above the limit of {} °C",
                limits.max_temp_c
            ),
        );
    }
    if let Some(m) = g
        .max_sm_clock_mhz
        .filter(|m| *m < limits.min_max_sm_clock_mhz)
    {
        let why = format!(
            "GPU {i}'s maximum SM clock reads {m} MHz, below {} MHz",
            limits.min_max_sm_clock_mhz
        );
        return refuse("max_clock_low", why);
    }
    if let (Some(limit), Some(default)) = (g.power_limit_w, g.default_power_limit_w)
        && limit < default * MIN_POWER_LIMIT_SHARE
    {
        let why = format!(
            "GPU {i}'s power limit is set to {limit:.0} W, below its default of {default:.0} W: \
             every kernel would be capped below its real speed"
        );
        return refuse("power_limit_low", why);
    }
    let active = g.slowdowns();
    if !active.is_empty() {
        return refuse(
            "clock_slowdown",
            format!("GPU {i} is slowed down: {}", active.join(", ")),
        );
    }
    Ok(())
}

/// How often a GPU that may cool is read again.
pub(crate) const COOLDOWN_POLL: Duration = Duration::from_secs(2);

/// How long to wait before reading the GPUs again after `refusal`, `waited` into a cool-down
/// of `cooldown`: a GPU still hot or slowed down from the previous job may pass by itself, so
/// it is re-read every [`COOLDOWN_POLL`] until the cool-down is over (the last read at its
/// end); anything else is refused at once.
pub(crate) fn wait_before_reading_again(
    refusal: &Refusal,
    waited: Duration,
    cooldown: Duration,
) -> Option<Duration> {
    let left = cooldown.saturating_sub(waited);
    (may_pass(refusal.reason) && !left.is_zero()).then(|| left.min(COOLDOWN_POLL))
}

/// A refusal that may pass by itself: a GPU still hot or slowed down from the previous job.
pub(crate) fn may_pass(reason: &str) -> bool {
    matches!(reason, "too_hot" | "clock_slowdown")
}

/// The whole pre-flight: the visible GPUs are exactly the given ones, none has a compute
/// process on it, and each is healthy. The first refusal found, in that order.
pub(crate) fn decide(
    given: Option<&[String]>,
    gpus: &[GpuReading],
    processes: &[GpuProcess],
    limits: &Thresholds,
) -> Result<(), Refusal> {
    check_visible(given, gpus)?;
    check_processes(gpus, processes)?;
    gpus.iter().try_for_each(|g| check_gpu(g, limits))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100(index: u32) -> GpuReading {
        GpuReading {
            index,
            uuid: format!("GPU-{index}aaa-bbbb"),
            name: "NVIDIA H100 80GB HBM3".into(),
            temperature_c: Some(34.0),
            power_w: Some(69.9),
            sm_clock_mhz: Some(345),
            mem_clock_mhz: Some(2619),
            max_sm_clock_mhz: Some(1980),
            clock_event_reasons: Some(0x1),
            clock_events: vec!["GpuIdle".into()],
            throttled: None,
            ecc_uncorrected: Some(0),
            retired_pages_pending: Some(false),
            power_limit_w: Some(700.0),
            default_power_limit_w: Some(700.0),
        }
    }

    fn limits() -> Thresholds {
        Thresholds {
            max_temp_c: 85.0,
            min_max_sm_clock_mhz: 500,
        }
    }

    fn given(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn healthy_gpus_pass_whatever_names_them() {
        let two = [h100(0), h100(1)];
        let cases: Vec<(Option<Vec<String>>, &[GpuReading])> = vec![
            (Some(given(&["0"])), &two[..1]),
            (Some(given(&["0", "1"])), &two),
            (Some(given(&["GPU-1aaa", "GPU-0aaa-bbbb"])), &two),
            (None, &two),
        ];
        for (given, gpus) in cases {
            assert_eq!(
                decide(given.as_deref(), gpus, &[], &limits()),
                Ok(()),
                "{given:?}"
            );
        }
    }

    #[test]
    fn each_fault_is_refused_with_its_reason() {
        let with = |f: fn(&mut GpuReading)| {
            let mut g = h100(0);
            f(&mut g);
            vec![g]
        };
        let cases: Vec<(&str, Vec<GpuReading>, &str)> = vec![
            ("no_gpu", vec![], "no GPU is visible"),
            (
                "ecc_errors",
                with(|g| g.ecc_uncorrected = Some(2)),
                "GPU 0 has 2 uncorrected ECC errors",
            ),
            (
                "retired_pages_pending",
                with(|g| g.retired_pages_pending = Some(true)),
                "retired",
            ),
            ("too_hot", with(|g| g.temperature_c = Some(85.0)), "85 °C"),
            (
                "max_clock_low",
                with(|g| g.max_sm_clock_mhz = Some(300)),
                "300 MHz",
            ),
            (
                "power_limit_low",
                with(|g| (g.power_limit_w, g.default_power_limit_w) = (Some(500.0), Some(700.0))),
                "set to 500 W, below its default of 700 W",
            ),
            (
                "clock_slowdown",
                with(|g| g.clock_event_reasons = Some(0x21)),
                "SwThermalSlowdown",
            ),
            (
                "clock_slowdown",
                with(|g| g.clock_event_reasons = Some(0x80)),
                "HwPowerBrakeSlowdown",
            ),
            (
                "clock_slowdown",
                with(|g| {
                    g.clock_event_reasons = None;
                    g.throttled = Some(true);
                }),
                "Throttled",
            ),
        ];
        for (reason, gpus, says) in cases {
            let refusal = decide(Some(&given(&["0"])), &gpus, &[], &limits()).unwrap_err();
            assert_eq!(refusal.reason, reason, "{refusal:?}");
            assert!(refusal.message.contains(says), "{refusal:?}");
        }
    }

    #[test]
    fn a_power_limit_at_its_default_passes() {
        for (limit, default) in [
            (Some(700.0), Some(700.0)),
            (Some(680.0), Some(700.0)),
            (Some(750.0), Some(700.0)),
            (None, Some(700.0)),
            (Some(100.0), None),
        ] {
            let mut g = h100(0);
            (g.power_limit_w, g.default_power_limit_w) = (limit, default);
            assert_eq!(
                decide(None, &[g], &[], &limits()),
                Ok(()),
                "{limit:?} {default:?}"
            );
        }
    }

    #[test]
    fn settings_idling_and_the_power_cap_are_not_slowdowns() {
        for mask in [0x0, 0x1, 0x2, 0x4, 0x10, 0x100, 0x113, 0x117] {
            let mut g = h100(0);
            g.clock_event_reasons = Some(mask);
            assert_eq!(decide(None, &[g], &[], &limits()), Ok(()), "{mask:#x}");
        }
        let mut unknown = h100(0);
        (
            unknown.temperature_c,
            unknown.ecc_uncorrected,
            unknown.max_sm_clock_mhz,
        ) = (None, None, None);
        unknown.clock_event_reasons = None;
        assert_eq!(
            decide(None, &[unknown], &[], &limits()),
            Ok(()),
            "[N/A] is not a fault"
        );
    }

    #[test]
    fn the_visible_gpus_are_exactly_the_given_ones() {
        let cases: Vec<(&[&str], Vec<GpuReading>, &str, &str)> = vec![
            (
                &["0", "1"],
                vec![h100(0)],
                "gpu_missing",
                "GPU 1 was given to this agent but is not visible (visible: 0)",
            ),
            (
                &["0"],
                vec![h100(0), h100(1)],
                "gpu_not_given",
                "GPU 1 is visible but was not given",
            ),
            (&[], vec![h100(0)], "gpu_not_given", "GPU 0 is visible"),
            (&["GPU-9"], vec![h100(0)], "gpu_missing", "GPU GPU-9"),
        ];
        for (list, gpus, reason, says) in cases {
            let refusal = decide(Some(&given(list)), &gpus, &[], &limits()).unwrap_err();
            assert_eq!(refusal.reason, reason, "{list:?}");
            assert!(refusal.message.contains(says), "{refusal:?}");
        }
    }

    #[test]
    fn a_process_on_the_agents_gpus_is_refused_and_elsewhere_ignored() {
        let by_uuid = GpuProcess {
            pid: 77,
            gpu_uuid: "GPU-1aaa-bbbb".into(),
            used_memory_mib: Some(512),
            ..Default::default()
        };
        let by_index = GpuProcess {
            pid: 78,
            gpu_index: Some(0),
            ..Default::default()
        };
        let elsewhere = GpuProcess {
            pid: 79,
            gpu_uuid: "GPU-7zzz".into(),
            ..Default::default()
        };
        let gpus = [h100(0), h100(1)];
        let refusal = decide(None, &gpus, &[elsewhere.clone(), by_uuid], &limits()).unwrap_err();
        assert_eq!(
            (refusal.reason, refusal.message.as_str()),
            (
                "foreign_process",
                "another process (pid 77, 512 MiB) is using GPU 1"
            )
        );
        let refusal = decide(None, &gpus, &[by_index], &limits()).unwrap_err();
        assert!(refusal.message.contains("pid 78") && refusal.message.contains("GPU 0"));
        assert_eq!(decide(None, &gpus, &[elsewhere], &limits()), Ok(()));
    }

    #[test]
    fn only_heat_and_slowdowns_are_waited_out_and_only_for_the_cool_down() {
        let refusal = |reason| Refusal {
            reason,
            message: String::new(),
        };
        let s = Duration::from_secs;
        let cases = [
            ("too_hot", s(0), s(30), Some(s(2))),
            ("clock_slowdown", s(29), s(30), Some(s(1))),
            ("clock_slowdown", s(30), s(30), None),
            ("too_hot", s(31), s(30), None),
            ("too_hot", s(0), s(0), None),
            ("ecc_errors", s(0), s(30), None),
            ("foreign_process", s(0), s(30), None),
            ("gpu_missing", s(0), s(30), None),
        ];
        for (reason, waited, cooldown, want) in cases {
            assert_eq!(
                wait_before_reading_again(&refusal(reason), waited, cooldown),
                want,
                "{reason} {waited:?} {cooldown:?}"
            );
        }
    }

    #[test]
    fn thresholds_come_from_the_environment_or_their_defaults() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(Thresholds::from_env(&env(&[])), Ok(limits()));
        let set = Thresholds::from_env(&env(&[
            ("KERNELBOT_PREFLIGHT_MAX_TEMP_C", "70.5"),
            ("KERNELBOT_PREFLIGHT_MIN_MAX_SM_CLOCK_MHZ", " 1000 "),
        ]));
        assert_eq!(
            set,
            Ok(Thresholds {
                max_temp_c: 70.5,
                min_max_sm_clock_mhz: 1000
            })
        );
        let bad =
            Thresholds::from_env(&env(&[("KERNELBOT_PREFLIGHT_MAX_TEMP_C", "hot")])).unwrap_err();
        assert!(bad.contains("KERNELBOT_PREFLIGHT_MAX_TEMP_C"), "{bad}");
    }
}
