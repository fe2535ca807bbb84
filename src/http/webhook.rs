//! `POST /webhooks/buildkite`: verify, then hand the event to the dispatcher.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use super::{ApiError, deadline_of, healthz, read_body};
use crate::buildkite::webhook::{EVENT_HEADER, SIGNATURE_HEADER, TOKEN_HEADER, WebhookEvent};
use crate::flow::{Dispatcher, EventOutcome};
use crate::telemetry::metrics::Unit;

/// Buildkite build payloads are a few KiB; anything near this is not one.
pub const MAX_BODY: usize = 1024 * 1024;

pub fn router(dispatcher: Arc<Dispatcher>) -> Router {
    Router::new()
        .route("/webhooks/buildkite", post(receive))
        .route("/healthz", get(healthz))
        .layer(axum::middleware::from_fn(super::in_span))
        .with_state(dispatcher)
}

fn now_secs() -> i64 {
    crate::jobs::model::now_millis() / 1000
}

/// Handles one request and counts it by outcome: a webhook answering 5xx (Buildkite is
/// never told to retry) shows up in the `WebhookRequests{Outcome=error}` metric.
async fn receive(
    State(d): State<Arc<Dispatcher>>,
    request: Request,
) -> Result<Json<Value>, ApiError> {
    let result = handle(&d, request).await;
    let outcome = match &result {
        Ok(EventOutcome::Advanced(_)) => "advanced",
        Ok(EventOutcome::Ignored(_)) => "ignored",
        Err(e) if e.status().is_server_error() => "error",
        Err(_) => "refused",
    };
    d.metrics.put(
        &[("Outcome", outcome)],
        &[("WebhookRequests", Unit::Count, 1.0)],
    );
    let body = match result? {
        EventOutcome::Advanced(state) => json!({"ok": true, "state": state}),
        EventOutcome::Ignored(reason) => json!({"ok": true, "ignored": reason}),
    };
    Ok(Json(body))
}

async fn handle(d: &Dispatcher, request: Request) -> Result<EventOutcome, ApiError> {
    let deadline = deadline_of(request.extensions());
    let (parts, body) = request.into_parts();
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let body = read_body(body, MAX_BODY).await?;
    // Verify the raw bytes before any parsing.
    d.config
        .webhook_auth
        .verify(
            header(SIGNATURE_HEADER),
            header(TOKEN_HEADER),
            &body,
            now_secs(),
        )
        .map_err(|e| {
            tracing::warn!(reason = %e, "webhook rejected");
            ApiError::Unauthorized
        })?;
    let event: WebhookEvent = serde_json::from_slice(&body).map_err(|e| ApiError::BadRequest {
        code: "invalid_json",
        message: format!("webhook body is not a Buildkite event: {e}"),
    })?;
    // The signed body decides; an unsigned header that disagrees is someone's replay.
    if let Some(claimed) = header(EVENT_HEADER).filter(|h| *h != event.event) {
        tracing::warn!(header = claimed, body = %event.event, "event header disagrees with the signed body");
        return Err(ApiError::BadRequest {
            code: "event_mismatch",
            message: format!(
                "X-Buildkite-Event {:?} does not match the signed body's event {:?}",
                claimed.chars().take(64).collect::<String>(),
                event.event.chars().take(64).collect::<String>()
            ),
        });
    }
    Ok(d.on_event(&event, deadline).await?)
}
