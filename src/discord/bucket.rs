//! Discord's per-webhook rate limit as its answers tell it (`X-RateLimit-Remaining`,
//! `X-RateLimit-Reset-After`, a 429's `retry_after`): one window per webhook, the model
//! Buildkite's limit uses too, kept by this instance and (where the deployment shares them)
//! spent together with every instance. A call the bucket has no room for waits for its
//! reset, or is not sent; calls of lower priority leave room to those above them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use reqwest::header::HeaderMap;

use crate::time::{Clock, Millis};
use crate::window::{Limiter, News, SharedWindows};

/// Webhooks remembered at most; buckets whose reset has passed are dropped first.
const MAX_BUCKETS: usize = 1_000;

/// Which messages come first when a webhook's bucket runs low: a final report may take its
/// last call; each below leaves one more to those above it. A place edit is sent only while
/// the bucket has room and never waits: the next place, the start or the report replaces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    /// A job's final report.
    Final,
    /// A job's first message.
    First,
    /// A build created or started.
    Start,
    /// A waiting job's place in its queue.
    Place,
}

impl Priority {
    /// Calls of the bucket this priority leaves to those above it.
    pub(crate) fn reserve(self) -> i64 {
        match self {
            Self::Final => 0,
            Self::First => 1,
            Self::Start => 2,
            Self::Place => 3,
        }
    }

    /// Whether a call of this priority waits for room (else it is not sent).
    pub(crate) fn waits(self) -> bool {
        self != Self::Place
    }
}

/// Seconds (Discord sends fractions) as milliseconds.
fn millis(headers: &HeaderMap, name: &str) -> Option<Millis> {
    let secs: f64 = headers.get(name)?.to_str().ok()?.trim().parse().ok()?;
    // A wait past an hour is a bad header, not a bucket.
    (secs.is_finite() && secs >= 0.0).then(|| (secs.min(3_600.0) * 1000.0).ceil() as Millis)
}

/// What an answer's headers (and a 429's `retry_after`) say of its bucket.
fn news(headers: &HeaderMap, retry_after: Option<Millis>) -> Option<News> {
    let number = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok()?.trim().parse::<i64>().ok())
    };
    if let Some(ms) = retry_after {
        return Some(News::Refused {
            reset_after: Some(ms.clamp(0, 3_600_000)),
        });
    }
    Some(News::Told {
        remaining: number("x-ratelimit-remaining")?,
        limit: number("x-ratelimit-limit"),
        reset_after: millis(headers, "x-ratelimit-reset-after")?,
    })
}

/// Each webhook's bucket; clones share them.
#[derive(Clone, Default)]
pub(crate) struct Buckets {
    map: Arc<Mutex<HashMap<String, Limiter>>>,
    clock: Clock,
    shared: Option<Arc<dyn SharedWindows>>,
}

impl std::fmt::Debug for Buckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buckets")
            .field("shared", &self.shared.is_some())
            .finish_non_exhaustive()
    }
}

impl Buckets {
    pub(crate) fn new(clock: Clock) -> Self {
        Self {
            map: Arc::default(),
            clock,
            shared: None,
        }
    }

    /// These buckets anew on `clock`, shared as they were.
    pub(crate) fn with_clock(&self, clock: Clock) -> Self {
        Self {
            shared: self.shared.clone(),
            ..Self::new(clock)
        }
    }

    /// These buckets, spent together with every instance through `windows`.
    pub(crate) fn shared(mut self, windows: Arc<dyn SharedWindows>) -> Self {
        self.shared = Some(windows);
        self
    }

