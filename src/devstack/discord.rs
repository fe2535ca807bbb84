//! A Discord stand-in: webhook execute (`POST /webhooks/{id}/{token}?wait=true`) and edit
//! (`PATCH /webhooks/{id}/{token}/messages/{message_id}`), enforcing Discord's message limits
//! and recording every call.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::{FromRequest, Multipart, Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{patch, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use super::discord_bucket::WebhookLimit;
use crate::discord::limits;
use crate::time::Clock;

#[derive(Clone, Debug)]
pub struct DiscordCall {
    pub method: &'static str,
    pub webhook_id: String,
    pub message_id: Option<String>,
    pub query: Option<String>,
    pub body: Value,
    pub status: u16,
}

#[derive(Default)]
struct Inner {
    calls: Vec<DiscordCall>,
    messages: BTreeMap<String, Value>,
    tokens: HashMap<String, String>,
    next_id: u64,
    rate_limits: VecDeque<f64>,
    failures: VecDeque<u16>,
    /// The next this-many posts create their message, then answer 500 (an answer lost).
    lost_posts: usize,
    gone: HashSet<String>,
    delay: Option<Duration>,
    /// Webhooks in an outage of their own, by id.
    outages: HashMap<String, Outage>,
    /// Seeded everyday faults: (rate, generator).
    chaos: Option<(f64, fastrand::Rng)>,
    /// Discord's per-webhook limit, when enforced.
    limit: Option<WebhookLimit>,
    clock: Clock,
}

/// One webhook's outage, until it is lifted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outage {
    /// Every call to it answers this status.
    Answers(u16),
    /// Calls to it are taken and never answered (a client's timeout ends them).
    Hung,
}

/// One everyday Discord fault.
#[derive(Clone, Copy, Debug)]
enum Fault {
    ServerError,
    RateLimited,
    Slow,
    /// A moderator deleted the message being edited.
    Deleted,
}

impl Inner {
    fn roll(&mut self) -> Option<Fault> {
        let (rate, rng) = self.chaos.as_mut()?;
        (rng.f64() < *rate).then(|| match rng.u8(0..4) {
            0 => Fault::ServerError,
            1 => Fault::RateLimited,
            2 => Fault::Slow,
            _ => Fault::Deleted,
        })
    }
}

#[derive(Clone)]
pub struct DiscordStandin {
    /// Use as `DISCORD_API_URL`.
    pub api_url: String,
    inner: Arc<Mutex<Inner>>,
}

fn chars(v: &Value) -> usize {
    v.as_str().map_or(0, |s| s.chars().count())
}

/// Discord's documented limits; a breach is a 400 "Invalid Form Body" (code 50035).
pub(crate) fn check_limits(body: &Value) -> Result<(), String> {
    let content = chars(&body["content"]);
    let embeds = body["embeds"].as_array().cloned().unwrap_or_default();
    if content == 0 && embeds.is_empty() {
        return Err("Cannot send an empty message".into());
    }
    if content > limits::CONTENT {
        return Err(format!(
            "content: Must be {} or fewer in length.",
            limits::CONTENT
        ));
    }
    if embeds.len() > limits::EMBEDS {
        return Err("embeds: Must be 10 or fewer in length.".into());
    }
    let mut total = 0;
    for e in &embeds {
        let fields = e["fields"].as_array().cloned().unwrap_or_default();
        let checks = [
            ("title", chars(&e["title"]), limits::TITLE),
            ("description", chars(&e["description"]), limits::DESCRIPTION),
            ("footer.text", chars(&e["footer"]["text"]), limits::FOOTER),
            ("fields", fields.len(), limits::FIELDS),
        ];
        for (name, len, max) in checks {
            if len > max {
                return Err(format!("embeds.{name}: Must be {max} or fewer in length."));
            }
        }
        for f in &fields {
            if chars(&f["name"]) > limits::FIELD_NAME || chars(&f["value"]) > limits::FIELD_VALUE {
                return Err("embeds.fields: name or value too long".into());
            }
            total += chars(&f["name"]) + chars(&f["value"]);
        }
        total += chars(&e["title"]) + chars(&e["description"]) + chars(&e["footer"]["text"]);
    }
    if total > limits::EMBED_TOTAL {
        return Err(format!(
            "embeds: total size {total} exceeds {}",
            limits::EMBED_TOTAL
        ));
    }
    Ok(())
}

fn error(status: StatusCode, code: u32, message: &str) -> Response {
    (status, Json(json!({"code": code, "message": message}))).into_response()
}

