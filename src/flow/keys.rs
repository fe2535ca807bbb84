//! The keys an instance checks inbound requests by (Buildkite's webhook secrets, the
//! submission API's tokens), read again while it lives so a rotation needs no restart: a key
//! the instance does not hold makes it read the secret again (at most once per
//! [`UNKNOWN_KEY_MS`], so a flood of bad signatures cannot flood Secrets Manager) and check
//! once more, and it reads it at least every [`AT_LEAST_EVERY_MS`] anyway. Without a reader
//! (every key from the environment) the keys are fixed for the instance's life.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};

use secrecy::{ExposeSecret, SecretString};

use crate::buildkite::WebhookAuth;
use crate::config::Config;
use crate::time::Millis;

/// The shortest time between two reads a refused key causes.
pub(crate) const UNKNOWN_KEY_MS: Millis = 30_000;
/// The longest an instance keeps keys without reading them again.
pub(crate) const AT_LEAST_EVERY_MS: Millis = 5 * 60_000;
/// The longest a request waits for a read: the extension is local, so a slower one is stuck,
/// and the request goes on with the keys held.
const READ_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);

/// The inbound keys, as read at one time.
#[derive(Debug, Clone)]
pub struct Keys {
    pub(crate) webhook: WebhookAuth,
    pub(crate) submit: Vec<SecretString>,
}

impl Keys {
    /// The keys `config` holds.
    pub fn of(config: &Config) -> Self {
        Self {
            webhook: WebhookAuth::new(config.webhook.secrets.clone(), config.webhook.allow_token),
            submit: config.submit_tokens.clone(),
        }
    }

    /// Whether `presented` is one of the submission API's tokens.
    pub(crate) fn submit_token(&self, presented: &str) -> bool {
        let presented = presented.trim().as_bytes();
        self.submit
            .iter()
            .any(|t| crate::token::same(t.expose_secret().as_bytes(), presented))
    }
}

/// An error from reading the keys again; its text never holds a key.
pub type ReadError = Box<dyn std::error::Error + Send + Sync>;
/// Reads the keys again (the server's: the environment, then the secrets extension).
pub type ReadKeys =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<Keys, ReadError>> + Send>> + Send + Sync>;

/// The keys an instance holds now, and how it reads them again.
pub(crate) struct LiveKeys {
    held: RwLock<Arc<Keys>>,
    /// When they were last read (or a read tried).
    read_at: Mutex<Millis>,
    reader: Option<ReadKeys>,
}

impl LiveKeys {
    /// `keys`, read at `read_at`; read again by `reader` when given.
    pub(crate) fn new(keys: Keys, reader: Option<ReadKeys>, read_at: Millis) -> Self {
        Self {
            held: RwLock::new(Arc::new(keys)),
            read_at: Mutex::new(read_at),
            reader,
        }
    }

    /// The keys held now.
    pub(crate) fn current(&self) -> Arc<Keys> {
        // A panic while holding the lock left whole keys behind: the value is still good.
        self.held
            .read()
            .map_or_else(|p| p.into_inner().clone(), |k| k.clone())
    }

    /// `accepts` applied to the keys held at `now`; when it refuses for a reason `unknown`
    /// says a newer key could cure, applied once more to keys read again (at most once per
    /// [`UNKNOWN_KEY_MS`]).
    pub(crate) async fn check<T, E>(
        &self,
        now: Millis,
        accepts: impl Fn(&Keys) -> Result<T, E>,
        unknown: impl Fn(&E) -> bool,
    ) -> Result<T, E> {
        if self.claim(now, AT_LEAST_EVERY_MS) {
            self.read_again().await;
        }
        match accepts(&self.current()) {
            Err(e) if unknown(&e) && self.claim(now, UNKNOWN_KEY_MS) => {
                self.read_again().await;
                accepts(&self.current())
            }
            other => other,
        }
    }

    /// Whether this caller reads the keys now: they were last read `after` or longer ago.
    /// Claimed before reading, so concurrent requests read once, and a failing read is not
    /// tried again at once.
    fn claim(&self, now: Millis, after: Millis) -> bool {
        if self.reader.is_none() {
            return false;
        }
        let mut read_at = self.read_at.lock().unwrap_or_else(|p| p.into_inner());
        if now.saturating_sub(*read_at) < after {
            return false;
        }
        *read_at = now;
        true
    }

