//! How many Buildkite API calls a sweep pass may still make (retries included, artifact
//! storage not), and the lowest `RateLimit-Remaining` Buildkite last reported: a pass never
//! takes the organisation's or the token's last requests, which submissions need, until
//! the window they were counted in resets.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use reqwest::header::HeaderMap;

use super::gate::{MAX_RESET_SECS, latest_reset, lowest_remaining};
use crate::time::{Clock, Millis};

/// Below this many requests left in Buildkite's window, a pass stops calling.
pub(crate) const RATE_LIMIT_FLOOR: i64 = 10;

#[derive(Clone, Debug)]
pub(crate) struct CallBudget(Arc<BudgetState>);

#[derive(Debug)]
struct BudgetState {
    left: AtomicI64,
    made: AtomicI64,
    remaining: AtomicI64,
    /// Seconds until Buildkite's window resets, as last said (`RateLimit-Reset`).
    reset: AtomicI64,
    /// When that window resets, on the service's clock (`Millis::MAX`: not said).
    reset_at: AtomicI64,
    clock: Clock,
}

impl CallBudget {
    pub(crate) fn new(max_calls: u32, clock: Clock) -> Self {
        Self(Arc::new(BudgetState {
            left: AtomicI64::new(i64::from(max_calls)),
            made: AtomicI64::new(0),
            remaining: AtomicI64::new(i64::MAX),
            reset: AtomicI64::new(-1),
            reset_at: AtomicI64::new(Millis::MAX),
            clock,
        }))
    }

    /// Whether the window last told is nearly used up: until it resets. A pass outlasts
    /// Buildkite's one-minute window; a count from a window that is over says nothing.
    fn window_low(&self) -> bool {
        self.0.remaining.load(Ordering::Relaxed) < RATE_LIMIT_FLOOR
            && self.0.clock.now() < self.0.reset_at.load(Ordering::Relaxed)
    }

    /// Takes one call, if the budget and the rate limit allow.
    pub(super) fn take(&self) -> bool {
        if self.window_low() {
            return false;
        }
        let ok = self.0.left.fetch_sub(1, Ordering::Relaxed) > 0;
        if ok {
            self.0.made.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Notes the lower of the organisation's and the token's remaining requests.
    pub(super) fn observe(&self, headers: &HeaderMap) {
        let lowest = lowest_remaining(headers);
        if let Some(n) = lowest {
            self.0.remaining.store(n, Ordering::Relaxed);
        }
        let reset = latest_reset(headers);
        if let Some(secs) = reset {
            self.0.reset.store(secs, Ordering::Relaxed);
        }
        if lowest.is_some() {
            // A count without its reset holds for the rest of the pass.
            let at = reset.map_or(Millis::MAX, |secs| {
                let ms = secs.clamp(0, MAX_RESET_SECS) * 1000;
                self.0.clock.now().saturating_add(ms)
            });
            self.0.reset_at.store(at, Ordering::Relaxed);
        }
    }

    /// Seconds until Buildkite's window resets, when it said.
    pub(crate) fn reset_secs(&self) -> Option<i64> {
        Some(self.0.reset.load(Ordering::Relaxed)).filter(|s| *s >= 0)
    }

    /// Calls made so far.
    pub(crate) fn made(&self) -> u32 {
        self.0.made.load(Ordering::Relaxed).max(0) as u32
    }

    /// The fewest requests left Buildkite last reported; `None` before it said.
    pub(crate) fn remaining(&self) -> Option<i64> {
        Some(self.0.remaining.load(Ordering::Relaxed)).filter(|n| *n != i64::MAX)
    }

    pub(crate) fn spent(&self) -> bool {
        self.0.left.load(Ordering::Relaxed) <= 0 || self.window_low()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn told(remaining: &str, reset: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("ratelimit-remaining", remaining.parse().unwrap());
        if let Some(r) = reset {
            headers.insert("ratelimit-reset", r.parse().unwrap());
        }
        headers
    }

    #[test]
    fn a_spent_window_stops_the_pass_only_until_its_reset() {
        let clock = Clock::default();
        clock.advance(std::time::Duration::from_secs(1_000));
        let budget = CallBudget::new(100, clock.clone());
        budget.observe(&told("2", Some("30")));
        assert!(
            budget.spent() && !budget.take(),
            "2 left: the pass leaves them"
        );
        clock.advance(std::time::Duration::from_secs(29));
        assert!(budget.spent(), "one second before the reset");
        clock.advance(std::time::Duration::from_secs(1));
        assert!(!budget.spent() && budget.take(), "a new window");
        assert_eq!(budget.made(), 1);
        budget.observe(&told("0", None));
        clock.advance(std::time::Duration::from_secs(3_600));
        assert!(
            budget.spent(),
            "a count without its reset holds for the pass"
        );
        let mut both = told("1", Some("5"));
        both.insert("ratelimit-user-reset", "40".parse().unwrap());
        budget.observe(&both);
        clock.advance(std::time::Duration::from_secs(39));
        assert!(budget.spent(), "the later of the two resets");
        clock.advance(std::time::Duration::from_secs(1));
        assert!(!budget.spent());
        budget.observe(&told("0", Some("99999999")));
        clock.advance(std::time::Duration::from_secs(3_599));
        assert!(budget.spent(), "a reset past an hour is read as an hour");
        clock.advance(std::time::Duration::from_secs(1));
        assert!(!budget.spent());
    }

    #[test]
    fn a_budget_counts_calls_and_stops_at_the_rate_limit_floor() {
        let budget = CallBudget::new(2, Clock::default());
        assert!(budget.take() && budget.take());
        assert!(!budget.take(), "two calls, then none");
        assert_eq!((budget.made(), budget.spent()), (2, true));
        let roomy = CallBudget::new(100, Clock::default());
        let mut headers = HeaderMap::new();
        headers.insert("ratelimit-remaining", "50".parse().unwrap());
        headers.insert("ratelimit-user-remaining", "9".parse().unwrap());
        roomy.observe(&headers);
        assert!(
            roomy.spent() && !roomy.take(),
            "the token's window is nearly used up"
        );
    }
}
