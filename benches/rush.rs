//! A deadline rush, fair share against first come, first served, and fair share with the
//! result read from the artifact (the finish path before it rode the event), in one run: 240
//! submissions in 10 simulated minutes from 30 users (one of them sends 100 in the first
//! two), on one queue of 8 GPUs whose runs take about 30 s, through the whole stack (submit,
//! webhook and sweep functions, the Buildkite and Discord stand-ins enforcing their limits)
//! on a clock that runs ×30. The same seeded arrivals and run times feed both sides. Prints
//! Markdown tables; `cargo bench --bench rush`. The rush's shape comes from `RUSH_AGENTS`,
//! `RUSH_SUBMISSIONS`, `RUSH_LIGHT_USERS`, `RUSH_HEAVY` and `RUSH_SEED` (defaults: the rush
//! above), and `RUSH_JSON=<path>` writes its summary there as well. `RUSH_RESUBMIT` (a
//! share, default 0.2) runs one more side: that share of the submissions send again the
//! code of an earlier one, with answers from earlier runs on (`RESULT_CACHE_SECS`), and it
//! reports the GPU-seconds saved against the fair-share side.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kernelbot_dispatch::devstack::buildkite::sample_result;
use kernelbot_dispatch::devstack::stack::{Stack, StoreKind, submission};
use kernelbot_dispatch::devstack::units::{CountingStore, Units};
use kernelbot_dispatch::jobs::{Channel, Job, JobState};
use kernelbot_dispatch::result::Verdict;
use kernelbot_dispatch::time::Clock;
use tokio::task::JoinSet;

/// Simulated seconds per real second. Real work is not scaled: a call's 10 ms count 0.3 s.
const SCALE: f64 = 30.0;
/// The heavy user's submissions all come in the first [`HEAVY_SECS`].
const HEAVY_SECS: f64 = 120.0;
/// Everyone else's arrive over the rush's 10 minutes.
const RUSH_SECS: f64 = 600.0;
/// Run times: 30 s ± 10 s (the sum of two uniform draws), seeded.
const RUN_SECS: f64 = 30.0;
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

/// The rush's shape: GPUs, submissions, light users, the heavy user's share, the seed.
#[derive(Clone, Copy, Debug)]
struct Params {
    agents: usize,
    submissions: usize,
    light_users: usize,
    heavy: usize,
    seed: u64,
    /// The share of submissions that send an earlier one's code again.
    resubmit: f64,
}

impl Params {
    fn from_env() -> Self {
        let number = |name: &str, default: u64| -> u64 {
            let Ok(text) = std::env::var(name) else {
                return default;
            };
            let parsed = match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
                None => text.replace('_', "").parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name} is a whole number, not {text:?}"))
        };
        let count = |name: &str, default: usize| number(name, default as u64) as usize;
        let p = Self {
            agents: count("RUSH_AGENTS", 8),
            submissions: count("RUSH_SUBMISSIONS", 240),
            light_users: count("RUSH_LIGHT_USERS", 29),
            heavy: count("RUSH_HEAVY", 100),
            seed: number("RUSH_SEED", 0x5eed_0033),
            resubmit: std::env::var("RUSH_RESUBMIT").map_or(0.2, |t| {
                t.parse()
                    .unwrap_or_else(|_| panic!("RUSH_RESUBMIT is a share, not {t:?}"))
            }),
        };
        assert!(p.agents > 0, "RUSH_AGENTS: at least one GPU");
        assert!(p.light_users > 0, "RUSH_LIGHT_USERS: at least one");
        assert!(
            p.heavy <= p.submissions,
            "RUSH_HEAVY: at most RUSH_SUBMISSIONS"
        );
        p
    }
}

/// The parameters of this run, read once.
fn params() -> Params {
    static PARAMS: OnceLock<Params> = OnceLock::new();
    *PARAMS.get_or_init(Params::from_env)
}

/// One submission: when (simulated seconds from the start), whose, and how long it runs.
#[derive(Clone, Debug)]
struct Arrival {
    at: f64,
    user: String,
    run_id: String,
    run_secs: f64,
    /// Which code it sends (the reuse side only): its own, or an earlier arrival's.
    code: usize,
}

