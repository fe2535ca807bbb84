//! The HTTP surface: one thin router per function. Handlers take typed extractors
//! ([`extract`]), call one function of the flow, and answer with a typed view ([`views`]) or
//! the one [`ApiError`].

mod error;
mod extract;
mod status;
pub mod submit;
mod views;
pub mod webhook;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

pub use error::ApiError;

/// The largest request body either function reads: submissions carry source code, and 1
/// MiB is far above any that compresses under the 128 KiB payload limit; Buildkite's
/// payloads are a few KiB.
pub(crate) const MAX_BODY: usize = 1024 * 1024;

/// Runs a request in its own span: the context of its log lines, and what the benchmarks
/// time. The path holds no secret (tokens travel in headers).
async fn in_span(request: Request, next: Next) -> Response {
    let span = tracing::info_span!(
        crate::telemetry::REQUEST_SPAN,
        method = %request.method(),
        path = request.uri().path()
    );
    next.run(request).instrument(span).await
}

async fn healthz() -> &'static str {
    "ok"
}
