//! A callback receiver stand-in: records every signed callback it is sent (headers and
//! body) and answers with the statuses a test queues (500, 410, a slow answer), else 204.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;

/// One callback as it arrived.
#[derive(Clone, Debug)]
pub struct Received {
    pub id: String,
    pub timestamp: String,
    pub signature: String,
    pub body: Vec<u8>,
    /// What the stand-in answered.
    pub status: u16,
}

impl Received {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }
}

#[derive(Default)]
struct Inner {
    received: Vec<Received>,
    answers: VecDeque<u16>,
    delay: Option<Duration>,
}

#[derive(Clone)]
pub struct ReceiverStandin {
    /// Use as `CALLBACK_URL`.
    pub url: String,
    inner: Arc<Mutex<Inner>>,
}

impl ReceiverStandin {
    pub async fn start() -> std::io::Result<Self> {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let router = Router::new()
            .route("/callbacks", post(receive))
            .with_state(inner.clone());
        let addr = super::spawn(router).await?;
        Ok(Self {
            url: format!("http://{addr}/callbacks"),
            inner,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every callback received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    /// The next callbacks are answered with these statuses, in order.
    pub fn answer_with(&self, statuses: &[u16]) {
        self.lock().answers.extend(statuses);
    }

    /// Every answer waits this long first (`None`: at once).
    pub fn set_delay(&self, delay: Option<Duration>) {
        self.lock().delay = delay;
    }
}

fn header(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

async fn receive(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let (status, delay) = {
        let mut inner = inner.lock().unwrap_or_else(|e| e.into_inner());
        let status = inner.answers.pop_front().unwrap_or(204);
        inner.received.push(Received {
            id: header(&headers, "webhook-id"),
            timestamp: header(&headers, "webhook-timestamp"),
            signature: header(&headers, "webhook-signature"),
            body: body.to_vec(),
            status,
        });
        (status, inner.delay)
    };
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}
