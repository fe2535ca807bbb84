//! Measurement conditions, pure: was a timed run measured while the GPU was slowed down by
//! heat, a hardware slowdown or a power brake (or only held at its power limit, which is the
//! kernel's real speed), and what follows from that.

use kernelbot_protocol::result::GpuReading;

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

/// A slowdown was active before or after the run.
pub(crate) fn throttled(before: &[GpuReading], after: &[GpuReading]) -> bool {
    before
        .iter()
        .chain(after)
        .any(|r| !r.slowdowns().is_empty())
}

/// The board was held at its power limit before or after the run.
pub(crate) fn power_capped(before: &[GpuReading], after: &[GpuReading]) -> bool {
    before.iter().chain(after).any(GpuReading::power_capped)
}

/// The slowdowns seen, each named once, for the sentence that reports them.
pub(crate) fn seen(before: &[GpuReading], after: &[GpuReading]) -> Vec<String> {
    let mut names: Vec<String> = before
        .iter()
        .chain(after)
        .flat_map(GpuReading::slowdowns)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Only a leaderboard run that passed is ranked, so only it is run again: once. A run that
/// failed stands as failed whatever the GPU did: a wrong answer is not the GPU's doing, and
/// must not buy a second run (or a second agent).
pub(crate) fn next(mode: &str, attempt: u32, throttled: bool, passed: bool) -> Next {
    match (mode, throttled && passed) {
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
        // (before, after, throttled, power capped)
        let cases: &[(&[u64], &[u64], bool, bool)] = &[
            (&[0x1], &[0x0], false, false),
            (&[0x2], &[0x10], false, false),
            (&[0x20], &[0x0], true, false),
            (&[0x0], &[0x4], false, true),
            (&[0x4], &[0x4], false, true),
            (&[0x0], &[0x8], true, false),
            (&[0x0, 0x0], &[0x0, 0x84], true, true),
            (&[], &[], false, false),
        ];
        for (before, after, want, capped) in cases {
            let b: Vec<_> = before.iter().map(|m| gpu(*m)).collect();
            let a: Vec<_> = after.iter().map(|m| gpu(*m)).collect();
            assert_eq!(throttled(&b, &a), *want, "{before:?} {after:?}");
            assert_eq!(power_capped(&b, &a), *capped, "{before:?} {after:?}");
        }
        assert_eq!(
            seen(&[gpu(0x20)], &[gpu(0x24)]),
            ["SwThermalSlowdown"],
            "the power cap is no slowdown"
        );
        assert_eq!(
            seen(&[gpu(0x48)], &[gpu(0x80)]),
            ["HwPowerBrakeSlowdown", "HwSlowdown", "HwThermalSlowdown"]
        );
    }

    #[test]
    fn only_a_throttled_leaderboard_run_is_run_again_and_only_once() {
        let cases = [
            ("leaderboard", 1, false, true, Next::Keep),
            ("leaderboard", 1, true, true, Next::CoolDownAndRetry),
            ("leaderboard", 2, true, true, Next::Fail),
            ("leaderboard", 2, false, true, Next::Keep),
            // A failing run is failed, however hot the GPU.
            ("leaderboard", 1, true, false, Next::Keep),
            ("leaderboard", 2, true, false, Next::Keep),
            ("benchmark", 1, true, true, Next::Keep),
            ("test", 1, true, true, Next::Keep),
        ];
        for (mode, attempt, throttled, passed, want) in cases {
            assert_eq!(
                next(mode, attempt, throttled, passed),
                want,
                "{mode} {attempt} {throttled} {passed}"
            );
        }
        assert!(is_timed("benchmark") && is_timed("leaderboard") && !is_timed("test"));
    }
}
