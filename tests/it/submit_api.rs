//! The submission API's answers to bad requests: a clear error, the right status, and
//! nothing created.

use crate::support::{API_TOKEN, StoreKind, TestApp, submission};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test]
async fn requests_without_the_right_token_get_401_and_create_nothing() {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    let body = serde_json::to_vec(&submission("auth")).unwrap();
    for token in [None, Some("wrong"), Some("")] {
        let (status, err) = app.submit_raw(body.clone(), token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            err,
            json!({"error": "unauthorized", "message": "unauthorized"})
        );
    }
    let resp = app
        .client
        .get(format!("{}/submissions/auth", app.submit_url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert!(app.buildkite.builds().is_empty());
    assert_eq!(app.status("auth").await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn malformed_bodies_get_400_naming_the_problem() {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    let (status, err) = app.submit_raw(b"{not json".to_vec(), Some(API_TOKEN)).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_json"))
    );

    let mut no_gpu = submission("x");
    no_gpu.as_object_mut().unwrap().remove("gpu");
    let (status, err) = app.submit(&no_gpu).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(err["message"], "gpu: is required");

    let mut bad_id = submission("x");
    bad_id["run_id"] = json!("../etc/passwd");
    let (status, err) = app.submit(&bad_id).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_field"))
    );
    assert!(err["message"].as_str().unwrap().starts_with("run_id:"));
    assert!(app.buildkite.builds().is_empty());
}

#[tokio::test]
async fn unknown_gpus_and_foreign_webhook_urls_get_422() {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    let mut tpu = submission("tpu");
    tpu["gpu"] = json!("TPU_V5");
    let (status, err) = app.submit(&tpu).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("unknown_gpu"))
    );
    assert!(
        err["message"].as_str().unwrap().contains("H100_BK"),
        "lists the known GPUs: {err}"
    );

    let mut foreign = submission("foreign");
    foreign["discord"]["webhook_url"] =
        json!("https://hooks.slack.com/api/webhooks/1/secret-slack-token");
    let (status, err) = app.submit(&foreign).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("invalid_webhook_url")
        )
    );
    assert!(
        !err.to_string().contains("secret-slack-token"),
        "the URL's token is never echoed"
    );
    assert!(app.buildkite.builds().is_empty());
    assert!(app.discord_calls().is_empty());
}

