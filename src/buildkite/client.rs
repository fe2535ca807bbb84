//! The Buildkite REST client: create, find, get and cancel builds, list and download artifacts.
//!
//! Every call is bounded by the invocation's [`Deadline`] and goes through the one retry
//! driver. Reads are retried on 429 (waiting `RateLimit-Reset`) and 5xx; creating a build is
//! retried only when it surely did not reach Buildkite (a refused connection, a 429): after a
//! timeout or a 5xx it is [`BuildkiteError::Unconfirmed`], for the caller to look up.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response, StatusCode, header};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use url::Url;

use super::model::{Agent, Artifact, Build, NewBuild};
use crate::config::BuildkiteConfig;
use crate::retry::{self, Again, Deadline, Policy, Transient};

/// Largest `result.json` we accept.
pub const MAX_ARTIFACT_BYTES: u64 = 8 * 1024 * 1024;
const API_TIMEOUT: Duration = Duration::from_secs(10);
const STORAGE_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_ARTIFACT_PAGES: u32 = 10;
/// 1000 agents: far more than any donated fleet.
const MAX_AGENT_PAGES: u32 = 10;

#[derive(Debug, thiserror::Error)]
pub enum BuildkiteError {
    #[error("Buildkite refused the request ({status}): {message}")]
    Rejected { status: u16, message: String },
    /// 429; `reset` is when the window resets, if Buildkite said.
    #[error("Buildkite rate limit exceeded")]
    RateLimited { reset: Option<Duration> },
    #[error("Buildkite unavailable: {0}")]
    Unavailable(String),
    /// A create call whose answer was lost (timeout, 5xx): the build may exist.
    #[error("Buildkite did not confirm the build: {0}")]
    Unconfirmed(String),
    #[error("unexpected response from Buildkite: {0}")]
    Protocol(String),
    #[error("artifact is larger than {MAX_ARTIFACT_BYTES} bytes")]
    TooLarge,
    /// The sweep pass's call budget is spent, or Buildkite's rate limit is nearly reached:
    /// the rest waits for the next pass.
    #[error("Buildkite call budget of this pass is spent")]
    OverBudget,
    /// Artifact storage refused the download (e.g. an expired link).
    #[error("artifact storage refused the download (HTTP {status})")]
    Storage { status: u16 },
}

impl BuildkiteError {
    /// A fixed sentence for people (Discord): a status code at most, never the other side's
    /// text (error pages, storage error bodies), which stays in the logs.
    pub fn public(&self) -> String {
        match self {
            Self::Rejected { status, .. } => {
                format!("Buildkite refused the request (HTTP {status})")
            }
            Self::RateLimited { .. } => "Buildkite's rate limit was reached".into(),
            Self::Unavailable(_) => "Buildkite could not be reached".into(),
            Self::Unconfirmed(_) => "Buildkite did not confirm the build".into(),
            Self::Protocol(_) => "Buildkite gave an answer that could not be read".into(),
            Self::TooLarge | Self::OverBudget | Self::Storage { .. } => self.to_string(),
        }
    }

    /// Whether the error says the pipeline (token, org or slug) is wrong rather than one build.
    pub fn is_misconfiguration(&self) -> bool {
        matches!(
            self,
            Self::Rejected {
                status: 401 | 403,
                ..
            }
        )
    }
}

impl Transient for BuildkiteError {
    fn again(&self) -> Again {
        match self {
            Self::RateLimited { reset } => Again::After(*reset),
            Self::Unavailable(_) => Again::After(None),
            _ => Again::Never,
        }
    }
}

/// How many Buildkite API calls a sweep pass may still make (retries included, artifact
/// storage not), and the lowest `RateLimit-Remaining` Buildkite last reported: a pass never
/// takes the organisation's or the token's last requests, which submissions need.
#[derive(Clone, Debug)]
pub struct CallBudget(Arc<BudgetState>);

#[derive(Debug)]
struct BudgetState {
    left: AtomicI64,
    made: AtomicI64,
    remaining: AtomicI64,
}

/// Below this many requests left in Buildkite's window, a pass stops calling.
pub const RATE_LIMIT_FLOOR: i64 = 10;

