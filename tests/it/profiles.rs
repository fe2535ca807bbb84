//! Profile runs through the service, on both stores: a finished profile build's report and
//! status link each profile's zip with a signed link of ours; the link answers 302 to the
//! zip's storage, without our token; a tampered, expired or borrowed link gets 403.

use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use kernelbot_dispatch::devstack::stack::LINK_SECRET;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, LOCATION};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::support::{StoreKind, TestApp, submission};

/// A profile run's `result.json`: two benchmarks profiled, the first with its files kept
/// (and a link of the program's own, which must not survive), the second without.
fn profile_result() -> Vec<u8> {
    let run = |i: usize| {
        json!({"success": true, "passed": true, "exit_code": 0, "duration": 1.0,
            "command": "ncu ... python3 eval.py profile cases.txt", "stdout": "", "stderr": "",
            "result": {"benchmark.0.spec": format!("size: {}", 1024 << i),
                "benchmark.0.report": "ICBjdXN0b21fa2VybmVsKCkKICAgIE1lbW9yeSBUaHJvdWdocHV0ICUgNzEuOTMK"}})
    };
    json!({"success": true, "error": "", "system": {"gpu": "NVIDIA H100 80GB HBM3", "runtime": "CUDA"},
        "runs": {
            "profile.0": {"run": run(0), "profile": {"profiler": "Nsight-Compute", "trace": null,
                "download_url": "https://phishing.example/steal"}},
            "profile.1": {"run": run(1), "profile": null},
        }})
    .to_string()
    .into_bytes()
}

/// A link of ours to `run_id`'s profile `index`, signed to expire at `expires`.
fn signed(base: &str, run_id: &str, index: usize, expires: i64) -> String {
    let path = format!("/submissions/{run_id}/profiles/{index}");
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(LINK_SECRET.as_bytes()).unwrap();
    mac.update(format!("{path}\n{expires}").as_bytes());
    let signature = hex::encode(mac.finalize().into_bytes());
    format!("{base}{path}?expires={expires}&signature={signature}")
}

/// What a click on `url` gets, redirects not followed: status, `Location`, JSON body.
pub(crate) async fn click(url: &str) -> (StatusCode, Option<String>, Value) {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let resp = client.get(url).send().await.expect("the API answers");
    let status = resp.status();
    let location = resp
        .headers()
        .get(LOCATION)
        .map(|l| l.to_str().unwrap().to_owned());
    let body = resp.json().await.unwrap_or(Value::Null);
    (status, location, body)
}

/// Runs `run_id` (in `mode`) to a finished profile build whose first profile left `zip`:
/// the link its status then shows.
pub(crate) async fn finished_with_zip(
    app: &TestApp,
    run_id: &str,
    mode: &str,
    zip: &[u8],
) -> String {
    let mut body = submission(run_id);
    body["config"]["mode"] = json!(mode);
    body["config"]["benchmarks"] = json!([{"size": 1024}, {"size": 2048}]);
    assert_eq!(app.submit(&body).await.0, StatusCode::ACCEPTED);
    let number = app.buildkite.builds().last().expect("a build").number;
    let path = "kernelbot-out/profile.0.zip";
    app.buildkite
        .upload(number, path, zip.to_vec(), "finished", false);
    let finished = app.finish(number, "passed", Some(profile_result())).await;
    assert_eq!(finished, StatusCode::OK);
    let (_, view) = app.status(run_id).await;
    let link = &view["result"]["result"]["runs"]["profile.0"]["profile"]["download_url"];
    link.as_str().unwrap_or_else(|| panic!("{view}")).to_owned()
}