impl DiscordStandin {
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with_clock(Clock::default()).await
    }

    /// A stand-in whose rate limit (when enforced) is counted on `clock`.
    pub async fn start_with_clock(clock: Clock) -> std::io::Result<Self> {
        let inner = Arc::new(Mutex::new(Inner {
            next_id: 1_300_000_000_000_000_000,
            clock,
            ..Default::default()
        }));
        let router = Router::new()
            .route("/api/v10/webhooks/{id}/{token}", post(execute))
            .route(
                "/api/v10/webhooks/{id}/{token}/messages/{message_id}",
                patch(edit),
            )
            .with_state(inner.clone());
        let addr = super::spawn(router).await?;
        Ok(Self {
            api_url: format!("http://{addr}/api/v10"),
            inner,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every call received, in order.
    pub fn calls(&self) -> Vec<DiscordCall> {
        self.lock().calls.clone()
    }

    /// The current body of every message, by id.
    pub fn messages(&self) -> BTreeMap<String, Value> {
        self.lock().messages.clone()
    }

    /// From now on each webhook takes `calls` per `window` (Discord: about 5 per 2 s), told
    /// in `X-RateLimit-*` headers; past it, a 429 with `retry_after`.
    pub fn enforce_rate_limit(&self, calls: u32, window: Duration) {
        let mut s = self.lock();
        let clock = s.clock.clone();
        s.limit = Some(WebhookLimit::new(calls, window.as_millis() as i64, clock));
    }

    /// Calls the enforced limit refused, and the most one webhook made in one window.
    pub fn rate_limit_seen(&self) -> (usize, u32) {
        self.lock()
            .limit
            .as_ref()
            .map_or((0, 0), |l| (l.refused, l.busiest))
    }

    /// The next `n` calls answer 429 with `retry_after` seconds.
    pub fn rate_limit_next(&self, n: usize, retry_after: f64) {
        self.lock()
            .rate_limits
            .extend(std::iter::repeat_n(retry_after, n));
    }

    /// The next calls answer these statuses (e.g. 500, 503).
    pub fn fail_next(&self, statuses: &[u16]) {
        self.lock().failures.extend(statuses);
    }

    /// The next `n` posts create their message, then answer 500 as if it had failed.
    pub fn lose_post_answers(&self, n: usize) {
        self.lock().lost_posts += n;
    }

    /// The webhook is deleted: every call to it answers 404.
    pub fn delete_webhook(&self, webhook_id: &str) {
        self.lock().gone.insert(webhook_id.to_owned());
    }

    /// A moderator deletes message `id`: editing it answers 404 `10008 Unknown Message`.
    pub fn delete_message(&self, id: &str) {
        self.lock().messages.remove(id);
    }

    /// From now on a share `rate` of calls meets one everyday fault (5xx, 429, a slow answer,
    /// the edited message deleted), drawn from a generator seeded with `seed`.
    pub fn chaos(&self, seed: u64, rate: f64) {
        self.lock().chaos = Some((rate, fastrand::Rng::with_seed(seed)));
    }

    /// Every answer waits this long first.
    pub fn set_delay(&self, delay: Option<Duration>) {
        self.lock().delay = delay;
    }

    /// Webhook `webhook_id` goes into `outage` (`None`: it is lifted); other webhooks answer
    /// as before.
    pub fn outage(&self, webhook_id: &str, outage: Option<Outage>) {
        let mut s = self.lock();
        match outage {
            Some(o) => s.outages.insert(webhook_id.to_owned(), o),
            None => s.outages.remove(webhook_id),
        };
    }
}

type Shared = Arc<Mutex<Inner>>;

/// One call to a webhook (`message_id`: an edit), as Discord would answer it: a fault the
/// test queued or the chaos rate drew, else the post or edit itself. Every call is recorded
/// with its status, those an outage refuses included (a test tells a refused try from none).
async fn handle(
    inner: Shared,
    method: &'static str,
    webhook_id: String,
    token: String,
    message_id: Option<String>,
    query: Option<String>,
    body: Value,
) -> Response {
    let mut call = DiscordCall {
        method,
        webhook_id,
        message_id,
        query,
        body,
        status: 0,
    };
    let (delay, fault, outage) = {
        let mut s = inner.lock().unwrap_or_else(|p| p.into_inner());
        (s.delay, s.roll(), s.outages.get(&call.webhook_id).copied())
    };
    let refused = match outage {
        Some(Outage::Hung) => return std::future::pending().await,
        Some(Outage::Answers(code)) => {
            Some(StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE))
        }
        None => None,
    };
    let delay = match fault {
        Some(Fault::Slow) => Some(Duration::from_millis(200)),
        _ => delay,
    };
    if let (None, Some(d)) = (refused, delay) {
        tokio::time::sleep(d).await;
    }
    let mut s = inner.lock().unwrap_or_else(|p| p.into_inner());
    let (status, response) = match refused {
        Some(status) => (status.as_u16(), error(status, 0, "webhook outage")),
        None => answered(&mut s, fault, &call, token),
    };
    call.status = status;
    s.calls.push(call);
    response
}

/// Discord's answer to `call` outside an outage, the fault drawn for it applied first and
/// the shared rate limit (when one is set) taken and stamped on the answer.
fn answered(
    s: &mut Inner,
    fault: Option<Fault>,
    call: &DiscordCall,
    token: String,
) -> (u16, Response) {
    apply(s, fault, call.message_id.as_deref());
    let told = s.limit.as_mut().map(|l| l.take(&call.webhook_id));
    let asked = Call {
        webhook_id: &call.webhook_id,
        token,
        message_id: call.message_id.as_deref(),
        query: call.query.as_deref(),
        body: &call.body,
    };
    let (status, mut response) = match &told {
        Some(t) if !t.allowed => (429, rate_limited(t.retry_after())),
        _ => answer(s, asked),
    };
    if let Some(t) = &told {
        t.stamp(&mut response);
    }
    (status, response)
}

/// Queues what the fault drawn for this call makes of its answer.
fn apply(s: &mut Inner, fault: Option<Fault>, message_id: Option<&str>) {
    match (fault, message_id) {
        (Some(Fault::ServerError), _) => s.failures.push_front(500),
        (Some(Fault::RateLimited), _) => s.rate_limits.push_front(0.05),
        (Some(Fault::Deleted), Some(id)) => {
            s.messages.remove(id);
        }
        _ => {}
    }
}

/// One call as [`answer`] reads it.
struct Call<'a> {
    webhook_id: &'a str,
    token: String,
    message_id: Option<&'a str>,
    query: Option<&'a str>,
    body: &'a Value,
}

