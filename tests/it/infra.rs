//! The GPU-node side in `infra/buildkite/`: setup-node.sh run against a temporary root with
//! stubbed GPU tools, and the pipeline and Dockerfile checked against what the runner and
//! the functions expect.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml_ng::Value;

use crate::support::{StoreKind, TestApp, submission};

fn infra(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("infra/buildkite")
        .join(file)
}

fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(path)
}

/// A directory of stand-ins for the node's tools, first on setup's `PATH`: the vendor's GPU
/// tools (`tests/fixtures/gpu-*`, with that many GPUs unless a test's `GPU_STANDIN_GPUS`
/// says otherwise; a stub `rocm-smi` listing the AMD cards), `lscpu` (`tests/fixtures/cpu`:
/// the topology in `CPU_STANDIN_TOPOLOGY`), `buildkite-agent` (its version in
/// `BUILDKITE_AGENT_STANDIN_VERSION`) and `hostname`.
fn stubs(nvidia_gpus: usize, amd_gpus: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, body: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    let standin = |name: &str, path: &str, gpus: usize| {
        let exec = format!("exec '{}' \"$@\"\n", fixture(path).display());
        write(
            name,
            format!(": \"${{GPU_STANDIN_GPUS:={gpus}}}\"\nexport GPU_STANDIN_GPUS\n{exec}"),
        );
    };
    if nvidia_gpus > 0 {
        standin("nvidia-smi", "gpu-nvidia/nvidia-smi", nvidia_gpus);
    }
    if amd_gpus > 0 {
        standin("amd-smi", "gpu-amd/amd-smi", amd_gpus);
        let cards: Vec<String> = (0..amd_gpus)
            .map(|i| format!("\"card{i}\": {{\"Card Series\": \"AMD Instinct MI300X\"}}"))
            .collect();
        write("rocm-smi", format!("echo '{{{}}}'\n", cards.join(", ")));
    }
    for (name, path) in [
        ("lscpu", "cpu/lscpu"),
        ("buildkite-agent", "buildkite-agent/buildkite-agent"),
    ] {
        write(name, format!("exec '{}' \"$@\"\n", fixture(path).display()));
    }
    write("hostname", "echo gpunode\n".into());
    dir
}

struct Setup {
    code: i32,
    output: String,
}

fn setup(root: &Path, stubs: &Path, vars: &[(&str, &str)]) -> Setup {
    let out = Command::new("bash")
        .arg(infra("setup-node.sh"))
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", stubs.display()))
        .env("ROOT", root)
        .env("BUILDKITE_AGENT_TOKEN", "agent-token-123")
        .envs(vars.iter().copied())
        .output()
        .expect("bash runs");
    Setup {
        code: out.status.code().unwrap_or(-1),
        output: String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr),
    }
}

/// Setup stopped, saying why.
fn assert_refused(s: &Setup, says: &str) {
    assert_ne!(s.code, 0, "{}", s.output);
    assert!(s.output.contains(says), "{}", s.output);
}

fn read(root: &Path, path: &str) -> String {
    std::fs::read_to_string(root.join(path.trim_start_matches('/')))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn mode(root: &Path, path: &str) -> u32 {
    std::fs::metadata(root.join(path.trim_start_matches('/')))
        .unwrap()
        .permissions()
        .mode()
        & 0o777
}

/// What a job on the agent sees: the hook sourced by bash, its exports printed.
fn hook_env(root: &Path, idx: usize) -> BTreeMap<String, String> {
    let hook = root.join(format!("etc/buildkite-agent/agent-{idx}/hooks/environment"));
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && env", hook.display()))
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}

/// Every file under `root` with its mode and content.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::metadata(&path).unwrap();
            if meta.is_dir() {
                out.insert(path.clone(), (meta.permissions().mode(), Vec::new()));
                stack.push(path);
            } else {
                out.insert(
                    path.clone(),
                    (meta.permissions().mode(), std::fs::read(&path).unwrap()),
                );
            }
        }
    }
    out
}

#[test]
fn a_two_gpu_nvidia_node_gets_two_isolated_agents() {
    let root = tempfile::tempdir().unwrap();
    let tools = stubs(2, 0);
    let s = setup(
        root.path(),
        tools.path(),
        &[
            ("QUEUE", "h100"),
            ("CPU_STANDIN_TOPOLOGY", "1x16x1"),
            ("NODE_MEMORY_GB", "72"),
        ],
    );
    assert_eq!(s.code, 0, "{}", s.output);
    // 16 cores, one kept for the host: 7 each.
    assert!(
        s.output
            .contains("2 nvidia GPU(s) on queue h100: 7 CPUs and 32 GiB each"),
        "{}",
        s.output
    );

    for idx in 0..2 {
        let cfg = read(
            root.path(),
            &format!("/etc/buildkite-agent/agent-{idx}/buildkite-agent.cfg"),
        );
        assert!(
            cfg.contains(&format!(
                "tags=\"queue=h100,gpu={idx},vendor=nvidia,node=gpunode\""
            )),
            "{cfg}"
        );
        assert!(cfg.contains(&format!(
            "build-path=\"/var/lib/buildkite-agent/gpu-{idx}/builds\""
        )));
        assert!(cfg.contains(&format!("name=\"gpunode-gpu{idx}\"")));
        assert!(cfg.contains("token=\"agent-token-123\""));
        assert!(
            cfg.contains("no-local-hooks=true"),
            "no hooks from a checkout"
        );
        assert_eq!(
            mode(
                root.path(),
                &format!("/etc/buildkite-agent/agent-{idx}/buildkite-agent.cfg")
            ),
            0o600,
            "the token is a secret"
        );
        assert!(
            root.path()
                .join(format!("var/lib/buildkite-agent/gpu-{idx}/builds"))
                .is_dir()
        );
    }
    let slice = read(root.path(), "/etc/systemd/system/kernelbot-gpu1.slice");
    assert!(
        slice.contains("AllowedCPUs=8-14")
            && slice.contains("AllowedMemoryNodes=0")
            && slice.contains("MemoryMax=32G")
            && slice.contains("CPUQuota=700%"),
        "{slice}"
    );
    let unit = read(
        root.path(),
        "/etc/systemd/system/buildkite-agent-gpu1.service",
    );
    assert!(unit.contains("Slice=kernelbot-gpu1.slice"), "{unit}");
    assert!(unit.contains("--config /etc/buildkite-agent/agent-1/buildkite-agent.cfg"));

    assert_eq!(
        mode(
            root.path(),
            "/etc/buildkite-agent/agent-1/hooks/environment"
        ),
        0o755
    );
    let env = hook_env(root.path(), 1);
    for (k, v) in [
        ("NVIDIA_VISIBLE_DEVICES", "1"),
        ("CUDA_VISIBLE_DEVICES", "0"),
        ("BUILDKITE_PLUGIN_DOCKER_GPUS", "device=1"),
        ("KERNELBOT_GPU_INDEX", "1"),
        ("KERNELBOT_CPUSET", "8-14"),
        ("KERNELBOT_MEMORY", "32g"),
        ("BUILDKITE_PLUGIN_DOCKER_CPUS", "7"),
        ("BUILDKITE_PLUGIN_DOCKER_MEMORY", "32g"),
        ("BUILDKITE_PLUGIN_DOCKER_MEMORY_SWAP", "32g"),
        ("BUILDKITE_CLEAN_CHECKOUT", "true"),
        ("KERNELBOT_PIDS_LIMIT", "8192"),
        // No stdin in the container: the plugin's schema has no option for it.
        ("BUILDKITE_PLUGIN_DOCKER_INTERACTIVE", "false"),
    ] {
        assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
    }
    assert!(
        env["PATH"].starts_with("/usr/local/lib/kernelbot/bin:"),
        "the docker wrapper comes first: {}",
        env["PATH"]
    );
    assert!(!env.contains_key("ROCR_VISIBLE_DEVICES"));
}

