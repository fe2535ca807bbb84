//! The stand-in's state: the builds it holds, the faults queued for its answers, and the
//! JSON it shows them as, as Buildkite's REST API and webhooks do.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::StepRunner;
use crate::time::{Clock, Millis, rfc3339};

#[derive(Clone, Debug)]
pub struct StandinArtifact {
    pub id: String,
    pub job_id: String,
    pub path: String,
    pub state: String,
    pub bytes: Vec<u8>,
}

#[derive(Clone, Debug)]
pub struct StandinBuild {
    pub id: String,
    pub number: u64,
    pub state: String,
    pub blocked: bool,
    pub branch: String,
    pub commit: String,
    pub message: String,
    pub env: BTreeMap<String, String>,
    pub meta_data: BTreeMap<String, String>,
    pub jobs: Vec<String>,
    /// Each job's try, by job id (jobs run by no stand-in agent have none).
    pub tries: BTreeMap<String, StandinJob>,
    /// When it was created, its evaluation step (`key: evaluate`) started on an agent, and
    /// it ended: on the stand-in's clock, so what a report shows is what happened.
    pub created_at: Millis,
    pub started_at: Option<Millis>,
    pub finished_at: Option<Millis>,
    pub artifacts: Vec<StandinArtifact>,
}

impl StandinBuild {
    /// Moves it to `state`, noting when it ended (or that it has not).
    pub(super) fn move_to(&mut self, state: &str, now: Millis) {
        self.state = state.to_owned();
        if crate::buildkite::TERMINAL_STATES.contains(&state) {
            self.finished_at.get_or_insert(now);
        } else {
            self.finished_at = None;
        }
    }
}

/// One try of a build's evaluation step: the agent that ran it and how it ended.
#[derive(Clone, Debug, Default)]
pub struct StandinJob {
    pub agent: Option<(String, String)>,
    pub started_at: Option<Millis>,
    pub finished_at: Option<Millis>,
    pub exit_status: Option<i32>,
    /// Buildkite's automatic retry replaced it with this job.
    pub retried_in_job_id: Option<String>,
}

/// A stand-in agent of the organization: a GPU of one queue, with the environment its
/// hooks would give each job (the GPU stand-ins' `PATH` and faults).
#[derive(Clone, Debug)]
pub struct StandinAgent {
    pub id: String,
    pub name: String,
    pub queue: String,
    pub connection_state: String,
    pub busy: bool,
    /// Paused by `buildkite-agent pause`: its note and timeout in minutes.
    pub paused: Option<(String, u64)>,
    pub env: BTreeMap<String, String>,
}

impl StandinAgent {
    /// As the agents API and agent webhooks show it.
    pub(super) fn json(&self, index: usize) -> Value {
        let paused = self.paused.as_ref();
        json!({"id": self.id, "name": self.name, "connection_state": self.connection_state,
               "hostname": "gpu-node-1", "meta_data": [format!("queue={}", self.queue), format!("gpu={index}")],
               "paused": paused.is_some(), "paused_note": paused.map(|p| p.0.clone()),
               "paused_timeout_in_minutes": paused.map(|p| p.1),
               "job": self.busy.then(|| json!({"id": format!("job-{index}"), "state": "running"}))})
    }

    /// Whether the next job of `queue` may start on it.
    pub(super) fn free_for(&self, queue: &str) -> bool {
        self.queue == queue
            && self.connection_state == "connected"
            && !self.busy
            && self.paused.is_none()
    }
}

/// Buildkite's REST limit, enforced: `calls` a window (a minute) on the stand-in's clock,
/// for its one token (its organization's limit is the smaller one, as one token is all it
/// has). Past it, a call answers 429 with `RateLimit-Reset`, as Buildkite does.
#[derive(Clone, Debug)]
pub(super) struct Limit {
    pub(super) calls: u32,
    pub(super) window: Millis,
    pub(super) started: Millis,
    pub(super) used: u32,
    /// Calls answered 429.
    pub(super) refused: usize,
    /// Calls taken in each window that has ended.
    pub(super) history: Vec<u32>,
}

