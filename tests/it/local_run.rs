//! The binaries as a user runs them: the README's local command, and start-up checks.

use std::io::{BufRead, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

use kernelbot_dispatch::devstack::runner_program::RUNNER_VAR;

#[test]
fn the_local_run_finishes_a_job_and_prints_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_local"))
        .env("KERNELBOT_DATA_DIR", dir.path())
        // Every log line, so the check below covers all of them.
        .env("RUST_LOG", "trace")
        .output()
        .expect("local runs");
    let wall = started.elapsed().as_secs_f64();
    let (stdout, logs) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "stdout:\n{stdout}\nlogs:\n{logs}");
    assert!(stdout.contains("POST /submissions → 202"), "{stdout}");
    assert!(stdout.contains("\"finished\""), "{stdout}");
    assert!(
        stdout.contains("✅ success") && stdout.contains("Passed 3/3 tests"),
        "{stdout}"
    );
    assert!(
        dir.path().join("jobs.sqlite3").exists(),
        "the embedded store was used"
    );
    // The report's times are what happened: the whole run took `wall`.
    let (queued, ran) = shown_timings(&stdout);
    assert!(
        queued + ran <= wall,
        "queued {queued} s, ran {ran} s in {wall:.1} s"
    );
    // A fresh random submit token, printed and written owner-only for scripts.
    let token = std::fs::read_to_string(dir.path().join("submit-token")).unwrap();
    let token = token.trim();
    assert!(
        token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "{token}"
    );
    assert!(stdout.contains(&format!("Bearer {token}")), "{stdout}");
    let mode = std::fs::metadata(dir.path().join("submit-token"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // The run id is on the job's log lines; no secret is on any line.
    assert!(logs.contains("run_id"), "{logs}");
    for secret in ["local-demo-token", token] {
        assert!(!logs.contains(secret), "{secret} appeared in the logs");
    }
}

/// The seconds a report's `⏱ Queued for <a> s, ran for <b> s` line shows.
fn shown_timings(report: &str) -> (f64, f64) {
    let line = report
        .lines()
        .find_map(|l| l.split_once("⏱ Queued for ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no timing line in {report}"));
    let (queued, ran) = line.split_once(", ran for ").expect("both times");
    // "12.3 s", or "1 min 5 s" on a slow machine.
    let secs = |t: &str| -> f64 {
        let t = t.trim();
        let (mins, rest) = t.split_once(" min ").unwrap_or(("0", t));
        let parsed = rest
            .strip_suffix(" s")
            .and_then(|n| n.parse::<f64>().ok())
            .zip(mins.parse::<f64>().ok());
        let (s, m) = parsed.unwrap_or_else(|| panic!("{t:?} is not a time under an hour"));
        m * 60.0 + s
    };
    (secs(queued), secs(ran))
}

#[test]
fn a_function_without_its_configuration_names_what_is_missing() {
    for (bin, missing) in [
        (env!("CARGO_BIN_EXE_submit"), "SUBMIT_API_TOKEN"),
        (env!("CARGO_BIN_EXE_webhook"), "BUILDKITE_WEBHOOK_SECRET"),
    ] {
        let out = Command::new(bin)
            .env_clear()
            .env("BUILDKITE_ORG", "o")
            .env("BUILDKITE_PIPELINE", "p")
            .env("BUILDKITE_API_TOKEN", "t")
            .output()
            .expect("binary runs");
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(missing), "{bin}: {stderr}");
    }
}

