//! The one error type of the HTTP boundary, mapped once to a status and a JSON body
//! ([`ErrorBody`]). A 5xx's detail is logged, never returned.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::views::ErrorBody;
use crate::buildkite::BuildkiteError;
use crate::flow::DispatchError;
use crate::flow::events::WebhookError;
use crate::flow::profiles::ProfileError;
use crate::flow::queues::QueueError;
use crate::flow::submission::Invalid;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400
    #[error("{message}")]
    BadRequest { code: &'static str, message: String },
    /// 401: never says which part was wrong.
    #[error("unauthorized")]
    Unauthorized,
    /// 403: a link that is not ours, or no longer open.
    #[error("{0}")]
    Forbidden(String),
    /// 404
    #[error("{0}")]
    NotFound(String),
    /// 409
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    /// 413
    #[error("{0}")]
    TooLarge(String),
    /// 422
    #[error("{message}")]
    Unprocessable { code: &'static str, message: String },
    /// 422 `invalid_config`: names the field (`config.<path>`).
    #[error("{message}")]
    InvalidConfig { field: String, message: String },
    /// 429
    #[error("{0}")]
    TooManyRequests(String),
    /// 502: Buildkite refused or failed; the message is Buildkite's own words.
    #[error("{0}")]
    BadGateway(String),
    /// 503: a dependency is down; the detail is logged, not returned.
    #[error("service temporarily unavailable")]
    Unavailable(String),
}

impl From<Invalid> for ApiError {
    fn from(e: Invalid) -> Self {
        let message = e.to_string();
        match e {
            Invalid::Json(_) | Invalid::NotAnObject => Self::BadRequest {
                code: "invalid_json",
                message,
            },
            Invalid::Field { .. } | Invalid::UnknownField(_) => Self::BadRequest {
                code: "invalid_field",
                message,
            },
            Invalid::PayloadTooLarge { .. } => Self::TooLarge(message),
            Invalid::UnknownGpu { .. } => Self::Unprocessable {
                code: "unknown_gpu",
                message,
            },
            Invalid::WebhookUrl(_) => Self::Unprocessable {
                code: "invalid_webhook_url",
                message,
            },
            Invalid::Config(ref c) => Self::InvalidConfig {
                field: e.field_path().unwrap_or_default(),
                message: c.message.clone(),
            },
        }
    }
}

impl From<DispatchError> for ApiError {
    fn from(e: DispatchError) -> Self {
        match e {
            DispatchError::BuildRefused { source, .. } => {
                Self::BadGateway(format!("Buildkite did not create the build: {source}"))
            }
            other => Self::Unavailable(other.to_string()),
        }
    }
}

impl From<ProfileError> for ApiError {
    fn from(e: ProfileError) -> Self {
        match e {
            ProfileError::Refused(_) => Self::Forbidden(e.to_string()),
            ProfileError::NotFound => Self::NotFound(e.to_string()),
            ProfileError::TooMany => Self::TooManyRequests(e.to_string()),
            // Buildkite busy or unreachable: a click may be tried again in a moment.
            ProfileError::Dispatch(DispatchError::Buildkite(
                source @ (BuildkiteError::Unavailable(_)
                | BuildkiteError::RateLimited { .. }
                | BuildkiteError::OverBudget),
            )) => Self::Unavailable(source.to_string()),
            ProfileError::Dispatch(DispatchError::Buildkite(BuildkiteError::Rejected {
                status: 404 | 410,
                ..
            })) => Self::NotFound("the profile's files are no longer kept".into()),
            ProfileError::Dispatch(DispatchError::Buildkite(source)) => {
                tracing::warn!(error = %source, "a profile's download was refused");
                Self::BadGateway(format!(
                    "Buildkite could not give the profile's download: {}",
                    source.public()
                ))
            }
            ProfileError::Dispatch(other) => other.into(),
        }
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::UnknownGpu { .. } => Self::NotFound(e.to_string()),
            // Buildkite's own words stay in the log.
            QueueError::Buildkite(source) => {
                tracing::warn!(error = %source, "the agents API failed");
                Self::BadGateway(format!(
                    "the Buildkite agents API failed: {}",
                    source.public()
                ))
            }
            QueueError::Stale(_) => Self::BadGateway(e.to_string()),
            other => Self::Unavailable(other.to_string()),
        }
    }
}

impl From<WebhookError> for ApiError {
    fn from(e: WebhookError) -> Self {
        match e {
            WebhookError::Unauthorized(_) => Self::Unauthorized,
            WebhookError::NotAnEvent(_) => Self::BadRequest {
                code: "invalid_json",
                message: e.to_string(),
            },
            WebhookError::EventMismatch { .. } => Self::BadRequest {
                code: "event_mismatch",
                message: e.to_string(),
            },
            WebhookError::Dispatch(e) => e.into(),
        }
    }
}

impl ApiError {
    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        self.status_and_code().0
    }

    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BadRequest { code, .. } => (StatusCode::BAD_REQUEST, *code),
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::Conflict { code, .. } => (StatusCode::CONFLICT, *code),
            Self::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            Self::Unprocessable { code, .. } => (StatusCode::UNPROCESSABLE_ENTITY, *code),
            Self::InvalidConfig { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_config"),
            Self::TooManyRequests(_) => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            Self::BadGateway(_) => (StatusCode::BAD_GATEWAY, "buildkite_error"),
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Self::Unavailable(detail) = &self {
            tracing::error!(error = %detail, "request failed");
        }
        let (status, code) = self.status_and_code();
        let field = match &self {
            Self::InvalidConfig { field, .. } => Some(field.clone()),
            _ => None,
        };
        let body = ErrorBody {
            error: code,
            message: self.to_string(),
            field,
        };
        (status, Json(body)).into_response()
    }
}
