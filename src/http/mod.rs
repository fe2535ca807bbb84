//! The HTTP surface: one thin router per function, sharing one error type.

pub mod error;
pub mod submit;
pub mod webhook;

use axum::body::{Body, Bytes};

pub use error::ApiError;

/// Reads a request body up to `limit` bytes; more is a 413 with a JSON body.
pub async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::TooLarge(format!("request body exceeds {limit} bytes")))
}

pub async fn healthz() -> &'static str {
    "ok"
}
