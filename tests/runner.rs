//! The runner as the pipeline step runs it: a real process, real Python subprocesses, a
//! payload in the environment and `result.json` in the working directory.

use std::process::Command;

use kernelbot_dispatch::payload;
use kernelbot_dispatch::result::FullResult;
use serde_json::{Value, json};

/// An evaluation harness speaking kernelbot's protocol: `eval.py <mode> <cases file>`,
/// verdict lines on the pipe whose fd is in POPCORN_FD. `BEHAVIOUR` picks what it does.
const HARNESS: &str = r#"
import os, sys, time, subprocess
mode, cases = sys.argv[1], open(sys.argv[2]).read().splitlines()
out = os.fdopen(int(os.environ["POPCORN_FD"]), "w")
def say(k, v): out.write(f"{k}: {v}\n"); out.flush()
behaviour = BEHAVIOUR
if behaviour == "timeout":
    child = subprocess.Popen(["sleep", "1000"])
    open("child.pid", "w").write(str(child.pid))
    with open(os.environ["PID_FILE"], "w") as f: f.write(str(child.pid))
    time.sleep(1000)
if behaviour == "escape":
    child = subprocess.Popen(["setsid", "sleep", "1000"])
    with open(os.environ["PID_FILE"], "w") as f: f.write(str(child.pid))
if behaviour == "crash":
    raise RuntimeError("kernel exploded")
if behaviour == "huge":
    for i in range(200000): print("line", i, "x" * 50)
say("mode", mode)
say(f"{mode}-count", len(cases))
for i, c in enumerate(cases):
    say(f"{mode}.{i}.spec", c)
    say(f"{mode}.{i}.status", "fail" if behaviour == "fail" else "pass")
    if mode != "test":
        say(f"{mode}.{i}.mean", 1500.0); say(f"{mode}.{i}.err", 5.0)
say("seed", os.environ.get("POPCORN_SEED", ""))
say("affinity", ",".join(map(str, sorted(os.sched_getaffinity(0)))))
say("check", "fail" if behaviour == "fail" else "pass")
sys.exit(112 if behaviour == "fail" else 0)
"#;

fn config(behaviour: &str, mode: &str) -> Value {
    json!({
        "lang": "py", "mode": mode, "main": "eval.py",
        "sources": {"eval.py": HARNESS.replace("BEHAVIOUR", &format!("{behaviour:?}")), "submission.py": "def kernel(x):\n    return x\n"},
        "tests": [{"size": 1024, "seed": 1}, {"size": 4096, "seed": 2}],
        "benchmarks": [{"size": 8192}, {"size": 16384}],
        "test_timeout": 30, "benchmark_timeout": 30, "ranked_timeout": 30, "seed": 42
    })
}

struct Run {
    code: i32,
    stdout: String,
    result: Option<FullResult>,
    raw: Option<Value>,
}

fn run_with(vars: &[(&str, String)]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_runner"))
        .current_dir(dir.path())
        .env_remove("KERNELBOT_PAYLOAD")
        .env_remove("SUBMISSION_PAYLOAD")
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("runner runs");
    let path = dir.path().join("result.json");
    let bytes = std::fs::read(&path).ok();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr),
        result: bytes
            .as_deref()
            .map(|b| FullResult::parse(b).expect("result.json is a FullResult")),
        raw: bytes.map(|b| serde_json::from_slice(&b).unwrap()),
    }
}

fn run(config: &Value) -> Run {
    run_with(&[("KERNELBOT_PAYLOAD", payload::encode(config).unwrap())])
}

