//! The Buildkite objects we read and write (REST API and webhook payloads share them).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::result::Timings;
use crate::time::Millis;

/// What we send to create a build.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct NewBuild {
    pub commit: String,
    pub branch: String,
    pub message: String,
    pub env: BTreeMap<String, String>,
    pub meta_data: BTreeMap<String, String>,
}

/// An agent as the agents API lists it (`read_agents`).
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct Agent {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub connection_state: String,
    /// Its tags, `"key=value"` (`"queue=h100"`).
    #[serde(default)]
    pub meta_data: Vec<String>,
    /// The job it is running; `null` when idle.
    #[serde(default)]
    pub job: Option<serde_json::Value>,
    /// Paused (`buildkite-agent pause`, the UI or the API), with its note where given.
    #[serde(default)]
    pub paused: bool,
    #[serde(default)]
    pub paused_note: Option<String>,
}

impl Agent {
    /// The queue its `queue=` tag names (Buildkite's `default` when it has none).
    pub(crate) fn queue(&self) -> &str {
        self.meta_data
            .iter()
            .find_map(|t| t.strip_prefix("queue="))
            .unwrap_or("default")
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.connection_state == "connected"
    }

    pub(crate) fn is_busy(&self) -> bool {
        self.job.as_ref().is_some_and(|j| !j.is_null())
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct Build {
    pub id: String,
    pub number: u64,
    #[serde(default)]
    pub web_url: String,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub blocked: bool,
    #[serde(default)]
    pub meta_data: Option<HashMap<String, serde_json::Value>>,
    #[serde(default)]
    pub created_at: Option<String>,
    /// Absent from webhook payloads; present from the REST API.
    #[serde(default)]
    pub jobs: Vec<BuildJob>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct BuildJob {
    pub id: String,
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub state: Option<String>,
    /// The step's `key` in the pipeline (`evaluate` for the evaluation step).
    #[serde(default)]
    pub step_key: Option<String>,
    #[serde(default)]
    pub started_at: Option<String>,
    #[serde(default)]
    pub finished_at: Option<String>,
    /// The command's exit status (`-1`: the agent was lost); absent until it ends.
    #[serde(default)]
    pub exit_status: Option<i64>,
    /// Buildkite's automatic retry replaced this job with another of the same build.
    #[serde(default)]
    pub retried: bool,
    /// The agent that ran it.
    #[serde(default)]
    pub agent: Option<JobAgent>,
}

/// The agent a job ran on, as a job shows it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct JobAgent {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub name: String,
}

/// Build states after which nothing more happens.
pub const TERMINAL_STATES: &[&str] = &[
    "passed", "failed", "canceled", "skipped", "not_run", "blocked",
];

impl Build {
    /// How long the evaluation waited for an agent (from the build's creation to its last
    /// evaluation job's start) and how long it ran, from Buildkite's timestamps.
    pub fn timings(&self) -> Timings {
        let at = |t: &Option<String>| t.as_deref().and_then(crate::time::millis_of);
        // Counted in the stamps' milliseconds (`secs_of` says why).
        let secs = |from: Option<Millis>, to: Option<Millis>| {
            let span = to? - from?;
            (span >= 0).then(|| crate::time::secs_of(span))
        };
        let eval = self
            .jobs
            .iter()
            .rev()
            .find(|j| j.step_key.as_deref() == Some("evaluate"));
        let (started, finished) =
            eval.map_or((None, None), |j| (at(&j.started_at), at(&j.finished_at)));
        Timings {
            queued_secs: secs(at(&self.created_at), started),
            ran_secs: secs(started, finished),
        }
    }

    /// The build without the result riding its meta-data (`kernelbot-result`), for those
    /// that keep many builds and never read it.
    pub(crate) fn without_result(mut self) -> Self {
        if let Some(meta) = self.meta_data.as_mut() {
            meta.remove(crate::protocol::riding::RESULT_META_DATA_KEY);
        }
        self
    }

    /// The run id we set in the build's meta-data when we created it; builds without it are
    /// not ours.
    pub fn run_id(&self) -> Option<&str> {
        self.meta_data.as_ref()?.get("run_id")?.as_str()
    }

    /// The final state as users read it: a finished build waiting on a block step is
    /// `blocked`, whatever `state` says.
    pub(crate) fn final_state(&self) -> &str {
        if self.blocked { "blocked" } else { &self.state }
    }

    pub(crate) fn is_finished(&self) -> bool {
        TERMINAL_STATES.contains(&self.final_state())
    }
}

#[derive(Clone, Debug, Deserialize)]
pub(crate) struct Artifact {
    pub id: String,
    pub job_id: String,
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub filename: String,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub file_size: Option<u64>,
}

pub(crate) const RESULT_FILE: &str = "result.json";

/// The `result.json` to read: a finished upload, from the latest job that has one.
/// Automatic retries (agent lost) give a build several jobs, each possibly with a result;
/// the REST API lists a build's jobs in the order they were created.
pub(crate) fn pick_result<'a>(build: &Build, artifacts: &'a [Artifact]) -> Option<&'a Artifact> {
    let is_result = |a: &&Artifact| {
        a.state == "finished"
            && (a.filename == RESULT_FILE
                || a.path == RESULT_FILE
                || a.path.ends_with("/result.json"))
    };
    let job_order = |a: &Artifact| build.jobs.iter().position(|j| j.id == a.job_id);
    artifacts
        .iter()
        .enumerate()
        .filter(|(_, a)| is_result(a))
        // Jobs the build does not list sort first; ties keep the API's order.
        .max_by_key(|(i, a)| (job_order(a).map_or(0, |p| p + 1), *i))
        .map(|(_, a)| a)
}

