//! A Buildkite stand-in: the REST endpoints we call (create build 201, get build, list
//! artifacts, download answering 302 to a storage URL that refuses any request carrying
//! `Authorization`, as presigned S3 URLs do), plus sending signed webhooks as Buildkite does.
//!
//! With [`BuildkiteStandin::autorun`] it also plays the agent: each new build is scheduled,
//! runs its step, uploads `result.json` and finishes, with a webhook at every step.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::buildkite::webhook::sign;

#[derive(Clone, Debug)]
pub struct StandinArtifact {
    pub id: String,
    pub job_id: String,
    pub path: String,
    pub state: String,
    pub bytes: Vec<u8>,
}

#[derive(Clone, Debug)]
pub struct StandinBuild {
    pub id: String,
    pub number: u64,
    pub state: String,
    pub blocked: bool,
    pub branch: String,
    pub commit: String,
    pub message: String,
    pub env: BTreeMap<String, String>,
    pub meta_data: BTreeMap<String, String>,
    pub jobs: Vec<String>,
    /// The evaluation step (`key: evaluate`) has started on an agent.
    pub eval_started: bool,
    pub artifacts: Vec<StandinArtifact>,
}

/// What the agent's step produced: whether the command succeeded, and the `result.json` it
/// left for upload (Buildkite uploads artifacts whether or not the command succeeded).
#[derive(Clone, Debug, Default)]
pub struct StepOutcome {
    pub passed: bool,
    pub result: Option<Vec<u8>>,
}

impl StepOutcome {
    /// A step that passed and wrote `result`.
    pub fn passed(result: Vec<u8>) -> Self {
        Self {
            passed: true,
            result: Some(result),
        }
    }
}

/// Runs a build's step from its env (the agent's work).
pub type StepRunner = Arc<dyn Fn(&BTreeMap<String, String>) -> StepOutcome + Send + Sync>;

#[derive(Clone)]
struct AutoRun {
    webhook_url: String,
    secret: String,
    step: StepRunner,
}

struct Inner {
    token: String,
    base: String,
    org: String,
    pipeline: String,
    builds: Vec<StandinBuild>,
    create_failure: Option<(u16, Value)>,
    /// The next creates answer these statuses, having created the build first when `true`
    /// (an answer lost after the work was done).
    create_faults: VecDeque<(u16, bool)>,
    /// `RateLimit-Reset` on a 429 to a create.
    create_reset_secs: u64,
    /// When set, every API answer carries `RateLimit-Remaining` counting down from it.
    rate_remaining: Option<i64>,
    /// Seeded everyday faults on creates and webhooks: (rate, generator).
    chaos: Option<(f64, fastrand::Rng)>,
    create_delay: Option<Duration>,
    read_failures: VecDeque<u16>,
    /// Reads under one build's path answer these statuses first.
    build_read_failures: std::collections::HashMap<u64, VecDeque<u16>>,
    storage_auth_rejections: usize,
    /// What storage answers every download with, when set: status and body.
    storage_failure: Option<(u16, String)>,
    /// What the artifact download endpoint answers, when set: status and body (HTML, say).
    download_failure: Option<(u16, String)>,
    storage_downloads: usize,
    api_calls: Vec<String>,
    autorun: Option<AutoRun>,
    /// What `GET /organizations/{org}/agents` lists, as the API shows agents.
    agents: Vec<Value>,
    /// The agents API answers this status instead (403: a token without `read_agents`).
    agents_failure: Option<u16>,
}

#[derive(Clone)]
pub struct BuildkiteStandin {
    /// Use as `BUILDKITE_API_URL`.
    pub api_url: String,
    pub org: String,
    pub pipeline: String,
    inner: Arc<Mutex<Inner>>,
}

type Shared = Arc<Mutex<Inner>>;