    async fn read_again(&self) {
        let Some(reader) = &self.reader else {
            return;
        };
        let read = tokio::time::timeout(READ_BUDGET, reader()).await;
        match read.unwrap_or_else(|_| Err("no answer within the read's budget".into())) {
            Ok(keys) => {
                let mut held = self.held.write().unwrap_or_else(|p| p.into_inner());
                *held = Arc::new(keys);
                tracing::info!("inbound keys read again");
            }
            Err(e) => tracing::warn!(error = %e, "inbound keys not read again; keeping those held"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A reader handing out `token` (changed by the test) and counting its reads.
    fn reader(token: Arc<Mutex<&'static str>>, reads: Arc<AtomicUsize>) -> ReadKeys {
        Arc::new(move || {
            let token = *token.lock().unwrap();
            reads.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { Ok(keys(token)) })
        })
    }

    fn keys(token: &str) -> Keys {
        Keys {
            webhook: WebhookAuth::new(vec![], false),
            submit: vec![SecretString::from(token)],
        }
    }

    async fn admits(live: &LiveKeys, now: Millis, token: &str) -> bool {
        let accepts = |k: &Keys| k.submit_token(token).then_some(()).ok_or(());
        live.check(now, accepts, |_| true).await.is_ok()
    }

    #[tokio::test]
    async fn a_new_key_is_read_at_most_once_per_half_minute_and_old_keys_within_five() {
        let (token, reads) = (Arc::new(Mutex::new("old")), Arc::default());
        let live = LiveKeys::new(
            keys("old"),
            Some(reader(token.clone(), Arc::clone(&reads))),
            1_000,
        );
        let count = || reads.load(Ordering::SeqCst);
        assert!(admits(&live, 1_000, "old").await);
        assert!(!admits(&live, 2_000, "new").await, "just read: not again");
        assert_eq!(count(), 0);
        *token.lock().unwrap() = "new";
        // (now, presented, admitted, reads so far, why)
        let table: [(Millis, &str, bool, usize, &str); 6] = [
            (
                20_000,
                "new",
                false,
                0,
                "19 s after the start: not read again",
            ),
            (31_000, "new", true, 1, "30 s on: read again, and admitted"),
            (
                32_000,
                "old",
                false,
                1,
                "the old key is gone, and 1 s is too soon",
            ),
            (
                40_000,
                "bogus",
                false,
                1,
                "a flood of bad keys reads nothing more",
            ),
            (
                62_000,
                "bogus",
                false,
                2,
                "30 s on: one read, still refused",
            ),
            (62_500, "new", true, 2, "the held key admits with no read"),
        ];
        for (now, presented, admitted, n, why) in table {
            assert_eq!(admits(&live, now, presented).await, admitted, "{why}");
            assert_eq!(count(), n, "{why}");
        }
        // Five minutes after the last read, the next check reads whatever it presents.
        *token.lock().unwrap() = "newer";
        assert!(admits(&live, 62_000 + AT_LEAST_EVERY_MS, "newer").await);
        assert_eq!(
            count(),
            3,
            "one read serves the five-minute read and the new key"
        );
    }

    #[tokio::test]
    async fn a_failed_read_keeps_the_keys_held_and_fixed_keys_are_never_read() {
        let failing: ReadKeys = Arc::new(|| Box::pin(async { Err("extension down".into()) }));
        let live = LiveKeys::new(keys("old"), Some(failing), 0);
        assert!(admits(&live, 0, "old").await);
        assert!(!admits(&live, 40_000, "new").await);
        assert!(admits(&live, 41_000, "old").await, "kept what it held");
        let fixed = LiveKeys::new(keys("old"), None, 0);
        assert!(admits(&fixed, 0, "old").await);
        assert!(!admits(&fixed, AT_LEAST_EVERY_MS * 2, "new").await);
    }

    #[tokio::test]
    async fn an_extension_that_never_answers_holds_a_request_only_for_the_read_s_budget() {
        let stuck: ReadKeys = Arc::new(|| Box::pin(std::future::pending()));
        let live = LiveKeys::new(keys("old"), Some(stuck), 0);
        // Without the read's budget this check would never return.
        assert!(!admits(&live, 40_000, "new").await);
        assert!(admits(&live, 41_000, "old").await, "kept what it held");
    }

    #[tokio::test]
    async fn a_refusal_a_new_key_cannot_cure_reads_nothing() {
        let reads = Arc::new(AtomicUsize::new(0));
        let live = LiveKeys::new(
            keys("old"),
            Some(reader(Arc::new(Mutex::new("old")), reads.clone())),
            0,
        );
        let _ = live.check(0, |_| Err::<(), _>("stale"), |_| false).await;
        assert!(
            live.check(60_000, |_| Err::<(), _>("stale"), |_| false)
                .await
                .is_err()
        );
        assert_eq!(reads.load(Ordering::SeqCst), 0);
    }
}