#[test]
fn a_function_serves_its_router_on_listen_addr() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_webhook"))
        .env_clear()
        .env("BUILDKITE_ORG", "o")
        .env("BUILDKITE_PIPELINE", "p")
        .env("BUILDKITE_API_TOKEN", "t")
        .env("BUILDKITE_WEBHOOK_SECRET", "s")
        .env("KERNELBOT_DATA_DIR", dir.path())
        .env("LISTEN_ADDR", format!("127.0.0.1:{port}"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("webhook starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let answer = loop {
        use std::io::{Read, Write};
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut buf = String::new();
            s.read_to_string(&mut buf).unwrap();
            break buf;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "webhook did not listen"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

fn sweep(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sweep"))
        .args(args)
        .env_clear()
        .env("BUILDKITE_ORG", "o")
        .env("BUILDKITE_PIPELINE", "p")
        .env("BUILDKITE_API_TOKEN", "t")
        .env("KERNELBOT_DATA_DIR", dir)
        .output()
        .expect("sweep runs")
}

#[test]
fn the_sweep_re_drives_one_run_and_refuses_a_bad_run_id() {
    let dir = tempfile::tempdir().unwrap();
    let one = sweep(dir.path(), &["--run-id", "never-seen"]);
    assert!(
        one.status.success(),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
    assert!(String::from_utf8_lossy(&one.stdout).starts_with("sweep: checked 0"));
    let bad = sweep(dir.path(), &["--run-id", "no/slashes"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--run-id"));
}

#[test]
fn the_sweep_makes_one_pass_and_prints_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sweep"))
        .env_clear()
        .env("BUILDKITE_ORG", "o")
        .env("BUILDKITE_PIPELINE", "p")
        .env("BUILDKITE_API_TOKEN", "t")
        .env("KERNELBOT_DATA_DIR", dir.path())
        .output()
        .expect("sweep runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim(),
        "sweep: checked 0 unfinished jobs: 0 finished, 0 failed, 0 advanced, 0 unchanged, \
         0 builds created, 0 creates deferred, 0 reports sent, 0 reports pending, 0 errors; \
         0 Buildkite calls"
    );
}

/// One raw HTTP/1.1 request; the answer's status line and body.
fn http(port: u16, host: &str, path: &str, token: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn serve_takes_the_token_from_the_environment_and_answers_only_to_localhost() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_local"))
        .arg("--serve")
        .env("KERNELBOT_DATA_DIR", dir.path())
        .env("SUBMIT_API_TOKEN", "token-chosen-by-the-user")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("local starts");
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut submit, mut standin) = (None, None);
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("buildkite stand-in http://127.0.0.1:") {
            standin = rest.split('/').next().and_then(|p| p.parse::<u16>().ok());
        }
        if let Some(rest) = line.strip_prefix("submit   http://127.0.0.1:") {
            submit = rest
                .split_whitespace()
                .next()
                .and_then(|p| p.parse::<u16>().ok());
        }
        if line.starts_with("Serving until Ctrl-C") {
            break;
        }
    }
    let port = submit.expect("the submit URL was printed");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("submit-token"))
            .unwrap()
            .trim(),
        "token-chosen-by-the-user"
    );
    let local = format!("127.0.0.1:{port}");
    let rebound = http(
        port,
        &format!("attacker.example:{port}"),
        "/submissions/nope",
        "token-chosen-by-the-user",
    );
    let known = http(
        port,
        &local,
        "/submissions/nope",
        "token-chosen-by-the-user",
    );
    let wrong = http(
        port,
        &format!("localhost:{port}"),
        "/submissions/nope",
        "guess",
    );
    // The stand-ins beside them too: a rebound page cannot have the stand-in run a build.
    let bk = standin.expect("the stand-in's URL was printed");
    let standin_rebound = http(
        bk,
        &format!("attacker.example:{bk}"),
        "/v2/organizations/local-org/pipelines/kernelbot/builds",
        "x",
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        standin_rebound.starts_with("HTTP/1.1 421"),
        "{standin_rebound}"
    );
    assert!(rebound.starts_with("HTTP/1.1 421"), "{rebound}");
    assert!(rebound.contains("wrong_host"), "{rebound}");
    assert!(known.starts_with("HTTP/1.1 404"), "{known}");
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
}

/// `local --serve` serves from its first lines whatever the sample run does: a runner that
/// never ends (a machine too busy to finish it) holds nothing back and ends nothing.
#[test]
fn serve_serves_at_once_while_the_sample_is_still_running() {
    let dir = tempfile::tempdir().unwrap();
    let runner = dir.path().join("slow-runner");
    std::fs::write(&runner, "#!/bin/sh\nexec sleep 60\n").unwrap();
    std::fs::set_permissions(&runner, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (mut child, rx) = serve(dir.path(), (RUNNER_VAR, runner.as_os_str()));
    let (mut submit, mut sample, mut serving) = (None, None, false);
    // Far less than the sample's own wait (5 min) and the runner's 60 s.
    while let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(45)) {
        if let Some(rest) = line.strip_prefix("submit   ") {
            submit = rest.split_whitespace().next().map(str::to_owned);
        }
        if let Some(id) = line.trim().strip_prefix("\"run_id\": \"") {
            sample = id.split('"').next().map(str::to_owned);
        }
        if line.starts_with("Serving until Ctrl-C") {
            serving = true;
            break;
        }
    }
    assert!(serving, "local --serve did not serve while its sample ran");
    let (submit, sample) = (submit.expect("submit URL"), sample.expect("sample run id"));
    let token = std::fs::read_to_string(dir.path().join("submit-token")).unwrap();
    let port: u16 = submit.rsplit(':').next().unwrap().parse().unwrap();
    let local = format!("127.0.0.1:{port}");
    let answer = http(
        port,
        &local,
        &format!("/submissions/{sample}"),
        token.trim(),
    );
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let view: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("{answer}"));
    let alive = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(alive, "local --serve ended");
    assert_ne!(view["state"], "finished", "{view}");
    assert_ne!(view["state"], "failed", "{view}");
}

