//! The REST endpoints the client calls: create, list, get and cancel builds, list and
//! download artifacts (a 302 to a storage URL that refuses any request carrying
//! `Authorization`, as presigned S3 URLs do), the pipeline, and the agents.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde_json::{Value, json};

use super::BuildkiteStandin;
use super::autorun::play_agent;
use super::faults::{create_fault, rate_limit_headers};
use super::state::{Inner, Shared, StandinBuild, bk_error, lock};
use super::webhooks::deliver;

/// The REST API's routes, on the stand-in's state.
pub(super) fn router(inner: Shared) -> Router {
    let p = "/v2/organizations/{org}/pipelines/{pipeline}/builds";
    Router::new()
        .route(p, post(create_build).get(list_builds))
        .route(&format!("{p}/{{number}}"), get(get_build))
        .route(&format!("{p}/{{number}}/cancel"), put(cancel_build))
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
        .layer(axum::middleware::from_fn_with_state(inner.clone(), timed))
        .with_state(inner)
}

/// Every answer after the delay a test set, each call's span kept.
async fn timed(State(inner): State<Shared>, req: Request, next: Next) -> Response {
    let arrived = Instant::now();
    let call = format!("{} {}", req.method(), req.uri().path());
    let delay = lock(&inner).delay;
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let response = next.run(req).await;
    lock(&inner).spans.push((call, arrived, Instant::now()));
    response
}

fn authorized(s: &Inner, req: &Request) -> bool {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {}", s.token))
}

/// Buildkite's 429: the window resets in a second, as its headers and body say.
fn over_limit() -> Response {
    let body = json!({"message": "You have exceeded your API rate limit. Please wait 1 seconds before making more requests.", "scope": "rest_user", "limit": 50, "current": 55, "reset": 1});
    let headers = [("ratelimit-reset", "1")];
    (StatusCode::TOO_MANY_REQUESTS, headers, Json(body)).into_response()
}

