//! Reads our secrets from AWS Secrets Manager through the AWS Parameters and Secrets Lambda
//! extension: plain HTTP on localhost, so no AWS SDK for it in the binaries, and no secret in
//! plain text in the functions' configuration.
//!
//! `KERNELBOT_SECRET_ID` names one secret whose `SecretString` is a JSON object holding any
//! of the keys in [`crate::config::SECRET_KEYS`]. A key that is also set in the environment keeps the environment's value
//! (local runs and tests). The extension answers only during an invocation, so the functions
//! read it on their first one; the keys requests are checked by are read again while an
//! instance lives (`flow::keys`).

use std::collections::BTreeMap;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::config::SECRET_KEYS;
use crate::retry::{Again, Deadline, Policy, Transient};

/// The variable naming the secret (its name or ARN).
pub(crate) const SECRET_ID_VAR: &str = "KERNELBOT_SECRET_ID";
/// The extension's documented default port.
pub(crate) const DEFAULT_PORT: u16 = 2773;
/// What the secret may hold (the one list, [`SECRET_KEYS`]); anything else in it is ignored.
pub fn keys() -> Vec<&'static str> {
    keys_known().collect()
}

fn keys_known() -> impl Iterator<Item = &'static str> {
    SECRET_KEYS.iter().map(|(key, _)| *key)
}
/// The extension runs beside us: a slow answer is a stuck one.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("AWS_SESSION_TOKEN is not set, and the secrets extension requires it")]
    MissingSessionToken,
    #[error("PARAMETERS_SECRETS_EXTENSION_HTTP_PORT={0:?} is not a port")]
    BadPort(String),
    #[error("the secrets extension could not be reached")]
    Unreachable(#[source] reqwest::Error),
    #[error("the secrets extension answered HTTP {status} for secret {secret_id}")]
    Refused {
        status: u16,
        secret_id: String,
        /// Secrets Manager throttled the call (the extension passes that on as a 400).
        throttled: bool,
    },
    #[error("secret {secret_id} is not a JSON object of strings")]
    Malformed { secret_id: String },
}

impl Transient for SecretsError {
    fn again(&self) -> Again {
        match self {
            // The extension may still be starting, or Secrets Manager briefly unavailable.
            Self::Unreachable(_) => Again::After(None),
            Self::Refused {
                status, throttled, ..
            } if *status >= 500 || *status == 429 || *throttled => Again::After(None),
            _ => Again::Never,
        }
    }
}

/// The extension's answer: Secrets Manager's `GetSecretValue` response.
#[derive(Deserialize)]
struct SecretValue {
    #[serde(rename = "SecretString")]
    secret_string: Option<String>,
}

/// A variable's value; set but blank counts as unset.
fn non_empty(lookup: &(impl Fn(&str) -> Option<String> + ?Sized), key: &str) -> Option<String> {
    lookup(key).filter(|v| !v.trim().is_empty())
}

/// Whether [`load`] will call the extension (and so must wait for an invocation).
pub(crate) fn configured(lookup: &(dyn Fn(&str) -> Option<String> + Sync)) -> bool {
    non_empty(lookup, SECRET_ID_VAR).is_some()
}

