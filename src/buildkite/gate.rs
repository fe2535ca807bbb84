//! What Buildkite last told this function instance of its REST limit (`RateLimit-Remaining`,
//! `RateLimit-Reset`, a 429), shared by every call the instance makes: a call that would go
//! past it waits for the window's reset or is refused before it is sent. The reads that
//! finish a job may take the window's last calls; creates, cancels, the sweep's listings
//! and the agents list (fair share counts idle GPUs by it) all but [`FINISH_RESERVE`];
//! everything else (the pipeline check, profile links) leaves [`RESERVE`]. What is
//! refused is taken up later (`flow::catch_up`, the sweep).

use std::sync::{Arc, Mutex};

use reqwest::header::HeaderMap;

use crate::time::{Clock, Millis};

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

/// The window as last told: requests left, and when it resets (on the service's clock);
/// with the limit, so that calls made after the reset, before any answer, are counted too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) remaining: Option<i64>,
    pub(crate) reset_at: Millis,
    pub(crate) limit: Option<i64>,
}

impl Window {
    /// `Ok` if a call of `priority` may be sent at `now`, else how long until the window
    /// resets (milliseconds).
    pub(crate) fn admits(&self, priority: Priority, now: Millis) -> Result<(), Millis> {
        let Some(remaining) = self.remaining else {
            return Ok(());
        };
        if now >= self.reset_at {
            return Ok(());
        }
        let reserve = match priority {
            Priority::Finish => 0,
            Priority::Create => FINISH_RESERVE,
            Priority::Routine => RESERVE,
        };
        if remaining > reserve {
            Ok(())
        } else {
            Err(self.reset_at - now)
        }
    }

    /// Past the reset, a new window of the known limit begins: counted from here.
    fn roll(&mut self, now: Millis) {
        if self.remaining.is_some() && now >= self.reset_at {
            self.remaining = self.limit;
            self.reset_at = now + WINDOW_MS;
        }
    }

    /// A call is on its way: one fewer left, until the answer says how many.
    fn sent(&mut self) {
        if let Some(r) = &mut self.remaining {
            *r -= 1;
        }
    }

    /// What an answer said: the lower of the organization's and the token's remaining
    /// requests, and the seconds to the reset. An answer without both (an edge's 502) says
    /// nothing of the window: what was told before stands until its reset.
    fn told(
        &mut self,
        (remaining, limit): (Option<i64>, Option<i64>),
        reset_secs: Option<i64>,
        now: Millis,
    ) {
        if let (Some(r), Some(secs)) = (remaining, reset_secs) {
            self.remaining = Some(r);
            self.reset_at = now.saturating_add(secs.clamp(0, MAX_RESET_SECS) * 1000);
            self.limit = limit;
        }
    }

    /// A 429: nothing left until the reset it gave (else a minute, Buildkite's window).
    fn refused(&mut self, reset_secs: Option<i64>, now: Millis) {
        self.remaining = Some(0);
        let ms = reset_secs.map_or(WINDOW_MS, |s| s.clamp(1, MAX_RESET_SECS) * 1000);
        self.reset_at = now.saturating_add(ms);
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

/// One instance's view of the limit; clones share it.
#[derive(Clone, Debug, Default)]
pub(crate) struct RateGate {
    window: Arc<Mutex<Window>>,
    clock: Clock,
}

impl RateGate {
    pub(crate) fn new(clock: Clock) -> Self {
        Self {
            window: Arc::default(),
            clock,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Window, Millis) -> T) -> T {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut w, self.clock.now())
    }

    /// Takes a call of `priority` if the window allows it; else the milliseconds to wait.
    pub(crate) fn take(&self, priority: Priority) -> Result<(), Millis> {
        self.with(|w, now| {
            w.roll(now);
            w.admits(priority, now)?;
            w.sent();
            Ok(())
        })
    }

    /// Whether a call of `priority` would be let go now (nothing is taken).
    pub(crate) fn allows(&self, priority: Priority) -> bool {
        self.with(|w, now| {
            w.roll(now);
            w.admits(priority, now).is_ok()
        })
    }

    /// Notes what an answer's `RateLimit-*` headers say.
    pub(crate) fn observe(&self, headers: &HeaderMap) {
        let remaining = lowest_remaining(headers);
        let limit = header(headers, &["ratelimit-limit", "ratelimit-user-limit"]);
        let reset = latest_reset(headers);
        self.with(|w, now| w.told((remaining, limit), reset, now));
    }

    /// Notes a 429 and the reset it gave.
    pub(crate) fn refused(&self, reset_secs: Option<i64>) {
        self.with(|w, now| w.refused(reset_secs, now));
    }

    /// Waits `ms` on the service's clock.
    pub(crate) async fn wait(&self, ms: Millis) {
        self.clock.sleep_ms(ms).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_window_admits() {
        use Priority::*;
        let w = |remaining, reset_at| Window {
            remaining,
            reset_at,
            limit: Some(50),
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
                window.admits(priority, now),
                expected,
                "{window:?} {priority:?} at {now}"
            );
        }
    }

    #[test]
    fn the_lower_count_and_the_later_reset_of_the_two_windows_are_kept() {
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
        gate.observe(&headers);
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
        let mut w = Window::default();
        w.told((Some(12), Some(50)), Some(40), 1_000);
        assert_eq!((w.remaining, w.reset_at), (Some(12), 41_000));
        w.sent();
        assert_eq!(w.remaining, Some(11));
        w.roll(41_000);
        assert_eq!(
            (w.remaining, w.reset_at),
            (Some(50), 101_000),
            "a new window of the limit, counted before any answer"
        );
        let before = w;
        w.told((None, None), None, 2_000);
        assert_eq!(w, before, "an answer without the headers changes nothing");
        w.told((Some(5), Some(50)), Some(i64::MAX), 2_000);
        assert_eq!(
            w.reset_at,
            2_000 + 3_600_000,
            "a reset past an hour is a bad header"
        );
        let mut w = Window::default();
        w.refused(Some(7), 2_000);
        assert_eq!(w.admits(Priority::Finish, 8_999), Err(1));
        w.refused(None, 0);
        assert_eq!(
            w.reset_at, 60_000,
            "a 429 without a reset: Buildkite's minute"
        );
    }
}
