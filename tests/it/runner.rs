//! The runner as the pipeline step runs it: a real process, real Python subprocesses, a
//! payload in the environment and `result.json` in the working directory.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use kernelbot_dispatch::devstack::runner_program::runner_program;
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
    print("child-pid:", child.pid, flush=True)
    time.sleep(1000)
if behaviour == "escape":
    child = subprocess.Popen(["setsid", "sleep", "1000"])
    print("child-pid:", child.pid, flush=True)
if behaviour == "crash":
    raise RuntimeError("kernel exploded")
if behaviour == "leak" and mode == "profile":
    # What a hostile program could leave for the profile's zip: links out of its directory.
    os.symlink("/etc/passwd", "profile_data/passwd")
    os.symlink("/", "profile_data/root")
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
say("gpus", os.environ.get("POPCORN_GPUS", "unset"))
say("check", "fail" if behaviour == "fail" else "pass")
sys.exit(112 if behaviour == "fail" else 0)
"#;

pub(crate) fn config(behaviour: &str, mode: &str) -> Value {
    json!({
        "lang": "py", "mode": mode, "main": "eval.py",
        "sources": {"eval.py": HARNESS.replace("BEHAVIOUR", &format!("{behaviour:?}")), "submission.py": "def kernel(x):\n    return x\n"},
        "tests": [{"size": 1024, "seed": 1}, {"size": 4096, "seed": 2}],
        "benchmarks": [{"size": 8192}, {"size": 16384}],
        "test_timeout": 30, "benchmark_timeout": 30, "ranked_timeout": 30, "seed": 42
    })
}

pub(crate) struct Run {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) result: Option<FullResult>,
    pub(crate) raw: Option<Value>,
    /// `infra.txt`, the line the agent's hook pauses the agent with.
    pub(crate) infra_line: Option<String>,
}

fn is_root() -> bool {
    // SAFETY: plain syscall.
    unsafe { libc::geteuid() == 0 }
}

/// A sandbox uid for one runner: tests run side by side, and a runner ends every process of
/// its uid, so no two runners may share one (on a node, one agent per GPU sees to that).
fn sandbox_uid() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // pid_max is at most 2^22: a block of 64 per test process, apart from the stand-in
    // agent's (which starts at 1_000_000_000).
    1_500_000_000 + std::process::id() * 64 + NEXT.fetch_add(1, Ordering::Relaxed) % 64
}

/// A checkout as the agent leaves it: world-readable, `.git/` with hooks and a config, owned
/// by the agent (here: whoever runs the tests).
pub(crate) fn checkout() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join(".git/hooks")).unwrap();
    std::fs::write(dir.path().join(".git/config"), GIT_CONFIG).unwrap();
    std::fs::write(dir.path().join("pipeline.yml"), "steps: []\n").unwrap();
    for d in [
        dir.path(),
        &dir.path().join(".git"),
        &dir.path().join(".git/hooks"),
    ] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

const GIT_CONFIG: &str = "[core]\n\trepositoryformatversion = 0\n";

fn run_in(dir: &Path, vars: &[(&str, String)], user: Option<u32>) -> Run {
    // Another user may not reach the build directory: that run gets a copy it can.
    let copy = user.map(|_| runner_copy());
    let binary = copy
        .as_ref()
        .map_or_else(|| runner_link().to_owned(), |(_, bin)| bin.clone());
    run_binary(&binary, dir, vars, user)
}

/// Runs `binary` as the pipeline step runs the runner, in `dir`.
pub(crate) fn run_binary(
    binary: &Path,
    dir: &Path,
    vars: &[(&str, String)],
    user: Option<u32>,
) -> Run {
    let mut cmd = Command::new(binary);
    cmd.current_dir(dir)
        .env_remove("KERNELBOT_PAYLOAD")
        .env_remove("SUBMISSION_PAYLOAD")
        .env("KERNELBOT_SANDBOX_UID", sandbox_uid().to_string())
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())));
    if let Some(uid) = user {
        cmd.uid(uid).gid(uid);
    }
    let out = cmd.output().expect("runner runs");
    let path = dir.join("result.json");
    let bytes = std::fs::read(&path).ok();
    let infra_line = std::fs::read_to_string(dir.join("infra.txt")).ok();
    Run {
        infra_line,
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr),
        result: bytes
            .as_deref()
            .map(|b| FullResult::parse(b).expect("result.json is a FullResult")),
        raw: bytes.map(|b| serde_json::from_slice(&b).unwrap()),
    }
}

/// The runner as the local stack runs it: the runner crate's own binary, the one
/// `KERNELBOT_RUNNER` names (`scripts/test.sh` names the one it built) or else built from this
/// workspace as it is now. Found (and built) once for the whole test process.
pub(crate) fn runner_link() -> &'static Path {
    static RUNNER: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    RUNNER.get_or_init(|| runner_program().expect("the runner binary builds"))
}

/// The runner binary, copied where any user may run it; gone with the directory.
fn runner_copy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("kernelbot-runner");
    std::fs::copy(runner_link(), &bin).unwrap();
    (dir, bin)
}

fn run_with(vars: &[(&str, String)]) -> Run {
    let dir = checkout();
    run_in(dir.path(), vars, None)
}

/// Output lines `key: value` of a program's stdout.
fn printed(stdout: &str, key: &str) -> Option<String> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().to_owned())
}

/// Live (not zombie) processes of `uid`.
fn alive_of(uid: u32) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| {
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.split_whitespace().next().unwrap_or_default().to_owned())
            };
            // A zombie leader with threads still running is alive.
            let running = field("State:")? != "Z" || field("Threads:")? != "1";
            (field("Uid:")? == uid.to_string() && running)
                .then(|| status.lines().take(3).collect::<Vec<_>>().join(" "))
        })
        .collect()
}