#[test]
fn an_eight_gpu_amd_node_binds_rocm_devices() {
    let root = tempfile::tempdir().unwrap();
    let tools = stubs(0, 8);
    let s = setup(
        root.path(),
        tools.path(),
        &[
            ("QUEUE", "mi300"),
            ("CPU_STANDIN_TOPOLOGY", "1x128x1"),
            ("NODE_MEMORY_GB", "1032"),
            ("RENDER_NODES", RENDER_NODES),
        ],
    );
    assert_eq!(s.code, 0, "{}", s.output);
    // 128 cores, one kept for the host: 15 each.
    assert!(
        s.output
            .contains("8 amd GPU(s) on queue mi300: 15 CPUs and 128 GiB each"),
        "{}",
        s.output
    );
    for idx in 0..8 {
        let env = hook_env(root.path(), idx);
        let cpuset = format!("{}-{}", 1 + idx * 15, 15 + idx * 15);
        // One render node in the container: there, the GPU is device 0.
        assert_eq!(env["ROCR_VISIBLE_DEVICES"], "0");
        assert_eq!(env["HIP_VISIBLE_DEVICES"], "0");
        assert_eq!(env["KERNELBOT_GPU_INDEX"], idx.to_string());
        assert_eq!(env["KERNELBOT_CPUSET"], cpuset);
        assert_eq!(env["BUILDKITE_PLUGIN_DOCKER_DEVICES_0"], "/dev/kfd");
        // Only this GPU's render node, not /dev/dri with every GPU of the node.
        assert_eq!(
            env["BUILDKITE_PLUGIN_DOCKER_DEVICES_1"],
            format!("/dev/dri/renderD{}", 128 + idx)
        );
        assert!(!env.contains_key("BUILDKITE_PLUGIN_DOCKER_DEVICES_2"));
        assert!(
            !env.contains_key("NVIDIA_VISIBLE_DEVICES")
                && !env.contains_key("BUILDKITE_PLUGIN_DOCKER_GPUS")
        );
        let slice = read(
            root.path(),
            &format!("/etc/systemd/system/kernelbot-gpu{idx}.slice"),
        );
        assert!(
            slice.contains(&format!("AllowedCPUs={cpuset}")) && slice.contains("MemoryMax=128G"),
            "{slice}"
        );
    }
    assert!(!root.path().join("etc/buildkite-agent/agent-8").exists());

    // Fewer render nodes than GPUs: nothing is set up, and the reason is given.
    let other = tempfile::tempdir().unwrap();
    let short = setup(
        other.path(),
        tools.path(),
        &[
            ("QUEUE", "mi300"),
            ("CPU_STANDIN_TOPOLOGY", "1x128x1"),
            ("NODE_MEMORY_GB", "1032"),
            ("RENDER_NODES", "renderD128 renderD129"),
        ],
    );
    assert_refused(&short, "found 2 render node(s) for 8 GPUs");
    assert!(!other.path().join("etc").exists());
}

/// An 8-GPU node of each vendor with `GPUS_PER_AGENT`: each agent holds its GPUs (numbered
/// from 0 in the container) and their share of the node, and its docker admits exactly them.
#[test]
fn a_multi_gpu_node_gets_agents_holding_several_gpus() {
    let stub = stub_docker();
    let real = stub.path().join("docker");
    let checkout = tempfile::tempdir().unwrap();
    for (nvidia, amd) in [(8, 0), (0, 8)] {
        for per_agent in [4, 8] {
            let root = tempfile::tempdir().unwrap();
            let tools = stubs(nvidia, amd);
            let per = per_agent.to_string();
            let vars = [
                ("QUEUE", "mi300x8"),
                ("CPU_STANDIN_TOPOLOGY", "1x128x1"),
                ("NODE_MEMORY_GB", "1032"),
                ("RENDER_NODES", RENDER_NODES),
                ("GPUS_PER_AGENT", per.as_str()),
                ("REAL_DOCKER", real.to_str().unwrap()),
            ];
            let s = setup(root.path(), tools.path(), &vars);
            assert_eq!(s.code, 0, "{}", s.output);
            let agents = 8 / per_agent;
            // 128 cores, one kept for the host: 15 a GPU.
            let (cpus, gib) = (15 * per_agent, 128 * per_agent);
            let said =
                format!("{agents} agent(s) of {per_agent} GPUs, {cpus} CPUs and {gib} GiB each");
            assert!(s.output.contains(&said), "{}", s.output);
            for agent in 0..agents {
                let (first, last) = (agent * per_agent, agent * per_agent + per_agent - 1);
                let gpus: Vec<String> = (first..=last).map(|i| i.to_string()).collect();
                let visible: Vec<String> = (0..per_agent).map(|i| i.to_string()).collect();
                let env = hook_env(root.path(), first);
                let cpuset = format!("{}-{}", 1 + agent * cpus, agent * cpus + cpus);
                assert_eq!(env["KERNELBOT_GPU_INDEX"], first.to_string());
                assert_eq!(env["KERNELBOT_GPUS"], gpus.join(","));
                assert_eq!(env["KERNELBOT_GPU_COUNT"], per);
                assert_eq!(env["KERNELBOT_CPUSET"], cpuset);
                assert_eq!(env["BUILDKITE_PLUGIN_DOCKER_MEMORY"], format!("{gib}g"));
                let cfg = read(
                    root.path(),
                    &format!("/etc/buildkite-agent/agent-{first}/buildkite-agent.cfg"),
                );
                assert!(
                    cfg.contains(&format!("queue=mi300x8,gpus={first}-{last},")),
                    "{cfg}"
                );
                assert!(
                    cfg.contains(&format!("name=\"gpunode-gpus{first}-{last}\"")),
                    "{cfg}"
                );
                let slice = read(
                    root.path(),
                    &format!("/etc/systemd/system/kernelbot-gpus{first}-{last}.slice"),
                );
                assert!(slice.contains(&format!("AllowedCPUs={cpuset}")), "{slice}");
                assert!(slice.contains(&format!("MemoryMax={gib}G")), "{slice}");
                if nvidia > 0 {
                    assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], gpus.join(","));
                    assert_eq!(env["CUDA_VISIBLE_DEVICES"], visible.join(","));
                    // Quoted: docker reads --gpus as CSV.
                    let quoted = format!("\"device={}\"", gpus.join(","));
                    assert_eq!(env["BUILDKITE_PLUGIN_DOCKER_GPUS"], quoted);
                } else {
                    assert_eq!(env["ROCR_VISIBLE_DEVICES"], visible.join(","));
                    assert_eq!(env["HIP_VISIBLE_DEVICES"], visible.join(","));
                    for (i, gpu) in (first..=last).enumerate() {
                        let node = format!("/dev/dri/renderD{}", 128 + gpu);
                        assert_eq!(
                            env[&format!("BUILDKITE_PLUGIN_DOCKER_DEVICES_{}", i + 1)],
                            node
                        );
                    }
                    let beyond = format!("BUILDKITE_PLUGIN_DOCKER_DEVICES_{}", per_agent + 1);
                    assert!(!env.contains_key(&beyond));
                }
                admits_exactly_its_gpus(root.path(), first, checkout.path(), &env, nvidia > 0);
            }
            // One agent per group of GPUs, none per GPU.
            for gpu in 0..8 {
                let dir = root.path().join(format!("etc/buildkite-agent/agent-{gpu}"));
                assert_eq!(dir.exists(), gpu % per_agent == 0, "agent-{gpu}");
            }
        }
    }
    // GPUs that agents of that size cannot split: nothing is set up, and the reason is given.
    let root = tempfile::tempdir().unwrap();
    let tools = stubs(8, 0);
    let s = setup(
        root.path(),
        tools.path(),
        &[("QUEUE", "h100x3"), ("GPUS_PER_AGENT", "3")],
    );
    assert_refused(&s, "8 GPUs cannot be split into agents of GPUS_PER_AGENT=3");
    assert!(!root.path().join("etc").exists());
    let s = setup(
        root.path(),
        tools.path(),
        &[("QUEUE", "h100"), ("GPUS_PER_AGENT", "0")],
    );
    assert_refused(&s, "GPUS_PER_AGENT must be a positive number");
}

/// The plugin's container runs on agent `first`'s docker; any GPU or render node beyond the
/// agent's is refused.
fn admits_exactly_its_gpus(
    root: &Path,
    first: usize,
    checkout: &Path,
    env: &BTreeMap<String, String>,
    nvidia: bool,
) {
    let args = plugin_args(checkout, env);
    let (code, out) = wrapped_docker(root, first, checkout, &args);
    assert_eq!(code, 0, "the plugin's own container must run: {out}");
    // A GPU of the node outside the agent's, else one beyond the node.
    let count: usize = env["KERNELBOT_GPU_COUNT"].parse().unwrap();
    let other = if count < 8 { (first + count) % 8 } else { 8 };
    let gpus = &env["KERNELBOT_GPUS"];
    let bad: Vec<Vec<String>> = if nvidia {
        vec![
            strings(&["--gpus", &format!("device={gpus},{other}")]),
            strings(&["--gpus", &format!("\"device={gpus},{other}\"")]),
            strings(&["--gpus", &format!("device={other}")]),
            strings(&["--gpus", "all"]),
        ]
    } else {
        vec![
            strings(&["--device", &format!("/dev/dri/renderD{}", 128 + other)]),
            strings(&["--device", "/dev/dri"]),
            strings(&["--device", "/dev/dri/renderD12"]),
        ]
    };
    let (base, tail) = args.split_at(args.len() - 5);
    for extra in bad {
        let attempt: Vec<String> = [base, &extra, tail].concat();
        let (code, out) = wrapped_docker(root, first, checkout, &attempt);
        assert_eq!(code, 125, "{extra:?}: {out}");
        assert!(out.contains("refusing"), "{out}");
    }
}