/// The finished artifacts beside `result` (the `result.json` read, so of the same job)
/// whose file name `wanted` accepts, by that name.
pub(crate) fn beside<'a>(
    result: &Artifact,
    artifacts: &'a [Artifact],
    wanted: impl Fn(&str) -> bool,
) -> Vec<(&'a str, &'a Artifact)> {
    artifacts
        .iter()
        .filter(|a| a.state == "finished" && a.job_id == result.job_id)
        .filter_map(|a| {
            let name = a.path.rsplit('/').next().unwrap_or(&a.path);
            wanted(name).then_some((name, a))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_come_from_the_last_evaluation_job() {
        let b: Build = serde_json::from_str(
            r#"{"id":"x","number":3,"created_at":"2026-11-21T10:00:00.000Z","jobs":[
              {"id":"a","step_key":"evaluate","started_at":"2026-11-21T10:00:05Z","finished_at":"2026-11-21T10:00:06Z"},
              {"id":"u","step_key":null,"started_at":"2026-11-21T10:00:01Z","finished_at":"2026-11-21T10:00:02Z"},
              {"id":"b","step_key":"evaluate","started_at":"2026-11-21T10:01:00.250Z","finished_at":"2026-11-21T10:03:10.250Z"}]}"#,
        )
        .unwrap();
        let t = b.timings();
        assert_eq!((t.queued_secs, t.ran_secs), (Some(60.25), Some(130.0)));
        let unstarted: Build = serde_json::from_str(
            r#"{"id":"x","number":3,"created_at":"2026-11-21T10:00:00Z","jobs":[{"id":"a","step_key":"evaluate"}]}"#,
        )
        .unwrap();
        assert_eq!(unstarted.timings(), Timings::default());
    }

    #[test]
    fn timings_read_as_the_milliseconds_the_stamps_give() {
        // 2.119 s as whole seconds plus nanoseconds is 2.1189999999999998: a span must read
        // as the decimal its stamps give (in the API, the callback and the report alike).
        let b: Build = serde_json::from_str(
            r#"{"id":"x","number":3,"created_at":"2026-11-21T10:00:00.000Z","jobs":[
              {"id":"a","step_key":"evaluate","started_at":"2026-11-21T10:00:02.119Z","finished_at":"2026-11-21T10:00:47.619Z"}]}"#,
        )
        .unwrap();
        let t = b.timings();
        assert_eq!((t.queued_secs, t.ran_secs), (Some(2.119), Some(45.5)));
        assert_eq!(
            serde_json::to_string(&t.queued_secs).unwrap(),
            "2.119",
            "as JSON"
        );
    }

    #[test]
    fn a_build_kept_without_its_result_keeps_the_rest_of_its_meta_data() {
        let b: Build = serde_json::from_str(
            r#"{"id":"x","number":3,"meta_data":{"run_id":"r1","kernelbot-result":"eJy...",
                "kernelbot-infra:j1":"ecc_errors"}}"#,
        )
        .unwrap();
        let kept = b.without_result();
        let mut keys: Vec<&str> = kept
            .meta_data
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, ["kernelbot-infra:j1", "run_id"]);
    }

    #[test]
    fn reads_run_id_and_blocked_state() {
        let b: Build = serde_json::from_str(
            r#"{"id":"x","number":3,"state":"passed","blocked":true,"meta_data":{"run_id":"r1"}}"#,
        )
        .unwrap();
        assert_eq!(
            (b.run_id(), b.final_state(), b.is_finished()),
            (Some("r1"), "blocked", true)
        );
        let theirs: Build =
            serde_json::from_str(r#"{"id":"x","number":3,"state":"running"}"#).unwrap();
        assert_eq!((theirs.run_id(), theirs.is_finished()), (None, false));
    }

    fn artifact(id: &str, job: &str, path: &str, state: &str) -> Artifact {
        Artifact {
            id: id.into(),
            job_id: job.into(),
            path: path.into(),
            filename: path.rsplit('/').next().unwrap_or_default().into(),
            state: state.into(),
            file_size: None,
        }
    }

    #[test]
    fn a_profile_zip_comes_from_the_job_whose_result_is_read() {
        let artifacts = vec![
            artifact("z1", "j1", "kernelbot-out/profile.0.zip", "finished"),
            artifact("r1", "j1", "kernelbot-out/result.json", "finished"),
            artifact("z2", "j2", "kernelbot-out/profile.0.zip", "finished"),
            artifact("z3", "j2", "kernelbot-out/profile.1.zip", "error"),
            artifact("z4", "j2", "kernelbot-out/profile.2.zip", "finished"),
            artifact("r2", "j2", "kernelbot-out/result.json", "finished"),
        ];
        let zips = |result: &Artifact| -> Vec<(String, String)> {
            beside(result, &artifacts, |n| n.starts_with("profile."))
                .into_iter()
                .map(|(n, a)| (n.to_owned(), a.id.clone()))
                .collect()
        };
        let of = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                .collect()
        };
        assert_eq!(
            zips(&artifacts[5]),
            of(&[("profile.0.zip", "z2"), ("profile.2.zip", "z4")])
        );
        assert_eq!(zips(&artifacts[1]), of(&[("profile.0.zip", "z1")]));
    }

    #[test]
    fn picks_the_finished_result_of_the_latest_job() {
        let build: Build = serde_json::from_str(
            r#"{"id":"b","number":1,"jobs":[{"id":"j1","type":"script"},{"id":"j2","type":"script"}]}"#,
        )
        .unwrap();
        let artifacts = vec![
            artifact("a0", "j2", "profile_data/x.json", "finished"),
            artifact("a1", "j2", "result.json", "error"),
            artifact("a2", "j2", "result.json", "finished"),
            artifact("a3", "j1", "result.json", "finished"),
        ];
        assert_eq!(
            pick_result(&build, &artifacts).map(|a| a.id.as_str()),
            Some("a2")
        );
        assert_eq!(
            pick_result(&build, &artifacts[..2]).map(|a| a.id.as_str()),
            None
        );
    }
}
