//! A Buildkite stand-in that speaks Buildkite's wire format: the REST endpoints we call
//! ([`routes`]), with the faults a test can queue ([`faults`]), kept in one state
//! ([`state`]), and the signed webhooks it sends ([`webhooks`]). With
//! [`BuildkiteStandin::autorun`] it also plays the agent ([`autorun`]).

mod autorun;
mod faults;
mod routes;
mod state;
mod webhooks;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::json;

use crate::time::Clock;

pub use state::{StandinAgent, StandinArtifact, StandinBuild, StandinJob};
pub use webhooks::{deliver, unix_now};

use state::{AutoRun, Inner, Shared, lock};

/// What the agent's step produced: whether the command succeeded, and the `result.json` it
/// left for upload (Buildkite uploads artifacts whether or not the command succeeded).
#[derive(Clone, Debug, Default)]
pub struct StepOutcome {
    pub passed: bool,
    pub result: Option<Vec<u8>>,
    /// The step's other artifacts (profile zips), by path.
    pub artifacts: Vec<(String, Vec<u8>)>,
    /// The command's exit status, where known (`None`: 0 if it passed, else 1).
    pub exit_status: Option<i32>,
    /// What the job's hooks asked of `buildkite-agent` (`["pause", "--note", …]`).
    pub agent_calls: Vec<Vec<String>>,
}

impl StepOutcome {
    /// A step that passed and wrote `result`.
    pub fn passed(result: Vec<u8>) -> Self {
        Self {
            passed: true,
            result: Some(result),
            ..Self::default()
        }
    }

    /// The exit status Buildkite would record for the job.
    pub fn exit(&self) -> i32 {
        self.exit_status.unwrap_or(if self.passed { 0 } else { 1 })
    }
}

/// Runs a build's step from its env (the agent's work).
pub type StepRunner = Arc<dyn Fn(&BTreeMap<String, String>) -> StepOutcome + Send + Sync>;

#[derive(Clone)]
pub struct BuildkiteStandin {
    /// Use as `BUILDKITE_API_URL`.
    pub api_url: String,
    pub org: String,
    pub pipeline: String,
    inner: Arc<Mutex<Inner>>,
}

impl BuildkiteStandin {
    pub async fn start(token: &str, org: &str, pipeline: &str) -> std::io::Result<Self> {
        Self::start_with_clock(token, org, pipeline, Clock::default()).await
    }

    /// A stand-in whose builds are timed on `clock` (tests move it forward).
    pub async fn start_with_clock(
        token: &str,
        org: &str,
        pipeline: &str,
        clock: Clock,
    ) -> std::io::Result<Self> {
        let inner = Arc::new(Mutex::new(Inner::new(token, org, pipeline, clock)));
        let addr = super::spawn(routes::router(inner.clone())).await?;
        lock(&inner).base = format!("http://{addr}");
        Ok(Self::from_shared(inner))
    }