fn pid_alive(pid: i32) -> bool {
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    state
        .rsplit_once(") ")
        .is_some_and(|(_, rest)| !rest.starts_with('Z'))
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
    let mut cfg = config("timeout", "test");
    // Time enough for Python to start and print its child's pid on a loaded machine.
    cfg["test_timeout"] = json!(5);
    let started = std::time::Instant::now();
    let r = run_with(&[("KERNELBOT_PAYLOAD", payload::encode(&cfg).unwrap())]);
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!(r.code, 0);
    let test = r.result.unwrap().runs["test"].run.clone().unwrap();
    assert_eq!(
        (test.success, test.exit_code, test.duration),
        (false, 114, 5.0)
    );
    let pid: i32 = printed(&test.stdout, "child-pid")
        .expect("the program printed its child's pid")
        .parse()
        .unwrap();
    // The grandchild (`sleep 1000`) is gone too, not even a zombie: the runner reaped it.
    assert!(!pid_alive(pid), "grandchild {pid} survived the timeout");
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
    // It leaves a `setsid sleep` behind with our stdout open; the runner still finishes, and
    // the sleep is gone when it does.
    let started = std::time::Instant::now();
    let r = run_with(&[(
        "KERNELBOT_PAYLOAD",
        payload::encode(&config("escape", "test")).unwrap(),
    )]);
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!(r.code, 0);
    let test = r.result.unwrap().runs["test"].run.clone().unwrap();
    assert!(test.passed);
    let pid: i32 = printed(&test.stdout, "child-pid").unwrap().parse().unwrap();
    assert!(
        !pid_alive(pid),
        "the setsid child {pid} outlived the runner"
    );
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

/// What an attacker's `eval.py` tries: plant a git hook and a git config the agent runs on the
/// host, rewrite the checkout, forge `result.json` (directly, by symlink, and from a daemon
/// that outlives the program), read the runner's secrets, reach the network.
const ATTACKER: &str = r##"
import os, socket, subprocess, sys
out = os.fdopen(int(os.environ["POPCORN_FD"]), "w")
def say(k, v): out.write(f"{k}: {v}\n"); out.flush()
checkout = CHECKOUT
def attempt(name, f):
    try:
        f(); say(f"try.{name}", "done")
    except Exception as e:
        say(f"try.{name}", type(e).__name__)
def write(path, text, mode="w"):
    with open(os.path.join(checkout, path), mode) as f: f.write(text)
attempt("hook", lambda: write(".git/hooks/post-checkout", "#!/bin/sh\necho pwned\n"))
attempt("git_config", lambda: write(".git/config", "[core]\n\tfsmonitor = echo pwned\n", "a"))
attempt("checkout", lambda: write("pipeline.yml", "pwned"))
attempt("new_file", lambda: write("planted.sh", "pwned"))
attempt("result", lambda: write("result.json", "forged"))
attempt("result_symlink", lambda: os.symlink("/etc/passwd", os.path.join(checkout, "result.json")))
attempt("runner_environ", lambda: open(f"/proc/{os.getppid()}/environ", "rb").read())
attempt("network", lambda: socket.create_connection(("127.0.0.1", PORT), timeout=2).close())
daemon = """
import os, sys, time
if os.fork(): sys.exit(0)
os.setsid()
if os.fork(): sys.exit(0)
end = time.time() + 8
while time.time() < end:
    try:
        open(sys.argv[1], "w").write('{"success": true, "error": "forged"}')
    except OSError:
        pass
    time.sleep(0.02)
"""
subprocess.Popen([sys.executable, "-c", daemon, os.path.join(checkout, "result.json")]).wait()
subprocess.Popen(["setsid", "sleep", "1000"])
# A leader that looks ended (a zombie) while its other thread keeps running.
hidden = """
import ctypes, os, sys, threading, time
if os.fork(): sys.exit(0)
os.setsid()
def loop():
    end = time.time() + 8
    while time.time() < end:
        try:
            open(sys.argv[1], "w").write("forged")
        except OSError:
            pass
        time.sleep(0.02)
threading.Thread(target=loop).start()
ctypes.CDLL(None).pthread_exit(None)
"""
subprocess.Popen([sys.executable, "-c", hidden, os.path.join(checkout, "result.json")]).wait()
say("uid", os.getuid())
say("env", ",".join(sorted(os.environ)))
say("secret_seen", any("secret-agent-token" in v for v in os.environ.values()))
say("check", "pass")
"##;

#[test]
fn an_attackers_program_is_contained() {
    if !is_root() {
        eprintln!(
            "skipped: the sandbox needs a root runner (CI runs as root, as the container does)"
        );
        return;
    }
    let dir = checkout();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let program = ATTACKER
        .replace("CHECKOUT", &format!("{:?}", dir.path().to_string_lossy()))
        .replace("PORT", &port.to_string());
    let cfg = json!({"lang": "py", "mode": "test", "main": "eval.py",
        "sources": {"eval.py": program}, "tests": [{"n": 1}]});
    let uid = sandbox_uid();
    let r = run_in(
        dir.path(),
        &[
            ("KERNELBOT_PAYLOAD", payload::encode(&cfg).unwrap()),
            ("KERNELBOT_SANDBOX_UID", uid.to_string()),
            ("BUILDKITE_AGENT_ACCESS_TOKEN", "secret-agent-token".into()),
            ("AWS_SECRET_ACCESS_KEY", "secret-agent-token-aws".into()),
        ],
        None,
    );
    assert_eq!(r.code, 0, "{}", r.stdout);
    let run = r.result.as_ref().unwrap().runs["test"].run.clone().unwrap();
    assert!(run.passed, "{run:?}");
    for attack in [
        "hook",
        "git_config",
        "checkout",
        "new_file",
        "result",
        "result_symlink",
        "runner_environ",
        "network",
    ] {
        let said = run.value(&format!("try.{attack}"));
        assert!(
            said.as_deref().is_some_and(|s| s != "done"),
            "{attack}: {said:?}"
        );
    }
    assert_eq!(run.value("uid"), Some(uid.to_string()));
    assert_eq!(run.value("secret_seen").as_deref(), Some("False"));
    let env = run.value("env").unwrap();
    assert!(!env.contains("BUILDKITE") && !env.contains("AWS"), "{env}");
    assert!(
        listener.accept().is_err(),
        "the program reached the network"
    );

    // Nothing of the program is left, and what the runner wrote stays its own.
    assert_eq!(alive_of(uid), Vec::<String>::new());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let written = std::fs::read(dir.path().join("result.json")).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&written).unwrap(),
        r.raw.clone().unwrap()
    );
    let meta = std::fs::symlink_metadata(dir.path().join("result.json")).unwrap();
    assert!(meta.is_file() && meta.uid() == 0);
    assert!(!dir.path().join(".git/hooks/post-checkout").exists());
    assert!(!dir.path().join("planted.sh").exists());
    assert_eq!(
        std::fs::read_to_string(dir.path().join(".git/config")).unwrap(),
        GIT_CONFIG
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("pipeline.yml")).unwrap(),
        "steps: []\n"
    );
    let sandbox = &r.raw.unwrap()["sandbox"];
    assert_eq!(sandbox["uid"], uid);
    assert_eq!(sandbox["network_isolated"], true);
    assert!(
        sandbox["processes_killed"].as_u64().unwrap() >= 2,
        "{sandbox}"
    );
    assert_eq!(sandbox["survivors"], json!([]));
}

