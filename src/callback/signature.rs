//! Standard Webhooks signatures: `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`
//! under the key a `whsec_<base64>` secret holds, one per key, space-separated.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use secrecy::{ExposeSecret, SecretBox};

const PREFIX: &str = "whsec_";

/// A signing key; its bytes are never printed.
#[derive(Clone)]
pub(super) struct SigningKey(std::sync::Arc<SecretBox<Vec<u8>>>);

/// Why a `CALLBACK_SECRET` entry is unusable. The text never quotes the secret.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum InvalidKey {
    #[error("each secret must start with {PREFIX}")]
    Prefix,
    #[error("a secret's key is not valid base64")]
    Base64,
    #[error("a secret's key is empty")]
    Empty,
}

impl SigningKey {
    pub(super) fn parse(secret: &str) -> Result<Self, InvalidKey> {
        let encoded = secret.strip_prefix(PREFIX).ok_or(InvalidKey::Prefix)?;
        let key = STANDARD.decode(encoded).map_err(|_| InvalidKey::Base64)?;
        if key.is_empty() {
            return Err(InvalidKey::Empty);
        }
        Ok(Self(std::sync::Arc::new(SecretBox::new(Box::new(key)))))
    }

    fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let timestamp = timestamp.to_string();
        let parts: [&[u8]; 5] = [id.as_bytes(), b".", timestamp.as_bytes(), b".", body];
        let mac = crate::mac::sign(self.0.expose_secret(), &parts);
        format!("v1,{}", STANDARD.encode(mac))
    }
}

/// The `webhook-signature` header: one signature per key (all of them while rotating).
pub(crate) fn header(keys: &[SigningKey], id: &str, timestamp: i64, body: &[u8]) -> String {
    keys.iter()
        .map(|k| k.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's published known-answer vector.
    #[test]
    fn signs_the_specs_test_vector() {
        let key = SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            header(
                &[key],
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn every_key_signs_and_each_input_counts() {
        let a = SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let b = SigningKey::parse("whsec_c2Vjb25kLWtleQ==").unwrap();
        let one = |k: &SigningKey, id: &str, ts: i64, body: &[u8]| {
            header(std::slice::from_ref(k), id, ts, body)
        };
        let both = header(&[a.clone(), b.clone()], "id", 1, b"{}");
        assert_eq!(
            both.split(' ').collect::<Vec<_>>(),
            [one(&a, "id", 1, b"{}"), one(&b, "id", 1, b"{}")]
        );
        let base = one(&a, "id", 1, b"{}");
        assert_ne!(base, one(&a, "id2", 1, b"{}"));
        assert_ne!(base, one(&a, "id", 2, b"{}"));
        assert_ne!(base, one(&a, "id", 1, b"{ }"));
    }

    #[test]
    fn malformed_secrets_are_refused() {
        assert_eq!(
            SigningKey::parse("MfKQ9r8G").err(),
            Some(InvalidKey::Prefix)
        );
        assert_eq!(
            SigningKey::parse("whsec_a*b").err(),
            Some(InvalidKey::Base64)
        );
        assert_eq!(SigningKey::parse("whsec_").err(), Some(InvalidKey::Empty));
    }
}
