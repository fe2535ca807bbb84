//! A busy competition's backlog: a receiver that hangs holds back only its own jobs, and
//! every owed report is tried within a bounded number of passes (what a pass holds in
//! memory meanwhile: `sweep_memory`).

use std::time::Duration;

use crate::support::{HOOK_URL, StoreKind, TestApp, submission};
use kernelbot_dispatch::devstack::discord::Outage;
use kernelbot_dispatch::flow::sweep::{self, PASS_RESERVE, SweepReport};
use kernelbot_dispatch::jobs::{
    Channel, Cursor, Job, JobState, Target, Transition, WebhookAddress,
};
use kernelbot_dispatch::result::{FullResult, Outcome};
use kernelbot_dispatch::retry::Deadline;
use serde_json::{Value, json};

/// The webhook of [`HOOK_URL`], and a second one.
const HOOK_ID: &str = "111111111111111111";
const OTHER_ID: &str = "222222222222222222";
const OTHER_URL: &str = "https://discord.com/api/webhooks/222222222222222222/hook-token_2";
const CALLBACKS: &[(&str, &str)] = &[("CALLBACK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")];

fn to_webhook(run_id: &str, url: &str) -> Value {
    let mut body = submission(run_id);
    body["discord"] = json!({ "webhook_url": url });
    body
}

/// One pass that starts new work for `starting` (then lets what it started end).
async fn pass(app: &TestApp, starting: Duration) -> SweepReport {
    let deadline = Deadline::after(PASS_RESERVE + starting);
    let report = sweep::sweep(&app.sweeper, deadline).await;
    report.expect("the pass completes")
}

/// How long a pass of the hung-receiver test starts new work.
const STARTING: Duration = Duration::from_secs(8);

fn tries(job: &Job) -> u32 {
    job.delivery(Channel::Discord).map_or(0, |d| d.attempts)
}

/// The Discord tries of each of `runs` so far.
async fn all_tries(app: &TestApp, runs: &[String]) -> Vec<u32> {
    let mut all = Vec::new();
    for run in runs {
        all.push(tries(&app.job(run).await));
    }
    all
}

/// While one Discord webhook hangs, the reports of another go out in the same pass, and the
/// callbacks too once their receiver answers; while the receiver hangs, Discord reports are
/// not held back either.
async fn a_hung_receiver_holds_back_only_its_own_jobs(kind: StoreKind) {
    let app = TestApp::spawn_tuned(kind, CALLBACKS, Duration::from_millis(200)).await;
    // Interleaved, so a pass that walked one job at a time would meet a hung one first.
    let runs: Vec<(String, bool)> = (0..8).map(|i| (format!("r{i}"), i % 2 == 0)).collect();
    app.receiver.set_delay(Some(Duration::from_secs(30)));
    for (run, hung) in &runs {
        let url = if *hung { HOOK_URL } else { OTHER_URL };
        app.submit(&to_webhook(run, url)).await;
    }
    // The evaluations start while both webhooks fail: each status message owes an edit
    // (retried, as an edit is, until its slice of the pass ends), and every callback is owed.
    app.discord.outage(HOOK_ID, Some(Outage::Answers(503)));
    app.discord.outage(OTHER_ID, Some(Outage::Answers(503)));
    for number in 1..=runs.len() as u64 {
        app.buildkite.start_eval(number);
        app.event("job.started", number).await;
    }
    app.discord.outage(HOOK_ID, Some(Outage::Hung));
    app.discord.outage(OTHER_ID, None);

    // Each job is tried once a pass, so a longer window adds no tries: it only leaves time
    // for a cold moto server's first answers (this test is the suite's first on it).
    pass(&app, STARTING).await;
    for (run, hung) in &runs {
        let job = app.job(run).await;
        assert_eq!(job.state, JobState::Running, "{run}");
        assert_eq!(job.owes(Channel::Discord), *hung, "{run}: {job:?}");
        assert!(job.owes(Channel::Callback), "{run}: the receiver hangs");
    }

    app.receiver.set_delay(None);
    pass(&app, STARTING).await;
    for (run, hung) in &runs {
        let job = app.job(run).await;
        assert!(!job.owes(Channel::Callback), "{run}: {job:?}");
        assert_eq!(job.owes(Channel::Discord), *hung, "{run}");
    }
}