const RENDER_NODES: &str =
    "renderD128 renderD129 renderD130 renderD131 renderD132 renderD133 renderD134 renderD135";

/// The wrapper setup-node.sh installs, called as the docker plugin calls docker, in `cwd`
/// (the checkout), with the agent's hook sourced; the real docker is a stub that prints its
/// arguments.
fn wrapped_docker(root: &Path, idx: usize, cwd: &Path, args: &[String]) -> (i32, String) {
    let hook = root.join(format!("etc/buildkite-agent/agent-{idx}/hooks/environment"));
    let wrapper = root.join("usr/local/lib/kernelbot/bin/docker");
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && exec {} \"$@\"",
            hook.display(),
            wrapper.display()
        ))
        .arg("docker")
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn stub_docker() -> tempfile::TempDir {
    let stub = tempfile::tempdir().unwrap();
    let real = stub.path().join("docker");
    std::fs::write(&real, "#!/bin/sh\nprintf '%s\\n' \"$@\"\n").unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).unwrap();
    stub
}

/// `docker run`'s arguments as docker plugin v5 builds them from `pipeline.yml`'s options
/// and the agent hook's `BUILDKITE_PLUGIN_DOCKER_*` values (its `commands/run.sh` order).
fn plugin_args(cwd: &Path, hook: &BTreeMap<String, String>) -> Vec<String> {
    let p = pipeline();
    let cfg = p["steps"][0]["plugins"][0]
        .as_mapping()
        .unwrap()
        .values()
        .next()
        .unwrap()
        .clone();
    let list = |key: &str| -> Vec<String> {
        cfg[key]
            .as_sequence()
            .map(|s| {
                s.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut args: Vec<String> = vec!["run".into()];
    if cfg["tty"].as_bool() != Some(false) {
        args.push("-t".into());
    }
    // Read from the option, else the agent hook's variable, defaulting to on.
    let interactive = cfg["interactive"]
        .as_bool()
        .map(|b| b.to_string())
        .or_else(|| hook.get("BUILDKITE_PLUGIN_DOCKER_INTERACTIVE").cloned())
        .unwrap_or_else(|| "on".into());
    if matches!(interactive.as_str(), "true" | "on" | "1") {
        args.push("-i".into());
    }
    args.extend(["--rm".into(), "--init".into()]);
    for v in list("volumes") {
        let v = match v.strip_prefix("./") {
            Some(rest) => format!("{}//{rest}", cwd.display()),
            None => v,
        };
        args.extend(["--volume".into(), v]);
    }
    for (i, _) in hook
        .keys()
        .filter(|k| k.starts_with("BUILDKITE_PLUGIN_DOCKER_DEVICES_"))
        .enumerate()
    {
        args.extend([
            "--device".into(),
            hook[&format!("BUILDKITE_PLUGIN_DOCKER_DEVICES_{i}")].clone(),
        ]);
    }
    for c in list("add-caps") {
        args.extend(["--cap-add".into(), c]);
    }
    for c in list("drop-caps") {
        args.extend(["--cap-drop".into(), c]);
    }
    for o in list("security-opts") {
        args.extend(["--security-opt".into(), o]);
    }
    args.extend(["--workdir".into(), cfg["workdir"].as_str().unwrap().into()]);
    for e in list("environment") {
        args.extend(["--env".into(), e]);
    }
    args.extend(["--network".into(), cfg["network"].as_str().unwrap().into()]);
    if let Some(gpus) = hook.get("BUILDKITE_PLUGIN_DOCKER_GPUS") {
        args.extend(["--gpus".into(), gpus.clone()]);
    }
    args.extend([
        "--shm-size".into(),
        cfg["shm-size"].as_str().unwrap().into(),
    ]);
    args.push(format!("--cpus={}", hook["BUILDKITE_PLUGIN_DOCKER_CPUS"]));
    args.push(format!(
        "--memory={}",
        hook["BUILDKITE_PLUGIN_DOCKER_MEMORY"]
    ));
    args.push(format!(
        "--memory-swap={}",
        hook["BUILDKITE_PLUGIN_DOCKER_MEMORY_SWAP"]
    ));
    args.extend(["--label".into(), "com.buildkite.job-id=0190-aaaa".into()]);
    args.push(cfg["image"].as_str().unwrap().into());
    args.extend([
        "/bin/sh".into(),
        "-e".into(),
        "-c".into(),
        "kernelbot-runner".into(),
    ]);
    args
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

#[test]
fn the_docker_wrapper_runs_the_plugins_container_with_the_cpu_set_and_refuses_the_rest() {
    let stub = stub_docker();
    let real = stub.path().join("docker");
    let checkout = tempfile::tempdir().unwrap();
    for (nvidia, amd, idx, cpuset) in [(2, 0, 1, "8-14"), (0, 2, 1, "8-14")] {
        let root = tempfile::tempdir().unwrap();
        let tools = stubs(nvidia, amd);
        let vars = [
            ("QUEUE", "h100"),
            ("CPU_STANDIN_TOPOLOGY", "1x16x1"),
            ("NODE_MEMORY_GB", "72"),
            ("PIDS_LIMIT", "2048"),
            ("RENDER_NODES", "renderD128 renderD129"),
            ("REAL_DOCKER", real.to_str().unwrap()),
        ];
        let s = setup(root.path(), tools.path(), &vars);
        assert_eq!(s.code, 0, "{}", s.output);
        assert_eq!(
            mode(root.path(), "/usr/local/lib/kernelbot/bin/docker"),
            0o755
        );
        let hook = hook_env(root.path(), idx);
        let args = plugin_args(checkout.path(), &hook);
        let (code, out) = wrapped_docker(root.path(), idx, checkout.path(), &args);
        assert_eq!(code, 0, "the plugin's own container must run: {out}");
        // Its memory on its node (one node here), as the slice says.
        assert_eq!(hook.get("KERNELBOT_MEMS").map(String::as_str), Some("0"));
        let mut want = vec![
            "run".to_owned(),
            format!("--cpuset-cpus={cpuset}"),
            "--cpuset-mems=0".to_owned(),
            "--pids-limit=2048".to_owned(),
        ];
        want.extend(args[1..].iter().cloned());
        assert_eq!(out.lines().collect::<Vec<_>>(), want);

        // Each of these, added to the plugin's arguments, is refused.
        let base = &args[..args.len() - 5];
        let other_gpu = if nvidia > 0 {
            strings(&["--gpus", "device=0"])
        } else {
            strings(&["--device", "/dev/dri/renderD128"])
        };
        let bad: Vec<Vec<String>> = vec![
            strings(&["--privileged"]),
            strings(&["--privileged=1"]),
            strings(&["--label", "--network", "--privileged"]),
            strings(&["--network", "host"]),
            strings(&["--network=container:abc"]),
            strings(&["--pid=host"]),
            strings(&["--ipc", "host"]),
            strings(&["--cap-add", "SYS_ADMIN"]),
            strings(&["--cap-add=ALL"]),
            strings(&["--device", "/dev/sda"]),
            strings(&["--gpus", "all"]),
            other_gpu,
            strings(&["-v", "/:/host"]),
            strings(&["-v=/:/host"]),
            strings(&["-itv", "/:/host"]),
            strings(&["--volume", "kernelbot-out:/out"]),
            strings(&["--volume=/var/lib/buildkite-agent/gpu-0/builds/x/kernelbot-out:/out"]),
            strings(&["--mount", "type=bind,src=/,dst=/host"]),
            strings(&["--security-opt", "seccomp=unconfined"]),
            strings(&["--pids-limit", "-1"]),
            strings(&["--cpuset-cpus=0-63"]),
            strings(&["--cpuset-mems", "0-1"]),
            strings(&["--runtime", "runc-unsafe"]),
            strings(&["-u", "1000"]),
            strings(&["--env", "NVIDIA_VISIBLE_DEVICES=all"]),
        ];
        for extra in bad {
            let mut attempt = base.to_vec();
            attempt.extend(extra.iter().cloned());
            attempt.extend(args[args.len() - 5..].iter().cloned());
            let (code, out) = wrapped_docker(root.path(), idx, checkout.path(), &attempt);
            assert_eq!(code, 125, "{extra:?}: {out}");
            assert!(out.contains("refusing"), "{out}");
        }
        for cmd in [
            &["-H", "tcp://10.0.0.1:2375", "run", "image"][..],
            &["update", "--pids-limit", "-1", "c"],
            &["exec", "--privileged", "c", "sh"],
            &["container", "update", "--cpuset-cpus", "0-63", "c"],
            &["compose", "run", "x"],
        ] {
            let (code, out) = wrapped_docker(root.path(), idx, checkout.path(), &strings(cmd));
            assert_eq!(code, 125, "{cmd:?}: {out}");
        }
        // Everything else passes through untouched.
        let (code, out) = wrapped_docker(
            root.path(),
            idx,
            checkout.path(),
            &strings(&["pull", "image"]),
        );
        assert_eq!((code, out.as_str()), (0, "pull\nimage\n"));
        // Outside an agent's hook (no CPU set), nothing runs.
        let out = Command::new(root.path().join("usr/local/lib/kernelbot/bin/docker"))
            .args(["run", "image"])
            .env_clear()
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125));
    }
}

/// What one run of agent 0's `post-command` hook did: its exit code, what it asked of the
/// `buildkite-agent` stand-in, and its output.
struct HookRun {
    code: i32,
    calls: Vec<serde_json::Value>,
    output: String,
}

/// Runs agent 0's `post-command` hook in a checkout after a command that exited `exit`,
/// with `infra` as the runner's `kernelbot-out/infra.txt`, and (when `token`) the agent's
/// access token in the job's environment.
fn post_command(root: &Path, exit: &str, infra: Option<&str>, token: bool) -> HookRun {
    let hook = root.join("etc/buildkite-agent/agent-0/hooks/post-command");
    let checkout = tempfile::tempdir().unwrap();
    let out = checkout.path().join("kernelbot-out");
    std::fs::create_dir(&out).unwrap();
    if let Some(line) = infra {
        std::fs::write(out.join("infra.txt"), line).unwrap();
    }
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/buildkite-agent");
    let log = checkout.path().join("calls.jsonl");
    let mut command = Command::new("bash");
    command
        .arg(&hook)
        .current_dir(checkout.path())
        .env_clear()
        .envs(hook_env(root, 0))
        .env("PATH", format!("{}:/usr/bin:/bin", agent.display()))
        .env("BUILDKITE_COMMAND_EXIT_STATUS", exit)
        .env("BUILDKITE_JOB_ID", "0190f0e4-job")
        .env("BUILDKITE_AGENT_NAME", "gpunode-gpu0")
        .env("BUILDKITE_AGENT_STANDIN_LOG", &log);
    if token {
        command.env("BUILDKITE_AGENT_ACCESS_TOKEN", "agent-access-token");
    }
    let ran = command.output().unwrap();
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    HookRun {
        code: ran.status.code().unwrap_or(-1),
        calls: calls
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect(),
        output: String::from_utf8_lossy(&ran.stdout).into_owned()
            + &String::from_utf8_lossy(&ran.stderr),
    }
}

/// A one-GPU node set up on a temporary root with `PAUSE_MINUTES=90`, and its stub tools.
fn one_gpu_node_pausing_90_minutes() -> (tempfile::TempDir, tempfile::TempDir) {
    let root = tempfile::tempdir().unwrap();
    let tools = stubs(1, 0);
    let vars = [
        ("QUEUE", "h100"),
        ("CPU_STANDIN_TOPOLOGY", "1x8x1"),
        ("NODE_MEMORY_GB", "32"),
        ("PAUSE_MINUTES", "90"),
    ];
    let s = setup(root.path(), tools.path(), &vars);
    assert_eq!(s.code, 0, "{}", s.output);
    (root, tools)
}

/// After the runner's infrastructure exit code the agent notes why in the build's meta-data
/// and pauses itself, with its own token, for `PAUSE_MINUTES`; after any other exit it does
/// nothing; a call that fails never changes the job's exit status.
#[test]
fn after_an_infrastructure_failure_the_agent_pauses_itself() {
    let (root, tools) = one_gpu_node_pausing_90_minutes();
    let hook = "/etc/buildkite-agent/agent-0/hooks/post-command";
    assert_eq!(mode(root.path(), hook), 0o755);
    let reason = "ecc_errors: GPU 0 has 3 uncorrected ECC errors";
    let r = post_command(root.path(), "75", Some(&format!("pause\n{reason}\n")), true);
    assert_eq!(r.code, 0, "{}", r.output);
    let commands: Vec<&serde_json::Value> = r.calls.iter().map(|c| &c["command"]).collect();
    assert_eq!(
        commands,
        [
            &serde_json::json!(["meta-data", "set", "kernelbot-infra:0190f0e4-job", reason]),
            &serde_json::json!([
                "pause",
                "--note",
                format!("kernelbot: {reason}"),
                "--timeout-in-minutes",
                "90"
            ]),
        ],
        "{}",
        r.output
    );
    for exit in ["0", "1", "-1", "255", "74"] {
        let r = post_command(root.path(), exit, Some(&format!("pause\n{reason}\n")), true);
        assert_eq!((r.code, r.calls.len()), (0, 0), "exit {exit}: {}", r.output);
    }
    // A fault that may pass (a hot GPU, a throttled run: perhaps the submission's own doing):
    // noted for the report, retried elsewhere, the agent not paused.
    let hot = "throttled: HwThermalSlowdown before and after the leaderboard run, twice";
    let r = post_command(root.path(), "75", Some(&format!("retry\n{hot}\n")), true);
    let commands: Vec<&serde_json::Value> = r.calls.iter().map(|c| &c["command"]).collect();
    assert_eq!(
        commands,
        [&serde_json::json!([
            "meta-data",
            "set",
            "kernelbot-infra:0190f0e4-job",
            hot
        ])],
        "{}",
        r.output
    );
    assert!(r.output.contains("agent not paused"), "{}", r.output);
    // No infra.txt (no runner wrote one): noted, and no pause on a word it did not say.
    let r = post_command(root.path(), "75", None, true);
    assert_eq!(r.calls.len(), 1, "{:?}", r.calls);
    assert!(
        r.calls[0]["command"][3]
            .as_str()
            .unwrap()
            .contains("no reason written"),
        "{:?}",
        r.calls
    );
    // Without the agent's token both calls fail: said in the log, the exit stays the job's.
    let r = post_command(
        root.path(),
        "75",
        Some(&format!("pause\n{reason}\n")),
        false,
    );
    assert_eq!((r.code, r.calls.len()), (0, 0), "{}", r.output);
    assert!(
        r.output.contains("could not pause this agent"),
        "{}",
        r.output
    );
    // Out of Buildkite's range, or not a number: setup refuses it.
    for minutes in ["0", "10081", "4h"] {
        let refused = setup(
            tempfile::tempdir().unwrap().path(),
            tools.path(),
            &[
                ("QUEUE", "h100"),
                ("CPU_STANDIN_TOPOLOGY", "1x8x1"),
                ("NODE_MEMORY_GB", "32"),
                ("PAUSE_MINUTES", minutes),
            ],
        );
        assert_refused(&refused, "PAUSE_MINUTES must be");
    }
}

/// After the runner's exit code 76 (a timed run stayed throttled after the submission ran:
/// perhaps its own heat) the agent notes why, as after 75, but never pauses itself, whatever
/// infra.txt says; the job's exit status stays its own.
#[test]
fn after_a_run_that_stayed_throttled_the_agent_notes_it_and_never_pauses() {
    let (root, _tools) = one_gpu_node_pausing_90_minutes();
    let reason = "throttled: SwThermalSlowdown after the leaderboard run, twice";
    for infra in [
        Some(format!("pause\n{reason}\n")),
        Some(format!("retry\n{reason}\n")),
        None,
    ] {
        let r = post_command(root.path(), "76", infra.as_deref(), true);
        assert_eq!(r.code, 0, "{}", r.output);
        let noted = if infra.is_some() {
            reason
        } else {
            "infrastructure failure (no reason written)"
        };
        let commands: Vec<&serde_json::Value> = r.calls.iter().map(|c| &c["command"]).collect();
        assert_eq!(
            commands,
            [&serde_json::json!([
                "meta-data",
                "set",
                "kernelbot-infra:0190f0e4-job",
                noted
            ])],
            "{infra:?}: {}",
            r.output
        );
        assert!(r.output.contains("agent not paused"), "{}", r.output);
    }
    // Without the agent's token the note fails: said, and the exit stays the job's.
    let r = post_command(
        root.path(),
        "76",
        Some(&format!("pause\n{reason}\n")),
        false,
    );
    assert_eq!((r.code, r.calls.len()), (0, 0), "{}", r.output);
    assert!(
        r.output
            .contains("could not record the infrastructure failure"),
        "{}",
        r.output
    );
}

/// The hook the local stack's agent runs is the one setup-node.sh writes, byte for byte.
#[test]
fn the_local_agent_runs_the_hook_setup_writes() {
    let root = tempfile::tempdir().unwrap();
    let tools = stubs(1, 0);
    let s = setup(
        root.path(),
        tools.path(),
        &[
            ("QUEUE", "h100"),
            ("CPU_STANDIN_TOPOLOGY", "1x8x1"),
            ("NODE_MEMORY_GB", "32"),
        ],
    );
    assert_eq!(s.code, 0, "{}", s.output);
    let written = read(
        root.path(),
        "/etc/buildkite-agent/agent-0/hooks/post-command",
    );
    assert_eq!(
        Some(written),
        kernelbot_dispatch::devstack::agent::post_command_hook()
    );
}

#[test]
fn the_pre_command_hook_makes_a_fresh_output_directory() {
    let root = tempfile::tempdir().unwrap();
    let tools = stubs(1, 0);
    let vars = [
        ("QUEUE", "h100"),
        ("CPU_STANDIN_TOPOLOGY", "1x8x1"),
        ("NODE_MEMORY_GB", "40"),
    ];
    assert_eq!(setup(root.path(), tools.path(), &vars).code, 0);
    let hook = "/etc/buildkite-agent/agent-0/hooks/pre-command";
    assert_eq!(mode(root.path(), hook), 0o755);
    let checkout = tempfile::tempdir().unwrap();
    let out = checkout.path().join("kernelbot-out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("result.json"), "stale").unwrap();
    let ran = Command::new("bash")
        .arg(root.path().join(hook.trim_start_matches('/')))
        .current_dir(checkout.path())
        .status()
        .unwrap();
    assert!(ran.success());
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        0,
        "a stale result is gone"
    );
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o755
    );
}

#[test]
fn running_setup_twice_changes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let tools = stubs(2, 0);
    let vars = [
        ("QUEUE", "h100"),
        ("CPU_STANDIN_TOPOLOGY", "1x16x1"),
        ("NODE_MEMORY_GB", "72"),
    ];
    let first = setup(root.path(), tools.path(), &vars);
    assert!(
        first.output.contains("done: 17 change(s)"),
        "{}",
        first.output
    );
    let before = snapshot(root.path());
    let second = setup(root.path(), tools.path(), &vars);
    assert_eq!(second.code, 0);
    assert!(
        second.output.contains("done: 0 change(s)"),
        "{}",
        second.output
    );
    assert_eq!(snapshot(root.path()), before);
    // A changed input is applied, and only where it matters.
    let third = setup(
        root.path(),
        tools.path(),
        &[
            ("QUEUE", "h100"),
            ("CPU_STANDIN_TOPOLOGY", "1x16x1"),
            ("NODE_MEMORY_GB", "40"),
        ],
    );
    assert!(
        third.output.contains("done: 4 change(s)"),
        "{}",
        third.output
    );
    assert!(
        read(root.path(), "/etc/systemd/system/kernelbot-gpu0.slice").contains("MemoryMax=16G")
    );
}

