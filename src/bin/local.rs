//! Runs the whole system on this machine with no accounts: the submit and webhook functions
//! on the embedded store, with local stand-ins for Buildkite (which also plays the GPU agent)
//! and Discord. Submits one job, waits for it to finish and prints its Discord report.
//!
//! `--serve` keeps everything running afterwards so you can submit more with curl.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kernelbot_dispatch::config::{Config, Role};
use kernelbot_dispatch::devstack::buildkite::{BuildkiteStandin, StepRunner, sample_result};
use kernelbot_dispatch::devstack::discord::{DiscordStandin, render_for_terminal};
use kernelbot_dispatch::dispatch::Dispatcher;
use kernelbot_dispatch::{http, jobs, telemetry};
use serde_json::{Value, json};

type Error = Box<dyn std::error::Error + Send + Sync>;

const API_TOKEN: &str = "local-submit-token";
const WEBHOOK_SECRET: &str = "local-webhook-secret";

fn sample_submission() -> Value {
    json!({
        "gpu": "H100_BK",
        "title": "vectoradd (local demo)",
        "discord": {"webhook_url": "https://discord.com/api/webhooks/1000000000000000001/local-demo-token"},
        "config": {
            "lang": "py", "mode": "test", "main": "eval.py",
            "sources": {"eval.py": "# evaluation harness\n", "submission.py": "def custom_kernel(data):\n    a, b = data\n    return a + b\n"},
            "tests": [{"size": 1024}, {"size": 4096}, {"size": 16384}],
            "benchmarks": [], "test_timeout": 180, "benchmark_timeout": 180, "ranked_timeout": 180
        }
    })
}

async fn start_function(
    role: Role,
    vars: &BTreeMap<&str, String>,
    router: fn(Arc<Dispatcher>) -> axum::Router,
) -> Result<String, Error> {
    let config = Arc::new(Config::from_lookup(role, &|k| {
        vars.get(k).cloned().or_else(|| std::env::var(k).ok())
    })?);
    let store = jobs::store::open(&config.store).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let app = router(Arc::new(Dispatcher::new(config, store)?));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(url)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let serve = std::env::args().any(|a| a == "--serve");

    let buildkite = BuildkiteStandin::start("local-bk-token", "local-org", "kernelbot").await?;
    let discord = DiscordStandin::start().await?;
    let vars: BTreeMap<&str, String> = BTreeMap::from([
        ("BUILDKITE_API_URL", buildkite.api_url.clone()),
        ("BUILDKITE_API_TOKEN", "local-bk-token".into()),
        ("BUILDKITE_ORG", buildkite.org.clone()),
        ("BUILDKITE_PIPELINE", buildkite.pipeline.clone()),
        ("BUILDKITE_WEBHOOK_SECRET", WEBHOOK_SECRET.into()),
        ("DISCORD_API_URL", discord.api_url.clone()),
        ("SUBMIT_API_TOKEN", API_TOKEN.into()),
    ]);
    let submit_url = start_function(Role::Submit, &vars, http::submit::router).await?;
    let webhook_url = start_function(Role::Webhook, &vars, http::webhook::router).await?;
    let step: StepRunner = Arc::new(|_env| Some(sample_result(false)));
    buildkite.autorun(
        &format!("{webhook_url}/webhooks/buildkite"),
        WEBHOOK_SECRET,
        step,
    );

    println!("submit   {submit_url}  (Authorization: Bearer {API_TOKEN})");
    println!("webhook  {webhook_url}/webhooks/buildkite");
    println!(
        "buildkite stand-in {}   discord stand-in {}\n",
        buildkite.api_url, discord.api_url
    );

    let client = reqwest::Client::new();
    let answer = client
        .post(format!("{submit_url}/submissions"))
        .bearer_auth(API_TOKEN)
        .json(&sample_submission())
        .send()
        .await?;
    let status = answer.status();
    let created: Value = answer.json().await?;
    println!(
        "POST /submissions → {status}\n{}\n",
        serde_json::to_string_pretty(&created)?
    );
    let run_id = created["run_id"]
        .as_str()
        .ok_or("no run_id in the answer")?
        .to_owned();

    let deadline = Instant::now() + Duration::from_secs(60);
    let job = loop {
        let job: Value = client
            .get(format!("{submit_url}/submissions/{run_id}"))
            .bearer_auth(API_TOKEN)
            .send()
            .await?
            .json()
            .await?;
        if matches!(job["state"].as_str(), Some("finished" | "failed")) {
            break job;
        }
        if Instant::now() > deadline {
            return Err(format!("job {run_id} did not finish within 60 s: {job}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "GET /submissions/{run_id} → {}, build {}, verdict {}\n",
        job["state"], job["result"]["build_state"], job["result"]["verdict"]
    );
    println!(
        "Discord calls: {}",
        discord
            .calls()
            .iter()
            .map(|c| format!("{} {}", c.method, c.status))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for message in discord.messages().values() {
        println!(
            "── Discord message ─────────────────────────────\n{}",
            render_for_terminal(message)
        );
    }

    if serve {
        println!("Serving until Ctrl-C.");
        let _ = tokio::signal::ctrl_c().await;
    }
    Ok(())
}
