//! A deadline rush, fair share against first come, first served, in one run: 240
//! submissions in 10 simulated minutes from 30 users (one of them sends 100 in the first
//! two), on one queue of 8 GPUs whose runs take about 30 s, through the whole stack (submit,
//! webhook and sweep functions, the Buildkite and Discord stand-ins enforcing their limits)
//! on a clock that runs ×30. The same seeded arrivals and run times feed both sides. Prints
//! Markdown tables; `cargo bench --bench rush`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kernelbot_dispatch::devstack::buildkite::sample_result;
use kernelbot_dispatch::devstack::stack::{Stack, StoreKind, submission};
use kernelbot_dispatch::jobs::{Channel, Job, JobState};
use kernelbot_dispatch::result::Verdict;
use kernelbot_dispatch::time::Clock;
use tokio::task::JoinSet;

/// Simulated seconds per real second. Real work is not scaled: a call's 10 ms count 0.3 s.
const SCALE: f64 = 30.0;
const AGENTS: usize = 8;
const SUBMISSIONS: usize = 240;
const LIGHT_USERS: usize = 29;
/// The heavy user's submissions, all in the first [`HEAVY_SECS`].
const HEAVY: usize = 100;
const HEAVY_SECS: f64 = 120.0;
/// Everyone else's arrive over the rush's 10 minutes.
const RUSH_SECS: f64 = 600.0;
/// Run times: 30 s ± 10 s (the sum of two uniform draws), seeded.
const RUN_SECS: f64 = 30.0;
const SEED: u64 = 0x5eed_0033;
/// Buildkite's REST limit of one token, per minute; Discord's per webhook, per 2 s.
const TOKEN_LIMIT: u32 = 50;
const DISCORD_CALLS: u32 = 5;
/// The sweep's schedule in `template.yaml`: `rate(5 minutes)`.
const SWEEP_SECS: f64 = 300.0;
/// A side that has not reported every run after this long has lost some.
const GIVE_UP_SECS: f64 = 4.0 * 3600.0;
/// The queue timeout of the main runs: a rush's backlog is longer than the default 900 s,
/// which would end runs in the queue on both sides; the default is run too, for its count.
const RUSH_QUEUE_TIMEOUT: &str = "3600";
const DEFAULT_QUEUE_TIMEOUT: &str = "900";
/// The driver's tick, in real time.
const TICK: Duration = Duration::from_millis(20);

/// One submission: when (simulated seconds from the start), whose, and how long it runs.
#[derive(Clone, Debug)]
struct Arrival {
    at: f64,
    user: String,
    run_id: String,
    run_secs: f64,
}

fn arrivals() -> Vec<Arrival> {
    let mut rng = fastrand::Rng::with_seed(SEED);
    let mut all: Vec<Arrival> = (0..SUBMISSIONS)
        .map(|i| {
            let (user, span) = if i < HEAVY {
                ("heavy".to_owned(), HEAVY_SECS)
            } else {
                (format!("light{:02}", i % LIGHT_USERS), RUSH_SECS)
            };
            Arrival {
                at: rng.f64() * span,
                user,
                run_id: format!("rush-{i:03}"),
                run_secs: RUN_SECS + 10.0 * (rng.f64() + rng.f64() - 1.0),
            }
        })
        .collect();
    all.sort_by(|a, b| a.at.total_cmp(&b.at));
    all
}

/// What one side measured, in simulated seconds.
#[derive(Default)]
struct Side {
    /// Per run: submitted → its build started on a GPU.
    waits: BTreeMap<String, f64>,
    /// Per run: its build ended → the job recorded as finished, when it was.
    to_record: Vec<f64>,
    /// Simulated seconds from the first submission to the last run reported.
    span: f64,
    heavy_done_at: f64,
    bk_calls: usize,
    bk_windows: Vec<u32>,
    bk_429: usize,
    discord_calls: usize,
    discord_busiest: u32,
    discord_429: usize,
    lost: usize,
    /// How the runs that did not pass ended, and how many.
    endings: BTreeMap<String, usize>,
    built_twice: usize,
    /// The webhook function's answers by outcome (`advanced`, `ignored`, `refused`, `error`…).
    webhooks: BTreeMap<String, usize>,
    real_secs: f64,
}

