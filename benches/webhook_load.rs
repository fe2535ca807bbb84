//! The webhook path over loopback: the real routers and the in-tree Buildkite and Discord
//! stand-ins (answering at once) on the embedded store, driven by a closed-loop load
//! generator at concurrency 64. Every figure is set against `GET /healthz` of the same
//! process in the same run. Prints a Markdown table; `cargo bench --bench webhook_load`.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use kernelbot_dispatch::buildkite::sign;
use kernelbot_dispatch::devstack::buildkite::{sample_result, unix_now};
use kernelbot_dispatch::devstack::stack::{API_TOKEN, SECRET, Stack, StoreKind, submission};
use support::load::{Run, client, drive, percentiles};
use support::own_work::{OwnTimes, OwnWork};

const CONCURRENCY: usize = 64;
/// Jobs taken through the whole life; each duplicate scenario replays every one of them.
const JOBS: usize = 4000;
const HEALTHZ_REQUESTS: usize = 30_000;
/// Each duplicate is sent this many times (a longer run, steadier figures).
const REPLAYS: usize = 4;

/// A signed webhook request, as Buildkite sends it.
fn webhook(client: &reqwest::Client, url: &str, event: &str, body: Vec<u8>) -> reqwest::Request {
    let ts = unix_now().to_string();
    let signature = format!("timestamp={ts},signature={}", sign(SECRET, &ts, &body));
    client
        .post(url)
        .header("content-type", "application/json")
        .header("x-buildkite-event", event)
        .header("x-buildkite-signature", signature)
        .body(body)
        .build()
        .expect("request")
}

fn ok_healthz(status: u16, body: &[u8]) -> bool {
    status == 200 && body == b"ok"
}

fn advanced_to(state: &'static str) -> impl Fn(u16, &[u8]) -> bool {
    move |status, body| {
        status == 200
            && serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| v["state"] == state)
    }
}

fn ok_running(status: u16, body: &[u8]) -> bool {
    advanced_to("running")(status, body)
}

fn ok_finished(status: u16, body: &[u8]) -> bool {
    advanced_to("finished")(status, body)
}

fn ok_ignored(status: u16, body: &[u8]) -> bool {
    status == 200
        && serde_json::from_slice::<serde_json::Value>(body)
            .is_ok_and(|v| v["ignored"] == "duplicate or out of order")
}

fn ok_created(status: u16, _body: &[u8]) -> bool {
    status == 202
}

struct Row {
    name: &'static str,
    run: Run,
    own: OwnTimes,
}

#[tokio::main]
async fn main() {
    let own = OwnWork::install();
    let app = Stack::spawn(StoreKind::Sqlite)
        .await
        .expect("the local stack");
    let client = client(CONCURRENCY);
    let healthz = format!(
        "{}/healthz",
        app.webhook_url.trim_end_matches("/webhooks/buildkite")
    );
    let healthz_run = |n: usize| {
        let reqs = (0..n)
            .map(|_| client.get(&healthz).build().expect("request"))
            .collect();
        drive(&client, reqs, CONCURRENCY, ok_healthz)
    };
    let mut rows: Vec<Row> = Vec::new();
    let mut measure = |name: &'static str, run: Run| {
        assert_eq!(run.wrong, 0, "{name}: {} wrong answers", run.wrong);
        rows.push(Row {
            name,
            run,
            own: own.take(),
        });
    };

    // Warm up: connections, the store's pages, the allocator.
    measure("warm-up", healthz_run(5_000).await);

    // Jobs to follow, made through the real submit path (not measured).
    let submits = (0..JOBS)
        .map(|i| {
            let body = serde_json::to_vec(&submission(&format!("bench-{i}"))).expect("json");
            client
                .post(format!("{}/submissions", app.submit_url))
                .bearer_auth(API_TOKEN)
                .header("content-type", "application/json")
                .body(body)
                .build()
                .expect("request")
        })
        .collect();
    measure(
        "submit (setup)",
        drive(&client, submits, CONCURRENCY, ok_created).await,
    );
    let numbers: Vec<u64> = app.buildkite.builds().iter().map(|b| b.number).collect();
    assert_eq!(numbers.len(), JOBS, "one build per job");

    measure(
        "GET /healthz (baseline, before)",
        healthz_run(HEALTHZ_REQUESTS).await,
    );

    let events = |event: &str, replays: usize| -> Vec<reqwest::Request> {
        let bodies: HashMap<u64, Vec<u8>> = numbers
            .iter()
            .map(|&n| (n, app.buildkite.webhook_body(event, n)))
            .collect();
        (0..replays)
            .flat_map(|_| numbers.iter())
            .map(|n| webhook(&client, &app.webhook_url, event, bodies[n].clone()))
            .collect()
    };

    for &n in &numbers {
        app.buildkite.start_eval(n);
    }
    // A created build is already `scheduled`; the evaluation step starting moves it on.
    let running = events("job.started", 1);
    measure(
        "`job.started` of the evaluation (advance to running, Discord edit)",
        drive(&client, running, CONCURRENCY, ok_running).await,
    );
    let early = events("build.running", REPLAYS);
    measure(
        "out-of-order `build.running` after running",
        drive(&client, early, CONCURRENCY, ok_ignored).await,
    );

    for &n in &numbers {
        app.buildkite
            .upload(n, "result.json", sample_result(false), "finished", false);
        app.buildkite.set_state(n, "passed");
    }
    let finished = events("build.finished", 1);
    measure(
        "`build.finished`, full path",
        drive(&client, finished, CONCURRENCY, ok_finished).await,
    );

    let duplicates = events("build.finished", REPLAYS);
    measure(
        "duplicate `build.finished`",
        drive(&client, duplicates, CONCURRENCY, ok_ignored).await,
    );
    let late = events("build.running", REPLAYS);
    measure(
        "out-of-order `build.running` after finished",
        drive(&client, late, CONCURRENCY, ok_ignored).await,
    );

    measure(
        "GET /healthz (baseline, after)",
        healthz_run(HEALTHZ_REQUESTS).await,
    );

    report(&rows);
    tokio::time::sleep(Duration::from_millis(10)).await;
}

fn report(rows: &[Row]) {
    let baseline = rows
        .iter()
        .filter(|r| r.name.starts_with("GET /healthz"))
        .map(|r| r.run.rate())
        .sum::<f64>()
        / 2.0;
    println!(
        "\nWebhook path over loopback, concurrency {CONCURRENCY}, embedded store (SQLite, WAL, synchronous = NORMAL: a commit survives a process crash, is synced to disk at checkpoints)"
    );
    println!(
        "baseline: GET /healthz of the same process, mean of the runs before and after: {baseline:.0} req/s\n"
    );
    println!(
        "| scenario | requests | rate (req/s) | × healthz | own work, CPU p50 / p99 / p99.9 (ms) | own work, wall p50 / p99 / p99.9 (ms) | round trip p50 / p99 / p99.9 (ms) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in rows.iter().filter(|r| r.name != "warm-up") {
        println!(
            "| {} | {} | {:.0} | {:.2} | {} | {} | {} |",
            r.name,
            r.run.requests,
            r.run.rate(),
            r.run.rate() / baseline,
            percentiles(&r.own.cpu),
            percentiles(&r.own.wall),
            percentiles(&r.run.latency),
        );
    }
}
