//! Time as the service keeps it: milliseconds since the Unix epoch, a clock tests can move
//! forward, and RFC 3339 for people and callbacks.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub(crate) type Millis = i64;

/// The wall clock, in milliseconds.
pub fn now_millis() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}

/// The wall clock, in whole seconds.
pub(crate) fn now_secs() -> i64 {
    now_millis() / 1000
}

/// `ms` as an RFC 3339 UTC time with milliseconds.
pub fn rfc3339(ms: Millis) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// An RFC 3339 time (as Buildkite writes them, with or without fractions) in milliseconds
/// since the epoch; `None` for anything else.
pub(crate) fn millis_of(text: &str) -> Option<Millis> {
    let at = humantime::parse_rfc3339_weak(text).ok()?;
    let since = at.duration_since(UNIX_EPOCH).ok()?;
    Millis::try_from(since.as_millis()).ok()
}

/// `ms` in seconds, as exact as a float writes them: 2,119 ms reads 2.119 (seconds plus
/// nanoseconds as floats would read 2.1189999999999998).
pub(crate) fn secs_of(ms: Millis) -> f64 {
    ms as f64 / 1000.0
}

/// `secs` in whole milliseconds, rounded, so that seconds read from milliseconds come back
/// exact; `as` saturates (NaN is 0).
pub(crate) fn millis_in(secs: f64) -> Millis {
    (secs * 1000.0).round() as Millis
}

/// Wall-clock time in milliseconds, which tests can move forward (deadlines of hours and the
/// 24 h give-up are tested without waiting) and a benchmark can run faster than real time (a
/// simulated hour in a minute). Deployed functions use the default: the wall clock itself.
#[derive(Clone, Debug)]
pub struct Clock {
    skew: Arc<AtomicI64>,
    /// Clock milliseconds per real millisecond, counted from `origin` (1 when deployed).
    scale: f64,
    origin: Millis,
}

impl Default for Clock {
    fn default() -> Self {
        Self::scaled(1.0)
    }
}

/// The longest a [`Clock::sleep`] waits in real time before it looks at the clock again, so
/// that a test moving the clock forward wakes it.
const SLEEP_SLICE: Duration = Duration::from_millis(50);

impl Clock {
    /// A clock that runs `scale` times faster than real time from now (at least 1×).
    pub fn scaled(scale: f64) -> Self {
        Self {
            skew: Arc::default(),
            scale: scale.max(1.0),
            origin: now_millis(),
        }
    }

    pub fn now(&self) -> Millis {
        let real = now_millis();
        let run = if self.scale == 1.0 {
            real
        } else {
            self.origin + ((real - self.origin) as f64 * self.scale) as Millis
        };
        run + self.skew.load(Ordering::Relaxed)
    }

    pub fn advance(&self, by: Duration) {
        self.skew
            .fetch_add(by.as_millis() as i64, Ordering::Relaxed);
    }

    /// As [`Self::sleep`], for `ms` milliseconds (none when negative): a limit's reset as
    /// the clients keep it.
    pub(crate) async fn sleep_ms(&self, ms: Millis) {
        self.sleep(Duration::from_millis(ms.max(0) as u64)).await;
    }

    /// Waits until `span` has passed on this clock: a rate limit's reset is honoured on the
    /// same clock the limit was counted on.
    pub async fn sleep(&self, span: Duration) {
        let until = self.now() + span.as_millis() as Millis;
        loop {
            let left = until - self.now();
            if left <= 0 {
                return;
            }
            let real = Duration::from_secs_f64(left as f64 / 1000.0 / self.scale);
            tokio::time::sleep(real.min(SLEEP_SLICE)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_milliseconds_convert_without_drift() {
        for (ms, secs) in [(2_119, 2.119), (45_500, 45.5), (0, 0.0), (1, 0.001)] {
            assert_eq!(secs_of(ms), secs, "{ms}");
            assert_eq!(millis_in(secs), ms, "{secs}");
        }
        // A span of seconds-plus-nanoseconds comes back to its milliseconds.
        assert_eq!(millis_in(Duration::from_millis(2_119).as_secs_f64()), 2_119);
        assert_eq!(millis_in(f64::NAN), 0);
        assert_eq!(millis_in(-1.5), -1_500);
    }

    #[test]
    fn rfc3339_has_milliseconds_and_a_moved_clock_stays_moved() {
        assert_eq!(rfc3339(1_614_265_330_000), "2021-02-25T15:02:10.000Z");
        for text in ["2021-02-25T15:02:10.000Z", "2021-02-25T15:02:10Z"] {
            assert_eq!(millis_of(text), Some(1_614_265_330_000), "{text}");
        }
        assert_eq!(millis_of("yesterday"), None);
        let clock = Clock::default();
        let before = clock.now();
        clock.advance(Duration::from_secs(3600));
        assert!(clock.now() - before >= 3_600_000);
        assert!(
            clock.clone().now() >= before + 3_600_000,
            "clones share the skew"
        );
    }

    #[tokio::test]
    async fn a_scaled_clock_runs_faster_and_its_sleep_follows_it() {
        let clock = Clock::scaled(100.0);
        let (real, at) = (std::time::Instant::now(), clock.now());
        clock.sleep(Duration::from_secs(5)).await;
        assert!(clock.now() - at >= 5_000, "slept 5 s of the clock");
        assert!(
            real.elapsed() < Duration::from_secs(2),
            "5 clock seconds are 50 real ms at 100x, not {:?}",
            real.elapsed()
        );
        // A sleep on a clock that is moved forward ends when the move passes its end.
        let clock = Clock::default();
        let moved = clock.clone();
        let sleeper = tokio::spawn(async move { clock.sleep(Duration::from_secs(3600)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        moved.advance(Duration::from_secs(3601));
        tokio::time::timeout(Duration::from_secs(2), sleeper)
            .await
            .expect("woken by the move")
            .expect("sleeper");
    }
}
