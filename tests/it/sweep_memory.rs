//! A sweep pass's peak memory over a backlog of owed jobs with the largest results a
//! submission can make: the `sweep` binary's own high-water mark, on both stores.

use std::process::Command;

use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use kernelbot_dispatch::devstack::moto;
use kernelbot_dispatch::jobs::{
    Job, JobRecord, JobState, SqliteStore, Target, Transition, WebhookAddress,
};
use kernelbot_dispatch::result::Outcome;
use serde_json::{Value, json};

use crate::support::{StoreKind, inflated_result, run_measured};

/// The stored record of a finished job that owes its report, with an inflated result.
fn owed_record() -> Value {
    let target = Target::Webhook(WebhookAddress {
        webhook_id: "1".into(),
        token: "hook-token".into(),
        thread_id: None,
    });
    let job = Job::new(
        "template".parse().expect("run id"),
        "H100_BK".into(),
        "h100".into(),
        Some("vectoradd".into()),
        Some(target),
        1_000,
    );
    let outcome = Outcome::judge("passed", Some(inflated_result()), None);
    let t = Transition::to(JobState::Finished, 2_000).with_outcome(outcome);
    let finished = job.apply(&t).expect("it finishes");
    let kept = finished.outcome.as_ref().and_then(|o| o.result.as_ref());
    assert!(kept.is_some(), "the whole result is kept");
    let record = JobRecord::from_job(&finished, "w");
    let stored = record.stored_outcome_bytes();
    assert!(stored < 64 * 1024, "stored compressed: {stored}");
    serde_json::to_value(&record).expect("a record")
}

/// The `i`th owed job's record: one encoded record under a new run id, reporting to one of
/// 16 webhooks (so a pass has every send it may have in flight).
fn record(template: &mut Value, i: usize) -> (String, i64) {
    let (run_id, created_at) = (format!("owed-{i:05}"), 1_000 + i as i64);
    template["run_id"] = json!(run_id);
    template["created_at"] = json!(created_at);
    template["discord_webhook_id"] = json!(format!("3000000000000000{:02}", i % 16));
    (run_id, created_at)
}

/// A store holding `jobs` owed jobs, written straight into it, as a long outage leaves it.
enum Backlog {
    Sqlite(tempfile::TempDir),
    Dynamo { table: String },
}

impl Backlog {
    async fn of(kind: StoreKind, jobs: usize) -> Self {
        let mut template = owed_record();
        match kind {
            StoreKind::Sqlite => Self::Sqlite(sqlite_backlog(&mut template, jobs)),
            StoreKind::Dynamo => Self::Dynamo {
                table: dynamo_backlog(&mut template, jobs).await,
            },
        }
    }

    /// The sweep binary's environment for this store.
    fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Self::Sqlite(dir) => vec![("KERNELBOT_DATA_DIR", dir.path().display().to_string())],
            Self::Dynamo { table } => vec![
                ("JOBS_TABLE", table.clone()),
                ("AWS_ENDPOINT_URL_DYNAMODB", moto_url()),
                ("AWS_REGION", "us-east-1".into()),
                ("AWS_ACCESS_KEY_ID", "testing".into()),
                ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ],
        }
    }

    /// Frees what the backlog holds (the moto server serves the whole run).
    async fn remove(self) {
        if let Self::Dynamo { table } = self {
            let client = moto::client().expect("a client");
            client
                .delete_table()
                .table_name(table)
                .send()
                .await
                .expect("deleted");
        }
    }

    /// Reports the pass tried (each read whole to be sent).
    async fn tried(&self) -> usize {
        match self {
            Self::Sqlite(dir) => {
                let conn = rusqlite::Connection::open(dir.path().join("jobs.sqlite3"));
                let sql = "SELECT count(*) FROM jobs \
                           WHERE json_extract(record, '$.discord_attempts') > 0";
                let count = conn
                    .expect("opens")
                    .query_row(sql, [], |r| r.get::<_, i64>(0));
                count.expect("counted") as usize
            }
            Self::Dynamo { table } => dynamo_tried(table).await,
        }
    }
}

fn moto_url() -> String {
    moto::endpoint().expect("the moto server runs").to_owned()
}

