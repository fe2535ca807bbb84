//! The local run's functions listen on loopback; a web page the user happens to visit could
//! still reach them through DNS rebinding (a name that resolves to 127.0.0.1). Requests must
//! name the listener itself in `Host`, as browsers do for a rebound name, so those are refused.

use axum::Router;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Whether `host` names the loopback listener on `port`.
pub(super) fn is_local(host: Option<&str>, port: u16) -> bool {
    host.is_some_and(|h| {
        [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ]
        .iter()
        .any(|ok| h.eq_ignore_ascii_case(ok))
    })
}

/// `router`, answering only requests whose `Host` names the loopback listener on `port`.
pub(super) fn loopback_only(router: Router, port: u16) -> Router {
    router.layer(middleware::from_fn(
        move |req: Request, next: Next| async move {
            let host = req
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok());
            if is_local(host, port) {
                return next.run(req).await;
            }
            refuse(port)
        },
    ))
}

fn refuse(port: u16) -> Response {
    (
        StatusCode::MISDIRECTED_REQUEST,
        axum::Json(json!({
            "error": "wrong_host",
            "message": format!("this local server answers only to 127.0.0.1:{port} or localhost:{port}"),
        })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_listener_itself_is_a_local_host() {
        for ok in [
            "127.0.0.1:3000",
            "localhost:3000",
            "LOCALHOST:3000",
            "[::1]:3000",
        ] {
            assert!(is_local(Some(ok), 3000), "{ok}");
        }
        for bad in [
            None,
            Some("attacker.example:3000"),
            Some("127.0.0.1"),
            Some("127.0.0.1:3001"),
            Some("localhost.attacker.example:3000"),
            Some("127.0.0.1:3000.attacker.example"),
        ] {
            assert!(!is_local(bad, 3000), "{bad:?}");
        }
    }
}