#[test]
fn missing_or_impossible_inputs_stop_setup_with_a_reason() {
    let root = tempfile::tempdir().unwrap();
    let tools = stubs(8, 0);
    let no_queue = setup(root.path(), tools.path(), &[]);
    assert_ne!(no_queue.code, 0);
    assert!(
        no_queue.output.contains("QUEUE is required"),
        "{}",
        no_queue.output
    );
    let bad_queue = setup(root.path(), tools.path(), &[("QUEUE", "H100 BK")]);
    assert!(bad_queue.output.contains("QUEUE must be"));
    let too_few = setup(
        root.path(),
        tools.path(),
        &[
            ("QUEUE", "h100"),
            ("CPU_STANDIN_TOPOLOGY", "1x4x1"),
            ("NODE_MEMORY_GB", "100"),
        ],
    );
    assert_refused(
        &too_few,
        "NUMA node 0 has 3 core(s) left after the host's 1 (HOST_CORES) for its 8 GPU(s)",
    );
    let no_gpu = setup(root.path(), stubs(0, 0).path(), &[("QUEUE", "h100")]);
    assert!(no_gpu.output.contains("no GPU found"), "{}", no_gpu.output);
    assert!(!root.path().join("etc").exists(), "nothing was written");
}

/// The stand-in nvidia-smi's PCI bus ids, as sysfs names the devices.
const NVIDIA_PCI: [&str; 8] = [
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
];

