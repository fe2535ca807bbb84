//! One model of a service's rate-limit window, for Buildkite's REST limit and each Discord
//! webhook's bucket alike: the calls left and when the window resets (as the service's
//! answers tell it, each through its own header adapter), the limit and the window's length,
//! so that calls made after a reset, before any answer, are counted too. A call of lower
//! priority leaves a reserve of the window to those above it. The service counts a call when
//! it arrives: the calls still on their way are counted in any window an answer tells of and
//! in the next one.
//!
//! A [`Limiter`] keeps one instance's view and, where the deployment shares one, spends the
//! window every instance spends ([`SharedWindows`], kept in the store by compare-and-swap):
//! together they stay within it, where each alone would meet the others' 429s. The shared
//! entry ([`SharedWindow`]) also keeps when its latest calls were taken, so that the calls
//! another instance has on their way at a reset count in the next window too.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::BoxError;
use crate::time::{Clock, Millis};

/// How long a call waits (at least, jittered up to twice) when the shared window could not
/// be read.
const UNREAD_WAIT_MS: Millis = 100;

/// A call unanswered this long is taken to have failed on its way (longer than any call's
/// timeout; a call that ends unanswered is let go at once: this is for one cut short).
const ANSWER_WITHIN_MS: Millis = 15_000;

/// Take times a shared window keeps of its latest calls (every instance's): enough for a
/// Discord bucket's calls in flight at once; Buildkite's minute also counts each taker's own.
const RECENT_KEPT: usize = 8;

/// How far ahead of this instance's clock a take time in a shared window may be (another
/// instance's clock); one further ahead is not counted.
const CLOCK_SKEW_MS: Millis = 1_000;

/// The longest window learned from resets (Buildkite's is a minute, Discord's buckets a few
/// seconds); a service's own window (given at construction) may be longer.
const MAX_SPAN_MS: Millis = 60_000;

/// A window as last told.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Window {
    /// Calls left; `None` while nothing was told (every call is let go).
    pub(crate) remaining: Option<i64>,
    /// When the window resets, on the service's clock.
    pub(crate) reset_at: Millis,
    /// Calls a window allows, once told.
    pub(crate) limit: Option<i64>,
    /// The window's length: the longest reset told, or the service's known window.
    pub(crate) span: Millis,
}

/// What one answer said of the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum News {
    /// Calls left, the limit if given, and the time to the reset (milliseconds).
    Told {
        remaining: i64,
        limit: Option<i64>,
        reset_after: Millis,
    },
    /// A 429: nothing left until the reset it gave (`None`: the window's length).
    Refused { reset_after: Option<Millis> },
}

impl Window {
    /// A window nothing was told of, `span` long once it is.
    pub(crate) fn of_span(span: Millis) -> Self {
        Self {
            span,
            ..Self::default()
        }
    }

    /// The longest a window is believed to be: a longer reset is one window's wait (a 429's,
    /// or a bad header), never the length of every window after it.
    fn cap(&self) -> Millis {
        MAX_SPAN_MS.max(self.span)
    }

    /// `Ok` if a call that leaves `reserve` calls to others may be sent at `now`, else how
    /// long until the window resets (milliseconds).
    pub(crate) fn admits(&self, reserve: i64, now: Millis) -> Result<(), Millis> {
        let Some(remaining) = self.remaining else {
            return Ok(());
        };
        if now >= self.reset_at || remaining > reserve {
            Ok(())
        } else {
            Err(self.reset_at - now)
        }
    }

    /// Past the reset, a new window of the known limit begins: counted from here, less the
    /// calls still `on_the_way` (the service counts a call when it arrives: one taken before
    /// this reset may land after the service's).
    pub(crate) fn roll(&mut self, now: Millis, on_the_way: i64) {
        if self.remaining.is_some() && now >= self.reset_at {
            self.remaining = self.limit.map(|l| l - on_the_way.max(0));
            self.reset_at = now.saturating_add(self.span);
        }
    }

