//! Donated hardware through the local stack: stand-in agents of one queue, each with its
//! own stand-in GPU (`tests/fixtures/gpu-nvidia`, with faults), run the pipeline's step and
//! then the `post-command` hook `setup-node.sh` writes, with a `buildkite-agent` stand-in
//! that records what the hook asks. The Buildkite stand-in retries the runner's
//! infrastructure exit code as a new job on another agent, as the pipeline's automatic
//! retry does. What users and operators see is checked: the report, the paused agent and
//! its reason, the operators' channel, `GET /fleet`.

use std::time::{Duration, Instant};

use kernelbot_dispatch::devstack::agent::local_agent;
use kernelbot_dispatch::devstack::discord::Outage;
use kernelbot_dispatch::jobs::{CacheEntry, Channel};
use kernelbot_dispatch::result::Verdict;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::runner::{config, gpu_stand_ins, runner_link};
use crate::support::{API_TOKEN, SECRET, StoreKind, TestApp, submission};

/// The operators' channel: a webhook of its own on the Discord stand-in.
const OPS_ID: &str = "222222222222222222";
const OPS_URL: &str = "https://discord.com/api/webhooks/222222222222222222/ops-token_2";

/// The local stack with the operators' channel, playing the agent with the local runner.
/// The GPU stand-ins' directory lives as long as the returned guard.
async fn fleet_app(kind: StoreKind) -> (TestApp, tempfile::TempDir) {
    let app = TestApp::spawn_with(kind, &[("OPS_DISCORD_WEBHOOK_URL", OPS_URL)]).await;
    let agent = local_agent(runner_link().to_path_buf());
    app.buildkite.autorun(&app.webhook_url, SECRET, agent);
    (app, gpu_stand_ins("gpu-nvidia"))
}

/// Adds agent `name` of queue `h100` with one stand-in GPU and `faults`.
fn add_gpu(app: &TestApp, stand_ins: &tempfile::TempDir, name: &str, faults: &[(&str, &str)]) {
    let path = format!(
        "{}:/usr/local/bin:/usr/bin:/bin",
        stand_ins.path().display()
    );
    let mut env: Vec<(&str, &str)> = vec![("PATH", &path), ("CUDA_VISIBLE_DEVICES", "0")];
    env.extend_from_slice(faults);
    app.buildkite.add_agent(name, "h100", &env);
}

/// A file the GPU stand-in counts its readings in (`GPU_STANDIN_STATE`), in a directory that
/// lives as long as the guard.
fn read_counter() -> (tempfile::TempDir, String) {
    let state = tempfile::tempdir().unwrap();
    let reads = state.path().join("reads").display().to_string();
    (state, reads)
}

/// A submission whose kernel passes, in `mode`.
fn passing(run_id: &str, mode: &str) -> Value {
    let mut body = submission(run_id);
    body["config"] = config("pass", mode);
    body
}