#[tokio::main]
async fn main() {
    // The functions' logs, when asked for (`RUST_LOG=warn`): what they gave up on, and why.
    if std::env::var_os("RUST_LOG").is_some() {
        kernelbot_dispatch::telemetry::init();
    }
    let arrivals = arrivals();
    let fair = run_side(true, RUSH_QUEUE_TIMEOUT, &arrivals).await;
    let fcfs = run_side(false, RUSH_QUEUE_TIMEOUT, &arrivals).await;
    report(&arrivals, &fair, &fcfs);
    for fair_share in [true, false] {
        let side = run_side(fair_share, DEFAULT_QUEUE_TIMEOUT, &arrivals).await;
        let name = if fair_share {
            "fair share"
        } else {
            "first come, first served"
        };
        println!(
            "\nAt the default queue timeout ({DEFAULT_QUEUE_TIMEOUT} s), {name}: {} of {SUBMISSIONS} \
             did not pass; last run reported at {:.1} simulated min.",
            side.lost,
            side.span / 60.0
        );
        for (ending, n) in &side.endings {
            println!("- {n}: {ending}");
        }
    }
}

/// The agents' side of the rush, as Buildkite runs a queue: each free GPU takes the oldest
/// scheduled build; a run ends after its drawn time and `build.finished` is sent.
struct Driver {
    app: Arc<Stack>,
    clock: Clock,
    t0: i64,
    by_run: HashMap<String, Arrival>,
    running: Vec<(u64, String, i64)>,
    started: HashMap<String, i64>,
    submitted: HashMap<String, i64>,
    ended: HashMap<String, i64>,
    tasks: JoinSet<()>,
}

impl Driver {
    fn sim(&self, at: i64) -> f64 {
        (at - self.t0) as f64 / 1000.0
    }

    fn submit(&mut self, a: &Arrival) {
        let mut body = submission(&a.run_id);
        body["user"] = a.user.clone().into();
        self.submitted.insert(a.run_id.clone(), self.clock.now());
        let app = self.app.clone();
        self.tasks.spawn(async move {
            let (status, answer) = app.submit(&body).await.expect("submit answered");
            assert_eq!(status.as_u16(), 202, "{answer}");
        });
    }

    fn finish_due(&mut self, now: i64) {
        let (due, left): (Vec<_>, Vec<_>) = self.running.drain(..).partition(|r| r.2 <= now);
        self.running = left;
        for (number, run_id, _) in due {
            self.ended.insert(run_id, now);
            let app = self.app.clone();
            self.tasks.spawn(async move {
                app.finish(number, "passed", Some(sample_result(false)))
                    .await;
            });
        }
    }

    fn start_free(&mut self, now: i64) {
        if self.running.len() >= AGENTS {
            return;
        }
        let mut scheduled: Vec<_> = self
            .app
            .buildkite
            .builds()
            .into_iter()
            .filter(|b| b.state == "scheduled")
            .collect();
        scheduled.sort_by_key(|b| b.number);
        for b in scheduled.into_iter().take(AGENTS - self.running.len()) {
            let run_id = b.meta_data["run_id"].clone();
            let ms = (self.by_run[&run_id].run_secs * 1000.0) as i64;
            self.app.buildkite.start_eval(b.number);
            self.started.insert(run_id.clone(), now);
            self.running.push((b.number, run_id, now + ms));
            let app = self.app.clone();
            let number = b.number;
            self.tasks.spawn(async move {
                app.event("build.running", number).await;
            });
        }
    }

    /// Whether every run has ended and been reported.
    async fn all_reported(&self) -> bool {
        for run_id in self.by_run.keys() {
            let Some(job) = self.app.job(run_id).await else {
                return false;
            };
            if !job.state.is_terminal() || job.owes(Channel::Discord) {
                return false;
            }
        }
        true
    }
}

