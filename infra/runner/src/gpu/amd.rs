//! `amd-smi`'s JSON (ROCm 6 and later): `amd-smi metric --json` and `amd-smi process --json`.
//!
//! The shapes follow amd-smi's own CLI (amdsmi_cli, `metric_gpu` and `process`): a list with
//! one object per GPU, `{"gpu": <index>, ...}`, newer releases wrapping that list as
//! `{"gpu_data": [...]}`. A measured value is `{"value": <n>, "unit": "<u>"}`, an unsupported
//! one the string `"N/A"`. Of the metric groups the runner reads `temperature` (`edge`, else
//! `hotspot` where the edge sensor reads nothing, as on MI300), `power.socket_power`,
//! `power.throttle_status` (`THROTTLED`/`UNTHROTTLED`), `clock.gfx_0` (`clk`, `max_clk`),
//! `clock.mem_0.clk`, `ecc.total_uncorrectable_count`, and the `throttle` group's
//! `*_violation_status`. amd-smi has no pending-retirement flag in `metric` (bad pages are
//! their own command): `retired_pages_pending` stays unknown.

use serde_json::Value;

use super::Unreadable;
use kernelbot_protocol::result::{GpuProcess, GpuReading};

const TOOL: &str = "amd-smi";

/// The violations of amd-smi's `throttle` group that hold the clocks down.
const VIOLATIONS: &[(&str, &str)] = &[
    ("prochot_violation_status", "ProchotViolation"),
    ("ppt_violation_status", super::AMD_POWER_CAP),
    ("socket_thermal_violation_status", "SocketThermalViolation"),
    ("vr_thermal_violation_status", "VrThermalViolation"),
    ("hbm_thermal_violation_status", "HbmThermalViolation"),
];

/// `amd-smi`'s arguments for the GPUs' readings.
pub(crate) fn metric_query() -> Vec<String> {
    vec!["metric".into(), "--json".into()]
}

/// `amd-smi`'s arguments for the processes.
pub(crate) fn process_query() -> Vec<String> {
    vec!["process".into(), "--json".into()]
}

/// The per-GPU objects of a document.
fn gpu_entries(output: &str) -> Result<Vec<Value>, Unreadable> {
    let doc: Value = serde_json::from_str(output)
        .map_err(|e| Unreadable::new(TOOL, format!("not JSON: {e}"), output.trim()))?;
    let list = match doc {
        Value::Array(list) => list,
        Value::Object(mut o) if o.get("gpu_data").is_some_and(Value::is_array) => {
            match o.remove("gpu_data") {
                Some(Value::Array(list)) => list,
                _ => Vec::new(),
            }
        }
        other => {
            let why = "neither a list of GPUs nor {\"gpu_data\": [...]}";
            return Err(Unreadable::new(TOOL, why, &other.to_string()));
        }
    };
    Ok(list)
}

/// A number, `{"value": <number>, ...}`, or `"N/A"` (`None`); anything else is an error.
fn number(entry: &Value, path: &[&str]) -> Result<Option<f64>, Unreadable> {
    let mut v = entry;
    for key in path {
        match v.get(key) {
            Some(next) => v = next,
            // A group left out (an older release, a metric not asked for): unknown.
            None => return Ok(None),
        }
    }
    let v = v.get("value").unwrap_or(v);
    match v {
        Value::Number(n) => Ok(n.as_f64()),
        Value::String(s) if s == "N/A" => Ok(None),
        Value::Null => Ok(None),
        other => {
            let why = format!("{} is {other}", path.join("."));
            Err(Unreadable::new(TOOL, why, &entry.to_string()))
        }
    }
}

fn index(entry: &Value) -> Result<u32, Unreadable> {
    entry
        .get("gpu")
        .and_then(Value::as_u64)
        .and_then(|i| u32::try_from(i).ok())
        .ok_or_else(|| Unreadable::new(TOOL, "a GPU without an index", &entry.to_string()))
}

/// `"ACTIVE"`/`true` is active; `"NOT ACTIVE"`, `false`, `"N/A"` or nothing is not.
fn active(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s.eq_ignore_ascii_case("active"),
        _ => false,
    }
}