/// Submits `body` and waits until its job has ended and its report is delivered.
async fn run(app: &TestApp, body: &Value) -> kernelbot_dispatch::jobs::Job {
    let run_id = body["run_id"].as_str().unwrap();
    let (status, answer) = app.submit(body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let job = app.job(run_id).await;
        if job.state.is_terminal() && !job.owes(Channel::Discord) {
            return job;
        }
        assert!(Instant::now() < deadline, "{run_id} never ended: {job:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the operators' channel received once `n` messages came (the service tells them
/// after the user's report, so they may land a moment later), or 10 s passed.
async fn ops_after(app: &TestApp, n: usize) -> Vec<String> {
    until_within_10s(|| ops_messages(app).len() >= n).await;
    // Anything more would come at once: a short look for extras.
    tokio::time::sleep(Duration::from_millis(200)).await;
    ops_messages(app)
}

/// How many posts the operators' channel refused once `n` were, or 10 s passed.
async fn ops_refused_after(app: &TestApp, n: usize) -> usize {
    let refused = || {
        app.discord
            .calls()
            .iter()
            .filter(|c| c.webhook_id == OPS_ID && c.status >= 300)
            .count()
    };
    until_within_10s(|| refused() >= n).await;
    refused()
}

/// Waits until `done` holds, or 10 s passed.
async fn until_within_10s(done: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !done() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the operators' channel received (and took).
fn ops_messages(app: &TestApp) -> Vec<String> {
    app.discord
        .calls()
        .into_iter()
        .filter(|c| c.webhook_id == OPS_ID && c.status < 300)
        .map(|c| c.body["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The users' channel: everything but the operators' messages.
fn user_text(app: &TestApp) -> String {
    app.discord
        .messages()
        .values()
        .map(|m| m.to_string())
        .filter(|m| {
            !m.contains("failed the GPU checks") && !m.contains("🔌") && !m.contains("🌡 Agent")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn fleet_view(app: &TestApp) -> Value {
    let resp = app
        .client
        .get(format!("{}/fleet", app.submit_url))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    resp.json().await.unwrap()
}

/// Past the grace, one sweep tells `name`'s loss and a second tells nothing more: the
/// operators hear it once. Their messages.
async fn told_lost_once(app: &TestApp, name: &str) -> Vec<String> {
    app.clock.advance(Duration::from_secs(6 * 60));
    assert_eq!(app.sweep().await.incidents_told, 1);
    app.sweep().await;
    let ops = ops_messages(app);
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert!(
        ops[0].contains(name) && ops[0].contains("agent.lost"),
        "{ops:?}"
    );
    ops
}

fn agent_row<'a>(fleet: &'a Value, name: &str) -> &'a Value {
    fleet["agents"]
        .as_array()
        .and_then(|a| a.iter().find(|r| r["name"] == name))
        .unwrap_or_else(|| panic!("{name} not in {fleet}"))
}

/// The evaluation's tries, as the stand-in recorded them: (agent, exit status).
fn tries(app: &TestApp, number: u64) -> Vec<(String, Option<i32>)> {
    let b = app.buildkite.build(number).expect("the build");
    b.jobs
        .iter()
        .map(|j| {
            let t = &b.tries[j];
            (t.agent.clone().unwrap_or_default().1, t.exit_status)
        })
        .collect()
}

/// The contract's first case: a GPU with uncorrected ECC errors never runs the submission;
/// its agent pauses itself with the reason, the retry on a healthy agent gives the user's
/// real result, the report says it was retried, and the operators hear of it once.
async fn an_ecc_fault_is_retried_on_a_healthy_gpu_and_the_agent_paused(kind: StoreKind) {
    let (app, gpus) = fleet_app(kind).await;
    add_gpu(&app, &gpus, "node1-gpu0", &[("GPU_STANDIN_ECC", "3")]);
    add_gpu(&app, &gpus, "node1-gpu1", &[]);
    let job = run(&app, &passing("ecc", "test")).await;

    let outcome = job.outcome.as_deref().expect("an outcome");
    assert_eq!(outcome.verdict, Verdict::Passed, "{outcome:?}");
    let number = job.build.as_ref().unwrap().number;
    assert_eq!(
        tries(&app, number),
        [
            ("node1-gpu0".into(), Some(75)),
            ("node1-gpu1".into(), Some(0))
        ]
    );
    // The hook as setup-node.sh writes it put the result into the build's meta-data, and
    // the job ended from build.finished alone, its two tries noted from job.finished.
    let meta = app.buildkite.build(number).unwrap().meta_data;
    let key = kernelbot_dispatch::protocol::riding::RESULT_META_DATA_KEY;
    assert!(meta.contains_key(key), "{:?}", meta.keys());
    let paths: Vec<String> = app
        .metric("FinishesRead")
        .iter()
        .map(|(m, _)| m["Path"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(paths, ["event"]);
    let paused = app.buildkite.agent("node1-gpu0").unwrap().paused;
    let (note, minutes) = paused.expect("the faulty agent paused itself");
    assert!(
        note.contains("ecc_errors") && note.contains("3 uncorrected"),
        "{note}"
    );
    assert_eq!(minutes, 240, "setup-node.sh's default pause");
    assert_eq!(app.buildkite.agent("node1-gpu1").unwrap().paused, None);

    let text = user_text(&app);
    assert!(text.contains("✅ success"), "{text}");
    assert!(
        text.contains("Retried on another GPU (ecc") && text.contains("3 uncorrected ECC"),
        "{text}"
    );
    let ops = ops_after(&app, 1).await;
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert!(
        ops[0].contains("node1-gpu0") && ops[0].contains("3 uncorrected ECC"),
        "{ops:?}"
    );
    assert_eq!(app.metric("GpuIncidents").len(), 1);

    // The agents' records are written just after the user's report goes out.
    let mut fleet = fleet_view(&app).await;
    for _ in 0..100 {
        if agent_row(&fleet, "node1-gpu1")["jobs_24h"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        fleet = fleet_view(&app).await;
    }
    let bad = agent_row(&fleet, "node1-gpu0");
    assert_eq!(bad["paused"], true, "{fleet}");
    assert!(
        bad["paused_why"].as_str().unwrap().contains("ecc_errors"),
        "{fleet}"
    );
    assert_eq!(
        (bad["jobs_24h"].as_u64(), bad["infra_failures_24h"].as_u64()),
        (Some(1), Some(1))
    );
    // Readings come from the result read (the last try's): the failed try's note says what
    // its check found.
    assert!(bad["readings"].as_array().unwrap().is_empty(), "{fleet}");
    let good = agent_row(&fleet, "node1-gpu1");
    assert_eq!(
        (
            good["paused"].as_bool(),
            good["infra_failures_24h"].as_u64()
        ),
        (Some(false), Some(0))
    );
    assert!(
        good["readings"][0]["temperature_c"].is_number(),
        "its pre-flight: {fleet}"
    );
}

/// A foreign process on the GPU is retried elsewhere, and its agent paused; a slowdown that
/// shows only while the submission runs and persists is tried once more elsewhere, with no
/// pause and no operators' message (one such run may be the kernel's own heat); a slowdown
/// that clears after a cool-down is measured again on the same GPU and ranked.
async fn foreign_processes_and_slowdowns_end_as_the_contract_says(kind: StoreKind) {
    let (app, gpus) = fleet_app(kind).await;
    let state = tempfile::tempdir().unwrap();
    let reads = |name: &str| -> String { state.path().join(name).display().to_string() };
    let (foreign, hot, warm) = (reads("foreign"), reads("hot"), reads("warm"));
    add_gpu(
        &app,
        &gpus,
        "a-foreign",
        &[
            ("GPU_STANDIN_FOREIGN_PID", "4242"),
            ("GPU_STANDIN_STATE", &foreign),
        ],
    );
    add_gpu(
        &app,
        &gpus,
        "b-healthy",
        &[("KERNELBOT_COOLDOWN_SECS", "0")],
    );

    let job = run(&app, &passing("foreign", "test")).await;
    assert_eq!(job.outcome.as_deref().unwrap().verdict, Verdict::Passed);
    let b = job.build.as_ref().unwrap().number;
    assert_eq!(tries(&app, b)[0], ("a-foreign".into(), Some(75)));
    assert!(
        user_text(&app).contains("Retried on another GPU (foreign"),
        "{}",
        user_text(&app)
    );

    // A persistent thermal slowdown: the pre-flight's read is clean, every read after
    // shows it; throttled twice, the leaderboard run is no ranked time.
    app.buildkite.resume("a-foreign");
    app.buildkite.set_agents(&[]);
    add_gpu(
        &app,
        &gpus,
        "c-hot",
        &[
            ("GPU_STANDIN_EVENTS", "0x40"),
            ("GPU_STANDIN_EVENTS_FROM", "1"),
            ("GPU_STANDIN_STATE", &hot),
            ("KERNELBOT_COOLDOWN_SECS", "0"),
        ],
    );
    add_gpu(
        &app,
        &gpus,
        "d-healthy",
        &[("KERNELBOT_COOLDOWN_SECS", "0")],
    );
    let job = run(&app, &passing("hot", "leaderboard")).await;
    let outcome = job.outcome.as_deref().unwrap();
    assert_eq!(outcome.verdict, Verdict::Passed, "{outcome:?}");
    assert_eq!(
        tries(&app, job.build.as_ref().unwrap().number),
        [("c-hot".into(), Some(76)), ("d-healthy".into(), Some(0))]
    );
    // A throttled run may be the submission's own heat: retried elsewhere, never a pause.
    assert_eq!(app.buildkite.agent("c-hot").unwrap().paused, None);
    assert!(outcome.tries[0].throttled && !outcome.tries[0].infra);
    let text = user_text(&app);
    assert!(text.contains("Retried on another GPU (throttled"), "{text}");

    // A slowdown that clears: measured again after the cool-down, on the same GPU (the
    // GPU's reads: the pre-flight's, the benchmark's two, then the leaderboard's).
    app.buildkite.set_agents(&[]);
    add_gpu(
        &app,
        &gpus,
        "e-warm",
        &[
            ("GPU_STANDIN_EVENTS", "0x40"),
            ("GPU_STANDIN_EVENTS_FROM", "3"),
            ("GPU_STANDIN_EVENTS_READS", "2"),
            ("GPU_STANDIN_STATE", &warm),
            ("KERNELBOT_COOLDOWN_SECS", "0"),
        ],
    );
    let job = run(&app, &passing("warm", "leaderboard")).await;
    let outcome = job.outcome.as_deref().unwrap();
    assert_eq!(outcome.verdict, Verdict::Passed, "{outcome:?}");
    assert_eq!(
        tries(&app, job.build.as_ref().unwrap().number),
        [("e-warm".into(), Some(0))]
    );
    let conditions = outcome.result.as_ref().unwrap().runs["leaderboard"]
        .conditions
        .clone()
        .unwrap();
    assert_eq!((conditions.attempts, conditions.throttled), (2, false));
    assert_eq!(app.buildkite.agent("e-warm").unwrap().paused, None);
    let report = app
        .discord
        .messages()
        .values()
        .find(|m| m.to_string().contains("warm"))
        .map(|m| m.to_string())
        .unwrap_or_default();
    assert!(
        report.contains("measured again after a cool-down"),
        "{report}"
    );
    // The foreign process only: a first throttled run is no incident.
    let ops = ops_after(&app, 1).await;
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert!(ops[0].contains("a-foreign"), "{ops:?}");
}

/// With every agent of the queue failing its pre-flight, the job ends as `infra` with the
/// sentence that blames the node; each agent is paused and told of once.
async fn when_every_gpu_fails_the_job_is_an_infrastructure_failure(kind: StoreKind) {
    let (app, gpus) = fleet_app(kind).await;
    for name in ["gpu0", "gpu1", "gpu2"] {
        add_gpu(&app, &gpus, name, &[("GPU_STANDIN_ECC", "1")]);
    }
    let job = run(&app, &passing("all-bad", "test")).await;
    let outcome = job.outcome.as_deref().unwrap();
    assert_eq!(outcome.verdict, Verdict::Infra, "{outcome:?}");
    assert!(
        outcome.error.as_deref().unwrap().contains("not your code"),
        "{outcome:?}"
    );
    assert_eq!(
        outcome.tries.len(),
        3,
        "the first try and the pipeline's two retries"
    );
    for name in ["gpu0", "gpu1", "gpu2"] {
        assert!(
            app.buildkite.agent(name).unwrap().paused.is_some(),
            "{name}"
        );
    }
    let text = user_text(&app);
    assert!(
        text.contains("Infrastructure failure — not your code"),
        "{text}"
    );
    assert!(text.contains("Tried on 3 GPUs"), "{text}");
    assert!(!text.contains("✅ success"), "{text}");
    let ops = ops_after(&app, 3).await;
    assert_eq!(ops.len(), 3, "one per agent: {ops:?}");
}

/// `agent.lost` for an agent of our queues reaches the operators once it has stayed away
/// past the grace (the sweep's look), once; its duplicates, and an agent of a queue we do not
/// serve, do not. `GET /fleet` shows it lost, then connected.
async fn a_lost_agent_is_told_once_it_stays_away(kind: StoreKind) {
    let (app, _gpus) = fleet_app(kind).await;
    app.buildkite.add_agent("h100-gpu3", "h100", &[]);
    app.buildkite
        .add_agent("other-gpu0", "someone-elses-queue", &[]);
    assert!(app.buildkite.agent_event("agent.lost", "h100-gpu3").await);
    assert!(app.buildkite.agent_event("agent.lost", "h100-gpu3").await);
    assert!(
        app.buildkite
            .agent_event("agent.disconnected", "h100-gpu3")
            .await
    );
    assert!(app.buildkite.agent_event("agent.lost", "other-gpu0").await);
    app.sweep().await;
    assert_eq!(
        ops_messages(&app),
        Vec::<String>::new(),
        "not yet: it may come back"
    );
    let row = agent_row(&fleet_view(&app).await, "h100-gpu3").clone();
    assert_eq!(row["connection_state"], "lost", "{row}");
    let ops = told_lost_once(&app, "h100-gpu3").await;
    assert!(!ops[0].contains("@everyone"));
    assert_eq!(app.metric("GpuIncidents").len(), 1);
    let fleet_now = fleet_view(&app).await;
    assert!(
        fleet_now["agents"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["name"] != "other-gpu0"),
        "{fleet_now}"
    );
    // Connected again (and listed by the agents API once its cache is refreshed), then lost
    // for good: a new incident.
    assert!(
        app.buildkite
            .agent_event("agent.connected", "h100-gpu3")
            .await
    );
    assert!(app.buildkite.agent_event("agent.lost", "h100-gpu3").await);
    app.clock.advance(Duration::from_secs(6 * 60));
    app.sweep().await;
    assert_eq!(
        ops_messages(&app).len(),
        2,
        "a new incident after it came back"
    );
}

/// Agent events may be lost or come out of order: before an offline agent is an incident the
/// sweep asks the agents list, and one listed connected (its `agent.connected` lost) is none.
/// When the list cannot be read, the events decide.
async fn the_agents_list_settles_offline_agents_and_events_decide_without_it(kind: StoreKind) {
    let (app, _gpus) = fleet_app(kind).await;
    app.buildkite.add_agent("h100-gpu3", "h100", &[]);
    assert!(
        app.buildkite
            .agent_event("agent.disconnected", "h100-gpu3")
            .await
    );
    // Back within seconds, but its agent.connected webhook never came.
    app.buildkite
        .set_agents(&[("h100-gpu3", "h100", "connected", false)]);
    app.clock.advance(Duration::from_secs(6 * 60));
    assert_eq!(app.sweep().await.incidents_told, 0);
    assert_eq!(ops_messages(&app), Vec::<String>::new());
    // Lost for good while the agents API fails (5xx): its events decide, once.
    assert!(app.buildkite.agent_event("agent.lost", "h100-gpu3").await);
    app.buildkite.fail_agents(Some(503));
    told_lost_once(&app, "h100-gpu3").await;
}

/// `setup-node.sh` restarts every agent of a node: each disconnects and connects again
/// within seconds. No incident, however long after the sweep looks.
async fn a_restart_of_every_agent_is_no_incident(kind: StoreKind) {
    let (app, _gpus) = fleet_app(kind).await;
    let names: Vec<String> = (0..8).map(|i| format!("node1-gpu{i}")).collect();
    for name in &names {
        app.buildkite.add_agent(name, "h100", &[]);
    }
    for name in &names {
        assert!(app.buildkite.agent_event("agent.disconnected", name).await);
    }
    app.clock.advance(Duration::from_secs(20));
    for name in &names {
        assert!(app.buildkite.agent_event("agent.connected", name).await);
    }
    app.clock.advance(Duration::from_secs(60 * 60));
    assert_eq!(app.sweep().await.incidents_told, 0);
    assert_eq!(ops_messages(&app), Vec::<String>::new());
    assert!(app.metric("GpuIncidents").is_empty());
}

/// The incident of a job's infrastructure failure is noted on the agent's record before the
/// user's report goes out; when its post to the operators fails (as when the function is
/// killed after the report), the sweep tells it later, once.
async fn an_incident_a_function_did_not_tell_is_told_by_the_sweep(kind: StoreKind) {
    let (app, gpus) = fleet_app(kind).await;
    add_gpu(&app, &gpus, "node1-gpu0", &[("GPU_STANDIN_ECC", "2")]);
    add_gpu(&app, &gpus, "node1-gpu1", &[]);
    app.discord.outage(OPS_ID, Some(Outage::Answers(503)));
    let job = run(&app, &passing("missed", "test")).await;
    assert_eq!(job.outcome.as_deref().unwrap().verdict, Verdict::Passed);
    // The function posts after the user's report: the outage stays until its try was refused.
    let refused = ops_refused_after(&app, 1).await;
    assert_eq!(refused, 1, "the function tried the operators' channel once");
    assert!(
        ops_messages(&app).is_empty(),
        "the operators' channel is down"
    );
    // Counted when it was decided: the alarm holds however the post goes.
    assert_eq!(app.metric("GpuIncidents").len(), 1);
    app.discord.outage(OPS_ID, None);
    app.sweep().await;
    assert!(
        ops_messages(&app).is_empty(),
        "the function that noted it may still tell it"
    );
    // Past any function's run: the sweep takes it.
    app.clock.advance(Duration::from_secs(17 * 60));
    assert_eq!(app.sweep().await.incidents_told, 1);
    app.sweep().await;
    let ops = ops_messages(&app);
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert!(
        ops[0].contains("node1-gpu0")
            && ops[0].contains("2 uncorrected ECC")
            && ops[0].contains("missed"),
        "{ops:?}"
    );
    assert_eq!(app.metric("GpuIncidents").len(), 1, "counted once");
}

/// A job with no Discord report (an API submission of a callback-only deployment) is noted on
/// its agents' records all the same: the faulty agent's incident is told, its counts kept.
async fn a_job_without_a_report_is_noted_on_the_fleet(kind: StoreKind) {
    let (app, gpus) = fleet_app(kind).await;
    add_gpu(&app, &gpus, "node1-gpu0", &[("GPU_STANDIN_ECC", "4")]);
    add_gpu(&app, &gpus, "node1-gpu1", &[]);
    let mut body = passing("quiet", "test");
    body.as_object_mut().unwrap().remove("discord");
    let job = run(&app, &body).await;
    assert!(job.discord.is_none(), "no report owed: {job:?}");
    assert_eq!(job.outcome.as_deref().unwrap().verdict, Verdict::Passed);
    let ops = ops_after(&app, 1).await;
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert!(
        ops[0].contains("node1-gpu0") && ops[0].contains("4 uncorrected ECC"),
        "{ops:?}"
    );
    let fleet = fleet_view(&app).await;
    let bad = agent_row(&fleet, "node1-gpu0");
    assert_eq!(
        (bad["jobs_24h"].as_u64(), bad["infra_failures_24h"].as_u64()),
        (Some(1), Some(1)),
        "{fleet}"
    );
    assert_eq!(
        agent_row(&fleet, "node1-gpu1")["jobs_24h"].as_u64(),
        Some(1)
    );
}

/// A kernel that draws the board's full power is held at its power limit on every reading
/// (SwPowerCap): its real speed. The leaderboard run is ranked on its first GPU, the cap in
/// its recorded conditions and the report, with no retry, pause or incident.
async fn a_power_capped_leaderboard_run_is_ranked(kind: StoreKind) {
    let (app, gpus) = fleet_app(kind).await;
    add_gpu(
        &app,
        &gpus,
        "node1-gpu0",
        &[("GPU_STANDIN_POWER_CAP_FROM", "0")],
    );
    let job = run(&app, &passing("capped", "leaderboard")).await;
    let outcome = job.outcome.as_deref().unwrap();
    assert_eq!(outcome.verdict, Verdict::Passed, "{outcome:?}");
    assert_eq!(
        tries(&app, job.build.as_ref().unwrap().number),
        [("node1-gpu0".into(), Some(0))]
    );
    let c = outcome.result.as_ref().unwrap().runs["leaderboard"]
        .conditions
        .clone()
        .unwrap();
    assert_eq!((c.throttled, c.power_capped, c.attempts), (false, true, 1));
    assert!(
        c.after[0].clock_events.contains(&"SwPowerCap".to_owned()),
        "{c:?}"
    );
    let text = user_text(&app);
    assert!(text.contains("✅ success"), "{text}");
    assert!(
        text.contains("no slowdown, held at its power limit (its real speed)"),
        "{text}"
    );
    assert_eq!(app.buildkite.agent("node1-gpu0").unwrap().paused, None);
    assert!(ops_after(&app, 1).await.is_empty());
}

/// A kernel that heats its GPU: every timed reading while it runs shows a thermal slowdown
/// (the GPU cools between jobs). The runner exits 76: no pause, one more try (the pipeline's
/// limit; here on the queue's only agent); throttled again it is the submission's outcome:
/// `throttled`, no ranked time, a report that says why with the readings, never `infra`. A
/// first and a second submission like it tell the operators nothing; the third within a day
/// on the same agent is one incident.
async fn a_kernel_s_own_heat_is_its_outcome_and_pauses_nothing(kind: StoreKind) {
    let (app, gpus) = fleet_app(kind).await;
    let (_state, reads) = read_counter();
    // A leaderboard job reads the GPU 7 times: the pre-flight's, the benchmark's two, the
    // leaderboard's two and its second try's two; all but the pre-flight's are hot.
    add_gpu(
        &app,
        &gpus,
        "node1-gpu0",
        &[
            ("GPU_STANDIN_EVENTS", "0x20"),
            ("GPU_STANDIN_HOT_TEMP", "89"),
            ("GPU_STANDIN_EVENTS_FROM", "1"),
            ("GPU_STANDIN_EVENTS_EVERY", "7"),
            ("GPU_STANDIN_STATE", &reads),
            ("KERNELBOT_COOLDOWN_SECS", "0"),
        ],
    );
    for (i, run_id) in ["heat-1", "heat-2", "heat-3"].iter().enumerate() {
        let job = run(&app, &passing(run_id, "leaderboard")).await;
        let outcome = job.outcome.as_deref().unwrap();
        assert_eq!(outcome.verdict, Verdict::Throttled, "{run_id}: {outcome:?}");
        assert_eq!(
            tries(&app, job.build.as_ref().unwrap().number),
            [
                ("node1-gpu0".into(), Some(76)),
                ("node1-gpu0".into(), Some(76))
            ],
            "{run_id}: retried once, by the pipeline's rule for 76"
        );
        assert!(
            outcome
                .tries
                .iter()
                .all(|t| t.throttled && !t.infra && !t.paused)
        );
        let result = outcome.result.as_ref().unwrap();
        assert!(!result.success && result.infra.is_none());
        assert_eq!(result.throttled.as_ref().unwrap().retry, 1);
        assert!(
            result.runs["leaderboard"].run.as_ref().unwrap().passed,
            "its results stand"
        );
        assert_eq!(app.buildkite.agent("node1-gpu0").unwrap().paused, None);
        let ops = ops_after(&app, usize::from(i == 2)).await;
        assert_eq!(ops.len(), usize::from(i == 2), "{run_id}: {ops:?}");
    }
    let text = user_text(&app);
    assert!(
        text.contains("⚠️ not ranked") && text.contains("Not ranked"),
        "{text}"
    );
    assert!(
        text.contains("89 °C") && text.contains("slowed down (SwThermalSlowdown)"),
        "the readings: {text}"
    );
    assert!(
        !text.contains("not your code") && !text.contains("❌ Failed"),
        "{text}"
    );
    let ops = ops_messages(&app);
    assert!(
        ops[0].contains("node1-gpu0") && ops[0].contains("3 different submissions"),
        "{ops:?}"
    );
    let row = agent_row(&fleet_view(&app).await, "node1-gpu0").clone();
    assert_eq!(
        (
            row["throttled_24h"].as_u64(),
            row["infra_failures_24h"].as_u64(),
            row["paused"].as_bool()
        ),
        (Some(6), Some(0), Some(false)),
        "{row}"
    );
}

/// The GPU the last job heated is still slowed down when the next user's job starts: the
/// pre-flight reads it again until it has cooled, and the job runs there and is ranked.
async fn a_gpu_that_cools_within_the_cool_down_runs_the_next_job(kind: StoreKind) {
    let (app, gpus) = fleet_app(kind).await;
    let (_state, reads) = read_counter();
    add_gpu(
        &app,
        &gpus,
        "node1-gpu0",
        &[
            ("GPU_STANDIN_EVENTS", "0x20"),
            ("GPU_STANDIN_EVENTS_READS", "2"),
            ("GPU_STANDIN_STATE", &reads),
            ("KERNELBOT_COOLDOWN_SECS", "10"),
        ],
    );
    let job = run(&app, &passing("cooled", "leaderboard")).await;
    let outcome = job.outcome.as_deref().unwrap();
    assert_eq!(outcome.verdict, Verdict::Passed, "{outcome:?}");
    assert_eq!(
        tries(&app, job.build.as_ref().unwrap().number),
        [("node1-gpu0".into(), Some(0))]
    );
    let result = outcome.result.as_ref().unwrap();
    let preflight = result.preflight.as_ref().unwrap();
    assert_eq!(preflight.status, "passed");
    assert!(preflight.detail.contains("to cool down"), "{preflight:?}");
    assert!(
        !result.runs["leaderboard"]
            .conditions
            .as_ref()
            .unwrap()
            .throttled
    );
    assert!(ops_after(&app, 1).await.is_empty());
}

/// An agent on a driver older than the `clocks_event_reasons` name: its GPU is read by the
/// older name, the job runs and is ranked, nothing pauses. Agents whose image has no tool to
/// read the GPUs they were given: an infrastructure failure on every try, never a time.
async fn older_drivers_run_and_missing_tools_never_rank(kind: StoreKind) {
    let (app, gpus) = fleet_app(kind).await;
    add_gpu(
        &app,
        &gpus,
        "old-driver",
        &[("GPU_STANDIN_DRIVER", "525.147.05")],
    );
    let job = run(&app, &passing("old", "leaderboard")).await;
    let outcome = job.outcome.as_deref().unwrap();
    assert_eq!(outcome.verdict, Verdict::Passed, "{outcome:?}");
    let preflight = outcome.result.as_ref().unwrap().preflight.clone().unwrap();
    assert_eq!(preflight.readings[0].clock_events, ["GpuIdle"]);
    assert!(preflight.detail.contains("older name"), "{preflight:?}");
    assert_eq!(app.buildkite.agent("old-driver").unwrap().paused, None);

    app.buildkite.set_agents(&[]);
    for name in ["bare0", "bare1", "bare2"] {
        let env = [
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
            ("CUDA_VISIBLE_DEVICES", "0"),
        ];
        app.buildkite.add_agent(name, "h100", &env);
    }
    let job = run(&app, &passing("bare", "leaderboard")).await;
    let outcome = job.outcome.as_deref().unwrap();
    assert_eq!(outcome.verdict, Verdict::Infra, "{outcome:?}");
    assert!(
        outcome.result.as_ref().unwrap().runs.is_empty(),
        "nothing ran"
    );
    let error = outcome.error.as_deref().unwrap();
    assert!(
        error.contains("nvidia-smi") && error.contains("not your code"),
        "{error}"
    );
    assert_eq!(outcome.tries.len(), 3);
}

/// `GET /fleet` takes the submit token.
async fn the_fleet_needs_the_token(kind: StoreKind) {
    let (app, _gpus) = fleet_app(kind).await;
    let resp = app
        .client
        .get(format!("{}/fleet", app.submit_url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let body: Value = resp.json().await.unwrap_or(json!(null));
    assert!(body.get("agents").is_none(), "{body}");
}

/// An agent never seen again goes away by itself: 30 days after its record was last written
/// it is gone from the store (DynamoDB's TTL, or the sweep on the embedded store), the sweep
/// takes it off the fleet's list, and `GET /fleet` no longer shows it. An agent still
/// reporting stays.
async fn an_agent_never_seen_again_leaves_the_fleet(kind: StoreKind) {
    let (app, _gpus) = fleet_app(kind).await;
    let names = ["node1-gpu0", "node1-gpu1"];
    for name in names {
        app.buildkite.add_agent(name, "h100", &[]);
        assert!(app.buildkite.agent_event("agent.disconnected", name).await);
    }
    app.clock.advance(Duration::from_secs(20));
    for name in names {
        assert!(app.buildkite.agent_event("agent.connected", name).await);
    }
    let listed = |entry: Option<CacheEntry>| -> Vec<String> {
        let value = entry.and_then(|e| e.value).unwrap_or_default();
        serde_json::from_str(&value).unwrap_or_default()
    };
    assert_eq!(listed(app.store.cached("~fleet").await.unwrap()), names);
    // gpu0 is taken away; gpu1 goes on reporting.
    app.buildkite
        .set_agents(&[("node1-gpu1", "h100", "connected", false)]);
    let day = Duration::from_secs(24 * 60 * 60);
    app.clock.advance(20 * day);
    assert!(
        app.buildkite
            .agent_event("agent.disconnected", "node1-gpu1")
            .await
    );
    app.clock.advance(Duration::from_secs(20));
    assert!(
        app.buildkite
            .agent_event("agent.connected", "node1-gpu1")
            .await
    );
    app.clock.advance(11 * day);
    app.sweep().await;
    let now = app.clock.now();
    let gone = app.store.cached("~agent/node1-gpu0").await.unwrap();
    assert!(
        gone.as_ref()
            .is_none_or(|e| e.expires_at.is_some_and(|at| at <= now)),
        "forgotten, or left to the table's TTL: {gone:?}"
    );
    assert_eq!(
        listed(app.store.cached("~fleet").await.unwrap()),
        ["node1-gpu1"]
    );
    let fleet = fleet_view(&app).await;
    let shown: Vec<&str> = fleet["agents"]
        .as_array()
        .map(|rows| rows.iter().filter_map(|r| r["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(shown, ["node1-gpu1"], "{fleet}");
}

on_both_stores!(
    an_agent_never_seen_again_leaves_the_fleet,
    an_ecc_fault_is_retried_on_a_healthy_gpu_and_the_agent_paused,
    foreign_processes_and_slowdowns_end_as_the_contract_says,
    when_every_gpu_fails_the_job_is_an_infrastructure_failure,
    a_lost_agent_is_told_once_it_stays_away,
    a_restart_of_every_agent_is_no_incident,
    the_agents_list_settles_offline_agents_and_events_decide_without_it,
    an_incident_a_function_did_not_tell_is_told_by_the_sweep,
    a_job_without_a_report_is_noted_on_the_fleet,
    a_power_capped_leaderboard_run_is_ranked,
    a_kernel_s_own_heat_is_its_outcome_and_pauses_nothing,
    a_gpu_that_cools_within_the_cool_down_runs_the_next_job,
    older_drivers_run_and_missing_tools_never_rank,
    the_fleet_needs_the_token,
);