impl CallBudget {
    pub fn new(max_calls: u32) -> Self {
        Self(Arc::new(BudgetState {
            left: AtomicI64::new(i64::from(max_calls)),
            made: AtomicI64::new(0),
            remaining: AtomicI64::new(i64::MAX),
        }))
    }

    /// Takes one call, if the budget and the rate limit allow.
    fn take(&self) -> bool {
        if self.0.remaining.load(Ordering::Relaxed) < RATE_LIMIT_FLOOR {
            return false;
        }
        let ok = self.0.left.fetch_sub(1, Ordering::Relaxed) > 0;
        if ok {
            self.0.made.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Notes the lower of the organisation's and the token's remaining requests.
    fn observe(&self, headers: &header::HeaderMap) {
        let lowest = ["ratelimit-remaining", "ratelimit-user-remaining"]
            .iter()
            .filter_map(|n| headers.get(*n)?.to_str().ok()?.trim().parse::<i64>().ok())
            .min();
        if let Some(n) = lowest {
            self.0.remaining.store(n, Ordering::Relaxed);
        }
    }

    /// Calls made so far.
    pub fn made(&self) -> u32 {
        self.0.made.load(Ordering::Relaxed).max(0) as u32
    }

    pub fn spent(&self) -> bool {
        self.0.left.load(Ordering::Relaxed) <= 0
            || self.0.remaining.load(Ordering::Relaxed) < RATE_LIMIT_FLOOR
    }
}

#[derive(Clone)]
pub struct BuildkiteClient {
    api: reqwest::Client,
    /// For artifact storage (S3): never carries our token.
    storage: reqwest::Client,
    base: Url,
    org: String,
    pipeline: String,
    token: SecretString,
    retry: Policy,
    timeout: Duration,
    budget: Option<CallBudget>,
}

fn transport(e: reqwest::Error) -> BuildkiteError {
    BuildkiteError::Unavailable(e.without_url().to_string())
}

/// The message Buildkite puts in an error body (`{"message": ...}`), else the raw text.
fn error_message(body: &str) -> String {
    let message = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            let message = v.get("message")?.as_str()?.to_owned();
            Some(match v.get("errors") {
                Some(errors) => format!("{message}: {errors}"),
                None => message,
            })
        })
        .unwrap_or_else(|| body.trim().to_owned());
    crate::discord::message::truncate(&message, 500)
}

fn rate_limit_reset(resp: &Response) -> Option<Duration> {
    let h = resp.headers();
    ["ratelimit-reset", "ratelimit-user-reset", "retry-after"]
        .iter()
        .filter_map(|name| h.get(*name)?.to_str().ok()?.trim().parse::<u64>().ok())
        .max()
        .map(Duration::from_secs)
}

/// Turns an answer into the response or the error it stands for.
async fn classify(resp: Response, idempotent: bool) -> Result<Response, BuildkiteError> {
    let status = resp.status();
    if status == StatusCode::TOO_MANY_REQUESTS {
        return Err(BuildkiteError::RateLimited {
            reset: rate_limit_reset(&resp),
        });
    }
    if status.is_success() || status.is_redirection() {
        return Ok(resp);
    }
    let body = resp.text().await.unwrap_or_default();
    let message = format!("HTTP {status}: {}", error_message(&body));
    Err(match status {
        s if s.is_server_error() && idempotent => BuildkiteError::Unavailable(message),
        s if s.is_server_error() => BuildkiteError::Unconfirmed(message),
        s => BuildkiteError::Rejected {
            status: s.as_u16(),
            message: error_message(&body),
        },
    })
}

