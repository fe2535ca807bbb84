//! Playing the agent: each new build is scheduled, runs its step, uploads `result.json` and
//! finishes, with a webhook at every step (`job.finished` after each try on an agent) (dropped, repeated or late at the chaos rate).
//! Where the stand-in has agents of the build's queue, each try runs on a free one, what
//! the job's hooks asked of `buildkite-agent` is applied (meta-data, a pause), and an exit
//! status the pipeline retries automatically starts a new job of the build, as Buildkite
//! does.

use std::time::Duration;

use super::BuildkiteStandin;
use super::StepOutcome;
use super::state::{AutoRun, Shared, StandinAgent, StandinJob, lock};
use super::webhooks::deliver;

/// The agent's side of a build: webhooks for scheduled and running, each try of the step
/// with its uploads, and build.finished.
pub(super) async fn play_agent(inner: Shared, run: AutoRun, number: u64) {
    let bk = BuildkiteStandin::from_shared(inner);
    tokio::time::sleep(Duration::from_millis(100)).await;
    send(&bk, &run, "build.scheduled", number).await;
    bk.set_state(number, "running");
    send(&bk, &run, "build.running", number).await;
    let Some(exit) = run_tries(&bk, &run, number).await else {
        // Canceled: the agent stops; the cancel sent build.finished.
        return;
    };
    bk.set_state(number, if exit == 0 { "passed" } else { "failed" });
    send(&bk, &run, "build.finished", number).await;
}

/// Sends `event` for build `number`: lost, repeated or late at the chaos rate.
async fn send(bk: &BuildkiteStandin, run: &AutoRun, event: &'static str, number: u64) {
    let body = bk.webhook_body(event, number);
    let post = {
        let (run, bk) = (run.clone(), bk.clone());
        move || {
            let (run, body, at) = (run.clone(), body.clone(), bk.now_secs());
            async move {
                if let Err(e) = deliver(&run.webhook_url, &run.secret, event, body, at).await {
                    tracing::warn!(error = %e.without_url(), event, "stand-in could not deliver webhook");
                }
            }
        }
    };
    let fault = lock(&bk.inner).roll(3);
    match fault {
        // Lost on the way.
        Some(0) => {}
        Some(1) => {
            post().await;
            post().await;
        }
        // Overtaken by the next event.
        Some(_) => {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                post().await;
            });
        }
        None => post().await,
    }
}

/// Runs the step until a try ends with an exit status the pipeline does not retry (or has
/// retried its limit): that exit status, or `None` when the build was canceled.
async fn run_tries(bk: &BuildkiteStandin, run: &AutoRun, number: u64) -> Option<i32> {
    let limits = crate::devstack::pipeline::retry_limits();
    let mut exits: Vec<i32> = Vec::new();
    loop {
        let agent = bk.next_agent(number).await.ok()?;
        bk.start_eval(number);
        let mut env = bk.build(number).map(|b| b.env).unwrap_or_default();
        if let Some(agent) = &agent {
            bk.start_try(number, agent);
            env.extend(agent.env.clone());
            env.insert("BUILDKITE_AGENT_NAME".into(), agent.name.clone());
            env.insert(
                "BUILDKITE_AGENT_ACCESS_TOKEN".into(),
                format!("standin-{}", agent.id),
            );
        }
        let job = bk.build(number).and_then(|b| b.jobs.last().cloned());
        env.insert("BUILDKITE_JOB_ID".into(), job.unwrap_or_default());
        // As Buildkite tells each job: how many times it has been retried.
        env.insert("BUILDKITE_RETRY_COUNT".into(), exits.len().to_string());
        send(bk, run, "job.started", number).await;
        let step = run.step.clone();
        let outcome = tokio::task::spawn_blocking(move || step(&env))
            .await
            .unwrap_or_default();
        if bk.build(number).is_some_and(|b| b.state == "canceled") {
            // The agent stops: nothing uploaded, the agent free again.
            if let Some(agent) = &agent {
                apply_agent_calls(&mut bk.lock().agents, &agent.name, &[]);
            }
            return None;
        }
        let exit = outcome.exit();
        exits.push(exit);
        let tries = exits.iter().filter(|e| **e == exit).count();
        let again = agent.is_some()
            && limits
                .iter()
                .any(|(status, limit)| *status == exit && tries <= *limit as usize);
        bk.end_try(number, agent.as_ref(), &outcome, again);
        if agent.is_some() {
            send(bk, run, "job.finished", number).await;
        }
        if !again {
            return Some(exit);
        }
    }
}

