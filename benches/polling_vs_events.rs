//! Polling vs events, side by side in one run: the same builds (30 s to 15 min, time-scaled)
//! finished through (a) a model of the seeds' launcher, which polls every 10 s, and (b) our
//! webhook path with its sweep on its schedule. Each side has its own Buildkite stand-in, so
//! each counts only its own calls. Prints Markdown tables and draws
//! `benches/calls-per-job.svg`; `cargo bench --bench polling_vs_events`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kernelbot_dispatch::devstack::buildkite::{BuildkiteStandin, sample_result};
use kernelbot_dispatch::devstack::discord::{DiscordCall, DiscordStandin};
use kernelbot_dispatch::devstack::stack::{BK_TOKEN, Stack, StoreKind, submission};
use kernelbot_dispatch::jobs::Shard;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Mutex;

/// Modelled seconds per real second: 15 minutes pass in 15 s. Real work is not scaled, so a
/// larger factor would inflate each call's few milliseconds into modelled seconds.
const SCALE: f64 = 60.0;
/// Build lengths, in modelled seconds.
const LENGTHS: [u64; 7] = [30, 60, 120, 300, 600, 840, 900];
/// Builds of each length, on each side.
const PER_LENGTH: usize = 4;
/// The seeds' launcher: `poll_interval_seconds` and `max_wait_seconds`.
const POLL_SECS: f64 = 10.0;
const MAX_WAIT_SECS: f64 = 900.0;
/// The sweep's schedule in `template.yaml`: `rate(5 minutes)`.
const SWEEP_SECS: f64 = 300.0;
/// Buildkite's REST limits (per organization, per token), per minute.
const ORG_LIMIT: f64 = 200.0;
const TOKEN_LIMIT: f64 = 50.0;

fn real(model_secs: f64) -> Duration {
    Duration::from_secs_f64(model_secs / SCALE)
}

/// One build's figures on one side.
#[derive(Clone, Debug)]
struct Finished {
    length: u64,
    /// Build end → Discord told, in modelled seconds; `None`: never told.
    delay: Option<f64>,
    /// Buildkite REST calls made for this job (artifact storage not counted).
    calls: f64,
    /// Discord calls made for this job.
    discord: f64,
}

#[tokio::main]
async fn main() {
    let started = Instant::now();
    let (polled, (evented, sweep_calls)) = tokio::join!(polling_side(), events_side());
    eprintln!("run took {:.1} s", started.elapsed().as_secs_f64());
    report(&polled, &evented, sweep_calls);
    draw(&polled, &evented);
}

// ---------------------------------------------------------------------------------------
// (a) The seeds' launcher: create, then GET the build every 10 s (a Discord edit each time)
// until it ends or 900 s pass; then the job's artifact list, the download (302 to storage,
// followed without the token), and the final Discord message.

