//! Posts and edits webhook messages.
//!
//! 429 answers are retried after the `retry_after` Discord asks for (body, else the
//! `Retry-After` header); 5xx with backoff. A 404 means the webhook was deleted: Discord
//! asks clients to stop using such a webhook, so it surfaces as [`DiscordError::Gone`].
//! Error texts never include the URL: its path carries the webhook token.

use std::time::Duration;

use reqwest::{Method, Response, StatusCode};
use serde::Deserialize;
use url::Url;

use super::message::Message;
use super::target::DiscordTarget;
use crate::retry::Policy;

/// Discord answers in well under a second; a slow answer must not hold a function long.
const TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum DiscordError {
    #[error("Discord webhook is gone (404)")]
    Gone,
    #[error("Discord refused the message ({status}): {message}")]
    Rejected { status: u16, message: String },
    #[error("Discord unavailable: {0}")]
    Unavailable(String),
}

#[derive(Clone)]
pub struct Notifier {
    http: reqwest::Client,
    base: Url,
    retry: Policy,
    timeout: Duration,
}

#[derive(Deserialize)]
struct Posted {
    id: String,
}

#[derive(Deserialize)]
struct RateLimited {
    retry_after: f64,
}

/// How long Discord asked us to wait.
async fn retry_after(resp: Response) -> Option<Duration> {
    let header = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok());
    let body = resp.json::<RateLimited>().await.ok().map(|r| r.retry_after);
    body.or(header)
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

fn transport(e: reqwest::Error) -> DiscordError {
    // `without_url`: the URL holds the webhook token.
    DiscordError::Unavailable(e.without_url().to_string())
}

impl Notifier {
    pub fn new(base: Url) -> Result<Self, DiscordError> {
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!(
                "DiscordBot (https://github.com/gpu-mode/kernelbot, ",
                env!("CARGO_PKG_VERSION"),
                ")"
            ))
            .build()
            .map_err(transport)?;
        Ok(Self {
            http,
            base,
            retry: Policy {
                budget: Duration::from_secs(10),
                ..Policy::default()
            },
            timeout: TIMEOUT,
        })
    }

    pub fn with_retry(mut self, retry: Policy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the time limit of each call (default 10 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn url(&self, target: &DiscordTarget, suffix: &str, wait: bool) -> Result<Url, DiscordError> {
        let raw = format!(
            "{}/{}{suffix}",
            self.base.as_str().trim_end_matches('/'),
            target.path()
        );
        let mut url = Url::parse(&raw)
            .map_err(|_| DiscordError::Unavailable("invalid Discord URL".into()))?;
        {
            let mut q = url.query_pairs_mut();
            if wait {
                q.append_pair("wait", "true");
            }
            if let Some(thread) = &target.thread_id {
                q.append_pair("thread_id", thread);
            }
        }
        if url.query() == Some("") {
            url.set_query(None);
        }
        Ok(url)
    }

    async fn send(
        &self,
        method: Method,
        url: Url,
        message: &Message,
    ) -> Result<Response, DiscordError> {
        let mut attempt = 0;
        let started = std::time::Instant::now();
        loop {
            attempt += 1;
            let resp = self
                .http
                .request(method.clone(), url.clone())
                .timeout(self.timeout)
                .json(message)
                .send()
                .await;
            let (wait, failure) = match resp {
                Ok(r) if r.status().is_success() => return Ok(r),
                Ok(r) if r.status() == StatusCode::NOT_FOUND => return Err(DiscordError::Gone),
                Ok(r) if r.status() == StatusCode::TOO_MANY_REQUESTS => {
                    let wait = retry_after(r).await.unwrap_or(Duration::from_secs(1));
                    (
                        Some(wait),
                        DiscordError::Unavailable(format!("rate limited for {wait:?}")),
                    )
                }
                Ok(r) if r.status().is_server_error() => (
                    None,
                    DiscordError::Unavailable(format!("HTTP {}", r.status())),
                ),
                Ok(r) => {
                    let status = r.status().as_u16();
                    let body = r.text().await.unwrap_or_default();
                    return Err(DiscordError::Rejected {
                        status,
                        message: super::message::truncate(body.trim(), 300),
                    });
                }
                Err(e) => (None, transport(e)),
            };
            match self.retry.delay(attempt, wait, started.elapsed()) {
                Some(pause) => {
                    tracing::warn!(attempt, pause_ms = pause.as_millis() as u64, error = %failure, "retrying Discord call");
                    tokio::time::sleep(pause).await;
                }
                None => return Err(failure),
            }
        }
    }

    /// Posts a new message and returns its id (`?wait=true`, so Discord confirms it).
    pub async fn post(
        &self,
        target: &DiscordTarget,
        message: &Message,
    ) -> Result<String, DiscordError> {
        let resp = self
            .send(Method::POST, self.url(target, "", true)?, message)
            .await?;
        let posted: Posted = resp.json().await.map_err(|e| {
            DiscordError::Unavailable(format!(
                "message id missing from answer: {}",
                e.without_url()
            ))
        })?;
        Ok(posted.id)
    }

    /// Replaces the content of a message this webhook posted.
    pub async fn edit(
        &self,
        target: &DiscordTarget,
        message_id: &str,
        message: &Message,
    ) -> Result<(), DiscordError> {
        let url = self.url(target, &format!("/messages/{message_id}"), false)?;
        self.send(Method::PATCH, url, message).await.map(drop)
    }
}
