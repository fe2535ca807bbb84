//! The submit function's routes: `POST /submissions`, `GET /submissions/{run_id}`,
//! `POST /submissions/{run_id}/cancel`, `GET /submissions/{run_id}/profiles/{index}` (a
//! signed link, no token), `GET /queues/{gpu}`, `GET /fleet`, `GET /users/{user}/usage` and
//! `GET /status` (public).

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use super::extract::{Authorized, Body, Invocation};
use super::views::{CanceledView, FleetView, JobView, QueueView, SubmittedView};
use super::{ApiError, MAX_BODY, healthz, in_span};
use crate::flow::cancel::Canceled;
use crate::flow::submit::Submitted;
use crate::flow::{Deps, budget, cancel, fair, fleet, profiles, queues, submission, submit};
use crate::jobs::RunId;

pub fn router(deps: Arc<Deps>) -> Router {
    Router::new()
        .route("/submissions", post(create))
        .route("/submissions/{run_id}", get(show))
        .route("/submissions/{run_id}/cancel", post(cancel))
        .route("/submissions/{run_id}/profiles/{index}", get(profile))
        .route("/queues/{gpu}", get(queue))
        .route("/fleet", get(fleet))
        .route("/users/{user}/usage", get(usage))
        .route("/status", get(super::status::status))
        .route("/healthz", get(healthz))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(in_span))
        .with_state(deps)
}

/// A run id from the path; one that cannot exist is not found.
fn run_id(raw: &str) -> Result<RunId, ApiError> {
    raw.parse().map_err(|_| not_found(raw))
}

fn not_found(run_id: &str) -> ApiError {
    ApiError::NotFound(format!(
        "no submission {:?}",
        run_id.chars().take(64).collect::<String>()
    ))
}

async fn create(
    State(d): State<Arc<Deps>>,
    _: Authorized,
    Invocation(deadline): Invocation,
    Body(body): Body,
) -> Result<impl IntoResponse, ApiError> {
    let queues = &d.config().queues;
    let sub = submission::parse(&body, queues, d.default_discord.is_some())?;
    let (status, job) = match submit::submit(&d, sub, deadline).await? {
        Submitted::New(job) => (StatusCode::ACCEPTED, job),
        Submitted::Existing(job) => (StatusCode::OK, job),
        Submitted::TooManyWaiting(r) => {
            return Err(ApiError::TooManyRequests {
                message: format!(
                    "this user already has {} submissions waiting for a GPU of this queue (at \
                     most {}); try again in about {} s",
                    r.waiting, r.limit, r.retry_after_secs
                ),
                retry_after: r.retry_after_secs,
            });
        }
        Submitted::OverBudget(u) => {
            let retry_after = u.retry_after_secs.unwrap_or(1);
            return Err(ApiError::TooManyRequests {
                message: format!(
                    "this user has used {:.0} of their {} GPU seconds for the last 24 hours; \
                     enough frees to submit again in about {} s",
                    u.used_secs, u.limit_secs, retry_after
                ),
                retry_after,
            });
        }
    };
    Ok((status, Json(SubmittedView::of(&job))).into_response())
}

async fn show(
    State(d): State<Arc<Deps>>,
    _: Authorized,
    Path(raw): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let job = submit::find(&d, &run_id(&raw)?)
        .await?
        .ok_or_else(|| not_found(&raw))?;
    // The place is a courtesy: a failing index read leaves it out, not the job.
    let standing = fair::standing(&d, &job).await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "the job's place could not be read");
        None
    });
    Ok(Json(JobView::of(&job, standing)).into_response())
}

/// `POST /submissions/{run_id}/cancel`: 202 with the job's state, also on a repeat.
async fn cancel(
    State(d): State<Arc<Deps>>,
    _: Authorized,
    Invocation(deadline): Invocation,
    Path(raw): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    match cancel::cancel(&d, &run_id(&raw)?, deadline).await? {
        Canceled::Accepted(job) => {
            Ok((StatusCode::ACCEPTED, Json(CanceledView::of(&job))).into_response())
        }
        Canceled::AlreadyFinished(job) => Err(ApiError::Conflict {
            code: "already_finished",
            message: format!("submission {} has already {}", job.run_id, job.state),
        }),
        Canceled::Unknown => Err(not_found(&raw)),
    }
}

/// `GET /submissions/{run_id}/profiles/{index}?expires=..&signature=..`: no token (the
/// link's signature is its credential); 302 to the profile's zip, for a minute or so.
async fn profile(
    State(d): State<Arc<Deps>>,
    Invocation(deadline): Invocation,
    Path((raw, index)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let forged = || ApiError::Forbidden("not a valid profile link".into());
    let run_id: RunId = raw.parse().map_err(|_| forged())?;
    let index: usize = index.parse().map_err(|_| forged())?;
    // Read by hand: any query at all gets our JSON answer, never an extractor's.
    let value = |key: &str| {
        let pairs = url::form_urlencoded::parse(query.as_deref().unwrap_or_default().as_bytes());
        pairs
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
    };
    let expires: i64 = value("expires")
        .and_then(|e| e.parse().ok())
        .ok_or_else(forged)?;
    let signature = value("signature").ok_or_else(forged)?;
    let url = profiles::download(&d, &run_id, index, (expires, &signature), deadline).await?;
    let headers = [
        (header::LOCATION, url),
        // The storage URL expires within minutes: never cached, never passed on.
        (header::CACHE_CONTROL, "no-store".to_owned()),
        (header::REFERRER_POLICY, "no-referrer".to_owned()),
    ];
    Ok((StatusCode::FOUND, headers).into_response())
}

/// `GET /queues/{gpu}`: the queue's agents and open jobs.
async fn queue(
    State(d): State<Arc<Deps>>,
    _: Authorized,
    Invocation(deadline): Invocation,
    Path(gpu): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let status = queues::status(&d, &gpu, deadline).await?;
    Ok(Json(QueueView::of(&status)).into_response())
}

/// `GET /users/{user}/usage`: a user's GPU time over the last 24 hours and their budget.
async fn usage(
    State(d): State<Arc<Deps>>,
    _: Authorized,
    Path(raw): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let user = submission::user_id(&raw)?;
    let usage = budget::usage(&d, &user)
        .await
        .map_err(crate::flow::DispatchError::from)?;
    Ok(Json(usage).into_response())
}

/// `GET /fleet`: each GPU agent of our queues, its pause and why, its last day.
async fn fleet(
    State(d): State<Arc<Deps>>,
    _: Authorized,
    Invocation(deadline): Invocation,
) -> Result<impl IntoResponse, ApiError> {
    let agents = fleet::view(&d, deadline).await?;
    Ok(Json(FleetView { agents }))
}
