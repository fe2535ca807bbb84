//! Cold start and footprint of the webhook function, against a baseline binary that builds
//! the same clients (`benches/support/coldstart_baseline.rs`), both built with the same profile and
//! started alternately in one run. Plain-HTTP mode, DynamoDB (moto) as the store. Then the
//! first request after start against the ones after it, ours (a webhook) beside the
//! baseline's (one `GetItem`), so start-up cost cannot hide in the first webhook; and idle
//! and peak RSS. `scripts/bench.sh` builds both binaries first.

#[path = "support/load.rs"]
mod load;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kernelbot_dispatch::buildkite::sign;
use kernelbot_dispatch::devstack::buildkite::{BuildkiteStandin, unix_now};
use kernelbot_dispatch::devstack::moto;
use kernelbot_dispatch::devstack::stack::{BK_TOKEN, SECRET};

const STARTS: usize = 30;
/// Fresh starts whose first request is timed, and the requests timed after it in each.
const FIRSTS: usize = 10;
const LATER: usize = 50;

fn binary(path: &str) -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target")));
    let p = target.join("release").join(path);
    assert!(
        p.exists(),
        "{} is missing: run scripts/bench.sh, which builds it",
        p.display()
    );
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `GET /healthz` over a fresh connection: whether it answered 200.
fn healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let req =
        format!("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    let mut answer = String::new();
    s.write_all(req.as_bytes()).is_ok()
        && s.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.1 200")
}

