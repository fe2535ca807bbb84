//! The operator's command (`kernelbot-dispatch`), on both stores: each command through the
//! library on the local stack (its clock, its stand-ins), and the binary itself on a store
//! of each kind, configured as the functions are.

use std::process::Command as Process;
use std::sync::Arc;
use std::time::Duration;

use kernelbot_dispatch::config::{Config, Role};
use kernelbot_dispatch::flow::Deps;

use kernelbot_dispatch::devstack::buildkite::{StepOutcome, StepRunner, sample_result};
use kernelbot_dispatch::devstack::stack::HOOK_URL;
use kernelbot_dispatch::jobs::{JobState, RunId};
use kernelbot_dispatch::ops::{Command, Confirm, OpsError, act};
use kernelbot_dispatch::result::Verdict;
use kernelbot_dispatch::retry::Deadline;
use serde_json::{Value, json};

use crate::support::{StoreKind, TestApp, submission};

const CALLBACK: (&str, &str) = ("CALLBACK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");

async fn run(app: &TestApp, command: Command) -> String {
    act(
        &app.sweeper,
        command,
        Deadline::after(Duration::from_secs(20)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

fn id(run_id: &str) -> RunId {
    run_id.parse().unwrap()
}

/// A submission that reports to the deployment's default Discord webhook.
fn to_default(run_id: &str) -> Value {
    let mut body = submission(run_id);
    body.as_object_mut().unwrap().remove("discord");
    body
}

/// The table's rows as (run id, state, queue, Discord) cells; the header checked.
fn rows(table: &str) -> Vec<Vec<String>> {
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap()
        .split("  ")
        .filter(|c| !c.is_empty())
        .collect();
    let header: Vec<&str> = header.iter().map(|c| c.trim()).collect();
    assert_eq!(
        header,
        [
            "RUN ID", "STATE", "QUEUE", "AGE", "BUILD", "DISCORD", "CALLBACK"
        ]
    );
    lines
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

fn run_ids(table: &str) -> Vec<String> {
    rows(table).into_iter().map(|r| r[0].clone()).collect()
}

async fn jobs_are_listed_by_state_queue_and_age(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("old-running")).await;
    app.buildkite.set_state(1, "running");
    app.event("job.started", 1).await;
    app.advance_clock(Duration::from_secs(3 * 3600));
    let mut other_queue = submission("young-mi300");
    other_queue["gpu"] = json!("MI300_BK");
    app.submit(&other_queue).await;
    // An ended job that owes nothing is not listed; one whose report Discord refuses is,
    // as owing it.
    app.submit(&submission("ended-done")).await;
    app.finish(3, "passed", Some(sample_result(false))).await;
    app.submit(&submission("ended-owing")).await;
    app.discord.fail_next(&[503; 8]);
    app.finish(4, "passed", Some(sample_result(false))).await;

    let list = |state, queue: Option<&str>, older_than| Command::Jobs {
        state,
        queue: queue.map(str::to_owned),
        older_than,
        json: false,
    };
    // The dashboard's jobs by verdict: each ended job counted once.
    let finished = app.metric("JobsFinished");
    assert_eq!(finished.len(), 2, "{finished:?}");
    assert!(
        finished
            .iter()
            .all(|(m, n)| m["Verdict"] == "passed" && *n == 1.0)
    );
    let all = run(&app, list(None, None, None)).await;
    assert_eq!(
        run_ids(&all),
        ["old-running", "young-mi300", "ended-owing"],
        "{all}"
    );
    let table = rows(&all);
    assert_eq!(table[0][1..3], ["running", "h100"]);
    assert_eq!(table[0][3..5], ["3h", "0m"], "age");
    assert_eq!(table[2][1], "finished");
    assert_eq!(table[2][table[2].len() - 2], "owed", "{all}");
    let running = run(&app, list(Some(JobState::Running), None, None)).await;
    assert_eq!(run_ids(&running), ["old-running"]);
    let mi300 = run(&app, list(None, Some("mi300"), None)).await;
    assert_eq!(run_ids(&mi300), ["young-mi300"]);
    let old = run(&app, list(None, None, Some(Duration::from_secs(3600)))).await;
    assert_eq!(run_ids(&old), ["old-running"]);
    let none = run(&app, list(Some(JobState::Failed), None, None)).await;
    assert_eq!(run_ids(&none), Vec::<String>::new());
    // `--json`: the same jobs, each as an object a script reads.
    let json = Command::Jobs {
        state: None,
        queue: None,
        older_than: None,
        json: true,
    };
    let listed: Vec<Value> = serde_json::from_str(&run(&app, json).await).unwrap();
    let ids: Vec<&str> = listed
        .iter()
        .map(|j| j["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["old-running", "young-mi300", "ended-owing"]);
    assert_eq!(listed[0]["state"], "running");
    assert_eq!(listed[0]["queue"], "h100");
    assert_eq!(listed[2]["discord"], "owed");
    assert_eq!(listed[2]["build"], 4);
    let created = listed[0]["created_at"].as_str().unwrap();
    assert!(humantime::parse_rfc3339_weak(created).is_ok(), "{created}");
}

async fn a_job_is_shown_without_its_secrets(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("shown")).await;
    app.finish(1, "failed", Some(sample_result(true))).await;
    let text = run(
        &app,
        Command::Show {
            run_id: id("shown"),
        },
    )
    .await;
    let view: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(view["state"], "finished");
    assert_eq!(view["queue"], "h100");
    assert_eq!(view["build"]["number"], 1);
    assert_eq!(view["verdict"], json!(Verdict::Failed));
    assert_eq!(view["discord"]["status"], "delivered");
    assert!(view["discord"]["message_id"].is_string(), "{view}");
    let token = HOOK_URL.rsplit('/').next().unwrap();
    assert!(!text.contains(token), "the webhook's token: {text}");
    let missing = act(
        &app.sweeper,
        Command::Show {
            run_id: id("nobody"),
        },
        deadline(),
    )
    .await;
    assert_eq!(missing.unwrap_err().to_string(), "no job nobody");
}

fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(20))
}

async fn resend_edits_the_same_message_and_calls_back_again(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[CALLBACK, ("DISCORD_WEBHOOK_URL", HOOK_URL)]).await;
    app.submit(&to_default("again")).await;
    app.finish(1, "passed", Some(sample_result(false))).await;
    let before = app.discord_calls();
    let message = before.last().unwrap().message_id.clone().expect("an edit");
    let called = |app: &TestApp| {
        let received = app.receiver.received();
        received
            .iter()
            .filter(|r| r.id == "msg_finished_again")
            .count()
    };
    assert_eq!(called(&app), 1);

    let said = run(
        &app,
        Command::Resend {
            run_id: id("again"),
        },
    )
    .await;
    assert_eq!(said, "again: Discord delivered, callback delivered");
    let after = app.discord_calls();
    assert_eq!(after.len(), before.len() + 1);
    let edit = after.last().unwrap();
    assert_eq!(
        (edit.method, edit.message_id.as_deref()),
        ("PATCH", Some(message.as_str()))
    );
    assert_eq!(called(&app), 2, "the same message id: kernelbot keeps one");

    // A webhook the submission named is not kept once delivered: only the callback goes.
    app.submit(&submission("named")).await;
    app.finish(2, "passed", Some(sample_result(false))).await;
    let calls = app.discord_calls().len();
    let said = run(
        &app,
        Command::Resend {
            run_id: id("named"),
        },
    )
    .await;
    assert!(said.contains("callback delivered"), "{said}");
    assert!(
        said.contains("Discord: not sent (the webhook the submission named"),
        "{said}"
    );
    assert_eq!(app.discord_calls().len(), calls);
    // Nothing to resend before a job ends.
    app.submit(&submission("open")).await;
    let said = act(
        &app.sweeper,
        Command::Resend { run_id: id("open") },
        deadline(),
    )
    .await;
    let said = said.unwrap_err().to_string();
    assert_eq!(said, "open: scheduled, not ended: nothing to resend");
    // A resend whose send fails again did not do what was asked: an error saying so.
    app.discord.fail_next(&[503; 8]);
    let resend = Command::Resend {
        run_id: id("again"),
    };
    let failed = act(&app.sweeper, resend, deadline()).await.unwrap_err();
    assert!(matches!(failed, OpsError::Incomplete(_)), "{failed:?}");
    assert!(
        failed.to_string().starts_with("again: Discord owed"),
        "{failed}"
    );
}

/// Jobs whose report was given up (Discord down for a day) get it once Discord is back.
async fn given_up_reports_are_replayed_since_a_time(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("DISCORD_WEBHOOK_URL", HOOK_URL)]).await;
    for (n, run_id) in [(1, "early"), (2, "late")] {
        if n == 2 {
            app.advance_clock(Duration::from_secs(3600));
        }
        app.submit(&to_default(run_id)).await;
        app.discord.fail_next(&[503; 4]);
        app.finish(n, "passed", Some(sample_result(false))).await;
    }
    app.advance_clock(Duration::from_secs(25 * 3600));
    app.discord.fail_next(&[503; 8]);
    app.sweep().await;
    for run_id in ["early", "late"] {
        let view = run(&app, Command::Show { run_id: id(run_id) }).await;
        assert!(view.contains("\"given_up\""), "{view}");
    }
    // Since the second one was submitted: only it. A dry run names it and sends nothing,
    // and without --yes nothing is sent either.
    let late = app.job("late").await.created_at;
    let sent = app.discord_calls().len();
    let dry = Confirm {
        yes: false,
        dry_run: true,
    };
    let replay = |confirm| Command::Replay {
        given_up: true,
        since: late,
        confirm,
    };
    assert_eq!(
        run(&app, replay(dry)).await,
        "1 run(s) would be replayed\nlate"
    );
    let refused = act(&app.sweeper, replay(Confirm::default()), deadline()).await;
    assert!(refused.unwrap_err().to_string().contains("add --yes"));
    assert_eq!(app.discord_calls().len(), sent, "a dry run sends nothing");
    assert!(
        run(&app, Command::Show { run_id: id("late") })
            .await
            .contains("\"given_up\"")
    );
    let said = run(
        &app,
        Command::Replay {
            given_up: true,
            since: late,
            confirm: Confirm::YES,
        },
    )
    .await;
    assert_eq!(
        said,
        "1 run(s) replayed\nlate: Discord delivered, callback none"
    );
    let said = run(
        &app,
        Command::Replay {
            given_up: true,
            since: 0,
            confirm: Confirm::YES,
        },
    )
    .await;
    assert_eq!(
        said,
        "1 run(s) replayed\nearly: Discord delivered, callback none"
    );
    let said = run(
        &app,
        Command::Replay {
            given_up: true,
            since: 0,
            confirm: Confirm::YES,
        },
    )
    .await;
    assert_eq!(said, "0 run(s) replayed\n");
    let messages = serde_json::to_string(&app.discord.messages()).unwrap();
    assert!(messages.contains("Report for early"), "{messages}");
}

