//! The webhook function's route: `POST /webhooks/buildkite`. Every answer is counted by
//! outcome: a webhook answering 5xx (Buildkite is never told to retry) shows up in the
//! `WebhookRequests{Outcome=error}` metric the alarms watch, and one signed with a key the
//! deployment does not hold in `Outcome=unknown_key` (other refusals are `refused`).

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use super::extract::{Body, BuildkiteHeaders, Invocation};
use super::views::EventView;
use super::{ApiError, MAX_BODY, healthz, in_span};
use crate::buildkite::VerifyError;
use crate::flow::Deps;
use crate::flow::events::{self, EventOutcome, WebhookError};
use crate::telemetry::metrics::Unit;

pub fn router(deps: Arc<Deps>) -> Router {
    Router::new()
        .route("/webhooks/buildkite", post(receive))
        .route_layer(axum::middleware::from_fn_with_state(deps.clone(), count))
        .route("/healthz", get(healthz))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(in_span))
        .with_state(deps)
}

/// What a webhook did, as its answer carries it to [`count`].
#[derive(Clone, Copy)]
struct Counted(&'static str);

async fn receive(
    State(d): State<Arc<Deps>>,
    Invocation(deadline): Invocation,
    BuildkiteHeaders(claimed): BuildkiteHeaders,
    Body(body): Body,
) -> Result<Response, ApiError> {
    // The signature's window is judged on the service's clock, as every other time is.
    let now = d.clock.now().div_euclid(1000);
    let received = match events::receive(&d, &claimed, &body, now, deadline).await {
        // Signed with a key this deployment does not hold, even read again: a rotation done
        // on one side only, or a forger. Counted apart from junk, which its alarm ignores.
        Err(e @ WebhookError::Unauthorized(VerifyError::Mismatch | VerifyError::BadToken)) => {
            let mut refused = ApiError::from(e).into_response();
            refused.extensions_mut().insert(Counted("unknown_key"));
            return Ok(refused);
        }
        other => other?,
    };
    let (view, outcome) = match received {
        EventOutcome::Advanced(state) => (EventView::advanced(state), "advanced"),
        EventOutcome::Ignored(reason) => (EventView::ignored(reason), "ignored"),
        EventOutcome::Foreign => (
            EventView::ignored("an event of another pipeline"),
            "foreign",
        ),
        EventOutcome::AgentNoted => (EventView::agent_noted(), "agent"),
        EventOutcome::TryNoted => (EventView::try_noted(), "try"),
    };
    let mut response = Json(view).into_response();
    response.extensions_mut().insert(Counted(outcome));
    Ok(response)
}

/// Counts every answer of the route, refusals by extractors included.
async fn count(State(d): State<Arc<Deps>>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let outcome = match response.extensions().get::<Counted>() {
        Some(Counted(outcome)) => outcome,
        None if response.status().is_server_error() => "error",
        None => "refused",
    };
    d.metrics.put(
        &[("Outcome", outcome)],
        &[("WebhookRequests", Unit::Count, 1.0)],
    );
    response
}