/// The call counted against the enforced limit; Buildkite's 429 when it is past it.
fn over_enforced_limit(s: &mut Inner) -> Option<Response> {
    let now = s.clock.now();
    let Some(Err(reset)) = s.limit.as_mut().map(|l| l.take(now)) else {
        return None;
    };
    let body = json!({"message": format!("You have exceeded your API rate limit. Please wait {reset} seconds before making more requests."),
        "scope": "rest_user", "reset": reset});
    let headers = [
        ("ratelimit-reset", reset.to_string()),
        ("ratelimit-remaining", "0".to_owned()),
    ];
    Some((StatusCode::TOO_MANY_REQUESTS, headers, Json(body)).into_response())
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
    if let Some(refused) = over_enforced_limit(s) {
        return Some(refused);
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
            return Some(over_limit());
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
    let build = match new_build(&s, bytes) {
        Ok(build) => build,
        Err(refused) => return (*refused, None),
    };
    let number = build.number;
    let body = s.build_json(&build, true);
    s.builds.push(build);
    if let Some(run) = s.autorun.clone() {
        tokio::spawn(play_agent(inner.clone(), run, number));
    }
    // A fault after the work: the build exists, its answer is lost.
    if let Some((code, true)) = fault {
        return (create_fault(code, s.create_reset_secs), None);
    }
    (
        (StatusCode::CREATED, Json(body)).into_response(),
        s.create_delay,
    )
}

/// The build a create's body asks for, numbered next; or Buildkite's refusal of the body.
fn new_build(s: &Inner, bytes: &[u8]) -> Result<StandinBuild, Box<Response>> {
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        return Err(Box::new(bk_error(
            StatusCode::BAD_REQUEST,
            "Problems parsing JSON",
        )));
    };
    let text = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
    if text("commit").is_empty() || text("branch").is_empty() {
        let body = json!({"message": "Validation Failed", "errors": [{"field": "commit", "code": "missing"}]});
        return Err(Box::new(
            (StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response(),
        ));
    }
    let map = |k: &str| -> BTreeMap<String, String> {
        v[k].as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.as_str().map_or_else(|| v.to_string(), str::to_owned),
                )
            })
            .collect()
    };
    Ok(StandinBuild {
        id: uuid::Uuid::new_v4().to_string(),
        number: s.builds.len() as u64 + 1,
        state: "scheduled".into(),
        blocked: false,
        branch: text("branch"),
        commit: text("commit"),
        message: text("message"),
        env: map("env"),
        meta_data: map("meta_data"),
        jobs: vec![uuid::Uuid::new_v4().to_string()],
        tries: BTreeMap::new(),
        created_at: s.clock.now(),
        started_at: None,
        finished_at: None,
        artifacts: Vec::new(),
    })
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
        let now = s.clock.now();
        s.builds[i].move_to("canceled", now);
        (
            Json(s.build_json(&s.builds[i], true)).into_response(),
            s.autorun.clone(),
        )
    };
    if let (Some(run), Ok(n)) = (run, number.parse::<u64>()) {
        let bk = BuildkiteStandin::from_shared(inner);
        tokio::spawn(async move {
            let body = bk.webhook_body("build.finished", n);
            let at = bk.now_secs();
            let _ = deliver(&run.webhook_url, &run.secret, "build.finished", body, at).await;
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
    // Every REST call of the token counts against its limit, the agents list's too.
    if let Some(refused) = over_enforced_limit(&mut s) {
        return refused;
    }
    if org != s.org {
        return bk_error(StatusCode::NOT_FOUND, "Not Found");
    }
    if let Some(code) = s.agents_failure {
        if code == 429 {
            return over_limit();
        }
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return bk_error(status, "Your API token does not have the read_agents scope");
    }
    let agents: Vec<Value> = s
        .agents
        .iter()
        .enumerate()
        .map(|(i, a)| a.json(i))
        .collect();
    paged(
        &agents,
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
    let answer = download_locked(&mut lock(&inner), &req, &number, &job, &id);
    match answer {
        Some(response) => response,
        None => std::future::pending().await,
    }
}

/// The answer to a download; `None` for one that never comes (a stalled build's).
fn download_locked(
    s: &mut Inner,
    req: &Request,
    number: &str,
    job: &str,
    id: &str,
) -> Option<Response> {
    let i = match read_build(s, req, number) {
        Ok(i) => i,
        Err(r) => return Some(*r),
    };
    if s.stalled_downloads.contains(&s.builds[i].number) {
        return None;
    }
    if !s.builds[i]
        .artifacts
        .iter()
        .any(|a| a.id == id && a.job_id == job)
    {
        return Some(bk_error(StatusCode::NOT_FOUND, "Not Found"));
    }
    if let Some((status, body)) = s.download_failure.clone() {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::NOT_FOUND);
        // Buildkite says when its window resets on every 429, an error page or not.
        let reset = if status == StatusCode::TOO_MANY_REQUESTS {
            "1"
        } else {
            ""
        };
        let mut resp = (status, [(header::CONTENT_TYPE, "text/html")], body).into_response();
        if let Ok(v) = header::HeaderValue::from_str(reset)
            && !reset.is_empty()
        {
            resp.headers_mut().insert("ratelimit-reset", v);
        }
        return Some(resp);
    }
    let number = s.builds[i].number;
    // Presigned as S3 signs: when, and for how long (a minute), on the stand-in's clock.
    let signed_at = amz_date(s.clock.now());
    let url = format!(
        "{}/storage/{number}/{id}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Date={signed_at}&X-Amz-Expires={STORAGE_URL_SECS}&X-Amz-Signature=abc123",
        s.base
    );
    Some(
        (
            StatusCode::FOUND,
            [(header::LOCATION, url.clone())],
            Json(json!({"url": url})),
        )
            .into_response(),
    )
}

/// How long a storage URL the stand-in hands out is valid.
const STORAGE_URL_SECS: i64 = 60;

/// `ms` as S3's `X-Amz-Date` (`20261125T133000Z`).
fn amz_date(ms: i64) -> String {
    let text = crate::time::rfc3339(ms);
    let whole = text
        .split('.')
        .next()
        .unwrap_or(&text)
        .trim_end_matches('Z');
    format!("{}Z", whole.replace(['-', ':'], ""))
}

/// Whether a presigned URL's query says it expired before `now` (as S3 checks).
fn presign_expired(query: &str, now: i64) -> bool {
    let param = |name: &str| {
        url::form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    let (Some(date), Some(secs)) = (param("X-Amz-Date"), param("X-Amz-Expires")) else {
        return false;
    };
    let signed = date
        .strip_suffix('Z')
        .filter(|d| d.len() == 15 && d.is_ascii())
        .map(|d| {
            format!(
                "{}-{}-{}T{}:{}:{}Z",
                &d[..4],
                &d[4..6],
                &d[6..8],
                &d[9..11],
                &d[11..13],
                &d[13..]
            )
        })
        .and_then(|t| humantime::parse_rfc3339(&t).ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    match (signed, secs.parse::<i64>()) {
        (Some(at), Ok(secs)) => now > at.as_millis() as i64 + secs * 1000,
        _ => true,
    }
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
    if presign_expired(req.uri().query().unwrap_or_default(), s.clock.now()) {
        let xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>";
        return (
            StatusCode::FORBIDDEN,
            [(header::CONTENT_TYPE, "application/xml")],
            xml,
        )
            .into_response();
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
