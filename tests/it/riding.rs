//! The result rides `build.finished`: the node's hook puts `result.json` (packed) into the
//! build's meta-data and each try's `job.finished` is noted, so the webhook ends the job
//! with no Buildkite call, exactly as reading the artifact would have; a value that is
//! broken, or not the whole story, falls back to the artifact with the same outcome.

use std::io::Write;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use flate2::Compression;
use flate2::write::ZlibEncoder;
use kernelbot_dispatch::devstack::buildkite::sample_result;
use kernelbot_dispatch::jobs::{Job, JobState};
use kernelbot_dispatch::protocol::riding::{RESULT_META_DATA_KEY, pack_result};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{StoreKind, TestApp, submission};

/// `sample_result` as try `job_id` (retry `retry`) wrote it, with `written_by` as the
/// runner writes it.
fn as_written_by(job_id: &str, retry: u32) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&sample_result(false)).unwrap();
    v["written_by"] = json!({"job_id": job_id, "retry_count": retry});
    serde_json::to_vec_pretty(&v).unwrap()
}

/// How a hand-played build ends: each try's exit status, the last one's leaving the result.
const ONE_TRY: &[i32] = &[0];
const RETRIED: &[i32] = &[75, 0];

/// Submits `run_id` and plays its build `number` by hand as the agent and its hook would:
/// each try of `exits` recorded and its `job.finished` sent, the last leaving `result.json`
/// and, where `value` gives one, the meta-data; then `build.finished`. Returns the Buildkite
/// calls that `build.finished` cost.
async fn play(
    app: &TestApp,
    run_id: &str,
    number: u64,
    exits: &[i32],
    value: impl Fn(&[u8]) -> Option<String>,
) -> Vec<String> {
    assert_eq!(
        app.submit(&submission(run_id)).await.0,
        StatusCode::ACCEPTED
    );
    let bk = &app.buildkite;
    for (i, exit) in exits.iter().enumerate() {
        let last = i + 1 == exits.len();
        if last {
            let job_id = bk.build(number).unwrap().jobs.last().cloned().unwrap();
            let bytes = as_written_by(&job_id, i as u32);
            bk.upload(number, "result.json", bytes.clone(), "finished", false);
            if let Some(v) = value(&bytes) {
                bk.set_meta_data(number, RESULT_META_DATA_KEY, &v);
            }
            bk.record_try(number, "gpu-1", *exit, false);
        } else {
            bk.record_try(number, "gpu-0", *exit, true);
        }
        assert_eq!(app.event("job.finished", number).await, StatusCode::OK);
        assert_noted(app, run_id, i + 1).await;
    }
    bk.set_state(number, "passed");
    let before = bk.api_calls().len();
    assert_eq!(app.event("build.finished", number).await, StatusCode::OK);
    assert_eq!(app.job(run_id).await.state, JobState::Finished, "{run_id}");
    bk.api_calls()[before..].to_vec()
}

/// The job has noted `n` tries.
async fn assert_noted(app: &TestApp, run_id: &str, n: usize) {
    assert_eq!(app.job(run_id).await.tries_seen.len(), n, "{run_id}");
}

/// A job's outcome with what names its build's jobs left out, and its tries' ends counted
/// from the build's creation: two builds played alike differ only there.
fn outcome_of(app: &TestApp, job: &Job) -> Value {
    let number = job.build.as_ref().expect("a build").number;
    let created = app.buildkite.build(number).expect("the build").created_at;
    let mut o = serde_json::to_value(job.outcome.as_deref().expect("an outcome")).unwrap();
    if let Some(result) = o["result"].as_object_mut() {
        result.remove("written_by");
    }
    for t in o["tries"].as_array_mut().into_iter().flatten() {
        t["job_id"] = json!("");
        t["finished_at"] = json!(t["finished_at"].as_i64().map(|at| at - created));
    }
    o
}

/// What a hook might have set, from the `result.json` it was given.
type Valued = dyn Fn(&[u8]) -> Option<String>;