/// Writes each of the 8 GPUs' NUMA node in sysfs under `root`, as on a two-socket board:
/// GPUs 0-3 on node 0, 4-7 on node 1 (NVIDIA: by PCI address; AMD: by render node).
fn place_gpus_on_two_nodes(root: &Path, nvidia: bool) {
    for (gpu, pci) in NVIDIA_PCI.iter().enumerate() {
        let device = if nvidia {
            format!("sys/bus/pci/devices/{pci}")
        } else {
            format!("sys/class/drm/renderD{}/device", 128 + gpu)
        };
        let dir = root.join(device);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("numa_node"), format!("{}\n", gpu / 4)).unwrap();
    }
}

/// The CPUs of a cpuset list like `1-3,33-35`.
fn cpus_in(list: &str) -> Vec<usize> {
    list.split(',')
        .flat_map(|part| {
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            lo.parse::<usize>().unwrap()..=hi.parse::<usize>().unwrap()
        })
        .collect()
}

/// On 2 sockets × 16 cores × 2 threads (core c is CPUs c and c + 32; cores 0-15 are NUMA
/// node 0, 16-31 node 1) with GPUs 0-3 on node 0 and 4-7 on node 1, every agent gets whole
/// cores of its GPU's node, as many as every other, and none the host keeps.
#[test]
fn a_two_socket_node_gives_each_agent_whole_cores_of_its_gpus_numa_node() {
    let node_of = |cpu: usize| cpu % 32 / 16;
    let sibling = |cpu: usize| (cpu + 32) % 64;
    // Node 0 keeps core 0 for the host: 15 cores for its 4 GPUs, 3 each; node 1's get as many.
    let want = [
        "1-3,33-35",
        "4-6,36-38",
        "7-9,39-41",
        "10-12,42-44",
        "16-18,48-50",
        "19-21,51-53",
        "22-24,54-56",
        "25-27,57-59",
    ];
    let docker = stub_docker();
    let real = docker.path().join("docker");
    let checkout = tempfile::tempdir().unwrap();
    for (nvidia, amd) in [(8, 0), (0, 8)] {
        let root = tempfile::tempdir().unwrap();
        let tools = stubs(nvidia, amd);
        place_gpus_on_two_nodes(root.path(), nvidia > 0);
        let vars = [
            ("QUEUE", "h100"),
            ("CPU_STANDIN_TOPOLOGY", "2x16x2"),
            ("NODE_MEMORY_GB", "1032"),
            ("RENDER_NODES", RENDER_NODES),
            ("REAL_DOCKER", real.to_str().unwrap()),
        ];
        let s = setup(root.path(), tools.path(), &vars);
        assert_eq!(s.code, 0, "{}", s.output);
        let mut taken = std::collections::BTreeSet::new();
        for (gpu, cpuset) in want.iter().enumerate() {
            let env = hook_env(root.path(), gpu);
            assert_eq!(env["KERNELBOT_CPUSET"], *cpuset, "GPU {gpu}");
            assert_eq!(env["KERNELBOT_CPUS"], "6");
            assert_eq!(env["BUILDKITE_PLUGIN_DOCKER_CPUS"], "6");
            let slice = read(
                root.path(),
                &format!("/etc/systemd/system/kernelbot-gpu{gpu}.slice"),
            );
            for line in [
                format!("AllowedCPUs={cpuset}\n"),
                format!("AllowedMemoryNodes={}\n", gpu / 4),
                "CPUQuota=600%\n".to_owned(),
            ] {
                assert!(slice.contains(&line), "{line}: {slice}");
            }
            let said = format!("gpu{gpu}: CPUs {cpuset} (6), memory node(s) {}", gpu / 4);
            assert!(s.output.contains(&said), "{said}: {}", s.output);
            let cpus = cpus_in(&env["KERNELBOT_CPUSET"]);
            for &cpu in &cpus {
                assert_eq!(node_of(cpu), gpu / 4, "CPU {cpu} of GPU {gpu}");
                assert!(
                    cpus.contains(&sibling(cpu)),
                    "a whole core: CPU {cpu}'s sibling"
                );
                assert!(taken.insert(cpu), "CPU {cpu} given twice");
            }
            // The job's container gets that set, a list of ranges, as docker reads it.
            let args = plugin_args(checkout.path(), &env);
            let (code, out) = wrapped_docker(root.path(), gpu, checkout.path(), &args);
            assert_eq!(code, 0, "{out}");
            assert_eq!(
                out.lines().nth(1),
                Some(format!("--cpuset-cpus={cpuset}").as_str())
            );
            // And its memory on its GPU's node: the container is not in the agent's slice.
            assert_eq!(
                out.lines().nth(2),
                Some(format!("--cpuset-mems={}", gpu / 4).as_str())
            );
        }
        // Core 0 and what is left over stay with the host.
        assert!(!taken.contains(&0) && !taken.contains(&32));
        assert!(
            s.output
                .contains("the host keeps CPUs 0,13-15,28-32,45-47,60-63"),
            "{}",
            s.output
        );
    }

    // Agents of several GPUs get their GPUs' cores together, and their nodes' memory.
    let tools = stubs(8, 0);
    for (per_agent, agents) in [
        ("4", &[("1-12,33-44", "0"), ("16-27,48-59", "1")][..]),
        ("8", &[("1-12,16-27,33-44,48-59", "0-1")][..]),
    ] {
        let root = tempfile::tempdir().unwrap();
        place_gpus_on_two_nodes(root.path(), true);
        let vars = [
            ("QUEUE", "h100x4"),
            ("CPU_STANDIN_TOPOLOGY", "2x16x2"),
            ("NODE_MEMORY_GB", "1032"),
            ("GPUS_PER_AGENT", per_agent),
        ];
        let s = setup(root.path(), tools.path(), &vars);
        assert_eq!(s.code, 0, "{}", s.output);
        let per: usize = per_agent.parse().unwrap();
        for (agent, (cpuset, nodes)) in agents.iter().enumerate() {
            let (first, last) = (agent * per, agent * per + per - 1);
            assert_eq!(hook_env(root.path(), first)["KERNELBOT_CPUSET"], *cpuset);
            let slice = read(
                root.path(),
                &format!("/etc/systemd/system/kernelbot-gpus{first}-{last}.slice"),
            );
            assert!(
                slice.contains(&format!("AllowedCPUs={cpuset}\n")),
                "{slice}"
            );
            assert!(
                slice.contains(&format!("AllowedMemoryNodes={nodes}\n")),
                "{slice}"
            );
        }
    }

    // More host cores: node 0 then has 11 for its 4 GPUs, so every GPU gets 2.
    let root = tempfile::tempdir().unwrap();
    place_gpus_on_two_nodes(root.path(), true);
    let vars = [
        ("QUEUE", "h100"),
        ("CPU_STANDIN_TOPOLOGY", "2x16x2"),
        ("NODE_MEMORY_GB", "1032"),
        ("HOST_CORES", "5"),
        // No longer read: said so, and nothing changes.
        ("NODE_CPUS", "4"),
    ];
    let s = setup(root.path(), tools.path(), &vars);
    assert_eq!(s.code, 0, "{}", s.output);
    assert!(
        s.output.contains("NODE_CPUS is no longer read"),
        "{}",
        s.output
    );
    assert_eq!(hook_env(root.path(), 0)["KERNELBOT_CPUSET"], "5-6,37-38");
    assert_eq!(hook_env(root.path(), 4)["KERNELBOT_CPUSET"], "16-17,48-49");
    for host_cores in ["0", "x"] {
        let refused = setup(
            tempfile::tempdir().unwrap().path(),
            tools.path(),
            &[("QUEUE", "h100"), ("HOST_CORES", host_cores)],
        );
        assert_refused(&refused, "HOST_CORES must be a number of cores, 1 or more");
    }

    // The GPUs' nodes unknown (no numa_node in sysfs) on a machine of two: said, and the
    // machine's cores are one pool, without a memory node.
    let root = tempfile::tempdir().unwrap();
    let vars = [
        ("QUEUE", "h100"),
        ("CPU_STANDIN_TOPOLOGY", "2x16x2"),
        ("NODE_MEMORY_GB", "1032"),
    ];
    let s = setup(root.path(), tools.path(), &vars);
    assert_eq!(s.code, 0, "{}", s.output);
    assert!(
        s.output.contains("the NUMA node of some GPU is unknown"),
        "{}",
        s.output
    );
    assert_eq!(hook_env(root.path(), 4)["KERNELBOT_CPUSET"], "13-15,45-47");
    let slice = read(root.path(), "/etc/systemd/system/kernelbot-gpu4.slice");
    assert!(!slice.contains("AllowedMemoryNodes"), "{slice}");
}