fn lock(inner: &Shared) -> MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    /// Where build `number` is: builds are numbered 1, 2, … as created and never removed,
    /// so this is a lookup, not a search (a load run holds thousands).
    fn index_of(&self, number: u64) -> Option<usize> {
        let i = usize::try_from(number).ok()?.checked_sub(1)?;
        (self.builds.get(i)?.number == number).then_some(i)
    }

    fn build_mut(&mut self, number: u64) -> Option<&mut StandinBuild> {
        let i = self.index_of(number)?;
        self.builds.get_mut(i)
    }

    /// A fault for this call, `0..kinds`, at the chaos rate.
    fn roll(&mut self, kinds: u8) -> Option<u8> {
        let (rate, rng) = self.chaos.as_mut()?;
        (rng.f64() < *rate).then(|| rng.u8(0..kinds))
    }

    fn build_api_url(&self, n: u64) -> String {
        format!(
            "{}/v2/organizations/{}/pipelines/{}/builds/{n}",
            self.base, self.org, self.pipeline
        )
    }

    fn web_url(&self, n: u64) -> String {
        format!(
            "https://buildkite.com/{}/{}/builds/{n}",
            self.org, self.pipeline
        )
    }

    fn build_json(&self, b: &StandinBuild, with_jobs: bool) -> Value {
        let api = self.build_api_url(b.number);
        let mut v = json!({
            "id": b.id, "graphql_id": format!("QnVpbGQt{}", b.number), "url": api,
            "web_url": self.web_url(b.number), "number": b.number, "state": b.state,
            "blocked": b.blocked, "message": b.message, "commit": b.commit, "branch": b.branch,
            "source": "api", "creator": {"id": "u1", "name": "kernelbot"},
            "created_at": "2026-11-21T10:00:00.000Z", "meta_data": b.meta_data,
            "pipeline": {"slug": self.pipeline},
        });
        if with_jobs {
            v["env"] = json!(b.env);
            v["jobs"] = b
                .jobs
                .iter()
                .map(|j| {
                    json!({"id": j, "type": "script", "name": ":rocket: Kernel Evaluation",
                    "step_key": "evaluate", "state": b.state,
                    "started_at": b.eval_started.then_some("2026-11-21T10:00:02.000Z"),
                    "finished_at": (b.eval_started && crate::buildkite::model::TERMINAL_STATES.contains(&b.state.as_str()))
                        .then_some("2026-11-21T10:00:47.500Z"),
                    "artifacts_url": format!("{api}/jobs/{j}/artifacts")})
                })
                .collect();
        }
        v
    }
}

fn bk_error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({"message": message}))).into_response()
}

impl BuildkiteStandin {
    pub async fn start(token: &str, org: &str, pipeline: &str) -> std::io::Result<Self> {
        let inner = Arc::new(Mutex::new(Inner {
            token: token.to_owned(),
            base: String::new(),
            org: org.to_owned(),
            pipeline: pipeline.to_owned(),
            builds: Vec::new(),
            create_failure: None,
            create_faults: VecDeque::new(),
            create_reset_secs: 30,
            rate_remaining: None,
            chaos: None,
            create_delay: None,
            read_failures: VecDeque::new(),
            build_read_failures: std::collections::HashMap::new(),
            storage_auth_rejections: 0,
            storage_failure: None,
            download_failure: None,
            storage_downloads: 0,
            api_calls: Vec::new(),
            autorun: None,
            agents: Vec::new(),
            agents_failure: None,
        }));
        let p = "/v2/organizations/{org}/pipelines/{pipeline}/builds";
        let router = Router::new()
            .route(p, post(create_build).get(list_builds))
            .route(&format!("{p}/{{number}}"), get(get_build))
            .route(
                &format!("{p}/{{number}}/cancel"),
                axum::routing::put(cancel_build),
            )
            .route(&format!("{p}/{{number}}/artifacts"), get(list_artifacts))
            .route(
                &format!("{p}/{{number}}/jobs/{{job}}/artifacts"),
                get(list_job_artifacts),
            )
            .route(
                &format!("{p}/{{number}}/jobs/{{job}}/artifacts/{{id}}/download"),
                get(download),
            )
            .route(
                "/v2/organizations/{org}/pipelines/{pipeline}",
                get(get_pipeline),
            )
            .route("/storage/{number}/{id}", get(storage))
            .route("/v2/organizations/{org}/agents", get(list_agents))
            .layer(axum::middleware::map_response_with_state(
                inner.clone(),
                rate_limit_headers,
            ))
            .with_state(inner.clone());
        let addr = super::spawn(router).await?;
        lock(&inner).base = format!("http://{addr}");
        Ok(Self::from_shared(inner))
    }