#[test]
fn without_root_the_sandbox_degrades_and_says_so() {
    // As root, the runner is started as an unprivileged user; otherwise it already is one.
    let dir = checkout();
    let user = is_root().then_some(65534);
    if let Some(uid) = user {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid)).unwrap();
    }
    let r = run_in(
        dir.path(),
        &[
            (
                "KERNELBOT_PAYLOAD",
                payload::encode(&config("escape", "test")).unwrap(),
            ),
            ("KERNELBOT_PYTHON", "/usr/bin/python3".into()),
            ("BUILDKITE_AGENT_ACCESS_TOKEN", "secret-agent-token".into()),
        ],
        user,
    );
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert!(
        r.stdout.contains("Sandbox: user not applied"),
        "{}",
        r.stdout
    );
    let raw = r.raw.unwrap();
    let sandbox = &raw["sandbox"];
    assert_eq!(sandbox["uid"], Value::Null);
    assert!(
        sandbox["not_applied"]["user"]
            .as_str()
            .unwrap()
            .contains("not root"),
        "{sandbox}"
    );
    assert_eq!(sandbox["limits"]["processes"], Value::Null);
    assert_eq!(sandbox["limits"]["core_dumps"], false);
    // What still holds: a cleared environment, and no process left behind.
    let test = r.result.unwrap().runs["test"].run.clone().unwrap();
    assert!(test.passed, "{test:?}");
    assert!(
        !sandbox["environment"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == "BUILDKITE_AGENT_ACCESS_TOKEN")
    );
    let pid: i32 = printed(&test.stdout, "child-pid").unwrap().parse().unwrap();
    assert!(
        !pid_alive(pid),
        "the setsid child {pid} outlived the runner"
    );
}

/// A stand-in nvcc: answers `--version`, prints the command it was given, and leaves an
/// `eval.out` that speaks kernelbot's protocol and says who runs it.
const FAKE_NVCC: &str = r#"#!/bin/sh
if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release 12.8, V12.8.93"; exit 0; fi
echo "nvcc $*"
cat > eval.out <<'EVAL'
#!/bin/sh
eval "exec 9>&$POPCORN_FD"
echo "uid: $(id -u)" >&9
echo "sources-left: $(ls *.cu 2>/dev/null | wc -l)" >&9
echo "check: pass" >&9
EVAL
chmod +x eval.out
"#;