/// The reading of every GPU the runner's pre-flight makes, as the message names it.
const NVIDIA_QUERY: &str = "--query-gpu=index,uuid,name,temperature.gpu,power.draw,clocks.sm,\
clocks.mem,clocks.max.sm,clocks_event_reasons.active,ecc.errors.uncorrected.volatile.total,\
retired_pages.pending,power.limit,power.default_limit --format=csv,noheader,nounits";

/// A GPU the runner would refuse every job on stops setup before anything is written, with
/// the GPU, the query and what the tool said; an older driver's name for the clock-event
/// mask is no such failure.
#[test]
fn a_node_whose_gpu_query_fails_is_refused_with_the_reason() {
    let fail = "Unable to determine the device handle for GPU0000:18:00.0: Unknown Error";
    let refused = |tools: &Path, vars: &[(&str, &str)], says: &str| {
        let root = tempfile::tempdir().unwrap();
        let mut all = vec![
            ("QUEUE", "h100"),
            ("CPU_STANDIN_TOPOLOGY", "2x16x2"),
            ("NODE_MEMORY_GB", "1032"),
            ("RENDER_NODES", RENDER_NODES),
        ];
        all.extend_from_slice(vars);
        assert_refused(&setup(root.path(), tools, &all), says);
        assert!(!root.path().join("etc").exists(), "nothing was written");
    };
    let nvidia = stubs(8, 0);
    refused(
        nvidia.path(),
        &[
            ("GPU_VENDOR", "nvidia"),
            ("GPU_COUNT", "8"),
            ("GPU_STANDIN_FAIL", fail),
        ],
        &format!(
            "GPU 0's pre-flight query failed: nvidia-smi -i 0 {NVIDIA_QUERY} printed: {fail} \
             (exit 9); fix the driver before adding this node"
        ),
    );
    // Found by its tool, which fails to list them.
    refused(
        nvidia.path(),
        &[("GPU_STANDIN_FAIL", fail)],
        &format!("no GPU found: nvidia-smi -L printed: {fail}; fix the driver"),
    );
    // One GPU fell off the bus.
    refused(
        nvidia.path(),
        &[("GPU_COUNT", "8"), ("GPU_STANDIN_MISSING", "5")],
        &format!(
            "GPU 5's pre-flight query failed: nvidia-smi -i 5 {NVIDIA_QUERY} printed: No devices were found"
        ),
    );
    refused(
        nvidia.path(),
        &[("GPU_STANDIN_ECC", "3")],
        "GPU 0 has 3 uncorrected ECC error(s): the runner would refuse every job on it; \
         reset it (nvidia-smi -r -i 0",
    );
    refused(
        nvidia.path(),
        &[("GPU_STANDIN_RETIRED_PENDING", "1")],
        "GPU 0 has pages waiting to be retired: the runner would refuse every job on it",
    );
    // A power limit set below the board's default: every kernel would be capped below its
    // real speed.
    refused(
        nvidia.path(),
        &[("GPU_STANDIN_POWER_LIMIT", "450.00")],
        "GPU 0's power limit is set to 450.00 W, below its default of 700.00 W: the runner \
         would refuse every job on it; restore it (nvidia-smi -i 0 -pl 700.00)",
    );

    // A driver before 535 refuses the query naming clocks_event_reasons: read again with
    // its older name, every GPU's reading logged.
    let root = tempfile::tempdir().unwrap();
    let s = setup(
        root.path(),
        nvidia.path(),
        &[
            ("QUEUE", "h100"),
            ("CPU_STANDIN_TOPOLOGY", "2x16x2"),
            ("NODE_MEMORY_GB", "1032"),
            ("GPU_STANDIN_DRIVER", "525.147.05"),
        ],
    );
    assert_eq!(s.code, 0, "{}", s.output);
    assert!(
        s.output
            .contains("names the clock-event mask clocks_throttle_reasons.active"),
        "{}",
        s.output
    );
    for gpu in 0..8 {
        let reading = format!(
            "GPU {gpu}: {gpu}, GPU-5a3c3b8e-1e4b-2f1d-8c3a-0b9f1c2d3e{gpu:02x}, NVIDIA H100 80GB \
             HBM3, 34, 69.88, 345, 2619, 1980, 0x0000000000000001, 0, No"
        );
        assert!(s.output.contains(&reading), "{reading}: {}", s.output);
    }

    let amd = stubs(0, 8);
    let driver = "amdgpu driver not loaded";
    refused(
        amd.path(),
        &[("GPU_STANDIN_FAIL", driver)],
        &format!(
            "GPU 0's pre-flight query failed: amd-smi metric --json -g 0 printed: {driver} \
             (exit 1); fix the driver before adding this node"
        ),
    );
    refused(
        amd.path(),
        &[("GPU_STANDIN_ECC", "2")],
        "GPU 0 has 2 uncorrected ECC error(s): the runner would refuse every job on it",
    );
    // Newer amd-smi releases wrap the GPUs' list: read the same.
    refused(
        amd.path(),
        &[("GPU_STANDIN_ECC", "2"), ("GPU_STANDIN_GPU_DATA", "1")],
        "GPU 0 has 2 uncorrected ECC error(s): the runner would refuse every job on it",
    );
    // The runner reads AMD GPUs with amd-smi (ROCm 6 and later): without it, nothing is set up.
    if !["/usr/bin/amd-smi", "/bin/amd-smi"]
        .iter()
        .any(|p| Path::new(p).exists())
    {
        std::fs::remove_file(amd.path().join("amd-smi")).unwrap();
        refused(amd.path(), &[], "amd-smi is not installed");
    }
}