impl Limit {
    /// Counts a call at `now`; `Err(reset seconds)` when it is over the limit.
    pub(super) fn take(&mut self, now: Millis) -> Result<(), u64> {
        self.roll(now);
        if self.used >= self.calls {
            self.refused += 1;
            return Err(self.reset_secs(now));
        }
        self.used += 1;
        Ok(())
    }

    /// Past its end, a new window begins (counted from its first call, as Buildkite's are):
    /// what an answer says of the window is never a window already over.
    pub(super) fn roll(&mut self, now: Millis) {
        if now - self.started >= self.window {
            self.history.push(self.used);
            self.started = now;
            self.used = 0;
        }
    }

    /// Whole seconds until the window ends (at least one, as Buildkite says it).
    pub(super) fn reset_secs(&self, now: Millis) -> u64 {
        let left = (self.started + self.window - now).max(0);
        u64::try_from((left + 999) / 1000).unwrap_or(1).max(1)
    }
}

#[derive(Clone)]
pub(super) struct AutoRun {
    pub(super) webhook_url: String,
    pub(super) secret: String,
    pub(super) step: StepRunner,
}

pub(super) struct Inner {
    /// What the builds' timestamps are read from.
    pub(super) clock: Clock,
    pub(super) token: String,
    pub(super) base: String,
    pub(super) org: String,
    pub(super) pipeline: String,
    pub(super) builds: Vec<StandinBuild>,
    pub(super) create_failure: Option<(u16, Value)>,
    /// The next creates answer these statuses, having created the build first when `true`
    /// (an answer lost after the work was done).
    pub(super) create_faults: VecDeque<(u16, bool)>,
    /// `RateLimit-Reset` on a 429 to a create.
    pub(super) create_reset_secs: u64,
    /// When set, every API answer carries `RateLimit-Remaining` counting down from it.
    pub(super) rate_remaining: Option<i64>,
    /// When set, the REST API's limit enforced as Buildkite does (see [`Limit`]).
    pub(super) limit: Option<Limit>,
    /// Seeded everyday faults on creates and webhooks: (rate, generator).
    pub(super) chaos: Option<(f64, fastrand::Rng)>,
    pub(super) create_delay: Option<Duration>,
    pub(super) read_failures: VecDeque<u16>,
    /// Reads under one build's path answer these statuses first.
    pub(super) build_read_failures: HashMap<u64, VecDeque<u16>>,
    pub(super) storage_auth_rejections: usize,
    /// What storage answers every download with, when set: status and body.
    pub(super) storage_failure: Option<(u16, String)>,
    /// What the artifact download endpoint answers, when set: status and body (HTML, say).
    pub(super) download_failure: Option<(u16, String)>,
    /// Builds whose artifact downloads never answer.
    pub(super) stalled_downloads: HashSet<u64>,
    pub(super) storage_downloads: usize,
    pub(super) api_calls: Vec<String>,
    pub(super) autorun: Option<AutoRun>,
    /// What `GET /organizations/{org}/agents` lists.
    pub(super) agents: Vec<StandinAgent>,
    /// The agents API answers this status instead (403: a token without `read_agents`).
    pub(super) agents_failure: Option<u16>,
    /// Every answer (REST and storage) waits this long first: a distant Buildkite.
    pub(super) delay: Option<Duration>,
    /// Every call as `METHOD path` with when it arrived and when it was answered.
    pub(super) spans: Vec<(String, Instant, Instant)>,
}

pub(super) type Shared = Arc<Mutex<Inner>>;

