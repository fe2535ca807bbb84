//! Buildkite's outgoing webhooks: verifying that a request came from Buildkite, and the
//! events we act on.
//!
//! Verification runs on the raw body before any JSON parsing. With `X-Buildkite-Signature`
//! (`timestamp=<unix>,signature=<hex>`) the HMAC-SHA256 of `<timestamp>.<body>` must match
//! one of the accepted secrets (several, so a secret can be rotated without downtime) and the
//! timestamp must be within [`TOLERANCE_SECS`] of now, which bounds replays. The clear-text
//! `X-Buildkite-Token` mode is accepted only when the deployment allows it.

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::model::{Build, BuildJob};

/// How far the signature's timestamp may be from our clock, either way.
pub(crate) const TOLERANCE_SECS: i64 = 300;

pub(crate) const SIGNATURE_HEADER: &str = "x-buildkite-signature";
pub(crate) const TOKEN_HEADER: &str = "x-buildkite-token";
pub(crate) const EVENT_HEADER: &str = "x-buildkite-event";

#[derive(Clone)]
pub struct WebhookAuth {
    secrets: Vec<SecretString>,
    /// Accept the clear-text `X-Buildkite-Token` header (weaker: no replay protection).
    allow_token: bool,
}

impl std::fmt::Debug for WebhookAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookAuth")
            .field(
                "secrets",
                &format_args!("[{} redacted]", self.secrets.len()),
            )
            .field("allow_token", &self.allow_token)
            .finish()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    #[error("no X-Buildkite-Signature header")]
    Missing,
    #[error("X-Buildkite-Signature is malformed")]
    Malformed,
    #[error("signature does not match")]
    Mismatch,
    #[error("signature timestamp is outside the {TOLERANCE_SECS}s tolerance")]
    Stale,
    #[error("token does not match")]
    BadToken,
}

/// Computes the lowercase hex signature Buildkite sends for `body` at `timestamp`.
pub fn sign(secret: &str, timestamp: &str, body: &[u8]) -> String {
    hex::encode(crate::mac::sign(
        secret.as_bytes(),
        &signed_parts(timestamp, body),
    ))
}

/// What Buildkite signs: `<timestamp>.<body>`.
fn signed_parts<'a>(timestamp: &'a str, body: &'a [u8]) -> [&'a [u8]; 3] {
    [timestamp.as_bytes(), b".", body]
}

/// Splits `timestamp=<unix>,signature=<hex>` (in either order, spaces allowed).
fn parse_signature_header(header: &str) -> Result<(&str, i64, Vec<u8>), VerifyError> {
    let (mut ts, mut sig) = (None, None);
    for part in header.split(',') {
        let (k, v) = part.split_once('=').ok_or(VerifyError::Malformed)?;
        match k.trim() {
            "timestamp" if ts.is_none() => ts = Some(v.trim()),
            "signature" if sig.is_none() => sig = Some(v.trim()),
            _ => return Err(VerifyError::Malformed),
        }
    }
    let (ts, sig) = ts.zip(sig).ok_or(VerifyError::Malformed)?;
    let ts_value = (!ts.is_empty() && ts.bytes().all(|b| b.is_ascii_digit()))
        .then(|| ts.parse::<i64>().ok())
        .flatten()
        .ok_or(VerifyError::Malformed)?;
    let sig = hex::decode(sig).map_err(|_| VerifyError::Malformed)?;
    if sig.len() != 32 {
        return Err(VerifyError::Malformed);
    }
    Ok((ts, ts_value, sig))
}

impl WebhookAuth {
    /// Accepts signatures made with any of `secrets` (and, if `allow_token`, any of them as
    /// a clear-text token).
    pub fn new(secrets: Vec<SecretString>, allow_token: bool) -> Self {
        Self {
            secrets,
            allow_token,
        }
    }

    /// Verifies a request's headers against its raw body at time `now` (Unix seconds).
    pub fn verify(
        &self,
        signature: Option<&str>,
        token: Option<&str>,
        body: &[u8],
        now: i64,
    ) -> Result<(), VerifyError> {
        // The signature is preferred whenever present: a token alongside it is ignored.
        if let Some(header) = signature {
            let (ts, ts_value, sig) = parse_signature_header(header)?;
            let parts = signed_parts(ts, body);
            let matched = self
                .secrets
                .iter()
                .any(|s| crate::mac::verify(s.expose_secret().as_bytes(), &parts, &sig));
            if !matched {
                return Err(VerifyError::Mismatch);
            }
            if now.abs_diff(ts_value) > TOLERANCE_SECS as u64 {
                return Err(VerifyError::Stale);
            }
            return Ok(());
        }
        match token {
            Some(token) if self.allow_token => {
                let ok = self
                    .secrets
                    .iter()
                    .any(|s| crate::token::same(s.expose_secret().as_bytes(), token.as_bytes()));
                if ok {
                    Ok(())
                } else {
                    Err(VerifyError::BadToken)
                }
            }
            _ => Err(VerifyError::Missing),
        }
    }
}

