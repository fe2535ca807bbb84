//! A local stand-in for a GPU agent: runs the pipeline step's command (from
//! `infra/buildkite/pipeline.yml`) in the output directory of a fresh checkout with only the
//! build's env, the way the agent would inside the runner image, and hands back the
//! `result.json` it wrote.
//! No Docker and no GPU: Python submissions run on this machine. After the step, the
//! `post-command` hook `setup-node.sh` writes for every agent runs as written, with a
//! `buildkite-agent` stand-in (`tests/fixtures/buildkite-agent`) that records what it asks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::buildkite::{StepOutcome, StepRunner};
use super::pipeline::{step_artifact, step_artifacts, step_command};

const SETUP_NODE: &str = include_str!("../../infra/buildkite/setup-node.sh");
const AGENT_STANDIN: &str = include_str!("../../tests/fixtures/buildkite-agent/buildkite-agent");

/// The agent's token: its hooks' `buildkite-agent` calls use it; the step never sees it.
const ACCESS_TOKEN_VAR: &str = "BUILDKITE_AGENT_ACCESS_TOKEN";

/// The `post-command` hook `setup-node.sh` writes for each agent, as it writes it.
pub fn post_command_hook() -> Option<String> {
    let body: Vec<&str> = SETUP_NODE
        .lines()
        .skip_while(|l| !l.contains("hooks/post-command\" 755 <<'HOOK'"))
        .skip(1)
        .take_while(|l| *l != "HOOK")
        .collect();
    (!body.is_empty()).then(|| body.join("\n") + "\n")
}

/// The name the runner image installs the runner under (the step's command).
pub const RUNNER_COMMAND: &str = "kernelbot-runner";

/// The files under `checkout` that the step's other artifact paths name, by path.
fn other_artifacts(checkout: &Path) -> Vec<(String, Vec<u8>)> {
    let mut found = Vec::new();
    for pattern in step_artifacts().into_iter().skip(1) {
        let (dir, name) = pattern.rsplit_once('/').unwrap_or(("", &pattern));
        let (prefix, suffix) = name.split_once('*').unwrap_or((name, ""));
        let Ok(entries) = std::fs::read_dir(checkout.join(dir)) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with(prefix) && n.ends_with(suffix) && n.len() >= name.len() - 1)
            .collect();
        names.sort();
        for n in names {
            if let Ok(bytes) = std::fs::read(checkout.join(dir).join(&n)) {
                found.push((format!("{dir}/{n}"), bytes));
            }
        }
    }
    found
}

/// An agent that runs the step with `runner` standing in for the image's `kernelbot-runner`.
pub fn local_agent(runner: PathBuf) -> StepRunner {
    Arc::new(
        move |env: &BTreeMap<String, String>| match run_step(&runner, env) {
            Ok(outcome) => outcome,
            Err(e) => {
                tracing::warn!(error = %e, "local agent could not run the step");
                StepOutcome::default()
            }
        },
    )
}

/// A sandbox uid no other live step shares: this process's pid picks a block of 64.
fn step_uid() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    1_000_000_000 + std::process::id() * 64 + NEXT.fetch_add(1, Ordering::Relaxed) % 64
}

fn run_step(runner: &Path, env: &BTreeMap<String, String>) -> std::io::Result<StepOutcome> {
    let command =
        step_command().ok_or_else(|| std::io::Error::other("pipeline.yml has no step command"))?;
    let artifact = step_artifact()
        .ok_or_else(|| std::io::Error::other("pipeline.yml has no artifact path"))?;
    let checkout = tempfile::tempdir()?;
    let result = checkout.path().join(&artifact);
    let out_dir = result.parent().unwrap_or(checkout.path());
    std::fs::create_dir_all(out_dir)?;
    let bin = tempfile::tempdir()?;
    std::os::unix::fs::symlink(runner, bin.path().join(RUNNER_COMMAND))?;
    let agent_bin = bin.path().join("buildkite-agent");
    std::fs::write(&agent_bin, AGENT_STANDIN)?;
    std::fs::set_permissions(
        &agent_bin,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let inherited = env
        .get("PATH")
        .cloned()
        .unwrap_or_else(|| std::env::var("PATH").unwrap_or_default());
    let path = format!("{}:{inherited}", bin.path().display());
    // Like the container: the build's env and a PATH, nothing of this process's own (nor the
    // agent's token). Each step stands for another GPU's agent: a sandbox uid of its own,
    // since a runner ends every process of its uid and steps here may run side by side.
    let status = Command::new("sh")
        .arg("-c")
        .arg(&command)
        .current_dir(out_dir)
        .env_clear()
        .envs(env.iter().filter(|(k, _)| *k != ACCESS_TOKEN_VAR))
        .env("PATH", &path)
        .env("KERNELBOT_SANDBOX_UID", step_uid().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()?;
    // A command killed by a signal has no code: Buildkite records -1.
    let exit = status.code().unwrap_or(-1);
    let agent_calls = run_post_command(checkout.path(), env, &path, exit)?;
    let result = std::fs::read(&result).ok();
    Ok(StepOutcome {
        passed: status.success(),
        result,
        artifacts: other_artifacts(checkout.path()),
        exit_status: Some(exit),
        agent_calls,
    })
}

/// Runs the agent's `post-command` hook in the checkout after a command that exited `exit`,
/// and returns what it asked of `buildkite-agent`.
fn run_post_command(
    checkout: &Path,
    env: &BTreeMap<String, String>,
    path: &str,
    exit: i32,
) -> std::io::Result<Vec<Vec<String>>> {
    let hook = post_command_hook()
        .ok_or_else(|| std::io::Error::other("setup-node.sh writes no post-command hook"))?;
    let log = checkout.join(".buildkite-agent-calls");
    let status = Command::new("bash")
        .arg("-c")
        .arg(&hook)
        .current_dir(checkout)
        .env_clear()
        .envs(env)
        .env("PATH", path)
        .env("BUILDKITE_COMMAND_EXIT_STATUS", exit.to_string())
        .env("BUILDKITE_AGENT_STANDIN_LOG", &log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()?;
    if !status.success() {
        tracing::warn!(?status, "the post-command hook failed");
    }
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    Ok(calls
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| serde_json::from_value(v["command"].clone()).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_node_writes_a_post_command_hook_that_pauses_on_exit_75() {
        let hook = post_command_hook().expect("a post-command hook");
        assert!(hook.starts_with("#!/usr/bin/env bash"), "{hook}");
        assert!(hook.contains("buildkite-agent pause"), "{hook}");
        assert!(hook.contains("BUILDKITE_COMMAND_EXIT_STATUS"), "{hook}");
    }
}