/// Starts `bin` with `env`; returns it and the time from spawn to its first answer.
fn start(bin: &PathBuf, env: &[(String, String)], port: u16) -> (Child, Duration) {
    let spawned = Instant::now();
    let child = Command::new(bin)
        .env_clear()
        .envs(env.iter().cloned())
        .env("LISTEN_ADDR", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    while !healthy(port) {
        assert!(
            spawned.elapsed() < Duration::from_secs(10),
            "{} never answered",
            bin.display()
        );
        std::thread::sleep(Duration::from_micros(100));
    }
    (child, spawned.elapsed())
}

/// `VmRSS` and `VmHWM` (peak) of a process, in MB.
fn rss(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let webhook_bin = binary("webhook");
    let baseline_bin = binary("examples/coldstart_baseline");
    let client = moto::client().expect("moto");
    let table = "coldstart-jobs";
    moto::create_table(&client, table).await.expect("table");
    let bk = BuildkiteStandin::start(BK_TOKEN, "test-org", "kernelbot")
        .await
        .expect("buildkite stand-in");
    let env: Vec<(String, String)> = [
        ("BUILDKITE_API_URL", bk.api_url.as_str()),
        ("BUILDKITE_API_TOKEN", BK_TOKEN),
        ("BUILDKITE_ORG", "test-org"),
        ("BUILDKITE_PIPELINE", "kernelbot"),
        ("BUILDKITE_WEBHOOK_SECRET", SECRET),
        ("JOBS_TABLE", table),
        ("AWS_ENDPOINT_URL_DYNAMODB", moto::endpoint().expect("moto")),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
        ("RUST_LOG", "warn"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();

    // Alternate, so both see the same machine.
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for _ in 0..STARTS {
        for (bin, into) in [(&webhook_bin, &mut ours), (&baseline_bin, &mut base)] {
            let port = free_port();
            let (mut child, took) = start(bin, &env, port);
            into.push(took);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    let (ours, base) = (median(ours), median(base));

    let body = bk_build_finished(&bk).await;
    let webhook = |port: u16| {
        let ts = unix_now().to_string();
        reqwest::Client::new()
            .post(format!("http://127.0.0.1:{port}/webhooks/buildkite"))
            .header("x-buildkite-event", "build.finished")
            .header(
                "x-buildkite-signature",
                format!("timestamp={ts},signature={}", sign(SECRET, &ts, &body)),
            )
            .body(body.clone())
            .build()
            .expect("request")
    };
    let read = |port: u16| {
        reqwest::Client::new()
            .get(format!("http://127.0.0.1:{port}/read"))
            .build()
            .expect("request")
    };

    // The first request after start against the ones after it, in fresh processes of both
    // (alternating): a webhook of ours, one `GetItem` of the baseline's. Their first calls
    // share costs no process avoids (connections, the SDK's first signing); what ours pays
    // beyond that would be start-up work moved to the first webhook.
    let (mut ours_first, mut base_first) = (Vec::new(), Vec::new());
    for _ in 0..FIRSTS {
        ours_first.push(first_and_later(&webhook_bin, &env, &webhook).await);
        base_first.push(first_and_later(&baseline_bin, &env, &read).await);
    }
    let (of, ol) = medians(ours_first);
    let (bf, bl) = medians(base_first);

    // Footprint: idle of both, then ours after a burst.
    let port = free_port();
    let (mut child, _) = start(&webhook_bin, &env, port);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (idle, _) = rss(child.id());
    let (mut base_child, _) = start(&baseline_bin, &env, free_port());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (base_idle, _) = rss(base_child.id());
    let _ = base_child.kill();
    let _ = base_child.wait();
    let http = load::client(64);
    let burst = load::drive(
        &http,
        (0..2_000).map(|_| webhook(port)).collect(),
        64,
        |s, _| s == 200,
    )
    .await;
    assert_eq!(burst.wrong, 0);
    let (_, peak) = rss(child.id());
    let _ = child.kill();
    let _ = child.wait();

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "\nCold start and footprint (plain HTTP, DynamoDB on moto, both binaries from `--profile bench`)\n"
    );
    println!("| figure | webhook function | baseline | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| process start → first answered request (median of {STARTS}) | {:.1} ms | {:.1} ms | {:.2} |",
        ms(ours),
        ms(base),
        ms(ours) / ms(base)
    );
    println!(
        "| first request after start (median of {FIRSTS} starts): webhook / baseline `GetItem` | {:.2} ms | {:.2} ms | {:.2} |",
        ms(of),
        ms(bf),
        ms(of) / ms(bf)
    );
    println!(
        "| the {LATER} after it (median) | {:.2} ms | {:.2} ms | {:.2} |",
        ms(ol),
        ms(bl),
        ms(ol) / ms(bl)
    );
    println!(
        "| first-request excess (first − later) | {:.2} ms | {:.2} ms | {:.2} |",
        ms(of.saturating_sub(ol)),
        ms(bf.saturating_sub(bl)),
        ms(of.saturating_sub(ol)) / ms(bf.saturating_sub(bl)).max(0.001)
    );
    println!(
        "| idle RSS | {idle:.1} MB | {base_idle:.1} MB | {:.2} |",
        idle / base_idle
    );
    println!("| peak RSS after 2,000 webhooks at concurrency 64 | {peak:.1} MB | | |");
    println!(
        "\nThat burst: {} requests in {:.2} s ({:.0}/s), latency p50 / p99 / p99.9 {} ms.",
        burst.requests,
        burst.elapsed.as_secs_f64(),
        burst.rate(),
        load::percentiles(&burst.latency)
    );
}

/// A build the stand-in knows, and its signed-for `build.finished` body: the webhook reads
/// the job (unknown to the store) and answers without a further call.
async fn bk_build_finished(bk: &BuildkiteStandin) -> Vec<u8> {
    let created = reqwest::Client::new()
        .post(format!(
            "{}/organizations/test-org/pipelines/kernelbot/builds",
            bk.api_url
        ))
        .bearer_auth(BK_TOKEN)
        .json(&serde_json::json!({"commit": "HEAD", "branch": "main",
            "env": {"KERNELBOT_RUN_ID": "coldstart-1"}, "meta_data": {"run_id": "coldstart-1"}}))
        .send()
        .await
        .expect("create");
    assert!(created.status().is_success());
    bk.webhook_body("build.finished", 1)
}

/// Starts `bin`, then times its first request (`make`, to the port) and the median of the
/// [`LATER`] after it, each over one client made for this process.
async fn first_and_later(
    bin: &PathBuf,
    env: &[(String, String)],
    make: &impl Fn(u16) -> reqwest::Request,
) -> (Duration, Duration) {
    let port = free_port();
    let (mut child, _) = start(bin, env, port);
    let http = load::client(1);
    let timed = |req: reqwest::Request| {
        let http = http.clone();
        async move {
            let sent = Instant::now();
            let resp = http.execute(req).await.expect("answers");
            assert!(resp.status().is_success(), "answered {}", resp.status());
            sent.elapsed()
        }
    };
    let first = timed(make(port)).await;
    let mut later = Vec::new();
    for _ in 0..LATER {
        later.push(timed(make(port)).await);
    }
    let _ = child.kill();
    let _ = child.wait();
    (first, median(later))
}

fn medians(v: Vec<(Duration, Duration)>) -> (Duration, Duration) {
    let (first, later): (Vec<_>, Vec<_>) = v.into_iter().unzip();
    (median(first), median(later))
}
