//! How many Buildkite API calls a sweep pass may still make (retries included, artifact
//! storage not), and the lowest `RateLimit-Remaining` Buildkite last reported: a pass never
//! takes the organisation's or the token's last requests, which submissions need.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use reqwest::header::HeaderMap;

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
}

impl CallBudget {
    pub(crate) fn new(max_calls: u32) -> Self {
        Self(Arc::new(BudgetState {
            left: AtomicI64::new(i64::from(max_calls)),
            made: AtomicI64::new(0),
            remaining: AtomicI64::new(i64::MAX),
            reset: AtomicI64::new(-1),
        }))
    }

    /// Takes one call, if the budget and the rate limit allow.
    pub(super) fn take(&self) -> bool {
        if self.0.remaining.load(Ordering::Relaxed) < RATE_LIMIT_FLOOR {
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
        let lowest = ["ratelimit-remaining", "ratelimit-user-remaining"]
            .iter()
            .filter_map(|n| headers.get(*n)?.to_str().ok()?.trim().parse::<i64>().ok())
            .min();
        if let Some(n) = lowest {
            self.0.remaining.store(n, Ordering::Relaxed);
        }
        let reset = headers.get("ratelimit-reset").and_then(|v| v.to_str().ok());
        if let Some(secs) = reset.and_then(|v| v.trim().parse::<i64>().ok()) {
            self.0.reset.store(secs, Ordering::Relaxed);
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
        self.0.left.load(Ordering::Relaxed) <= 0
            || self.0.remaining.load(Ordering::Relaxed) < RATE_LIMIT_FLOOR
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_counts_calls_and_stops_at_the_rate_limit_floor() {
        let budget = CallBudget::new(2);
        assert!(budget.take() && budget.take());
        assert!(!budget.take(), "two calls, then none");
        assert_eq!((budget.made(), budget.spent()), (2, true));
        let roomy = CallBudget::new(100);
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
