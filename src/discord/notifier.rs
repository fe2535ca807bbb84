//! Posts and edits webhook messages.
//!
//! 429 answers are retried after the `retry_after` Discord asks for (body, else the
//! `Retry-After` header); 5xx with backoff; both through the one retry driver, within the
//! invocation's deadline. 4xx answers are read by their JSON error code: see
//! [`DiscordError`]. Error texts never include the URL: its path carries the webhook token.

use std::sync::Arc;
use std::time::Duration;

use reqwest::multipart::{Form, Part};
use reqwest::{Method, Response, StatusCode};
use serde::Deserialize;
use url::Url;

use super::bucket::{Buckets, Priority};
use super::message::{Message, REPORT_FILENAME};
use super::target::DiscordTarget;
use crate::error::{BoxError, chain};
use crate::retry::{Again, Deadline, Policy, Transient};
use crate::time::Clock;
use crate::window::SharedWindows;

/// Discord answers in well under a second; a slow answer must not hold a function long.
/// The least time a call is sent with after a wait for its bucket.
const MIN_TRY: Duration = Duration::from_millis(250);
const TIMEOUT: Duration = Duration::from_secs(5);

/// Discord's JSON error codes we act on.
mod codes {
    pub(super) const UNKNOWN_MESSAGE: u64 = 10008;
    pub(super) const UNKNOWN_WEBHOOK: u64 = 10015;
    pub(super) const EDIT_LIMIT: u64 = 30046;
    pub(super) const INVALID_WEBHOOK_TOKEN: u64 = 50027;
}

#[derive(Debug, thiserror::Error)]
pub enum DiscordError {
    /// The webhook was deleted or its token revoked (10015, 50027, or a 404 with no or another
    /// code): nothing more can be sent there.
    #[error("Discord webhook is gone ({status}, code {code:?})")]
    Gone { status: u16, code: Option<u64> },
    /// The message was deleted (10008) or can no longer be edited (30046): post a new one.
    #[error("Discord message can no longer be edited (code {code})")]
    MessageGone { code: u64 },
    /// Refused for good (any other 4xx): this render will not be accepted.
    #[error("Discord refused the message ({status}, code {code:?}): {message}")]
    Rejected {
        status: u16,
        code: Option<u64>,
        message: String,
    },
    /// Worth trying later: 5xx, 429, a timeout, no answer. A transport error is kept
    /// without its URL, whose path holds the webhook token.
    #[error("Discord unavailable: {}", chain(source.as_ref()))]
    Unavailable {
        #[source]
        source: BoxError,
        retry_after: Option<Duration>,
        /// The request may have reached Discord and done its work (a 5xx, a timeout): only
        /// an idempotent call may be repeated after it.
        maybe_done: bool,
    },
    /// A message of low priority (a place in a queue) not sent: the webhook's bucket had no
    /// room for it. Not tried again within the call; the next message replaces it.
    #[error("Discord's bucket has no room for this message for {wait:?}")]
    NoRoom { wait: Duration },
    /// A post whose answer was lost (a 5xx, a timeout): the message may exist. It is not
    /// posted again within the call, as a webhook takes no idempotency key.
    #[error("Discord may have posted the message: {}", chain(source.as_ref()))]
    Unconfirmed {
        #[source]
        source: BoxError,
    },
}

impl DiscordError {
    /// A failure before the request could have done anything.
    fn unavailable(source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            source: source.into(),
            retry_after: None,
            maybe_done: false,
        }
    }

    /// A failure after the request may have done its work.
    fn maybe_done(source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            source: source.into(),
            retry_after: None,
            maybe_done: true,
        }
    }

    /// This failure, for a call that must not be repeated once it may have done its work.
    fn for_post(self) -> Self {
        match self {
            Self::Unavailable {
                source,
                maybe_done: true,
                ..
            } => Self::Unconfirmed { source },
            other => other,
        }
    }
}

impl Transient for DiscordError {
    fn again(&self) -> Again {
        match self {
            Self::Unavailable { retry_after, .. } => Again::After(*retry_after),
            _ => Again::Never,
        }
    }
}

#[derive(Clone)]
pub struct Notifier {
    http: reqwest::Client,
    base: Url,
    retry: Policy,
    timeout: Duration,
    /// Each webhook's rate limit as Discord last told it, shared by every clone.
    buckets: Buckets,
}