/// The build was canceled while its job waited for an agent.
struct Canceled;

impl BuildkiteStandin {
    /// A free agent of the build's queue, marked busy (waiting while none is free), or
    /// `None` when the stand-in has no agent of that queue at all.
    async fn next_agent(&self, number: u64) -> Result<Option<StandinAgent>, Canceled> {
        loop {
            {
                let mut s = self.lock();
                let Some(build) = s.index_of(number).map(|i| &s.builds[i]) else {
                    return Err(Canceled);
                };
                if build.state == "canceled" {
                    return Err(Canceled);
                }
                let queue = build
                    .env
                    .get("KERNELBOT_QUEUE")
                    .cloned()
                    .unwrap_or_else(|| "test".into());
                if !s.agents.iter().any(|a| a.queue == queue) {
                    return Ok(None);
                }
                // Buildkite gives a job to any free agent of its queue: here, one that has
                // not run this build yet if there is one, so a retry shows it went elsewhere.
                let tried: Vec<String> = build
                    .tries
                    .values()
                    .filter_map(|t| t.agent.as_ref().map(|(_, name)| name.clone()))
                    .collect();
                let fresh = s
                    .agents
                    .iter()
                    .position(|a| a.free_for(&queue) && !tried.contains(&a.name));
                let pick = fresh.or_else(|| s.agents.iter().position(|a| a.free_for(&queue)));
                if let Some(i) = pick {
                    s.agents[i].busy = true;
                    return Ok(Some(s.agents[i].clone()));
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The build's latest job starts on `agent`.
    fn start_try(&self, number: u64, agent: &StandinAgent) {
        let mut s = self.lock();
        let now = s.clock.now();
        if let Some(b) = s.build_mut(number)
            && let Some(job) = b.jobs.last().cloned()
        {
            b.started_at = Some(now);
            b.tries.insert(
                job,
                StandinJob {
                    agent: Some((agent.id.clone(), agent.name.clone())),
                    started_at: Some(now),
                    ..StandinJob::default()
                },
            );
        }
    }

    /// The latest job ended with `outcome`: its uploads, what its hooks asked of the agent,
    /// the agent free again, and (when `again`) a new job of the build for the retry.
    fn end_try(
        &self,
        number: u64,
        agent: Option<&StandinAgent>,
        outcome: &StepOutcome,
        again: bool,
    ) {
        for (path, bytes) in &outcome.artifacts {
            self.upload(number, path, bytes.clone(), "finished", false);
        }
        if let Some(bytes) = &outcome.result {
            self.upload(number, "result.json", bytes.clone(), "finished", false);
        }
        let mut s = self.lock();
        let now = s.clock.now();
        if let Some(agent) = agent {
            apply_agent_calls(&mut s.agents, &agent.name, &outcome.agent_calls);
        }
        let Some(b) = s.build_mut(number) else { return };
        for call in &outcome.agent_calls {
            if let [verb, set, key, value] = call.as_slice()
                && verb == "meta-data"
                && set == "set"
            {
                b.meta_data.insert(key.clone(), value.clone());
            }
        }
        let Some(job) = b.jobs.last().cloned() else {
            return;
        };
        let next = again.then(|| uuid::Uuid::new_v4().to_string());
        if let Some(t) = b.tries.get_mut(&job) {
            t.finished_at = Some(now);
            t.exit_status = Some(outcome.exit());
            t.retried_in_job_id = next.clone();
        }
        b.jobs.extend(next);
    }
}

/// `buildkite-agent pause` and `resume` from a job of agent `name`.
fn apply_agent_calls(agents: &mut [StandinAgent], name: &str, calls: &[Vec<String>]) {
    let Some(agent) = agents.iter_mut().find(|a| a.name == name) else {
        return;
    };
    agent.busy = false;
    for call in calls {
        match call.first().map(String::as_str) {
            Some("pause") => {
                let option = |flag: &str| {
                    call.iter()
                        .position(|a| a == flag)
                        .and_then(|i| call.get(i + 1))
                        .cloned()
                };
                let minutes = option("--timeout-in-minutes").and_then(|m| m.parse().ok());
                agent.paused = Some((option("--note").unwrap_or_default(), minutes.unwrap_or(5)));
            }
            Some("resume") => agent.paused = None,
            _ => {}
        }
    }
}