async fn cancel_and_reconcile_act_on_one_run(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    app.submit(&submission("stop")).await;
    let cancel = |run_id: &str, confirm| Command::Cancel {
        run_id: id(run_id),
        confirm,
    };
    // Without --yes nothing changes; a dry run says what it would do.
    let refused = act(&app.sweeper, cancel("stop", Confirm::default()), deadline()).await;
    assert!(refused.unwrap_err().to_string().contains("add --yes"));
    let dry = Confirm {
        yes: false,
        dry_run: true,
    };
    let said = run(&app, cancel("stop", dry)).await;
    assert_eq!(said, "stop: would cancel (scheduled, build #1)");
    assert_eq!(app.buildkite.build(1).unwrap().state, "scheduled");
    assert!(!app.job("stop").await.cancel_requested);
    let said = run(&app, cancel("stop", Confirm::YES)).await;
    assert_eq!(said, "stop: cancel requested (scheduled)");
    assert_eq!(app.buildkite.build(1).unwrap().state, "canceled");
    for confirm in [Confirm::YES, dry] {
        let nobody = act(&app.sweeper, cancel("nobody", confirm), deadline()).await;
        assert_eq!(nobody.unwrap_err().to_string(), "no job nobody");
    }
    // Asked of a run that is not there, resend and reconcile fail.
    let resend = act(
        &app.sweeper,
        Command::Resend {
            run_id: id("nobody"),
        },
        deadline(),
    );
    assert_eq!(resend.await.unwrap_err().to_string(), "no job nobody");
    let reconcile = act(
        &app.sweeper,
        Command::Reconcile {
            run_id: id("nobody"),
        },
        deadline(),
    );
    assert_eq!(reconcile.await.unwrap_err().to_string(), "no job nobody");

    // A build that ended while its webhooks were lost: reconcile reads it and finishes it,
    // whatever its age, and the report goes out.
    app.submit(&submission("lost")).await;
    app.buildkite
        .upload(2, "result.json", sample_result(false), "finished", false);
    app.buildkite.set_state(2, "passed");
    let said = run(&app, Command::Reconcile { run_id: id("lost") }).await;
    assert!(said.starts_with("lost: finished ("), "{said}");
    let job = app.job("lost").await;
    assert_eq!(job.outcome.unwrap().verdict, Verdict::Passed);
    let messages = serde_json::to_string(&app.discord.messages()).unwrap();
    assert!(messages.contains("Report for lost"), "{messages}");
}

