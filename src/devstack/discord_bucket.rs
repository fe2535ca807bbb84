//! Discord's per-webhook rate limit as the stand-in enforces it: `calls` per `window` for
//! each webhook, counted on the stand-in's clock, told in `X-RateLimit-*` headers on every
//! answer and refused past it with a 429 whose body gives `retry_after` in seconds.

use std::collections::HashMap;

use axum::http::HeaderValue;
use axum::response::Response;

use crate::time::{Clock, Millis};

/// Webhook buckets, one window each.
#[derive(Debug)]
pub(super) struct WebhookLimit {
    calls: u32,
    window: Millis,
    clock: Clock,
    /// Per webhook: when its window started, and the calls taken in it.
    windows: HashMap<String, (Millis, u32)>,
    /// Calls refused with a 429.
    pub(super) refused: usize,
    /// The most calls any webhook made in one window.
    pub(super) busiest: u32,
}

/// What the bucket said of one call.
pub(super) struct Told {
    pub(super) allowed: bool,
    remaining: u32,
    limit: u32,
    reset_after: f64,
    reset: f64,
    bucket: String,
}

impl Told {
    /// Seconds until the bucket has room again.
    pub(super) fn retry_after(&self) -> f64 {
        self.reset_after
    }

    /// Puts Discord's headers on `resp`.
    pub(super) fn stamp(&self, resp: &mut Response) {
        let h = resp.headers_mut();
        let values = [
            ("x-ratelimit-limit", self.limit.to_string()),
            ("x-ratelimit-remaining", self.remaining.to_string()),
            ("x-ratelimit-reset", format!("{:.3}", self.reset)),
            (
                "x-ratelimit-reset-after",
                format!("{:.3}", self.reset_after),
            ),
            ("x-ratelimit-bucket", self.bucket.clone()),
        ];
        for (name, value) in values {
            if let Ok(v) = HeaderValue::from_str(&value) {
                h.insert(name, v);
            }
        }
    }
}

impl WebhookLimit {
    pub(super) fn new(calls: u32, window: Millis, clock: Clock) -> Self {
        Self {
            calls,
            window,
            clock,
            windows: HashMap::new(),
            refused: 0,
            busiest: 0,
        }
    }

    /// Takes a call to `webhook` if its window has room.
    pub(super) fn take(&mut self, webhook: &str) -> Told {
        let now = self.clock.now();
        let (start, used) = self.windows.entry(webhook.to_owned()).or_insert((now, 0));
        if now >= *start + self.window {
            (*start, *used) = (now, 0);
        }
        let allowed = *used < self.calls;
        if allowed {
            *used += 1;
            self.busiest = self.busiest.max(*used);
        } else {
            self.refused += 1;
        }
        let reset_at = *start + self.window;
        Told {
            allowed,
            remaining: self.calls - *used,
            limit: self.calls,
            reset_after: (reset_at - now) as f64 / 1000.0,
            reset: reset_at as f64 / 1000.0,
            bucket: format!("{:x}", fxhash(webhook)),
        }
    }
}

/// A stable stand-in for Discord's opaque bucket id.
fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}
