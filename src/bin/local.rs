//! Runs the whole system on this machine with no accounts: the submit and webhook functions
//! on the embedded store, with local stand-ins for Buildkite (which also plays the GPU agent)
//! and Discord. Submits one job, waits for it to finish and prints its Discord report.
//!
//! `--serve` keeps everything running afterwards so you can submit more with curl.

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kernelbot_dispatch::config::{Config, Role};
use kernelbot_dispatch::devstack::agent::{RUNNER_COMMAND, local_agent};
use kernelbot_dispatch::devstack::buildkite::BuildkiteStandin;
use kernelbot_dispatch::devstack::discord::{DiscordStandin, render_for_terminal};
use kernelbot_dispatch::flow::Deps;
use kernelbot_dispatch::{devstack, http, jobs, telemetry};
use serde_json::{Value, json};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A kernelbot-style Python task: `eval.py` is the harness (kernelbot's protocol: mode and
/// cases file as arguments, `key: value` verdict lines on the POPCORN_FD pipe), and
/// `submission.py` the user's kernel.
const EVAL_PY: &str = r#"import os, random, sys, time
from submission import custom_kernel

def reference(data):
    a, b = data
    return [x + y for x, y in zip(a, b)]

mode, cases = sys.argv[1], [l for l in open(sys.argv[2]).read().splitlines() if l]
kind = "test" if mode == "test" else "benchmark"  # kernelbot's key prefix
out = os.fdopen(int(os.environ["POPCORN_FD"]), "w")
def say(key, value):
    print(f"{key}: {value}", file=out, flush=True)

say(f"{kind}-count", len(cases))
ok = True
for i, case in enumerate(cases):
    spec = dict(kv.split(": ") for kv in case.split("; "))
    rng = random.Random(int(spec.get("seed", 0)))
    n = int(spec["size"])
    data = ([rng.random() for _ in range(n)], [rng.random() for _ in range(n)])
    say(f"{kind}.{i}.spec", case)
    if mode == "test":
        passed = custom_kernel(data) == reference(data)
        ok &= passed
        say(f"{kind}.{i}.status", "pass" if passed else "fail")
    else:
        times = []
        for _ in range(20):
            start = time.perf_counter_ns(); custom_kernel(data); times.append(time.perf_counter_ns() - start)
        mean = sum(times) / len(times)
        err = (sum((t - mean) ** 2 for t in times) / len(times)) ** 0.5 / len(times) ** 0.5
        say(f"{kind}.{i}.runs", len(times)); say(f"{kind}.{i}.mean", mean); say(f"{kind}.{i}.err", err)
        say(f"{kind}.{i}.best", min(times)); say(f"{kind}.{i}.worst", max(times))
        say(f"{kind}.{i}.status", "pass")
say("check", "pass" if ok else "fail")
sys.exit(0 if ok else 112)
"#;

const SUBMISSION_PY: &str =
    "def custom_kernel(data):\n    a, b = data\n    return [x + y for x, y in zip(a, b)]\n";

fn sample_submission() -> Value {
    json!({
        "gpu": "H100_BK",
        "title": "vectoradd (local demo)",
        "discord": {"webhook_url": "https://discord.com/api/webhooks/1000000000000000001/local-demo-token"},
        "config": {
            "lang": "py", "mode": "leaderboard", "main": "eval.py",
            "sources": {"eval.py": EVAL_PY, "submission.py": SUBMISSION_PY},
            "tests": [{"size": 1024, "seed": 1}, {"size": 4096, "seed": 2}, {"size": 16384, "seed": 3}],
            "benchmarks": [{"size": 65536, "seed": 4}],
            "test_timeout": 60, "benchmark_timeout": 60, "ranked_timeout": 60
        }
    })
}

async fn start_function(
    role: Role,
    vars: &BTreeMap<&str, String>,
    router: fn(Arc<Deps>) -> axum::Router,
) -> Result<String, Error> {
    let config = Arc::new(Config::from_lookup(role, &|k| {
        vars.get(k).cloned().or_else(|| std::env::var(k).ok())
    })?);
    let store = jobs::open(config.store()).await?;
    // Served like the stand-ins: loopback only, answering to its own Host only.
    let addr = devstack::spawn(router(Arc::new(Deps::new(config, store)?))).await?;
    Ok(format!("http://{addr}"))
}

fn main() -> Result<(), Error> {
    let called_as = std::env::args().next().unwrap_or_default();
    if std::path::Path::new(&called_as)
        .file_name()
        .is_some_and(|n| n == RUNNER_COMMAND)
    {
        let out_dir = std::env::current_dir()?;
        std::process::exit(kernelbot_dispatch::runner::run(
            &|k| std::env::var(k).ok(),
            &out_dir,
        ));
    }
    tokio::runtime::Runtime::new()?.block_on(run_local())
}

fn data_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(
        std::env::var("KERNELBOT_DATA_DIR").unwrap_or_else(|_| "./.kernelbot".into()),
    )
}