    /// Takes a call that leaves `reserve` (with `on_the_way` calls unanswered), or says how
    /// long to wait for room.
    pub(crate) fn take(
        &mut self,
        reserve: i64,
        now: Millis,
        on_the_way: i64,
    ) -> Result<(), Millis> {
        self.roll(now, on_the_way);
        self.admits(reserve, now)?;
        if let Some(r) = &mut self.remaining {
            *r -= 1;
        }
        Ok(())
    }

    /// Notes what an answer said at `now`, `on_the_way` other calls still unanswered. The
    /// calls it tells are left less those on their way: the service counts a call when it
    /// arrives, and where windows begin with a call's arrival and a reset is learned an
    /// answer's way late, this window's calls may land in the service's next one. Within
    /// the window held, the fewer calls left and the later reset are kept (the answer
    /// arrives after the service measured its reset). A reset well past the held one is a
    /// later window: taken as told.
    pub(crate) fn hear(&mut self, news: News, now: Millis, on_the_way: i64) {
        match news {
            News::Told {
                remaining,
                limit,
                reset_after,
            } => {
                let reset_at = now.saturating_add(reset_after.max(0));
                let remaining = remaining - on_the_way.max(0);
                self.limit = limit.or(self.limit);
                let held = self.remaining.filter(|_| now < self.reset_at);
                let half = self.span / 2;
                let later = reset_at >= self.reset_at.saturating_add(half);
                let earlier = reset_at < self.reset_at.saturating_sub(half);
                match held {
                    // An answer to a call sent before this window began (its reset is the
                    // one this window followed): it says nothing of this window.
                    Some(_) if earlier => {}
                    Some(held) if !later => {
                        self.remaining = Some(held.min(remaining));
                        self.reset_at = self.reset_at.max(reset_at);
                    }
                    _ => {
                        self.remaining = Some(remaining);
                        self.reset_at = reset_at;
                        // A reset told at a window's start is its length (up to the cap).
                        self.span = self.span.max(reset_after.min(self.cap()));
                    }
                }
            }
            News::Refused { reset_after } => {
                let after = reset_after.unwrap_or(self.span).max(1);
                let held = self.remaining.is_some() && now < self.reset_at;
                let reset_at = now.saturating_add(after);
                self.remaining = Some(0);
                // A 429 does not shorten a reset already held.
                self.reset_at = if held {
                    self.reset_at.max(reset_at)
                } else {
                    reset_at
                };
            }
        }
    }
}

/// A window as every instance spends it (the store's entry): the window, and when its latest
/// calls were taken. An instance knows only its own calls on their way; at a reset, another's
/// taken within a round trip of it may land in the service's next window as well, and the
/// first to take there counts them too (where each counted only its own, the two together
/// met 429s in the rush).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SharedWindow {
    #[serde(flatten)]
    window: Window,
    /// Take times of the latest calls (at most [`RECENT_KEPT`]), oldest first. A list, not
    /// an array: an entry of another length (another version's) still reads.
    #[serde(default)]
    recent: Vec<Millis>,
}

impl SharedWindow {
    /// A window nothing was told of, `span` long once it is.
    pub(crate) fn of_span(span: Millis) -> Self {
        Self {
            window: Window::of_span(span),
            recent: Vec::new(),
        }
    }

    /// Calls taken after `since` and not after `now` (a time ahead of the clock, another
    /// instance's skew or a bad entry, would count at every reset and never leave).
    fn taken_between(&self, since: Millis, now: Millis) -> i64 {
        let ahead = now.saturating_add(CLOCK_SKEW_MS);
        self.recent
            .iter()
            .filter(|&&at| at > since && at <= ahead)
            .count() as i64
    }

    /// Takes a call that leaves `reserve`, `on_the_way` of the taker's unanswered and its
    /// calls' `round_trip` (the longest it has seen lately), or says how long to wait. At a
    /// reset the calls on their way are the more of the taker's own and every instance's
    /// taken within a round trip of it in the window that ends (one taken earlier lands in
    /// that window, or was counted at the reset before).
    pub(crate) fn take(
        &mut self,
        reserve: i64,
        now: Millis,
        (on_the_way, round_trip): (i64, Millis),
    ) -> Result<(), Millis> {
        let w = &self.window;
        let since = now
            .saturating_sub(round_trip.clamp(0, w.span))
            .max(w.reset_at.saturating_sub(w.span));
        let on_the_way = on_the_way.max(self.taken_between(since, now));
        self.window.take(reserve, now, on_the_way)?;
        if self.recent.len() >= RECENT_KEPT {
            let extra = self.recent.len() + 1 - RECENT_KEPT;
            self.recent.drain(..extra);
        }
        self.recent.push(now);
        Ok(())
    }