    /// The handle for a stand-in's state (what its own request handlers hold).
    fn from_shared(inner: Shared) -> Self {
        let (api_url, org, pipeline) = {
            let s = lock(&inner);
            (format!("{}/v2", s.base), s.org.clone(), s.pipeline.clone())
        };
        Self {
            api_url,
            org,
            pipeline,
            inner,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Sets the organization's agents: `(name, queue tag, connection state, busy)`.
    pub fn set_agents(&self, agents: &[(&str, &str, &str, bool)]) {
        self.lock().agents = agents
            .iter()
            .enumerate()
            .map(|(i, (name, queue, connection, busy))| {
                json!({"id": format!("agent-{i}"), "name": name, "connection_state": connection,
                       "hostname": "gpu-node-1", "meta_data": [format!("queue={queue}"), format!("gpu={i}")],
                       "job": busy.then(|| json!({"id": format!("job-{i}"), "state": "running"}))})
            })
            .collect();
    }

    /// The agents API answers `status` from now on (`None`: it lists the agents again).
    pub fn fail_agents(&self, status: Option<u16>) {
        self.lock().agents_failure = status;
    }

    /// How many times the agents API was called.
    pub fn agent_calls(&self) -> usize {
        self.lock()
            .api_calls
            .iter()
            .filter(|c| c.ends_with("/agents"))
            .count()
    }

    /// Every build created, in order.
    pub fn builds(&self) -> Vec<StandinBuild> {
        self.lock().builds.clone()
    }

    pub fn build(&self, number: u64) -> Option<StandinBuild> {
        let s = self.lock();
        s.index_of(number).map(|i| s.builds[i].clone())
    }

    /// Every REST call as `METHOD path`.
    pub fn api_calls(&self) -> Vec<String> {
        self.lock().api_calls.clone()
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

    /// The evaluation step starts on an agent: the build runs.
    pub fn start_eval(&self, number: u64) {
        if let Some(b) = self.lock().build_mut(number) {
            b.state = "running".into();
            b.eval_started = true;
        }
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

    /// Storage requests refused because they carried an `Authorization` header.
    pub fn storage_auth_rejections(&self) -> usize {
        self.lock().storage_auth_rejections
    }

    pub fn storage_downloads(&self) -> usize {
        self.lock().storage_downloads
    }

    /// Moves a build to `state` (`blocked` sets the blocked flag on a passed build).
    pub fn set_state(&self, number: u64, state: &str) {
        if let Some(b) = self.lock().build_mut(number) {
            b.blocked = state == "blocked";
            b.state = if state == "blocked" {
                "passed".into()
            } else {
                state.into()
            };
        }
    }

    /// Adds an artifact to the build's latest job, or a new retried job when `new_job`.
    pub fn upload(&self, number: u64, path: &str, bytes: Vec<u8>, state: &str, new_job: bool) {
        if let Some(b) = self.lock().build_mut(number) {
            if new_job {
                b.jobs.push(uuid::Uuid::new_v4().to_string());
            }
            let job_id = b.jobs.last().cloned().unwrap_or_default();
            b.artifacts.push(StandinArtifact {
                id: uuid::Uuid::new_v4().to_string(),
                job_id,
                path: path.to_owned(),
                state: state.to_owned(),
                bytes,
            });
        }
    }

    /// The webhook body Buildkite would send for `event` on build `number` now.
    pub fn webhook_body(&self, event: &str, number: u64) -> Vec<u8> {
        let s = self.lock();
        let build = s
            .index_of(number)
            .map(|i| s.build_json(&s.builds[i], false));
        let mut body = json!({"event": event, "build": build, "pipeline": {"slug": s.pipeline, "name": s.pipeline},
            "sender": {"id": "u1", "name": "Buildkite"}});
        if event.starts_with("job.")
            && let Some(b) = s.index_of(number).map(|i| &s.builds[i])
        {
            body["job"] = json!({"id": b.jobs.last(), "type": "script", "step_key": "evaluate",
                "state": "running", "started_at": "2026-11-21T10:00:02.000Z"});
        }
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// Plays the agent for every new build: see the module docs.
    pub fn autorun(&self, webhook_url: &str, secret: &str, step: StepRunner) {
        self.lock().autorun = Some(AutoRun {
            webhook_url: webhook_url.to_owned(),
            secret: secret.to_owned(),
            step,
        });
    }
}

/// Sends a webhook as Buildkite does: `X-Buildkite-Event` and a signature over
/// `<timestamp>.<body>` made with `secret` at `timestamp`.
pub async fn deliver(
    url: &str,
    secret: &str,
    event: &str,
    body: Vec<u8>,
    timestamp: i64,
) -> reqwest::Result<reqwest::Response> {
    let ts = timestamp.to_string();
    let signature = format!("timestamp={ts},signature={}", sign(secret, &ts, &body));
    reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("x-buildkite-event", event)
        .header("x-buildkite-signature", signature)
        .body(body)
        .send()
        .await
}

pub fn unix_now() -> i64 {
    crate::jobs::model::now_millis() / 1000
}

fn authorized(s: &Inner, req: &Request) -> bool {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {}", s.token))
}

/// Common checks for REST calls: auth, then an injected failure if one is queued.
fn gate(s: &mut Inner, req: &Request, read: bool) -> Option<Response> {
    s.api_calls
        .push(format!("{} {}", req.method(), req.uri().path()));
    if !authorized(s, req) {
        return Some(bk_error(
            StatusCode::UNAUTHORIZED,
            "No valid API token provided",
        ));
    }
    let pipeline = format!("/v2/organizations/{}/pipelines/{}", s.org, s.pipeline);
    let path = req.uri().path();
    if path != pipeline && !path.starts_with(&format!("{pipeline}/")) {
        return Some(bk_error(StatusCode::NOT_FOUND, "Not Found"));
    }
    let build_failure = path
        .strip_prefix(&format!("{pipeline}/builds/"))
        .and_then(|rest| rest.split('/').next()?.parse::<u64>().ok())
        .filter(|_| read)
        .and_then(|n| s.build_read_failures.get_mut(&n)?.pop_front());
    if read && let Some(code) = build_failure.or_else(|| s.read_failures.pop_front()) {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if code == 429 {
            return Some((status, [("ratelimit-reset", "1")], Json(json!({"message": "You have exceeded your API rate limit. Please wait 1 seconds before making more requests.", "scope": "rest_user", "limit": 50, "current": 55, "reset": 1}))).into_response());
        }
        return Some(bk_error(status, "Internal Server Error"));
    }
    None
}

async fn create_build(
    State(inner): State<Shared>,
    Path((_org, _pipe)): Path<(String, String)>,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, 10 * 1024 * 1024)
        .await
        .unwrap_or_default();
    let req = Request::from_parts(parts, axum::body::Body::empty());
    let (response, delay) = create_locked(&inner, &req, &bytes);
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    response
}

fn create_locked(inner: &Shared, req: &Request, bytes: &[u8]) -> (Response, Option<Duration>) {
    let mut s = lock(inner);
    if let Some(r) = gate(&mut s, req, false) {
        return (r, None);
    }
    let chaos = s.roll(3).map(|k| match k {
        0 => (429, false),
        1 => (502, true),
        _ => (503, false),
    });
    let fault = s.create_faults.pop_front().or(chaos);
    if let Some((code, false)) = fault {
        return (create_fault(code, s.create_reset_secs), None);
    }
    if let Some((code, body)) = s.create_failure.clone() {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::UNPROCESSABLE_ENTITY);
        return ((status, Json(body)).into_response(), None);
    }
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        return (
            bk_error(StatusCode::BAD_REQUEST, "Problems parsing JSON"),
            None,
        );
    };
    let text = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
    if text("commit").is_empty() || text("branch").is_empty() {
        let body = json!({"message": "Validation Failed", "errors": [{"field": "commit", "code": "missing"}]});
        return (
            (StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response(),
            None,
        );
    }
    let map = |k: &str| -> BTreeMap<String, String> {
        v[k].as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            v.as_str().map_or_else(|| v.to_string(), str::to_owned),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let number = s.builds.len() as u64 + 1;
    let build = StandinBuild {
        id: uuid::Uuid::new_v4().to_string(),
        number,
        state: "scheduled".into(),
        blocked: false,
        branch: text("branch"),
        commit: text("commit"),
        message: text("message"),
        env: map("env"),
        meta_data: map("meta_data"),
        jobs: vec![uuid::Uuid::new_v4().to_string()],
        eval_started: false,
        artifacts: Vec::new(),
    };
    let body = s.build_json(&build, true);
    s.builds.push(build);
    if let Some(run) = s.autorun.clone() {
        tokio::spawn(play_agent(inner.clone(), run, number));
    }
    if let Some((code, true)) = fault {
        return (create_fault(code, s.create_reset_secs), None);
    }
    (
        (StatusCode::CREATED, Json(body)).into_response(),
        s.create_delay,
    )
}

/// Buildkite's rate-limit headers on every API answer, once a test has set a remaining count.
async fn rate_limit_headers(State(inner): State<Shared>, mut response: Response) -> Response {
    let mut s = lock(&inner);
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
fn create_fault(code: u16, reset_secs: u64) -> Response {
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

/// `PUT .../builds/{number}/cancel`: cancels a live build (422 once it has ended) and, when
/// playing the agent, sends `build.finished` as Buildkite does.
async fn cancel_build(
    State(inner): State<Shared>,
    Path((_o, _p, number)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    let (response, run) = {
        let mut s = lock(&inner);
        if let Some(r) = gate(&mut s, &req, false) {
            return r;
        }
        let Some(i) = find(&s, &number) else {
            return bk_error(StatusCode::NOT_FOUND, "Not Found");
        };
        if !matches!(
            s.builds[i].state.as_str(),
            "scheduled" | "running" | "failing"
        ) {
            return bk_error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Build can't be canceled because it's already finished",
            );
        }
        s.builds[i].state = "canceled".into();
        (
            Json(s.build_json(&s.builds[i], true)).into_response(),
            s.autorun.clone(),
        )
    };
    if let (Some(run), Ok(n)) = (run, number.parse::<u64>()) {
        let bk = BuildkiteStandin::from_shared(inner);
        tokio::spawn(async move {
            let body = bk.webhook_body("build.finished", n);
            let _ = deliver(
                &run.webhook_url,
                &run.secret,
                "build.finished",
                body,
                unix_now(),
            )
            .await;
        });
    }
    response
}

/// `GET .../pipelines/{slug}`: the pipeline, if the token may read it.
async fn get_pipeline(State(inner): State<Shared>, req: Request) -> Response {
    let mut s = lock(&inner);
    if let Some(r) = gate(&mut s, &req, true) {
        return r;
    }
    Json(json!({"slug": s.pipeline, "name": s.pipeline})).into_response()
}

/// The agent's side of a build: webhooks for scheduled and running, the step, the upload,
/// and build.finished.
async fn play_agent(inner: Shared, run: AutoRun, number: u64) {
    let bk = BuildkiteStandin::from_shared(inner);
    let send = |event: &'static str| {
        let (bk, run) = (bk.clone(), run.clone());
        async move {
            let body = bk.webhook_body(event, number);
            let post = move || {
                let (run, body) = (run.clone(), body.clone());
                async move {
                    if let Err(e) =
                        deliver(&run.webhook_url, &run.secret, event, body, unix_now()).await
                    {
                        tracing::warn!(error = %e.without_url(), event, "stand-in could not deliver webhook");
                    }
                }
            };
            let fault = lock(&bk.inner).roll(3);
            match fault {
                // Lost on the way.
                Some(0) => {}
                Some(1) => {
                    post().await;
                    post().await;
                }
                // Overtaken by the next event.
                Some(_) => {
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        post().await;
                    });
                }
                None => post().await,
            }
        }
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    send("build.scheduled").await;
    bk.set_state(number, "running");
    send("build.running").await;
    bk.start_eval(number);
    send("job.started").await;
    let env = bk.build(number).map(|b| b.env).unwrap_or_default();
    let step = run.step.clone();
    let outcome = tokio::task::spawn_blocking(move || step(&env))
        .await
        .unwrap_or_default();
    if bk.build(number).is_some_and(|b| b.state == "canceled") {
        // Canceled while it ran: the agent stops; the cancel sent build.finished.
        return;
    }
    if let Some(bytes) = outcome.result {
        bk.upload(number, "result.json", bytes, "finished", false);
    }
    bk.set_state(number, if outcome.passed { "passed" } else { "failed" });
    send("build.finished").await;
}

/// `GET .../builds`: newest first, filtered by `meta_data[k]=v` and `state[]=s` (a blocked
/// build is listed under `blocked`), `per_page` (at most 100) a `page`, with a `Link` header
/// to the next page while there is one.
async fn list_builds(
    State(inner): State<Shared>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let mut s = lock(&inner);
    if let Some(r) = gate(&mut s, &req, true) {
        return r;
    }
    let pairs = query_pairs(query);
    let meta: Vec<(&str, &str)> = pairs
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("meta_data[")?.strip_suffix(']')?, v.as_str())))
        .collect();
    let states: Vec<&str> = pairs
        .iter()
        .filter(|(k, _)| k == "state[]" || k == "state")
        .map(|(_, v)| v.as_str())
        .collect();
    let matching: Vec<&StandinBuild> = s
        .builds
        .iter()
        .rev()
        .filter(|b| {
            meta.iter()
                .all(|(k, v)| b.meta_data.get(*k).map(String::as_str) == Some(v))
        })
        .filter(|b| {
            let listed = if b.blocked {
                "blocked"
            } else {
                b.state.as_str()
            };
            states.is_empty() || states.contains(&listed)
        })
        .collect();
    let all: Vec<Value> = matching.iter().map(|b| s.build_json(b, true)).collect();
    paged(&all, &pairs, &format!("{}{}", s.base, req.uri().path()))
}

fn query_pairs(query: Option<String>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// One page of a listing as the REST API pages it (`per_page`, default 30, at most 100;
/// `page` from 1), with `Link: <…>; rel="next"` while more pages exist.
fn paged(all: &[Value], pairs: &[(String, String)], url: &str) -> Response {
    let number = |k: &str, default: usize| {
        pairs
            .iter()
            .find(|(key, _)| key == k)
            .and_then(|(_, v)| v.parse::<usize>().ok())
            .unwrap_or(default)
    };
    let (per_page, page) = (
        number("per_page", 30).clamp(1, 100),
        number("page", 1).max(1),
    );
    let list: Vec<&Value> = all
        .iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    let mut response = Json(list).into_response();
    if all.len() > page * per_page {
        let rest: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs.iter().filter(|(k, _)| k != "page"))
            .append_pair("page", &(page + 1).to_string())
            .finish();
        if let Ok(v) = format!("<{url}?{rest}>; rel=\"next\"").parse() {
            response.headers_mut().insert(header::LINK, v);
        }
    }
    response
}

/// `GET /v2/organizations/{org}/agents`, paged like the builds listing.
async fn list_agents(
    State(inner): State<Shared>,
    Path(org): Path<String>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let mut s = lock(&inner);
    s.api_calls
        .push(format!("{} {}", req.method(), req.uri().path()));
    if !authorized(&s, &req) {
        return bk_error(StatusCode::UNAUTHORIZED, "No valid API token provided");
    }
    if org != s.org {
        return bk_error(StatusCode::NOT_FOUND, "Not Found");
    }
    if let Some(code) = s.agents_failure {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return bk_error(status, "Your API token does not have the read_agents scope");
    }
    paged(
        &s.agents,
        &query_pairs(query),
        &format!("{}{}", s.base, req.uri().path()),
    )
}

fn find(s: &Inner, number: &str) -> Option<usize> {
    s.index_of(number.parse().ok()?)
}

/// A REST read of build `number`: the gate's answer or a 404 if it does not pass, else the
/// build's index.
fn read_build(s: &mut Inner, req: &Request, number: &str) -> Result<usize, Box<Response>> {
    if let Some(r) = gate(s, req, true) {
        return Err(Box::new(r));
    }
    find(s, number).ok_or_else(|| Box::new(bk_error(StatusCode::NOT_FOUND, "Not Found")))
}

async fn get_build(
    State(inner): State<Shared>,
    Path((_o, _p, number)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    let mut s = lock(&inner);
    match read_build(&mut s, &req, &number) {
        Ok(i) => Json(s.build_json(&s.builds[i], true)).into_response(),
        Err(r) => *r,
    }
}

async fn list_artifacts(
    State(inner): State<Shared>,
    Path((_o, _p, number)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    artifacts_of(&inner, &req, &number, None)
}

/// One job's artifacts (a job's `artifacts_url`).
async fn list_job_artifacts(
    State(inner): State<Shared>,
    Path((_o, _p, number, job)): Path<(String, String, String, String)>,
    req: Request,
) -> Response {
    artifacts_of(&inner, &req, &number, Some(&job))
}

fn artifacts_of(inner: &Shared, req: &Request, number: &str, job: Option<&str>) -> Response {
    let mut s = lock(inner);
    let i = match read_build(&mut s, req, number) {
        Ok(i) => i,
        Err(r) => return *r,
    };
    let b = &s.builds[i];
    let api = s.build_api_url(b.number);
    let list: Vec<Value> = b
        .artifacts
        .iter()
        .filter(|a| job.is_none_or(|j| a.job_id == j))
        .map(|a| {
            let filename = a.path.rsplit('/').next().unwrap_or_default();
            json!({"id": a.id, "job_id": a.job_id, "url": format!("{api}/jobs/{}/artifacts/{}", a.job_id, a.id),
                "download_url": format!("{api}/jobs/{}/artifacts/{}/download", a.job_id, a.id),
                "state": a.state, "path": a.path, "dirname": ".", "filename": filename,
                "mime_type": "application/json", "file_size": a.bytes.len(), "glob_path": null,
                "original_path": null, "sha1sum": "0"})
        })
        .collect();
    Json(list).into_response()
}

async fn download(
    State(inner): State<Shared>,
    Path((_o, _p, number, job, id)): Path<(String, String, String, String, String)>,
    req: Request,
) -> Response {
    let mut s = lock(&inner);
    let i = match read_build(&mut s, &req, &number) {
        Ok(i) => i,
        Err(r) => return *r,
    };
    if !s.builds[i]
        .artifacts
        .iter()
        .any(|a| a.id == id && a.job_id == job)
    {
        return bk_error(StatusCode::NOT_FOUND, "Not Found");
    }
    if let Some((status, body)) = s.download_failure.clone() {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::NOT_FOUND);
        return (status, [(header::CONTENT_TYPE, "text/html")], body).into_response();
    }
    let number = s.builds[i].number;
    let url = format!(
        "{}/storage/{number}/{id}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=60&X-Amz-Signature=abc123",
        s.base
    );
    (
        StatusCode::FOUND,
        [(header::LOCATION, url.clone())],
        Json(json!({"url": url})),
    )
        .into_response()
}

async fn storage(
    State(inner): State<Shared>,
    Path((number, id)): Path<(u64, String)>,
    req: Request,
) -> Response {
    let mut s = lock(&inner);
    if req.headers().contains_key(header::AUTHORIZATION) {
        // What S3 answers when a presigned URL also carries an Authorization header.
        s.storage_auth_rejections += 1;
        let xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InvalidArgument</Code><Message>Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, Signature query string parameter or the Authorization header should be specified</Message></Error>";
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/xml")],
            xml,
        )
            .into_response();
    }
    if let Some((status, body)) = s.storage_failure.clone() {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN);
        return (status, [(header::CONTENT_TYPE, "application/xml")], body).into_response();
    }
    let bytes = s
        .index_of(number)
        .and_then(|i| s.builds[i].artifacts.iter().find(|a| a.id == id))
        .map(|a| a.bytes.clone());
    match bytes {
        Some(b) => {
            s.storage_downloads += 1;
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                b,
            )
                .into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            "<Error><Code>NoSuchKey</Code></Error>",
        )
            .into_response(),
    }
}