    /// `webhook`'s bucket (made if new, where the map has room or may make it).
    fn bucket(&self, webhook: &str) -> Option<Limiter> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = map.get(webhook) {
            return Some(b.clone());
        }
        if map.len() >= MAX_BUCKETS {
            let now = self.clock.now();
            map.retain(|_, b| b.view().reset_at > now);
        }
        if map.len() >= MAX_BUCKETS {
            return None;
        }
        // Discord tells resets in milliseconds.
        let mut b = Limiter::new(self.clock.clone(), 0, 1);
        if let Some(w) = &self.shared {
            b = b.shared(w.clone(), format!("discord/{webhook}"));
        }
        map.insert(webhook.to_owned(), b.clone());
        Some(b)
    }

    /// Takes a call of `priority` to `webhook`, or says how long to wait for room.
    pub(crate) async fn take(&self, webhook: &str, priority: Priority) -> Result<(), Millis> {
        match self.bucket(webhook) {
            Some(b) => b.take(priority.reserve()).await,
            None => Ok(()),
        }
    }

    /// How many calls of `priority` `webhook`'s bucket has room for now, as this instance
    /// sees it (nothing is taken; `i64::MAX` where nothing was told).
    pub(crate) fn room(&self, webhook: &str, priority: Priority) -> i64 {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.get(webhook)
            .map_or(i64::MAX, |b| b.room(priority.reserve()))
    }

    /// The time on the service's clock: what a call sent now gives [`Self::observe`].
    pub(crate) fn now(&self) -> Millis {
        self.clock.now()
    }

    /// Notes the bucket headers of an answer to a call sent at `sent_at`; a 429
    /// (`retry_after` in its body) empties it.
    pub(crate) async fn observe(
        &self,
        webhook: &str,
        (headers, retry_after): (&HeaderMap, Option<Millis>),
        sent_at: Millis,
    ) {
        let Some(b) = self.bucket(webhook) else {
            return;
        };
        match news(headers, retry_after) {
            Some(news) => b.hear(news, sent_at).await,
            None => {
                b.replied(sent_at);
            }
        }
    }

    /// Notes an answer to a call sent at `sent_at` that says nothing of the bucket (another
    /// failure's headers may be of another bucket): the call is no longer on its way.
    pub(crate) fn answered(&self, webhook: &str, sent_at: Millis) {
        if let Some(b) = self.bucket(webhook) {
            b.answered(sent_at);
        }
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
        use crate::window::Window;
        let b = |remaining, reset_at| Window {
            remaining: Some(remaining),
            reset_at,
            limit: None,
            span: 2_000,
        };
        let cases = [
            (b(1, 2_000), 1_000, None),
            (b(0, 2_000), 1_000, Some(1_000)),
            (b(0, 2_000), 2_000, None),
            (b(-1, 2_500), 1_000, Some(1_500)),
        ];
        for (bucket, now, expected) in cases {
            let wait = bucket.admits(Priority::Final.reserve(), now).err();
            assert_eq!(wait, expected, "{bucket:?} at {now}");
        }
    }

    #[test]
    fn each_priority_leaves_room_to_those_above_it() {
        use Priority::*;
        // (calls left in the bucket, the priorities it lets go)
        let cases = [
            (5, vec![Final, First, Start, Place]),
            (4, vec![Final, First, Start, Place]),
            (3, vec![Final, First, Start]),
            (2, vec![Final, First]),
            (1, vec![Final]),
            (0, vec![]),
        ];
        let window = |remaining| crate::window::Window {
            remaining: Some(remaining),
            reset_at: 2_000,
            limit: Some(5),
            span: 2_000,
        };
        for (left, expected) in cases {
            let admitted: Vec<Priority> = [Final, First, Start, Place]
                .into_iter()
                .filter(|p| window(left).admits(p.reserve(), 0).is_ok())
                .collect();
            assert_eq!(admitted, expected, "{left} left");
        }
        assert!(!Place.waits() && Start.waits() && Final.waits());
    }

    #[tokio::test]
    async fn headers_and_429s_fill_the_bucket() {
        let buckets = Buckets::default();
        assert_eq!(
            buckets.take("1", Priority::Final).await,
            Ok(()),
            "unknown: no wait"
        );
        let h = headers(&[
            ("x-ratelimit-remaining", "1"),
            ("x-ratelimit-reset-after", "1.5"),
        ]);
        buckets.observe("1", (&h, None), buckets.now()).await;
        assert_eq!(buckets.take("1", Priority::Final).await, Ok(()), "one left");
        let wait = buckets
            .take("1", Priority::Final)
            .await
            .expect_err("none left");
        assert!((1_400..=1_500).contains(&wait), "{wait}");
        assert_eq!(
            buckets.take("2", Priority::Final).await,
            Ok(()),
            "another webhook's bucket"
        );
        buckets
            .observe("2", (&HeaderMap::new(), Some(700)), buckets.now())
            .await;
        let wait = buckets
            .take("2", Priority::Final)
            .await
            .expect_err("a 429 empties it");
        assert!((600..=700).contains(&wait), "{wait}");
        buckets
            .observe(
                "3",
                (&headers(&[("x-ratelimit-remaining", "2")]), None),
                buckets.now(),
            )
            .await;
        assert_eq!(
            buckets.take("3", Priority::Final).await,
            Ok(()),
            "no reset: nothing kept"
        );
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
        buckets.observe("1", (&h, None), buckets.now()).await;
        assert!(buckets.take("1", Priority::Final).await.is_err(), "spent");
        clock.advance(std::time::Duration::from_millis(2_001));
        for i in 0..5 {
            assert_eq!(
                buckets.take("1", Priority::Final).await,
                Ok(()),
                "call {i} of the new window"
            );
        }
        let wait = buckets
            .take("1", Priority::Final)
            .await
            .expect_err("the sixth waits");
        assert!((1_900..=2_000).contains(&wait), "{wait}");
    }
}
