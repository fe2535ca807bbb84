//! The HTTP surface: one thin router per function, sharing one error type.

pub mod error;
pub mod submit;
pub mod webhook;

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::Extensions;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

pub use error::ApiError;

use crate::retry::{Deadline, LOCAL_BUDGET};

/// Kept back from the Lambda deadline to write the answer.
const ANSWER_RESERVE: Duration = Duration::from_millis(500);

/// The invocation's one deadline: the Lambda context's when there is one, else a fixed span.
pub fn deadline_of(extensions: &Extensions) -> Deadline {
    match extensions.get::<lambda_http::Context>() {
        Some(ctx) => Deadline::at_unix_millis(ctx.deadline).less(ANSWER_RESERVE),
        None => Deadline::after(LOCAL_BUDGET),
    }
}

/// Reads a request body up to `limit` bytes; more is a 413 with a JSON body.
pub async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::TooLarge(format!("request body exceeds {limit} bytes")))
}

/// Runs a request in its own span: the context of its log lines, and what the benchmarks
/// time. The path holds no secret (tokens travel in headers).
pub async fn in_span(request: Request, next: Next) -> Response {
    let span = tracing::info_span!(
        crate::telemetry::REQUEST_SPAN,
        method = %request.method(),
        path = request.uri().path()
    );
    next.run(request).instrument(span).await
}

pub async fn healthz() -> &'static str {
    "ok"
}
