//! A seeded chaos run through the whole local stack: many jobs submitted concurrently while
//! a share of every outside call meets an everyday fault (Discord 5xx, 429, slow answers and
//! deleted messages; webhooks dropped, duplicated and reordered; Buildkite 5xx and 429 on
//! create), with sweep passes in between. What must hold: no job lost, every final report
//! shown exactly once, as its message's last state, with the right verdict, and no run with
//! two builds.
//!
//! Size and seed: `KERNELBOT_CHAOS_JOBS`, `KERNELBOT_CHAOS_CONCURRENCY`, `KERNELBOT_CHAOS_SEED`
//! (the README has the full-size command and its last result).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{API_TOKEN, SECRET, StoreKind, TestApp};
use kernelbot_dispatch::devstack::buildkite::{StepOutcome, StepRunner, sample_result};
use kernelbot_dispatch::flow::present::verdict_sentence;
use kernelbot_dispatch::flow::sweep;
use kernelbot_dispatch::jobs::{Channel, DeliveryStatus, JobState};
use kernelbot_dispatch::result::Verdict;
use kernelbot_dispatch::retry::Deadline;
use serde_json::json;

const FAULT_RATE: f64 = 0.10;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Every fifth run's kernel fails a test; the rest pass.
fn fails(run: &str) -> bool {
    run.rsplit('-')
        .next()
        .and_then(|i| i.parse::<u64>().ok())
        .is_some_and(|i| i % 5 == 0)
}

async fn chaos(kind: StoreKind, default_jobs: u64) {
    let jobs = setting("KERNELBOT_CHAOS_JOBS", default_jobs);
    let concurrency = setting("KERNELBOT_CHAOS_CONCURRENCY", 25) as usize;
    let seed = setting("KERNELBOT_CHAOS_SEED", 1);
    let app = TestApp::spawn_with(
        kind,
        &[
            ("SWEEP_MIN_AGE_SECS", "0"),
            ("QUEUE_TIMEOUT_SECS", "31536000"),
            ("JOB_MAX_AGE_SECS", "31536000"),
            ("SWEEP_MAX_CALLS", "200"),
        ],
    )
    .await;
    let step: StepRunner = Arc::new(|env| {
        let run = env.get("KERNELBOT_RUN_ID").cloned().unwrap_or_default();
        StepOutcome::passed(sample_result(fails(&run)))
    });
    app.buildkite.autorun(&app.webhook_url, SECRET, step);
    app.buildkite.chaos(seed, FAULT_RATE);
    app.discord.chaos(seed + 1, FAULT_RATE);
    let started = Instant::now();

    // Sweep passes run beside the submissions, as the schedule would.
    let sweeper = app.sweeper.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sweeping = {
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = sweep::sweep(&sweeper, Deadline::after(Duration::from_secs(30))).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let runs: Vec<String> = (0..jobs).map(|i| format!("chaos-{seed}-{i}")).collect();
    let gate = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut submits = tokio::task::JoinSet::new();
    for run in runs.clone() {
        let (client, url, gate) = (app.client.clone(), app.submit_url.clone(), gate.clone());
        submits.spawn(async move {
            let _slot = gate.acquire_owned().await;
            let body = json!({"run_id": run, "gpu": "H100_BK", "title": run,
                "config": {"lang": "py", "mode": "test", "main": "eval.py", "sources": {"eval.py": "print(1)"}},
                "discord": {"webhook_url": crate::support::HOOK_URL}});
            let resp = client
                .post(format!("{url}/submissions"))
                .bearer_auth(API_TOKEN)
                .json(&body)
                .send()
                .await
                .expect("submit answers");
            assert_eq!(
                resp.status().as_u16(),
                202,
                "{run}: {:?}",
                resp.text().await
            );
        });
    }
    while let Some(done) = submits.join_next().await {
        done.expect("submission task");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sweeping.await.expect("sweeper");

    // Let the agents and webhooks settle, then sweep until nothing is left, moving time
    // on (only while all is quiet) so deferred creates fall due.
    let mut passes = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(800)).await;
        app.sweep().await;
        passes += 1;
        let mut open = 0;
        for run in &runs {
            let job = app.job(run).await;
            if !job.state.is_terminal() || job.owes(Channel::Discord) {
                open += 1;
            }
        }
        if open == 0 {
            break;
        }
        assert!(passes < 60, "{open} jobs still open after {passes} passes");
        // Quiet means no sender holds a message either: a late webhook's delivery may still be
        // in flight, and moving time past its lease would hand the message to a second sender
        // (which no real clock does in the milliseconds a send takes).
        let quiet_by = Instant::now() + Duration::from_secs(10);
        while Instant::now() < quiet_by {
            let mut held = false;
            for run in &runs {
                held |= app
                    .job(run)
                    .await
                    .discord
                    .is_some_and(|o| o.delivery.lease.is_some());
            }
            if !held {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        app.advance_clock(Duration::from_secs(61));
    }

    // No run with two builds; every job finished with the right verdict; its one message
    // ends on the final report.
    let mut builds: BTreeMap<String, usize> = BTreeMap::new();
    for b in app.buildkite.builds() {
        *builds.entry(b.meta_data["run_id"].clone()).or_default() += 1;
    }
    assert!(builds.values().all(|n| *n == 1), "a run got two builds");
    let messages = app.discord.messages();
    for run in &runs {
        let job = app.job(run).await;
        assert_eq!(job.state, JobState::Finished, "{run}: {:?}", job.failure);
        let want = if fails(run) {
            Verdict::Failed
        } else {
            Verdict::Passed
        };
        let verdict = job.outcome.as_ref().map(|o| o.verdict);
        assert_eq!(verdict, Some(want), "{run}");
        let outbox = job.discord.expect("a Discord target");
        assert_eq!(outbox.delivery.status, DeliveryStatus::Delivered, "{run}");
        let id = outbox.message_id.expect("a message");
        let text = messages[&id]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            text.contains(&verdict_sentence(want, "h100")),
            "{run}: {text}"
        );
        let shown = messages
            .values()
            .filter(|m| {
                m["content"]
                    .as_str()
                    .is_some_and(|c| c.starts_with(&format!("**{run}**")))
            })
            .count();
        assert_eq!(shown, 1, "{run}: one message per job");
    }
    // The faults did happen.
    let refused = app
        .discord_calls()
        .iter()
        .filter(|c| c.status >= 400)
        .count();
    let creates = app
        .buildkite
        .api_calls()
        .iter()
        .filter(|c| c.starts_with("POST"))
        .count();
    assert!(refused > 0 && creates > runs.len(), "no fault was injected");
    println!(
        "chaos: {jobs} jobs at concurrency {concurrency}, seed {seed}, {:.0}% faults: \
         0 lost, 0 wrong, {} builds for {creates} create calls, {} Discord calls ({refused} \
         refused), {passes} closing sweep passes, {:.1} s",
        FAULT_RATE * 100.0,
        app.buildkite.builds().len(),
        app.discord_calls().len(),
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_run_on_the_embedded_store_loses_nothing() {
    chaos(StoreKind::Sqlite, 150).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_run_on_dynamodb_loses_nothing() {
    chaos(StoreKind::Dynamo, 60).await;
}