/// Discord's answer to a post could not be read for the new message's id.
#[derive(Debug, thiserror::Error)]
#[error("message id missing from answer")]
struct MissingId(#[source] reqwest::Error);

#[derive(Deserialize)]
struct Posted {
    id: String,
}

#[derive(Deserialize, Default)]
struct ErrorBody {
    #[serde(default)]
    code: Option<u64>,
    #[serde(default)]
    message: String,
    #[serde(default)]
    retry_after: Option<f64>,
}

fn transport(e: reqwest::Error) -> DiscordError {
    // `without_url`: the URL holds the webhook token. A request that never connected did
    // nothing; any other (a timeout, a reset) may have.
    if e.is_connect() {
        DiscordError::unavailable(e.without_url())
    } else {
        DiscordError::maybe_done(e.without_url())
    }
}

/// What a non-success answer means, read from its status, headers and JSON error body.
async fn classify(resp: Response) -> DiscordError {
    let status = resp.status();
    let header_wait = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok());
    let body: ErrorBody = resp.json().await.unwrap_or_default();
    let code = body.code.filter(|c| *c != 0);
    match (status, code) {
        (StatusCode::TOO_MANY_REQUESTS, _) => {
            let wait = body
                .retry_after
                .or(header_wait)
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .unwrap_or(Duration::from_secs(1));
            // Refused before any work: safe to send again.
            DiscordError::Unavailable {
                source: format!("rate limited for {wait:?}").into(),
                retry_after: Some(wait),
                maybe_done: false,
            }
        }
        (s, _) if s.is_server_error() => DiscordError::maybe_done(format!("HTTP {s}")),
        (_, Some(c @ (codes::UNKNOWN_MESSAGE | codes::EDIT_LIMIT))) => {
            DiscordError::MessageGone { code: c }
        }
        (_, Some(codes::UNKNOWN_WEBHOOK | codes::INVALID_WEBHOOK_TOKEN))
        | (StatusCode::NOT_FOUND, _) => DiscordError::Gone {
            status: status.as_u16(),
            code,
        },
        (s, code) => DiscordError::Rejected {
            status: s.as_u16(),
            code,
            message: crate::text::truncate(body.message.trim(), 300),
        },
    }
}

/// Discord's multipart form: the message as `payload_json`, the report as `files[0]`.
fn form(message: &Message, text: &str) -> Result<Form, DiscordError> {
    let json = serde_json::to_string(message).map_err(DiscordError::unavailable)?;
    let file = Part::text(text.to_owned())
        .file_name(REPORT_FILENAME)
        .mime_str("text/plain; charset=utf-8")
        .map_err(transport)?;
    let payload = Part::text(json)
        .mime_str("application/json")
        .map_err(transport)?;
    Ok(Form::new()
        .part("payload_json", payload)
        .part("files[0]", file))
}

