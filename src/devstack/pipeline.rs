//! What the evaluation step of `infra/buildkite/pipeline.yml` says, as the stand-ins read
//! it: its command and artifact paths (the agent runs and uploads them) and its automatic
//! retries (Buildkite applies them). Read from the file the deployment uses, so the stand-ins
//! cannot drift from it.

const PIPELINE: &str = include_str!("../../infra/buildkite/pipeline.yml");

/// The step's automatic retries, `(exit status, limit)`, as its `retry: automatic:` lists them.
pub(crate) fn retry_limits() -> Vec<(i32, u32)> {
    let Ok(pipeline) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(PIPELINE) else {
        return Vec::new();
    };
    let rules = pipeline["steps"][0]["retry"]["automatic"].as_sequence();
    rules
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let status = i32::try_from(r["exit_status"].as_i64()?).ok()?;
            Some((status, u32::try_from(r["limit"].as_u64()?).ok()?))
        })
        .collect()
}

/// The evaluation step's command in the pipeline.
pub(crate) fn step_command() -> Option<String> {
    PIPELINE.lines().find_map(|l| {
        let value = l.trim().strip_prefix("command:")?.trim().trim_matches('"');
        (!value.is_empty()).then(|| value.to_owned())
    })
}

/// The step's artifact paths, relative to the checkout (`*` matches within a name).
pub(crate) fn step_artifacts() -> Vec<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pipeline_step_runs_the_runner() {
        assert_eq!(
            step_command().as_deref(),
            Some(crate::devstack::agent::RUNNER_COMMAND)
        );
        assert_eq!(
            step_artifact().as_deref(),
            Some("kernelbot-out/result.json")
        );
    }

    #[test]
    fn the_step_is_retried_on_the_runner_s_infrastructure_exit_code() {
        let limits = retry_limits();
        assert!(limits.contains(&(75, 2)), "{limits:?}");
        assert!(limits.contains(&(76, 1)), "{limits:?}");
        assert!(limits.contains(&(-1, 2)), "{limits:?}");
    }
}