/// A command set up for another deployment (another pipeline, another default webhook)
/// refuses to change anything in this one's store, once its functions have noted which
/// deployment it is; it still lists.
async fn a_command_set_up_for_another_deployment_changes_nothing(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("DISCORD_WEBHOOK_URL", HOOK_URL)]).await;
    app.submit(&to_default("theirs")).await;
    app.sweep().await;
    let configured = |name: &str, value: &str| {
        let mut env = app.env.clone();
        env.insert(name.to_owned(), value.to_owned());
        let config = Config::from_lookup(Role::Sweep, &move |k: &str| env.get(k).cloned());
        Deps::new(Arc::new(config.unwrap()), app.store.clone()).unwrap()
    };
    let other_webhook = "https://discord.com/api/webhooks/333333333333333333/other-token_3";
    for (d, says) in [
        (
            configured("BUILDKITE_PIPELINE", "staging"),
            "pipeline test-org/staging here",
        ),
        (
            configured("DISCORD_WEBHOOK_URL", other_webhook),
            "webhook 333333333333333333 here",
        ),
    ] {
        let cancel = Command::Cancel {
            run_id: id("theirs"),
            confirm: Confirm::YES,
        };
        let refused = act(&d, cancel, deadline()).await.unwrap_err().to_string();
        assert!(
            refused.contains("another deployment") && refused.contains(says),
            "{refused}"
        );
        assert!(
            !refused.contains("other-token_3"),
            "a webhook's token is never shown"
        );
        let listed = Command::Jobs {
            state: None,
            queue: None,
            older_than: None,
            json: false,
        };
        assert_eq!(
            run_ids(&act(&d, listed, deadline()).await.unwrap()),
            ["theirs"]
        );
    }
    assert_eq!(app.buildkite.build(1).unwrap().state, "scheduled");
    assert!(!app.job("theirs").await.cancel_requested);
    let cancel = Command::Cancel {
        run_id: id("theirs"),
        confirm: Confirm::YES,
    };
    assert_eq!(
        run(&app, cancel).await,
        "theirs: cancel requested (scheduled)"
    );
}

