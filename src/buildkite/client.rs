//! The Buildkite REST client: create, find, get and cancel builds, list and download artifacts.
//!
//! Every call is bounded by the invocation's [`Deadline`] and goes through the one retry
//! driver. Reads are retried on 429 (waiting `RateLimit-Reset`) and 5xx; creating a build is
//! retried only when it surely did not reach Buildkite (a refused connection, a 429): after a
//! timeout or a 5xx it is [`BuildkiteError::Unconfirmed`], for the caller to look up.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, Response, StatusCode, header};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use sha2::Digest;
use url::Url;

use super::budget::CallBudget;
use super::error::{Answered, BuildkiteError, MAX_ARTIFACT_BYTES};
use super::gate::{Priority, RateGate};
use super::model::{Agent, Artifact, Build, NewBuild};
use crate::config::BuildkiteConfig;
use crate::retry::{self, Deadline, Policy};
use crate::time::Clock;
use crate::window::SharedWindows;

/// The least time a call is sent with after a wait for a reset.
const MIN_TRY: Duration = Duration::from_millis(250);
const API_TIMEOUT: Duration = Duration::from_secs(10);
const STORAGE_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_ARTIFACT_PAGES: u32 = 10;
/// 1000 agents: far more than any donated fleet.
const MAX_AGENT_PAGES: u32 = 10;

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
    /// What Buildkite last said of the rate limit, shared by every clone.
    gate: RateGate,
}

/// What a call addresses, which decides what its 404 means.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// The pipeline itself (create, list, look up): a 404 means the pipeline is not there.
    Pipeline,
    /// One thing in it (a build, its artifacts, the agents): a 404 means only that is missing.
    Item,
}

/// One REST call.
struct Call<'a> {
    method: Method,
    url: &'a str,
    body: Option<&'a NewBuild>,
    /// May be sent again after an answer was lost.
    idempotent: bool,
    scope: Scope,
    /// Whether it may take a window's last calls.
    priority: Priority,
}

impl<'a> Call<'a> {
    fn get(url: &'a str, scope: Scope) -> Self {
        Self {
            method: Method::GET,
            url,
            body: None,
            idempotent: true,
            scope,
            priority: Priority::Finish,
        }
    }

    /// A call that leaves a window's last requests to creates and finishes.
    fn routine(mut self) -> Self {
        self.priority = Priority::Routine;
        self
    }
}

fn transport(e: reqwest::Error) -> BuildkiteError {
    BuildkiteError::unavailable(e.without_url())
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
    crate::text::truncate(&message, 500)
}

fn rate_limit_reset(resp: &Response) -> Option<Duration> {
    let h = resp.headers();
    ["ratelimit-reset", "ratelimit-user-reset", "retry-after"]
        .iter()
        .filter_map(|name| h.get(*name)?.to_str().ok()?.trim().parse::<u64>().ok())
        .max()
        .map(Duration::from_secs)
}

/// Turns an answer into the response or the error it stands for. This is the one place
/// that decides a refusal means the pipeline is misconfigured.
async fn classify(resp: Response, call: &Call<'_>) -> Result<Response, BuildkiteError> {
    let status = resp.status();
    if status == StatusCode::TOO_MANY_REQUESTS {
        return Err(BuildkiteError::RateLimited {
            reset: rate_limit_reset(&resp),
        });
    }
    if status.is_success() || status.is_redirection() {
        return Ok(resp);
    }
    let message = error_message(&resp.text().await.unwrap_or_default());
    let pipeline_gone = status == StatusCode::NOT_FOUND && call.scope == Scope::Pipeline;
    Err(match status {
        s if s.is_server_error() => {
            let answered = Answered { status, message };
            if call.idempotent {
                BuildkiteError::unavailable(answered)
            } else {
                BuildkiteError::Unconfirmed(answered.into())
            }
        }
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => BuildkiteError::Misconfigured {
            status: status.as_u16(),
            message,
        },
        _ if pipeline_gone => BuildkiteError::Misconfigured {
            status: status.as_u16(),
            message,
        },
        s => BuildkiteError::Rejected {
            status: s.as_u16(),
            message,
        },
    })
}

