//! The real binaries under `cargo lambda watch` (the Lambda runtime emulator), driven through
//! the function-URL path: submit → signed webhooks → final Discord edit. This proves the
//! `lambda_http` event path end to end, and that two function processes share the embedded
//! store. Slow (it builds and starts the functions), so `cargo test` skips it and
//! `scripts/test.sh` runs it.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kernelbot_dispatch::devstack::buildkite::{
    BuildkiteStandin, StepOutcome, StepRunner, sample_result,
};
use kernelbot_dispatch::devstack::discord::DiscordStandin;
use serde_json::{Value, json};

const TOKEN: &str = "watch-submit-token";
const SECRET: &str = "watch-webhook-secret";

/// Kills the emulator and the functions it started (one process group).
struct Emulator(Child);

impl Drop for Emulator {
    fn drop(&mut self) {
        unsafe {
            libc::kill(-(self.0.id() as i32), libc::SIGTERM);
        }
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "slow: builds and runs the functions under cargo lambda watch; scripts/test.sh runs it"]
async fn functions_under_the_lambda_emulator_complete_a_job() {
    let buildkite = BuildkiteStandin::start("watch-bk-token", "org", "kernelbot")
        .await
        .unwrap();
    let discord = DiscordStandin::start().await.unwrap();
    let data = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}/lambda-url");

    let env_file = data.path().join("functions.env");
    let mut f = std::fs::File::create(&env_file).unwrap();
    for (k, v) in [
        ("BUILDKITE_API_URL", buildkite.api_url.as_str()),
        ("BUILDKITE_API_TOKEN", "watch-bk-token"),
        ("BUILDKITE_ORG", "org"),
        ("BUILDKITE_PIPELINE", "kernelbot"),
        ("BUILDKITE_WEBHOOK_SECRET", SECRET),
        ("SUBMIT_API_TOKEN", TOKEN),
        ("DISCORD_API_URL", discord.api_url.as_str()),
        ("KERNELBOT_DATA_DIR", data.path().to_str().unwrap()),
        ("RUST_LOG", "info"),
        ("SWEEP_MIN_AGE_SECS", "0"),
    ] {
        writeln!(f, "{k}={v}").unwrap();
    }
    drop(f);

    let mut cmd = Command::new("cargo");
    cmd.args([
        "lambda",
        "watch",
        "--ignore-changes",
        "-A",
        "127.0.0.1",
        "-P",
        &port.to_string(),
    ])
    .arg("--env-file")
    .arg(&env_file)
    .current_dir(env!("CARGO_MANIFEST_DIR"))
    .stdout(if std::env::var_os("TEST_LOG").is_some() {
        Stdio::inherit()
    } else {
        Stdio::null()
    })
    .stderr(if std::env::var_os("TEST_LOG").is_some() {
        Stdio::inherit()
    } else {
        Stdio::null()
    });
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let _emulator = Emulator(
        cmd.spawn()
            .expect("cargo lambda is installed (scripts/test.sh installs it)"),
    );

    let step: StepRunner = Arc::new(|_| StepOutcome::passed(sample_result(false)));
    buildkite.autorun(&format!("{base}/webhook/webhooks/buildkite"), SECRET, step);

    // The first call waits while the emulator builds and starts the function.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    // The emulator builds each function on its first call: both are asked for their health
    // first, so no webhook of the run reaches a function still being built (and is lost, as
    // the stand-in does not deliver again).
    for function in ["submit", "webhook"] {
        loop {
            let health = client
                .get(format!("{base}/{function}/healthz"))
                .send()
                .await;
            if health.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the {function} function never answered"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let body = json!({"run_id": "watch-1", "gpu": "H100_BK", "title": "under the emulator",
        "config": {"lang": "py", "mode": "test", "main": "eval.py", "sources": {"eval.py": "print(1)"}},
        "discord": {"webhook_url": "https://discord.com/api/webhooks/222222222222222222/watch-token"}});
    let created = loop {
        match client
            .post(format!("{base}/submit/submissions"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
        {
            Ok(resp) => break resp,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("emulator never answered: {e}"),
        }
    };
    let status = created.status();
    let created: Value = created.json().await.unwrap();
    assert_eq!(status.as_u16(), 202, "{created}");
    assert_eq!(created["state"], "scheduled");

    let job = loop {
        let view: Value = client
            .get(format!("{base}/submit/submissions/watch-1"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        // Finished and reported (the state is written before Discord is told).
        if view["state"] == "finished" && view["delivery"]["discord"]["status"] == "delivered" {
            break view;
        }
        assert!(Instant::now() < deadline, "job never finished: {view}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(job["result"]["verdict"], "passed");
    let messages = discord.messages();
    assert_eq!(messages.len(), 1, "one Discord message per job");
    let text = messages.values().next().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(text.contains("✅ success"), "{text}");
    let edits = discord
        .calls()
        .iter()
        .filter(|c| c.method == "PATCH")
        .count();
    assert!(edits >= 1);
}
