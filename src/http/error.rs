//! The one error type of the HTTP boundary, mapped once to a status and a JSON body
//! ([`ErrorBody`]). A 5xx keeps its source, which is logged with its chain, never returned.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::views::ErrorBody;
use crate::buildkite::BuildkiteError;
use crate::error::{BoxError, chain};
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
    /// 429, and when to try again (`Retry-After`, seconds).
    #[error("{message}")]
    TooManyRequests { message: String, retry_after: u64 },
    /// 502: Buildkite refused or failed. The message is what the caller may read (Buildkite's
    /// words where they are about the request, else a fixed sentence); the source is logged.
    #[error("{message}")]
    BadGateway {
        message: String,
        #[source]
        source: BoxError,
    },
    /// 503: a dependency is down; the source is logged, not returned. Try again in
    /// [`RETRY_UNAVAILABLE_SECS`].
    #[error("service temporarily unavailable")]
    Unavailable(#[source] BoxError),
    /// 503 for a reason the caller may read, and when to try again.
    #[error("{message}")]
    Busy { message: String, retry_after: u64 },
    /// 503 `profile_links_not_configured`: the deployment makes and opens no profile links.
    #[error("{0}")]
    NotConfigured(String),
}

/// When a caller may try again after a 503 for a dependency being down.
const RETRY_UNAVAILABLE_SECS: u64 = 5;

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
            // The job stays behind: the refusal is the cause.
            DispatchError::BuildRefused { source, .. } => Self::BadGateway {
                message: format!("Buildkite did not create the build: {source}"),
                source: source.into(),
            },
            other => Self::Unavailable(other.into()),
        }
    }
}

impl From<ProfileError> for ApiError {
    fn from(e: ProfileError) -> Self {
        match e {
            ProfileError::Refused(_) => Self::Forbidden(e.to_string()),
            ProfileError::NotFound => Self::NotFound(e.to_string()),
            ProfileError::TooMany { retry_after } => Self::TooManyRequests {
                message: e.to_string(),
                retry_after,
            },
            ProfileError::Busy { retry_after } => Self::Busy {
                message: e.to_string(),
                retry_after,
            },
            ProfileError::NotConfigured => Self::NotConfigured(e.to_string()),
            ProfileError::Dispatch(DispatchError::Buildkite(BuildkiteError::RateLimited {
                reset,
            })) => Self::Busy {
                message: "Buildkite's rate limit was reached; try again later".into(),
                retry_after: reset.map_or(60, |r| r.as_secs().clamp(1, 60)),
            },
            // Buildkite busy or unreachable: a click may be tried again in a moment.
            ProfileError::Dispatch(DispatchError::Buildkite(
                source @ (BuildkiteError::Unavailable(_) | BuildkiteError::OverBudget),
            )) => Self::Unavailable(source.into()),
            ProfileError::Dispatch(DispatchError::Buildkite(BuildkiteError::Rejected {
                status: 404 | 410,
                ..
            })) => Self::NotFound("the profile's files are no longer kept".into()),
            ProfileError::Dispatch(DispatchError::Buildkite(source)) => Self::BadGateway {
                message: format!(
                    "Buildkite could not give the profile's download: {}",
                    source.public()
                ),
                source: source.into(),
            },
            ProfileError::Dispatch(other) => other.into(),
        }
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        let message = match &e {
            QueueError::UnknownGpu { .. } => return Self::NotFound(e.to_string()),
            // Buildkite's own words stay in the log.
            QueueError::Buildkite(source) => {
                format!("the Buildkite agents API failed: {}", source.public())
            }
            QueueError::Stale(_) => e.to_string(),
            QueueError::Pending | QueueError::Store(_) => return Self::Unavailable(e.into()),
        };
        Self::BadGateway {
            message,
            source: e.into(),
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
            Self::TooManyRequests { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            Self::BadGateway { .. } => (StatusCode::BAD_GATEWAY, "buildkite_error"),
            Self::Unavailable(_) | Self::Busy { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
            }
            Self::NotConfigured(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "profile_links_not_configured",
            ),
        }
    }

    /// Logs a 5xx once, with its sources' chain: the body leaves the cause out.
    fn log(&self) {
        let status = self.status();
        // A 503 we chose (the quota kept, a fetch under way, links off) is no failure.
        let chosen = matches!(self, Self::Busy { .. } | Self::NotConfigured(_));
        if !status.is_server_error() || chosen {
            return;
        }
        let error = chain(self);
        // A 502 is Buildkite failing or refusing, not this service: a warning.
        if status == StatusCode::BAD_GATEWAY {
            tracing::warn!(%error, %status, "request failed");
        } else {
            tracing::error!(%error, %status, "request failed");
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.log();
        let (status, code) = self.status_and_code();
        let field = match &self {
            Self::InvalidConfig { field, .. } => Some(field.clone()),
            _ => None,
        };
        // Every 429 and 503 says when to try again.
        let retry_after = match &self {
            Self::TooManyRequests { retry_after, .. } | Self::Busy { retry_after, .. } => {
                Some(*retry_after)
            }
            Self::Unavailable(_) => Some(RETRY_UNAVAILABLE_SECS),
            // Until someone configures it: a long while.
            Self::NotConfigured(_) => Some(3600),
            _ => None,
        };
        let body = ErrorBody {
            error: code,
            message: self.to_string(),
            field,
        };
        let mut response = (status, Json(body)).into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.max(1).into());
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use serde_json::{Value, json};

    use super::*;
    use crate::jobs::StoreError;

    /// What the log captured while `act` ran.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let mut log = self.0.lock().unwrap_or_else(|p| p.into_inner());
            log.extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The answer to `e`, and the log lines written while it was made.
    async fn answer(e: ApiError) -> (StatusCode, Value, String) {
        let log = Captured::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let response = tracing::subscriber::with_default(subscriber, || e.into_response());
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await;
        let body = serde_json::from_slice(&bytes.unwrap_or_default()).unwrap_or(Value::Null);
        let lines = log.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (status, body, String::from_utf8_lossy(&lines).into_owned())
    }

    #[tokio::test]
    async fn a_503_keeps_its_source_logs_it_once_and_answers_without_it() {
        let down = DispatchError::Store(StoreError::unavailable("disk on fire"));

        let (status, body, log) = answer(down.into()).await;

        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let opaque = json!({"error": "unavailable", "message": "service temporarily unavailable"});
        assert_eq!(body, opaque);
        assert_eq!(log.lines().count(), 1, "{log}");
        assert!(log.contains("ERROR"), "{log}");
        assert!(log.contains("job store unavailable: disk on fire"), "{log}");
    }

    #[tokio::test]
    async fn a_502_keeps_buildkite_s_words_in_its_source_and_the_log_only() {
        let refused = QueueError::Buildkite(BuildkiteError::Misconfigured {
            status: 403,
            message: "needs the read_agents scope".into(),
        });
        let error = ApiError::from(refused);
        assert!(chain(&error).contains("read_agents"), "{}", chain(&error));

        let (status, body, log) = answer(error).await;

        assert_eq!(status, StatusCode::BAD_GATEWAY);
        let message = "the Buildkite agents API failed: Buildkite refused the request (HTTP 403)";
        assert_eq!(
            body,
            json!({"error": "buildkite_error", "message": message})
        );
        assert_eq!(log.lines().count(), 1, "{log}");
        assert!(log.contains("WARN") && log.contains("read_agents"), "{log}");
    }

    #[tokio::test]
    async fn a_4xx_is_not_logged() {
        let (status, _, log) = answer(ApiError::Unauthorized).await;

        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(log, "");
    }
}