async fn polling_side() -> Vec<Finished> {
    let bk = BuildkiteStandin::start(BK_TOKEN, "test-org", "kernelbot")
        .await
        .expect("buildkite stand-in");
    let discord = DiscordStandin::start().await.expect("discord stand-in");
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let tasks: Vec<_> = builds()
        .map(|(i, length)| {
            let (bk, discord, http) = (bk.clone(), discord.api_url.clone(), http.clone());
            tokio::spawn(async move { poll_one(&bk, &discord, &http, i, length).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("polling task"));
    }
    let calls = discord.calls();
    for (f, (i, _)) in out.iter_mut().zip(builds()) {
        f.discord = discord_calls(&calls, i);
    }
    out
}

fn builds() -> impl Iterator<Item = (usize, u64)> {
    LENGTHS
        .iter()
        .flat_map(|&l| std::iter::repeat_n(l, PER_LENGTH))
        .enumerate()
}

/// How long build `i` of nominal `length` runs, in modelled seconds: the builds of one length
/// end at points spread over one poll interval, as real builds would, not in step with the
/// polls that started with them.
fn run_time(i: usize, length: u64) -> f64 {
    length as f64 + (i % PER_LENGTH) as f64 * POLL_SECS / PER_LENGTH as f64
}

/// Job `i`'s Discord webhook id: its own, so its calls can be counted.
fn hook_id(i: usize) -> String {
    format!("1{i:017}")
}

fn discord_calls(calls: &[DiscordCall], i: usize) -> f64 {
    let id = hook_id(i);
    calls.iter().filter(|c| c.webhook_id == id).count() as f64
}

async fn poll_one(
    bk: &BuildkiteStandin,
    discord: &str,
    http: &reqwest::Client,
    i: usize,
    length: u64,
) -> Finished {
    let api = |url: &str| http.get(url).bearer_auth(BK_TOKEN);
    let hook = format!("{discord}/webhooks/{}/token-{i}", hook_id(i));
    let created: Value = http
        .post(format!(
            "{}/organizations/{}/pipelines/{}/builds",
            bk.api_url, bk.org, bk.pipeline
        ))
        .bearer_auth(BK_TOKEN)
        .json(
            &json!({"commit": "HEAD", "branch": "main", "message": format!("Kernel eval: sub-{i}"),
                      "env": {"KERNELBOT_RUN_ID": format!("sub-{i}")}}),
        )
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .expect("create")
        .json()
        .await
        .expect("build");
    let number = created["number"].as_u64().expect("number");
    let build_url = created["url"].as_str().expect("url").to_owned();
    let message: Value = http
        .post(format!("{hook}?wait=true"))
        .json(&json!({"content": "Submitting to Buildkite"}))
        .send()
        .await
        .expect("discord")
        .json()
        .await
        .expect("message");
    let edit = format!("{hook}/messages/{}", message["id"].as_str().expect("id"));
    let _ = http
        .patch(&edit)
        .json(&json!({"content": format!("Build created: {number}")}))
        .send()
        .await;
    let ended = end_later(bk.clone(), number, run_time(i, length));
    let start = Instant::now();
    let mut outcome = None;
    while start.elapsed().as_secs_f64() * SCALE < MAX_WAIT_SECS {
        let build: Value = api(&build_url)
            .send()
            .await
            .expect("poll")
            .json()
            .await
            .expect("build");
        if build["state"] == "passed" {
            let seen = Instant::now();
            let artifacts: Value = api(build["jobs"][0]["artifacts_url"]
                .as_str()
                .expect("artifacts_url"))
            .send()
            .await
            .expect("artifacts")
            .json()
            .await
            .expect("list");
            let download = artifacts
                .as_array()
                .and_then(|a| a.iter().find(|a| a["filename"] == "result.json"))
                .and_then(|a| a["download_url"].as_str())
                .expect("result.json listed");
            let redirect = api(download).send().await.expect("download");
            assert_eq!(redirect.status(), StatusCode::FOUND);
            let location = redirect.headers()["location"]
                .to_str()
                .expect("location")
                .to_owned();
            let stored = http.get(location).send().await.expect("storage");
            assert!(
                stored.status().is_success(),
                "storage answered {}",
                stored.status()
            );
            let _ = http
                .patch(&edit)
                .json(&json!({"content": "result"}))
                .send()
                .await;
            let told = Instant::now();
            let end = ended
                .lock()
                .await
                .expect("the build ended before it was seen");
            outcome = Some(
                seen.duration_since(end).as_secs_f64() * SCALE
                    + told.duration_since(seen).as_secs_f64(),
            );
            break;
        }
        let _ = http
            .patch(&edit)
            .json(&json!({"content": "⏳ running"}))
            .send()
            .await;
        tokio::time::sleep(real(POLL_SECS)).await;
    }
    let calls = calls_for(bk, number) + 1.0;
    Finished {
        length,
        delay: outcome,
        calls,
        discord: 0.0,
    }
}

/// Ends build `number` as passed, its `result.json` uploaded, `after` modelled seconds from
/// now; the cell holds when.
fn end_later(bk: BuildkiteStandin, number: u64, after: f64) -> Arc<Mutex<Option<Instant>>> {
    let ended = Arc::new(Mutex::new(None));
    let cell = ended.clone();
    bk.start_eval(number);
    tokio::spawn(async move {
        tokio::time::sleep(real(after)).await;
        let mut at = cell.lock().await;
        bk.upload(
            number,
            "result.json",
            sample_result(false),
            "finished",
            false,
        );
        bk.set_state(number, "passed");
        *at = Some(Instant::now());
    });
    ended
}

/// REST calls naming build `number` (its reads, artifact list and downloads).
fn calls_for(bk: &BuildkiteStandin, number: u64) -> f64 {
    let needle = format!("/builds/{number}");
    bk.api_calls()
        .iter()
        .filter(|c| {
            c.split_once(&needle)
                .is_some_and(|(_, rest)| rest.is_empty() || rest.starts_with('/'))
        })
        .count() as f64
}

// ---------------------------------------------------------------------------------------
// (b) Our path: submit, `build.running` and `build.finished` webhooks, and the sweep every
// 5 minutes, on the functions' shared clock moved forward at the same scale.

async fn events_side() -> (Vec<Finished>, f64) {
    let app = Arc::new(
        Stack::spawn(StoreKind::Sqlite)
            .await
            .expect("the local stack"),
    );
    let started = Instant::now();
    let clock = {
        let app = app.clone();
        tokio::spawn(async move {
            let mut applied = 0.0;
            loop {
                let target = started.elapsed().as_secs_f64() * (SCALE - 1.0);
                app.advance_clock(Duration::from_secs_f64(target - applied));
                applied = target;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let shares = Arc::new(std::sync::Mutex::new(std::collections::HashMap::<
        String,
        f64,
    >::new()));
    let sweeper = {
        let (app, shares) = (app.clone(), shares.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(real(SWEEP_SECS)).await;
                sweep_pass(&app, &shares).await;
            }
        })
    };
    let tasks: Vec<_> = builds()
        .map(|(i, length)| {
            let app = app.clone();
            tokio::spawn(async move { event_one(&app, i, length).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("events task"));
    }
    let calls = app.discord.calls();
    for (f, (i, _)) in out.iter_mut().zip(builds()) {
        f.discord = discord_calls(&calls, i);
    }
    sweeper.abort();
    clock.abort();
    let shares = shares.lock().expect("shares");
    let mut sweep_total = 0.0;
    for (f, (i, _)) in out.iter_mut().zip(builds()) {
        let share = shares.get(&format!("ev-{i}")).copied().unwrap_or(0.0);
        f.calls += share;
        sweep_total += share;
    }
    (out, sweep_total)
}

/// One sweep pass; its listing calls are shared among the jobs it looked at.
async fn sweep_pass(
    app: &Stack,
    shares: &std::sync::Mutex<std::collections::HashMap<String, f64>>,
) {
    let now = app.clock.now();
    let min_age = app.sweeper.config().timing.sweep_min_age.as_millis() as i64;
    let due: Vec<String> = app
        .store
        .list(Shard::Open, 0, 10_000)
        .await
        .expect("open jobs")
        .jobs
        .into_iter()
        .filter(|j| j.build.is_some() && j.created_at <= now - min_age)
        .map(|j| j.run_id.to_string())
        .collect();
    let listings = |calls: &[String]| {
        calls
            .iter()
            .filter(|c| c.starts_with("GET") && c.ends_with("/builds"))
            .count()
    };
    let before = listings(&app.buildkite.api_calls());
    let report = app.sweep().await.expect("sweep pass");
    let made = (listings(&app.buildkite.api_calls()) - before) as f64;
    assert!(report.errors == 0, "sweep errors: {report}");
    if !due.is_empty() {
        let mut s = shares.lock().expect("shares");
        for id in &due {
            *s.entry(id.clone()).or_default() += made / due.len() as f64;
        }
    }
}

async fn event_one(app: &Stack, i: usize, length: u64) -> Finished {
    let mut sub = submission(&format!("ev-{i}"));
    sub["discord"]["webhook_url"] = json!(format!(
        "https://discord.com/api/webhooks/{}/token-{i}",
        hook_id(i)
    ));
    let (status, body) = app.submit(&sub).await.expect("the submit API answers");
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let number = body["build"]["number"]
        .as_u64()
        .expect("build created inline");
    app.buildkite.start_eval(number);
    assert_eq!(
        app.event("build.running", number).await,
        Some(StatusCode::OK)
    );
    tokio::time::sleep(real(run_time(i, length))).await;
    app.buildkite.upload(
        number,
        "result.json",
        sample_result(false),
        "finished",
        false,
    );
    app.buildkite.set_state(number, "passed");
    let end = Instant::now();
    assert_eq!(
        app.event("build.finished", number).await,
        Some(StatusCode::OK)
    );
    let told = Instant::now();
    let job = app.job(&format!("ev-{i}")).await.expect("the job");
    assert_eq!(job.state.to_string(), "finished", "job {i} finished");
    Finished {
        length,
        delay: Some(told.duration_since(end).as_secs_f64()),
        calls: calls_for(&app.buildkite, number) + 1.0,
        discord: 0.0,
    }
}

// ---------------------------------------------------------------------------------------

/// Mean of `f` over the builds of `length`.
fn mean(of: &[Finished], length: u64, f: impl Fn(&Finished) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = of
        .iter()
        .filter(|x| x.length == length)
        .filter_map(f)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Builds of `length` in flight that `limit` calls a minute sustain, for `calls` per job,
/// `poll_rate` calls a minute per build in flight while it runs: in flight N costs
/// N·(calls_fixed/length + poll_rate) a minute.
fn sustained(limit: f64, per_job: f64, length: u64, poll_rate: f64, polls: f64) -> f64 {
    let minutes = length as f64 / 60.0;
    let fixed = per_job - polls;
    limit / (fixed / minutes + poll_rate)
}

fn report(polled: &[Finished], evented: &[Finished], sweep_calls: f64) {
    println!(
        "\nPolling vs events: {} builds a side, time-scaled ×{SCALE}; delays in modelled seconds",
        LENGTHS.len() * PER_LENGTH
    );
    println!(
        "\n| build length | polling: Buildkite calls/job | events: calls/job (sweep share incl.) | ratio | polling: Discord calls/job | events: Discord calls/job | polling: delay to Discord (s) | events: delay (s) | polling: never told |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for &l in &LENGTHS {
        let pc = mean(polled, l, |f| Some(f.calls)).unwrap_or(0.0);
        let ec = mean(evented, l, |f| Some(f.calls)).unwrap_or(0.0);
        let lost = polled
            .iter()
            .filter(|f| f.length == l && f.delay.is_none())
            .count();
        let fmt =
            |d: Option<f64>, digits: usize| d.map_or("—".to_owned(), |d| format!("{d:.digits$}"));
        let pd = mean(polled, l, |f| Some(f.discord)).unwrap_or(0.0);
        let ed = mean(evented, l, |f| Some(f.discord)).unwrap_or(0.0);
        println!(
            "| {} | {pc:.1} | {ec:.2} | {:.1}× fewer | {pd:.1} | {ed:.1} | {} | {} | {lost}/{PER_LENGTH} |",
            humantime::format_duration(Duration::from_secs(l)),
            pc / ec,
            fmt(mean(polled, l, |f| f.delay), 1),
            fmt(mean(evented, l, |f| f.delay), 3),
        );
    }
    println!(
        "\nThe sweep made {sweep_calls:.0} listing calls in the run, shared above among the jobs each pass looked at."
    );
    println!(
        "\nBuilds in flight each side sustains within Buildkite's limits (from the calls above):"
    );
    println!(
        "\n| build length | polling, per token (50/min) | events, per token | polling, per org (200/min) | events, per org |"
    );
    println!("|---|---|---|---|---|");
    let poll_rate = 60.0 / POLL_SECS;
    for &l in &LENGTHS {
        let pc = mean(polled, l, |f| Some(f.calls)).unwrap_or(0.0);
        let ec = mean(evented, l, |f| Some(f.calls)).unwrap_or(0.0);
        // One at the start, then one every interval until the build is seen to end.
        let polls = (1.0 + (l as f64 / POLL_SECS).ceil()).min(MAX_WAIT_SECS / POLL_SECS);
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} |",
            humantime::format_duration(Duration::from_secs(l)),
            sustained(TOKEN_LIMIT, pc, l, poll_rate, polls),
            sustained(TOKEN_LIMIT, ec, l, 0.0, 0.0),
            sustained(ORG_LIMIT, pc, l, poll_rate, polls),
            sustained(ORG_LIMIT, ec, l, 0.0, 0.0),
        );
    }
}

/// A line chart of calls per job against build length, as SVG.
fn draw(polled: &[Finished], evented: &[Finished]) {
    use plotters::prelude::*;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/calls-per-job.svg");
    let series = |of: &[Finished]| -> Vec<(f64, f64)> {
        LENGTHS
            .iter()
            .filter_map(|&l| Some((l as f64 / 60.0, mean(of, l, |f| Some(f.calls))?)))
            .collect()
    };
    let (p, e) = (series(polled), series(evented));
    let top = p.iter().map(|(_, c)| *c).fold(10.0, f64::max) * 1.1;
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    let drawn = (|| -> Result<(), Box<dyn std::error::Error>> {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Buildkite API calls per job against build length",
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..15.5, 0.0..top)?;
        chart
            .configure_mesh()
            .x_desc("build length (minutes)")
            .y_desc("calls per job")
            .draw()?;
        chart
            .draw_series(LineSeries::new(p.clone(), RED.stroke_width(2)))?
            .label("seeds' launcher, polling every 10 s")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED));
        chart.draw_series(p.iter().map(|&pt| Circle::new(pt, 3, RED.filled())))?;
        chart
            .draw_series(LineSeries::new(e.clone(), BLUE.stroke_width(2)))?
            .label("webhooks, sweep share included")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE));
        chart.draw_series(e.iter().map(|&pt| Circle::new(pt, 3, BLUE.filled())))?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    })();
    match drawn {
        Ok(()) => println!("\nchart: benches/calls-per-job.svg"),
        Err(e) => eprintln!("chart not drawn: {e}"),
    }
}