/// A `result.json` like kernelbot's runner writes, for a run whose tests all pass (or, with
/// `failing_test`, one that fails).
pub fn sample_result(failing_test: bool) -> Vec<u8> {
    let status = if failing_test { "fail" } else { "pass" };
    let v = json!({
        "success": true, "error": "",
        "system": {"gpu": "NVIDIA H100 80GB HBM3", "device_count": 1, "cpu": "AMD EPYC 9654",
                   "runtime": "CUDA", "platform": "Linux-6.8.0-x86_64", "torch": "2.6.0+cu126", "hostname": "gpu-node-1"},
        "runs": {
            "test": {"start": "2026-11-21T10:00:01.000000", "end": "2026-11-21T10:00:04.500000", "compilation": null,
                "run": {"success": true, "passed": !failing_test, "command": "python eval.py test", "stdout": "", "stderr": "",
                        "exit_code": if failing_test { 112 } else { 0 }, "duration": 3.5,
                        "result": {"check": status, "test-count": "3", "test.0.spec": "size: 1024", "test.0.status": "pass",
                                   "test.1.spec": "size: 4096", "test.1.status": "pass",
                                   "test.2.spec": "size: 16384", "test.2.status": status,
                                   "test.2.error": if failing_test { "mismatch at index 7: 0.5 != 0.25" } else { "" }}},
                "profile": null}
        }
    });
    serde_json::to_vec_pretty(&v).unwrap_or_default()
}
