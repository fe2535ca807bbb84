//! What handlers take from a request: proof of a submit token ([`Authorized`]), the
//! invocation's deadline ([`Invocation`]), what a webhook's Buildkite headers claim
//! ([`BuildkiteHeaders`]) and the raw body within the route's limit ([`Body`]), each
//! refusing with the API's own error.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header;
use axum::http::request::Parts;

use super::{ApiError, MAX_BODY};
use crate::buildkite::{EVENT_HEADER, SIGNATURE_HEADER, TOKEN_HEADER};
use crate::flow::Deps;
use crate::flow::events::Claimed;
use crate::flow::keys::Keys;
use crate::retry::{Deadline, LOCAL_BUDGET};

/// Kept back from the Lambda deadline to write the answer.
const ANSWER_RESERVE: Duration = Duration::from_millis(500);

/// The request carried one of the submission API's bearer tokens. A handler that reads or
/// changes a job takes it, so forgetting the check does not compile into a route.
pub(crate) struct Authorized;

impl FromRequestParts<Arc<Deps>> for Authorized {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, d: &Arc<Deps>) -> Result<Self, ApiError> {
        let presented = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or(ApiError::Unauthorized)?;
        // A token this instance does not hold may be the rotation's new one: read them again.
        let known = |k: &Keys| k.submit_token(presented).then_some(Self).ok_or(());
        let now = d.clock.now();
        let checked = d.keys.check(now, known, |_| true).await;
        checked.map_err(|()| ApiError::Unauthorized)
    }
}

/// The invocation's one deadline: the Lambda context's when there is one, else a fixed span.
pub(crate) struct Invocation(pub(crate) Deadline);

impl<S: Sync> FromRequestParts<S> for Invocation {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(match parts.extensions.get::<lambda_http::Context>() {
            Some(ctx) => Deadline::at_unix_millis(ctx.deadline).less(ANSWER_RESERVE),
            None => Deadline::after(LOCAL_BUDGET),
        }))
    }
}

/// Whether the client asked for JSON (`Accept: application/json`) rather than a page.
pub(crate) struct WantsJson(pub(crate) bool);

impl<S: Sync> FromRequestParts<S> for WantsJson {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let accept = parts.headers.get(axum::http::header::ACCEPT);
        let accept = accept.and_then(|v| v.to_str().ok()).unwrap_or_default();
        Ok(Self(accept.contains("application/json")))
    }
}

/// A webhook's Buildkite headers, as claims the flow checks against the signed body. One
/// that is absent or not text is `None`: verifying, not extracting, refuses the request.
pub(crate) struct BuildkiteHeaders(pub(crate) Claimed);

impl<S: Sync> FromRequestParts<S> for BuildkiteHeaders {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let header = |name: &str| {
            let value = parts.headers.get(name)?.to_str().ok()?;
            Some(value.to_owned())
        };
        Ok(Self(Claimed {
            signature: header(SIGNATURE_HEADER),
            token: header(TOKEN_HEADER),
            event: header(EVENT_HEADER),
        }))
    }
}

/// The raw body, up to the route's `DefaultBodyLimit`; more is a 413 with the API's body.
pub(crate) struct Body(pub(crate) Bytes);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        match Bytes::from_request(request, state).await {
            Ok(bytes) => Ok(Self(bytes)),
            Err(e) if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE => Err(
                ApiError::TooLarge(format!("request body exceeds {MAX_BODY} bytes")),
            ),
            Err(e) => Err(ApiError::BadRequest {
                code: "unreadable_body",
                message: e.body_text(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn claimed(request: axum::http::Request<()>) -> Claimed {
        let (mut parts, ()) = request.into_parts();
        match BuildkiteHeaders::from_request_parts(&mut parts, &()).await {
            Ok(BuildkiteHeaders(claimed)) => claimed,
            Err(never) => match never {},
        }
    }

    #[tokio::test]
    async fn buildkite_headers_are_read_and_one_that_is_not_text_is_absent() {
        let request = axum::http::Request::builder()
            .header("X-Buildkite-Signature", "timestamp=1,signature=ab")
            .header("X-Buildkite-Event", "build.finished")
            .header("X-Buildkite-Token", &b"\xffsecret"[..])
            .body(())
            .expect("a request");

        let claimed = claimed(request).await;

        assert_eq!(
            claimed.signature.as_deref(),
            Some("timestamp=1,signature=ab")
        );
        assert_eq!(claimed.event.as_deref(), Some("build.finished"));
        assert_eq!(claimed.token, None);
    }
}
