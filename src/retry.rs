//! Retry timing for calls to Buildkite and Discord: exponential backoff with full jitter,
//! or the wait the server asked for, bounded so a function never sleeps past its budget.

use std::time::Duration;

#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Total tries, the first included.
    pub attempts: u32,
    /// Backoff before the second try; doubles each time.
    pub base: Duration,
    /// Cap on one computed backoff.
    pub max_backoff: Duration,
    /// A server that asks for a longer wait than this is not waited for.
    pub max_wait: Duration,
    /// No new try starts after this long: a function must answer within its own timeout.
    pub budget: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            attempts: 4,
            base: Duration::from_millis(250),
            max_backoff: Duration::from_secs(4),
            max_wait: Duration::from_secs(10),
            budget: Duration::from_secs(15),
        }
    }
}

impl Policy {
    /// The pause before try `attempt + 1` (after `attempt` failed tries, counting from 1,
    /// `elapsed` since the first), or `None` when no try is left, the server's requested
    /// wait is too long, or the pause would end past the budget.
    pub fn delay(
        &self,
        attempt: u32,
        requested: Option<Duration>,
        elapsed: Duration,
    ) -> Option<Duration> {
        if attempt >= self.attempts {
            return None;
        }
        let pause = match requested {
            Some(wait) if wait > self.max_wait => None,
            // A little jitter on top, so clients that were told the same wait don't stampede.
            Some(wait) => Some(wait + Duration::from_millis(fastrand::u64(0..=100))),
            None => {
                let exp = self
                    .base
                    .saturating_mul(1 << (attempt - 1).min(16))
                    .min(self.max_backoff);
                Some(Duration::from_millis(fastrand::u64(
                    exp.as_millis() as u64 / 2..=exp.as_millis() as u64,
                )))
            }
        }?;
        (elapsed + pause <= self.budget).then_some(pause)
    }
}

/// Whether a status is worth another try: rate limited or a server-side failure.
pub fn is_transient(status: reqwest::StatusCode) -> bool {
    status == reqwest::StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    const Z: Duration = Duration::ZERO;

    #[test]
    fn backs_off_exponentially_within_bounds() {
        let p = Policy {
            attempts: 6,
            base: Duration::from_millis(100),
            max_backoff: Duration::from_millis(500),
            max_wait: Duration::from_secs(1),
            budget: Duration::from_secs(60),
        };
        for _ in 0..50 {
            let d1 = p.delay(1, None, Z).unwrap();
            assert!(d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100));
            let d3 = p.delay(3, None, Z).unwrap();
            assert!(d3 >= Duration::from_millis(200) && d3 <= Duration::from_millis(400));
            assert!(p.delay(5, None, Z).unwrap() <= Duration::from_millis(500));
        }
        assert_eq!(p.delay(6, None, Z), None);
    }

    #[test]
    fn honours_the_servers_wait_unless_too_long() {
        let p = Policy::default();
        let d = p.delay(1, Some(Duration::from_millis(1500)), Z).unwrap();
        assert!(d >= Duration::from_millis(1500) && d <= Duration::from_millis(1600));
        assert_eq!(p.delay(1, Some(Duration::from_secs(60)), Z), None);
    }

    #[test]
    fn never_starts_a_try_past_the_budget() {
        let p = Policy {
            budget: Duration::from_secs(2),
            ..Policy::default()
        };
        assert!(
            p.delay(
                1,
                Some(Duration::from_millis(500)),
                Duration::from_millis(1000)
            )
            .is_some()
        );
        assert_eq!(
            p.delay(
                1,
                Some(Duration::from_millis(500)),
                Duration::from_millis(1900)
            ),
            None
        );
    }
}
