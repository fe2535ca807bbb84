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

/// A directory of stub tools standing in for the GPU vendor's CLI.
fn stubs(nvidia_gpus: usize, amd_gpus: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, body: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    if nvidia_gpus > 0 {
        let lines: String = (0..nvidia_gpus)
            .map(|i| format!("GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd)\\n"))
            .collect();
        write("nvidia-smi", format!("printf '{lines}'\n"));
    }
    if amd_gpus > 0 {
        let cards: Vec<String> = (0..amd_gpus)
            .map(|i| format!("\"card{i}\": {{\"Card Series\": \"AMD Instinct MI300X\"}}"))
            .collect();
        write("rocm-smi", format!("echo '{{{}}}'\n", cards.join(", ")));
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
            ("NODE_CPUS", "16"),
            ("NODE_MEMORY_GB", "72"),
        ],
    );
    assert_eq!(s.code, 0, "{}", s.output);
    assert!(
        s.output
            .contains("2 nvidia GPU(s) on queue h100: 8 CPUs and 32 GiB each"),
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
        slice.contains("AllowedCPUs=8-15")
            && slice.contains("MemoryMax=32G")
            && slice.contains("CPUQuota=800%"),
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
        ("KERNELBOT_CPUSET", "8-15"),
        ("KERNELBOT_MEMORY", "32g"),
        ("BUILDKITE_PLUGIN_DOCKER_CPUS", "8"),
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
            ("NODE_CPUS", "128"),
            ("NODE_MEMORY_GB", "1032"),
            ("RENDER_NODES", RENDER_NODES),
        ],
    );
    assert_eq!(s.code, 0, "{}", s.output);
    assert!(
        s.output
            .contains("8 amd GPU(s) on queue mi300: 16 CPUs and 128 GiB each"),
        "{}",
        s.output
    );
    for idx in 0..8 {
        let env = hook_env(root.path(), idx);
        let cpuset = format!("{}-{}", idx * 16, idx * 16 + 15);
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
            ("NODE_CPUS", "128"),
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
                ("NODE_CPUS", "128"),
                ("NODE_MEMORY_GB", "1032"),
                ("RENDER_NODES", RENDER_NODES),
                ("GPUS_PER_AGENT", per.as_str()),
                ("REAL_DOCKER", real.to_str().unwrap()),
            ];
            let s = setup(root.path(), tools.path(), &vars);
            assert_eq!(s.code, 0, "{}", s.output);
            let agents = 8 / per_agent;
            let (cpus, gib) = (16 * per_agent, 128 * per_agent);
            let said =
                format!("{agents} agent(s) of {per_agent} GPUs, {cpus} CPUs and {gib} GiB each");
            assert!(s.output.contains(&said), "{}", s.output);
            for agent in 0..agents {
                let (first, last) = (agent * per_agent, agent * per_agent + per_agent - 1);
                let gpus: Vec<String> = (first..=last).map(|i| i.to_string()).collect();
                let visible: Vec<String> = (0..per_agent).map(|i| i.to_string()).collect();
                let env = hook_env(root.path(), first);
                let cpuset = format!("{}-{}", agent * cpus, agent * cpus + cpus - 1);
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
    for (nvidia, amd, idx, cpuset) in [(2, 0, 1, "8-15"), (0, 2, 1, "8-15")] {
        let root = tempfile::tempdir().unwrap();
        let tools = stubs(nvidia, amd);
        let vars = [
            ("QUEUE", "h100"),
            ("NODE_CPUS", "16"),
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
        let mut want = vec![
            "run".to_owned(),
            format!("--cpuset-cpus={cpuset}"),
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

/// After the runner's infrastructure exit code the agent notes why in the build's meta-data
/// and pauses itself, with its own token, for `PAUSE_MINUTES`; after any other exit it does
/// nothing; a call that fails never changes the job's exit status.
#[test]
fn after_an_infrastructure_failure_the_agent_pauses_itself() {
    let root = tempfile::tempdir().unwrap();
    let tools = stubs(1, 0);
    let vars = [
        ("QUEUE", "h100"),
        ("NODE_CPUS", "8"),
        ("NODE_MEMORY_GB", "32"),
        ("PAUSE_MINUTES", "90"),
    ];
    let s = setup(root.path(), tools.path(), &vars);
    assert_eq!(s.code, 0, "{}", s.output);
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
                ("NODE_CPUS", "8"),
                ("NODE_MEMORY_GB", "32"),
                ("PAUSE_MINUTES", minutes),
            ],
        );
        assert_refused(&refused, "PAUSE_MINUTES must be");
    }
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
            ("NODE_CPUS", "8"),
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
        ("NODE_CPUS", "8"),
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
        ("NODE_CPUS", "16"),
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
            ("NODE_CPUS", "16"),
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
            ("NODE_CPUS", "4"),
            ("NODE_MEMORY_GB", "100"),
        ],
    );
    assert_refused(&too_few, "4 CPUs cannot be shared by 8 GPUs");
    let no_gpu = setup(root.path(), stubs(0, 0).path(), &[("QUEUE", "h100")]);
    assert!(no_gpu.output.contains("no GPU found"), "{}", no_gpu.output);
    assert!(!root.path().join("etc").exists(), "nothing was written");
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
        step_secs >= kernelbot_dispatch::runner::EVALUATION_BUDGET.as_secs() + 180,
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
    // Retried when the agent is lost, and on the runner's infrastructure failure (a GPU that
    // failed its pre-flight or stayed throttled), never on a submission's own failure.
    let infra = i64::from(kernelbot_dispatch::runner::exit::INFRA);
    assert_eq!(retried, [(-1, 2), (infra, 2), (255, 1)]);

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