impl BuildkiteClient {
    pub fn new(config: &BuildkiteConfig) -> Result<Self, BuildkiteError> {
        let api = crate::tls::client_builder()
            .connect_timeout(Duration::from_secs(5))
            // The artifact download answers 302 to storage; we follow it ourselves so the
            // Authorization header is never sent there.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("kernelbot-dispatch/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(transport)?;
        let storage = crate::tls::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::limited(3))
            .build()
            .map_err(transport)?;
        Ok(Self {
            api,
            storage,
            base: config.api_url.clone(),
            org: config.org.clone(),
            pipeline: config.pipeline.clone(),
            token: config.token.clone(),
            retry: Policy::default(),
            timeout: API_TIMEOUT,
            budget: None,
        })
    }

    /// Whether this client's call budget (if it has one) is spent.
    pub fn over_budget(&self) -> bool {
        self.budget.as_ref().is_some_and(CallBudget::spent)
    }

    /// This client, counting every API call against `budget`.
    pub fn with_budget(&self, budget: CallBudget) -> Self {
        Self {
            budget: Some(budget),
            ..self.clone()
        }
    }

    pub fn with_retry(mut self, retry: Policy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the time limit of each REST call (default 10 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn pipeline_url(&self) -> String {
        format!(
            "{}/organizations/{}/pipelines/{}",
            self.base.as_str().trim_end_matches('/'),
            self.org,
            self.pipeline
        )
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.pipeline_url())
    }

    /// One try of a REST call, bounded by the deadline.
    async fn attempt(
        &self,
        method: Method,
        url: &str,
        body: Option<&NewBuild>,
        idempotent: bool,
        deadline: Deadline,
    ) -> Result<Response, BuildkiteError> {
        let timeout = deadline
            .call_timeout(self.timeout)
            .ok_or_else(|| BuildkiteError::Unavailable("no time left for the call".into()))?;
        if self.budget.as_ref().is_some_and(|b| !b.take()) {
            return Err(BuildkiteError::OverBudget);
        }
        let mut req: RequestBuilder = self
            .api
            .request(method, url)
            .timeout(timeout)
            .bearer_auth(self.token.expose_secret());
        if let Some(b) = body {
            req = req.json(b);
        }
        match req.send().await {
            Ok(resp) => {
                if let Some(b) = &self.budget {
                    b.observe(resp.headers());
                }
                classify(resp, idempotent).await
            }
            // A request that may have reached Buildkite is not repeated unless idempotent.
            Err(e) if idempotent || e.is_connect() => Err(transport(e)),
            Err(e) => Err(BuildkiteError::Unconfirmed(e.without_url().to_string())),
        }
    }

    async fn read(&self, url: &str, deadline: Deadline) -> Result<Response, BuildkiteError> {
        self.retry
            .run(deadline, "Buildkite", || {
                self.attempt(Method::GET, url, None, true, deadline)
            })
            .await
    }

    async fn json<T: DeserializeOwned>(resp: Response) -> Result<T, BuildkiteError> {
        let body = resp.bytes().await.map_err(transport)?;
        serde_json::from_slice(&body).map_err(|e| BuildkiteError::Protocol(e.to_string()))
    }

    pub async fn create_build(
        &self,
        build: &NewBuild,
        deadline: Deadline,
    ) -> Result<Build, BuildkiteError> {
        let url = self.url("builds");
        let resp = self
            .retry
            .run(deadline, "Buildkite", || {
                self.attempt(Method::POST, &url, Some(build), false, deadline)
            })
            .await?;
        // Buildkite answered 2xx: whatever goes wrong reading the body, the build exists.
        Self::json(resp)
            .await
            .map_err(|e| BuildkiteError::Unconfirmed(e.to_string()))
    }

    /// Checks that the configured pipeline exists and the token may read it.
    pub async fn check_pipeline(&self, deadline: Deadline) -> Result<(), BuildkiteError> {
        self.read(&self.pipeline_url(), deadline).await.map(drop)
    }

    /// The build we created for `run_id`, found by its meta-data. Used when a create call
    /// failed in a way that leaves open whether the build exists (timeout, 5xx).
    pub async fn find_build(
        &self,
        run_id: &str,
        deadline: Deadline,
    ) -> Result<Option<Build>, BuildkiteError> {
        let mut url =
            Url::parse(&self.url("builds")).map_err(|e| BuildkiteError::Protocol(e.to_string()))?;
        url.query_pairs_mut()
            .append_pair("meta_data[run_id]", run_id)
            .append_pair("per_page", "2");
        let builds: Vec<Build> = Self::json(self.read(url.as_str(), deadline).await?).await?;
        Ok(builds.into_iter().find(|b| b.run_id() == Some(run_id)))
    }

    pub async fn get_build(
        &self,
        number: u64,
        deadline: Deadline,
    ) -> Result<Build, BuildkiteError> {
        let url = self.url(&format!("builds/{number}?include_retried_jobs=true"));
        Self::json(self.read(&url, deadline).await?).await
    }

    /// Cancels a build. A build that has already ended (422) is not an error: there is
    /// nothing left to cancel.
    pub async fn cancel_build(
        &self,
        number: u64,
        deadline: Deadline,
    ) -> Result<(), BuildkiteError> {
        let url = self.url(&format!("builds/{number}/cancel"));
        let result = self
            .retry
            .run(deadline, "Buildkite", || {
                // Canceling twice is harmless: the call may be repeated.
                self.attempt(Method::PUT, &url, None, true, deadline)
            })
            .await;
        match result {
            Ok(_) | Err(BuildkiteError::Rejected { status: 422, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Builds in any of `states`, newest first, 100 a page, down to build `down_to` (build
    /// numbers only grow, so older pages hold nothing we look for) or `max_pages` pages. When
    /// the call budget runs out after the first page, the pages read so far are returned.
    pub async fn list_builds(
        &self,
        states: &[&str],
        down_to: u64,
        max_pages: usize,
        deadline: Deadline,
    ) -> Result<Vec<Build>, BuildkiteError> {
        let mut url =
            Url::parse(&self.url("builds")).map_err(|e| BuildkiteError::Protocol(e.to_string()))?;
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("per_page", "100")
                .append_pair("include_retried_jobs", "true");
            for s in states {
                q.append_pair("state[]", s);
            }
        }
        let mut url = url.to_string();
        let mut all: Vec<Build> = Vec::new();
        for _ in 0..max_pages {
            let resp = match self.read(&url, deadline).await {
                Ok(resp) => resp,
                Err(BuildkiteError::OverBudget) if !all.is_empty() => return Ok(all),
                Err(e) => return Err(e),
            };
            let next = next_link(resp.headers());
            let page: Vec<Build> = Self::json(resp).await?;
            let done = page.is_empty() || page.iter().any(|b| b.number <= down_to);
            all.extend(page);
            match next {
                Some(n) if !done && n.starts_with(self.base.as_str().trim_end_matches('/')) => {
                    url = n;
                }
                _ => return Ok(all),
            }
        }
        Ok(all)
    }

    /// Every agent of the organization, following the `Link: rel="next"` pages (100 a page,
    /// [`MAX_AGENT_PAGES`] at most).
    pub async fn list_agents(&self, deadline: Deadline) -> Result<Vec<Agent>, BuildkiteError> {
        let mut url = format!(
            "{}/organizations/{}/agents?per_page=100",
            self.base.as_str().trim_end_matches('/'),
            self.org
        );
        let mut all = Vec::new();
        for _ in 0..MAX_AGENT_PAGES {
            let resp = self.read(&url, deadline).await?;
            let next = next_link(resp.headers());
            all.extend(Self::json::<Vec<Agent>>(resp).await?);
            match next {
                Some(n) if n.starts_with(self.base.as_str().trim_end_matches('/')) => url = n,
                _ => break,
            }
        }
        Ok(all)
    }

    /// Every artifact of a build, following the `Link: rel="next"` pages.
    pub async fn list_artifacts(
        &self,
        number: u64,
        deadline: Deadline,
    ) -> Result<Vec<Artifact>, BuildkiteError> {
        let mut url = self.url(&format!("builds/{number}/artifacts?per_page=100"));
        let mut all = Vec::new();
        for _ in 0..MAX_ARTIFACT_PAGES {
            let resp = self.read(&url, deadline).await?;
            let next = next_link(resp.headers());
            all.extend(Self::json::<Vec<Artifact>>(resp).await?);
            match next {
                // Only follow pages on the API we were configured with: the token goes along.
                Some(n) if n.starts_with(self.base.as_str().trim_end_matches('/')) => url = n,
                _ => break,
            }
        }
        Ok(all)
    }

    /// Downloads an artifact: the API answers 302 with a short-lived storage URL, which is
    /// fetched with a client that has no credentials. A retry asks the API anew, since the
    /// storage URL is only valid for about a minute.
    pub async fn download_artifact(
        &self,
        build_number: u64,
        artifact: &Artifact,
        deadline: Deadline,
    ) -> Result<Vec<u8>, BuildkiteError> {
        if artifact.file_size.is_some_and(|s| s > MAX_ARTIFACT_BYTES) {
            return Err(BuildkiteError::TooLarge);
        }
        let url = self.url(&format!(
            "builds/{build_number}/jobs/{}/artifacts/{}/download",
            artifact.job_id, artifact.id
        ));
        self.retry
            .run(deadline, "Buildkite artifacts", || {
                self.download_once(&url, deadline)
            })
            .await
    }

    async fn download_once(
        &self,
        url: &str,
        deadline: Deadline,
    ) -> Result<Vec<u8>, BuildkiteError> {
        let resp = self.attempt(Method::GET, url, None, true, deadline).await?;
        if !resp.status().is_redirection() {
            return read_capped(resp).await;
        }
        let location = resp
            .headers()
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .ok_or_else(|| BuildkiteError::Protocol("artifact redirect without Location".into()))?;
        let target = Url::parse(url)
            .and_then(|u| u.join(location))
            .map_err(|e| BuildkiteError::Protocol(format!("artifact Location: {e}")))?;
        self.fetch_storage(target, deadline).await
    }

    async fn fetch_storage(&self, url: Url, deadline: Deadline) -> Result<Vec<u8>, BuildkiteError> {
        let timeout = deadline
            .call_timeout(STORAGE_TIMEOUT)
            .ok_or_else(|| BuildkiteError::Unavailable("no time left for the download".into()))?;
        let resp = self
            .storage
            .get(url)
            .timeout(timeout)
            .send()
            .await
            .map_err(transport)?;
        let status = resp.status();
        if retry::is_transient(status) {
            return Err(BuildkiteError::Unavailable(format!(
                "artifact storage HTTP {status}"
            )));
        }
        if !status.is_success() {
            // The storage's own error text stays out of reports: it is not ours to show.
            return Err(BuildkiteError::Storage {
                status: status.as_u16(),
            });
        }
        read_capped(resp).await
    }
}

/// Reads a body, refusing more than [`MAX_ARTIFACT_BYTES`] (checked as it streams, since a
/// `Content-Length` can be absent).
async fn read_capped(mut resp: Response) -> Result<Vec<u8>, BuildkiteError> {
    if resp
        .content_length()
        .is_some_and(|l| l > MAX_ARTIFACT_BYTES)
    {
        return Err(BuildkiteError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(transport)? {
        if (body.len() + chunk.len()) as u64 > MAX_ARTIFACT_BYTES {
            return Err(BuildkiteError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The `rel="next"` URL of an RFC 8288 `Link` header.
fn next_link(headers: &header::HeaderMap) -> Option<String> {
    let link = headers.get(header::LINK)?.to_str().ok()?;
    link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        params
            .split(';')
            .any(|p| p.trim().replace(' ', "") == "rel=\"next\"")
            .then(|| {
                target
                    .trim()
                    .trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_owned()
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_next_page() {
        let mut h = header::HeaderMap::new();
        h.insert(
            header::LINK,
            r#"<https://api.buildkite.com/v2/x?page=3>; rel="last", <https://api.buildkite.com/v2/x?page=2>; rel="next""#
                .parse()
                .unwrap(),
        );
        assert_eq!(
            next_link(&h).as_deref(),
            Some("https://api.buildkite.com/v2/x?page=2")
        );
        h.insert(
            header::LINK,
            r#"<https://x/1>; rel="prev""#.parse().unwrap(),
        );
        assert_eq!(next_link(&h), None);
    }

    #[test]
    fn error_messages_come_from_the_body() {
        assert_eq!(
            error_message(r#"{"message":"Validation Failed","errors":["branch can't be blank"]}"#),
            r#"Validation Failed: ["branch can't be blank"]"#
        );
        assert_eq!(error_message("oops\n"), "oops");
    }
}
