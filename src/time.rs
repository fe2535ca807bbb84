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

/// Wall-clock time in milliseconds, which tests can move forward (deadlines of hours and the
/// 24 h give-up are tested without waiting).
#[derive(Clone, Debug, Default)]
pub struct Clock {
    skew: Arc<AtomicI64>,
}

impl Clock {
    pub fn now(&self) -> Millis {
        now_millis() + self.skew.load(Ordering::Relaxed)
    }

    pub fn advance(&self, by: Duration) {
        self.skew
            .fetch_add(by.as_millis() as i64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_has_milliseconds_and_a_moved_clock_stays_moved() {
        assert_eq!(rfc3339(1_614_265_330_000), "2021-02-25T15:02:10.000Z");
        let clock = Clock::default();
        let before = clock.now();
        clock.advance(Duration::from_secs(3600));
        assert!(clock.now() - before >= 3_600_000);
        assert!(
            clock.clone().now() >= before + 3_600_000,
            "clones share the skew"
        );
    }
}