/// `fleet`: each agent of our queues as a table: the one whose GPU failed its checks paused
/// with its hook's note, the one that ran the retry, the lost one; no other queue's.
async fn the_fleet_is_a_table_of_our_agents(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let step: StepRunner = std::sync::Arc::new(|env| {
        let job = env.get("BUILDKITE_JOB_ID").cloned().unwrap_or_default();
        if env.get("BUILDKITE_AGENT_NAME").map(String::as_str) != Some("h100-gpu0") {
            return StepOutcome::passed(sample_result(false));
        }
        let note = "ecc_errors: GPU 0 has 2 uncorrected ECC errors";
        let result = json!({"success": false, "error": "infrastructure failure, not your code",
            "infra": {"stage": "preflight", "reason": "ecc_errors", "detail": note, "readings": []}});
        StepOutcome {
            result: Some(result.to_string().into_bytes()),
            exit_status: Some(75),
            agent_calls: vec![
                strings(&["meta-data", "set", &format!("kernelbot-infra:{job}"), note]),
                strings(&[
                    "pause",
                    "--note",
                    &format!("kernelbot: {note}"),
                    "--timeout-in-minutes",
                    "60",
                ]),
            ],
            ..StepOutcome::default()
        }
    });
    app.buildkite
        .autorun(&app.webhook_url, crate::support::SECRET, step);
    for name in ["h100-gpu0", "h100-gpu1", "h100-gpu2"] {
        app.buildkite.add_agent(name, "h100", &[]);
    }
    app.buildkite.add_agent("b200-elsewhere", "not-ours", &[]);
    let (status, _) = app.submit(&submission("on-gpu1")).await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED);
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while !app.job("on-gpu1").await.state.is_terminal() {
        assert!(std::time::Instant::now() < until, "never finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(app.buildkite.agent_event("agent.lost", "h100-gpu2").await);
    // The agents' records are written just after the job's report goes out.
    let mut table = run(&app, Command::Fleet { json: false }).await;
    for _ in 0..100 {
        let noted = table
            .lines()
            .any(|l| l.starts_with("h100-gpu1") && l.split_whitespace().nth(4) == Some("1"));
        if noted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        table = run(&app, Command::Fleet { json: false }).await;
    }
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("AGENT") && lines[0].contains("INFRA 24H"),
        "{table}"
    );
    let row = |name: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing: {table}"))
            .to_string()
    };
    let gpu0 = row("h100-gpu0");
    assert!(
        gpu0.contains("ecc_errors: GPU 0 has 2 uncorrected ECC errors"),
        "{table}"
    );
    let cells = |l: &str| {
        l.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    // jobs and infrastructure failures in the last day
    assert_eq!(
        cells(&gpu0)[4..6],
        ["1".to_owned(), "1".to_owned()],
        "{table}"
    );
    let gpu1 = cells(&row("h100-gpu1"));
    assert_eq!(
        (gpu1[3].as_str(), gpu1[4].as_str(), gpu1[5].as_str()),
        ("-", "1", "0"),
        "{table}"
    );
    let gpu2 = row("h100-gpu2");
    assert!(gpu2.contains("lost"), "{table}");
    assert!(!table.contains("b200-elsewhere"), "{table}");
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

on_both_stores!(
    the_fleet_is_a_table_of_our_agents,
    jobs_are_listed_by_state_queue_and_age,
    a_job_is_shown_without_its_secrets,
    resend_edits_the_same_message_and_calls_back_again,
    given_up_reports_are_replayed_since_a_time,
    cancel_and_reconcile_act_on_one_run,
    a_command_set_up_for_another_deployment_changes_nothing,
);

/// The binary itself: configured as the functions are, on an empty store of each kind.
#[test]
fn the_binary_reads_the_functions_configuration_on_either_store() {
    let dir = tempfile::tempdir().unwrap();
    let moto = kernelbot_dispatch::devstack::moto::endpoint().unwrap();
    let table = format!("ops-{}", uuid::Uuid::new_v4().simple());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = kernelbot_dispatch::devstack::moto::client().unwrap();
        kernelbot_dispatch::devstack::moto::create_table(&client, &table)
            .await
            .unwrap();
    });
    let dynamo = [
        ("JOBS_TABLE", table.as_str()),
        ("AWS_ENDPOINT_URL_DYNAMODB", moto),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
    ];
    let sqlite = [("KERNELBOT_DATA_DIR", dir.path().to_str().unwrap())];
    for store in [&sqlite[..], &dynamo[..]] {
        let command = |args: &[&str]| {
            Process::new(env!("CARGO_BIN_EXE_kernelbot-dispatch"))
                .args(args)
                .env_clear()
                .env("BUILDKITE_ORG", "o")
                .env("BUILDKITE_PIPELINE", "p")
                .env("BUILDKITE_API_TOKEN", "t")
                .envs(store.iter().copied())
                .output()
                .expect("the command runs")
        };
        let out = command(&["jobs", "--state", "running"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("RUN ID"));
        let out = command(&["show", "nobody"]);
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("no job nobody"));
        let out = command(&["replay", "--since", "24h"]);
        assert_eq!(out.status.code(), Some(2), "--given-up is required");
        let out = command(&["jobs", "--state", "sleeping"]);
        assert_eq!(out.status.code(), Some(2), "an unknown state");
        let out = command(&["jobs", "--json"]);
        assert!(out.status.success());
        let listed: Value = serde_json::from_slice(&out.stdout).expect("--json prints JSON");
        assert_eq!(listed, json!([]));
        // Every failure exits non-zero; a change asked without --yes is refused.
        for args in [
            &["resend", "nobody"][..],
            &["cancel", "nobody"],
            &["cancel", "x", "--yes", "--dry-run"],
        ] {
            let out = command(args);
            assert_ne!(out.status.code(), Some(0), "{args:?}");
        }
        let out = command(&["cancel", "nobody"]);
        assert!(String::from_utf8_lossy(&out.stderr).contains("add --yes"));
    }
}