pub(super) fn lock(inner: &Shared) -> MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    pub(super) fn new(token: &str, org: &str, pipeline: &str, clock: Clock) -> Self {
        Self {
            clock,
            token: token.to_owned(),
            base: String::new(),
            org: org.to_owned(),
            pipeline: pipeline.to_owned(),
            builds: Vec::new(),
            create_failure: None,
            create_faults: VecDeque::new(),
            create_reset_secs: 30,
            rate_remaining: None,
            limit: None,
            chaos: None,
            create_delay: None,
            read_failures: VecDeque::new(),
            build_read_failures: HashMap::new(),
            storage_auth_rejections: 0,
            storage_failure: None,
            download_failure: None,
            stalled_downloads: HashSet::new(),
            storage_downloads: 0,
            api_calls: Vec::new(),
            autorun: None,
            agents: Vec::new(),
            agents_failure: None,
            delay: None,
            spans: Vec::new(),
        }
    }

    /// Where build `number` is: builds are numbered 1, 2, … as created and never removed,
    /// so this is a lookup, not a search (a load run holds thousands).
    pub(super) fn index_of(&self, number: u64) -> Option<usize> {
        let i = usize::try_from(number).ok()?.checked_sub(1)?;
        (self.builds.get(i)?.number == number).then_some(i)
    }

    pub(super) fn build_mut(&mut self, number: u64) -> Option<&mut StandinBuild> {
        let i = self.index_of(number)?;
        self.builds.get_mut(i)
    }

    /// A fault for this call, `0..kinds`, at the chaos rate.
    pub(super) fn roll(&mut self, kinds: u8) -> Option<u8> {
        let (rate, rng) = self.chaos.as_mut()?;
        (rng.f64() < *rate).then(|| rng.u8(0..kinds))
    }

    pub(super) fn build_api_url(&self, n: u64) -> String {
        format!(
            "{}/v2/organizations/{}/pipelines/{}/builds/{n}",
            self.base, self.org, self.pipeline
        )
    }

    pub(super) fn web_url(&self, n: u64) -> String {
        format!(
            "https://buildkite.com/{}/{}/builds/{n}",
            self.org, self.pipeline
        )
    }

    pub(super) fn build_json(&self, b: &StandinBuild, with_jobs: bool) -> Value {
        let api = self.build_api_url(b.number);
        let mut v = json!({
            "id": b.id, "graphql_id": format!("QnVpbGQt{}", b.number), "url": api,
            "web_url": self.web_url(b.number), "number": b.number, "state": b.state,
            "blocked": b.blocked, "message": b.message, "commit": b.commit, "branch": b.branch,
            "source": "api", "creator": {"id": "u1", "name": "kernelbot"},
            "created_at": rfc3339(b.created_at), "meta_data": b.meta_data,
            "pipeline": {"slug": self.pipeline},
        });
        if with_jobs {
            v["env"] = json!(b.env);
            v["jobs"] = b
                .jobs
                .iter()
                .map(|j| match b.tries.get(j) {
                    Some(t) => try_json(j, t, b, &api),
                    None => json!({"id": j, "type": "script", "name": ":rocket: Kernel Evaluation",
                        "step_key": "evaluate", "state": b.state,
                        "started_at": b.started_at.map(rfc3339),
                        "finished_at": b.started_at.and(b.finished_at).map(rfc3339),
                        "artifacts_url": format!("{api}/jobs/{j}/artifacts")}),
                })
                .collect();
        }
        v
    }
}

/// A job a stand-in agent ran, as the REST API shows it with `include_retried_jobs`.
pub(super) fn try_json(id: &str, t: &StandinJob, b: &StandinBuild, api: &str) -> Value {
    let state = match (t.retried_in_job_id.is_some(), t.exit_status) {
        (false, Some(0)) => "passed".to_owned(),
        (true, _) | (false, Some(_)) => "failed".to_owned(),
        (false, None) if t.started_at.is_some() => "running".to_owned(),
        (false, None) => b.state.clone(),
    };
    json!({"id": id, "type": "script", "name": ":rocket: Kernel Evaluation",
        "step_key": "evaluate", "state": state,
        "agent": t.agent.as_ref().map(|(id, name)| json!({"id": id, "name": name})),
        "exit_status": t.exit_status, "retried": t.retried_in_job_id.is_some(),
        "retried_in_job_id": t.retried_in_job_id,
        "started_at": t.started_at.map(rfc3339), "finished_at": t.finished_at.map(rfc3339),
        "artifacts_url": format!("{api}/jobs/{id}/artifacts")})
}

pub(super) fn bk_error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({"message": message}))).into_response()
}