/// The agents pause themselves with `buildkite-agent pause`, which came in v3.96.0.
#[test]
fn an_agent_too_old_to_pause_itself_is_refused() {
    let tools = stubs(2, 0);
    let vars = |version: &'static str| {
        [
            ("QUEUE", "h100"),
            ("CPU_STANDIN_TOPOLOGY", "1x16x1"),
            ("NODE_MEMORY_GB", "72"),
            ("BUILDKITE_AGENT_STANDIN_VERSION", version),
        ]
    };
    let root = tempfile::tempdir().unwrap();
    let s = setup(root.path(), tools.path(), &vars("3.95.1"));
    assert_refused(
        &s,
        "buildkite-agent 3.95.1 is too old: the agents pause themselves with 'buildkite-agent \
         pause', which came in 3.96.0; upgrade it (apt-get update && apt-get install \
         --only-upgrade buildkite-agent)",
    );
    assert!(!root.path().join("etc").exists(), "nothing was written");
    let s = setup(root.path(), tools.path(), &vars("3.96.0"));
    assert_eq!(s.code, 0, "{}", s.output);
    assert!(s.output.contains("buildkite-agent 3.96.0"), "{}", s.output);

    // Not installed: a warning while nothing starts, an error when the agents are to start.
    if ["/usr/bin/buildkite-agent", "/bin/buildkite-agent"]
        .iter()
        .any(|p| Path::new(p).exists())
    {
        return;
    }
    std::fs::remove_file(tools.path().join("buildkite-agent")).unwrap();
    let root = tempfile::tempdir().unwrap();
    let s = setup(root.path(), tools.path(), &vars("3.97.0"));
    assert_eq!(s.code, 0, "{}", s.output);
    assert!(
        s.output
            .contains("warning: buildkite-agent is not installed: the agents need version 3.96.0"),
        "{}",
        s.output
    );
    let root = tempfile::tempdir().unwrap();
    let mut starting = vars("3.97.0").to_vec();
    starting.push(("START", "1"));
    let s = setup(root.path(), tools.path(), &starting);
    assert_refused(
        &s,
        "buildkite-agent is not installed: install it (INSTALL=1 does)",
    );
    assert!(!root.path().join("etc").exists(), "nothing was written");
}

/// Warnings, never refusals: profiling restricted to administrators (profile mode's Nsight
/// Compute then fails), persistence mode off, a process already on a GPU.
#[test]
fn setup_says_whether_profiling_is_allowed_and_persistence_mode_is_on() {
    let tools = stubs(2, 0);
    let vars = [
        ("QUEUE", "h100"),
        ("CPU_STANDIN_TOPOLOGY", "1x16x1"),
        ("NODE_MEMORY_GB", "72"),
    ];
    for (admin_only, says) in [
        (
            Some("1"),
            &[
                "warning: profiling is restricted to administrators (RmProfilingAdminOnly: 1)",
                "ERR_NVGPUCTRPERM",
                "options nvidia NVreg_RestrictProfilingToAdminUsers=0",
                "update-initramfs -u, then reboot",
            ][..],
        ),
        (Some("0"), &["profiling is allowed"][..]),
        (None, &["could not tell whether profiling is allowed"][..]),
    ] {
        let root = tempfile::tempdir().unwrap();
        if let Some(value) = admin_only {
            let dir = root.path().join("proc/driver/nvidia");
            std::fs::create_dir_all(&dir).unwrap();
            let params = format!(
                "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nRmProfilingAdminOnly: {value}\n\
                 EnableStreamMemOPs: 0\n"
            );
            std::fs::write(dir.join("params"), params).unwrap();
        }
        let s = setup(root.path(), tools.path(), &vars);
        assert_eq!(s.code, 0, "{}", s.output);
        for said in says {
            assert!(s.output.contains(said), "{said}: {}", s.output);
        }
        assert!(
            !s.output.contains("persistence mode is off"),
            "{}",
            s.output
        );
    }

    let root = tempfile::tempdir().unwrap();
    let mut more = vars.to_vec();
    more.extend([
        ("GPU_STANDIN_PERSISTENCE", "0"),
        ("GPU_STANDIN_FOREIGN_PID", "4242"),
    ]);
    let s = setup(root.path(), tools.path(), &more);
    assert_eq!(s.code, 0, "{}", s.output);
    for said in [
        "warning: persistence mode is off on GPU(s) 0 1",
        "'nvidia-smi -pm 1'",
        "nvidia-persistenced",
        "warning: compute processes on the GPUs now (pid, GPU, MiB): 4242, \
         GPU-5a3c3b8e-1e4b-2f1d-8c3a-0b9f1c2d3e00, 1024; the runner refuses a GPU that has one",
    ] {
        assert!(s.output.contains(said), "{said}: {}", s.output);
    }
}

/// The options docker-buildkite-plugin v5.13.0 declares (`configuration.properties` of its
/// `plugin.yml`, which sets `additionalProperties: false`).
const DOCKER_PLUGIN_OPTIONS: &[&str] = &[
    "add-host",
    "additional-groups",
    "always-pull",
    "chown",
    "chown-image",
    "command",
    "cpus",
    "debug",
    "device-read-bps",
    "device-read-iops",
    "device-write-bps",
    "device-write-iops",
    "entrypoint",
    "environment",
    "env-file",
    "env-propagation-list",
    "expand-image-vars",
    "image",
    "ipc",
    "leave-container",
    "load",
    "log-driver",
    "log-opt",
    "memory",
    "memory-swap",
    "memory-swappiness",
    "mount-buildkite-agent",
    "mount-ssh-agent",
    "mount-checkout",
    "network",
    "pid",
    "gpus",
    "runtime",
    "run-labels",
    "shell",
    "shm-size",
    "skip-checkout",
    "tty",
    "user",
    "userns",
    "volumes",
    "expand-volume-vars",
    "devices",
    "tmpfs",
    "workdir",
    "platform",
    "propagate-environment",
    "propagate-aws-auth-tokens",
    "propagate-gcp-auth-tokens",
    "propagate-uid-gid",
    "privileged",
    "publish",
    "init",
    "sysctls",
    "storage-opt",
    "add-caps",
    "drop-caps",
    "security-opts",
    "ulimits",
];