fn zlib(bytes: &[u8]) -> Vec<u8> {
    let mut e = ZlibEncoder::new(Vec::new(), Compression::best());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

async fn a_result_riding_the_event_ends_its_job_with_no_call_as_the_artifact_would(
    kind: StoreKind,
) {
    let app = TestApp::spawn(kind).await;
    for (i, exits) in [ONE_TRY, RETRIED].into_iter().enumerate() {
        let n = 2 * i as u64 + 1;
        let (ridden, read) = (format!("ridden-{i}"), format!("read-{i}"));
        let calls = play(&app, &ridden, n, exits, pack_result).await;
        assert_eq!(calls, Vec::<String>::new(), "{exits:?}");
        let calls = play(&app, &read, n + 1, exits, |_| None).await;
        assert!(
            calls.iter().any(|c| c.ends_with("/download")),
            "the artifact path reads the artifact: {calls:?}"
        );
        let (ridden, read) = (app.job(&ridden).await, app.job(&read).await);
        assert_eq!(
            outcome_of(&app, &ridden),
            outcome_of(&app, &read),
            "{exits:?}"
        );
        let outcome = ridden.outcome.as_deref().unwrap();
        assert_eq!(outcome.tries.len(), exits.len());
        assert!(outcome.timings.is_some_and(|t| t.ran_secs == Some(30.0)));
        assert!(outcome.result.as_ref().is_some_and(|r| r.success));
    }
    let by_path = app.metric("FinishesRead");
    let event = |path: &str| by_path.iter().filter(|(m, _)| m["Path"] == path).count();
    assert_eq!((event("event"), event("absent")), (2, 2), "{by_path:?}");
}

async fn a_broken_or_partial_result_in_the_meta_data_falls_back_to_the_artifact(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let bomb = STANDARD.encode(zlib(&vec![b' '; 64 << 20]));
    let deep = format!("{}{}", "[".repeat(5_000), "]".repeat(5_000));
    let broken: Vec<(&str, Box<Valued>)> = vec![
        (
            "not base64",
            Box::new(|_| Some("not base64 at all!".into())),
        ),
        ("not zlib", Box::new(|b| Some(STANDARD.encode(b)))),
        (
            "not json",
            Box::new(|_| Some(STANDARD.encode(zlib(b"{not json")))),
        ),
        ("a bomb", Box::new(move |_| Some(bomb.clone()))),
        (
            "too deep",
            Box::new(move |_| Some(STANDARD.encode(zlib(deep.as_bytes())))),
        ),
        (
            "another try's",
            Box::new(|_| pack_result(&as_written_by("some-other-job", 0))),
        ),
    ];
    let reference = play(&app, "reference", 1, ONE_TRY, |_| None).await;
    assert!(!reference.is_empty());
    let want = outcome_of(&app, &app.job("reference").await);
    for (i, (name, value)) in broken.into_iter().enumerate() {
        let run_id = format!("broken-{i}");
        let calls = play(&app, &run_id, i as u64 + 2, ONE_TRY, value).await;
        assert!(
            calls.iter().any(|c| c.ends_with("/download")),
            "{name}: the artifact is read: {calls:?}"
        );
        assert_eq!(outcome_of(&app, &app.job(&run_id).await), want, "{name}");
    }
    let by_path = app.metric("FinishesRead");
    let path = |p: &str| by_path.iter().filter(|(m, _)| m["Path"] == p).count();
    assert_eq!(
        (path("unreadable"), path("tries_unseen"), path("event")),
        (5, 1, 0),
        "{by_path:?}"
    );
}

/// `build.finished` overtook the last try's `job.finished`: the tries seen do not account
/// for the result, so the artifact is read, and the late `job.finished` changes nothing.
async fn a_build_finished_before_its_try_s_event_reads_the_artifact(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    assert_eq!(
        app.submit(&submission("overtaken")).await.0,
        StatusCode::ACCEPTED
    );
    let bk = &app.buildkite;
    let job_id = bk.build(1).unwrap().jobs.last().cloned().unwrap();
    let bytes = as_written_by(&job_id, 0);
    bk.upload(1, "result.json", bytes.clone(), "finished", false);
    bk.set_meta_data(1, RESULT_META_DATA_KEY, &pack_result(&bytes).unwrap());
    bk.record_try(1, "gpu-1", 0, false);
    bk.set_state(1, "passed");
    let before = bk.api_calls().len();
    assert_eq!(app.event("build.finished", 1).await, StatusCode::OK);
    assert!(
        bk.api_calls()[before..]
            .iter()
            .any(|c| c.ends_with("/download"))
    );
    let job = app.job("overtaken").await;
    assert_eq!(job.state, JobState::Finished);
    assert_eq!(app.event("job.finished", 1).await, StatusCode::OK);
    assert_eq!(app.job("overtaken").await, job, "an ended job notes no try");
}

on_both_stores!(
    a_result_riding_the_event_ends_its_job_with_no_call_as_the_artifact_would,
    a_broken_or_partial_result_in_the_meta_data_falls_back_to_the_artifact,
    a_build_finished_before_its_try_s_event_reads_the_artifact,
);