/// Discord's answer to `call`, and its status.
fn answer(s: &mut Inner, call: Call<'_>) -> (u16, Response) {
    if s.gone.contains(call.webhook_id) {
        return (404, error(StatusCode::NOT_FOUND, 10015, "Unknown Webhook"));
    }
    if s.tokens
        .get(call.webhook_id)
        .is_some_and(|t| *t != call.token)
    {
        let refused = error(StatusCode::UNAUTHORIZED, 50027, "Invalid Webhook Token");
        return (401, refused);
    }
    if let Some(wait) = s.rate_limits.pop_front() {
        return (429, rate_limited(wait));
    }
    if let Some(code) = s.failures.pop_front() {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return (code, error(status, 0, "500: Internal Server Error"));
    }
    if let Err(reason) = check_limits(call.body) {
        let why = format!("Invalid Form Body: {reason}");
        return (400, error(StatusCode::BAD_REQUEST, 50035, &why));
    }
    match call.message_id {
        Some(id) => edit_message(s, call.webhook_id, id, call.body),
        None if s.lost_posts > 0 => {
            s.lost_posts -= 1;
            post_message(s, call);
            (
                500,
                error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    0,
                    "500: Internal Server Error",
                ),
            )
        }
        None => post_message(s, call),
    }
}

/// A 429 asking for `wait` seconds, in the body and (rounded up) the header.
fn rate_limited(wait: f64) -> Response {
    let body =
        json!({"message": "You are being rate limited.", "retry_after": wait, "global": false});
    let headers = [
        ("retry-after", format!("{}", wait.ceil() as u64)),
        ("x-ratelimit-scope", "user".to_owned()),
    ];
    (StatusCode::TOO_MANY_REQUESTS, headers, Json(body)).into_response()
}

fn edit_message(s: &mut Inner, webhook_id: &str, id: &str, body: &Value) -> (u16, Response) {
    let Some(old) = s
        .messages
        .get(id)
        .filter(|m| m["webhook_id"] == json!(webhook_id))
    else {
        return (404, error(StatusCode::NOT_FOUND, 10008, "Unknown Message"));
    };
    let mut msg = body.clone();
    // An edit that names no attachments keeps the message's own, as Discord does.
    if msg.get("attachments").is_none()
        && let Some(a) = old.get("attachments")
    {
        msg["attachments"] = a.clone();
    }
    msg["id"] = json!(id);
    msg["webhook_id"] = json!(webhook_id);
    s.messages.insert(id.to_owned(), msg.clone());
    (200, Json(msg).into_response())
}