/// With no store named the command refuses and creates nothing, where it runs or anywhere.
#[test]
fn the_binary_never_guesses_a_store() {
    let cwd = tempfile::tempdir().unwrap();
    let with = |args: &[&str], stores: &[(&str, &str)]| {
        Process::new(env!("CARGO_BIN_EXE_kernelbot-dispatch"))
            .args(args)
            .current_dir(cwd.path())
            .env_clear()
            .env("BUILDKITE_ORG", "o")
            .env("BUILDKITE_PIPELINE", "p")
            .env("BUILDKITE_API_TOKEN", "t")
            .envs(stores.iter().copied())
            .output()
            .expect("the command runs")
    };
    let command = |args: &[&str]| with(args, &[]);
    for (args, says) in [
        (&["jobs"][..], "no store named: set JOBS_TABLE"),
        (&["--local", "jobs"], "no local store at ./.kernelbot"),
    ] {
        let out = command(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{stderr}");
        assert!(out.stdout.is_empty());
    }
    // A named store and --local, or two stores named, is a question, not a choice to guess.
    for (name, value) in [
        ("JOBS_TABLE", "kernelbot-prod"),
        ("KERNELBOT_DATA_DIR", "data"),
    ] {
        let out = with(&["--local", "jobs"], &[(name, value)]);
        assert_eq!(out.status.code(), Some(2), "--local with {name}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--local with a store named"));
    }
    let both = with(
        &["jobs"],
        &[
            ("JOBS_TABLE", "kernelbot-prod"),
            ("KERNELBOT_DATA_DIR", "data"),
        ],
    );
    assert_eq!(both.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&both.stderr).contains("both JOBS_TABLE and KERNELBOT_DATA_DIR")
    );
    let left: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().collect();
    assert!(left.is_empty(), "created {left:?}");
    // A local run's store there is used with --local.
    std::fs::create_dir(cwd.path().join(".kernelbot")).unwrap();
    let out = command(&["--local", "jobs", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        json!([])
    );
}

