//! Runs the whole system on this machine with no accounts: the submit and webhook functions
//! on the embedded store, with local stand-ins for Buildkite (which also plays the GPU agent)
//! and Discord. Submits one job, waits for it to finish and prints its Discord report.
//!
//! `--serve` keeps everything running so you can submit more with curl: it serves as soon as
//! its URLs are printed, and prints the sample's report when that run ends.

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kernelbot_dispatch::config::{Config, Role};
use kernelbot_dispatch::devstack::agent::local_agent;
use kernelbot_dispatch::devstack::buildkite::BuildkiteStandin;
use kernelbot_dispatch::devstack::discord::{DiscordStandin, render_for_terminal};
use kernelbot_dispatch::devstack::env::{Secrets, function_env};
use kernelbot_dispatch::devstack::runner_program::runner_program;
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
    env: &BTreeMap<String, String>,
    router: fn(Arc<Deps>) -> axum::Router,
) -> Result<String, Error> {
    let config = Arc::new(Config::from_lookup(role, &|k| {
        env.get(k).cloned().or_else(|| std::env::var(k).ok())
    })?);
    let store = jobs::open(config.store()).await?;
    // Served like the stand-ins: loopback only, answering to its own Host only.
    let addr = devstack::spawn(router(Arc::new(Deps::new(config, store)?))).await?;
    Ok(format!("http://{addr}"))
}

fn main() -> Result<(), Error> {
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

/// A secret of this run's only.
fn random_secret() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The system as it runs here: the stand-ins, and where the two functions listen.
struct Local {
    buildkite: BuildkiteStandin,
    discord: DiscordStandin,
    submit_url: String,
    /// Where Buildkite's webhooks go.
    hook_url: String,
    api_token: String,
}

async fn run_local() -> Result<(), Error> {
    telemetry::init();
    let serve = std::env::args().any(|a| a == "--serve");
    let local = Arc::new(start().await?);
    announce(&local)?;
    let client = reqwest::Client::new();
    let run_id = submit_sample(&client, &local).await?;
    let sample = {
        let local = local.clone();
        async move {
            let job = wait_for_report(&client, &local, &run_id).await?;
            print_report(&local, &run_id, &job);
            Ok::<_, Error>(())
        }
    };
    if !serve {
        return sample.await;
    }
    // The stack serves from its first line: the sample's report comes when it ends, and a
    // slow one (a busy machine) never holds back or takes down what scripts already use.
    tokio::spawn(async move {
        if let Err(e) = sample.await {
            eprintln!("The sample run: {e}. Serving all the same.");
        }
    });
    println!("Serving until Ctrl-C.");
    let _ = tokio::signal::ctrl_c().await;
    Ok(())
}

/// Starts the stand-ins and both functions, wired to each other by the devstack's
/// environment (the process environment fills in what it leaves out).
async fn start() -> Result<Local, Error> {
    let secrets = Secrets {
        // Random, so nothing else on this machine can drive the stand-in's builds.
        buildkite_token: random_secret(),
        webhook_secret: random_secret(),
        submit_token: submit_token()?,
        // Profile links, signed with a key of this run's (they open the submit API).
        profile_link_secret: std::env::var("PROFILE_LINK_SECRET")
            .unwrap_or_else(|_| random_secret()),
    };
    let buildkite =
        BuildkiteStandin::start(&secrets.buildkite_token, "local-org", "kernelbot").await?;
    let discord = DiscordStandin::start().await?;
    // One idle GPU agent per queue, for `GET /queues/{gpu}`.
    buildkite.set_agents(&[
        ("local-b200-gpu0", "b200", "connected", false),
        ("local-h100-gpu0", "h100", "connected", false),
        ("local-mi300-gpu0", "mi300", "connected", false),
        ("local-test-gpu0", "test", "connected", false),
    ]);
    let mut env = function_env(&buildkite, &discord, &secrets);
    let submit_url = start_function(Role::Submit, &env, http::submit::router).await?;
    env.insert("PUBLIC_URL".into(), submit_url.clone());
    let webhook_url = start_function(Role::Webhook, &env, http::webhook::router).await?;
    let hook_url = format!("{webhook_url}/webhooks/buildkite");
    // The stand-in agent runs the pipeline's step, which calls `kernelbot-runner`: the runner
    // crate's own binary, as the runner image installs it.
    let runner = runner_program()?;
    tracing::info!(runner = %runner.display(), "the stand-in agent runs this runner");
    let agent = local_agent(runner);
    buildkite.autorun(&hook_url, &secrets.webhook_secret, agent);
    Ok(Local {
        buildkite,
        discord,
        submit_url,
        hook_url,
        api_token: secrets.submit_token,
    })
}

/// Prints where everything listens, and writes the submit API's URL for scripts.
fn announce(local: &Local) -> Result<(), Error> {
    let Local {
        buildkite,
        discord,
        submit_url,
        hook_url,
        api_token,
    } = local;
    println!(
        "submit   {submit_url}  (Authorization: Bearer {api_token}; also in <data dir>/submit-token)"
    );
    println!("webhook  {hook_url}");
    // For scripts (the launcher's tests): where the submit API listens, once it does.
    let url_file = data_dir().join("submit-url");
    std::fs::write(url_file.with_extension("tmp"), format!("{submit_url}\n"))?;
    std::fs::rename(url_file.with_extension("tmp"), &url_file)?;
    println!(
        "buildkite stand-in {}   discord stand-in {}\n",
        buildkite.api_url, discord.api_url
    );
    Ok(())
}

/// Submits the sample job and prints the answer; its run id.
async fn submit_sample(client: &reqwest::Client, local: &Local) -> Result<String, Error> {
    let answer = client
        .post(format!("{}/submissions", local.submit_url))
        .bearer_auth(&local.api_token)
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
        .ok_or("no run_id in the answer")?;
    Ok(run_id.to_owned())
}

/// How long the sample may take to be reported: its three phases may each run to their 60 s
/// timeout on a slow machine, and the runner's start and the stack's calls come on top.
const REPORT_WAIT: Duration = Duration::from_secs(300);

/// The job once it has ended and its report was delivered; an error after [`REPORT_WAIT`].
async fn wait_for_report(
    client: &reqwest::Client,
    local: &Local,
    run_id: &str,
) -> Result<Value, Error> {
    let deadline = Instant::now() + REPORT_WAIT;
    loop {
        let job: Value = client
            .get(format!("{}/submissions/{run_id}", local.submit_url))
            .bearer_auth(&local.api_token)
            .send()
            .await?
            .json()
            .await?;
        // Ended, and its report delivered (the state is written before Discord is told).
        let reported = job["delivery"]["discord"]["status"] != "pending";
        if matches!(job["state"].as_str(), Some("finished" | "failed")) && reported {
            return Ok(job);
        }
        if Instant::now() > deadline {
            let secs = REPORT_WAIT.as_secs();
            return Err(format!("job {run_id} did not finish within {secs} s: {job}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Prints the job's end, the calls Discord got and the messages it shows.
fn print_report(local: &Local, run_id: &str, job: &Value) {
    println!(
        "GET /submissions/{run_id} → {}, build {}, verdict {}\n",
        job["state"], job["result"]["build_state"], job["result"]["verdict"]
    );
    println!(
        "Discord calls: {}",
        local
            .discord
            .calls()
            .iter()
            .map(|c| format!("{} {}", c.method, c.status))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for message in local.discord.messages().values() {
        println!(
            "── Discord message ─────────────────────────────\n{}",
            render_for_terminal(message)
        );
    }
}
