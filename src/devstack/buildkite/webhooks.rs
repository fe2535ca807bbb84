//! Sending webhooks as Buildkite does, and the bodies it sends.

use serde_json::json;

use super::BuildkiteStandin;
use super::state::try_json;
use crate::buildkite::sign;
use crate::time::rfc3339;

impl BuildkiteStandin {
    /// Now on the stand-in's clock, in whole seconds: what its webhooks' signatures say, as
    /// Buildkite's say its time (the functions verify on the clock they share with it).
    pub fn now_secs(&self) -> i64 {
        self.lock().clock.now().div_euclid(1000)
    }

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
            // job.finished tells of the try that just ended (a retry's job may follow it).
            let ended = b.jobs.iter().rev().find_map(|j| {
                let t = b.tries.get(j).filter(|t| t.finished_at.is_some())?;
                Some(try_json(j, t, b, &s.build_api_url(number)))
            });
            body["job"] = match ended {
                Some(job) if event == "job.finished" => job,
                _ => {
                    let started = b.started_at.unwrap_or_else(|| s.clock.now());
                    json!({"id": b.jobs.last(), "type": "script", "step_key": "evaluate",
                        "state": "running", "started_at": rfc3339(started)})
                }
            };
        }
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

impl BuildkiteStandin {
    /// Agent `name` connects, disconnects or is lost (`agent.connected`, `agent.lost`, …):
    /// its connection state changes and, when playing the agent, the event is sent as the
    /// notification service sends it. Whether it was delivered with a 2xx.
    pub async fn agent_event(&self, event: &str, name: &str) -> bool {
        let (body, run) = {
            let mut s = self.lock();
            let Some(i) = s.agents.iter().position(|a| a.name == name) else {
                return false;
            };
            if let Some(state) = event.strip_prefix("agent.") {
                s.agents[i].connection_state = state.to_owned();
                s.agents[i].busy &= state == "connected";
            }
            let body = json!({"event": event, "agent": s.agents[i].json(i),
                "sender": {"id": "u1", "name": "Buildkite"}});
            (
                serde_json::to_vec(&body).unwrap_or_default(),
                s.autorun.clone(),
            )
        };
        let Some(run) = run else { return false };
        deliver(&run.webhook_url, &run.secret, event, body, self.now_secs())
            .await
            .is_ok_and(|r| r.status().is_success())
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

/// The wall clock in whole seconds: what a webhook sent from outside a stack signs with.
pub fn unix_now() -> i64 {
    crate::time::now_secs()
}
