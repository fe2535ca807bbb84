//! What Buildkite last told this function instance of its REST limit (`RateLimit-Remaining`,
//! `RateLimit-Reset`, a 429), shared by every call the instance makes: a call that would go
//! past it waits for the window's reset or is refused before it is sent. The reads that
//! finish a job may take the window's last calls; creates, cancels, the sweep's listings
//! and the agents list (fair share counts idle GPUs by it) all but [`FINISH_RESERVE`];
//! everything else (the pipeline check, profile links) leaves [`RESERVE`]. What is
//! refused is taken up later (`flow::catch_up`, the sweep).

use std::sync::Arc;

use reqwest::header::HeaderMap;

use crate::time::{Clock, Millis};
use crate::window::{Limiter, News, SharedWindows};

/// Calls of a window kept for creates and finishes.
pub(crate) const RESERVE: i64 = 10;
/// Calls of a window kept for finishes: one finish's reads (build, artifacts, download).
pub(crate) const FINISH_RESERVE: i64 = 3;
/// Buildkite's window, when an answer gave no reset to go by.
const WINDOW_MS: Millis = 60_000;
/// The longest reset believed: a larger one is a bad header, not a window.
pub(super) const MAX_RESET_SECS: i64 = 3_600;

/// Which calls come first when the window runs low.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Priority {
    /// Reading back a finished build and its result: a report waits on these.
    Finish,
    /// Creating a build (or looking up one whose create was unconfirmed), stopping one,
    /// the sweep's listings of builds, the agents list.
    Create,
    /// Anything that can wait for the next window.
    Routine,
}

impl Priority {
    /// Calls of the window this priority leaves to those above it.
    pub(crate) fn reserve(self) -> i64 {
        match self {
            Self::Finish => 0,
            Self::Create => FINISH_RESERVE,
            Self::Routine => RESERVE,
        }
    }
}

/// What an answer's `RateLimit-*` headers say of the window: the lower of the
/// organization's and the token's remaining requests, and the later reset. An answer without
/// both (an edge's 502) says nothing: what was told before stands until its reset.
fn news(headers: &HeaderMap) -> Option<News> {
    let (remaining, reset) = (lowest_remaining(headers)?, latest_reset(headers)?);
    Some(News::Told {
        remaining,
        limit: header(headers, &["ratelimit-limit", "ratelimit-user-limit"]),
        reset_after: reset.clamp(0, MAX_RESET_SECS) * 1000,
    })
}

/// A 429 and the reset it gave (else a minute, Buildkite's window).
fn refusal(reset_secs: Option<i64>) -> News {
    News::Refused {
        reset_after: reset_secs.map(|s| s.clamp(1, MAX_RESET_SECS) * 1000),
    }
}

fn numbers<'h>(headers: &'h HeaderMap, names: &'h [&str]) -> impl Iterator<Item = i64> + 'h {
    names
        .iter()
        .filter_map(|n| headers.get(*n)?.to_str().ok()?.trim().parse::<i64>().ok())
}

/// The lower of the organization's and the token's counts.
fn header(headers: &HeaderMap, names: &[&str]) -> Option<i64> {
    numbers(headers, names).min()
}

/// The fewer requests left of the organization's and the token's windows.
pub(super) fn lowest_remaining(headers: &HeaderMap) -> Option<i64> {
    header(
        headers,
        &["ratelimit-remaining", "ratelimit-user-remaining"],
    )
}

/// The later of the two windows' resets, in seconds: the lower count may be either's.
pub(super) fn latest_reset(headers: &HeaderMap) -> Option<i64> {
    numbers(headers, &["ratelimit-reset", "ratelimit-user-reset"]).max()
}

/// Buildkite's window as this instance and (where shared) every instance spend it; clones
/// share it.
#[derive(Clone, Debug)]
pub(crate) struct RateGate {
    limiter: Limiter,
}

impl Default for RateGate {
    fn default() -> Self {
        Self::new(Clock::default())
    }
}

impl RateGate {
    pub(crate) fn new(clock: Clock) -> Self {
        Self {
            // `RateLimit-Reset` is whole seconds.
            limiter: Limiter::new(clock, WINDOW_MS, 1_000),
        }
    }

    /// This gate on `clock`, anew (a shared window stays shared).
    pub(crate) fn with_clock(&self, clock: Clock) -> Self {
        Self {
            limiter: self.limiter.with_clock(clock),
        }
    }

    /// This gate, spending the window kept under `name` in `windows` with every instance.
    pub(crate) fn shared(self, windows: Arc<dyn SharedWindows>, name: String) -> Self {
        Self {
            limiter: self.limiter.shared(windows, name),
        }
    }

    /// Takes a call of `priority` if the window allows it; else the milliseconds to wait.
    pub(crate) async fn take(&self, priority: Priority) -> Result<(), Millis> {
        self.limiter.take(priority.reserve()).await
    }