fn post_message(s: &mut Inner, call: Call<'_>) -> (u16, Response) {
    s.tokens.insert(call.webhook_id.to_owned(), call.token);
    s.next_id += 1;
    let id = s.next_id.to_string();
    let mut msg = call.body.clone();
    msg["id"] = json!(id);
    msg["webhook_id"] = json!(call.webhook_id);
    s.messages.insert(id, msg.clone());
    let wait = call
        .query
        .is_some_and(|q| q.split('&').any(|p| p == "wait=true"));
    if wait {
        (200, Json(msg).into_response())
    } else {
        (204, StatusCode::NO_CONTENT.into_response())
    }
}

/// The message of a request: a JSON body, or Discord's multipart form (`payload_json` and
/// `files[n]`), whose files are kept in the message's `attachments` (with their text, for
/// tests to read) as Discord would list them.
async fn message_of(request: Request) -> Result<Value, Response> {
    let multipart = request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    let invalid = |why: &str| {
        error(
            StatusCode::BAD_REQUEST,
            50035,
            &format!("Invalid Form Body: {why}"),
        )
    };
    if !multipart {
        let Json(body) = Json::<Value>::from_request(request, &())
            .await
            .map_err(|_| invalid("not JSON"))?;
        return Ok(body);
    }
    let mut form = Multipart::from_request(request, &())
        .await
        .map_err(|_| invalid("not multipart"))?;
    let mut body = None;
    let mut files = BTreeMap::new();
    while let Some(field) = form.next_field().await.map_err(|_| invalid("bad part"))? {
        let name = field.name().unwrap_or_default().to_owned();
        let filename = field.file_name().map(str::to_owned);
        let bytes = field.bytes().await.map_err(|_| invalid("bad part"))?;
        if name == "payload_json" {
            body =
                Some(serde_json::from_slice::<Value>(&bytes).map_err(|_| invalid("payload_json"))?);
        } else if let Some(n) = name
            .strip_prefix("files[")
            .and_then(|r| r.strip_suffix(']'))
        {
            files.insert(n.to_owned(), (filename.unwrap_or_default(), bytes));
        }
    }
    let mut body = body.ok_or_else(|| invalid("payload_json missing"))?;
    let mut listed = Vec::new();
    for a in body["attachments"].as_array().cloned().unwrap_or_default() {
        let id = a["id"].to_string();
        let (filename, bytes) = files
            .remove(&id)
            .ok_or_else(|| invalid("attachment without its file"))?;
        listed.push(
            json!({"id": id, "filename": a["filename"].as_str().unwrap_or(&filename),
            "size": bytes.len(), "content": String::from_utf8_lossy(&bytes)}),
        );
    }
    if !files.is_empty() {
        return Err(invalid("file without an attachment entry"));
    }
    body["attachments"] = json!(listed);
    Ok(body)
}

async fn execute(
    State(inner): State<Shared>,
    Path((id, token)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Response {
    match message_of(request).await {
        Ok(body) => handle(inner, "POST", id, token, None, query, body).await,
        Err(refused) => refused,
    }
}

async fn edit(
    State(inner): State<Shared>,
    Path((id, token, message_id)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Response {
    match message_of(request).await {
        Ok(body) => handle(inner, "PATCH", id, token, Some(message_id), query, body).await,
        Err(refused) => refused,
    }
}

/// Prints a message the way a reader would see it in a channel.
pub fn render_for_terminal(message: &Value) -> String {
    let mut out = String::new();
    if let Some(c) = message["content"].as_str() {
        out.push_str(c);
        out.push('\n');
    }
    for e in message["embeds"].as_array().into_iter().flatten() {
        out.push_str("┃ ");
        if let Some(t) = e["title"].as_str() {
            out.push_str(&format!("**{t}**\n┃ "));
        }
        if let Some(d) = e["description"].as_str() {
            out.push_str(&d.replace('\n', "\n┃ "));
            out.push('\n');
        }
        for f in e["fields"].as_array().into_iter().flatten() {
            let (name, value) = (
                f["name"].as_str().unwrap_or(""),
                f["value"].as_str().unwrap_or(""),
            );
            out.push_str(&format!("┃ {name}\n┃ {}\n", value.replace('\n', "\n┃ ")));
        }
    }
    out
}