async fn start_stack(fair: bool, queue_timeout: &str) -> (Arc<Stack>, Clock) {
    let clock = Clock::scaled(SCALE);
    let limit = if fair { "2" } else { "0" };
    let vars = [
        ("USER_MAX_IN_FLIGHT", limit),
        ("QUEUE_TIMEOUT_SECS", queue_timeout),
    ];
    let app = Stack::spawn_on(
        StoreKind::Sqlite,
        &vars,
        Duration::from_secs(5),
        clock.clone(),
    )
    .await
    .expect("stack");
    for i in 0..AGENTS {
        app.buildkite
            .add_agent(&format!("h100-gpu{i}"), "h100", &[]);
    }
    app.buildkite.enforce_rate_limit(TOKEN_LIMIT);
    app.discord
        .enforce_rate_limit(DISCORD_CALLS, Duration::from_secs(2));
    (Arc::new(app), clock)
}

async fn run_side(fair: bool, queue_timeout: &str, arrivals: &[Arrival]) -> Side {
    let real = Instant::now();
    let (app, clock) = start_stack(fair, queue_timeout).await;
    let t0 = clock.now();
    let mut d = Driver {
        app: app.clone(),
        clock: clock.clone(),
        t0,
        by_run: arrivals
            .iter()
            .map(|a| (a.run_id.clone(), a.clone()))
            .collect(),
        running: Vec::new(),
        started: HashMap::new(),
        submitted: HashMap::new(),
        ended: HashMap::new(),
        tasks: JoinSet::new(),
    };
    let (mut next, mut next_sweep, mut ticks) = (0, SWEEP_SECS, 0u64);
    let mut sweeping: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        let now = clock.now();
        while next < arrivals.len() && arrivals[next].at <= d.sim(now) {
            d.submit(&arrivals[next]);
            next += 1;
        }
        d.finish_due(now);
        d.start_free(now);
        if d.sim(now) >= next_sweep && sweeping.as_ref().is_none_or(|s| s.is_finished()) {
            next_sweep += SWEEP_SECS;
            let app = app.clone();
            sweeping = Some(tokio::spawn(async move {
                let _ = app.sweep().await;
            }));
        }
        while d.tasks.try_join_next().is_some() {}
        ticks += 1;
        let quiet = next == arrivals.len() && d.running.is_empty();
        if (quiet && ticks % 25 == 0 && d.all_reported().await) || d.sim(now) > GIVE_UP_SECS {
            break;
        }
        tokio::time::sleep(TICK).await;
    }
    while d.tasks.join_next().await.is_some() {}
    measure(&d, real).await
}

async fn measure(d: &Driver, real: Instant) -> Side {
    let app = &d.app;
    let mut side = Side {
        span: d.sim(d.clock.now()),
        real_secs: real.elapsed().as_secs_f64(),
        ..Side::default()
    };
    for (run_id, a) in &d.by_run {
        let job = app.job(run_id).await;
        let passed = job.as_ref().is_some_and(|j| {
            j.state == JobState::Finished
                && !j.owes(Channel::Discord)
                && j.outcome
                    .as_ref()
                    .is_some_and(|o| o.verdict == Verdict::Passed)
        });
        side.lost += usize::from(!passed);
        if !passed {
            *side.endings.entry(ending(job.as_ref())).or_default() += 1;
        }
        if let (Some(s), Some(t)) = (d.started.get(run_id), d.submitted.get(run_id)) {
            side.waits.insert(run_id.clone(), (s - t) as f64 / 1000.0);
        }
        if let (Some(job), Some(end)) = (&job, d.ended.get(run_id)) {
            side.to_record.push((job.updated_at - end) as f64 / 1000.0);
            if a.user == "heavy" {
                side.heavy_done_at = side.heavy_done_at.max(d.sim(job.updated_at));
            }
        }
    }
    let mut runs: Vec<String> = app
        .buildkite
        .builds()
        .into_iter()
        .map(|b| b.meta_data["run_id"].clone())
        .collect();
    let builds = runs.len();
    runs.sort();
    runs.dedup();
    side.built_twice = builds - runs.len();
    side.bk_calls = app.buildkite.api_calls().len();
    side.bk_windows = app.buildkite.rate_limit_windows();
    side.bk_429 = app.buildkite.rate_limited_calls();
    side.discord_calls = app.discord_calls().len();
    (side.discord_429, side.discord_busiest) = app.discord.rate_limit_seen();
    for (m, _) in app.metric("WebhookRequests") {
        let outcome = m["Outcome"].as_str().unwrap_or("unnamed").to_owned();
        *side.webhooks.entry(outcome).or_default() += 1;
    }
    side
}