/// `local --serve` on data directory `dir` with one more variable set; its stdout's lines
/// as they come (read to the end: the stack prints as it runs).
fn serve(
    dir: &std::path::Path,
    (name, value): (&str, &std::ffi::OsStr),
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_local"))
        .arg("--serve")
        .env("KERNELBOT_DATA_DIR", dir)
        .env(name, value)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("local starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// A harness for profile mode: reports each benchmark as kernelbot's does.
const PROFILE_HARNESS: &str = r#"
import os, sys
mode, cases = sys.argv[1], open(sys.argv[2]).read().splitlines()
out = os.fdopen(int(os.environ["POPCORN_FD"]), "w")
out.write(f"benchmark-count: {len(cases)}\n")
for i, c in enumerate(cases):
    out.write(f"benchmark.{i}.spec: {c}\nbenchmark.{i}.status: pass\n")
out.write("check: pass\n")
"#;

/// The README's local stack (`local --serve`) with each vendor's stand-in profiler on its
/// PATH: a profile submission runs under the profiler, its zip is uploaded, the finished
/// job links it, and the link answers 302 to the stand-in's storage, which serves the zip.
#[tokio::test]
async fn a_profile_submission_through_the_local_stack_links_its_download() {
    for (vendor, in_zip) in [
        ("gpu-nvidia", "profile.ncu-rep"),
        ("gpu-amd", "_kernel_trace.csv"),
    ] {
        let stand_ins = crate::runner::gpu_stand_ins(vendor);
        let dir = tempfile::tempdir().unwrap();
        let path = format!(
            "{}:{}",
            stand_ins.path().display(),
            std::env::var("PATH").unwrap()
        );
        let (mut child, rx) = serve(dir.path(), ("PATH", path.as_ref()));
        // Start-up includes cargo's build of the runner where `KERNELBOT_RUNNER` names none
        // (`scripts/test.sh` names the one it built): minutes, on a busy machine.
        let submit = loop {
            let line = rx
                .recv_timeout(std::time::Duration::from_secs(300))
                .expect("the submit URL was printed");
            if let Some(url) = line
                .strip_prefix("submit   ")
                .and_then(|r| r.split_whitespace().next())
            {
                break url.to_owned();
            }
        };
        let token = std::fs::read_to_string(dir.path().join("submit-token")).unwrap();
        let link = profile_link(&submit, token.trim(), vendor).await;
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let answer = client.get(&link).send().await.unwrap();
        assert_eq!(answer.status(), reqwest::StatusCode::FOUND, "{vendor}");
        let storage = answer.headers()[reqwest::header::LOCATION]
            .to_str()
            .unwrap()
            .to_owned();
        let zip = reqwest::get(&storage).await.unwrap().bytes().await.unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let archive = zip::ZipArchive::new(std::io::Cursor::new(zip.to_vec())).unwrap();
        let names: Vec<String> = archive
            .file_names()
            .map(|n| n.unwrap().into_owned())
            .collect();
        assert!(
            names.iter().any(|n| n.ends_with(in_zip)),
            "{vendor}: {names:?}"
        );
    }
}

/// Submits a profile run to `submit` and waits for it to finish: its profile link.
async fn profile_link(submit: &str, token: &str, vendor: &str) -> String {
    let client = reqwest::Client::new();
    let body = serde_json::json!({
        "run_id": format!("prof-{vendor}"), "gpu": "H100_BK",
        "config": {"lang": "py", "mode": "profile", "main": "eval.py",
            "sources": {"eval.py": PROFILE_HARNESS}, "benchmarks": [{"size": 1024}]}});
    let resp = client
        .post(format!("{submit}/submissions"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::ACCEPTED);
    let status_url = format!("{submit}/submissions/prof-{vendor}");
    // Up to 5 minutes: the run is the real runner on Python, which the whole suite's
    // parallel load on two cores can slow far past its few seconds alone.
    for _ in 0..1500 {
        let view: serde_json::Value = client
            .get(&status_url)
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if view["state"] == "finished" {
            let run = &view["result"]["result"]["runs"]["profile.0"];
            assert_eq!(view["verdict"], "passed", "{view}");
            return run["profile"]["download_url"]
                .as_str()
                .unwrap_or_else(|| panic!("{view}"))
                .to_owned();
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("the profile run did not finish");
}