/// A stack as `sam deploy` leaves one, cut to what `--stack` reads: the sweep function (its
/// environment as the template sets it) and the output naming it.
fn stack_template(table: &str, secret: &str) -> String {
    json!({
        "Resources": {
            "SweepRole": {"Type": "AWS::IAM::Role", "Properties": {
                "AssumeRolePolicyDocument": {"Version": "2012-10-17", "Statement": [{
                    "Effect": "Allow", "Action": "sts:AssumeRole",
                    "Principal": {"Service": "lambda.amazonaws.com"}}]}}},
            "SweepFunction": {"Type": "AWS::Lambda::Function", "Properties": {
                "Runtime": "provided.al2023", "Handler": "bootstrap",
                "Architectures": ["arm64"],
                "Role": {"Fn::GetAtt": ["SweepRole", "Arn"]},
                "Code": {"ZipFile": "bootstrap"},
                "Environment": {"Variables": {
                    "JOBS_TABLE": table,
                    "BUILDKITE_ORG": "stack-org",
                    "BUILDKITE_PIPELINE": "stack-pipeline",
                    "BUILDKITE_BRANCH": "main",
                    "KERNELBOT_SECRET_ID": secret,
                    "SECRETS_MANAGER_TTL": "0",
                    "GPU_QUEUES": "H100_BK=h100,MI300_BK=mi300",
                    "CALLBACK_URL": "https://kernelbot.example/callbacks",
                    "QUEUE_TIMEOUT_SECS": "900",
                    "AWS_LAMBDA_LOG_FORMAT": "JSON"}}}}
        },
        "Outputs": {
            "JobsTableName": {"Value": table},
            "SweepFunctionName": {"Value": {"Ref": "SweepFunction"}}
        }
    })
    .to_string()
}

/// The deployment's secret, every key the functions read, and one they do not.
fn stack_keys() -> Value {
    json!({
        "BUILDKITE_API_TOKEN": "bkua_0123456789abcdef0123456789abcdef01234567",
        "BUILDKITE_WEBHOOK_SECRET": "9b2c1e4f7a0d3c6b8e5f2a1d4c7b0e3f",
        "SUBMIT_API_TOKEN": "submit-0123456789abcdef",
        "DISCORD_WEBHOOK_URL": "https://discord.com/api/webhooks/1234567890/abcdefABCDEF",
        CALLBACK.0: CALLBACK.1,
        "PROFILE_LINK_SECRET": "pl-7f3a9c1e5b2d8f4a6c0e9b3d7f1a5c8e2b4d6f",
        "OPS_DISCORD_WEBHOOK_URL": "https://discord.com/api/webhooks/99/opsOPS",
        // Not a secret's key: ignored, as the functions ignore it (read, it would stop
        // the command: not a number).
        "USER_MAX_WAITING": "twenty",
    })
}

/// A deployment on moto as `sam deploy` leaves one: its table (holding the job
/// `from-the-stack`), its secret ([`stack_keys`]) and its stack; and beside it a stack of
/// another kind, `other-{unique}`.
struct Deployed {
    endpoint: &'static str,
    table: String,
    stack: String,
    unique: String,
}

fn deployed(rt: &tokio::runtime::Runtime) -> Deployed {
    use aws_sdk_cloudformation::config::{BehaviorVersion, Credentials, Region};
    use kernelbot_dispatch::devstack::moto;
    use kernelbot_dispatch::jobs::{DynamoStore, Job, JobStore};
    let endpoint = moto::endpoint().unwrap();
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let (table, stack, secret) = (
        format!("ops-{unique}"),
        format!("kd-{unique}"),
        format!("kernelbot-{unique}"),
    );
    rt.block_on(async {
        let client = moto::client().unwrap();
        moto::create_table(&client, &table).await.unwrap();
        let store = DynamoStore::new(client, table.clone());
        let job = Job::new(
            id("from-the-stack"),
            "H100_BK".into(),
            "h100".into(),
            None,
            None,
            1,
        );
        store.create(&job).await.unwrap();
        let aws = aws_config::defaults(BehaviorVersion::latest())
            .endpoint_url(endpoint)
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "test"))
            .load()
            .await;
        let keys = stack_keys();
        aws_sdk_secretsmanager::Client::new(&aws)
            .create_secret()
            .name(&secret)
            .secret_string(keys.to_string())
            .send()
            .await
            .unwrap();
        aws_sdk_cloudformation::Client::new(&aws)
            .create_stack()
            .stack_name(&stack)
            .template_body(stack_template(&table, &secret))
            .send()
            .await
            .unwrap();
        let not_ours = json!({"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}});
        aws_sdk_cloudformation::Client::new(&aws)
            .create_stack()
            .stack_name(format!("other-{unique}"))
            .template_body(not_ours.to_string())
            .send()
            .await
            .unwrap();
    });
    Deployed {
        endpoint,
        table,
        stack,
        unique,
    }
}