fn sqlite_backlog(template: &mut Value, jobs: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    drop(SqliteStore::open(dir.path()).expect("the store opens"));
    let mut conn = rusqlite::Connection::open(dir.path().join("jobs.sqlite3")).expect("opens");
    let tx = conn.transaction().expect("a transaction");
    for i in 0..jobs {
        let (run_id, created_at) = record(template, i);
        tx.execute(
            "INSERT INTO jobs (run_id, shard, created_at, record) VALUES (?1, 'outbox', ?2, ?3)",
            rusqlite::params![run_id, created_at, template.to_string()],
        )
        .expect("inserted");
    }
    tx.commit().expect("committed");
    dir
}

async fn dynamo_backlog(template: &mut Value, jobs: usize) -> String {
    let client = moto::client().expect("a client");
    let table = format!("jobs-{}", uuid::Uuid::new_v4().simple());
    moto::create_table(&client, &table).await.expect("created");
    let items: Vec<WriteRequest> = (0..jobs)
        .map(|i| {
            record(template, i);
            let item = serde_dynamo::to_item(&*template).expect("an item");
            let put = PutRequest::builder().set_item(Some(item)).build();
            WriteRequest::builder()
                .put_request(put.expect("a put"))
                .build()
        })
        .collect();
    for batch in items.chunks(25) {
        let written = client
            .batch_write_item()
            .request_items(&table, batch.to_vec())
            .send()
            .await
            .expect("written");
        assert!(written.unprocessed_items.unwrap_or_default().is_empty());
    }
    table
}

async fn dynamo_tried(table: &str) -> usize {
    let client = moto::client().expect("a client");
    let pages = client
        .scan()
        .table_name(table)
        .filter_expression("discord_attempts > :zero")
        .expression_attribute_values(":zero", AttributeValue::N("0".into()))
        .into_paginator()
        .items()
        .send()
        .collect::<Result<Vec<_>, _>>()
        .await;
    pages.expect("scanned").len()
}

/// One pass of the `sweep` binary with `env`, Discord unreachable: its peak resident memory
/// in KiB, and its summary line.
fn sweep_peak_rss(env: Vec<(&'static str, String)>) -> (i64, String) {
    let mut sweep = Command::new(env!("CARGO_BIN_EXE_sweep"));
    sweep
        .env_clear()
        .envs(env)
        .env("BUILDKITE_ORG", "o")
        .env("BUILDKITE_PIPELINE", "p")
        .env("BUILDKITE_API_TOKEN", "t")
        // Nothing listens on the discard port: every send fails at once.
        .env("DISCORD_API_URL", "http://127.0.0.1:9/api/v10")
        // Sends start only while 10 s of the pass are left (its reserve): on a busy
        // machine moto's listing of thousands of jobs can take most of a shorter pass.
        .env("SWEEP_PASS_SECS", "30")
        .env("RUST_LOG", "error");
    let (peak, succeeded, summary) = run_measured(sweep);
    assert!(succeeded, "{summary}");
    (peak, summary)
}

/// A pass reads its backlog as a listing without results, then each job whole only to send
/// it, a few at a time: its memory is the same for 2,000 owed jobs and for 4,000, and far
/// inside a 256 MB function, though each job's result is 3 MiB decompressed.
async fn a_sweep_pass_s_memory_stays_flat_as_its_backlog_doubles(kind: StoreKind) {
    let mut peaks = Vec::new();
    for jobs in [2_000, 4_000] {
        let backlog = Backlog::of(kind, jobs).await;
        let env = backlog.env();
        let run = tokio::task::spawn_blocking(move || sweep_peak_rss(env));
        let (peak_kib, summary) = run.await.expect("the pass ran");
        assert!(summary.contains("reports pending"), "{summary}");
        let tried = backlog.tried().await;
        assert!(
            tried >= 8,
            "the pass read jobs whole and tried them: {tried}"
        );
        eprintln!("{kind:?}, {jobs} owed jobs: peak {peak_kib} KiB, {tried} tried");
        // A pass's own start-up takes more than this: a smaller figure measured nothing.
        assert!(peak_kib > 8 * 1024, "a peak of {peak_kib} KiB was measured");
        backlog.remove().await;
        peaks.push(peak_kib);
    }
    let (small, large) = (peaks[0], peaks[1]);
    // Which sends' reads coincide varies from run to run by some MB: doubling the backlog
    // may move the peak by no more than that (before, a pass held 3 MiB a listed job).
    let noise = 32 * 1024;
    assert!(
        large <= small + noise,
        "twice the backlog: {small} KiB, then {large} KiB"
    );
    assert!(large < 128 * 1024, "{large} KiB at the peak");
}

on_both_stores!(a_sweep_pass_s_memory_stays_flat_as_its_backlog_doubles);
