//! Discord's per-webhook rate limit as its answers tell it (`X-RateLimit-Remaining`,
//! `X-RateLimit-Reset-After`, a 429's `retry_after`), kept per webhook for this function
//! instance: a call the bucket has no room for waits for its reset, or is not sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use reqwest::header::HeaderMap;

use crate::time::{Clock, Millis};

/// Webhooks remembered at most; buckets whose reset has passed are dropped first.
const MAX_BUCKETS: usize = 1_000;

/// One webhook's bucket as last told: with its size and the longest reset it gave (about
/// its window), so that calls made after a reset, before any answer, are counted too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub(crate) remaining: i64,
    pub(crate) reset_at: Millis,
    pub(crate) limit: Option<i64>,
    pub(crate) window: Millis,
}

impl Bucket {
    /// How long a call must wait at `now` (milliseconds), if at all.
    pub(crate) fn wait(&self, now: Millis) -> Option<Millis> {
        (self.remaining <= 0 && now < self.reset_at).then(|| self.reset_at - now)
    }

    /// Past the reset, a new window of the known size begins: counted from here.
    fn roll(&mut self, now: Millis) {
        if let Some(limit) = self.limit
            && now >= self.reset_at
        {
            self.remaining = limit;
            self.reset_at = now.saturating_add(self.window);
        }
    }
}

/// Seconds (Discord sends fractions) as milliseconds.
fn millis(headers: &HeaderMap, name: &str) -> Option<Millis> {
    let secs: f64 = headers.get(name)?.to_str().ok()?.trim().parse().ok()?;
    // A wait past an hour is a bad header, not a bucket.
    (secs.is_finite() && secs >= 0.0).then(|| (secs.min(3_600.0) * 1000.0).ceil() as Millis)
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Buckets {
    map: Arc<Mutex<HashMap<String, Bucket>>>,
    clock: Clock,
}

impl Buckets {
    pub(crate) fn new(clock: Clock) -> Self {
        Self {
            map: Arc::default(),
            clock,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Bucket>, Millis) -> T) -> T {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut map, self.clock.now())
    }

    /// Takes a call to `webhook`, or says how long to wait for room.
    pub(crate) fn take(&self, webhook: &str) -> Result<(), Millis> {
        self.with(|map, now| {
            let Some(b) = map.get_mut(webhook) else {
                return Ok(());
            };
            b.roll(now);
            if let Some(ms) = b.wait(now) {
                return Err(ms);
            }
            b.remaining -= 1;
            Ok(())
        })
    }

    /// Notes an answer's bucket headers; a 429 (`retry_after` in its body) empties it.
    pub(crate) fn observe(&self, webhook: &str, headers: &HeaderMap, retry_after: Option<Millis>) {
        let number = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok()?.trim().parse::<i64>().ok())
        };
        let after = retry_after
            .or_else(|| millis(headers, "x-ratelimit-reset-after"))
            .map(|ms| ms.clamp(0, 3_600_000));
        let told = match (retry_after, number("x-ratelimit-remaining"), after) {
            (Some(_), _, Some(ms)) => Some((0, ms)),
            (None, Some(r), Some(ms)) => Some((r, ms)),
            _ => None,
        };
        let Some((remaining, ms)) = told else {
            return;
        };
        let limit = number("x-ratelimit-limit");
        self.with(|map, now| {
            if map.len() >= MAX_BUCKETS {
                map.retain(|_, b| b.reset_at > now);
            }
            if map.len() >= MAX_BUCKETS && !map.contains_key(webhook) {
                return;
            }
            let window = map.get(webhook).map_or(0, |b| b.window).max(ms);
            let limit = limit.or_else(|| map.get(webhook).and_then(|b| b.limit));
            let reset_at = now.saturating_add(ms);
            map.insert(
                webhook.to_owned(),
                Bucket {
                    remaining,
                    reset_at,
                    limit,
                    window,
                },
            );
        });
    }

    /// Waits `ms` on the service's clock.
    pub(crate) async fn wait(&self, ms: Millis) {
        self.clock.sleep_ms(ms).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_bucket_with_no_room_waits_for_its_reset() {
        let b = |remaining, reset_at| Bucket {
            remaining,
            reset_at,
            limit: None,
            window: 2_000,
        };
        let cases = [
            (b(1, 2_000), 1_000, None),
            (b(0, 2_000), 1_000, Some(1_000)),
            (b(0, 2_000), 2_000, None),
            (b(-1, 2_500), 1_000, Some(1_500)),
        ];
        for (bucket, now, expected) in cases {
            assert_eq!(bucket.wait(now), expected, "{bucket:?} at {now}");
        }
    }

    #[test]
    fn headers_and_429s_fill_the_bucket() {
        let buckets = Buckets::default();
        assert_eq!(buckets.take("1"), Ok(()), "unknown: no wait");
        let h = headers(&[
            ("x-ratelimit-remaining", "1"),
            ("x-ratelimit-reset-after", "1.5"),
        ]);
        buckets.observe("1", &h, None);
        assert_eq!(buckets.take("1"), Ok(()), "one left");
        let wait = buckets.take("1").expect_err("none left");
        assert!((1_400..=1_500).contains(&wait), "{wait}");
        assert_eq!(buckets.take("2"), Ok(()), "another webhook's bucket");
        buckets.observe("2", &HeaderMap::new(), Some(700));
        let wait = buckets.take("2").expect_err("a 429 empties it");
        assert!((600..=700).contains(&wait), "{wait}");
        buckets.observe("3", &headers(&[("x-ratelimit-remaining", "2")]), None);
        assert_eq!(buckets.take("3"), Ok(()), "no reset: nothing kept");
    }

    #[tokio::test]
    async fn after_a_reset_calls_are_counted_before_any_answer() {
        let clock = Clock::default();
        let buckets = Buckets::new(clock.clone());
        let h = headers(&[
            ("x-ratelimit-limit", "5"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset-after", "2"),
        ]);
        buckets.observe("1", &h, None);
        assert!(buckets.take("1").is_err(), "spent");
        clock.advance(std::time::Duration::from_millis(2_001));
        for i in 0..5 {
            assert_eq!(buckets.take("1"), Ok(()), "call {i} of the new window");
        }
        let wait = buckets.take("1").expect_err("the sixth waits");
        assert!((1_900..=2_000).contains(&wait), "{wait}");
    }
}
