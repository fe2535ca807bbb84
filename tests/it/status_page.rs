//! The public status page (`GET /status`), opened as a person would: in a real headless
//! Chromium (Debian's, which `scripts/test.sh` installs), checked against the store, with a
//! phone-sized screenshot kept under `target/test-artifacts/`; and read for anything private.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kernelbot_dispatch::devstack::buildkite::sample_result;
use kernelbot_dispatch::devstack::stack::HOOK_URL;
use kernelbot_dispatch::jobs::JobState;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::process::Command;

use crate::support::{API_TOKEN, StoreKind, TestApp, submission};

fn chromium() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into())
}

/// Chromium, headless, on `url` with `args`: what it printed. Awaited, so the test's own
/// runtime goes on serving the page meanwhile.
async fn headless(url: &str, args: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (scripts/test.sh installs Debian's chromium)",
                chromium()
            )
        });
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The figure a queue's section shows under `field`, as the page's DOM holds it.
fn shown(dom: &str, queue: &str, field: &str) -> String {
    let section = dom
        .split(&format!("id=\"queue-{queue}\""))
        .nth(1)
        .unwrap_or_else(|| panic!("no section for {queue}: {dom}"));
    let after = section
        .split(&format!("data-field=\"{field}\">"))
        .nth(1)
        .unwrap_or_else(|| panic!("no {field} in {queue}'s section"));
    after
        .split('<')
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn artifacts() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(target)
        .join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn from(user: &str, run_id: &str) -> Value {
    let mut body = submission(run_id);
    body["user"] = user.into();
    body
}

/// A queue with something of everything: agents busy, idle and paused; a job running, one
/// queued for an agent, one waiting its turn; jobs ended in the last hour, one of them an
/// infrastructure failure.
async fn busy_queue(app: &TestApp) {
    app.buildkite.add_agent("h100-gpu0", "h100", &[]);
    app.buildkite.add_agent("h100-gpu1", "h100", &[]);
    app.buildkite.add_agent("h100-gpu2", "h100", &[]);
    app.buildkite.pause(
        "h100-gpu2",
        "kernelbot: ecc_errors: GPU 0 has 3 uncorrected ECC errors",
    );
    for (user, run_id) in [("carol", "c1"), ("dave", "d1")] {
        let (status, _) = app.submit(&from(user, run_id)).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        let number = app.job(run_id).await.build.unwrap().number;
        app.buildkite.start_eval(number);
        app.advance_clock(Duration::from_secs(30));
        let result = if run_id == "d1" {
            let infra = json!({"success": false, "error": "infrastructure failure",
                "infra": {"stage": "preflight", "reason": "ecc_errors", "detail": "GPU 0", "readings": []}});
            infra.to_string().into_bytes()
        } else {
            sample_result(false)
        };
        app.finish(number, "passed", Some(result)).await;
    }
    for (user, run_id) in [("alice", "a1"), ("alice", "a2"), ("bob", "b1")] {
        let (status, _) = app.submit(&from(user, run_id)).await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    let b1 = app.job("b1").await.build.unwrap().number;
    app.buildkite.start_eval(b1);
    app.event("job.started", b1).await;
    // The agents list is read through its cache, as GET /queues reads it.
    let resp = app
        .client
        .get(format!("{}/queues/H100_BK", app.submit_url))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

/// The page as Chromium renders it shows what the store holds, readable on a phone.
async fn the_page_shows_the_queue_as_the_store_has_it(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("USER_MAX_IN_FLIGHT", "1")]).await;
    busy_queue(&app).await;
    let open = app.store.open_in_queue("h100").await.unwrap();
    let running = open.iter().filter(|j| j.state == JobState::Running).count();
    assert_eq!((open.len(), running), (3, 1), "{open:?}");
    let url = format!("{}/status", app.submit_url);
    let dom = headless(&url, &["--dump-dom"]).await;
    let field = |f| shown(&dom, "h100", f);
    assert_eq!(field("jobs_running"), running.to_string());
    assert_eq!(field("jobs_waiting"), (open.len() - running).to_string());
    assert_eq!(field("agents_paused"), "1");
    assert_eq!(
        field("agents_busy"),
        "0",
        "the stand-in's agents ran nothing"
    );
    assert_eq!(field("agents_idle"), "2");
    assert_eq!(field("jobs_last_24h"), "2");
    assert_eq!(field("infra_failures_last_24h"), "1");
    assert_eq!(field("median_run"), "30 s");
    assert!(dom.contains("GPU queues"), "{dom}");
    assert!(!dom.contains("<script"), "no script needed");
    // A phone's screen, kept for a person to look at.
    let shot = artifacts().join(format!("status-page-{kind:?}.png").to_lowercase());
    let _ = std::fs::remove_file(&shot);
    let screenshot = format!("--screenshot={}", shot.display());
    headless(&url, &[&screenshot, "--window-size=412,915"]).await;
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 5_000,
        "{}",
        png.len()
    );
}

/// Nothing private is on it, as a page or as JSON: no run id, user, title, source, build
/// link, token or webhook; the JSON holds the documented figures only.
async fn nothing_private_is_on_the_page(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("USER_MAX_IN_FLIGHT", "1")]).await;
    busy_queue(&app).await;
    let mut body = from("private-user-4711", "private-run-0815");
    body["title"] = "private title 1234".into();
    body["config"]["sources"]["eval.py"] = "print('private source 9876')".into();
    let (status, _) = app.submit(&body).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let get = |accept: &'static str| {
        let client = reqwest::Client::new();
        let url = format!("{}/status", app.submit_url);
        async move {
            let resp = client
                .get(url)
                .header("accept", accept)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            let cache = resp.headers()["cache-control"].to_str().unwrap().to_owned();
            assert!(cache.contains("max-age"), "{cache}");
            resp.text().await.unwrap()
        }
    };
    let (html, json_text) = (get("text/html").await, get("application/json").await);
    let webhook_token = HOOK_URL.rsplit('/').next().unwrap();
    for text in [&html, &json_text] {
        for private in [
            "private-run-0815",
            "private-user-4711",
            "private title 1234",
            "private source 9876",
            "alice",
            "a1",
            "buildkite.com",
            API_TOKEN,
            webhook_token,
            "vectoradd",
            "ecc_errors",
        ] {
            assert!(!text.contains(private), "{private} leaked: {text}");
        }
    }
    let page: Value = serde_json::from_str(&json_text).unwrap();
    let keys = |v: &Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&page), ["generated_at", "agents_age_ms", "queues"]);
    let h100 = page["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "h100")
        .unwrap();
    assert_eq!(
        keys(h100),
        [
            "queue",
            "gpus",
            "agents_busy",
            "agents_idle",
            "agents_paused",
            "jobs_waiting",
            "jobs_background",
            "jobs_running",
            "median_wait_secs_last_hour",
            "median_run_secs_last_hour",
            "jobs_last_24h",
            "infra_failures_last_24h",
        ]
    );
    assert_eq!(
        h100["jobs_waiting"], 3,
        "a2 and the private run wait their turn, a1 its agent"
    );
}

on_both_stores!(
    the_page_shows_the_queue_as_the_store_has_it,
    nothing_private_is_on_the_page,
);