fn arrivals() -> Vec<Arrival> {
    let p = params();
    let mut rng = fastrand::Rng::with_seed(p.seed);
    let mut all: Vec<Arrival> = (0..p.submissions)
        .map(|i| {
            let (user, span) = if i < p.heavy {
                ("heavy".to_owned(), HEAVY_SECS)
            } else {
                (format!("light{:02}", i % p.light_users), RUSH_SECS)
            };
            Arrival {
                at: rng.f64() * span,
                user,
                run_id: format!("rush-{i:03}"),
                run_secs: RUN_SECS + 10.0 * (rng.f64() + rng.f64() - 1.0),
                code: i,
            }
        })
        .collect();
    all.sort_by(|a, b| a.at.total_cmp(&b.at));
    // Drawn apart, so the arrivals above are the same whatever the share.
    let mut again = fastrand::Rng::with_seed(p.seed ^ 0xc0de);
    for i in 1..all.len() {
        if again.f64() < p.resubmit {
            all[i].code = all[again.usize(..i)].code;
        }
    }
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
    /// Of them, posts (first messages); the rest are edits.
    discord_posts: usize,
    discord_busiest: u32,
    discord_429: usize,
    /// What the functions' store calls would cost on DynamoDB.
    store_units: Units,
    /// The same by call and kind of item, largest read first.
    store_by_kind: Vec<(String, Units)>,
    lost: usize,
    /// How the runs that did not pass ended, and how many.
    endings: BTreeMap<String, usize>,
    built_twice: usize,
    /// GPU-seconds busy while any submitted run had not started, and the simulated seconds
    /// during which one had not: how busy fair share and the quota kept the GPUs. (A run
    /// that never starts counts as waiting until its side ends.)
    busy_while_waiting: f64,
    waiting_secs: f64,
    /// The webhook function's answers by outcome (`advanced`, `ignored`, `refused`, `error`…).
    webhooks: BTreeMap<String, usize>,
    real_secs: f64,
    /// Runs answered from an earlier run (no build), and the GPU-seconds their own runs
    /// would have taken; the GPU-seconds the runs that ran took.
    answered: usize,
    gpu_secs_saved: f64,
    gpu_secs_run: f64,
}