#[test]
fn cuda_compiles_with_kernelbots_flags_and_runs_sandboxed() {
    let tools = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tools.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let nvcc = tools.path().join("nvcc");
    std::fs::write(&nvcc, FAKE_NVCC).unwrap();
    std::fs::set_permissions(&nvcc, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = json!({"lang": "cu", "mode": "test", "sources": {"kernel.cu": "__global__ void k() {}"},
        "compile_flags": ["-lineinfo"], "tests": [{"n": 1}]});
    let uid = sandbox_uid();
    let r = run_with(&[
        ("KERNELBOT_PAYLOAD", payload::encode(&cfg).unwrap()),
        ("NVCC", nvcc.to_string_lossy().into_owned()),
        ("KERNELBOT_SANDBOX_UID", uid.to_string()),
    ]);
    let test = &r.result.unwrap().runs["test"];
    let compilation = test.compilation.as_ref().unwrap();
    assert!(compilation.success, "{compilation:?}");
    assert!(compilation.nvcc_version.contains("release 12.8"));
    let command = &compilation.command;
    for flag in [
        "--std=c++20",
        "-DNDEBUG",
        "--expt-extended-lambda",
        "--expt-relaxed-constexpr",
        "-O3",
        "-Xptxas=--warn-on-spills",
    ] {
        assert!(command.contains(flag), "{flag} missing: {command}");
    }
    assert!(!command.contains("fast_math"), "{command}");
    // The config's own flags come after kernelbot's, then the sources, arch and output.
    assert!(command.find("-lineinfo").unwrap() > command.find("-Xptxas=--warn-on-spills").unwrap());
    assert!(
        command.ends_with("kernel.cu '-arch=native' -o eval.out"),
        "{command}"
    );
    let run = test.run.as_ref().unwrap();
    assert!(run.passed, "{run:?}");
    assert_eq!(run.value("sources-left").as_deref(), Some("0"));
    if is_root() {
        assert_eq!(run.value("uid"), Some(uid.to_string()));
    }
}

#[test]
fn a_process_hiding_behind_a_zombie_leader_is_ended_too() {
    if !is_root() {
        eprintln!("skipped: needs a root runner");
        return;
    }
    // The only thing left behind: a session whose leader ended its main thread, so it looks
    // like a zombie while another thread runs on.
    let program = r#"
import os, subprocess, sys
hidden = """
import ctypes, os, sys, threading, time
if os.fork(): sys.exit(0)
os.setsid()
threading.Thread(target=lambda: time.sleep(30)).start()
ctypes.CDLL(None).pthread_exit(None)
"""
subprocess.Popen([sys.executable, "-c", hidden]).wait()
out = os.fdopen(int(os.environ["POPCORN_FD"]), "w")
out.write("check: pass\n")
"#;
    let cfg = json!({"lang": "py", "mode": "test", "main": "eval.py",
        "sources": {"eval.py": program}, "tests": [{"n": 1}]});
    let uid = sandbox_uid();
    let r = run_with(&[
        ("KERNELBOT_PAYLOAD", payload::encode(&cfg).unwrap()),
        ("KERNELBOT_SANDBOX_UID", uid.to_string()),
    ]);
    assert!(r.result.unwrap().runs["test"].run.as_ref().unwrap().passed);
    assert_eq!(alive_of(uid), Vec::<String>::new());
    assert_eq!(r.raw.unwrap()["sandbox"]["processes_killed"], 1);
}

/// A directory holding only `name`, a stub of a GPU tool that prints `output`.
fn gpu_tool(name: &str, output: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, format!("#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    for d in [dir.path(), path.as_path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

/// On a multi-GPU agent (8 GPUs of either vendor in its container) the runner reports the
/// device count and a multi-GPU task's program is told it in `POPCORN_GPUS`; a single-GPU
/// task is not.
#[test]
fn a_multi_gpu_agent_s_devices_are_counted_and_given_to_multi_gpu_tasks() {
    let cards: Vec<String> = (0..8)
        .map(|i| format!("\"card{i}\": {{\"Card Series\": \"AMD Instinct MI300X\"}}"))
        .collect();
    let amd = format!("{{{}}}", cards.join(", "));
    // Each vendor's stand-in answers the pre-flight's queries for 8 GPUs too (the AMD
    // one's rocm-smi replaced by one that names 8 cards).
    let nvidia = gpu_stand_ins("gpu-nvidia");
    let rocm = gpu_stand_ins("gpu-amd");
    let eight = gpu_tool("rocm-smi", &amd);
    std::fs::copy(eight.path().join("rocm-smi"), rocm.path().join("rocm-smi")).unwrap();
    for (tool, stubs, gpu, runtime) in [
        ("nvidia-smi", nvidia.path(), "NVIDIA H100 80GB HBM3", "CUDA"),
        ("rocm-smi", rocm.path(), "AMD Instinct MI300X", "ROCm"),
    ] {
        let path = format!("{}:/usr/local/bin:/usr/bin:/bin", stubs.display());
        for (multi, told) in [(true, "8"), (false, "unset")] {
            let mut config = config("pass", "test");
            config["multi_gpu"] = json!(multi);
            let r = run_with(&[
                ("KERNELBOT_PAYLOAD", payload::encode(&config).unwrap()),
                ("PATH", path.clone()),
                ("GPU_STANDIN_GPUS", "8".into()),
                ("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7".into()),
            ]);
            let result = r.result.unwrap_or_else(|| panic!("{}", r.stdout));
            assert_eq!(result.system.device_count, 8, "{tool}");
            assert_eq!(
                (result.system.gpu.as_str(), result.system.runtime.as_str()),
                (gpu, runtime)
            );
            let test = result.runs["test"].run.as_ref().unwrap();
            assert!(test.passed, "{test:?}");
            assert_eq!(
                test.value("gpus").as_deref(),
                Some(told),
                "{tool}, multi_gpu {multi}"
            );
        }
    }
}

/// A copy of a GPU stand-in directory in `tests/fixtures/` that any user can reach (the
/// sandboxed program runs the profiler).
pub(crate) fn gpu_stand_ins(vendor: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(vendor);
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let to = dir.path().join(path.file_name().unwrap());
        std::fs::copy(&path, &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

/// The entries of a zip the runner left, by name.
fn zip_entries(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut archive = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    (0..archive.len())
        .map(|i| {
            let mut file = archive.by_index(i).unwrap();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut bytes).unwrap();
            (file.name().unwrap().into_owned(), bytes)
        })
        .collect()
}

/// Profile mode on each vendor's stand-in profiler: one run per benchmark, each under the
/// profiler with kernelbot's variable set; Nsight's tables (kernelbot's three, nothing else)
/// in the run's `benchmark.0.report`; the profiler's files zipped beside `result.json`, with
/// nothing a link in them pointed at; and nothing of them in `result.json`.
#[test]
fn profile_mode_runs_each_benchmark_under_the_profiler_and_zips_its_files() {
    use base64::Engine;
    for (vendor, profiler, file_says) in [
        ("gpu-nvidia", "Nsight-Compute", "POPCORN_NCU=1"),
        ("gpu-amd", "rocPROF", "GPU_DUMP_CODE_OBJECT=1"),
    ] {
        let stand_ins = gpu_stand_ins(vendor);
        let dir = checkout();
        let path = format!(
            "{}:/usr/local/bin:/usr/bin:/bin",
            stand_ins.path().display()
        );
        let r = run_in(
            dir.path(),
            &[
                (
                    "KERNELBOT_PAYLOAD",
                    payload::encode(&config("leak", "profile")).unwrap(),
                ),
                ("PATH", path),
            ],
            None,
        );
        let raw = r.raw.unwrap_or_else(|| panic!("{}", r.stdout));
        let result = r.result.unwrap();
        assert!(result.success, "{}", result.error);
        assert_eq!(
            result.runs.keys().collect::<Vec<_>>(),
            ["profile.0", "profile.1"]
        );
        for (i, size) in [(0, "8192"), (1, "16384")] {
            let eval = &result.runs[&format!("profile.{i}")];
            let run = eval.run.as_ref().unwrap();
            assert!(run.success && run.passed, "{vendor}: {run:?}");
            assert_eq!(
                run.value("profile.0.spec").as_deref(),
                Some(&*format!("size: {size}"))
            );
            let profile = eval.profile.as_ref().unwrap();
            assert_eq!(profile.profiler, profiler);
            let shown = &raw["runs"][format!("profile.{i}")]["profile"];
            assert_eq!(
                shown["trace"],
                Value::Null,
                "the files are not in result.json"
            );
            let report = run.value("benchmark.0.report");
            if vendor == "gpu-nvidia" {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(report.unwrap())
                    .unwrap();
                let tables = String::from_utf8(bytes).unwrap();
                assert!(
                    tables.starts_with("  custom_kernel(float const*"),
                    "{tables}"
                );
                for kept in ["Memory Throughput", "FMA", "Stall Long Scoreboard"] {
                    assert!(tables.contains(kept), "{kept}: {tables}");
                }
                assert!(!tables.contains("L1/TEX Hit Rate"), "{tables}");
            } else {
                assert_eq!(report, None, "rocprofv3 has no tables");
            }
            let entries = zip_entries(&dir.path().join(format!("profile.{i}.zip")));
            assert!(!entries.is_empty(), "{vendor}");
            assert!(
                entries
                    .values()
                    .any(|b| String::from_utf8_lossy(b).contains(file_says)),
                "{vendor}: {:?}",
                entries.keys()
            );
            if vendor == "gpu-amd" {
                // The code objects the runtime dumped beside the program, as kernelbot keeps.
                let objects = entries.contains_key("_code_object0001.o");
                assert!(objects, "{:?}", entries.keys());
            }
            assert!(
                entries
                    .keys()
                    .all(|n| !n.contains("passwd") && !n.starts_with("root")),
                "no link is followed: {:?}",
                entries.keys()
            );
        }
    }
}

/// kernelbot's profile options: only the benchmark named is profiled (as `profile.<its
/// index>`), and Nsight Compute measures the kernels and launches they name.
#[test]
fn profile_options_pick_the_benchmark_kernels_and_launches() {
    let stand_ins = gpu_stand_ins("gpu-nvidia");
    let dir = checkout();
    let path = format!(
        "{}:/usr/local/bin:/usr/bin:/bin",
        stand_ins.path().display()
    );
    let mut profiled = config("pass", "profile");
    profiled["profile_options"] = json!({"benchmark_index": 1, "ncu_kernel_name": "regex:gemm.*",
        "ncu_kernel_name_base": "demangled", "ncu_launch_count": 3});
    let vars = [
        ("KERNELBOT_PAYLOAD", payload::encode(&profiled).unwrap()),
        ("PATH", path),
    ];
    let r = run_in(dir.path(), &vars, None);
    let result = r.result.unwrap_or_else(|| panic!("{}", r.stdout));
    assert!(result.success, "{}", result.error);
    assert_eq!(result.runs.keys().collect::<Vec<_>>(), ["profile.1"]);
    let run = result.runs["profile.1"].run.as_ref().unwrap();
    assert_eq!(run.value("profile.0.spec").as_deref(), Some("size: 16384"));
    let entries = zip_entries(&dir.path().join("profile.1.zip"));
    let report = entries
        .values()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .find(|t| t.starts_with("NCU-REP"))
        .expect("the report in the zip");
    assert!(
        report.contains("OPTIONS=--set full --nvtx --nvtx-include custom_kernel/ --import-source 1 -k regex:gemm.* --kernel-name-base demangled -c 3 -o "),
        "{report}"
    );
}

/// Profile mode where no profiler can run (no GPU tools on PATH): a clear failure, no runs.
#[test]
fn profile_mode_without_a_gpu_runtime_says_so() {
    let r = run_with(&[
        (
            "KERNELBOT_PAYLOAD",
            payload::encode(&config("pass", "profile")).unwrap(),
        ),
        ("PATH", "/usr/local/bin:/usr/bin:/bin".into()),
    ]);
    let result = r.result.unwrap();
    assert!(!result.success);
    assert!(
        result.error.contains("profile mode needs a CUDA GPU"),
        "{}",
        result.error
    );
    assert!(result.runs.is_empty());
}

/// A submission that leaves a mark as soon as any of its code runs (its module, or the
/// harness), in `dir`, which every user may write.
fn marking_config(dir: &Path) -> Value {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mark = format!(
        "open({:?}, 'a').write('ran\\n')\n",
        dir.join("ran").display().to_string()
    );
    let mut c = config("pass", "test");
    let harness = c["sources"]["eval.py"].as_str().unwrap().to_owned();
    c["sources"]["eval.py"] = json!(format!("{mark}{harness}"));
    c["sources"]["submission.py"] = json!(format!("{mark}def kernel(x):\n    return x\n"));
    c
}

/// The runner on a vendor's stand-in GPU tools, given device 0, with `faults` in its env.
fn run_on_stand_ins(vendor: &str, config: &Value, faults: &[(&str, &str)]) -> Run {
    let stand_ins = gpu_stand_ins(vendor);
    let path = format!(
        "{}:/usr/local/bin:/usr/bin:/bin",
        stand_ins.path().display()
    );
    let given = if vendor == "gpu-nvidia" {
        "CUDA_VISIBLE_DEVICES"
    } else {
        "ROCR_VISIBLE_DEVICES"
    };
    let mut vars = vec![
        ("KERNELBOT_PAYLOAD", payload::encode(config).unwrap()),
        ("PATH", path),
        (given, "0".to_owned()),
    ];
    vars.extend(faults.iter().map(|(k, v)| (*k, (*v).to_owned())));
    run_with(&vars)
}

/// A healthy stand-in GPU of either vendor passes the pre-flight and the submission runs as
/// before; `result.json` says the pre-flight passed and what it read.
#[test]
fn a_healthy_gpu_passes_the_preflight_and_the_submission_runs() {
    for vendor in ["gpu-nvidia", "gpu-amd"] {
        let marks = tempfile::tempdir().unwrap();
        let r = run_on_stand_ins(vendor, &marking_config(marks.path()), &[]);
        assert_eq!(r.code, 0, "{vendor}: {}", r.stdout);
        let result = r.result.unwrap();
        assert!(result.success && result.infra.is_none(), "{}", result.error);
        assert!(result.runs["test"].run.as_ref().unwrap().passed);
        assert!(marks.path().join("ran").exists(), "the submission ran");
        assert_eq!(r.infra_line, None, "no pause for a healthy GPU");
        let preflight = &r.raw.unwrap()["preflight"];
        assert_eq!(preflight["status"], "passed", "{vendor}: {preflight}");
        assert_eq!(preflight["readings"].as_array().map(Vec::len), Some(1));
    }
}

/// Without nvidia-smi or amd-smi (the CPU demo) there is nothing to check: the pre-flight
/// is skipped, `result.json` says so, and the submission runs.
#[test]
fn without_gpu_tools_the_preflight_is_skipped_and_says_so() {
    let r = run_with(&[
        (
            "KERNELBOT_PAYLOAD",
            payload::encode(&config("pass", "test")).unwrap(),
        ),
        ("PATH", "/usr/local/bin:/usr/bin:/bin".into()),
    ]);
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert!(r.result.unwrap().success);
    let preflight = &r.raw.unwrap()["preflight"];
    assert_eq!(preflight["status"], "skipped");
    assert!(
        preflight["detail"]
            .as_str()
            .unwrap()
            .contains("no nvidia-smi or amd-smi"),
        "{preflight}"
    );
}

/// Each fault of the GPU stops the job before any of its code runs: exit 75 (the pipeline
/// retries it elsewhere), no runs, no mark, and `infra` saying the stage, the reason and
/// what was read, with the blame on the node. (Heat and slowdowns are given no cool-down
/// here: waiting them out is the next test's.)
#[test]
fn a_gpu_fault_stops_the_job_before_any_of_its_code_runs() {
    type Fault = (
        &'static str,
        &'static [(&'static str, &'static str)],
        &'static str,
        &'static str,
    );
    let faults: &[Fault] = &[
        (
            "gpu-nvidia",
            &[("GPU_STANDIN_ECC", "3")],
            "ecc_errors",
            "GPU 0 has 3 uncorrected ECC errors",
        ),
        (
            "gpu-amd",
            &[("GPU_STANDIN_ECC", "1")],
            "ecc_errors",
            "GPU 0 has 1 uncorrected ECC errors",
        ),
        (
            "gpu-nvidia",
            &[("GPU_STANDIN_FOREIGN_PID", "4242")],
            "foreign_process",
            "pid 4242, 1024 MiB",
        ),
        (
            "gpu-amd",
            &[("GPU_STANDIN_FOREIGN_PID", "4243")],
            "foreign_process",
            "pid 4243, 1024 MiB",
        ),
        (
            "gpu-nvidia",
            &[("GPU_STANDIN_MISSING", "0")],
            "no_gpu",
            "no GPU is visible",
        ),
        (
            "gpu-nvidia",
            &[("GPU_STANDIN_GPUS", "2")],
            "gpu_not_given",
            "GPU 1 is visible but was not given",
        ),
        (
            "gpu-amd",
            &[("GPU_STANDIN_GPUS", "2"), ("GPU_STANDIN_MISSING", "0")],
            "gpu_missing",
            "GPU 0 was given",
        ),
        (
            "gpu-nvidia",
            &[
                ("GPU_STANDIN_EVENTS", "0x40"),
                ("KERNELBOT_COOLDOWN_SECS", "0"),
            ],
            "clock_slowdown",
            "HwThermalSlowdown",
        ),
        (
            "gpu-amd",
            &[
                ("GPU_STANDIN_THROTTLED", "1"),
                ("KERNELBOT_COOLDOWN_SECS", "0"),
            ],
            "clock_slowdown",
            "SocketThermalViolation",
        ),
        (
            "gpu-nvidia",
            &[("GPU_STANDIN_TEMP", "91"), ("KERNELBOT_COOLDOWN_SECS", "0")],
            "too_hot",
            "91 °C",
        ),
        (
            "gpu-nvidia",
            &[("GPU_STANDIN_RETIRED_PENDING", "1")],
            "retired_pages_pending",
            "retired",
        ),
        (
            "gpu-nvidia",
            &[("GPU_STANDIN_POWER_LIMIT", "450.00")],
            "power_limit_low",
            "power limit is set to 450 W, below its default of 700 W",
        ),
        (
            "gpu-nvidia",
            &[(
                "GPU_STANDIN_MALFORMED",
                "Unable to determine the device handle for GPU0000:41:00.0: Unknown Error",
            )],
            "tool_output_unreadable",
            "\"Unable to determine the device handle for GPU0000:41:00.0: Unknown Error\"",
        ),
        (
            "gpu-amd",
            &[(
                "GPU_STANDIN_MALFORMED",
                "ERROR:root:Unable to detect any GPU devices",
            )],
            "tool_output_unreadable",
            "ERROR:root:Unable to detect any GPU devices",
        ),
    ];
    for (vendor, env, reason, says) in faults {
        let marks = tempfile::tempdir().unwrap();
        let r = run_on_stand_ins(vendor, &marking_config(marks.path()), env);
        assert_eq!(r.code, 75, "{vendor} {env:?}: {}", r.stdout);
        let result = r.result.unwrap();
        assert!(
            !result.success && result.runs.is_empty(),
            "{vendor} {env:?}"
        );
        assert!(
            !marks.path().join("ran").exists(),
            "{vendor} {env:?}: nothing of it ran"
        );
        let infra = result.infra.unwrap();
        assert_eq!(
            (infra.stage.as_str(), infra.reason.as_str()),
            ("preflight", *reason),
            "{vendor} {env:?}: {}",
            infra.detail
        );
        assert!(
            !infra.detail.contains("cool-down"),
            "refused at the first reading: {}",
            infra.detail
        );
        assert!(
            result.error.contains("not your code") && result.error.contains(says),
            "{vendor} {env:?}: {}",
            result.error
        );
        let raw = r.raw.unwrap();
        assert!(raw["infra"]["readings"].is_array(), "{raw}");
        // For the agent's hook: whether to pause (a fault that outlasts the job), then one
        // printable line, the reason and what was found.
        let text = r.infra_line.expect("infra.txt");
        let lines: Vec<&str> = text.lines().collect();
        let lasting = !matches!(*reason, "clock_slowdown" | "too_hot");
        assert_eq!(
            lines[0],
            if lasting { "pause" } else { "retry" },
            "{reason}"
        );
        assert_eq!(lines.len(), 2, "{text:?}");
        assert!(lines[1].starts_with(&format!("{reason}: ")), "{text:?}");
        assert!(lines[1].contains(says.trim_matches('"')), "{text:?}");
        assert!(!lines[1].chars().any(char::is_control), "{text:?}");
    }
}

/// Each timed run (benchmark, leaderboard) records the GPU's readings before and after it. A
/// leaderboard run measured during a thermal slowdown is run again after the cool-down: kept
/// when the slowdown has cleared. When it persists it showed only after the submission ran
/// (perhaps its own heat): the runner exits 76 (the pipeline's one retry, no pause) with
/// `throttled`, not `infra`, in `result.json`: no ranked time, whichever try it was
/// (`BUILDKITE_RETRY_COUNT` is recorded). On either vendor's stand-in. The stand-ins count the readings: the pre-flight's is the 0th, the benchmark's
/// 1st and 2nd, the leaderboard's 3rd and 4th, its second try's 5th and 6th.
#[test]
fn a_throttled_leaderboard_run_is_run_again_once_then_tried_elsewhere_and_never_ranked() {
    let cases = [
        (
            "gpu-nvidia",
            ("GPU_STANDIN_EVENTS", "0x20"),
            "SwThermalSlowdown",
        ),
        (
            "gpu-amd",
            ("GPU_STANDIN_THROTTLED", "1"),
            "SocketThermalViolation",
        ),
    ];
    // (how many reads it lasts, BUILDKITE_RETRY_COUNT, exit code)
    let ways = [("2", "0", 0), ("99", "0", 76), ("99", "1", 76)];
    for ((vendor, fault, named), (lasts, retry, code)) in
        cases.into_iter().flat_map(|c| ways.map(|w| (c, w)))
    {
        let state = tempfile::tempdir().unwrap();
        let counter = state.path().join("reads").display().to_string();
        let faults = [
            fault,
            ("GPU_STANDIN_EVENTS_FROM", "3"),
            ("GPU_STANDIN_EVENTS_READS", lasts),
            ("GPU_STANDIN_STATE", counter.as_str()),
            ("KERNELBOT_COOLDOWN_SECS", "0"),
            ("BUILDKITE_RETRY_COUNT", retry),
        ];
        let r = run_on_stand_ins(vendor, &config("pass", "leaderboard"), &faults);
        let case = format!("{vendor} lasting {lasts}, retry {retry}");
        assert_eq!(r.code, code, "{case}: {}", r.stdout);
        let result = r.result.unwrap();
        assert!(result.infra.is_none(), "{case}: never the node's fault");
        assert!(
            result.runs["test"].conditions.is_none(),
            "a test run is not timed"
        );
        let benchmark = result.runs["benchmark"].conditions.clone().unwrap();
        assert!(
            !benchmark.throttled && benchmark.attempts == 1,
            "{benchmark:?}"
        );
        assert_eq!((benchmark.before.len(), benchmark.after.len()), (1, 1));
        assert!(benchmark.after[0].sm_clock_mhz.is_some(), "{benchmark:?}");
        let leaderboard = result.runs["leaderboard"].conditions.clone().unwrap();
        assert_eq!(leaderboard.attempts, 2, "run again after the cool-down");
        if lasts == "2" {
            assert!(
                result.success && result.throttled.is_none(),
                "{}",
                result.error
            );
            assert!(!leaderboard.throttled);
            assert!(result.runs["leaderboard"].run.as_ref().unwrap().passed);
            assert_eq!(r.infra_line, None);
            continue;
        }
        assert!(!result.success && leaderboard.throttled, "{case}");
        let throttled = result.throttled.clone().expect("throttled");
        assert_eq!(
            (
                throttled.mode.as_str(),
                throttled.slowdowns.clone(),
                throttled.retry
            ),
            (
                "leaderboard",
                vec![named.to_owned()],
                retry.parse().unwrap()
            ),
            "{case}"
        );
        assert!(
            result.error.starts_with("Not ranked")
                && result.error.contains(named)
                && !result.error.contains("not your code"),
            "{case}: {}",
            result.error
        );
        // Its results stand: the run passed; only its time is not ranked.
        assert!(result.runs["leaderboard"].run.as_ref().unwrap().passed);
        let raw = r.raw.unwrap();
        let reasons = &raw["runs"]["leaderboard"]["conditions"]["after"][0]["clock_events"];
        assert_eq!(reasons, &json!([named]));
        assert_eq!(
            raw["throttled"]["readings"][0]["clock_events"],
            json!([named])
        );
        // For the agent's hook: never a pause.
        let text = r.infra_line.expect("infra.txt");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "retry", "{text:?}");
        assert!(
            lines[1].starts_with("throttled: ") && lines[1].contains(named),
            "{text:?}"
        );
    }
}

/// A kernel that draws the board's full power is held at its power limit on every healthy
/// GPU (NVIDIA's SwPowerCap, AMD's PPT): its real speed. Capped on every reading, the pre-
/// flight included, the leaderboard run is ranked at once, the cap in its conditions.
#[test]
fn a_power_capped_run_is_ranked_with_the_cap_recorded() {
    for vendor in ["gpu-nvidia", "gpu-amd"] {
        let r = run_on_stand_ins(
            vendor,
            &config("pass", "leaderboard"),
            &[("GPU_STANDIN_POWER_CAP_FROM", "0")],
        );
        assert_eq!(r.code, 0, "{vendor}: {}", r.stdout);
        let result = r.result.unwrap();
        assert!(
            result.success && result.throttled.is_none(),
            "{}",
            result.error
        );
        let c = result.runs["leaderboard"].conditions.clone().unwrap();
        assert_eq!(
            (c.throttled, c.power_capped, c.attempts),
            (false, true, 1),
            "{vendor}: {c:?}"
        );
        assert!(
            c.after[0].power_w.unwrap() > 600.0,
            "{vendor}: at its limit"
        );
        let capped = if vendor == "gpu-nvidia" {
            "SwPowerCap"
        } else {
            "PowerViolation"
        };
        assert!(c.after[0].clock_events.iter().any(|e| e == capped), "{c:?}");
        assert_eq!(r.raw.unwrap()["preflight"]["status"], "passed");
        assert_eq!(r.infra_line, None);
    }
}

/// A GPU still hot (or slowed down) from the previous job is read again every few seconds
/// for the cool-down before it is refused: one that cools in time runs the submission;
/// one that does not is refused saying it was given the cool-down.
#[test]
fn the_pre_flight_waits_out_a_gpu_still_hot_from_the_last_job() {
    for (lasts, code) in [("2", 0), ("99", 75)] {
        let state = tempfile::tempdir().unwrap();
        let counter = state.path().join("reads").display().to_string();
        let marks = tempfile::tempdir().unwrap();
        let r = run_on_stand_ins(
            "gpu-nvidia",
            &marking_config(marks.path()),
            &[
                ("GPU_STANDIN_EVENTS", "0x20"),
                ("GPU_STANDIN_HOT_TEMP", "88"),
                ("GPU_STANDIN_EVENTS_READS", lasts),
                ("GPU_STANDIN_STATE", counter.as_str()),
                ("KERNELBOT_COOLDOWN_SECS", "5"),
            ],
        );
        assert_eq!(r.code, code, "lasting {lasts}: {}", r.stdout);
        let raw = r.raw.unwrap();
        if code == 0 {
            assert!(
                marks.path().join("ran").exists(),
                "it ran once the GPU cooled"
            );
            // Read at once, then every 2 s: clean on the third read, 4 s (and the tool's
            // own time) in.
            let detail = raw["preflight"]["detail"].as_str().unwrap_or_default();
            let waited: f64 = detail
                .strip_prefix("waited ")
                .and_then(|d| d.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{detail}"));
            assert!((4.0..=5.0).contains(&waited), "{detail}");
            assert!(detail.contains("s for the GPU to cool down"), "{detail}");
            assert_eq!(
                raw["preflight"]["readings"][0]["temperature_c"],
                json!(34.0)
            );
        } else {
            assert!(!marks.path().join("ran").exists());
            let infra = r.result.unwrap().infra.unwrap();
            assert_eq!(infra.reason, "too_hot", "{infra:?}");
            assert!(
                infra.detail.contains("88 °C")
                    && infra.detail.contains("still after a 5 s cool-down"),
                "{infra:?}"
            );
            assert_eq!(
                r.infra_line.unwrap().lines().next(),
                Some("retry"),
                "no pause"
            );
        }
    }
}

/// A driver older than the `clocks_event_reasons` name refuses a query naming it: the
/// runner asks the older name, reads the GPU in full (its slowdowns included) and says so;
/// nothing fails and nothing pauses.
#[test]
fn an_older_driver_is_read_by_the_names_it_knows() {
    let old = ("GPU_STANDIN_DRIVER", "525.147.05");
    let r = run_on_stand_ins("gpu-nvidia", &config("pass", "leaderboard"), &[old]);
    assert_eq!(r.code, 0, "{}", r.stdout);
    let result = r.result.unwrap();
    assert!(result.success, "{}", result.error);
    let raw = r.raw.unwrap();
    assert_eq!(raw["preflight"]["status"], "passed");
    assert!(
        raw["preflight"]["detail"]
            .as_str()
            .unwrap()
            .contains("older name (clocks_throttle_reasons)"),
        "{raw}"
    );
    assert_eq!(
        raw["preflight"]["readings"][0]["clock_events"],
        json!(["GpuIdle"])
    );
    let c = result.runs["leaderboard"].conditions.clone().unwrap();
    assert_eq!(
        c.after[0].clock_event_reasons,
        Some(1),
        "read in full: {c:?}"
    );
    // Its mask is read: a slowdown is seen through the older name too.
    let r = run_on_stand_ins(
        "gpu-nvidia",
        &config("pass", "test"),
        &[
            old,
            ("GPU_STANDIN_EVENTS", "0x40"),
            ("KERNELBOT_COOLDOWN_SECS", "0"),
        ],
    );
    assert_eq!(r.code, 75, "{}", r.stdout);
    assert_eq!(r.result.unwrap().infra.unwrap().reason, "clock_slowdown");
}

/// An agent given GPUs whose image has no tool to read them is never taken for a CPU-only
/// machine: nothing of the submission runs, and the infrastructure failure names the tool.
#[test]
fn gpus_given_without_a_tool_to_read_them_are_an_infrastructure_failure() {
    for (given, tool) in [
        ("CUDA_VISIBLE_DEVICES", "nvidia-smi"),
        ("ROCR_VISIBLE_DEVICES", "amd-smi"),
    ] {
        let marks = tempfile::tempdir().unwrap();
        let r = run_with(&[
            (
                "KERNELBOT_PAYLOAD",
                payload::encode(&marking_config(marks.path())).unwrap(),
            ),
            ("PATH", "/usr/local/bin:/usr/bin:/bin".into()),
            (given, "0".into()),
        ]);
        assert_eq!(r.code, 75, "{given}: {}", r.stdout);
        assert!(!marks.path().join("ran").exists(), "{given}: nothing ran");
        let result = r.result.unwrap();
        let infra = result.infra.unwrap();
        assert_eq!(infra.reason, "tool_missing", "{given}");
        assert!(
            result.error.contains("not your code") && result.error.contains(tool),
            "{given}: {}",
            result.error
        );
        // The image lacks the tool, not the agent: retried, never a pause of every agent.
        assert_eq!(r.infra_line.unwrap().lines().next(), Some("retry"));
    }
}

/// A GPU that supports fewer fields (`[N/A]` for power, ECC and retired pages, as consumer
/// cards print) passes: unknown is not a fault, and `result.json` says `null` for it.
#[test]
fn unsupported_readings_are_unknown_not_faults() {
    let na = "power.draw,ecc.errors.uncorrected.volatile.total,retired_pages.pending";
    let r = run_on_stand_ins(
        "gpu-nvidia",
        &config("pass", "test"),
        &[("GPU_STANDIN_NA", na)],
    );
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert!(r.result.unwrap().success);
    let reading = &r.raw.unwrap()["preflight"]["readings"][0];
    for field in ["power_w", "ecc_uncorrected", "retired_pages_pending"] {
        assert_eq!(reading[field], Value::Null, "{field}: {reading}");
    }
    assert_eq!(reading["temperature_c"], json!(34.0));
    assert_eq!(reading["clock_events"], json!(["GpuIdle"]));
}
