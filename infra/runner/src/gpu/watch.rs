//! Readings around each timed run (benchmark, leaderboard), and the one cool-down and second
//! try a throttled leaderboard run gets. The decisions are in [`super::measure`].

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::measure::{self, Next};
use super::probe::{self, Vendor};
use crate::result::{Conditions, EvalResult, GpuReading, InfraFailure};

/// How long a GPU that throttled a leaderboard run cools before the second try, unless
/// `KERNELBOT_COOLDOWN_SECS` says otherwise.
pub(crate) const DEFAULT_COOLDOWN: Duration = Duration::from_secs(30);

/// The vendor's tool to read the GPUs with, and the cool-down.
#[derive(Clone, Debug)]
pub(crate) struct Watch {
    pub(crate) vendor: Vendor,
    pub(crate) tool: PathBuf,
    pub(crate) cooldown: Duration,
}

impl Watch {
    /// The GPUs' readings; none when the tool fails now (the pre-flight passed, so a
    /// failure here costs the run its conditions, never its result).
    fn read(&self) -> Vec<GpuReading> {
        probe::readings(self.vendor, &self.tool).unwrap_or_else(|e| {
            eprintln!("Cannot read the GPUs' conditions: {e}");
            Vec::new()
        })
    }

    /// Runs a timed `mode` with readings before and after, in its result's `conditions`. A
    /// throttled leaderboard run is run again after the cool-down (within the budget left
    /// until `until`); throttled again, it is an infrastructure failure.
    pub(crate) fn timed(
        &self,
        mode: &str,
        until: Instant,
        mut run: impl FnMut() -> EvalResult,
    ) -> (EvalResult, Option<InfraFailure>) {
        let mut attempt = 1;
        loop {
            let before = self.read();
            let mut result = run();
            let after = self.read();
            let throttled = measure::throttled(&before, &after);
            let seen = measure::seen(&before, &after);
            result.conditions = Some(Conditions {
                before,
                after: after.clone(),
                throttled,
                attempts: attempt,
            });
            match measure::next(mode, attempt, throttled) {
                Next::Keep => return (result, None),
                Next::CoolDownAndRetry => {
                    let pause = self
                        .cooldown
                        .min(until.saturating_duration_since(Instant::now()));
                    println!(
                        "The {mode} run was throttled ({}); again after {} s.",
                        seen.join(", "),
                        pause.as_secs()
                    );
                    std::thread::sleep(pause);
                    attempt += 1;
                }
                Next::Fail => {
                    let detail = format!(
                        "the {mode} run was throttled ({}) twice, the second time after a {} s cool-down",
                        seen.join(", "),
                        self.cooldown.as_secs()
                    );
                    let infra = InfraFailure {
                        stage: "measurement".into(),
                        reason: "throttled".into(),
                        detail,
                        readings: after,
                        processes: Vec::new(),
                    };
                    return (result, Some(infra));
                }
            }
        }
    }
}
