//! The CPU work of the functions' hot paths, each next to a baseline measured in the same
//! run, so results read as ratios: what verification adds to the HMAC it cannot avoid, what
//! a rotation (two secrets) costs, and what reading and reporting a large result costs next
//! to plain JSON serialisation of the same data.
//!
//! `cargo bench --bench hot_paths`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use kernelbot_dispatch::buildkite::{WebhookAuth, WebhookEvent, sign};
use kernelbot_dispatch::flow::present::render;
use kernelbot_dispatch::jobs::{BuildRef, Job, JobState, Transition};
use kernelbot_dispatch::result::{FullResult, Outcome};
use secrecy::SecretString;
use serde_json::json;

/// A build.finished body the size Buildkite sends (a few KiB of build fields).
fn webhook_body() -> Vec<u8> {
    let build = json!({
        "id": "0190f2b1-7a55-4e0c-9c7e-0d3d4f1f5a11", "graphql_id": "QnVpbGQtLS0wMTkw", "number": 4711,
        "url": "https://api.buildkite.com/v2/organizations/gpu-mode/pipelines/kernelbot/builds/4711",
        "web_url": "https://buildkite.com/gpu-mode/kernelbot/builds/4711", "state": "passed", "blocked": false,
        "message": "Kernel eval: vectoradd", "commit": "HEAD", "branch": "main", "source": "api",
        "creator": {"id": "u", "name": "kernelbot", "email": "bot@example.com", "avatar_url": "https://example.com/a.png"},
        "created_at": "2026-11-21T10:00:00.000Z", "scheduled_at": "2026-11-21T10:00:00.000Z",
        "started_at": "2026-11-21T10:00:05.000Z", "finished_at": "2026-11-21T10:01:05.000Z",
        "meta_data": {"run_id": "sub-42-H100_BK", "queue": "h100", "buildkite:git:commit": "x".repeat(1500)},
        "pull_request": null, "rebuilt_from": null
    });
    serde_json::to_vec(
        &json!({"event": "build.finished", "build": build, "pipeline": {"slug": "kernelbot"},
        "sender": {"id": "u", "name": "Buildkite"}}),
    )
    .unwrap()
}

/// A leaderboard result.json with logs and 50 benchmark entries.
fn result_json() -> Vec<u8> {
    let mut values = serde_json::Map::new();
    values.insert("check".into(), json!("pass"));
    values.insert("benchmark-count".into(), json!("50"));
    for i in 0..50 {
        values.insert(
            format!("benchmark.{i}.spec"),
            json!(format!("size: {}; seed: {i}", 1024 << (i % 10))),
        );
        values.insert(format!("benchmark.{i}.mean"), json!("123456.7"));
        values.insert(format!("benchmark.{i}.err"), json!("12.5"));
    }
    let run = json!({"success": true, "passed": true, "command": "python eval.py benchmark /tmp/x", "exit_code": 0,
        "duration": 12.5, "stdout": "benchmark output line\n".repeat(700), "stderr": "", "result": values});
    let eval = json!({"start": "2026-11-21T10:00:01", "end": "2026-11-21T10:00:59", "compilation": null, "run": run, "profile": null});
    serde_json::to_vec(&json!({"success": true, "error": "",
        "system": {"gpu": "NVIDIA H100 80GB HBM3", "device_count": 1, "cpu": "AMD EPYC 9654", "runtime": "CUDA",
                   "platform": "Linux", "torch": "2.7.1", "hostname": "node"},
        "runs": {"test": eval.clone(), "benchmark": eval.clone(), "leaderboard": eval}}))
    .unwrap()
}

fn webhook(c: &mut Criterion) {
    let body = webhook_body();
    let ts = "1795255200";
    let header = format!(
        "timestamp={ts},signature={}",
        sign("current-secret", ts, &body)
    );
    let one = WebhookAuth::new(vec![SecretString::from("current-secret")], false);
    let rotating = WebhookAuth::new(
        vec![
            SecretString::from("old-secret"),
            SecretString::from("current-secret"),
        ],
        false,
    );
    let now = 1_795_255_210;
    let mut g = c.benchmark_group("webhook");
    g.bench_function("baseline: HMAC-SHA256 of the body", |b| {
        b.iter(|| sign("current-secret", ts, black_box(&body)))
    });
    g.bench_function("verify, one secret", |b| {
        b.iter(|| one.verify(Some(&header), None, black_box(&body), now))
    });
    g.bench_function("verify, rotation (second of two)", |b| {
        b.iter(|| rotating.verify(Some(&header), None, black_box(&body), now))
    });
    g.bench_function("verify and parse the event", |b| {
        b.iter(|| {
            one.verify(Some(&header), None, black_box(&body), now)
                .unwrap();
            serde_json::from_slice::<WebhookEvent>(&body).unwrap()
        })
    });
    g.finish();
}

fn report(c: &mut Criterion) {
    let bytes = result_json();
    let parsed = FullResult::parse(&bytes).unwrap();
    let mut job = Job::new(
        "sub-42-H100_BK".parse().unwrap(),
        "H100_BK".into(),
        "h100".into(),
        Some("vectoradd".into()),
        None,
        0,
    );
    let build = BuildRef {
        id: "b".into(),
        number: 4711,
        web_url: "https://buildkite.com/gpu-mode/kernelbot/builds/4711".into(),
    };
    job = job
        .apply(
            &Transition::to(JobState::Finished, 1)
                .with_build(build)
                .with_outcome(Outcome::judge("passed", Some(parsed.clone()), None)),
        )
        .unwrap();
    let mut g = c.benchmark_group("result");
    g.bench_function("baseline: serialise the result to JSON", |b| {
        b.iter(|| serde_json::to_vec(black_box(&parsed)).unwrap())
    });
    g.bench_function("parse result.json (caps logs)", |b| {
        b.iter(|| FullResult::parse(black_box(&bytes)).unwrap())
    });
    g.bench_function("render and fit the final report", |b| {
        b.iter(|| render(black_box(&job)))
    });
    g.finish();
}

criterion_group!(benches, webhook, report);
criterion_main!(benches);