    /// Whether a call of `priority` would be let go now, as this instance sees the window
    /// (nothing is taken).
    pub(crate) fn allows(&self, priority: Priority) -> bool {
        self.limiter.allows(priority.reserve())
    }

    /// The time on the service's clock: what a call sent now gives the answer's notes.
    pub(crate) fn now(&self) -> Millis {
        self.limiter.now()
    }

    /// Notes what the `RateLimit-*` headers of an answer to a call sent at `sent_at` say.
    pub(crate) async fn observe(&self, headers: &HeaderMap, sent_at: Millis) {
        match news(headers) {
            Some(news) => self.limiter.hear(news, sent_at).await,
            None => {
                self.limiter.replied(sent_at);
            }
        }
    }

    /// Notes that the call sent at `sent_at` ended without an answer that tells the window.
    pub(crate) fn answered(&self, sent_at: Millis) {
        self.limiter.answered(sent_at);
    }

    /// Notes a 429 (to a call sent at `sent_at`) and the reset it gave.
    pub(crate) async fn refused(&self, reset_secs: Option<i64>, sent_at: Millis) {
        self.limiter.hear(refusal(reset_secs), sent_at).await;
    }

    /// Waits `ms` on the service's clock.
    pub(crate) async fn wait(&self, ms: Millis) {
        self.limiter.wait(ms).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::Window;

    #[test]
    fn what_a_window_admits() {
        use Priority::*;
        let w = |remaining, reset_at| Window {
            remaining,
            reset_at,
            limit: Some(50),
            span: WINDOW_MS,
        };
        // (window, priority, now, expected)
        let cases = [
            (w(None, 0), Routine, 1_000, Ok(())),
            (w(Some(0), 30_000), Finish, 1_000, Err(29_000)),
            (w(Some(0), 30_000), Finish, 30_000, Ok(())),
            (w(Some(1), 30_000), Finish, 1_000, Ok(())),
            (w(Some(3), 30_000), Create, 1_000, Err(29_000)),
            (w(Some(4), 30_000), Create, 1_000, Ok(())),
            (w(Some(3), 30_000), Finish, 1_000, Ok(())),
            (w(Some(11), 30_000), Routine, 1_000, Ok(())),
            (w(Some(10), 30_000), Routine, 1_000, Err(29_000)),
            (w(Some(10), 30_000), Create, 1_000, Ok(())),
            (w(Some(3), 30_000), Routine, 31_000, Ok(())),
        ];
        for (window, priority, now, expected) in cases {
            assert_eq!(
                window.admits(priority.reserve(), now),
                expected,
                "{window:?} {priority:?} at {now}"
            );
        }
    }

    #[tokio::test]
    async fn the_lower_count_and_the_later_reset_of_the_two_windows_are_kept() {
        let clock = Clock::default();
        let gate = RateGate::new(clock.clone());
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("ratelimit-remaining", "30"),
            ("ratelimit-user-remaining", "0"),
            ("ratelimit-reset", "5"),
            ("ratelimit-user-reset", "40"),
        ] {
            headers.insert(name, value.parse().unwrap());
        }
        gate.observe(&headers, gate.now()).await;
        clock.advance(std::time::Duration::from_secs(39));
        assert!(
            !gate.allows(Priority::Finish),
            "the token's window is still spent"
        );
        clock.advance(std::time::Duration::from_secs(1));
        assert!(gate.allows(Priority::Finish));
    }

    #[test]
    fn answers_refusals_and_resets_set_the_window() {
        let told = |pairs: &[(&'static str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, v.parse().unwrap());
            }
            news(&h)
        };
        let mut w = Window::of_span(WINDOW_MS);
        let answer = [
            ("ratelimit-remaining", "12"),
            ("ratelimit-limit", "50"),
            ("ratelimit-reset", "40"),
        ];
        w.hear(told(&answer).unwrap(), 1_000, 0);
        assert_eq!((w.remaining, w.reset_at), (Some(12), 41_000));
        w.take(0, 1_000, 0).unwrap();
        assert_eq!(w.remaining, Some(11));
        w.roll(41_000, 0);
        assert_eq!(
            (w.remaining, w.reset_at),
            (Some(50), 101_000),
            "a new window of the limit, counted before any answer"
        );
        assert_eq!(
            told(&[("ratelimit-limit", "50")]),
            None,
            "an answer without the headers changes nothing"
        );
        let huge = i64::MAX.to_string();
        let answer = [("ratelimit-remaining", "5"), ("ratelimit-reset", &huge)];
        w.hear(told(&answer).unwrap(), 2_000, 0);
        assert_eq!(
            w.reset_at,
            2_000 + 3_600_000,
            "a reset past an hour is a bad header"
        );
        let mut w = Window::of_span(WINDOW_MS);
        w.hear(refusal(Some(7)), 2_000, 0);
        assert_eq!(w.admits(Priority::Finish.reserve(), 8_999), Err(1));
        w.hear(refusal(None), 0, 0);
        assert_eq!(
            w.reset_at, 60_000,
            "a 429 without a reset: Buildkite's minute"
        );
    }
}