    /// Notes what an answer to a call sent at `sent_at` said at `now`, `on_the_way` of the
    /// hearer's unanswered. The calls any instance took after it most likely reached the
    /// service after it: not counted in what it told.
    pub(crate) fn hear(&mut self, news: News, (now, sent_at): (Millis, Millis), on_the_way: i64) {
        let taken_after = self.taken_between(sent_at, now);
        self.window.hear(news, now, on_the_way.max(taken_after));
    }
}

/// Whether an answer that moved this instance's view from `before` to `after` is news to
/// the others: a 429, fewer calls left, or a reset later by at least the `grain` the
/// service tells resets in. Resets told in whole seconds move by up to a second: not news.
/// One told finely is: a bucket of two seconds whose reset the others hold a few hundred
/// milliseconds early lets their next window's calls go before the service's has begun.
fn worth_telling(news: News, (before, after): (&Window, &Window), grain: Millis) -> bool {
    let refused = matches!(news, News::Refused { .. });
    let fewer = after.remaining < before.remaining || before.remaining.is_none();
    let later = after.reset_at >= before.reset_at.saturating_add(grain);
    refused || fewer || later
}

/// The windows every instance shares, by name (the store keeps them).
#[async_trait]
pub(crate) trait SharedWindows: Send + Sync {
    /// Takes a call that leaves `reserve` from the window `name` (one `span` long when it
    /// is new), `on_the_way` calls of the taker's unanswered and its calls' `round_trip`:
    /// `Ok(Err(ms))` when it has no room for that long.
    async fn take(
        &self,
        name: &str,
        span: Millis,
        (reserve, on_the_way, round_trip): (i64, i64, Millis),
        now: Millis,
    ) -> Result<Result<(), Millis>, BoxError>;

    /// Notes what an answer to a call sent at `sent_at` said of the window `name`,
    /// `on_the_way` other calls of the hearer's unanswered.
    async fn hear(
        &self,
        name: &str,
        span: Millis,
        (news, on_the_way, sent_at): (News, i64, Millis),
        now: Millis,
    ) -> Result<(), BoxError>;
}

/// A shared window and the name it is kept under.
#[derive(Clone)]
struct Shared {
    windows: Arc<dyn SharedWindows>,
    name: String,
}

/// One window as this instance sees it, and (where there is one) as every instance spends it.
#[derive(Clone)]
pub(crate) struct Limiter {
    local: Arc<Mutex<Window>>,
    shared: Option<Shared>,
    clock: Clock,
    /// How finely the service tells its resets: a reset later by less is not news.
    grain: Millis,
    /// When each call this instance sent and has not heard back on was taken, oldest first.
    unanswered: Arc<Mutex<VecDeque<Millis>>>,
    /// The round trips of this instance's latest answered calls, oldest first.
    round_trips: Arc<Mutex<VecDeque<Millis>>>,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("local", &self.view())
            .field("shared", &self.shared.as_ref().map(|s| &s.name))
            .finish()
    }
}

impl Limiter {
    /// A window of `span` that this instance alone keeps, on `clock`, whose service tells
    /// its resets to `grain` milliseconds (Buildkite whole seconds, Discord milliseconds).
    pub(crate) fn new(clock: Clock, span: Millis, grain: Millis) -> Self {
        Self {
            local: Arc::new(Mutex::new(Window::of_span(span))),
            shared: None,
            clock,
            grain: grain.max(1),
            unanswered: Arc::default(),
            round_trips: Arc::default(),
        }
    }

    /// This window anew on `clock`, shared as it was.
    pub(crate) fn with_clock(&self, clock: Clock) -> Self {
        let span = self.view().span;
        Self {
            shared: self.shared.clone(),
            ..Self::new(clock, span, self.grain)
        }
    }