fn pipeline() -> Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(infra("pipeline.yml")).unwrap())
        .expect("pipeline.yml parses")
}

/// The image a build runs when the deployment names none is one image: what the service puts
/// in each build's env, what the template's parameter defaults to, and what the pipeline
/// falls back to.
#[tokio::test]
async fn the_service_the_template_and_the_pipeline_default_to_one_runner_image() {
    let p = pipeline();
    let plugin = p["steps"][0]["plugins"][0].as_mapping().unwrap();
    let image = plugin.values().next().unwrap()["image"].as_str().unwrap();
    let fallback = image
        .strip_prefix("${KERNELBOT_IMAGE:-")
        .and_then(|r| r.strip_suffix('}'))
        .expect("the pipeline falls back to a default image");
    let template: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/template.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        template["Parameters"]["RunnerImage"]["Default"].as_str(),
        Some(fallback)
    );
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    app.submit(&submission("image")).await;
    let build = app.buildkite.build(1).expect("a build");
    assert_eq!(build.env["KERNELBOT_IMAGE"], fallback);
}

/// Only the service's builds take a GPU: the evaluation step is added only when the build's
/// env holds a variable every build the service makes has and Buildkite itself never sets
/// (a push or a build started by hand lacks it); and a GPU node never checks out the
/// repository.
#[tokio::test]
async fn only_the_service_s_builds_run_the_evaluation_and_none_checks_out() {
    let p = pipeline();
    let step = &p["steps"][0];
    let gate = step["if"].as_str().expect("the step is gated");
    let variable = gate
        .strip_prefix("build.env(\"")
        .and_then(|r| r.strip_suffix("\") != null"))
        .unwrap_or_else(|| panic!("a gate on one variable being set: {gate}"));
    assert!(
        !variable.starts_with("BUILDKITE_"),
        "{variable} is Buildkite's own"
    );
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    app.submit(&submission("gated")).await;
    let build = app.buildkite.build(1).expect("a build");
    assert_eq!(build.env.get(variable).map(String::as_str), Some("gated"));
    assert_eq!(step["checkout"]["skip"].as_bool(), Some(true));
}

#[test]
fn the_pipeline_runs_the_runner_on_the_submitted_queue() {
    let p = pipeline();
    let steps = p["steps"].as_sequence().unwrap();
    assert_eq!(steps.len(), 1);
    let step = &steps[0];
    assert_eq!(step["command"].as_str(), Some("kernelbot-runner"));
    assert!(
        step["agents"]["queue"]
            .as_str()
            .unwrap()
            .contains("${KERNELBOT_QUEUE")
    );
    // The evaluation's whole budget fits the step, with room for pull, cleanup and upload.
    let step_secs = step["timeout_in_minutes"].as_u64().unwrap() * 60;
    assert!(
        step_secs >= kernelbot_dispatch::protocol::EVALUATION_BUDGET.as_secs() + 180,
        "a {step_secs} s step cannot hold the runner's budget"
    );
    let mut retried: Vec<(i64, i64)> = step["retry"]["automatic"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["exit_status"].as_i64().unwrap(),
                r["limit"].as_i64().unwrap(),
            )
        })
        .collect();
    retried.sort_unstable();
    // Retried when the agent is lost, on the runner's infrastructure failure (a GPU that
    // failed its pre-flight) twice, and once after a run that stayed throttled (perhaps the
    // submission's own heat); never on a submission's own failure.
    let infra = i64::from(kernelbot_dispatch::protocol::exit::INFRA);
    let throttled = i64::from(kernelbot_dispatch::protocol::exit::THROTTLED);
    assert_eq!(retried, [(-1, 2), (infra, 2), (throttled, 1), (255, 1)]);

    let plugins = step["plugins"].as_sequence().unwrap();
    let docker = plugins[0].as_mapping().unwrap();
    let (name, cfg) = docker.iter().next().unwrap();
    assert!(name.as_str().unwrap().starts_with("docker#v5."));
    assert!(cfg["image"].as_str().unwrap().contains("${KERNELBOT_IMAGE"));
    // GPU, CPUs and memory come from each agent's environment hook; a value here would
    // override them, and `runtime: nvidia` would break AMD nodes.
    for key in ["runtime", "gpus", "cpus", "memory"] {
        assert!(cfg.get(key).is_none(), "pipeline must not set {key}");
    }
    // Isolation: nothing of the checkout in the container, only an output directory (which
    // is what the agent uploads and where the runner writes), no network, no privileges.
    for (key, value) in [
        ("mount-checkout", Value::Bool(false)),
        ("mount-buildkite-agent", Value::Bool(false)),
        ("propagate-environment", Value::Bool(false)),
        ("network", Value::from("none")),
        ("init", Value::Bool(true)),
        ("tty", Value::Bool(false)),
    ] {
        assert_eq!(cfg[key], value, "{key}");
    }
    // An agent that validates plugins refuses any option the plugin's schema does not list.
    for key in cfg.as_mapping().unwrap().keys() {
        let key = key.as_str().unwrap();
        assert!(
            DOCKER_PLUGIN_OPTIONS.contains(&key),
            "{key} is not an option of the plugin"
        );
    }
    // Any value of it, `false` included, makes the plugin run the container as the agent's
    // user, and the runner could then hand programs no uid of their own.
    assert!(cfg.get("propagate-uid-gid").is_none());
    for key in ["privileged", "mount-ssh-agent", "propagate-aws-auth-tokens"] {
        assert!(
            cfg.get(key).is_none_or(|v| v == &Value::Bool(false)),
            "{key}"
        );
    }
    let strings = |key: &str| -> Vec<String> {
        cfg[key]
            .as_sequence()
            .map(|s| {
                s.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(strings("volumes"), ["./kernelbot-out:/out"]);
    let artifact = step["artifact_paths"][0].as_str().unwrap();
    let (host_dir, container_dir) = strings("volumes")[0]
        .split_once(':')
        .map(|(h, c)| (h.trim_start_matches("./").to_owned(), c.to_owned()))
        .unwrap();
    assert_eq!(
        artifact,
        format!("{host_dir}/result.json"),
        "the agent uploads what the runner wrote"
    );
    assert_eq!(
        step["artifact_paths"][1].as_str(),
        Some(format!("{host_dir}/profile.*.zip").as_str()),
        "and the profile runs' zips beside it"
    );
    assert_eq!(
        cfg["workdir"].as_str(),
        Some(container_dir.as_str()),
        "the runner writes result.json to its working directory"
    );
    assert!(strings("security-opts").contains(&"no-new-privileges:true".to_owned()));
    assert_eq!(strings("drop-caps"), ["ALL"]);
    assert_eq!(
        strings("add-caps"),
        ["CHOWN", "DAC_OVERRIDE", "KILL", "SETGID", "SETUID"],
        "only what switching users needs"
    );
    let passed: Vec<&str> = cfg["environment"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for var in [
        "KERNELBOT_PAYLOAD",
        "KERNELBOT_RUN_ID",
        "KERNELBOT_CPUSET",
        "KERNELBOT_MEMORY",
        "CUDA_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "KERNELBOT_PREFLIGHT_MAX_TEMP_C",
        "KERNELBOT_PREFLIGHT_MIN_MAX_SM_CLOCK_MHZ",
        "KERNELBOT_COOLDOWN_SECS",
        // A run throttled on a retry is the submission's outcome, not tried again.
        "BUILDKITE_RETRY_COUNT",
    ] {
        assert!(
            passed.contains(&var),
            "{var} is not passed into the container"
        );
    }
    assert!(
        !passed.contains(&"NVIDIA_VISIBLE_DEVICES"),
        "--gpus decides the container's GPUs"
    );
}

#[test]
fn the_image_installs_the_runner_the_pipeline_calls() {
    let dockerfile = std::fs::read_to_string(infra("Dockerfile")).unwrap();
    let first_from = dockerfile.find("\nFROM ").unwrap();
    assert!(
        dockerfile[..first_from].contains("ARG BASE_IMAGE="),
        "the base image is a build argument"
    );
    assert!(dockerfile.matches("\nFROM ").count() >= 2, "multi-stage");
    assert!(dockerfile.contains("FROM ${BASE_IMAGE}"));
    let command = pipeline()["steps"][0]["command"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        dockerfile.contains(&format!("/usr/local/bin/{command}")),
        "the image must provide `{command}`"
    );
}
