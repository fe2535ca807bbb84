//! The jobs listing as a plain-text table: one job a line, columns padded to their widest
//! cell, so it reads in a terminal and greps by column.

use crate::jobs::{Channel, Listed};
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
        job.queue.clone(),
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
    let rows: Vec<[String; 7]> = std::iter::once(HEADER.map(str::to_owned))
        .chain(jobs.iter().map(|j| row(j, now)))
        .collect();
    let widths: Vec<usize> = (0..HEADER.len())
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