#[tokio::test]
async fn status_shows_the_job_and_never_its_discord_token() {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    let (status, created) = app.submit(&submission("shown")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert!(!created.to_string().contains("hook-token_1"));
    let (status, view) = app.status("shown").await;
    assert_eq!(status, StatusCode::OK);
    for key in [
        "run_id",
        "state",
        "gpu",
        "queue",
        "build",
        "created_at",
        "updated_at",
        "result",
    ] {
        assert!(view.get(key).is_some(), "missing {key}: {view}");
    }
    assert_eq!(
        (view["gpu"].as_str(), view["queue"].as_str()),
        (Some("H100_BK"), Some("h100"))
    );
    assert!(view["created_at"].as_str().unwrap().ends_with('Z'));
    assert!(!view.to_string().contains("hook-token_1"));
    let (status, err) = app.status("no-such-run").await;
    assert_eq!(
        (status, err["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
}

#[tokio::test]
async fn a_submission_without_run_id_gets_a_generated_one() {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    let mut body = submission("ignored");
    body.as_object_mut().unwrap().remove("run_id");
    let (status, created) = app.submit(&body).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let run_id = created["run_id"].as_str().unwrap();
    assert!(run_id.starts_with("run-"));
    assert_eq!(app.buildkite.build(1).unwrap().meta_data["run_id"], run_id);
}

#[tokio::test]
async fn both_functions_answer_health_checks() {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    let webhook_base = app.webhook_url.trim_end_matches("/webhooks/buildkite");
    for base in [app.submit_url.as_str(), webhook_base] {
        let resp = app
            .client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
}

#[tokio::test]
async fn webhook_bodies_that_are_not_events_get_400_after_verification() {
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    let resp = kernelbot_dispatch::devstack::buildkite::deliver(
        &app.webhook_url,
        crate::support::SECRET,
        "build.finished",
        b"[1,2".to_vec(),
        kernelbot_dispatch::devstack::buildkite::unix_now(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let too_big = vec![b' '; 1024 * 1024 + 1];
    let resp = app
        .client
        .post(&app.webhook_url)
        .body(too_big)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

/// A config the runner would refuse is found at submit, on both stores: `422 invalid_config`
/// naming the field, no job recorded, no build, no Discord message.
#[tokio::test]
async fn a_config_the_runner_would_refuse_gets_422_and_takes_no_gpu() {
    for kind in [StoreKind::Sqlite, StoreKind::Dynamo] {
        let app = TestApp::spawn(kind).await;
        for (config, field, says) in [
            (
                json!({"lang": "rust", "mode": "test"}),
                "config.lang",
                "lang must be",
            ),
            (
                json!({"lang": "py", "mode": "test", "main": "missing.py", "sources": {"eval.py": ""}}),
                "config.main",
                "is not one of the sources",
            ),
            (
                json!({"lang": "cu", "mode": "test", "sources": {"/etc/cron.d/x": ""}}),
                "config.sources./etc/cron.d/x",
                "relative path",
            ),
            (
                json!({"lang": "py", "mode": "test", "main": "eval.py", "sources": {"eval.py": ""}, "test_timeout": -5}),
                "config.test_timeout",
                "positive number of seconds",
            ),
            (
                json!({"lang": "py", "mode": "profile", "main": "eval.py", "sources": {"eval.py": ""},
                    "benchmarks": [{"size": 1}], "profile_options": {"ncu_launch_count": 1000}}),
                "config.profile_options.ncu_launch_count",
                "must be 1 to 100",
            ),
            (
                json!({"lang": "py", "mode": "profile", "main": "eval.py", "sources": {"eval.py": ""},
                    "benchmarks": [{"size": 1}], "profile_options": {"benchmark_index": 1}}),
                "config.profile_options.benchmark_index",
                "one of the 1 benchmarks",
            ),
        ] {
            let mut body = submission("bad-config");
            body["config"] = config;
            let (status, err) = app.submit(&body).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
            assert_eq!(err["error"], "invalid_config");
            assert_eq!(err["field"], field, "{err}");
            assert!(err["message"].as_str().unwrap().contains(says), "{err}");
        }
        assert!(app.buildkite.builds().is_empty());
        assert!(app.discord.messages().is_empty());
        assert_eq!(app.status("bad-config").await.0, StatusCode::NOT_FOUND);
    }
}

/// A multi-GPU task goes to the queue whose agents hold several GPUs, with its queue in the
/// build's env; on a single-GPU queue it is refused at submit (and a single-GPU task on a
/// multi-GPU queue), on both stores.
#[tokio::test]
async fn multi_gpu_tasks_reach_only_multi_gpu_queues() {
    for kind in [StoreKind::Sqlite, StoreKind::Dynamo] {
        let queues = ("GPU_QUEUES", "H100_BK=h100,MI300x8_BK=mi300x8:8");
        let app = TestApp::spawn_with(kind, &[queues]).await;
        let config = |multi: bool| {
            let mut body = submission("x");
            body["config"]["multi_gpu"] = json!(multi);
            body["config"].clone()
        };
        for (run_id, gpu, multi, says) in [
            ("multi-on-one", "H100_BK", true, "cannot run on H100_BK"),
            (
                "one-on-eight",
                "MI300x8_BK",
                false,
                "is for multi-GPU tasks",
            ),
        ] {
            let mut body = submission(run_id);
            body["gpu"] = json!(gpu);
            body["config"] = config(multi);
            let (status, err) = app.submit(&body).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
            assert_eq!(
                (&err["error"], &err["field"]),
                (&json!("invalid_config"), &json!("config.multi_gpu"))
            );
            assert!(err["message"].as_str().unwrap().contains(says), "{err}");
            assert_eq!(app.status(run_id).await.0, StatusCode::NOT_FOUND);
        }
        assert!(app.buildkite.builds().is_empty());

        let mut body = submission("multi-on-eight");
        body["gpu"] = json!("MI300x8_BK");
        body["config"] = config(true);
        let (status, answer) = app.submit(&body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
        let builds = app.buildkite.builds();
        assert_eq!(builds.len(), 1);
        assert_eq!(builds[0].env["KERNELBOT_QUEUE"], "mi300x8");
    }
}