/// The secrets among `keys` that the extension holds; empty when `KERNELBOT_SECRET_ID` is not
/// set. A function keeps only the keys it uses: the public webhook function does not keep the
/// submission API's token. (The extension answers with the whole secret and IAM grants the
/// whole secret; a deployment wanting a hard line gives each function a secret of its own.)
pub async fn load(
    lookup: &(dyn Fn(&str) -> Option<String> + Sync),
    keys: &[&str],
) -> Result<BTreeMap<String, SecretString>, SecretsError> {
    let present = |k: &str| non_empty(lookup, k);
    let Some(secret_id) = present(SECRET_ID_VAR) else {
        return Ok(BTreeMap::new());
    };
    let session_token = present("AWS_SESSION_TOKEN").ok_or(SecretsError::MissingSessionToken)?;
    let port = match present("PARAMETERS_SECRETS_EXTENSION_HTTP_PORT") {
        None => DEFAULT_PORT,
        Some(p) => p.trim().parse().map_err(|_| SecretsError::BadPort(p))?,
    };
    let url = url::Url::parse_with_params(
        &format!("http://127.0.0.1:{port}/secretsmanager/get"),
        [("secretId", &secret_id)],
    )
    .map_err(|_| SecretsError::BadPort(port.to_string()))?;
    // Never through a proxy from the environment: the session token and the secret stay local.
    let client = crate::tls::client_builder()
        .no_proxy()
        .timeout(CALL_TIMEOUT)
        .build()
        .map_err(SecretsError::Unreachable)?;
    let policy = Policy {
        attempts: 5,
        base: Duration::from_millis(100),
        ..Policy::default()
    };
    let body = policy
        .run(
            Deadline::after(Duration::from_secs(20)),
            "secrets extension",
            || fetch(&client, &url, &session_token, &secret_id),
        )
        .await?;
    let secrets = keep(&body, keys, &secret_id)?;
    tracing::info!(
        secret = %secret_id,
        keys = ?secrets.keys().collect::<Vec<_>>(),
        "read secrets through the extension"
    );
    Ok(secrets)
}

/// The `keys` the extension's answer holds (of those the secret may hold at all).
fn keep(
    body: &[u8],
    keys: &[&str],
    secret_id: &str,
) -> Result<BTreeMap<String, SecretString>, SecretsError> {
    let malformed = || SecretsError::Malformed {
        secret_id: secret_id.to_owned(),
    };
    let value: SecretValue = serde_json::from_slice(body).map_err(|_| malformed())?;
    keep_from(&value.secret_string.ok_or_else(malformed)?, keys, secret_id)
}

/// The `keys` a secret's `SecretString` holds (of those the secret may hold at all).
pub(crate) fn keep_from(
    secret_string: &str,
    keys: &[&str],
    secret_id: &str,
) -> Result<BTreeMap<String, SecretString>, SecretsError> {
    let malformed = || SecretsError::Malformed {
        secret_id: secret_id.to_owned(),
    };
    let fields: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(secret_string).map_err(|_| malformed())?;
    let known: Vec<&str> = keys_known().collect();
    let mut secrets = BTreeMap::new();
    for key in keys.iter().filter(|k| known.contains(k)) {
        match fields.get(*key) {
            None => {}
            Some(serde_json::Value::String(v)) => {
                secrets.insert((*key).to_owned(), SecretString::from(v.clone()));
            }
            Some(_) => return Err(malformed()),
        }
    }
    Ok(secrets)
}

async fn fetch(
    client: &reqwest::Client,
    url: &url::Url,
    session_token: &str,
    secret_id: &str,
) -> Result<Vec<u8>, SecretsError> {
    let resp = client
        .get(url.clone())
        .header("X-Aws-Parameters-Secrets-Token", session_token)
        .send()
        .await
        .map_err(SecretsError::Unreachable)?;
    let status = resp.status();
    if !status.is_success() {
        // Only the error's type is read from the body, never shown.
        let body = resp.text().await.unwrap_or_default();
        return Err(SecretsError::Refused {
            status: status.as_u16(),
            secret_id: secret_id.to_owned(),
            throttled: body.contains("ThrottlingException"),
        });
    }
    resp.bytes()
        .await
        .map(|b| b.to_vec())
        .map_err(SecretsError::Unreachable)
}

/// `lookup` first, then the secrets read through the extension.
pub fn overlay(
    lookup: impl Fn(&str) -> Option<String>,
    secrets: BTreeMap<String, SecretString>,
) -> impl Fn(&str) -> Option<String> {
    move |name| {
        non_empty(&lookup, name).or_else(|| secrets.get(name).map(|s| s.expose_secret().to_owned()))
    }
}
