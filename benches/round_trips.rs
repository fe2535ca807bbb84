//! Round trips on the critical paths: from the moment Buildkite sends an event (or, for the
//! sweep, from a pass's start) to the Discord message that shows it, with Buildkite and
//! Discord stand-ins that wait a fixed delay before every answer. Round trips = time /
//! one round trip to the same stand-in, measured in the same run; medians over jobs.
//! Prints a Markdown table; `cargo bench --bench round_trips`.

use std::time::{Duration, Instant};

use kernelbot_dispatch::devstack::buildkite::sample_result;
use kernelbot_dispatch::devstack::stack::{BK_TOKEN, Stack, StoreKind, submission};
use reqwest::StatusCode;

/// What every stand-in answer waits: far above the local work on each path.
const DELAY: Duration = Duration::from_millis(100);
const JOBS: usize = 15;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

/// One plain round trip to the delayed Buildkite stand-in: the unit of the table.
async fn one_round_trip(app: &Stack) -> Duration {
    let url = format!(
        "{}/organizations/{}/pipelines/{}/builds/1",
        app.buildkite.api_url, app.buildkite.org, app.buildkite.pipeline
    );
    let client = reqwest::Client::new();
    let mut samples = Vec::new();
    for _ in 0..JOBS {
        let started = Instant::now();
        let answer = client.get(&url).bearer_auth(BK_TOKEN).send().await;
        assert!(answer.is_ok_and(|a| a.status().is_success()));
        samples.push(started.elapsed());
    }
    median(samples)
}

/// The time `event` on build `number` takes to answer: the webhook answers once the job's
/// message shows the event.
async fn timed_event(app: &Stack, event: &str, number: u64) -> Duration {
    let started = Instant::now();
    assert_eq!(app.event(event, number).await, Some(StatusCode::OK));
    started.elapsed()
}

/// Build `number` ends as the agent leaves it: `result.json` uploaded, the build passed.
fn passed_with_result(app: &Stack, number: u64) {
    let result = sample_result(false);
    app.buildkite
        .upload(number, "result.json", result, "finished", false);
    app.buildkite.set_state(number, "passed");
}

/// A job submitted and its build created, undelayed; its build's number.
async fn submitted(app: &Stack, run_id: &str) -> u64 {
    app.buildkite.set_delay(None);
    app.discord.set_delay(None);
    let (status, body) = app
        .submit(&submission(run_id))
        .await
        .expect("submit answers");
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let number = body["build"]["number"].as_u64().expect("a build");
    assert_eq!(
        app.event("build.scheduled", number).await,
        Some(StatusCode::OK)
    );
    app.buildkite.set_delay(Some(DELAY));
    app.discord.set_delay(Some(DELAY));
    number
}

#[tokio::main]
async fn main() {
    let vars = [("SWEEP_MIN_AGE_SECS", "0")];
    let app = Stack::spawn_with(StoreKind::Sqlite, &vars)
        .await
        .expect("the local stack");
    let mut started = Vec::new();
    let mut finished = Vec::new();
    let mut ridden = Vec::new();
    let mut swept = Vec::new();
    for i in 0..JOBS {
        let number = submitted(&app, &format!("rt-{i}")).await;
        app.buildkite.start_eval(number);
        started.push(timed_event(&app, "job.started", number).await);
        passed_with_result(&app, number);
        finished.push(timed_event(&app, "build.finished", number).await);

        // A build whose result rides `build.finished` (the node's hook set it as meta-data,
        // its try's `job.finished` came first): the report needs only Discord.
        let number = submitted(&app, &format!("rt-ridden-{i}")).await;
        app.buildkite.start_eval(number);
        assert_eq!(app.event("job.started", number).await, Some(StatusCode::OK));
        let result = sample_result(false);
        let rode = app.end_riding(number, "h100-gpu0", "passed", &result);
        assert!(rode.await.is_some(), "the try ended");
        let reads = app.buildkite.api_calls().len();
        ridden.push(timed_event(&app, "build.finished", number).await);
        assert_eq!(app.buildkite.api_calls().len(), reads, "no Buildkite call");

        // A build whose `build.finished` never came: the next sweep pass finishes it.
        let number = submitted(&app, &format!("rt-lost-{i}")).await;
        app.buildkite.start_eval(number);
        assert_eq!(app.event("job.started", number).await, Some(StatusCode::OK));
        passed_with_result(&app, number);
        let pass = Instant::now();
        let report = app.sweep().await.expect("sweep pass");
        assert_eq!(report.finished, 1, "{report}");
        swept.push(pass.elapsed());
    }
    let unit = one_round_trip(&app).await;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "\nRound trips on the critical paths (stand-ins answering after {} ms; one round trip \
         measured at {:.1} ms; medians of {JOBS} jobs)\n",
        DELAY.as_millis(),
        ms(unit)
    );
    println!("| path | median time | round trips |");
    println!("|---|---|---|");
    for (path, samples) in [
        ("`job.started` → running edit", started),
        (
            "`build.finished` → final report (result read back)",
            finished,
        ),
        (
            "`build.finished` → final report (result rides the event)",
            ridden,
        ),
        (
            "sweep pass finishing a build whose webhook never came",
            swept,
        ),
    ] {
        let m = median(samples);
        println!(
            "| {path} | {:.1} ms | {:.2} |",
            ms(m),
            m.as_secs_f64() / unit.as_secs_f64()
        );
    }
}