    /// This window, spent together with every instance through `windows` under `name`.
    pub(crate) fn shared(mut self, windows: Arc<dyn SharedWindows>, name: String) -> Self {
        self.shared = Some(Shared { windows, name });
        self
    }

    fn with<T>(&self, f: impl FnOnce(&mut Window, Millis) -> T) -> T {
        let mut w = self.local.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut w, self.clock.now())
    }

    /// This instance's view of the window.
    pub(crate) fn view(&self) -> Window {
        self.with(|w, _| *w)
    }

    /// Whether this instance's view has room for a call that leaves `reserve` (nothing
    /// is taken).
    pub(crate) fn allows(&self, reserve: i64) -> bool {
        self.room(reserve) > 0
    }

    /// How many calls that leave `reserve` this instance's view has room for now
    /// (`i64::MAX` while nothing was told).
    pub(crate) fn room(&self, reserve: i64) -> i64 {
        let on_the_way = self.on_the_way(self.clock.now(), None);
        self.with(|w, now| {
            w.roll(now, on_the_way);
            match w.remaining {
                Some(r) if now < w.reset_at => (r - reserve).max(0),
                _ => i64::MAX,
            }
        })
    }

    /// The time on the service's clock: what a call sent now gives [`Self::hear`].
    pub(crate) fn now(&self) -> Millis {
        self.clock.now()
    }

    /// Calls of this instance still on their way at `now` (after forgetting those unanswered
    /// too long); `answered`: the call sent at that time ended now, and only the calls taken
    /// after it count (the service most likely counted those before it), and whether the
    /// service answered it (then its round trip is noted: a failure's time says nothing of
    /// how long calls take, and a timeout's would hold back whole windows).
    fn on_the_way(&self, now: Millis, answered: Option<(Millis, bool)>) -> i64 {
        let mut calls = self.unanswered.lock().unwrap_or_else(|p| p.into_inner());
        calls.retain(|&at| now - at < ANSWER_WITHIN_MS);
        let Some((sent_at, replied)) = answered else {
            return calls.len() as i64;
        };
        // Its own entry (taken just before it was sent), else the oldest.
        let own = calls.iter().rposition(|&at| at <= sent_at);
        let taken_at = calls.remove(own.unwrap_or(0));
        let after = calls.iter().filter(|&&at| at > sent_at).count() as i64;
        drop(calls);
        if let (true, Some(_), Some(taken_at)) = (replied, own, taken_at) {
            self.note_round_trip(now - taken_at);
        }
        after
    }

    /// Notes how long a call took from its take to its answer (the store's write included).
    fn note_round_trip(&self, ms: Millis) {
        let mut trips = self.round_trips.lock().unwrap_or_else(|p| p.into_inner());
        if trips.len() >= RECENT_KEPT {
            trips.pop_front();
        }
        // Bounded here; the shared window counts no further back than its own length.
        trips.push_back(ms.clamp(0, ANSWER_WITHIN_MS));
    }

    /// Notes a call taken at `now`: on its way until heard back.
    fn sent(&self, now: Millis) {
        let mut calls = self.unanswered.lock().unwrap_or_else(|p| p.into_inner());
        calls.push_back(now);
    }

    /// Takes a call that leaves `reserve`, or says how long to wait for room. A window this
    /// instance knows to be spent costs no store read; the shared one decides the rest.
    pub(crate) async fn take(&self, reserve: i64) -> Result<(), Millis> {
        let on_the_way = self.on_the_way(self.clock.now(), None);
        self.with(|w, now| {
            w.roll(now, on_the_way);
            w.admits(reserve, now)
        })?;
        let Some(s) = &self.shared else {
            let taken = self.with(|w, now| w.take(reserve, now, on_the_way).map(|()| now));
            return taken.map(|now| self.sent(now));
        };
        let (span, now) = (self.view().span, self.clock.now());
        match s
            .windows
            .take(&s.name, span, (reserve, on_the_way, self.round_trip()), now)
            .await
        {
            Ok(Ok(())) => {
                // Taken where every instance counts: this view counts it too.
                self.with(|w, now| {
                    w.roll(now, on_the_way);
                    w.remaining = w.remaining.map(|r| r - 1);
                });
                self.sent(now);
                Ok(())
            }
            Ok(Err(wait)) => Err(wait),
            // Others kept changing it (a burst), or the store is down (then the job's own
            // writes fail too): a call made on this instance's view alone could go past
            // what the others spent, so it waits a moment and asks again.
            Err(e) => {
                tracing::warn!(window = %s.name, error = %e, "shared window unread");
                Err(UNREAD_WAIT_MS + fastrand::i64(0..UNREAD_WAIT_MS))
            }
        }
    }

    /// Notes what an answer to a call sent at `sent_at` said. The shared window hears only
    /// what this instance's view did not already hold (fewer calls left, a later reset, a
    /// 429): most answers cost no write.
    pub(crate) async fn hear(&self, news: News, sent_at: Millis) {
        let on_the_way = self.replied(sent_at);
        let (before, after) = self.with(|w, now| {
            let before = *w;
            w.hear(news, now, on_the_way);
            (before, *w)
        });
        let Some(s) = &self.shared else {
            return;
        };
        if !worth_telling(news, (&before, &after), self.grain) {
            return;
        }
        let now = self.clock.now();
        let told = (news, on_the_way, sent_at);
        if let Err(e) = s.windows.hear(&s.name, after.span, told, now).await {
            tracing::warn!(window = %s.name, error = %e, "shared window not told");
        }
    }

    /// Notes that the call sent at `sent_at` ended, answered or not (a failure, a timeout):
    /// it is no longer on its way. The calls that still are.
    pub(crate) fn answered(&self, sent_at: Millis) -> i64 {
        self.on_the_way(self.clock.now(), Some((sent_at, false)))
    }

    /// Notes that the service answered the call sent at `sent_at` (whether or not its answer
    /// told of the window): as [`Self::answered`], its round trip noted too.
    pub(crate) fn replied(&self, sent_at: Millis) -> i64 {
        self.on_the_way(self.clock.now(), Some((sent_at, true)))
    }

    /// The longest a call of this instance took lately from its take to its answer (0
    /// before any answer): a call taken that long before a reset may land after it.
    fn round_trip(&self) -> Millis {
        let trips = self.round_trips.lock().unwrap_or_else(|p| p.into_inner());
        trips.iter().copied().max().unwrap_or(0)
    }

    /// Waits `ms` on the service's clock.
    pub(crate) async fn wait(&self, ms: Millis) {
        self.clock.sleep_ms(ms).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn told(remaining: i64, limit: i64, reset_after: Millis) -> News {
        News::Told {
            remaining,
            limit: Some(limit),
            reset_after,
        }
    }

    #[test]
    fn what_a_window_admits() {
        let w = |remaining, reset_at| Window {
            remaining,
            reset_at,
            limit: Some(5),
            span: 2_000,
        };
        // (window, reserve, now, expected)
        let cases = [
            (w(None, 0), 3, 1_000, Ok(())),
            (w(Some(0), 2_000), 0, 1_000, Err(1_000)),
            (w(Some(0), 2_000), 0, 2_000, Ok(())),
            (w(Some(1), 2_000), 0, 1_000, Ok(())),
            (w(Some(1), 2_000), 1, 1_000, Err(1_000)),
            (w(Some(4), 2_000), 3, 1_000, Ok(())),
            (w(Some(-1), 2_500), 0, 1_000, Err(1_500)),
        ];
        for (window, reserve, now, expected) in cases {
            assert_eq!(
                window.admits(reserve, now),
                expected,
                "{window:?} leaving {reserve} at {now}"
            );
        }
    }

    #[test]
    fn answers_within_a_window_keep_the_fewer_calls_and_the_later_reset() {
        let mut w = Window::of_span(2_000);
        w.hear(told(4, 5, 2_000), 0, 0);
        assert_eq!((w.remaining, w.reset_at), (Some(4), 2_000));
        w.take(0, 100, 0).unwrap();
        w.take(0, 100, 0).unwrap();
        w.hear(told(3, 5, 1_850), 200, 0);
        assert_eq!(
            (w.remaining, w.reset_at),
            (Some(2), 2_050),
            "one call still on its way; the service's reset is later than held"
        );
        w.hear(told(0, 5, 1_700), 300, 0);
        assert_eq!(w.remaining, Some(0), "others spent the rest");
        w.hear(told(4, 5, 2_000), 2_100, 0);
        assert_eq!(
            (w.remaining, w.reset_at),
            (Some(4), 4_100),
            "past the reset: the new window as told"
        );
        let mut w = Window::of_span(60_000);
        w.hear(told(40, 50, 10_000), 0, 0);
        w.hear(told(49, 50, 60_000), 30_000, 0);
        assert_eq!(
            (w.remaining, w.reset_at),
            (Some(49), 90_000),
            "a reset well past the held one is a later window: not the fewer of two windows"
        );
    }

    #[test]
    fn a_late_answer_of_the_window_before_says_nothing_of_this_one() {
        let mut w = Window::of_span(60_000);
        w.hear(told(3, 50, 1_000), 59_000, 0);
        w.roll(60_000, 0);
        assert_eq!((w.remaining, w.reset_at), (Some(50), 120_000));
        // Sent at 59.9 s, answered at 60.2 s: the old window's last call, reset "now".
        w.hear(told(0, 50, 0), 60_200, 0);
        assert_eq!(
            (w.remaining, w.reset_at),
            (Some(50), 120_000),
            "the new window keeps its calls"
        );
        w.hear(told(48, 50, 59_000), 60_500, 0);
        assert_eq!(w.remaining, Some(48), "its own answers count");
    }

    #[test]
    fn what_is_news_to_the_other_instances() {
        let w = |remaining: Option<i64>, reset_at| Window {
            remaining,
            reset_at,
            limit: Some(5),
            span: 2_000,
        };
        let told = told(3, 5, 1_000);
        let refused = News::Refused { reset_after: None };
        // (news, before, after, grain, worth telling)
        let cases = [
            (told, w(None, 0), w(Some(3), 2_000), 1, true),
            (told, w(Some(4), 2_000), w(Some(3), 2_000), 1_000, true),
            (told, w(Some(3), 2_000), w(Some(3), 2_000), 1, false),
            (told, w(Some(3), 2_000), w(Some(3), 2_300), 1_000, false),
            (told, w(Some(3), 2_000), w(Some(3), 2_300), 1, true),
            (told, w(Some(3), 2_000), w(Some(3), 3_000), 1_000, true),
            (refused, w(Some(0), 2_000), w(Some(0), 2_000), 1_000, true),
        ];
        for (news, before, after, grain, expected) in cases {
            assert_eq!(
                worth_telling(news, (&before, &after), grain),
                expected,
                "{before:?} -> {after:?} at a grain of {grain}"
            );
        }
    }

    #[test]
    fn a_long_reset_is_one_wait_not_every_window_s_length() {
        let mut w = Window::of_span(60_000);
        w.hear(told(5, 50, 3_600_000), 0, 0);
        assert_eq!(w.reset_at, 3_600_000, "this window waits as told");
        assert_eq!(w.span, 60_000, "the next ones are a minute long");
        let mut d = Window::of_span(0);
        d.hear(told(4, 5, 2_000), 0, 0);
        d.hear(
            News::Refused {
                reset_after: Some(600_000),
            },
            100,
            0,
        );
        assert_eq!(d.span, 2_000, "a 429's wait is not the bucket's length");
        let mut r = Window::of_span(2_000);
        r.hear(told(2, 5, 2_000), 0, 0);
        r.hear(
            News::Refused {
                reset_after: Some(500),
            },
            100,
            0,
        );
        assert_eq!(r.reset_at, 2_000, "a 429 does not shorten the reset held");
    }

    #[test]
    fn a_refusal_empties_the_window_until_its_reset_or_a_window_s_length() {
        let mut w = Window::of_span(60_000);
        w.hear(
            News::Refused {
                reset_after: Some(7_000),
            },
            2_000,
            0,
        );
        assert_eq!(w.admits(0, 8_999), Err(1));
        w.hear(News::Refused { reset_after: None }, 0, 0);
        assert_eq!(w.reset_at, 60_000);
    }

    #[test]
    fn after_a_reset_calls_are_counted_before_any_answer() {
        let mut w = Window::of_span(0);
        w.hear(told(0, 5, 2_000), 0, 0);
        assert!(w.take(0, 1_000, 0).is_err(), "spent");
        for i in 0..5 {
            assert_eq!(w.take(0, 2_001, 0), Ok(()), "call {i} of the new window");
        }
        assert_eq!(w.take(0, 2_001, 0), Err(2_000), "the sixth waits a window");
    }

    #[test]
    fn calls_still_on_their_way_at_a_reset_count_in_the_next_window() {
        // (calls unanswered at the reset, calls the next window has)
        for (on_the_way, next) in [(0, 5), (1, 4), (3, 2)] {
            let mut w = Window::of_span(2_000);
            w.hear(told(2, 5, 2_000), 0, 0);
            w.take(0, 1_900, 0).unwrap();
            w.roll(2_000, on_the_way);
            assert_eq!(w.remaining, Some(next), "{on_the_way} on their way");
        }
    }

    #[test]
    fn an_answer_from_the_service_s_next_window_holds_the_calls_on_their_way_to_it() {
        // As seen in a rush: this window was learned from an answer that came 0.9 s late,
        // so the service's next window began 0.9 s before the reset held here. Three calls
        // taken in that gap are on their way when the first of the new window's answers
        // comes: they land in it too.
        // (calls unanswered, calls left as held)
        for (on_the_way, left) in [(3, 1), (0, 4)] {
            let mut w = Window::of_span(2_000);
            w.hear(told(5, 5, 2_000), 1_567, 0);
            w.take(0, 1_567, 0).unwrap();
            w.take(0, 2_377, 0).unwrap();
            w.take(0, 2_407, 0).unwrap();
            w.take(0, 2_407, 0).unwrap();
            w.hear(told(4, 5, 2_000), 2_647, on_the_way);
            assert_eq!(
                (w.remaining, w.reset_at),
                (Some(left), 4_647),
                "{on_the_way}"
            );
        }
    }

    #[test]
    fn within_the_window_held_the_calls_on_their_way_are_not_left() {
        // (calls left as held, as told, calls on their way, calls left)
        for (held, told, on_the_way, left) in [(3, 4, 0, 3), (3, 4, 2, 2), (1, 4, 2, 1)] {
            let mut w = Window::of_span(2_000);
            w.hear(self::told(5, 5, 2_000), 0, 0);
            for _ in held..5 {
                w.take(0, 100, 0).unwrap();
            }
            w.hear(self::told(told, 5, 1_800), 200, on_the_way);
            assert_eq!(w.remaining, Some(left), "{held} {told} {on_the_way}");
        }
    }

    /// A shared window told 2 calls left until 2 s, whose last two another instance took
    /// at 1.9 s and 1.95 s.
    fn spent_by_another() -> SharedWindow {
        let mut w = SharedWindow::of_span(2_000);
        w.window.hear(told(2, 5, 2_000), 0, 0);
        w.take(0, 1_900, (0, 0)).unwrap();
        w.take(0, 1_950, (0, 0)).unwrap();
        assert!(w.take(0, 1_990, (0, 0)).is_err(), "spent");
        w
    }

    #[test]
    fn another_instance_s_calls_taken_within_a_round_trip_of_the_reset_count_in_the_next() {
        // The first to take after the reset knows none of those two as its own.
        // (when it takes, its round trip, its own calls on their way, calls the new window
        // has left)
        let cases = [
            (2_000, 0, 0, 4),
            (2_000, 80, 0, 3),
            (2_000, 300, 0, 2),
            (2_000, 300, 3, 1),
            // A round trip longer than the window: only the ending window's calls count
            // (one taken before it landed in it, or was counted at its own reset).
            (2_000, 9_000, 0, 2),
            // Long after the reset, nothing taken then is still on its way.
            (2_500, 300, 0, 4),
        ];
        for (now, round_trip, own, left) in cases {
            let mut w = spent_by_another();
            w.take(0, now, (own, round_trip)).unwrap();
            assert_eq!(
                w.window.remaining,
                Some(left),
                "at {now}, {round_trip} ms, {own} own"
            );
        }
        let mut w = SharedWindow::of_span(2_000);
        w.window.hear(told(5, 5, 2_000), 0, 0);
        for at in 1..=20 {
            let _ = w.take(0, at * 100, (0, 0));
        }
        assert!(w.recent.len() <= RECENT_KEPT, "{:?}", w.recent);
    }

    #[test]
    fn an_answer_leaves_out_the_calls_any_instance_took_after_it_was_sent() {
        // The call sent at 1.9 s is answered from Discord's next window (4 left, reset in
        // 2 s) at 2.3 s: the one another instance took at 1.95 s reached it after.
        let mut w = spent_by_another();
        w.hear(told(4, 5, 2_000), (2_300, 1_900), 0);
        assert_eq!(w.window.remaining, Some(3));
        // Sent at 1.95 s: none taken after it.
        let mut w = spent_by_another();
        w.hear(told(4, 5, 2_000), (2_300, 1_950), 0);
        assert_eq!(w.window.remaining, Some(4));
    }

    #[test]
    fn take_times_ahead_of_the_clock_or_of_another_version_do_not_hold_a_window() {
        // An entry whose take times are far ahead (a skewed clock, a bad write) lets the
        // next window's calls go as if none were on their way.
        let mut w: SharedWindow = serde_json::from_str(
            r#"{"remaining":0,"reset_at":2000,"limit":5,"span":2000,
                "recent":[9000000000000,9000000000001,9000000000002,9000000000003,
                          9000000000004,9000000000005,9000000000006,9000000000007,9]}"#,
        )
        .unwrap();
        w.take(0, 2_000, (0, 300)).unwrap();
        assert_eq!(w.window.remaining, Some(4));
        // An entry written before take times were kept reads as none kept.
        let old: SharedWindow =
            serde_json::from_str(r#"{"remaining":3,"reset_at":2000,"limit":5,"span":2000}"#)
                .unwrap();
        assert_eq!(old.window.remaining, Some(3));
        assert_eq!(old.taken_between(0, 2_000), 0);
    }

    #[tokio::test]
    async fn only_answered_calls_tell_how_long_calls_take() {
        let clock = Clock::default();
        let limiter = Limiter::new(clock.clone(), 2_000, 1);
        let tick = |ms| clock.advance(std::time::Duration::from_millis(ms));
        // The clock runs on in real time too: a round trip is known to within that.
        let real = std::time::Instant::now();
        // (what became of the call, its time out, the longest round trip after it)
        for (replied, took, longest) in [(true, 120, 120), (false, 5_000, 120), (true, 40, 120)] {
            // As the clients do: the call is sent (and timed) once taken.
            limiter.take(0).await.unwrap();
            let sent = limiter.now();
            tick(took);
            if replied {
                limiter.replied(sent);
            } else {
                // A timeout: it says nothing of how long answers take.
                limiter.answered(sent);
            }
            let slack = real.elapsed().as_millis() as Millis + 1;
            let trip = limiter.round_trip();
            assert!(
                (longest..=longest + slack).contains(&trip),
                "{replied} after {took} ms: {trip}, {slack} ms of real time"
            );
        }
    }

    #[tokio::test]
    async fn a_limiter_counts_the_calls_it_has_not_heard_back_on() {
        let clock = Clock::default();
        let limiter = Limiter::new(clock.clone(), 0, 1);
        let sent = limiter.now();
        limiter.take(0).await.unwrap();
        limiter.hear(told(4, 5, 2_000), sent).await;
        let first = limiter.now();
        limiter.take(0).await.unwrap();
        clock.advance(std::time::Duration::from_millis(10));
        limiter.take(0).await.unwrap();
        limiter.take(0).await.unwrap();
        // The first of the three is answered from the service's next window; the two taken
        // after it are on their way.
        clock.advance(std::time::Duration::from_millis(1_500));
        limiter.hear(told(4, 5, 2_000), first).await;
        assert_eq!(limiter.view().remaining, Some(2));
        // Calls unanswered past any timeout were cut short: not counted at the reset.
        clock.advance(std::time::Duration::from_millis(ANSWER_WITHIN_MS as u64));
        limiter.take(0).await.unwrap();
        assert_eq!(limiter.view().remaining, Some(4));
    }
}
