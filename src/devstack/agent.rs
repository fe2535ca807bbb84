//! A local stand-in for a GPU agent: runs the pipeline step's command (from
//! `infra/buildkite/pipeline.yml`) in the output directory of a fresh checkout with only the
//! build's env, the way the agent would inside the runner image, and hands back the
//! `result.json` it wrote.
//! No Docker and no GPU: Python submissions run on this machine.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::buildkite::{StepOutcome, StepRunner};

const PIPELINE: &str = include_str!("../../infra/buildkite/pipeline.yml");

/// The name the runner image installs the runner under (the step's command).
pub const RUNNER_COMMAND: &str = "kernelbot-runner";

/// The evaluation step's command in the pipeline.
pub(crate) fn step_command() -> Option<String> {
    PIPELINE.lines().find_map(|l| {
        let value = l.trim().strip_prefix("command:")?.trim().trim_matches('"');
        (!value.is_empty()).then(|| value.to_owned())
    })
}

/// The step's artifact paths, relative to the checkout (`*` matches within a name).
fn step_artifacts() -> Vec<String> {
    PIPELINE
        .lines()
        .skip_while(|l| l.trim() != "artifact_paths:")
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .map_while(|l| l.strip_prefix("- "))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .filter(|v| !v.is_empty())
        .collect()
}

/// Where the step leaves `result.json`, relative to the checkout: its first artifact path.
/// The container's working directory is that path's directory, mounted from the checkout.
pub(crate) fn step_artifact() -> Option<String> {
    step_artifacts().into_iter().next()
}

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
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // Like the container: the build's env and a PATH, nothing of this process's own. Each
    // step stands for another GPU's agent: a sandbox uid of its own, since a runner ends
    // every process of its uid and steps here may run side by side.
    let status = Command::new("sh")
        .arg("-c")
        .arg(&command)
        .current_dir(out_dir)
        .env_clear()
        .envs(env)
        .env("PATH", path)
        .env("KERNELBOT_SANDBOX_UID", step_uid().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()?;
    let result = std::fs::read(&result).ok();
    Ok(StepOutcome {
        passed: status.success(),
        result,
        artifacts: other_artifacts(checkout.path()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pipeline_step_runs_the_runner() {
        assert_eq!(step_command().as_deref(), Some(RUNNER_COMMAND));
        assert_eq!(
            step_artifact().as_deref(),
            Some("kernelbot-out/result.json")
        );
    }
}