#[test]
fn a_passing_submission_reports_every_case() {
    let r = run(&config("pass", "test"));
    assert_eq!(r.code, 0, "{}", r.stdout);
    let result = r.result.unwrap();
    assert!(result.success && result.error.is_empty());
    let test = result.runs["test"].run.as_ref().unwrap();
    assert!(test.success && test.passed, "{test:?}");
    assert_eq!(test.value("mode").as_deref(), Some("test"));
    assert_eq!(
        test.value("test.0.spec").as_deref(),
        Some("size: 1024; seed: 1")
    );
    assert_eq!(
        test.value("test.1.spec").as_deref(),
        Some("size: 4096; seed: 2")
    );
    assert_eq!(test.value("seed").as_deref(), Some("42"));
    assert!(test.command.contains("eval.py test"), "{}", test.command);
    assert!(result.system.platform.starts_with("Linux-"));
    // kernelbot's shape: start/end timestamps and all four parts present.
    let raw = r.raw.unwrap();
    for key in ["start", "end", "compilation", "run", "profile"] {
        assert!(raw["runs"]["test"].get(key).is_some(), "missing {key}");
    }
    for key in [
        "gpu",
        "device_count",
        "cpu",
        "runtime",
        "platform",
        "torch",
        "hostname",
    ] {
        assert!(raw["system"].get(key).is_some(), "missing system.{key}");
    }
}

#[test]
fn a_failing_test_is_an_honest_failure_with_exit_zero() {
    let r = run(&config("fail", "test"));
    assert_eq!(r.code, 0);
    let test = r.result.unwrap().runs["test"].run.clone().unwrap();
    assert!(test.success, "exit 112 is a completed validation");
    assert!(!test.passed);
    assert_eq!(test.exit_code, 112);
}

#[test]
fn leaderboard_mode_runs_all_three_on_a_pass_and_stops_on_a_failure() {
    let r = run(&config("pass", "leaderboard")).result.unwrap();
    assert_eq!(
        r.runs.keys().collect::<Vec<_>>(),
        ["benchmark", "leaderboard", "test"]
    );
    let bench = r.runs["benchmark"].run.as_ref().unwrap();
    // ranking_by "last": only the last benchmark case is run.
    assert_eq!(bench.value("benchmark-count").as_deref(), Some("1"));
    assert_eq!(
        bench.value("benchmark.0.spec").as_deref(),
        Some("size: 16384")
    );
    let failed = run(&config("fail", "leaderboard")).result.unwrap();
    assert_eq!(failed.runs.keys().collect::<Vec<_>>(), ["test"]);
}

#[test]
fn a_timeout_kills_the_whole_process_group() {
    let pid_dir = tempfile::tempdir().unwrap();
    let pid_file = pid_dir.path().join("pid");
    let mut cfg = config("timeout", "test");
    cfg["test_timeout"] = json!(1);
    let started = std::time::Instant::now();
    let r = run_with(&[
        ("KERNELBOT_PAYLOAD", payload::encode(&cfg).unwrap()),
        ("PID_FILE", pid_file.to_string_lossy().into_owned()),
    ]);
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(r.code, 0);
    let test = r.result.unwrap().runs["test"].run.clone().unwrap();
    assert_eq!(
        (test.success, test.exit_code, test.duration),
        (false, 114, 1.0)
    );
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The grandchild (`sleep 1000`) is gone too: no such process, or only its zombie
    // waiting to be reaped by whoever inherited it.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let alive = state
        .rsplit_once(") ")
        .is_some_and(|(_, rest)| !rest.starts_with('Z'));
    assert!(!alive, "grandchild {pid} survived the timeout: {state}");
}

#[test]
fn a_crash_is_reported_with_its_traceback() {
    let test = run(&config("crash", "test")).result.unwrap().runs["test"]
        .run
        .clone()
        .unwrap();
    assert!(!test.success && !test.passed);
    assert_eq!(test.exit_code, 1);
    assert!(
        test.stderr.contains("RuntimeError: kernel exploded"),
        "{}",
        test.stderr
    );
}

#[test]
fn huge_output_is_capped() {
    let test = run(&config("huge", "test")).result.unwrap().runs["test"]
        .run
        .clone()
        .unwrap();
    assert!(test.passed);
    assert!(test.stdout.len() <= 16 * 1024, "{}", test.stdout.len());
    assert!(
        test.stdout.ends_with("lines omitted"),
        "{}",
        &test.stdout[test.stdout.len() - 60..]
    );
}

