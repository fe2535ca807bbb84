//! Readings around each timed run (benchmark, leaderboard), and the one cool-down and second
//! try a throttled leaderboard run gets. The decisions are in [`super::measure`].

use std::time::{Duration, Instant};

use super::measure::{self, Next};
use super::probe::Reader;
use kernelbot_protocol::result::{Conditions, EvalResult, GpuReading, Throttled};

/// How long a GPU that throttled a leaderboard run cools before the second try, and how long
/// the pre-flight waits for a GPU still hot from the previous job, unless
/// `KERNELBOT_COOLDOWN_SECS` says otherwise.
pub(crate) const DEFAULT_COOLDOWN: Duration = Duration::from_secs(30);

/// How the GPUs are read, the cool-down, and which try of the job this is.
#[derive(Clone, Debug)]
pub(crate) struct Watch {
    pub(crate) reader: Reader,
    pub(crate) cooldown: Duration,
    /// `BUILDKITE_RETRY_COUNT`: 0 on the job's first try.
    pub(crate) retry: u32,
}

impl Watch {
    /// The GPUs' readings; none when the tool fails now (the pre-flight passed, so a
    /// failure here costs the run its conditions, never its result).
    fn read(&self) -> Vec<GpuReading> {
        self.reader.readings().unwrap_or_else(|e| {
            eprintln!("Cannot read the GPUs' conditions: {e}");
            Vec::new()
        })
    }

    /// Runs a timed `mode` with readings before and after, in its result's `conditions`. A
    /// throttled leaderboard run is run again after the cool-down (within the budget left
    /// until `until`); throttled again, no time of it is ranked: what says so comes back.
    pub(crate) fn timed(
        &self,
        mode: &str,
        until: Instant,
        mut run: impl FnMut() -> EvalResult,
    ) -> (EvalResult, Option<Throttled>) {
        let mut attempt = 1;
        let mut cooled = Duration::ZERO;
        loop {
            let before = self.read();
            let mut result = run();
            let after = self.read();
            let throttled = measure::throttled(&before, &after);
            let seen = measure::seen(&before, &after);
            result.conditions = Some(Conditions {
                throttled,
                power_capped: measure::power_capped(&before, &after),
                before,
                after: after.clone(),
                attempts: attempt,
            });
            let passed = result.run.as_ref().is_some_and(|r| r.passed);
            match measure::next(mode, attempt, throttled, passed) {
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
                    cooled = pause;
                    attempt += 1;
                }
                Next::Fail => {
                    let throttled = Throttled {
                        mode: mode.to_owned(),
                        slowdowns: seen,
                        retry: self.retry,
                        cooldown_secs: cooled.as_secs(),
                        readings: after,
                    };
                    return (result, Some(throttled));
                }
            }
        }
    }
}