#[tokio::main]
async fn main() {
    // The functions' logs, when asked for (`RUST_LOG=warn`): what they gave up on, and why.
    if std::env::var_os("RUST_LOG").is_some() {
        kernelbot_dispatch::telemetry::init();
    }
    let arrivals = arrivals();
    // Today's finish path (the result read from the artifact), then the result riding the
    // event, each under fair share; then first come, first served on the event path.
    let artifact = run_side(true, false, RUSH_QUEUE_TIMEOUT, &arrivals).await;
    let fair = run_side(true, true, RUSH_QUEUE_TIMEOUT, &arrivals).await;
    let fcfs = run_side(false, true, RUSH_QUEUE_TIMEOUT, &arrivals).await;
    report(&arrivals, &fair, &fcfs, &artifact);
    let reuse = if params().resubmit > 0.0 {
        let side = run_reuse_side(&arrivals).await;
        reuse_table(&arrivals, &fair, &side);
        Some(side)
    } else {
        None
    };
    if let Some(path) = std::env::var_os("RUSH_JSON") {
        let summary = serde_json::json!({
            "params": {
                "agents": params().agents,
                "submissions": params().submissions,
                "light_users": params().light_users,
                "heavy": params().heavy,
                "seed": params().seed,
            },
            "fair_share": summary(&fair, &arrivals),
            "first_come": summary(&fcfs, &arrivals),
            "fair_share_artifact_path": summary(&artifact, &arrivals),
            "fair_share_with_resubmissions": reuse.as_ref().map(|r| reuse_summary(r, &fair, &arrivals)),
        });
        let text = serde_json::to_string_pretty(&summary).expect("a summary");
        std::fs::write(&path, text).expect("RUSH_JSON is writable");
    }
    for fair_share in [true, false] {
        let side = run_side(fair_share, true, DEFAULT_QUEUE_TIMEOUT, &arrivals).await;
        let name = if fair_share {
            "fair share"
        } else {
            "first come, first served"
        };
        println!(
            "\nAt the default queue timeout ({DEFAULT_QUEUE_TIMEOUT} s), {name}: {} of {} \
             did not pass; last run reported at {:.1} simulated min.",
            side.lost,
            arrivals.len(),
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
    /// Builds end as nodes end them now: the result rides `build.finished` (else it is only
    /// an artifact, as before).
    riding: bool,
    clock: Clock,
    t0: i64,
    by_run: HashMap<String, Arrival>,
    running: Vec<(u64, String, i64)>,
    started: HashMap<String, i64>,
    submitted: HashMap<String, i64>,
    ended: HashMap<String, i64>,
    tasks: JoinSet<()>,
    busy_while_waiting: f64,
    waiting_secs: f64,
    /// Each submission sends its arrival's `code` (the reuse side).
    distinct_code: bool,
    /// Runs answered at submission from an earlier run: they never wait for a GPU.
    answered: Arc<Mutex<HashSet<String>>>,
}

impl Driver {
    fn sim(&self, at: i64) -> f64 {
        (at - self.t0) as f64 / 1000.0
    }

    /// Notes `dt` simulated seconds of GPU use, when a submitted run was still waiting.
    fn note_busy(&mut self, dt: f64) {
        let answered = self.answered.lock().map_or(0, |a| a.len());
        if self.submitted.len() > self.started.len() + answered {
            self.waiting_secs += dt;
            self.busy_while_waiting += self.running.len() as f64 * dt;
        }
    }

    fn submit(&mut self, a: &Arrival) {
        let mut body = submission(&a.run_id);
        body["user"] = a.user.clone().into();
        if self.distinct_code {
            body["config"]["sources"]["eval.py"] = format!("print('hi')  # code {}", a.code).into();
        }
        self.submitted.insert(a.run_id.clone(), self.clock.now());
        let (app, answered, run_id) = (self.app.clone(), self.answered.clone(), a.run_id.clone());
        self.tasks.spawn(async move {
            let (status, answer) = app.submit(&body).await.expect("submit answered");
            assert_eq!(status.as_u16(), 202, "{answer}");
            if answer.get("cached_from").is_some()
                && let Ok(mut answered) = answered.lock()
            {
                answered.insert(run_id);
            }
        });
    }

    fn finish_due(&mut self, now: i64) {
        let (due, left): (Vec<_>, Vec<_>) = self.running.drain(..).partition(|r| r.2 <= now);
        self.running = left;
        let (riding, agents) = (self.riding, params().agents as u64);
        for (number, run_id, _) in due {
            self.ended.insert(run_id, now);
            let app = self.app.clone();
            self.tasks.spawn(async move {
                let result = sample_result(false);
                if riding {
                    let agent = format!("h100-gpu{}", number % agents);
                    app.finish_riding(number, &agent, "passed", &result).await;
                } else {
                    app.finish(number, "passed", Some(result)).await;
                }
            });
        }
    }

    fn start_free(&mut self, now: i64) {
        let agents = params().agents;
        if self.running.len() >= agents {
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
        for b in scheduled.into_iter().take(agents - self.running.len()) {
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

async fn start_stack(
    fair: bool,
    queue_timeout: &str,
    reuse: bool,
) -> (Arc<Stack>, Clock, Arc<CountingStore>) {
    let clock = Clock::scaled(SCALE);
    let limit = if fair { "2" } else { "0" };
    let vars = [
        ("RESULT_CACHE_SECS", if reuse { "86400" } else { "0" }),
        ("USER_MAX_IN_FLIGHT", limit),
        // The heavy user's 100 all wait their turn, as in every run above (the default
        // refuses those past 20 waiting: a different rush).
        ("USER_MAX_WAITING", "0"),
        ("QUEUE_TIMEOUT_SECS", queue_timeout),
    ];
    let (app, counted) = Stack::spawn_counted(
        StoreKind::Sqlite,
        &vars,
        Duration::from_secs(5),
        clock.clone(),
    )
    .await
    .expect("stack");
    for i in 0..params().agents {
        app.buildkite
            .add_agent(&format!("h100-gpu{i}"), "h100", &[]);
    }
    app.buildkite.enforce_rate_limit(TOKEN_LIMIT);
    app.discord
        .enforce_rate_limit(DISCORD_CALLS, Duration::from_secs(2));
    (Arc::new(app), clock, counted)
}

async fn run_side(fair: bool, riding: bool, queue_timeout: &str, arrivals: &[Arrival]) -> Side {
    drive((fair, riding, false), queue_timeout, arrivals).await
}

/// Fair share on the event path, each arrival sending its `code`, answers from earlier runs
/// on.
async fn run_reuse_side(arrivals: &[Arrival]) -> Side {
    drive((true, true, true), RUSH_QUEUE_TIMEOUT, arrivals).await
}

async fn drive(
    (fair, riding, reuse): (bool, bool, bool),
    queue_timeout: &str,
    arrivals: &[Arrival],
) -> Side {
    let real = Instant::now();
    let (app, clock, counted) = start_stack(fair, queue_timeout, reuse).await;
    let mut d = Driver::new(app.clone(), riding, clock.clone(), arrivals);
    d.distinct_code = reuse;
    let (mut next, mut next_sweep, mut ticks) = (0, SWEEP_SECS, 0u64);
    let mut last = 0.0;
    let mut sweeping: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        let now = clock.now();
        d.note_busy(d.sim(now) - last);
        last = d.sim(now);
        while next < arrivals.len() && arrivals[next].at <= d.sim(now) {
            d.submit(&arrivals[next]);
            next += 1;
        }
        d.finish_due(now);
        d.start_free(now);
        if d.sim(now) >= next_sweep && sweeping.as_ref().is_none_or(|s| s.is_finished()) {
            next_sweep += SWEEP_SECS;
            let app = app.clone();
            let at = d.sim(now);
            sweeping = Some(tokio::spawn(async move {
                let report = app.sweep().await;
                // What each pass did, beside the functions' logs when they are asked for.
                if std::env::var_os("RUST_LOG").is_some() {
                    eprintln!("sweep pass at {at:.0} simulated s: {report:?}");
                }
            }));
        }
        // A driver's task that failed (a submission refused) fails the benchmark, loudly.
        while let Some(done) = d.tasks.try_join_next() {
            done.expect("a submission or build end of the driver");
        }
        ticks += 1;
        let quiet = next == arrivals.len() && d.running.is_empty();
        if (quiet && ticks % 25 == 0 && d.all_reported().await) || d.sim(now) > GIVE_UP_SECS {
            break;
        }
        tokio::time::sleep(TICK).await;
    }
    while let Some(done) = d.tasks.join_next().await {
        done.expect("a submission or build end of the driver");
    }
    // Counted before the benchmark's own reads of the jobs.
    let (units, by_kind) = (counted.units(), counted.units_by_kind());
    let mut side = measure(&d, real).await;
    side.store_units = units;
    side.store_by_kind = by_kind;
    side
}

impl Driver {
    /// A driver of `arrivals` on `app`, its clock starting now.
    fn new(app: Arc<Stack>, riding: bool, clock: Clock, arrivals: &[Arrival]) -> Self {
        Self {
            app,
            riding,
            t0: clock.now(),
            clock,
            by_run: arrivals
                .iter()
                .map(|a| (a.run_id.clone(), a.clone()))
                .collect(),
            running: Vec::new(),
            started: HashMap::new(),
            submitted: HashMap::new(),
            ended: HashMap::new(),
            tasks: JoinSet::new(),
            busy_while_waiting: 0.0,
            waiting_secs: 0.0,
            distinct_code: false,
            answered: Arc::default(),
        }
    }
}

async fn measure(d: &Driver, real: Instant) -> Side {
    let app = &d.app;
    let mut side = Side {
        span: d.sim(d.clock.now()),
        real_secs: real.elapsed().as_secs_f64(),
        busy_while_waiting: d.busy_while_waiting,
        waiting_secs: d.waiting_secs,
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
            side.gpu_secs_run += a.run_secs;
        }
        if job.as_ref().is_some_and(|j| j.cached_from.is_some()) {
            side.answered += 1;
            side.gpu_secs_saved += a.run_secs;
            // Answered at once: no wait for a GPU.
            side.waits.insert(run_id.clone(), 0.0);
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
    side.discord_posts = app
        .discord_calls()
        .iter()
        .filter(|c| c.method == "POST")
        .count();
    (side.discord_429, side.discord_busiest) = app.discord.rate_limit_seen();
    for (m, _) in app.metric("WebhookRequests") {
        let outcome = m["Outcome"].as_str().unwrap_or("unnamed").to_owned();
        *side.webhooks.entry(outcome).or_default() += 1;
    }
    side
}

impl Side {
    /// The share of the GPUs' time they were busy while a run waited (1: never idle then).
    fn busy_share(&self) -> f64 {
        self.busy_while_waiting
            / (params().agents as f64 * self.waiting_secs).max(f64::MIN_POSITIVE)
    }
}

/// One side's summary as `RUSH_JSON` writes it.
fn summary(side: &Side, arrivals: &[Arrival]) -> serde_json::Value {
    let jobs = arrivals.len() as f64;
    let reported = sorted(side.to_record.clone());
    serde_json::json!({
        "jobs": arrivals.len(),
        "lost": side.lost,
        "built_twice": side.built_twice,
        "rest_calls_per_job": side.bk_calls as f64 / jobs,
        "rest_429s": side.bk_429,
        "discord_calls_per_job": side.discord_calls as f64 / jobs,
        "discord_429s": side.discord_429,
        "discord_posts_per_job": side.discord_posts as f64 / jobs,
        "gpu_busy_while_waiting": side.busy_share(),
        "report_latency_p95_s": quantile(&reported, 0.95),
        "light_p95_wait_s": quantile(&waits_of(side, arrivals, None), 0.95),
        "last_reported_s": side.span,
        "store_read_units_per_job": side.store_units.read / jobs,
        "store_write_units_per_job": side.store_units.write / jobs,
        "store_units_per_job_by_call": side.store_by_kind.iter().map(|(kind, u)| {
            (kind.clone(), serde_json::json!({
                "read": u.read / jobs,
                "write": u.write / jobs,
                "calls": u.calls as f64 / jobs,
            }))
        }).collect::<serde_json::Map<_, _>>(),
    })
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

fn report(arrivals: &[Arrival], fair: &Side, fcfs: &Side, artifact: &Side) {
    let p = params();
    println!(
        "One run: {} submissions, {} users, {} GPUs, ×{SCALE} clock, seed {:#x}; \
         fair share took {:.0} s real, first come first served {:.0} s, fair share on the \
         artifact path {:.0} s.\n",
        p.submissions,
        p.light_users + 1,
        p.agents,
        p.seed,
        fair.real_secs,
        fcfs.real_secs,
        artifact.real_secs
    );
    let sides = [
        ("fair share", fair),
        ("first come, first served", fcfs),
        ("fair share, artifact path", artifact),
    ];
    for (name, side) in sides {
        for (ending, n) in &side.endings {
            println!("{name}: {n} did not pass: {ending}");
        }
    }
    waits_table(arrivals, fair, fcfs);
    limits_table(fair, fcfs, artifact);
    units_table(fair);
    ceiling_table(fair, fcfs, artifact);
}

/// The reuse side's summary, with the fair-share side's GPU-seconds as its baseline.
fn reuse_summary(reuse: &Side, fair: &Side, arrivals: &[Arrival]) -> serde_json::Value {
    let mut s = summary(reuse, arrivals);
    s["resubmit_share"] = params().resubmit.into();
    s["answered"] = reuse.answered.into();
    s["gpu_secs_run"] = reuse.gpu_secs_run.into();
    s["gpu_secs_saved"] = reuse.gpu_secs_saved.into();
    s["gpu_secs_run_without_answers"] = fair.gpu_secs_run.into();
    s
}

/// What answers from earlier runs save, against fair share on the same arrivals.
fn reuse_table(arrivals: &[Arrival], fair: &Side, reuse: &Side) {
    let light = |s: &Side| quantile(&waits_of(s, arrivals, None), 0.95);
    let resent = arrivals
        .iter()
        .enumerate()
        .filter(|(i, a)| arrivals[..*i].iter().any(|b| b.code == a.code))
        .count();
    println!(
        "\nWith {:.0} % of submissions sending an earlier one's code again ({resent} of {}), \
         answers from earlier runs on:\n",
        params().resubmit * 100.0,
        arrivals.len()
    );
    println!("| | fair share | with resubmissions answered | ratio |");
    println!("|---|---|---|---|");
    let row = |name: &str, a: f64, b: f64| {
        println!(
            "| {name} | {a:.0} | {b:.0} | {:.2} |",
            b / a.max(f64::MIN_POSITIVE)
        );
    };
    row("GPU-seconds run", fair.gpu_secs_run, reuse.gpu_secs_run);
    row("light users' p95 wait (s)", light(fair), light(reuse));
    row("last run reported (s)", fair.span, reuse.span);
    println!(
        "| runs answered, no build | 0 | {} | |\n| GPU-seconds saved | 0 | {:.0} | |\n| lost | {} | {} | |\n",
        reuse.answered, reuse.gpu_secs_saved, fair.lost, reuse.lost
    );
}

/// Where fair share's store units go: by call and kind of item, per job.
fn units_table(fair: &Side) {
    println!("| fair share's store units per job, by call | read | write | calls |");
    println!("|---|---|---|---|");
    let jobs = params().submissions as f64;
    for (kind, u) in &fair.store_by_kind {
        println!(
            "| {kind} | {:.2} | {:.2} | {:.2} |",
            u.read / jobs,
            u.write / jobs,
            u.calls as f64 / jobs
        );
    }
    println!();
}

/// Each light user's own p95 wait: the median user's and the worst.
fn light_users_p95s(side: &Side, arrivals: &[Arrival]) -> (f64, f64) {
    let users: Vec<String> = (0..params().light_users)
        .map(|u| format!("light{u:02}"))
        .collect();
    let p95s = sorted(
        users
            .iter()
            .map(|u| quantile(&waits_of(side, arrivals, Some(u)), 0.95))
            .collect(),
    );
    (quantile(&p95s, 0.5), quantile(&p95s, 1.0))
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
    let (a, b) = (
        light_users_p95s(fair, arrivals),
        light_users_p95s(fcfs, arrivals),
    );
    row("light users' own p95, median user", a.0, b.0);
    row("light users' own p95, worst user", a.1, b.1);
    let heavy_rate = |s: &Side| params().heavy as f64 / s.heavy_done_at * 3600.0;
    println!(
        "| heavy user's throughput (runs reported an hour) | {:.0} | {:.0} | {:.2} |\n",
        heavy_rate(fair),
        heavy_rate(fcfs),
        heavy_rate(fair) / heavy_rate(fcfs)
    );
}

/// The limits table's rows for one side.
fn limit_rows(s: &Side) -> Vec<(&'static str, String)> {
    let per_job = |n: usize| format!("{:.2}", n as f64 / params().submissions as f64);
    let mut rows = vec![
        (
            "GPUs busy while a run waited (share of GPU time)",
            format!("{:.2}", s.busy_share()),
        ),
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
            "Discord posts / edits per job",
            format!(
                "{} / {}",
                per_job(s.discord_posts),
                per_job(s.discord_calls - s.discord_posts)
            ),
        ),
        (
            "Discord calls, busiest 2 s of the webhook (limit 5)",
            s.discord_busiest.to_string(),
        ),
        ("Discord 429s", s.discord_429.to_string()),
        (
            "store read / write units per job (as DynamoDB bills them)",
            format!(
                "{:.1} / {:.1}",
                s.store_units.read / params().submissions as f64,
                s.store_units.write / params().submissions as f64
            ),
        ),
    ];
    rows.extend(outcome_rows(s));
    rows
}

/// The limits table's rows of what the side's jobs came to.
fn outcome_rows(s: &Side) -> Vec<(&'static str, String)> {
    let t = sorted(s.to_record.clone());
    vec![
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

fn limits_table(fair: &Side, fcfs: &Side, artifact: &Side) {
    println!(
        "| within the limits | fair share | first come, first served | fair share, artifact path |"
    );
    println!("|---|---|---|---|");
    let rows = limit_rows(fair)
        .into_iter()
        .zip(limit_rows(fcfs))
        .zip(limit_rows(artifact));
    for (((name, a), (_, b)), (_, c)) in rows {
        println!("| {name} | {a} | {b} | {c} |");
    }
    println!();
}

/// Jobs an hour one token sustains, from the calls per job measured above, against what 8
/// GPUs can run; and the seeds' polling launcher at the same run times (create, a GET every
/// 10 s from creation to the end, the artifact list and the download).
fn ceiling_table(fair: &Side, fcfs: &Side, artifact: &Side) {
    let per_hour = |calls_per_job: f64| f64::from(TOKEN_LIMIT) * 60.0 / calls_per_job;
    let agents = params().agents;
    let submissions = params().submissions as f64;
    let gpus = agents as f64 * 3600.0 / RUN_SECS;
    let polling = 1.0 + (RUN_SECS / 10.0).ceil() + 1.0 + 2.0;
    println!(
        "| throughput ceiling at {RUN_SECS:.0} s runs | calls per job | jobs an hour, one token | GPUs ({agents}) | bound by |"
    );
    println!("|---|---|---|---|---|");
    for (name, calls) in [
        (
            "events, fair share (measured)",
            fair.bk_calls as f64 / submissions,
        ),
        (
            "events, first come first served (measured)",
            fcfs.bk_calls as f64 / submissions,
        ),
        (
            "events, fair share, result read from the artifact (measured)",
            artifact.bk_calls as f64 / submissions,
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