/// The part of a webhook body we read. Everything else is ignored.
#[derive(Debug, Deserialize)]
pub struct WebhookEvent {
    /// The event's name. The signed body decides: the `X-Buildkite-Event` header is not signed.
    #[serde(default)]
    pub event: String,
    pub build: Option<Build>,
    /// The job of a `job.*` event.
    pub job: Option<BuildJob>,
    /// The pipeline the event is about (a notification service may send every pipeline's).
    pub pipeline: Option<PipelineRef>,
    /// The agent of an `agent.*` event.
    #[serde(default)]
    pub(crate) agent: Option<super::Agent>,
}

/// A pipeline as events name it.
#[derive(Debug, Deserialize)]
pub struct PipelineRef {
    #[serde(default)]
    pub slug: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"event":"build.finished","build":{"id":"b"}}"#;

    fn auth(secrets: &[&str], allow_token: bool) -> WebhookAuth {
        WebhookAuth::new(
            secrets.iter().map(|s| SecretString::from(*s)).collect(),
            allow_token,
        )
    }

    #[test]
    fn known_answer_vector() {
        // python3 -c 'import hmac,hashlib; print(hmac.new(b"s3cret",
        //   b"1700000000." + b"{\"event\":\"build.finished\",\"build\":{\"id\":\"b\"}}",
        //   hashlib.sha256).hexdigest())'
        let expected = "bed716c6087cb3e703c8c35574880331eca1a9ec010259c82a7afc0b6ce3e48c";
        assert_eq!(sign("s3cret", "1700000000", BODY), expected);
        let header = format!("timestamp=1700000000,signature={expected}");
        assert_eq!(
            auth(&["s3cret"], false).verify(Some(&header), None, BODY, 1_700_000_010),
            Ok(())
        );
    }

    fn header(secret: &str, ts: i64, body: &[u8]) -> String {
        format!(
            "timestamp={ts},signature={}",
            sign(secret, &ts.to_string(), body)
        )
    }

    #[test]
    fn wrong_secret_and_tampered_body_are_rejected() {
        let a = auth(&["right"], false);
        let now = 1_700_000_000;
        assert_eq!(
            a.verify(Some(&header("wrong", now, BODY)), None, BODY, now),
            Err(VerifyError::Mismatch)
        );
        let tampered = br#"{"event":"build.finished","build":{"id":"c"}}"#;
        assert_eq!(
            a.verify(Some(&header("right", now, BODY)), None, tampered, now),
            Err(VerifyError::Mismatch)
        );
    }

    #[test]
    fn stale_and_future_timestamps_are_rejected() {
        let a = auth(&["k"], false);
        let now = 1_700_000_000;
        assert_eq!(
            a.verify(Some(&header("k", now - 301, BODY)), None, BODY, now),
            Err(VerifyError::Stale)
        );
        assert_eq!(
            a.verify(Some(&header("k", now + 301, BODY)), None, BODY, now),
            Err(VerifyError::Stale)
        );
        assert_eq!(
            a.verify(Some(&header("k", now - 300, BODY)), None, BODY, now),
            Ok(())
        );
        assert_eq!(
            a.verify(Some(&header("k", now + 300, BODY)), None, BODY, now),
            Ok(())
        );
    }

    #[test]
    fn malformed_headers_are_rejected() {
        let a = auth(&["k"], false);
        let sig = sign("k", "1", BODY);
        for h in [
            "".to_owned(),
            "garbage".to_owned(),
            format!("signature={sig}"),
            "timestamp=1".to_owned(),
            format!("timestamp=-1,signature={sig}"),
            format!("timestamp=abc,signature={sig}"),
            "timestamp=1,signature=zz".to_owned(),
            "timestamp=1,signature=abcd".to_owned(),
            format!("timestamp=1,signature={sig},extra=1"),
            format!("timestamp=1,timestamp=2,signature={sig}"),
        ] {
            assert_eq!(
                a.verify(Some(&h), None, BODY, 1),
                Err(VerifyError::Malformed),
                "{h:?}"
            );
        }
        // Order and spaces are tolerated, as in Buildkite's Ruby example.
        assert_eq!(
            a.verify(
                Some(&format!("signature={sig}, timestamp=1")),
                None,
                BODY,
                1
            ),
            Ok(())
        );
    }

    #[test]
    fn any_of_several_secrets_is_accepted() {
        let a = auth(&["old", "new"], false);
        assert_eq!(
            a.verify(Some(&header("new", 5, BODY)), None, BODY, 5),
            Ok(())
        );
        assert_eq!(
            a.verify(Some(&header("old", 5, BODY)), None, BODY, 5),
            Ok(())
        );
    }

    #[test]
    fn token_mode_only_when_allowed() {
        assert_eq!(
            auth(&["tok"], false).verify(None, Some("tok"), BODY, 0),
            Err(VerifyError::Missing)
        );
        let a = auth(&["old", "tok"], true);
        assert_eq!(a.verify(None, Some("tok"), BODY, 0), Ok(()));
        assert_eq!(
            a.verify(None, Some("tok2"), BODY, 0),
            Err(VerifyError::BadToken)
        );
        assert_eq!(a.verify(None, None, BODY, 0), Err(VerifyError::Missing));
        // A signature, when present, decides even if a valid token rides along.
        assert_eq!(
            a.verify(Some("timestamp=0,signature=00"), Some("tok"), BODY, 0),
            Err(VerifyError::Malformed)
        );
    }
}