#[test]
fn no_payload_is_not_an_error_and_writes_nothing() {
    let r = run_with(&[]);
    assert_eq!(r.code, 0);
    assert!(r.stdout.contains("No KERNELBOT_PAYLOAD"), "{}", r.stdout);
    assert!(r.result.is_none());
}

#[test]
fn a_corrupt_payload_is_reported_in_result_json() {
    let zlib_not_json = "eJzLyy9RyCrOzwMADiYDLA==";
    for (payload, says) in [
        ("%%%not base64", "base64"),
        ("aGVsbG8=", "zlib"),
        (zlib_not_json, "JSON"),
    ] {
        let r = run_with(&[("KERNELBOT_PAYLOAD", payload.to_owned())]);
        assert_eq!(r.code, 2, "{payload}");
        let result = r.result.expect("result.json written");
        assert!(!result.success);
        assert!(result.error.contains(says), "{}", result.error);
    }
    let r = run(&json!({"lang": "py", "mode": "test"}));
    assert_eq!(r.code, 2);
    assert!(r.result.unwrap().error.contains("sources is required"));
}

#[test]
fn the_older_variable_and_files_key_still_work() {
    let mut cfg = config("pass", "test");
    let sources = cfg.as_object_mut().unwrap().remove("sources").unwrap();
    cfg["files"] = sources;
    let r = run_with(&[("SUBMISSION_PAYLOAD", payload::encode(&cfg).unwrap())]);
    assert!(r.result.unwrap().runs["test"].run.as_ref().unwrap().passed);
}

#[test]
fn cuda_without_nvcc_is_a_clear_compilation_failure() {
    let cfg = json!({"lang": "cu", "mode": "test", "sources": {"kernel.cu": "__global__ void k() {}"}, "tests": [{"n": 1}]});
    let r = run_with(&[
        ("KERNELBOT_PAYLOAD", payload::encode(&cfg).unwrap()),
        ("NVCC", "/nonexistent/nvcc".into()),
    ]);
    assert_eq!(r.code, 0);
    let test = &r.result.unwrap().runs["test"];
    let compilation = test.compilation.as_ref().unwrap();
    assert!(!compilation.nvcc_found && !compilation.success);
    assert!(compilation.stderr.contains("nvcc was not found"));
    assert!(test.run.is_none());
}

#[test]
fn source_names_cannot_escape_the_work_directory() {
    let mut cfg = config("pass", "test");
    cfg["sources"]["../escape.py"] = json!("print(1)");
    let r = run(&cfg);
    let result = r.result.unwrap();
    assert!(!result.success);
    assert!(result.error.contains("../escape.py"));
    assert!(result.runs.is_empty());
}

#[test]
fn a_process_that_escapes_the_group_cannot_hold_the_runner() {
    // It leaves a `setsid sleep` behind with our stdout open; the runner still finishes.
    let pid_dir = tempfile::tempdir().unwrap();
    let pid_file = pid_dir.path().join("pid");
    let started = std::time::Instant::now();
    let r = run_with(&[
        (
            "KERNELBOT_PAYLOAD",
            payload::encode(&config("escape", "test")).unwrap(),
        ),
        ("PID_FILE", pid_file.to_string_lossy().into_owned()),
    ]);
    if let Ok(pid) = std::fs::read_to_string(&pid_file) {
        unsafe { libc::kill(pid.trim().parse().unwrap_or(0), libc::SIGKILL) };
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!(r.code, 0);
    assert!(r.result.unwrap().runs["test"].run.as_ref().unwrap().passed);
}

#[test]
fn the_evaluation_runs_on_the_agents_cpu_set() {
    let r = run_with(&[
        (
            "KERNELBOT_PAYLOAD",
            payload::encode(&config("pass", "test")).unwrap(),
        ),
        ("KERNELBOT_CPUSET", "0".into()),
    ]);
    let test = r.result.unwrap().runs["test"].run.clone().unwrap();
    assert_eq!(test.value("affinity").as_deref(), Some("0"), "{}", r.stdout);
}
