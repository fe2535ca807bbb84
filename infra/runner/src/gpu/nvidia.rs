//! `nvidia-smi`'s CSV (`--format=csv,noheader,nounits`): one line per GPU or process, values
//! separated by ", ", `[N/A]` where a GPU does not support a field.

use super::{Unreadable, clock_event_names};
use kernelbot_protocol::result::{GpuProcess, GpuReading};

const TOOL: &str = "nvidia-smi";

/// The name a driver gives the clock-event reasons mask. Drivers before 535 know only
/// `clocks_throttle_reasons.*`, and refuse a whole query that names a field they do not know;
/// [`MaskName::older`] is what to ask such a driver instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MaskName {
    /// `clocks_event_reasons.active` (newer drivers).
    Event,
    /// `clocks_throttle_reasons.active` (the same mask, its older name).
    Throttle,
    /// Neither: a driver that knows neither name is still read for everything else.
    Neither,
}

/// The fields of a reading before the mask and after it, in the order [`parse_gpus`] reads.
const FIELDS_BEFORE_MASK: &str =
    "index,uuid,name,temperature.gpu,power.draw,clocks.sm,clocks.mem,clocks.max.sm";
const FIELDS_AFTER_MASK: &str = "ecc.errors.uncorrected.volatile.total,retired_pages.pending,\
power.limit,power.default_limit";

impl MaskName {
    /// The field's name, if the query names one.
    pub(crate) fn field(self) -> Option<&'static str> {
        match self {
            Self::Event => Some("clocks_event_reasons.active"),
            Self::Throttle => Some("clocks_throttle_reasons.active"),
            Self::Neither => None,
        }
    }

    /// The name to ask a driver that refused this one.
    pub(crate) fn older(self) -> Option<Self> {
        match self {
            Self::Event => Some(Self::Throttle),
            Self::Throttle => Some(Self::Neither),
            Self::Neither => None,
        }
    }

    /// The reading's fields, comma-separated, as `--query-gpu=` takes them.
    pub(crate) fn fields(self) -> String {
        match self.field() {
            Some(mask) => format!("{FIELDS_BEFORE_MASK},{mask},{FIELDS_AFTER_MASK}"),
            None => format!("{FIELDS_BEFORE_MASK},{FIELDS_AFTER_MASK}"),
        }
    }
}

/// The fields of one compute process, in the order [`parse_processes`] reads them.
pub(crate) const PROCESS_FIELDS: &str = "pid,gpu_uuid,used_memory";

/// `nvidia-smi`'s arguments for the GPUs' readings, naming the mask as `mask` says.
pub(crate) fn gpu_query(mask: MaskName) -> Vec<String> {
    vec![
        format!("--query-gpu={}", mask.fields()),
        "--format=csv,noheader,nounits".into(),
    ]
}

/// `nvidia-smi`'s arguments for the compute processes.
pub(crate) fn process_query() -> Vec<String> {
    vec![
        format!("--query-compute-apps={PROCESS_FIELDS}"),
        "--format=csv,noheader,nounits".into(),
    ]
}

/// A value the GPU does not support. Older drivers say `[Not Supported]`.
fn unsupported(value: &str) -> bool {
    matches!(value, "[N/A]" | "N/A" | "[Not Supported]")
}

/// One column: `None` when unsupported, else parsed by `parse`; anything else (an
/// `[Unknown Error]`, a word where a number belongs) makes the line unreadable.
fn column<T>(
    line: &str,
    name: &str,
    value: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Option<T>, Unreadable> {
    if unsupported(value) {
        return Ok(None);
    }
    parse(value)
        .map(Some)
        .ok_or_else(|| Unreadable::new(TOOL, format!("{name} is {value:?}"), line))
}

fn hex(value: &str) -> Option<u64> {
    let digits = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))?;
    u64::from_str_radix(digits, 16).ok()
}