async fn a_profile_s_link_opens_its_zip_and_nothing_else(kind: StoreKind) {
    let key = ("CALLBACK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    let app = TestApp::spawn_with(kind, &[key]).await;
    let zip = b"PK\x03\x04 the profiler's files".to_vec();
    let link = finished_with_zip(&app, "prof-1", "profile", &zip).await;
    let (_, view) = app.status("prof-1").await;
    let runs = &view["result"]["result"]["runs"];
    let prefix = format!("{}/submissions/prof-1/profiles/0?expires=", app.submit_url);
    assert!(link.starts_with(&prefix), "{link}");
    assert_eq!(runs["profile.1"]["profile"], Value::Null);
    // The final report links it, and shows the tables' headline.
    let messages = serde_json::to_string(&app.discord.messages()).unwrap();
    assert!(messages.contains(&format!("(<{link}>)")), "{messages}");
    assert!(messages.contains("Memory Throughput % 71.93"), "{messages}");
    assert!(!messages.contains("phishing.example"), "{messages}");
    // kernelbot's callback carries it too.
    let finished = app.receiver.received();
    let finished = finished
        .iter()
        .find(|r| r.id == "msg_finished_prof-1")
        .expect("called back");
    let called: Value = serde_json::from_slice(&finished.body).unwrap();
    let profile = &called["data"]["result"]["runs"]["profile.0"]["profile"];
    assert_eq!(profile["download_url"].as_str(), Some(link.as_str()));
    assert_eq!(profile["trace"], Value::Null);

    // The link: 302 to the storage, which serves the zip to a request without our token.
    let (status, location, _) = click(&link).await;
    assert_eq!(status, StatusCode::FOUND);
    let location = location.expect("a Location");
    assert!(location.contains("/storage/"), "{location}");
    let download = reqwest::get(&location).await.unwrap();
    assert_eq!(download.status(), StatusCode::OK);
    assert_eq!(download.bytes().await.unwrap().as_ref(), zip.as_slice());

    let expires: i64 = link
        .split("expires=")
        .nth(1)
        .unwrap()
        .split('&')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let mut tampered = link.clone().into_bytes();
    let last = tampered.len() - 1;
    tampered[last] = if tampered[last] == b'0' { b'1' } else { b'0' };
    let now = expires - 7 * 24 * 3600;
    for (url, says) in [
        (String::from_utf8(tampered).unwrap(), "signature"),
        (link.replace("/prof-1/", "/prof-2/"), "signature"),
        (link.replace("/profiles/0?", "/profiles/1?"), "signature"),
        (
            link.replace(
                &format!("expires={expires}"),
                &format!("expires={}", expires + 1),
            ),
            "signature",
        ),
        (signed(&app.submit_url, "prof-1", 0, now - 1), "expired"),
        (
            link.split('?').next().unwrap().to_owned(),
            "not a valid profile link",
        ),
    ] {
        let (status, location, body) = click(&url).await;
        assert_eq!((status, location), (StatusCode::FORBIDDEN, None), "{url}");
        assert_eq!(body["error"], "forbidden");
        assert!(
            body["message"].as_str().unwrap().contains(says),
            "{url}: {body}"
        );
    }
    // Signed, but no such profile: the second run kept no files.
    let (status, _, _) = click(&signed(&app.submit_url, "prof-1", 1, expires)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Seven days on, the link has expired.
    app.advance_clock(Duration::from_secs(7 * 24 * 3600 + 60));
    let (status, _, body) = click(&link).await;
    assert_eq!(
        (status, body["message"].as_str()),
        (StatusCode::FORBIDDEN, Some("the link has expired"))
    );
}

/// A burst of clicks on a run's links (120 at once, as a channel looping two links would)
/// costs Buildkite a call per link, not per click: the storage URL one click obtained is kept
/// in the store for every instance. Every answer is the file's redirect, or says when to try
/// again. The API's token is never what opens a link.
async fn a_burst_of_clicks_costs_buildkite_a_call_per_link(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let link = finished_with_zip(&app, "prof-2", "profile", b"PK").await;
    let downloads = |app: &TestApp| {
        let calls = app.buildkite.api_calls();
        calls.iter().filter(|c| c.ends_with("/download")).count()
    };
    let before = downloads(&app);
    let mut clicks = tokio::task::JoinSet::new();
    for _ in 0..120 {
        let link = link.clone();
        clicks.spawn(async move { click(&link).await });
    }
    let answers = clicks.join_all().await;
    for (status, location, body) in &answers {
        match *status {
            StatusCode::FOUND => {
                assert!(location.as_ref().is_some_and(|l| l.contains("/storage/")))
            }
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                assert!(
                    body["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("try again")),
                    "{body}"
                )
            }
            other => panic!("{other}: {body}"),
        }
    }
    let found = answers.iter().filter(|a| a.0 == StatusCode::FOUND).count();
    let other: Vec<_> = answers
        .iter()
        .filter(|a| a.0 != StatusCode::FOUND)
        .map(|a| (a.0, a.2.to_string()))
        .take(3)
        .collect();
    assert!(found >= 100, "{found} of 120 redirected: {other:?}");
    let calls = downloads(&app) - before;
    assert!(
        (1..=3).contains(&calls),
        "{calls} Buildkite calls for 120 clicks"
    );
    // Half a minute later (storage URLs are signed for a minute): still the kept URL, and it
    // still opens; past three quarters of its life, a fresh one.
    app.advance_clock(Duration::from_secs(30));
    let (status, location, _) = click(&link).await;
    assert_eq!(status, StatusCode::FOUND);
    assert_eq!(downloads(&app) - before, calls);
    let download = reqwest::get(location.unwrap()).await.unwrap();
    assert_eq!(
        download.status(),
        StatusCode::OK,
        "a kept URL is never an expired one"
    );
    app.advance_clock(Duration::from_secs(20));
    assert_eq!(click(&link).await.0, StatusCode::FOUND);
    assert_eq!(
        downloads(&app) - before,
        calls + 1,
        "a fresh URL near the old one's expiry"
    );

    // The submit token opens nothing without a signature.
    let bare = link.split('?').next().unwrap();
    let resp = reqwest::Client::new()
        .get(bare)
        .header(
            AUTHORIZATION,
            format!("Bearer {}", crate::support::API_TOKEN),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
}

/// When Buildkite's quota nears the share kept for submissions and finishes, a click that
/// would need a call answers 503 with `Retry-After`; a kept URL still opens.
async fn a_click_leaves_buildkite_s_reserve_to_submissions(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let link = finished_with_zip(&app, "prof-5", "profile", b"PK").await;
    let other = finished_with_zip(&app, "prof-6", "profile", b"PK").await;
    app.buildkite.rate_limit_remaining(19);
    assert_eq!(
        click(&link).await.0,
        StatusCode::FOUND,
        "the first click spends one"
    );
    let resp = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(&other)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    let retry = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .expect("Retry-After");
    let secs: u64 = retry.to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&secs), "{secs}");
    assert_eq!(
        click(&link).await.0,
        StatusCode::FOUND,
        "a kept URL costs nothing"
    );
}

/// A private run's Discord message shows neither the tables nor the link.
async fn a_private_profile_shows_no_link_in_discord(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let link = finished_with_zip(&app, "prof-3", "private", b"PK").await;
    assert!(link.contains("/profiles/0?"), "the status keeps it: {link}");
    let messages = serde_json::to_string(&app.discord.messages()).unwrap();
    assert!(!messages.contains("/profiles/"), "{messages}");
    assert!(!messages.contains("71.93"), "{messages}");
}

/// A click while Buildkite fails gets an answer that says so (503 while it is down, busy
/// or slow, 404 once the artifact is gone, 502 for an answer that is not a redirect), the
/// next click works again, and the job, its report and its link are as they were.
async fn a_click_while_buildkite_fails_changes_nothing(kind: StoreKind) {
    let app = TestApp::spawn_tuned(kind, &[], Duration::from_secs(1)).await;
    let link = finished_with_zip(&app, "prof-4", "profile", b"PK").await;
    let report = app.discord.messages();
    for (status, answer) in [
        (500, StatusCode::SERVICE_UNAVAILABLE),
        (502, StatusCode::SERVICE_UNAVAILABLE),
        (429, StatusCode::SERVICE_UNAVAILABLE),
        (404, StatusCode::NOT_FOUND),
        (200, StatusCode::BAD_GATEWAY),
    ] {
        app.buildkite
            .fail_download_page(status, "<html>oops</html>");
        let (got, location, body) = click(&link).await;
        assert_eq!(
            (got, location),
            (answer, None),
            "Buildkite {status}: {body}"
        );
        assert!(
            !body.to_string().contains(crate::support::BK_TOKEN),
            "{body}"
        );
    }
    app.buildkite.clear_download_failure();
    app.buildkite.set_delay(Some(Duration::from_secs(3)));
    assert_eq!(
        click(&link).await.0,
        StatusCode::SERVICE_UNAVAILABLE,
        "a slow Buildkite"
    );
    app.buildkite.set_delay(None);
    assert_eq!(click(&link).await.0, StatusCode::FOUND, "and then it works");
    let (_, view) = app.status("prof-4").await;
    assert_eq!(
        (view["state"].as_str(), view["verdict"].as_str()),
        (Some("finished"), Some("passed"))
    );
    assert_eq!(app.discord.messages(), report, "the report is untouched");
}

/// Nsight's tables as the runner keeps them for a submission of three kernels (kernelbot's
/// filter: the first two kernels' three tables, each about 2.5 KB): real size, not a stub.
const TABLES: &str = include_str!("../fixtures/ncu/kept-tables-3-kernels.txt");

/// kernelbot's own decoding of a report value (`base64.b64decode(value, b"+*")`).
fn kernelbot_decodes(value: &str) -> String {
    use std::io::Write;
    let mut python = std::process::Command::new("python3")
        .args(["-c", "import base64, sys; sys.stdout.buffer.write(base64.b64decode(sys.stdin.read(), b'+*'))"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    python
        .stdin
        .take()
        .unwrap()
        .write_all(value.as_bytes())
        .unwrap();
    let out = python.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// Tables of a real size arrive whole: stored as the runner wrote them, the report shows
/// the first kernel and its first rows, and kernelbot decodes the callback's value.
async fn real_size_tables_arrive_whole(kind: StoreKind) {
    use base64::Engine;
    let report = base64::engine::general_purpose::STANDARD.encode(TABLES);
    assert!(report.len() > 6_000, "{} bytes", report.len());
    let app = TestApp::spawn_with(
        kind,
        &[("CALLBACK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")],
    )
    .await;
    let mut body = submission("tables");
    body["config"]["mode"] = json!("profile");
    app.submit(&body).await;
    let result = json!({"success": true, "error": "", "system": {"gpu": "NVIDIA H100 80GB HBM3"},
        "runs": {"profile.0": {"run": {"success": true, "passed": true, "exit_code": 0,
            "result": {"benchmark.0.spec": "size: 4096", "benchmark.0.report": report}},
            "profile": {"profiler": "Nsight-Compute", "trace": null}}}});
    let finished = app
        .finish(1, "passed", Some(result.to_string().into_bytes()))
        .await;
    assert_eq!(finished, StatusCode::OK);

    let job = app.job("tables").await;
    let outcome = job.outcome.expect("finished");
    let stored = outcome.result.as_ref().unwrap().runs["profile.0"]
        .run
        .as_ref()
        .unwrap();
    assert_eq!(
        stored.value("benchmark.0.report").as_deref(),
        Some(report.as_str())
    );
    let messages = serde_json::to_string(&app.discord.messages()).unwrap();
    assert!(
        messages.contains("custom_kernel(const float *, const float *, float *, int)"),
        "{messages}"
    );
    assert!(messages.contains("DRAM Frequency"), "{messages}");
    let received = app.receiver.received();
    let called = received
        .iter()
        .find(|r| r.id == "msg_finished_tables")
        .expect("called back");
    let called: Value = serde_json::from_slice(&called.body).unwrap();
    let value =
        called["data"]["result"]["runs"]["profile.0"]["run"]["result"]["benchmark.0.report"]
            .as_str()
            .expect("the report in the callback");
    assert_eq!(kernelbot_decodes(value), TABLES);
}

/// A deployment without `PROFILE_LINK_SECRET` says so to a link, rather than "not found".
async fn links_on_a_deployment_without_the_secret_say_so(kind: StoreKind) {
    let app = TestApp::spawn_with(kind, &[("PROFILE_LINK_SECRET", "")]).await;
    let url = signed(&app.submit_url, "prof-7", 0, i64::MAX / 2);
    let resp = reqwest::get(&url).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(resp.headers().contains_key(reqwest::header::RETRY_AFTER));
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "profile_links_not_configured", "{body}");
}

on_both_stores!(
    links_on_a_deployment_without_the_secret_say_so,
    a_burst_of_clicks_costs_buildkite_a_call_per_link,
    a_click_leaves_buildkite_s_reserve_to_submissions,
    real_size_tables_arrive_whole,
    a_click_while_buildkite_fails_changes_nothing,
    a_profile_s_link_opens_its_zip_and_nothing_else,
    a_private_profile_shows_no_link_in_discord
);
