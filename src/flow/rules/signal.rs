//! What a webhook event, or a build as the REST API shows it, says about our job.

use crate::buildkite::{Build, BuildJob};
use crate::jobs::JobState;

/// The pipeline's evaluation step (`key:` in `infra/buildkite/pipeline.yml`).
pub(crate) const EVAL_STEP_KEY: &str = "evaluate";

/// What a verified webhook event says about the job of its build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// The build exists (scheduled, or running its pipeline upload).
    Scheduled,
    /// The evaluation step started on a GPU agent.
    Running,
    /// The build may have ended: read its state from the API to be sure.
    Finished,
    /// A try of the evaluation step ended (`job.finished`): noted for the build's end.
    TryEnded,
    Ignore(&'static str),
}

/// What `event` (the signed body's, never the header's) means for our job.
pub fn signal_of(event: &str, job: Option<&BuildJob>) -> Signal {
    match event {
        // The pipeline is uploaded by a first step, so a running build is not yet running
        // the evaluation: only `job.started` for that step is.
        "build.scheduled" | "build.running" | "build.failing" => Signal::Scheduled,
        "job.started" if job.is_some_and(is_eval_step) => Signal::Running,
        "job.started" | "job.finished" if job.is_none_or(|j| !is_eval_step(j)) => {
            Signal::Ignore("a step other than the evaluation")
        }
        "job.finished" => Signal::TryEnded,
        "build.finished" | "build.skipped" => Signal::Finished,
        "ping" => Signal::Ignore("ping"),
        _ => Signal::Ignore("event not handled"),
    }
}

pub(crate) fn is_eval_step(job: &BuildJob) -> bool {
    job.step_key.as_deref() == Some(EVAL_STEP_KEY)
}

/// The job state a build, as the REST API shows it (with its jobs), corresponds to.
pub fn progress_of(build: &Build) -> JobState {
    if build.is_finished() {
        JobState::Finished
    } else if build
        .jobs
        .iter()
        .any(|j| is_eval_step(j) && j.started_at.is_some())
    {
        JobState::Running
    } else {
        JobState::Scheduled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(key: &str, started: bool) -> BuildJob {
        serde_json::from_value(serde_json::json!({"id": "j", "step_key": key,
            "started_at": if started { Some("2026-11-22T10:00:00Z") } else { None }}))
        .unwrap()
    }

    #[test]
    fn events_mean_what_the_pipeline_makes_them_mean() {
        let eval = step(EVAL_STEP_KEY, true);
        let upload = step("upload", true);
        let table = [
            ("build.scheduled", None, Signal::Scheduled),
            ("build.running", None, Signal::Scheduled),
            ("build.failing", None, Signal::Scheduled),
            ("job.started", Some(&eval), Signal::Running),
            (
                "job.started",
                Some(&upload),
                Signal::Ignore("a step other than the evaluation"),
            ),
            ("job.finished", Some(&eval), Signal::TryEnded),
            (
                "job.finished",
                Some(&upload),
                Signal::Ignore("a step other than the evaluation"),
            ),
            (
                "job.finished",
                None,
                Signal::Ignore("a step other than the evaluation"),
            ),
            ("build.finished", None, Signal::Finished),
            ("build.skipped", None, Signal::Finished),
            ("ping", None, Signal::Ignore("ping")),
            ("agent.lost", None, Signal::Ignore("event not handled")),
        ];
        for (event, job, want) in table {
            assert_eq!(signal_of(event, job), want, "{event}");
        }
    }

    #[test]
    fn a_build_is_running_only_once_its_evaluation_started() {
        let build = |state: &str, jobs: Vec<BuildJob>| Build {
            id: "b".into(),
            number: 1,
            web_url: String::new(),
            state: state.into(),
            blocked: false,
            meta_data: None,
            created_at: None,
            jobs,
        };
        assert_eq!(
            progress_of(&build("running", vec![step("upload", true)])),
            JobState::Scheduled
        );
        assert_eq!(
            progress_of(&build(
                "running",
                vec![step("upload", true), step(EVAL_STEP_KEY, true)]
            )),
            JobState::Running
        );
        assert_eq!(progress_of(&build("failing", vec![])), JobState::Scheduled);
        for state in ["passed", "failed", "canceled", "skipped", "not_run"] {
            assert_eq!(
                progress_of(&build(state, vec![])),
                JobState::Finished,
                "{state}"
            );
        }
        assert_eq!(
            progress_of(&build("canceling", vec![])),
            JobState::Scheduled
        );
    }
}
