//! What a queue's record keeps of its ended jobs, for the public status page and the
//! expected start: the last runs' wait and run times, and per hour of the last day how many
//! jobs ended and how many of them were infrastructure failures. Pure, and small whatever
//! the traffic (a bounded list and 24 counters).

use serde::{Deserialize, Serialize};

use crate::time::Millis;

/// Runs kept for the medians.
const RECENT: usize = 100;
const HOUR_MS: Millis = 3_600_000;
/// The counters kept: a day of hours.
const HOURS: i64 = 24;

/// One ended run: when it ended, how long it waited for an agent and how long it ran.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Ended {
    pub(crate) at: Millis,
    pub(crate) waited_ms: Option<Millis>,
    pub(crate) ran_ms: Option<Millis>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct QueueRecord {
    pub(crate) recent: Vec<Ended>,
    /// (hour since the epoch, jobs ended, of which infrastructure failures).
    pub(crate) hours: Vec<(i64, u32, u32)>,
}

impl QueueRecord {
    /// Notes a job that ended at `e.at` (`infra`: the node, not the submission, failed it).
    pub(crate) fn note(&mut self, e: Ended, infra: bool) {
        let hour = e.at.div_euclid(HOUR_MS);
        match self.hours.iter_mut().find(|(h, ..)| *h == hour) {
            Some((_, jobs, failed)) => {
                *jobs += 1;
                *failed += u32::from(infra);
            }
            None => self.hours.push((hour, 1, u32::from(infra))),
        }
        self.hours.retain(|(h, ..)| *h > hour - HOURS);
        self.recent.push(e);
        let over = self.recent.len().saturating_sub(RECENT);
        self.recent.drain(..over);
    }

    /// Jobs ended and infrastructure failures in the 24 hours up to `now`.
    pub(crate) fn last_day(&self, now: Millis) -> (u32, u32) {
        let hour = now.div_euclid(HOUR_MS);
        self.hours
            .iter()
            .filter(|(h, ..)| *h > hour - HOURS && *h <= hour)
            .fold((0, 0), |(j, f), (_, jobs, failed)| (j + jobs, f + failed))
    }

    /// The median wait and run time (ms) of the runs that ended since `from`.
    pub(crate) fn medians_since(&self, from: Millis) -> (Option<Millis>, Option<Millis>) {
        let recent = || self.recent.iter().filter(|e| e.at >= from);
        let waits: Vec<Millis> = recent().filter_map(|e| e.waited_ms).collect();
        let runs: Vec<Millis> = recent().filter_map(|e| e.ran_ms).collect();
        (median(&waits), median(&runs))
    }

    /// The median run time of the runs kept, whenever they ended (the expected start's).
    pub(crate) fn median_run(&self) -> Option<Millis> {
        let runs: Vec<Millis> = self.recent.iter().filter_map(|e| e.ran_ms).collect();
        median(&runs)
    }
}

/// The median (the upper one of an even count).
pub(crate) fn median(values: &[Millis]) -> Option<Millis> {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(at: Millis, waited: Millis, ran: Millis) -> Ended {
        Ended {
            at,
            waited_ms: Some(waited),
            ran_ms: Some(ran),
        }
    }

    #[test]
    fn the_last_day_and_the_last_hour_are_counted_from_what_ended() {
        let mut q = QueueRecord::default();
        let day = 24 * HOUR_MS;
        q.note(ended(0, 1_000, 30_000), true);
        q.note(ended(day - 10, 5_000, 40_000), false);
        q.note(ended(day + HOUR_MS, 9_000, 20_000), false);
        q.note(ended(day + HOUR_MS + 1, 3_000, 60_000), true);
        let now = day + HOUR_MS + 5;
        assert_eq!(q.last_day(now), (3, 1), "the first is over a day old");
        assert_eq!(
            q.medians_since(now - HOUR_MS),
            (Some(9_000), Some(60_000)),
            "the two of the last hour"
        );
        assert_eq!(q.median_run(), Some(40_000));
        assert!(q.hours.len() <= 24);
    }

    #[test]
    fn a_busy_queue_keeps_a_bounded_record() {
        let mut q = QueueRecord::default();
        for i in 0..10_000 {
            q.note(ended(i * 60_000, 1, 2), i % 10 == 0);
        }
        assert_eq!(q.recent.len(), RECENT);
        assert!(q.hours.len() <= 24);
        let now = 9_999 * 60_000;
        assert_eq!(
            q.last_day(now).0,
            24 * 60 - 20,
            "a day of minutes, this hour partly"
        );
    }
}