/// A backlog on a hung webhook is worked through from where each pass stopped: no report
/// waits behind others that keep failing.
async fn every_owed_report_is_tried_within_a_bounded_number_of_passes(kind: StoreKind) {
    let app = TestApp::spawn_tuned(kind, &[], Duration::from_millis(200)).await;
    app.discord.outage(HOOK_ID, Some(Outage::Answers(503)));
    let runs: Vec<String> = (0..24).map(|i| format!("r{i:02}")).collect();
    for run in &runs {
        app.submit(&submission(run)).await;
    }
    app.discord.outage(HOOK_ID, Some(Outage::Hung));
    let before = all_tries(&app, &runs).await;
    // A receiver's lane has two sends in flight, so each pass that starts any tries at
    // least two of its reports: 24 need 12 such passes at most. On a loaded machine a
    // pass's second may go to the store before any send starts: a few such are not counted
    // (a pass that never sends while reports are owed still fails here).
    let (mut seen, mut working, mut idle) = (before.clone(), 0, 0);
    while working < 12 && idle < 4 {
        pass(&app, Duration::from_secs(1)).await;
        let now = all_tries(&app, &runs).await;
        if now == seen {
            idle += 1;
        } else {
            working += 1;
        }
        seen = now;
    }
    for (run, tried) in runs.iter().zip(before) {
        let job = app.job(run).await;
        assert!(
            tries(&job) > tried,
            "{run} was never tried in {working} passes that sent and {idle} that did not: {job:?}"
        );
        assert!(job.owes(Channel::Discord));
    }
}

/// A finished job owing its report to webhook `webhook_id`, as a long outage leaves it.
fn owing_report(i: usize, webhook_id: &str, created_at: i64) -> Job {
    let target = Target::Webhook(WebhookAddress {
        webhook_id: webhook_id.into(),
        token: "hook-token".into(),
        thread_id: None,
    });
    let job = Job::new(
        format!("owed-{i:05}").parse().expect("run id"),
        "H100_BK".into(),
        "h100".into(),
        Some("vectoradd".into()),
        Some(target),
        created_at,
    );
    let outcome = Outcome::judge("passed", Some(FullResult::default()), None);
    let t = Transition::to(JobState::Finished, created_at).with_outcome(outcome);
    job.apply(&t).expect("it finishes")
}

/// More reports owed to a hung webhook than one listing holds, and a few to another webhook
/// after them: the pass lists on while its lanes have room, so those few are tried at once,
/// and the next pass goes on with the hung webhook's where it stopped.
async fn a_long_backlog_on_a_hung_webhook_keeps_nobody_after_it_waiting(kind: StoreKind) {
    let app = TestApp::spawn_tuned(kind, &[], Duration::from_millis(200)).await;
    app.discord.outage(HOOK_ID, Some(Outage::Hung));
    app.discord.outage(OTHER_ID, Some(Outage::Answers(503)));
    let (hung, after) = (sweep::SWEEP_BATCH + 50, 5);
    let now = app.clock.now();
    for i in 0..hung + after {
        let webhook = if i < hung { HOOK_ID } else { OTHER_ID };
        let job = owing_report(i, webhook, now + i as i64);
        app.store.create(&job).await.expect("recorded");
    }
    // Time enough to list a thousand jobs, on moto too, and then some.
    pass(&app, Duration::from_secs(8)).await;
    for i in hung..hung + after {
        let job = app.job(&format!("owed-{i:05}")).await;
        assert!(
            tries(&job) > 0,
            "owed-{i:05} waited behind the hung webhook"
        );
    }
    let mark = app.store.cursor(Cursor::Outbox).await.expect("read");
    let mut first_untried = None;
    for i in 0..hung {
        if tries(&app.job(&format!("owed-{i:05}")).await) == 0 {
            first_untried = Some(i);
            break;
        }
    }
    let first_untried = first_untried.expect("the hung webhook holds the rest back");
    let expected = format!("{:020}:owed-{first_untried:05}", now + first_untried as i64);
    assert_eq!(
        mark,
        Some(expected),
        "the next pass goes on where this one stopped"
    );
}

on_both_stores!(
    a_hung_receiver_holds_back_only_its_own_jobs,
    every_owed_report_is_tried_within_a_bounded_number_of_passes,
    a_long_backlog_on_a_hung_webhook_keeps_nobody_after_it_waiting,
);
