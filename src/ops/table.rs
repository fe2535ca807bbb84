//! The jobs listing and the fleet as plain-text tables: one job (or agent) a line, columns
//! padded to their widest cell, so they read in a terminal and grep by column.

use crate::flow::fleet::FleetAgent;
use crate::jobs::{Channel, Listed};
use crate::result::GpuReading;
use crate::time::Millis;

const HEADER: [&str; 7] = [
    "RUN ID", "STATE", "QUEUE", "AGE", "BUILD", "DISCORD", "CALLBACK",
];

/// A duration in its largest whole unit and the next: `3d 4h`, `12m 5s`.
fn age(ms: Millis) -> String {
    let s = ms.max(0) / 1000;
    let (d, h, m) = (s / 86_400, s / 3600 % 24, s / 60 % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {}s", s % 60),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

fn delivery(job: &Listed, channel: Channel) -> String {
    super::standing(job.delivery(channel), job.owes(channel))
        .unwrap_or("-")
        .into()
}

fn row(job: &Listed, now: Millis) -> [String; 7] {
    [
        job.run_id.as_str().to_owned(),
        job.state.as_str().to_owned(),
        job.queue.to_string(),
        age(now - job.created_at),
        job.build
            .as_ref()
            .map_or("-".into(), |b| format!("#{}", b.number)),
        delivery(job, Channel::Discord),
        delivery(job, Channel::Callback),
    ]
}

/// The jobs as a table with a header line, ages measured at `now`.
pub fn jobs_table(jobs: &[Listed], now: Millis) -> String {
    table(HEADER, jobs.iter().map(|j| row(j, now)))
}

const FLEET_HEADER: [&str; 9] = [
    "AGENT",
    "QUEUE",
    "STATE",
    "PAUSED",
    "JOBS 24H",
    "INFRA 24H",
    "THROTTLED 24H",
    "LAST READINGS",
    "READ",
];

/// One GPU's last reading, as a cell: `0: 41 °C 1980 MHz ecc 0`.
fn reading(r: &GpuReading) -> String {
    let mut parts = vec![format!("{}:", r.index)];
    parts.extend(r.temperature_c.map(|t| format!("{t:.0}°C")));
    parts.extend(r.sm_clock_mhz.map(|c| format!("{c}MHz")));
    parts.extend(r.ecc_uncorrected.map(|e| format!("ecc {e}")));
    parts.join(" ")
}

fn fleet_row(a: &FleetAgent, now: Millis) -> [String; 9] {
    let state = if a.busy {
        format!("{} (busy)", a.connection_state)
    } else {
        a.connection_state.clone()
    };
    let paused = match (&a.paused_why, a.paused_since) {
        (Some(why), Some(at)) => format!("{why} ({} ago)", age(now - at)),
        (Some(why), None) => why.clone(),
        (None, _) => "-".into(),
    };
    let readings: Vec<String> = a.readings.iter().map(reading).collect();
    [
        a.name.clone(),
        a.queue.clone(),
        state,
        paused,
        a.jobs_24h.to_string(),
        a.infra_failures_24h.to_string(),
        a.throttled_24h.to_string(),
        if readings.is_empty() {
            "-".into()
        } else {
            readings.join(", ")
        },
        a.readings_at
            .map_or("-".into(), |at| format!("{} ago", age(now - at))),
    ]
}

/// The fleet as a table with a header line, times measured at `now`.
pub fn fleet_table(agents: &[FleetAgent], now: Millis) -> String {
    table(FLEET_HEADER, agents.iter().map(|a| fleet_row(a, now)))
}

fn table<const N: usize>(header: [&str; N], rows: impl Iterator<Item = [String; N]>) -> String {
    let rows: Vec<[String; N]> = std::iter::once(header.map(str::to_owned))
        .chain(rows)
        .collect();
    let widths: Vec<usize> = (0..N)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_reads_in_one_line() {
        let agent = FleetAgent {
            name: "node-gpu0".into(),
            queue: "h100".into(),
            connection_state: "connected".into(),
            busy: true,
            paused: true,
            paused_why: Some("ecc_errors: 3".into()),
            paused_since: Some(1_000),
            jobs_24h: 7,
            infra_failures_24h: 1,
            throttled_24h: 2,
            readings: vec![GpuReading {
                index: 0,
                temperature_c: Some(41.0),
                sm_clock_mhz: Some(1980),
                ecc_uncorrected: Some(3),
                ..GpuReading::default()
            }],
            readings_at: Some(61_000),
        };
        let table = fleet_table(&[agent], 121_000);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2, "{table}");
        for cell in [
            "node-gpu0",
            "h100",
            "connected (busy)",
            "ecc_errors: 3 (2m 0s ago)",
            "7  ",
            "1  ",
            "2  ",
            "0: 41°C 1980MHz ecc 3",
            "1m 0s ago",
        ] {
            assert!(lines[1].contains(cell), "{cell}: {table}");
        }
    }

    #[test]
    fn ages_read_in_two_units() {
        for (ms, shown) in [
            (0, "0s"),
            (59_999, "59s"),
            (61_000, "1m 1s"),
            (3_600_000 + 120_000, "1h 2m"),
            (3 * 86_400_000 + 4 * 3_600_000 + 5, "3d 4h"),
            (-5, "0s"),
        ] {
            assert_eq!(age(ms), shown, "{ms}");
        }
    }
}