    /// The handle for a stand-in's state (what its own request handlers hold).
    fn from_shared(inner: Shared) -> Self {
        let (api_url, org, pipeline) = {
            let s = lock(&inner);
            (format!("{}/v2", s.base), s.org.clone(), s.pipeline.clone())
        };
        Self {
            api_url,
            org,
            pipeline,
            inner,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Sets the organization's agents: `(name, queue tag, connection state, busy)`.
    pub fn set_agents(&self, agents: &[(&str, &str, &str, bool)]) {
        self.lock().agents = agents
            .iter()
            .enumerate()
            .map(|(i, (name, queue, connection, busy))| StandinAgent {
                id: format!("agent-{i}"),
                name: (*name).to_owned(),
                queue: (*queue).to_owned(),
                connection_state: (*connection).to_owned(),
                busy: *busy,
                paused: None,
                env: BTreeMap::new(),
            })
            .collect();
    }

    /// Adds a connected, idle agent of `queue` whose jobs run with `env` on top of the
    /// build's (what its hooks would set: the GPU stand-ins' `PATH`, their faults). With
    /// agents of a build's queue, [`Self::autorun`] runs each try on a free one of them.
    pub fn add_agent(&self, name: &str, queue: &str, env: &[(&str, &str)]) {
        let mut s = self.lock();
        let id = format!("agent-{}", s.agents.len());
        s.agents.push(StandinAgent {
            id,
            name: name.to_owned(),
            queue: queue.to_owned(),
            connection_state: "connected".into(),
            busy: false,
            paused: None,
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        });
    }

    /// The agent named `name`, as it stands now.
    pub fn agent(&self, name: &str) -> Option<StandinAgent> {
        self.lock().agents.iter().find(|a| a.name == name).cloned()
    }

    /// Pauses an agent with `note`, as the UI or `buildkite-agent pause` does.
    pub fn pause(&self, name: &str, note: &str) {
        if let Some(a) = self.lock().agents.iter_mut().find(|a| a.name == name) {
            a.paused = Some((note.to_owned(), 240));
        }
    }

    /// Resumes a paused agent, as `buildkite-agent resume` or the UI does.
    pub fn resume(&self, name: &str) {
        if let Some(a) = self.lock().agents.iter_mut().find(|a| a.name == name) {
            a.paused = None;
        }
    }

    /// How many times the agents API was called.
    pub fn agent_calls(&self) -> usize {
        self.lock()
            .api_calls
            .iter()
            .filter(|c| c.ends_with("/agents"))
            .count()
    }

    /// Every build created, in order.
    pub fn builds(&self) -> Vec<StandinBuild> {
        self.lock().builds.clone()
    }

    pub fn build(&self, number: u64) -> Option<StandinBuild> {
        let s = self.lock();
        s.index_of(number).map(|i| s.builds[i].clone())
    }

    /// Every REST call as `METHOD path`.
    pub fn api_calls(&self) -> Vec<String> {
        self.lock().api_calls.clone()
    }

    /// The evaluation step starts on an agent: the build runs.
    pub fn start_eval(&self, number: u64) {
        let mut s = self.lock();
        let now = s.clock.now();
        if let Some(b) = s.build_mut(number) {
            b.move_to("running", now);
            b.started_at.get_or_insert(now);
        }
    }

    /// Storage requests refused because they carried an `Authorization` header.
    pub fn storage_auth_rejections(&self) -> usize {
        self.lock().storage_auth_rejections
    }

    pub fn storage_downloads(&self) -> usize {
        self.lock().storage_downloads
    }

    /// Moves a build to `state` (`blocked` sets the blocked flag on a passed build).
    pub fn set_state(&self, number: u64, state: &str) {
        let mut s = self.lock();
        let now = s.clock.now();
        if let Some(b) = s.build_mut(number) {
            b.blocked = state == "blocked";
            b.move_to(if b.blocked { "passed" } else { state }, now);
        }
    }

    /// Adds an artifact to the build's latest job, or a new retried job when `new_job`.
    pub fn upload(&self, number: u64, path: &str, bytes: Vec<u8>, state: &str, new_job: bool) {
        if let Some(b) = self.lock().build_mut(number) {
            if new_job {
                b.jobs.push(uuid::Uuid::new_v4().to_string());
            }
            let job_id = b.jobs.last().cloned().unwrap_or_default();
            b.artifacts.push(StandinArtifact {
                id: uuid::Uuid::new_v4().to_string(),
                job_id,
                path: path.to_owned(),
                state: state.to_owned(),
                bytes,
            });
        }
    }

    /// The build's latest job ran on agent `agent` and ended with `exit` (a retry, when
    /// `again`, follows as a new job), as a test playing the agent by hand has it; its id.
    /// Try `i` of a build starts `2 + 40 i` s after the build was created and runs 30 s, so
    /// builds played alike show alike timings.
    pub fn record_try(&self, number: u64, agent: &str, exit: i32, again: bool) -> Option<String> {
        let mut s = self.lock();
        let b = s.build_mut(number)?;
        let job = b.jobs.last().cloned()?;
        let started = b.created_at + 2_000 + 40_000 * b.tries.len() as i64;
        b.started_at.get_or_insert(started);
        let next = again.then(|| uuid::Uuid::new_v4().to_string());
        b.tries.insert(
            job.clone(),
            StandinJob {
                agent: Some((format!("id-{agent}"), agent.to_owned())),
                started_at: Some(started),
                finished_at: Some(started + 30_000),
                exit_status: Some(exit),
                retried_in_job_id: next.clone(),
            },
        );
        b.jobs.extend(next);
        Some(job)
    }

    /// The build's latest job, which started with the build's evaluation (or now), ends now
    /// on agent `agent` with `exit`; its id.
    pub fn end_try_now(&self, number: u64, agent: &str, exit: i32) -> Option<String> {
        let mut s = self.lock();
        let now = s.clock.now();
        let b = s.build_mut(number)?;
        let job = b.jobs.last().cloned()?;
        let started = *b.started_at.get_or_insert(now);
        let agent = Some((format!("id-{agent}"), agent.to_owned()));
        b.tries.insert(
            job.clone(),
            StandinJob {
                agent,
                started_at: Some(started),
                finished_at: Some(now),
                exit_status: Some(exit),
                retried_in_job_id: None,
            },
        );
        Some(job)
    }

    /// Sets build meta-data `key`, as `buildkite-agent meta-data set` does.
    pub fn set_meta_data(&self, number: u64, key: &str, value: &str) {
        if let Some(b) = self.lock().build_mut(number) {
            b.meta_data.insert(key.to_owned(), value.to_owned());
        }
    }

    /// Plays the agent for every new build: see the module docs.
    pub fn autorun(&self, webhook_url: &str, secret: &str, step: StepRunner) {
        self.lock().autorun = Some(AutoRun {
            webhook_url: webhook_url.to_owned(),
            secret: secret.to_owned(),
            step,
        });
    }
}

/// A `result.json` like kernelbot's runner writes, for a run whose tests all pass (or, with
/// `failing_test`, one that fails).
pub fn sample_result(failing_test: bool) -> Vec<u8> {
    let status = if failing_test { "fail" } else { "pass" };
    let v = json!({
        "success": true, "error": "",
        "system": {"gpu": "NVIDIA H100 80GB HBM3", "device_count": 1, "cpu": "AMD EPYC 9654",
                   "runtime": "CUDA", "platform": "Linux-6.8.0-x86_64", "torch": "2.6.0+cu126", "hostname": "gpu-node-1"},
        "runs": {
            "test": {"start": "2026-11-21T10:00:01.000000", "end": "2026-11-21T10:00:04.500000", "compilation": null,
                "run": {"success": true, "passed": !failing_test, "command": "python eval.py test", "stdout": "", "stderr": "",
                        "exit_code": if failing_test { 112 } else { 0 }, "duration": 3.5,
                        "result": {"check": status, "test-count": "3", "test.0.spec": "size: 1024", "test.0.status": "pass",
                                   "test.1.spec": "size: 4096", "test.1.status": "pass",
                                   "test.2.spec": "size: 16384", "test.2.status": status,
                                   "test.2.error": if failing_test { "mismatch at index 7: 0.5 != 0.25" } else { "" }}},
                "profile": null}
        }
    });
    serde_json::to_vec_pretty(&v).unwrap_or_default()
}
