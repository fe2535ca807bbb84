//! The one retry driver for every outbound call (Buildkite, its artifact storage, Discord),
//! and the deadline that bounds them all.
//!
//! An invocation has one [`Deadline`] (the Lambda context's, or a fixed span outside
//! Lambda). Each try gets at most its own time limit and never more than what is left; a
//! retry is planned only when its pause and a minimal try still fit. Servers that ask for a
//! wait (429 `Retry-After`, `RateLimit-Reset`) are obeyed, or, when the wait is longer than the
//! policy allows, not retried at all: the caller then defers the work to the sweep.

use std::future::Future;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use tracing::Instrument;

/// How long an invocation has outside Lambda (where the context gives the real deadline).
pub const LOCAL_BUDGET: Duration = Duration::from_secs(50);

/// A try is not started with less time than this left: it could not finish.
const MIN_TRY: Duration = Duration::from_millis(250);

/// The moment an invocation must have answered by.
#[derive(Clone, Copy, Debug)]
pub struct Deadline(Instant);

impl Deadline {
    pub fn after(span: Duration) -> Self {
        Self(Instant::now() + span)
    }

    /// From a Lambda context's deadline (milliseconds since the Unix epoch). The emulator of
    /// `cargo lambda watch` sends the timeout itself instead (a value far in the past as a
    /// date): that is read as a span, at most [`LOCAL_BUDGET`].
    pub fn at_unix_millis(deadline_ms: u64) -> Self {
        let now_ms = crate::time::now_millis().max(0) as u64;
        if deadline_ms < now_ms / 2 {
            return Self::after(Duration::from_millis(deadline_ms).min(LOCAL_BUDGET));
        }
        Self::after(Duration::from_millis(deadline_ms.saturating_sub(now_ms)))
    }

    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    /// The time limit for one call: its own `limit`, or less if less is left; `None` when too
    /// little is left to try at all.
    pub(crate) fn call_timeout(&self, limit: Duration) -> Option<Duration> {
        let left = self.remaining();
        (left >= MIN_TRY).then(|| limit.min(left))
    }

    /// This deadline, or `span` from now if that comes first.
    pub(crate) fn within(&self, span: Duration) -> Self {
        Self(self.0.min(Instant::now() + span))
    }

    /// This deadline less `reserve` (kept back for work that must follow).
    pub fn less(&self, reserve: Duration) -> Self {
        Self(self.0.checked_sub(reserve).unwrap_or(self.0))
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Total tries, the first included.
    pub attempts: u32,
    /// Backoff before the second try; doubles each time, with jitter.
    pub base: Duration,
    /// Cap on one computed backoff.
    pub max_backoff: Duration,
    /// A server that asks for a longer wait than this is not waited for.
    pub max_wait: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            attempts: 4,
            base: Duration::from_millis(250),
            max_backoff: Duration::from_secs(4),
            max_wait: Duration::from_secs(10),
        }
    }
}

/// What a failed try says about trying again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Again {
    Never,
    /// Yes, after the server's requested wait if it named one, else after a backoff.
    After(Option<Duration>),
}

/// Errors of one try know whether another try may succeed.
pub trait Transient {
    fn again(&self) -> Again;
}

impl Policy {
    /// The pause before the next try, or `None` to stop: `planned` is the backoff's own plan
    /// (`None` when tries are used up).
    fn pause(
        &self,
        again: Again,
        planned: Option<Duration>,
        deadline: Deadline,
    ) -> Option<Duration> {
        let planned = planned?;
        let pause = match again {
            Again::Never => return None,
            Again::After(Some(wait)) if wait > self.max_wait => return None,
            // A little jitter on top, so clients told the same wait do not stampede.
            Again::After(Some(wait)) => wait + Duration::from_millis(fastrand::u64(0..=100)),
            Again::After(None) => planned,
        };
        (deadline.remaining() >= pause + MIN_TRY).then_some(pause)
    }

    /// Runs `op` until it succeeds, fails for good, runs out of tries, or would outlive
    /// `deadline`. `what` names the service in logs.
    pub async fn run<T, E, F, Fut>(&self, deadline: Deadline, what: &str, op: F) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Transient + std::fmt::Display,
    {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(self.base)
            .with_max_delay(self.max_backoff)
            .with_max_times(self.attempts.saturating_sub(1) as usize)
            .with_jitter();
        let span = tracing::info_span!(crate::telemetry::OUTBOUND_SPAN, service = what);
        op.retry(backoff)
            .sleep(tokio::time::sleep)
            .when(|e: &E| e.again() != Again::Never)
            .adjust(|e: &E, planned| self.pause(e.again(), planned, deadline))
            .notify(|e: &E, pause: Duration| {
                tracing::warn!(service = what, pause_ms = pause.as_millis() as u64, error = %e, "retrying");
            })
            .instrument(span)
            .await
    }
}

/// Whether a status is worth another try: rate limited or a server-side failure.
pub(crate) fn is_transient(status: reqwest::StatusCode) -> bool {
    status == reqwest::StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[derive(Debug)]
    struct E(Again);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{:?}", self.0)
        }
    }
    impl Transient for E {
        fn again(&self) -> Again {
            self.0
        }
    }

    fn quick() -> Policy {
        Policy {
            attempts: 4,
            base: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
            max_wait: Duration::from_millis(200),
        }
    }

    async fn tries(policy: Policy, deadline: Deadline, again: Again) -> u32 {
        let n = AtomicU32::new(0);
        let _ = policy
            .run(deadline, "test", || async {
                n.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(E(again))
            })
            .await;
        n.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn transient_failures_are_tried_up_to_the_policy() {
        let far = Deadline::after(Duration::from_secs(30));
        assert_eq!(tries(quick(), far, Again::After(None)).await, 4);
        assert_eq!(tries(quick(), far, Again::Never).await, 1);
    }

    #[tokio::test]
    async fn a_requested_wait_is_obeyed_unless_too_long() {
        let far = Deadline::after(Duration::from_secs(30));
        let started = Instant::now();
        let wait = Again::After(Some(Duration::from_millis(60)));
        assert_eq!(tries(quick(), far, wait).await, 4);
        assert!(started.elapsed() >= Duration::from_millis(180));
        let too_long = Again::After(Some(Duration::from_secs(1)));
        assert_eq!(tries(quick(), far, too_long).await, 1);
    }

    #[tokio::test]
    async fn no_try_starts_that_would_outlive_the_deadline() {
        let near = Deadline::after(Duration::from_millis(900));
        let wait = Again::After(Some(Duration::from_millis(400)));
        // One try, one pause of 400-500 ms (a try needs 250 ms more), then 400-500 ms are
        // left, too little for another: 150 ms of slack either way for a loaded machine.
        let patient = Policy {
            max_wait: Duration::from_secs(1),
            ..quick()
        };
        assert_eq!(tries(patient, near, wait).await, 2);
        assert!(
            Deadline::after(Duration::from_millis(100))
                .call_timeout(Duration::from_secs(5))
                .is_none()
        );
        let t = Deadline::after(Duration::from_secs(2)).call_timeout(Duration::from_secs(5));
        assert!(t.is_some_and(|t| t <= Duration::from_secs(2)));
    }
}
