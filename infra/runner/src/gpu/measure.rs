//! Measurement conditions, pure: was a timed run measured while the GPU was held down by heat
//! or power, and what follows from that.

use super::preflight::slowdowns;
use crate::result::GpuReading;

/// What follows a timed run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Its numbers stand (a benchmark's are kept whatever happened, with its conditions).
    Keep,
    /// A throttled leaderboard run: let the GPU cool, then run it once more.
    CoolDownAndRetry,
    /// A leaderboard run throttled again after the cool-down: no ranked time from this GPU.
    Fail,
}

/// A thermal or power slowdown was active before or after the run.
pub(crate) fn throttled(before: &[GpuReading], after: &[GpuReading]) -> bool {
    before.iter().chain(after).any(|r| !slowdowns(r).is_empty())
}

/// The slowdowns seen, each named once, for the sentence that reports them.
pub(crate) fn seen(before: &[GpuReading], after: &[GpuReading]) -> Vec<String> {
    let mut names: Vec<String> = before.iter().chain(after).flat_map(slowdowns).collect();
    names.sort();
    names.dedup();
    names
}

/// Only a leaderboard run is ranked, so only it is run again: once.
pub(crate) fn next(mode: &str, attempt: u32, throttled: bool) -> Next {
    match (mode, throttled) {
        ("leaderboard", true) if attempt <= 1 => Next::CoolDownAndRetry,
        ("leaderboard", true) => Next::Fail,
        _ => Next::Keep,
    }
}

/// The runs measured with readings around them.
pub(crate) fn is_timed(mode: &str) -> bool {
    matches!(mode, "benchmark" | "leaderboard")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(mask: u64) -> GpuReading {
        GpuReading {
            clock_event_reasons: Some(mask),
            ..Default::default()
        }
    }

    #[test]
    fn a_slowdown_before_or_after_is_throttled() {
        let cases: &[(&[u64], &[u64], bool)] = &[
            (&[0x1], &[0x0], false),
            (&[0x2], &[0x10], false),
            (&[0x20], &[0x0], true),
            (&[0x0], &[0x4], true),
            (&[0x0, 0x0], &[0x0, 0x80], true),
            (&[], &[], false),
        ];
        for (before, after, want) in cases {
            let b: Vec<_> = before.iter().map(|m| gpu(*m)).collect();
            let a: Vec<_> = after.iter().map(|m| gpu(*m)).collect();
            assert_eq!(throttled(&b, &a), *want, "{before:?} {after:?}");
        }
        assert_eq!(
            seen(&[gpu(0x20)], &[gpu(0x24)]),
            ["SwPowerCap", "SwThermalSlowdown"]
        );
    }

    #[test]
    fn only_a_throttled_leaderboard_run_is_run_again_and_only_once() {
        let cases = [
            ("leaderboard", 1, false, Next::Keep),
            ("leaderboard", 1, true, Next::CoolDownAndRetry),
            ("leaderboard", 2, true, Next::Fail),
            ("leaderboard", 2, false, Next::Keep),
            ("benchmark", 1, true, Next::Keep),
            ("test", 1, true, Next::Keep),
        ];
        for (mode, attempt, throttled, want) in cases {
            assert_eq!(
                next(mode, attempt, throttled),
                want,
                "{mode} {attempt} {throttled}"
            );
        }
        assert!(is_timed("benchmark") && is_timed("leaderboard") && !is_timed("test"));
    }
}
