//! The faults a test can queue on the stand-in: refused, slow, rate-limited or lost
//! creates, failing reads and downloads, a renamed pipeline, a seeded chaos rate.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::BuildkiteStandin;
use super::state::{Limit, Shared, bk_error, lock};

impl BuildkiteStandin {
    /// Every answer, REST and storage, waits `delay` first (`None`: answers at once).
    pub fn set_delay(&self, delay: Option<Duration>) {
        self.lock().delay = delay;
    }

    /// Every call so far as `METHOD path`, with when it arrived and when it was answered.
    pub fn call_spans(&self) -> Vec<(String, std::time::Instant, std::time::Instant)> {
        self.lock().spans.clone()
    }

    /// The agents API answers `status` from now on (`None`: it lists the agents again).
    pub fn fail_agents(&self, status: Option<u16>) {
        self.lock().agents_failure = status;
    }

    /// Creating a build answers `status` with `body` (e.g. 422 Validation Failed).
    pub fn fail_create(&self, status: u16, body: Value) {
        self.lock().create_failure = Some((status, body));
    }

    /// Creating a build succeeds but the answer comes only after `delay` (a slow Buildkite).
    pub fn slow_create(&self, delay: Duration) {
        self.lock().create_delay = Some(delay);
    }

    /// The next creates answer `status`; with `created`, after creating the build (its answer
    /// lost), else without. A 429 carries `RateLimit-Reset: reset_secs`.
    pub fn fail_creates(&self, faults: &[(u16, bool)], reset_secs: u64) {
        let mut s = self.lock();
        s.create_faults.extend(faults);
        s.create_reset_secs = reset_secs;
    }

    /// The pipeline is renamed: every call to the configured one answers 404.
    pub fn rename_pipeline(&self, new_slug: &str) {
        self.lock().pipeline = new_slug.to_owned();
    }

    /// From now on a share `rate` of creates fail (429, or 5xx with or without the build made)
    /// and of webhooks are dropped, duplicated or delayed past the next one, drawn from a
    /// generator seeded with `seed`.
    pub fn chaos(&self, seed: u64, rate: f64) {
        self.lock().chaos = Some((rate, fastrand::Rng::with_seed(seed)));
    }

    /// From now on every API answer says `RateLimit-Remaining: n`, one less each call.
    pub fn rate_limit_remaining(&self, n: i64) {
        self.lock().rate_remaining = Some(n);
    }

    /// From now on the REST API allows `calls` a minute (Buildkite's default: 50 a token),
    /// with `RateLimit-Remaining` and `RateLimit-Reset` on every answer and a 429 past it.
    pub fn enforce_rate_limit(&self, calls: u32) {
        let mut s = self.lock();
        let now = s.clock.now();
        s.limit = Some(Limit {
            calls,
            window: 60_000,
            started: now,
            used: 0,
            refused: 0,
            history: Vec::new(),
        });
    }

    /// Calls taken in each window of the enforced limit so far, the current one last.
    pub fn rate_limit_windows(&self) -> Vec<u32> {
        let s = self.lock();
        s.limit.as_ref().map_or_else(Vec::new, |l| {
            let mut all = l.history.clone();
            all.push(l.used);
            all
        })
    }

    /// How many calls the enforced limit answered 429.
    pub fn rate_limited_calls(&self) -> usize {
        self.lock().limit.as_ref().map_or(0, |l| l.refused)
    }

    /// The next reads of build `number` (the build, its artifacts, downloads) answer these.
    pub fn fail_build_reads(&self, number: u64, statuses: &[u16]) {
        self.lock()
            .build_read_failures
            .entry(number)
            .or_default()
            .extend(statuses);
    }

    /// The next REST reads answer these statuses.
    pub fn fail_reads(&self, statuses: &[u16]) {
        self.lock().read_failures.extend(statuses);
    }

    /// Storage answers every download with `status` and `body` (an S3 error document, say).
    pub fn fail_storage(&self, status: u16, body: &str) {
        self.lock().storage_failure = Some((status, body.to_owned()));
    }

    /// The artifact download endpoint answers `status` with `body` instead of its 302.
    pub fn fail_download_page(&self, status: u16, body: &str) {
        self.lock().download_failure = Some((status, body.to_owned()));
    }

    /// Downloads of build `number`'s artifacts never answer: a read that never comes back
    /// (`false`: they answer again).
    pub fn stall_downloads(&self, number: u64, stalled: bool) {
        let mut s = self.lock();
        if stalled {
            s.stalled_downloads.insert(number);
        } else {
            s.stalled_downloads.remove(&number);
        }
    }

    /// The artifact download endpoint answers its 302 again.
    pub fn clear_download_failure(&self) {
        self.lock().download_failure = None;
    }
}

/// Buildkite's rate-limit headers on every API answer, once a test has set a remaining count.
pub(super) async fn rate_limit_headers(
    State(inner): State<Shared>,
    mut response: Response,
) -> Response {
    let mut s = lock(&inner);
    let now = s.clock.now();
    if let Some(l) = s.limit.as_mut() {
        l.roll(now);
        let headers = [
            ("ratelimit-limit", l.calls.to_string()),
            (
                "ratelimit-remaining",
                l.calls.saturating_sub(l.used).to_string(),
            ),
            ("ratelimit-reset", l.reset_secs(now).to_string()),
        ];
        for (name, value) in headers {
            if let Ok(v) = value.parse() {
                response.headers_mut().entry(name).or_insert(v);
            }
        }
    }
    if let Some(n) = s.rate_remaining {
        s.rate_remaining = Some(n - 1);
        for name in ["ratelimit-remaining", "ratelimit-user-remaining"] {
            if let Ok(v) = n.max(0).to_string().parse() {
                response.headers_mut().insert(name, v);
            }
        }
    }
    response
}

/// A failed create's answer, as Buildkite words it.
pub(super) fn create_fault(code: u16, reset_secs: u64) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if code == 429 {
        let body = json!({"message": format!("You have exceeded your API rate limit. Please wait {reset_secs} seconds before making more requests."),
            "scope": "rest", "limit": 200, "current": 201, "reset": reset_secs});
        return (
            status,
            [
                ("ratelimit-reset", reset_secs.to_string()),
                ("ratelimit-remaining", "0".into()),
            ],
            Json(body),
        )
            .into_response();
    }
    bk_error(status, "Internal Server Error")
}