/// The operator's command against AWS at `endpoint`, from a shell set up for another
/// deployment, plus `shell`; it must end within `bound`. What it prints goes to files, which
/// never fill as a pipe would.
fn dispatch(
    endpoint: &str,
    args: &[&str],
    shell: &[(&str, &str)],
    bound: Duration,
) -> std::process::Output {
    use std::io::{Read, Seek};
    let (mut stdout, mut stderr) = (tempfile::tempfile().unwrap(), tempfile::tempfile().unwrap());
    let mut child = Process::new(env!("CARGO_BIN_EXE_kernelbot-dispatch"))
        .args(args)
        .env_clear()
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("BUILDKITE_ORG", "elsewhere")
        .env("BUILDKITE_PIPELINE", "elsewhere")
        .envs(shell.iter().copied())
        .stdout(stdout.try_clone().unwrap())
        .stderr(stderr.try_clone().unwrap())
        .spawn()
        .expect("the command runs");
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > bound {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{args:?} still running after {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |file: &mut std::fs::File| {
        let mut bytes = Vec::new();
        file.rewind().unwrap();
        file.read_to_end(&mut bytes).unwrap();
        bytes
    };
    std::process::Output {
        status,
        stdout: read(&mut stdout),
        stderr: read(&mut stderr),
    }
}

/// `--stack NAME` (or `KERNELBOT_STACK`): the deployment's configuration from its stack (the
/// sweep function's environment, the secret it names) and none from the shell, which here
/// has no Buildkite token and another deployment's names; a stack that cannot be read, or
/// one named beside another store, is refused.
#[test]
fn the_binary_works_on_the_deployment_its_stack_names() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Deployed {
        endpoint,
        table,
        stack,
        unique,
    } = deployed(&rt);
    let command = |args: &[&str], shell: &[(&str, &str)]| {
        dispatch(endpoint, args, shell, Duration::from_secs(300))
    };
    let out = command(&["--stack", &stack, "jobs", "--json"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|j| j["run_id"].as_str())
        .collect();
    assert_eq!(ids, ["from-the-stack"], "{listed}");
    let out = command(&["show", "from-the-stack"], &[("KERNELBOT_STACK", &stack)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("from-the-stack"));
    // A store named twice is refused before anything is read.
    for shell in [
        [("JOBS_TABLE", table.as_str())],
        [("KERNELBOT_DATA_DIR", "/tmp")],
    ] {
        let out = command(&["--stack", &stack, "jobs"], &shell);
        assert_eq!(out.status.code(), Some(2), "{shell:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--stack names the store"));
    }
    let out = command(&["--stack", &stack, "--local", "jobs"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let out = command(&["--stack", " ", "jobs"], &[]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a blank name never lists every stack"
    );
    // A stack that is not there, or not ours, fails and says which.
    let out = command(&["--stack", "no-such-stack", "jobs"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("stack no-such-stack could not be read"),
        "{said}"
    );
    assert!(out.stdout.is_empty());
    let out = command(&["--stack", &format!("other-{unique}"), "jobs"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("is it a kernelbot-dispatch stack?"), "{said}");
}

/// What the stand-in between the command and AWS answers a request it fails.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// 503, no body: an AWS front end's hiccup.
    Unavailable,
    /// CloudFormation's 400 `Throttling`, as its query protocol writes it.
    Throttled,
    /// Never an answer.
    Hung,
}

/// CloudFormation's answer to a caller past its rate (the query protocol's error document).
const THROTTLED: &str = r#"<ErrorResponse xmlns="http://cloudformation.amazonaws.com/doc/2010-05-15/">
  <Error>
    <Type>Sender</Type>
    <Code>Throttling</Code>
    <Message>Rate exceeded</Message>
  </Error>
  <RequestId>7a62c49f-347e-4fc4-9331-6e8e0cbd5e0a</RequestId>
</ErrorResponse>"#;

/// Between the command and moto: fails the first `failing` requests with `fault`, passes the
/// rest on, and counts every request.
#[derive(Clone)]
struct Faulty {
    upstream: &'static str,
    fault: Fault,
    failing: Arc<std::sync::atomic::AtomicUsize>,
    asked: Arc<std::sync::atomic::AtomicUsize>,
    http: reqwest::Client,
}

/// Headers of one connection, not of the request: never passed on.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

fn end_to_end(mut headers: axum::http::HeaderMap) -> axum::http::HeaderMap {
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers
}

async fn faulty(
    axum::extract::State(f): axum::extract::State<Faulty>,
    request: axum::extract::Request,
) -> axum::response::Response {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    use std::sync::atomic::Ordering::SeqCst;
    f.asked.fetch_add(1, SeqCst);
    if f.failing
        .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        match f.fault {
            Fault::Unavailable => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
            Fault::Throttled => {
                return (
                    StatusCode::BAD_REQUEST,
                    [(header::CONTENT_TYPE, "text/xml")],
                    THROTTLED,
                )
                    .into_response();
            }
            Fault::Hung => std::future::pending::<()>().await,
        }
    }
    match pass_on(&f, request).await {
        Ok(answer) => answer,
        // Said, not dropped: a reset would be retried and hide a broken stand-in.
        Err(e) => (StatusCode::BAD_GATEWAY, format!("the stand-in: {e}")).into_response(),
    }
}

/// `request` sent to moto as it came (moto checks no signature, so the new `Host` is no
/// matter), and moto's answer.
async fn pass_on(
    f: &Faulty,
    request: axum::extract::Request,
) -> Result<axum::response::Response, Box<dyn std::error::Error>> {
    use axum::response::IntoResponse;
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await?;
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut headers = end_to_end(parts.headers);
    headers.remove(axum::http::header::HOST);
    let answer = f
        .http
        .request(parts.method, format!("{}{path}", f.upstream))
        .headers(headers)
        .body(body)
        .send()
        .await?;
    let (status, headers) = (answer.status(), end_to_end(answer.headers().clone()));
    Ok((status, headers, answer.bytes().await?).into_response())
}

/// Starts a stand-in failing its first `failing` requests; its URL and its count of requests.
fn start_faulty(
    rt: &tokio::runtime::Runtime,
    upstream: &'static str,
    fault: Fault,
    failing: usize,
) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    let state = Faulty {
        upstream,
        fault,
        failing: Arc::new(failing.into()),
        asked: Arc::default(),
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
    };
    let asked = state.asked.clone();
    let app = axum::Router::new().fallback(faulty).with_state(state);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, app).await });
    (url, asked)
}

