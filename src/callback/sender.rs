//! Posts one signed callback. One attempt per call: the outbox redelivers (the sweep, for
//! up to 24 h), so a slow or failing receiver never holds a function.

use std::time::Duration;

use reqwest::StatusCode;
use tracing::Instrument;
use url::Url;

use super::Event;
use super::signature::{self, InvalidKey, SigningKey};
use crate::error::{BoxError, chain};
use crate::retry::Deadline;

/// A receiver that has not answered in this long is tried again later (by the sweep): it
/// only records the callback, and a dead one must not slow every submit and webhook.
const TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub(crate) enum CallbackError {
    /// 410: the receiver wants no more callbacks for this run.
    #[error("the callback receiver answered 410 Gone")]
    Gone,
    /// Any other answer than 2xx: tried again later. The body is not kept (it is theirs).
    #[error("the callback receiver answered {0}")]
    Refused(u16),
    /// A redirect is not followed (it would carry a result elsewhere): `CALLBACK_URL` must
    /// name the route itself.
    #[error("the callback receiver redirected ({0}): set CALLBACK_URL to the final URL")]
    Redirected(u16),
    /// No answer: a timeout or a connection error. The URL is left out (its query may carry
    /// a token of the receiver's).
    #[error("the callback receiver did not answer: {}", chain(.0.as_ref()))]
    Unreachable(#[source] BoxError),
}

#[derive(Clone)]
pub(crate) struct CallbackSender {
    http: reqwest::Client,
    url: Url,
    keys: Vec<SigningKey>,
    timeout: Duration,
}

/// Why a sender could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SenderError {
    /// A `CALLBACK_SECRET` key is unusable.
    #[error(transparent)]
    Key(#[from] InvalidKey),
    #[error("the HTTP client could not be built")]
    Client(#[source] reqwest::Error),
}

impl CallbackSender {
    /// Posts to `url`, signed with every key `secret` holds (space-separated `whsec_` keys).
    pub(crate) fn new(url: Url, secret: &str) -> Result<Self, SenderError> {
        let keys = secret
            .split_whitespace()
            .map(SigningKey::parse)
            .collect::<Result<Vec<_>, _>>()?;
        let http = crate::tls::client_builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(SenderError::Client)?;
        Ok(Self {
            http,
            url,
            keys,
            timeout: TIMEOUT,
        })
    }

    #[must_use]
    pub(crate) fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How many keys sign each callback.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> usize {
        self.keys.len()
    }

    /// Sends `event` once, signed for this attempt's time.
    pub(crate) async fn send(
        &self,
        event: &Event,
        deadline: Deadline,
    ) -> Result<(), CallbackError> {
        let span = tracing::info_span!(crate::telemetry::OUTBOUND_SPAN, service = "callback");
        self.send_once(event, deadline).instrument(span).await
    }

    async fn send_once(&self, event: &Event, deadline: Deadline) -> Result<(), CallbackError> {
        let Some(timeout) = deadline.call_timeout(self.timeout) else {
            return Err(CallbackError::Unreachable("no time left".into()));
        };
        let now = crate::time::now_secs();
        let answer = self
            .http
            .post(self.url.clone())
            .timeout(timeout)
            .header("content-type", "application/json")
            .header("webhook-id", &event.id)
            .header("webhook-timestamp", now.to_string())
            .header(
                "webhook-signature",
                signature::header(&self.keys, &event.id, now, &event.body),
            )
            .body(event.body.clone())
            .send()
            .await
            .map_err(|e| CallbackError::Unreachable(e.without_url().into()))?;
        match answer.status() {
            s if s.is_success() => Ok(()),
            StatusCode::GONE => Err(CallbackError::Gone),
            s if s.is_redirection() => Err(CallbackError::Redirected(s.as_u16())),
            s => Err(CallbackError::Refused(s.as_u16())),
        }
    }
}
