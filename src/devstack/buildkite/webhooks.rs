//! Sending webhooks as Buildkite does, and the bodies it sends.

use serde_json::json;

use super::BuildkiteStandin;
use crate::buildkite::sign;
use crate::time::rfc3339;

impl BuildkiteStandin {
    /// The webhook body Buildkite would send for `event` on build `number` now.
    pub fn webhook_body(&self, event: &str, number: u64) -> Vec<u8> {
        let s = self.lock();
        let build = s
            .index_of(number)
            .map(|i| s.build_json(&s.builds[i], false));
        let mut body = json!({"event": event, "build": build, "pipeline": {"slug": s.pipeline, "name": s.pipeline},
            "sender": {"id": "u1", "name": "Buildkite"}});
        if event.starts_with("job.")
            && let Some(b) = s.index_of(number).map(|i| &s.builds[i])
        {
            let started = b.started_at.unwrap_or_else(|| s.clock.now());
            body["job"] = json!({"id": b.jobs.last(), "type": "script", "step_key": "evaluate",
                "state": "running", "started_at": rfc3339(started)});
        }
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

/// Sends a webhook as Buildkite does: `X-Buildkite-Event` and a signature over
/// `<timestamp>.<body>` made with `secret` at `timestamp`.
pub async fn deliver(
    url: &str,
    secret: &str,
    event: &str,
    body: Vec<u8>,
    timestamp: i64,
) -> reqwest::Result<reqwest::Response> {
    let ts = timestamp.to_string();
    let signature = format!("timestamp={ts},signature={}", sign(secret, &ts, &body));
    reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("x-buildkite-event", event)
        .header("x-buildkite-signature", signature)
        .body(body)
        .send()
        .await
}

pub fn unix_now() -> i64 {
    crate::time::now_secs()
}