/// The submission API's token: `SUBMIT_API_TOKEN` when set, else a fresh random one. It is
/// written (owner-only) to `<data dir>/submit-token` for scripts, and printed for people.
fn submit_token() -> Result<String, Error> {
    let token = match std::env::var("SUBMIT_API_TOKEN") {
        Ok(t) if !t.trim().is_empty() => t.trim().to_owned(),
        _ => format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        ),
    };
    let dir = data_dir();
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("submit-token");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)?;
    // An older file keeps its mode on open: make it owner-only too.
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes())?;
    Ok(token)
}

async fn run_local() -> Result<(), Error> {
    telemetry::init();
    let serve = std::env::args().any(|a| a == "--serve");
    let api_token = submit_token()?;

    // Random, so nothing else on this machine can drive the stand-in's builds.
    let buildkite_token = uuid::Uuid::new_v4().simple().to_string();
    let webhook_secret = uuid::Uuid::new_v4().simple().to_string();
    let buildkite = BuildkiteStandin::start(&buildkite_token, "local-org", "kernelbot").await?;
    let discord = DiscordStandin::start().await?;
    // One idle GPU agent per queue, for `GET /queues/{gpu}`.
    buildkite.set_agents(&[
        ("local-b200-gpu0", "b200", "connected", false),
        ("local-h100-gpu0", "h100", "connected", false),
        ("local-mi300-gpu0", "mi300", "connected", false),
        ("local-test-gpu0", "test", "connected", false),
    ]);
    let vars: BTreeMap<&str, String> = BTreeMap::from([
        ("BUILDKITE_API_URL", buildkite.api_url.clone()),
        ("BUILDKITE_API_TOKEN", buildkite_token.clone()),
        ("BUILDKITE_ORG", buildkite.org.clone()),
        ("BUILDKITE_PIPELINE", buildkite.pipeline.clone()),
        ("BUILDKITE_WEBHOOK_SECRET", webhook_secret.clone()),
        ("DISCORD_API_URL", discord.api_url.clone()),
        ("SUBMIT_API_TOKEN", api_token.clone()),
    ]);
    let mut vars = vars;
    // Profile links, signed with a key of this run's (they open the submit API).
    let link_secret = std::env::var("PROFILE_LINK_SECRET")
        .unwrap_or_else(|_| uuid::Uuid::new_v4().simple().to_string());
    vars.insert("PROFILE_LINK_SECRET", link_secret);
    let submit_url = start_function(Role::Submit, &vars, http::submit::router).await?;
    vars.insert("PUBLIC_URL", submit_url.clone());
    let webhook_url = start_function(Role::Webhook, &vars, http::webhook::router).await?;
    // The stand-in agent runs the pipeline's step, which calls `kernelbot-runner`: this very
    // binary, which acts as the runner when called by that name.
    let agent = local_agent(std::env::current_exe()?);
    buildkite.autorun(
        &format!("{webhook_url}/webhooks/buildkite"),
        &webhook_secret,
        agent,
    );

    println!(
        "submit   {submit_url}  (Authorization: Bearer {api_token}; also in <data dir>/submit-token)"
    );
    println!("webhook  {webhook_url}/webhooks/buildkite");
    // For scripts (the launcher's tests): where the submit API listens, once it does.
    let url_file = data_dir().join("submit-url");
    std::fs::write(url_file.with_extension("tmp"), format!("{submit_url}\n"))?;
    std::fs::rename(url_file.with_extension("tmp"), &url_file)?;
    println!(
        "buildkite stand-in {}   discord stand-in {}\n",
        buildkite.api_url, discord.api_url
    );

    let client = reqwest::Client::new();
    let answer = client
        .post(format!("{submit_url}/submissions"))
        .bearer_auth(&api_token)
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
            .bearer_auth(&api_token)
            .send()
            .await?
            .json()
            .await?;
        // Ended, and its report delivered (the state is written before Discord is told).
        let reported = job["delivery"]["discord"]["status"] != "pending";
        if matches!(job["state"].as_str(), Some("finished" | "failed")) && reported {
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