/// How a run that did not pass ended, in a few words.
fn ending(job: Option<&Job>) -> String {
    let Some(j) = job else {
        return "no job".into();
    };
    let why = j
        .failure
        .clone()
        .or_else(|| j.outcome.as_ref().and_then(|o| o.error.clone()))
        .unwrap_or_default();
    let owes = if j.owes(Channel::Discord) {
        ", report owed"
    } else {
        ""
    };
    format!(
        "{:?}{owes}: {}",
        j.state,
        why.chars().take(80).collect::<String>()
    )
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Waits of `who`'s runs (`None`: the light users together), sorted.
fn waits_of(side: &Side, arrivals: &[Arrival], who: Option<&str>) -> Vec<f64> {
    sorted(
        arrivals
            .iter()
            .filter(|a| match who {
                Some(u) => a.user == u,
                None => a.user != "heavy",
            })
            .filter_map(|a| side.waits.get(&a.run_id).copied())
            .collect(),
    )
}

fn report(arrivals: &[Arrival], fair: &Side, fcfs: &Side) {
    println!(
        "One run: {SUBMISSIONS} submissions, {} users, {AGENTS} GPUs, ×{SCALE} clock; \
         fair share took {:.0} s real, first come first served {:.0} s.\n",
        LIGHT_USERS + 1,
        fair.real_secs,
        fcfs.real_secs
    );
    for (name, side) in [("fair share", fair), ("first come, first served", fcfs)] {
        for (ending, n) in &side.endings {
            println!("{name}: {n} did not pass: {ending}");
        }
    }
    waits_table(arrivals, fair, fcfs);
    limits_table(fair, fcfs);
    ceiling_table(fair, fcfs);
}

fn waits_table(arrivals: &[Arrival], fair: &Side, fcfs: &Side) {
    println!("| wait for a GPU (simulated s) | fair share | first come, first served | ratio |");
    println!("|---|---|---|---|");
    let light = (
        waits_of(fair, arrivals, None),
        waits_of(fcfs, arrivals, None),
    );
    let heavy = (
        waits_of(fair, arrivals, Some("heavy")),
        waits_of(fcfs, arrivals, Some("heavy")),
    );
    let row = |name: &str, a: f64, b: f64| {
        println!("| {name} | {a:.0} | {b:.0} | {:.2} |", a / b);
    };
    row(
        "light users, median",
        quantile(&light.0, 0.5),
        quantile(&light.1, 0.5),
    );
    row(
        "light users, p95",
        quantile(&light.0, 0.95),
        quantile(&light.1, 0.95),
    );
    row(
        "light users, worst",
        quantile(&light.0, 1.0),
        quantile(&light.1, 1.0),
    );
    row(
        "heavy user, median",
        quantile(&heavy.0, 0.5),
        quantile(&heavy.1, 0.5),
    );
    row(
        "heavy user, p95",
        quantile(&heavy.0, 0.95),
        quantile(&heavy.1, 0.95),
    );
    let per_user = |side: &Side| -> (f64, f64) {
        let users: Vec<String> = (0..LIGHT_USERS).map(|u| format!("light{u:02}")).collect();
        let p95s = sorted(
            users
                .iter()
                .map(|u| quantile(&waits_of(side, arrivals, Some(u)), 0.95))
                .collect(),
        );
        (quantile(&p95s, 0.5), quantile(&p95s, 1.0))
    };
    let (a, b) = (per_user(fair), per_user(fcfs));
    row("light users' own p95, median user", a.0, b.0);
    row("light users' own p95, worst user", a.1, b.1);
    let heavy_rate = |s: &Side| HEAVY as f64 / s.heavy_done_at * 3600.0;
    println!(
        "| heavy user's throughput (runs reported an hour) | {:.0} | {:.0} | {:.2} |\n",
        heavy_rate(fair),
        heavy_rate(fcfs),
        heavy_rate(fair) / heavy_rate(fcfs)
    );
}

/// The limits table's rows for one side.
fn limit_rows(s: &Side) -> Vec<(&'static str, String)> {
    let per_job = |n: usize| format!("{:.2}", n as f64 / SUBMISSIONS as f64);
    let t = sorted(s.to_record.clone());
    vec![
        ("Buildkite calls per job", per_job(s.bk_calls)),
        (
            "Buildkite calls, busiest minute (limit 50)",
            s.bk_windows.iter().max().copied().unwrap_or(0).to_string(),
        ),
        (
            "Buildkite calls, mean per minute",
            format!("{:.1}", s.bk_calls as f64 / (s.span / 60.0)),
        ),
        ("Buildkite 429s", s.bk_429.to_string()),
        ("Discord calls per job", per_job(s.discord_calls)),
        (
            "Discord calls, busiest 2 s of the webhook (limit 5)",
            s.discord_busiest.to_string(),
        ),
        ("Discord 429s", s.discord_429.to_string()),
        (
            "build end → reported, median / p95 (s)",
            format!("{:.1} / {:.1}", quantile(&t, 0.5), quantile(&t, 0.95)),
        ),
        (
            "jobs lost / built twice",
            format!("{} / {}", s.lost, s.built_twice),
        ),
        (
            "last run reported (simulated min)",
            format!("{:.1}", s.span / 60.0),
        ),
        (
            "webhooks refused / answered 5xx",
            format!(
                "{} / {}",
                s.webhooks.get("refused").copied().unwrap_or(0),
                s.webhooks.get("error").copied().unwrap_or(0)
            ),
        ),
    ]
}

fn limits_table(fair: &Side, fcfs: &Side) {
    println!("| within the limits | fair share | first come, first served |");
    println!("|---|---|---|");
    for ((name, a), (_, b)) in limit_rows(fair).into_iter().zip(limit_rows(fcfs)) {
        println!("| {name} | {a} | {b} |");
    }
    println!();
}

/// Jobs an hour one token sustains, from the calls per job measured above, against what 8
/// GPUs can run; and the seeds' polling launcher at the same run times (create, a GET every
/// 10 s from creation to the end, the artifact list and the download).
fn ceiling_table(fair: &Side, fcfs: &Side) {
    let per_hour = |calls_per_job: f64| f64::from(TOKEN_LIMIT) * 60.0 / calls_per_job;
    let gpus = AGENTS as f64 * 3600.0 / RUN_SECS;
    let polling = 1.0 + (RUN_SECS / 10.0).ceil() + 1.0 + 2.0;
    println!(
        "| throughput ceiling at {RUN_SECS:.0} s runs | calls per job | jobs an hour, one token | GPUs ({AGENTS}) | bound by |"
    );
    println!("|---|---|---|---|---|");
    for (name, calls) in [
        (
            "events, fair share (measured)",
            fair.bk_calls as f64 / SUBMISSIONS as f64,
        ),
        (
            "events, first come first served (measured)",
            fcfs.bk_calls as f64 / SUBMISSIONS as f64,
        ),
        ("seeds' polling launcher, no queue wait (model)", polling),
    ] {
        let token = per_hour(calls);
        let bound = if token < gpus {
            "the token's quota"
        } else {
            "the GPUs"
        };
        println!("| {name} | {calls:.2} | {token:.0} | {gpus:.0} | {bound} |");
    }
}