/// One GPU's reading from its `metric` object.
fn reading(entry: &Value) -> Result<GpuReading, Unreadable> {
    let mhz = |path: &[&str]| number(entry, path).map(|v| v.map(|f| f as u32));
    let temperature = match number(entry, &["temperature", "edge"])? {
        Some(t) => Some(t),
        None => number(entry, &["temperature", "hotspot"])?,
    };
    let throttled = match entry
        .pointer("/power/throttle_status")
        .and_then(Value::as_str)
    {
        Some("THROTTLED") => Some(true),
        Some("UNTHROTTLED") => Some(false),
        _ => None,
    };
    let violations = entry.get("throttle");
    let clock_events = VIOLATIONS
        .iter()
        .filter(|(key, _)| active(violations.and_then(|t| t.get(key))))
        .map(|(_, name)| (*name).to_owned())
        .collect();
    Ok(GpuReading {
        index: index(entry)?,
        temperature_c: temperature,
        power_w: number(entry, &["power", "socket_power"])?,
        sm_clock_mhz: mhz(&["clock", "gfx_0", "clk"])?,
        mem_clock_mhz: mhz(&["clock", "mem_0", "clk"])?,
        max_sm_clock_mhz: mhz(&["clock", "gfx_0", "max_clk"])?,
        clock_events,
        throttled,
        ecc_uncorrected: number(entry, &["ecc", "total_uncorrectable_count"])?.map(|n| n as u64),
        ..Default::default()
    })
}

/// Every GPU of `amd-smi metric --json`.
pub(crate) fn parse_metrics(output: &str) -> Result<Vec<GpuReading>, Unreadable> {
    gpu_entries(output)?.iter().map(reading).collect()
}

/// One entry of a GPU's `process_list`: `{"process_info": {...}}`, or its text when there
/// is none ("No running processes detected").
fn process(gpu: u32, item: &Value) -> Result<Option<GpuProcess>, Unreadable> {
    let info = item.get("process_info").unwrap_or(item);
    if info.is_string() {
        return Ok(None);
    }
    let pid = info
        .get("pid")
        .and_then(Value::as_u64)
        .ok_or_else(|| Unreadable::new(TOOL, "a process without a pid", &item.to_string()))?;
    let bytes = number(info, &["mem_usage"])?;
    Ok(Some(GpuProcess {
        pid,
        name: info
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        gpu_uuid: String::new(),
        gpu_index: Some(gpu),
        used_memory_mib: bytes.map(|b| (b / (1024.0 * 1024.0)) as u64),
    }))
}