impl Notifier {
    pub fn new(base: Url) -> Result<Self, DiscordError> {
        let http = crate::tls::client_builder()
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
            retry: Policy::default(),
            timeout: TIMEOUT,
            buckets: Buckets::default(),
        })
    }

    /// This notifier, timing Discord's buckets on `clock`.
    pub(crate) fn with_clock(mut self, clock: Clock) -> Self {
        self.buckets = self.buckets.with_clock(clock);
        self
    }

    /// This notifier, spending each webhook's bucket together with every instance that
    /// shares `windows`.
    pub(crate) fn with_windows(mut self, windows: Arc<dyn SharedWindows>) -> Self {
        self.buckets = self.buckets.shared(windows);
        self
    }

    /// How many messages of `priority` `target`'s bucket has room for now, as this instance
    /// sees it (`i64::MAX` where nothing was told).
    pub(crate) fn room(&self, target: &DiscordTarget, priority: Priority) -> i64 {
        self.buckets.room(&target.bucket(), priority)
    }

    /// [`room`](Self::room) of the bucket named `bucket` (a [`DiscordTarget::bucket`]).
    pub(crate) fn bucket_room(&self, bucket: &str, priority: Priority) -> i64 {
        self.buckets.room(bucket, priority)
    }

    pub fn with_retry(mut self, retry: Policy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the time limit of each call (default 5 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The time limit of one call: how much of a deadline one Discord attempt needs.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn url(&self, target: &DiscordTarget, suffix: &str, wait: bool) -> Result<Url, DiscordError> {
        let raw = format!(
            "{}/{}{suffix}",
            self.base.as_str().trim_end_matches('/'),
            target.path()
        );
        let mut url =
            Url::parse(&raw).map_err(|_| DiscordError::unavailable("invalid Discord URL"))?;
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

    async fn attempt(
        &self,
        (method, priority): (Method, Priority),
        (target, url): (&DiscordTarget, &Url),
        message: &Message,
        deadline: Deadline,
    ) -> Result<Response, DiscordError> {
        let bucket = target.bucket();
        self.admit(&bucket, priority, deadline).await?;
        let sent_at = self.buckets.now();
        // A call the bucket let go that ends without an answer is no longer on its way: it
        // was not sent, or Discord counted it or never will.
        let unanswered = |e: DiscordError| {
            self.buckets.answered(&bucket, sent_at);
            e
        };
        let timeout = deadline
            .call_timeout(self.timeout)
            .ok_or_else(|| unanswered(DiscordError::unavailable("no time left for the call")))?;
        let request = self.http.request(method, url.clone()).timeout(timeout);
        let request = match &message.file {
            None => request.json(message),
            Some(text) => request.multipart(form(message, text).map_err(unanswered)?),
        };
        let resp = request.send().await.map_err(|e| unanswered(transport(e)))?;
        if resp.status().is_success() {
            let told = (resp.headers(), None);
            self.buckets.observe(&bucket, told, sent_at).await;
            return Ok(resp);
        }
        Err(self.failed(&bucket, resp, sent_at).await)
    }

    /// What a failed answer (to a call sent at `sent_at`) means, its bucket noted. Only a 429
    /// says more of the bucket than a success does: another failure's headers (an unknown
    /// webhook's, a bad token's) may be of another bucket.
    async fn failed(
        &self,
        bucket: &str,
        resp: Response,
        sent_at: crate::time::Millis,
    ) -> DiscordError {
        let limited = resp.status() == StatusCode::TOO_MANY_REQUESTS;
        let headers = resp.headers().clone();
        let error = classify(resp).await;
        let retry_after = match &error {
            DiscordError::Unavailable {
                retry_after: Some(wait),
                ..
            } => Some(wait.as_millis() as i64),
            _ => None,
        };
        if limited || retry_after.is_some() {
            let told = (&headers, retry_after);
            self.buckets.observe(bucket, told, sent_at).await;
        } else {
            self.buckets.answered(bucket, sent_at);
        }
        // The bucket holds the wait now: the retry waits there, on the service's clock.
        match error {
            DiscordError::Unavailable {
                source,
                retry_after: Some(_),
                maybe_done,
            } => DiscordError::Unavailable {
                source,
                retry_after: Some(Duration::ZERO),
                maybe_done,
            },
            other => other,
        }
    }

    /// Lets a call go within the webhook's bucket: at once, after a wait for its reset that
    /// the retry policy would also wait, or not at all (as a 429 that was never sent).
    async fn admit(
        &self,
        webhook: &str,
        priority: Priority,
        deadline: Deadline,
    ) -> Result<(), DiscordError> {
        let Err(wait) = self.buckets.take(webhook, priority).await else {
            return Ok(());
        };
        let span = Duration::from_millis(wait.max(0) as u64);
        let refused = || DiscordError::Unavailable {
            source: format!("rate limited for {span:?}").into(),
            retry_after: Some(span),
            maybe_done: false,
        };
        if !priority.waits() {
            return Err(DiscordError::NoRoom { wait: span });
        }
        if span > self.retry.max_wait || deadline.remaining() < span + MIN_TRY {
            return Err(refused());
        }
        self.buckets.wait(wait).await;
        self.buckets
            .take(webhook, priority)
            .await
            .map_err(|_| refused())
    }

    /// Posts a new message and returns its id (`?wait=true`, so Discord confirms it). A
    /// webhook takes no idempotency key: the post is tried again only after an answer that
    /// says nothing was done (a 429, no connection), never after one that may have posted.
    pub async fn post(
        &self,
        (target, priority): (&DiscordTarget, Priority),
        message: &Message,
        deadline: Deadline,
    ) -> Result<String, DiscordError> {
        let url = self.url(target, "", true)?;
        let resp = self
            .retry
            .run(deadline, "Discord", || async {
                let sent = self
                    .attempt((Method::POST, priority), (target, &url), message, deadline)
                    .await;
                sent.map_err(DiscordError::for_post)
            })
            .await?;
        // Discord answered 2xx: the message exists, whatever its body says.
        let posted: Posted = resp.json().await.map_err(|e| DiscordError::Unconfirmed {
            source: MissingId(e.without_url()).into(),
        })?;
        Ok(posted.id)
    }

    /// Replaces the content of a message this webhook posted.
    pub async fn edit(
        &self,
        (target, priority): (&DiscordTarget, Priority),
        message_id: &str,
        message: &Message,
        deadline: Deadline,
    ) -> Result<(), DiscordError> {
        let url = self.url(target, &format!("/messages/{message_id}"), false)?;
        self.retry
            .run(deadline, "Discord", || {
                self.attempt((Method::PATCH, priority), (target, &url), message, deadline)
            })
            .await
            .map(drop)
    }
}