/// Whether `url` is under `base`: the same scheme, host and port, and a path at or below
/// base's, on a `/` boundary (`https://api.example` must not admit `https://api.example.evil`).
fn on_api(base: &Url, url: &str) -> bool {
    let Ok(url) = Url::parse(url) else {
        return false;
    };
    let root = base.path().trim_end_matches('/');
    let path = url.path();
    url.origin() == base.origin() && (path == root || path.starts_with(&format!("{root}/")))
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

impl BuildkiteClient {
    pub(crate) fn new(config: &BuildkiteConfig) -> Result<Self, BuildkiteError> {
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
            gate: RateGate::default(),
        })
    }

    /// This client, timing Buildkite's rate-limit windows on `clock`.
    pub(crate) fn with_clock(mut self, clock: Clock) -> Self {
        self.gate = self.gate.with_clock(clock);
        self
    }

    /// This client, spending Buildkite's window together with every instance that shares
    /// `windows` and this token. The window is named by a fingerprint of the token (a hash
    /// that cannot be turned back into it), as Buildkite counts per token.
    pub(crate) fn with_windows(mut self, windows: Arc<dyn SharedWindows>) -> Self {
        let digest = sha2::Sha256::digest(self.token.expose_secret().as_bytes());
        let name = format!("buildkite/{}", hex::encode(&digest[..8]));
        self.gate = self.gate.shared(windows, name);
        self
    }

    /// Whether this client's call budget (if it has one) is spent.
    pub(crate) fn over_budget(&self) -> bool {
        self.budget.as_ref().is_some_and(CallBudget::spent)
    }

    /// Whether Buildkite's window, as this instance was told it, has room for a call of
    /// `priority` now.
    pub(crate) fn allows(&self, priority: Priority) -> bool {
        self.gate.allows(priority)
    }

    /// This client, counting every API call against `budget`.
    pub(crate) fn with_budget(&self, budget: CallBudget) -> Self {
        Self {
            budget: Some(budget),
            ..self.clone()
        }
    }

    pub(crate) fn with_retry(mut self, retry: Policy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the time limit of each REST call (default 10 s).
    pub(crate) fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn api_base(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    fn pipeline_url(&self) -> String {
        format!(
            "{}/organizations/{}/pipelines/{}",
            self.api_base(),
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
        call: &Call<'_>,
        deadline: Deadline,
    ) -> Result<Response, BuildkiteError> {
        self.admit(call.priority, deadline).await?;
        let sent_at = self.gate.now();
        // A call the gate let go that ends without an answer is no longer on its way: it was
        // not sent, or the service counted it or never will.
        let unanswered = |e: BuildkiteError| {
            self.gate.answered(sent_at);
            e
        };
        let timeout = deadline
            .call_timeout(self.timeout)
            .ok_or_else(|| unanswered(BuildkiteError::unavailable("no time left for the call")))?;
        if self.budget.as_ref().is_some_and(|b| !b.take()) {
            return Err(unanswered(BuildkiteError::OverBudget));
        }
        let mut req = self
            .api
            .request(call.method.clone(), call.url)
            .timeout(timeout)
            .bearer_auth(self.token.expose_secret());
        if let Some(b) = call.body {
            req = req.json(b);
        }
        match req.send().await {
            Ok(resp) => {
                self.noted(&resp, sent_at).await;
                match classify(resp, call).await {
                    // The gate holds the reset now: the retry waits there, on the service's
                    // clock, or comes back at once with the time left.
                    Err(BuildkiteError::RateLimited { .. }) => Err(BuildkiteError::RateLimited {
                        reset: Some(Duration::ZERO),
                    }),
                    answered => answered,
                }
            }
            // A request that may have reached Buildkite is not repeated unless idempotent.
            Err(e) if call.idempotent || e.is_connect() => Err(unanswered(transport(e))),
            Err(e) => Err(unanswered(BuildkiteError::Unconfirmed(
                e.without_url().into(),
            ))),
        }
    }

    /// Lets a call go within the rate limit Buildkite last told: at once, after a wait for
    /// the window's reset that the retry policy would also wait, or not at all (a 429 of our
    /// own, with the time to the reset, for the caller to defer the work).
    async fn admit(&self, priority: Priority, deadline: Deadline) -> Result<(), BuildkiteError> {
        let Err(wait) = self.gate.take(priority).await else {
            return Ok(());
        };
        let span = std::time::Duration::from_millis(wait.max(0) as u64);
        let refused = BuildkiteError::RateLimited { reset: Some(span) };
        if span > self.retry.max_wait || deadline.remaining() < span + MIN_TRY {
            return Err(refused);
        }
        self.gate.wait(wait).await;
        self.gate.take(priority).await.map_err(|_| refused)
    }

    /// What an answer says of the rate limit. A 429's own wait is left to [`Self::admit`]
    /// (the retry comes back at once and waits there, on the service's clock).
    async fn noted(&self, resp: &Response, sent_at: crate::time::Millis) {
        if let Some(b) = &self.budget {
            b.observe(resp.headers());
        }
        if resp.status() == StatusCode::TOO_MANY_REQUESTS {
            let reset = rate_limit_reset(resp).map(|d| d.as_secs() as i64);
            self.gate.refused(reset, sent_at).await;
        } else {
            self.gate.observe(resp.headers(), sent_at).await;
        }
    }

    async fn run(&self, call: Call<'_>, deadline: Deadline) -> Result<Response, BuildkiteError> {
        self.retry
            .run(deadline, "Buildkite", || self.attempt(&call, deadline))
            .await
    }

    async fn json<T: DeserializeOwned>(resp: Response) -> Result<T, BuildkiteError> {
        let body = resp.bytes().await.map_err(transport)?;
        serde_json::from_slice(&body).map_err(BuildkiteError::protocol)
    }

    pub(crate) async fn create_build(
        &self,
        build: &NewBuild,
        deadline: Deadline,
    ) -> Result<Build, BuildkiteError> {
        let url = self.url("builds");
        let call = Call {
            method: Method::POST,
            url: &url,
            body: Some(build),
            idempotent: false,
            scope: Scope::Pipeline,
            priority: Priority::Create,
        };
        let resp = self.run(call, deadline).await?;
        // Buildkite answered 2xx: whatever goes wrong reading the body, the build exists.
        Self::json(resp)
            .await
            .map_err(|e| BuildkiteError::Unconfirmed(e.into()))
    }

    /// Checks that the configured pipeline exists and the token may read it.
    pub(crate) async fn check_pipeline(&self, deadline: Deadline) -> Result<(), BuildkiteError> {
        let url = self.pipeline_url();
        self.run(Call::get(&url, Scope::Pipeline).routine(), deadline)
            .await
            .map(drop)
    }

    /// The build we created for `run_id`, found by its meta-data. Used when a create call
    /// failed in a way that leaves open whether the build exists (timeout, 5xx).
    pub(crate) async fn find_build(
        &self,
        run_id: &str,
        deadline: Deadline,
    ) -> Result<Option<Build>, BuildkiteError> {
        let mut url = Url::parse(&self.url("builds")).map_err(BuildkiteError::protocol)?;
        url.query_pairs_mut()
            .append_pair("meta_data[run_id]", run_id)
            .append_pair("per_page", "2");
        let mut call = Call::get(url.as_str(), Scope::Pipeline);
        call.priority = Priority::Create;
        let resp = self.run(call, deadline).await?;
        let builds: Vec<Build> = Self::json(resp).await?;
        Ok(builds.into_iter().find(|b| b.run_id() == Some(run_id)))
    }

    pub(crate) async fn get_build(
        &self,
        number: u64,
        deadline: Deadline,
    ) -> Result<Build, BuildkiteError> {
        let url = self.url(&format!("builds/{number}?include_retried_jobs=true"));
        Self::json(self.run(Call::get(&url, Scope::Item), deadline).await?).await
    }

    /// Cancels a build. A build that has already ended (422) is not an error: there is
    /// nothing left to cancel.
    pub(crate) async fn cancel_build(
        &self,
        number: u64,
        deadline: Deadline,
    ) -> Result<(), BuildkiteError> {
        let url = self.url(&format!("builds/{number}/cancel"));
        let call = Call {
            method: Method::PUT,
            url: &url,
            body: None,
            // Canceling twice is harmless: the call may be repeated.
            idempotent: true,
            scope: Scope::Item,
            // A build nobody reads must not hold a GPU through a rush.
            priority: Priority::Create,
        };
        match self.run(call, deadline).await {
            Ok(_) | Err(BuildkiteError::Rejected { status: 422, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Builds in any of `states`, newest first, 100 a page, down to build `down_to` (build
    /// numbers only grow, so older pages hold nothing we look for) or `max_pages` pages. When
    /// the call budget runs out after the first page, the pages read so far are returned.
    pub(crate) async fn list_builds(
        &self,
        states: &[&str],
        down_to: u64,
        max_pages: usize,
        deadline: Deadline,
    ) -> Result<Vec<Build>, BuildkiteError> {
        let mut url = Url::parse(&self.url("builds")).map_err(BuildkiteError::protocol)?;
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
            // The sweep's listings find the builds that ended: they finish jobs.
            let mut call = Call::get(&url, Scope::Pipeline);
            call.priority = Priority::Create;
            let resp = match self.run(call, deadline).await {
                Ok(resp) => resp,
                Err(BuildkiteError::OverBudget) if !all.is_empty() => return Ok(all),
                Err(e) => return Err(e),
            };
            let next = self.next_page(resp.headers());
            let page: Vec<Build> = Self::json(resp).await?;
            let done = page.is_empty() || page.iter().any(|b| b.number <= down_to);
            // A listing reads no result from the meta-data (up to 100 KB a build): a deep
            // one must not hold a thousand of them.
            all.extend(page.into_iter().map(Build::without_result));
            match next {
                Some(n) if !done => url = n,
                _ => return Ok(all),
            }
        }
        Ok(all)
    }

    /// The next page's URL, if it is on the API we were configured with: the token goes
    /// along, so no other host is followed.
    fn next_page(&self, headers: &header::HeaderMap) -> Option<String> {
        next_link(headers).filter(|n| on_api(&self.base, n))
    }

    /// Every item of a paged listing, up to `max_pages` pages.
    async fn pages<T: DeserializeOwned>(
        &self,
        (first, priority): (String, Priority),
        max_pages: u32,
        deadline: Deadline,
    ) -> Result<Vec<T>, BuildkiteError> {
        let (mut url, mut all) = (first, Vec::new());
        for _ in 0..max_pages {
            let mut call = Call::get(&url, Scope::Item);
            call.priority = priority;
            let resp = self.run(call, deadline).await?;
            let next = self.next_page(resp.headers());
            all.extend(Self::json::<Vec<T>>(resp).await?);
            match next {
                Some(n) => url = n,
                None => break,
            }
        }
        Ok(all)
    }

    /// Every agent of the organization, following the `Link: rel="next"` pages (100 a page,
    /// [`MAX_AGENT_PAGES`] at most).
    pub(crate) async fn list_agents(
        &self,
        deadline: Deadline,
    ) -> Result<Vec<Agent>, BuildkiteError> {
        let url = format!(
            "{}/organizations/{}/agents?per_page=100",
            self.api_base(),
            self.org
        );
        // Fair share counts idle GPUs by it (a call a minute at most): it decides creates.
        self.pages((url, Priority::Create), MAX_AGENT_PAGES, deadline)
            .await
    }

    /// Every artifact of a build, following the `Link: rel="next"` pages.
    pub(crate) async fn list_artifacts(
        &self,
        number: u64,
        deadline: Deadline,
    ) -> Result<Vec<Artifact>, BuildkiteError> {
        let url = self.url(&format!("builds/{number}/artifacts?per_page=100"));
        self.pages((url, Priority::Finish), MAX_ARTIFACT_PAGES, deadline)
            .await
    }

    /// Downloads an artifact: the API answers 302 with a short-lived storage URL, which is
    /// fetched with a client that has no credentials. A retry asks the API anew, since the
    /// storage URL is only valid for about a minute.
    pub(crate) async fn download_artifact(
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

    /// Where an artifact can be downloaded from for a minute or so: the storage URL the API
    /// redirects to, without following it (a user's browser does, with no token of ours).
    /// One try: a click waits for no retry, and its user can click again.
    pub(crate) async fn artifact_location(
        &self,
        build_number: u64,
        (job_id, artifact_id): (&str, &str),
        deadline: Deadline,
    ) -> Result<Url, BuildkiteError> {
        let url = self.url(&format!(
            "builds/{build_number}/jobs/{job_id}/artifacts/{artifact_id}/download"
        ));
        let resp = self
            .attempt(&Call::get(&url, Scope::Item).routine(), deadline)
            .await?;
        if !resp.status().is_redirection() {
            return Err(BuildkiteError::protocol(
                "artifact download without a redirect",
            ));
        }
        redirect_target(&url, resp.headers())
    }

    async fn download_once(
        &self,
        url: &str,
        deadline: Deadline,
    ) -> Result<Vec<u8>, BuildkiteError> {
        let resp = self.attempt(&Call::get(url, Scope::Item), deadline).await?;
        if !resp.status().is_redirection() {
            return read_capped(resp).await;
        }
        let target = redirect_target(url, resp.headers())?;
        self.fetch_storage(target, deadline).await
    }

    async fn fetch_storage(&self, url: Url, deadline: Deadline) -> Result<Vec<u8>, BuildkiteError> {
        let timeout = deadline
            .call_timeout(STORAGE_TIMEOUT)
            .ok_or_else(|| BuildkiteError::unavailable("no time left for the download"))?;
        let resp = self
            .storage
            .get(url)
            .timeout(timeout)
            .send()
            .await
            .map_err(transport)?;
        let status = resp.status();
        if retry::is_transient(status) {
            return Err(BuildkiteError::unavailable(format!(
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

/// Where a redirect from `url` points.
fn redirect_target(url: &str, headers: &header::HeaderMap) -> Result<Url, BuildkiteError> {
    let location = headers
        .get(header::LOCATION)
        .and_then(|l| l.to_str().ok())
        .ok_or_else(|| BuildkiteError::protocol("artifact redirect without Location"))?;
    Url::parse(url)
        .and_then(|u| u.join(location))
        .map_err(BuildkiteError::protocol)
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
    fn only_pages_of_the_configured_api_are_followed() {
        let base = Url::parse("https://api.buildkite.com/v2").unwrap();
        for ok in [
            "https://api.buildkite.com/v2/organizations/o/agents?page=2",
            "https://api.buildkite.com/v2",
        ] {
            assert!(on_api(&base, ok), "{ok}");
        }
        for other in [
            "https://api.buildkite.com.evil.example/v2/x",
            "https://api.buildkite.com/v2evil/x",
            "http://api.buildkite.com/v2/x",
            "https://api.buildkite.com:8443/v2/x",
            "https://evil.example/v2/x",
            "not a url",
        ] {
            assert!(!on_api(&base, other), "{other}");
        }
        let bare = Url::parse("https://bk.internal").unwrap();
        assert!(on_api(&bare, "https://bk.internal/organizations/o"));
        assert!(!on_api(&bare, "https://bk.internal.evil/organizations/o"));
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