/// Every process of `amd-smi process --json`, each with its GPU's index.
pub(crate) fn parse_processes(output: &str) -> Result<Vec<GpuProcess>, Unreadable> {
    let mut all = Vec::new();
    for entry in gpu_entries(output)? {
        let gpu = index(&entry)?;
        let list = match entry.get("process_list") {
            Some(Value::Array(list)) => list.clone(),
            None | Some(Value::Null) => Vec::new(),
            Some(other) => {
                let why = "process_list is not a list";
                return Err(Unreadable::new(TOOL, why, &other.to_string()));
            }
        };
        for item in &list {
            all.extend(process(gpu, item)?);
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// One MI300X's `metric --json` entry, as amd-smi's CLI builds it (trimmed).
    fn mi300x(gpu: u32) -> Value {
        json!({
            "gpu": gpu,
            "usage": {"gfx_activity": {"value": 0, "unit": "%"}},
            "power": {"socket_power": {"value": 140, "unit": "W"}, "gfx_voltage": "N/A",
                      "soc_voltage": "N/A", "mem_voltage": "N/A",
                      "throttle_status": "UNTHROTTLED", "power_management": "ENABLED"},
            "clock": {"gfx_0": {"clk": {"value": 132, "unit": "MHz"}, "min_clk": {"value": 500, "unit": "MHz"},
                                "max_clk": {"value": 2100, "unit": "MHz"}, "clk_locked": "DISABLED", "deep_sleep": "ENABLED"},
                      "mem_0": {"clk": {"value": 900, "unit": "MHz"}, "min_clk": "N/A", "max_clk": "N/A",
                                "clk_locked": "N/A", "deep_sleep": "DISABLED"}},
            "temperature": {"edge": "N/A", "hotspot": {"value": 41, "unit": "C"}, "mem": {"value": 35, "unit": "C"}},
            "ecc": {"total_correctable_count": 0, "total_uncorrectable_count": 0, "total_deferred_count": 0,
                    "cache_correctable_count": 0, "cache_uncorrectable_count": 0},
            "throttle": {"prochot_violation_status": "NOT ACTIVE", "ppt_violation_status": "NOT ACTIVE",
                         "socket_thermal_violation_status": "NOT ACTIVE", "vr_thermal_violation_status": "N/A",
                         "hbm_thermal_violation_status": "NOT ACTIVE"}
        })
    }

    #[test]
    fn an_idle_mi300x_reads_in_full() {
        let gpus = parse_metrics(&json!([mi300x(0)]).to_string()).unwrap();
        assert_eq!(
            gpus,
            [GpuReading {
                index: 0,
                temperature_c: Some(41.0),
                power_w: Some(140.0),
                sm_clock_mhz: Some(132),
                mem_clock_mhz: Some(900),
                max_sm_clock_mhz: Some(2100),
                throttled: Some(false),
                ecc_uncorrected: Some(0),
                ..Default::default()
            }]
        );
    }

    #[test]
    fn metric_documents_read_field_by_field() {
        type Check = fn(&[GpuReading]) -> bool;
        let hot = |mut g: Value| {
            g["temperature"]["edge"] = json!({"value": 90, "unit": "C"});
            g["power"]["throttle_status"] = json!("THROTTLED");
            g["throttle"]["socket_thermal_violation_status"] = json!("ACTIVE");
            g["ecc"]["total_uncorrectable_count"] = json!(3);
            g
        };
        let cases: Vec<(Value, Check)> = vec![
            (json!({"gpu_data": [mi300x(0), mi300x(1)]}), |g| {
                g.len() == 2 && g[1].index == 1
            }),
            (json!([hot(mi300x(0))]), |g| {
                g[0].temperature_c == Some(90.0)
                    && g[0].throttled == Some(true)
                    && g[0].clock_events == ["SocketThermalViolation"]
                    && g[0].ecc_uncorrected == Some(3)
            }),
            // A release without the throttle group: nothing known of it.
            (json!([{"gpu": 2}]), |g| {
                g[0].index == 2 && g[0].throttled.is_none() && g[0].temperature_c.is_none()
            }),
            (json!([]), |g| g.is_empty()),
        ];
        for (doc, check) in cases {
            let gpus = parse_metrics(&doc.to_string()).unwrap();
            assert!(check(&gpus), "{doc}: {gpus:?}");
        }
    }

    #[test]
    fn unreadable_metric_documents_are_errors_with_the_text() {
        let mut bad_temp = mi300x(0);
        bad_temp["temperature"]["edge"] = json!({"value": "hot", "unit": "C"});
        let cases: Vec<(String, &str)> = vec![
            (
                "ERROR:root:Unable to detect any GPU devices".into(),
                "not JSON",
            ),
            (json!({"error": "no GPU"}).to_string(), "neither a list"),
            (json!([{"power": {}}]).to_string(), "without an index"),
            (json!([bad_temp]).to_string(), "temperature.edge is \"hot\""),
        ];
        for (text, why) in cases {
            let err = parse_metrics(&text).unwrap_err();
            assert!(err.why.contains(why), "{text}: {err}");
            assert!(
                text.starts_with(err.line.trim_end_matches('…'))
                    || err.line.contains("gpu")
                    || err.line.contains("power"),
                "{err:?}"
            );
        }
    }

    #[test]
    fn processes_read_per_gpu() {
        let doc = json!([
            {"gpu": 0, "process_list": [{"process_info": "No running processes detected"}]},
            {"gpu": 1, "process_list": [{"process_info": {"name": "python3", "pid": 4242,
                "memory_usage": {"gtt_mem": {"value": 0, "unit": "B"}, "cpu_mem": {"value": 0, "unit": "B"},
                                  "vram_mem": {"value": 2097152, "unit": "B"}},
                "mem_usage": {"value": 2097152, "unit": "B"},
                "usage": {"gfx": {"value": 0, "unit": "ns"}, "enc": {"value": 0, "unit": "ns"}}}}]}
        ]);
        let procs = parse_processes(&doc.to_string()).unwrap();
        assert_eq!(
            procs,
            [GpuProcess {
                pid: 4242,
                name: "python3".into(),
                gpu_uuid: String::new(),
                gpu_index: Some(1),
                used_memory_mib: Some(2),
            }]
        );
        for bad in [
            "garbage".to_owned(),
            json!([{"gpu": 0, "process_list": "none"}]).to_string(),
            json!([{"gpu": 0, "process_list": [{"process_info": {"name": "x"}}]}]).to_string(),
        ] {
            assert!(parse_processes(&bad).is_err(), "{bad}");
        }
    }
}
