//! `POST /submissions` and `GET /submissions/{run_id}`.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use secrecy::ExposeSecret;
use serde_json::{Value, json};

use super::{ApiError, deadline_of, healthz, read_body};
use crate::flow::queues::QueueStatus;
use crate::flow::{Canceled, Dispatcher, Submitted};
use crate::jobs::model::rfc3339;
use crate::jobs::{Job, RunId};
use crate::submission;

/// Submissions carry source code; 1 MiB is far above any that compresses under the
/// 128 KiB payload limit.
pub const MAX_BODY: usize = 1024 * 1024;

pub fn router(dispatcher: Arc<Dispatcher>) -> Router {
    Router::new()
        .route("/submissions", post(create))
        .route("/submissions/{run_id}", get(show))
        .route("/submissions/{run_id}/cancel", post(cancel))
        .route("/queues/{gpu}", get(queue))
        .route("/healthz", get(healthz))
        .layer(axum::middleware::from_fn(super::in_span))
        .with_state(dispatcher)
}

fn authorize(d: &Dispatcher, headers: &HeaderMap) -> Result<(), ApiError> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(ApiError::Unauthorized)?;
    let ok =
        d.config.submit_tokens.iter().any(|t| {
            crate::secrets::same(t.expose_secret().as_bytes(), presented.trim().as_bytes())
        });
    if ok {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

fn build_json(job: &Job) -> Value {
    job.build.as_ref().map_or(
        Value::Null,
        |b| json!({"id": b.id, "number": b.number, "web_url": b.web_url}),
    )
}

fn rank_name(rank: u8) -> &'static str {
    match rank {
        0 => "submitted",
        1 => "scheduled",
        2 => "running",
        _ => "final",
    }
}

/// Where the job's Discord status stands, for operators (never the webhook token).
fn delivery_json(job: &Job) -> Value {
    let Some(o) = &job.discord else {
        return json!({"discord": null, "callback": callback_json(job)});
    };
    let status = if o.owes(job.state) {
        "pending"
    } else {
        o.status.as_str()
    };
    json!({"discord": {
        "status": status,
        "shown": o.shown.map(rank_name),
        "message_id": o.message_id,
        "attempts": o.attempts,
        "pending_since": o.pending_since.map(rfc3339),
        "last_error": o.last_error,
    }, "callback": callback_json(job)})
}

fn callback_json(job: &Job) -> Value {
    let Some(c) = &job.callback else {
        return Value::Null;
    };
    let status = if c.owes(job.state) {
        "pending"
    } else {
        c.status.as_str()
    };
    json!({
        "status": status,
        // The top rank is the job's own end (`finished` or `failed`).
        "delivered": c.delivered.map(|r| if r == job.state.rank() { job.state.as_str() } else { rank_name(r) }),
        "attempts": c.attempts,
        "pending_since": c.pending_since.map(rfc3339),
        "last_error": c.last_error,
    })
}

/// The job as `GET /submissions/{run_id}` shows it.
pub fn job_view(job: &Job) -> Value {
    json!({
        "run_id": job.run_id,
        "state": job.state,
        "gpu": job.gpu,
        "queue": job.queue,
        "title": job.title,
        "build": build_json(job),
        "failure": job.failure,
        "created_at": rfc3339(job.created_at),
        "updated_at": rfc3339(job.updated_at),
        "verdict": job.outcome.as_ref().map(|o| o.verdict),
        "result": job.outcome,
        "delivery": delivery_json(job),
    })
}

async fn create(State(d): State<Arc<Dispatcher>>, request: Request) -> Result<Response, ApiError> {
    authorize(&d, request.headers())?;
    let deadline = deadline_of(request.extensions());
    let body = read_body(request.into_body(), MAX_BODY).await?;
    let sub = submission::parse(
        &body,
        &d.config.queues,
        d.config.discord.default_target.as_ref(),
    )?;
    let (status, job) = match d.submit(sub, deadline).await? {
        Submitted::New(job) => (StatusCode::ACCEPTED, job),
        Submitted::Existing(job) => (StatusCode::OK, job),
    };
    let body = json!({"run_id": job.run_id, "state": job.state, "build": build_json(&job)});
    Ok((status, Json(body)).into_response())
}

fn not_found(run_id: &str) -> ApiError {
    ApiError::NotFound(format!(
        "no submission {:?}",
        run_id.chars().take(64).collect::<String>()
    ))
}

/// `POST /submissions/{run_id}/cancel`: 202 with the job's state, also on a repeat.
async fn cancel(
    State(d): State<Arc<Dispatcher>>,
    Path(run_id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    authorize(&d, request.headers())?;
    let deadline = deadline_of(request.extensions());
    let id: RunId = run_id.parse().map_err(|_| not_found(&run_id))?;
    match d.cancel(&id, deadline).await? {
        Canceled::Accepted(job) => Ok((
            StatusCode::ACCEPTED,
            Json(json!({"run_id": job.run_id, "state": job.state})),
        )
            .into_response()),
        Canceled::AlreadyFinished(job) => Err(ApiError::Conflict {
            code: "already_finished",
            message: format!("submission {} has already {}", job.run_id, job.state),
        }),
        Canceled::Unknown => Err(not_found(&run_id)),
    }
}

async fn show(
    State(d): State<Arc<Dispatcher>>,
    headers: HeaderMap,
    Path(run_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    authorize(&d, &headers)?;
    let not_found = || not_found(&run_id);
    let id: RunId = run_id.parse().map_err(|_| not_found())?;
    let job = d
        .store
        .get(&id)
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?
        .ok_or_else(not_found)?;
    Ok(Json(job_view(&job)))
}

/// `GET /queues/{gpu}`: the queue's agents and open jobs.
async fn queue(
    State(d): State<Arc<Dispatcher>>,
    Path(gpu): Path<String>,
    request: Request,
) -> Result<Json<QueueStatus>, ApiError> {
    authorize(&d, request.headers())?;
    let deadline = deadline_of(request.extensions());
    Ok(Json(d.queue_status(&gpu, deadline).await?))
}