/// `--stack` when AWS answers badly: a hiccup is retried and the command works; throttling
/// that never ends is tried as often as the SDK's standard retries allow (three times), then
/// named; a call never answered ends at `--timeout`. No secret of the deployment is ever in
/// what it prints.
#[test]
fn a_stack_read_through_faults_is_retried_then_named_never_hung() {
    use std::sync::atomic::Ordering::SeqCst;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Deployed {
        endpoint, stack, ..
    } = deployed(&rt);
    let bound = Duration::from_secs(120);
    let no_secret = |out: &std::process::Output| {
        let printed = [&out.stdout[..], &out.stderr[..]].concat();
        let printed = String::from_utf8_lossy(&printed);
        let keys = stack_keys();
        for (key, value) in keys.as_object().unwrap() {
            if key != "USER_MAX_WAITING" {
                let value = value.as_str().unwrap();
                assert!(!printed.contains(value), "{key} printed: {printed}");
            }
        }
    };

    let (url, asked) = start_faulty(&rt, endpoint, Fault::Unavailable, 2);
    let out = dispatch(&url, &["--stack", &stack, "jobs", "--json"], &[], bound);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("from-the-stack"));
    // The two failures, then the stack, the function, the secret and the store's reads.
    assert!(asked.load(SeqCst) >= 2 + 4, "{}", asked.load(SeqCst));
    no_secret(&out);

    let (url, asked) = start_faulty(&rt, endpoint, Fault::Throttled, usize::MAX);
    let out = dispatch(&url, &["--stack", &stack, "jobs"], &[], bound);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!("stack {stack} could not be read")),
        "{said}"
    );
    assert!(said.contains("Throttling"), "the cause is named: {said}");
    assert_eq!(asked.load(SeqCst), 3, "tried three times: {said}");
    assert!(out.stdout.is_empty());
    no_secret(&out);

    let (url, asked) = start_faulty(&rt, endpoint, Fault::Hung, usize::MAX);
    let out = dispatch(
        &url,
        &["--timeout", "10s", "--stack", &stack, "jobs"],
        &[],
        bound,
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!("stack {stack} could not be read in 10s")),
        "{said}"
    );
    assert!(asked.load(SeqCst) >= 1, "the call was made");
    assert!(out.stdout.is_empty());
    no_secret(&out);
}