fn yes_no(value: &str) -> Option<bool> {
    match value {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

/// The columns of one line, exactly `count` of them.
fn columns(line: &str, count: usize) -> Result<Vec<&str>, Unreadable> {
    let values: Vec<&str> = line.split(',').map(str::trim).collect();
    if values.len() != count {
        let why = format!("{} columns where {count} were asked for", values.len());
        return Err(Unreadable::new(TOOL, why, line));
    }
    Ok(values)
}

/// One GPU's line of the readings' query (its mask named as `mask` says).
fn parse_gpu(line: &str, mask: MaskName) -> Result<GpuReading, Unreadable> {
    let named = mask.field();
    let v = columns(line, if named.is_some() { 13 } else { 12 })?;
    let index = column(line, "index", v[0], |s| s.parse().ok())?
        .ok_or_else(|| Unreadable::new(TOOL, "a GPU without an index", line))?;
    let mhz = |i: usize, name: &str| column(line, name, v[i], |s| s.parse::<u32>().ok());
    let (reasons, after) = match named {
        Some(name) => (column(line, name, v[8], hex)?, 9),
        None => (None, 8),
    };
    Ok(GpuReading {
        index,
        uuid: v[1].to_owned(),
        name: v[2].to_owned(),
        temperature_c: column(line, "temperature.gpu", v[3], |s| s.parse().ok())?,
        power_w: column(line, "power.draw", v[4], |s| s.parse().ok())?,
        sm_clock_mhz: mhz(5, "clocks.sm")?,
        mem_clock_mhz: mhz(6, "clocks.mem")?,
        max_sm_clock_mhz: mhz(7, "clocks.max.sm")?,
        clock_event_reasons: reasons,
        clock_events: reasons.map(clock_event_names).unwrap_or_default(),
        throttled: None,
        ecc_uncorrected: column(line, "ecc.errors.uncorrected", v[after], |s| s.parse().ok())?,
        retired_pages_pending: column(line, "retired_pages.pending", v[after + 1], yes_no)?,
        power_limit_w: column(line, "power.limit", v[after + 2], |s| s.parse().ok())?,
        default_power_limit_w: column(line, "power.default_limit", v[after + 3], |s| {
            s.parse().ok()
        })?,
    })
}

/// Every GPU of the readings' query, one line each (blank lines skipped).
pub(crate) fn parse_gpus(output: &str, mask: MaskName) -> Result<Vec<GpuReading>, Unreadable> {
    output
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| parse_gpu(l, mask))
        .collect()
}

/// Every compute process of the [`PROCESS_FIELDS`] query. `used_memory` is `[N/A]` where
/// the driver cannot see the process's memory (inside some containers).
pub(crate) fn parse_processes(output: &str) -> Result<Vec<GpuProcess>, Unreadable> {
    output
        .lines()
        .map(str::trim)
        // What the human-readable format says instead of nothing: read the same.
        .filter(|l| !l.is_empty() && *l != "No running processes found")
        .map(|line| {
            let v = columns(line, 3)?;
            let pid = column(line, "pid", v[0], |s| s.parse().ok())?
                .ok_or_else(|| Unreadable::new(TOOL, "a process without a pid", line))?;
            Ok(GpuProcess {
                pid,
                name: String::new(),
                gpu_uuid: v[1].to_owned(),
                gpu_index: None,
                used_memory_mib: column(line, "used_memory", v[2], |s| s.parse().ok())?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100_IDLE: &str = "0, GPU-5a3c3b8e-1e4b-2f1d-8c3a-0b9f1c2d3e4f, NVIDIA H100 80GB HBM3, 34, 69.88, 345, 2619, 1980, 0x0000000000000001, 0, No, 700.00, 700.00";

    #[test]
    fn an_idle_h100_reads_in_full() {
        let gpus = parse_gpus(&format!("{H100_IDLE}\n"), MaskName::Event).unwrap();
        assert_eq!(
            gpus,
            [GpuReading {
                index: 0,
                uuid: "GPU-5a3c3b8e-1e4b-2f1d-8c3a-0b9f1c2d3e4f".into(),
                name: "NVIDIA H100 80GB HBM3".into(),
                temperature_c: Some(34.0),
                power_w: Some(69.88),
                sm_clock_mhz: Some(345),
                mem_clock_mhz: Some(2619),
                max_sm_clock_mhz: Some(1980),
                clock_event_reasons: Some(1),
                clock_events: vec!["GpuIdle".into()],
                throttled: None,
                ecc_uncorrected: Some(0),
                retired_pages_pending: Some(false),
                power_limit_w: Some(700.0),
                default_power_limit_w: Some(700.0),
            }]
        );
    }

    #[test]
    fn gpu_lines_read_field_by_field() {
        type Check = fn(&GpuReading) -> bool;
        let cases: &[(&str, Check)] = &[
            // A consumer card: no ECC, no retired pages, no power reading.
            (
                "1, GPU-1, NVIDIA GeForce RTX 4090, 40, [N/A], 210, 405, 3120, 0x0000000000000000, [N/A], [N/A], 700.00, 700.00",
                |g| {
                    g.index == 1
                        && g.power_w.is_none()
                        && g.ecc_uncorrected.is_none()
                        && g.retired_pages_pending.is_none()
                },
            ),
            (
                "0, GPU-2, NVIDIA A100-SXM4-80GB, 88, 400.12, 1410, 1593, 1410, 0x0000000000000060, 2, Yes, 700.00, 700.00",
                |g| {
                    g.clock_events == ["SwThermalSlowdown", "HwThermalSlowdown"]
                        && g.ecc_uncorrected == Some(2)
                        && g.retired_pages_pending == Some(true)
                },
            ),
            (
                "3, GPU-3, Tesla V100, 50, 60.5, 1380, 877, 1530, [Not Supported], 0, No, 700.00, 700.00",
                |g| g.clock_event_reasons.is_none() && g.clock_events.is_empty(),
            ),
        ];
        for (line, check) in cases {
            let gpus = parse_gpus(line, MaskName::Event).unwrap();
            assert!(gpus.len() == 1 && check(&gpus[0]), "{line}: {gpus:?}");
        }
        let eight: String = (0..8)
            .map(|i| format!("{}\n", H100_IDLE.replacen('0', &i.to_string(), 1)))
            .collect();
        let indices: Vec<u32> = parse_gpus(&eight, MaskName::Event)
            .unwrap()
            .iter()
            .map(|g| g.index)
            .collect();
        assert_eq!(indices, [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(parse_gpus("\n", MaskName::Event).unwrap(), []);
    }

    #[test]
    fn each_name_of_the_mask_reads_the_same_gpu() {
        let with_mask = "0, GPU-1, NVIDIA A100-SXM4-80GB, 88, 400.12, 1410, 1593, 1410, 0x0000000000000024, 0, No, 700.00, 700.00";
        let without =
            "0, GPU-1, NVIDIA A100-SXM4-80GB, 88, 400.12, 1410, 1593, 1410, 0, No, 700.00, 700.00";
        let event = parse_gpus(with_mask, MaskName::Event).unwrap();
        assert_eq!(event[0].clock_events, ["SwPowerCap", "SwThermalSlowdown"]);
        assert_eq!(parse_gpus(with_mask, MaskName::Throttle).unwrap(), event);
        let neither = parse_gpus(without, MaskName::Neither).unwrap();
        assert_eq!(
            (
                neither[0].clock_event_reasons,
                neither[0].clock_events.len()
            ),
            (None, 0)
        );
        assert_eq!(
            (neither[0].temperature_c, neither[0].ecc_uncorrected),
            (Some(88.0), Some(0))
        );
        // Each older query names the older field, then none; the rest is the same list.
        let queries: Vec<String> = [MaskName::Event, MaskName::Throttle, MaskName::Neither]
            .iter()
            .map(|m| m.fields())
            .collect();
        assert!(queries[0].contains(",clocks_event_reasons.active,"));
        assert_eq!(
            queries[0].replace("clocks_event_reasons", "clocks_throttle_reasons"),
            queries[1]
        );
        assert_eq!(
            queries[1].replace(",clocks_throttle_reasons.active", ""),
            queries[2]
        );
        assert_eq!(MaskName::Event.older(), Some(MaskName::Throttle));
        assert_eq!(MaskName::Neither.older(), None);
        // A line of the other shape is unreadable, not misread.
        assert!(parse_gpus(without, MaskName::Event).is_err());
    }

    /// `setup-node.sh` runs the pre-flight's query on each GPU when a node is set up: the
    /// same fields, so a driver that refuses them is found then, not by the first job.
    #[test]
    fn node_setup_asks_the_pre_flight_s_fields() {
        let script = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../buildkite/setup-node.sh"
        ))
        .unwrap();
        let line = format!("NVIDIA_GPU_FIELDS=\"{}\"", MaskName::Event.fields());
        assert!(
            script.lines().any(|l| l.trim() == line),
            "setup-node.sh has no line {line}"
        );
    }

    #[test]
    fn unreadable_gpu_lines_are_errors_with_the_line() {
        let cases: &[(&str, &str)] = &[
            ("NVIDIA H100 80GB HBM3", "1 columns where 13 were asked for"),
            (
                "0, GPU-1, H100, 34, 69.88, 345, 2619, 1980, 0x1, 0, 700.00, 700.00",
                "12 columns",
            ),
            (
                "0, GPU-1, H100, hot, 69.88, 345, 2619, 1980, 0x1, 0, No, 700.00, 700.00",
                "temperature.gpu is \"hot\"",
            ),
            (
                "0, GPU-1, H100, 34, 69.88, 345, 2619, 1980, 4, 0, No, 700.00, 700.00",
                "clocks_event_reasons.active is \"4\"",
            ),
            (
                "0, GPU-1, H100, 34, 69.88, 345, 2619, 1980, 0x1, [Unknown Error], No, 700.00, 700.00",
                "ecc.errors.uncorrected is",
            ),
            (
                "0, GPU-1, H100, 34, 69.88, 345, 2619, 1980, 0x1, 0, Maybe, 700.00, 700.00",
                "retired_pages.pending is",
            ),
            (
                "[N/A], GPU-1, H100, 34, 69.88, 345, 2619, 1980, 0x1, 0, No, 700.00, 700.00",
                "without an index",
            ),
            (
                "Unable to determine the device handle for GPU0000:41:00.0: Unknown Error",
                "columns",
            ),
        ];
        for (line, why) in cases {
            let err = parse_gpus(&format!("{H100_IDLE}\n{line}\n"), MaskName::Event).unwrap_err();
            assert!(err.why.contains(why), "{line}: {err}");
            assert_eq!(err.line, *line);
        }
    }

    #[test]
    fn compute_processes_read_per_line() {
        let out = "12345, GPU-5a3c3b8e-1e4b-2f1d-8c3a-0b9f1c2d3e4f, 1024\n678, GPU-2, [N/A]\n";
        let procs = parse_processes(out).unwrap();
        assert_eq!(procs.len(), 2);
        assert_eq!(
            (procs[0].pid, procs[0].used_memory_mib),
            (12345, Some(1024))
        );
        assert_eq!(
            procs[0].gpu_uuid,
            "GPU-5a3c3b8e-1e4b-2f1d-8c3a-0b9f1c2d3e4f"
        );
        assert_eq!((procs[1].pid, procs[1].used_memory_mib), (678, None));
        for empty in ["", "\n", "No running processes found\n"] {
            assert_eq!(parse_processes(empty).unwrap(), [], "{empty:?}");
        }
        for bad in ["12345, GPU-1", "abc, GPU-1, 10", "1, GPU-1, lots"] {
            let err = parse_processes(bad).unwrap_err();
            assert_eq!(err.line, bad);
        }
    }
}
