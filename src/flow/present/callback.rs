//! A job's state change as its callback carries it: rendered from what the job held when it
//! entered that state, so every attempt sends the same `webhook-id` and the same body.

use serde::Serialize;

use crate::callback::Event;
use crate::jobs::{BuildRef, Job, JobState};
use crate::result::{FullResult, Verdict};
use crate::time::rfc3339;

#[derive(Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    kind: String,
    timestamp: String,
    data: Data<'a>,
}

#[derive(Serialize)]
struct Data<'a> {
    run_id: &'a str,
    state: JobState,
    gpu: &'a str,
    queue: &'a str,
    build: Option<&'a BuildRef>,
    verdict: Option<Verdict>,
    build_state: Option<&'a str>,
    timings: Times,
    /// Why no result: the submission's failure, or the build's error.
    error: Option<&'a str>,
    /// kernelbot's FullResult as stored.
    result: Option<&'a FullResult>,
    /// The earlier run whose outcome this job took, without a build of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    cached_from: Option<&'a str>,
}

/// Timings with unknown ones as `null` (the stored form leaves them out).
#[derive(Serialize)]
struct Times {
    queued_secs: Option<f64>,
    ran_secs: Option<f64>,
}

/// The callback for the state `job` is in (`webhook-id`: one per run and state), or `None`
/// for a state that sends none.
pub(crate) fn render(job: &Job) -> Option<Event> {
    let entered_at = job.callback.as_ref()?.entered_at;
    if job.state == JobState::Submitted {
        return None;
    }
    let outcome = job.outcome.as_ref();
    let timings = outcome.and_then(|o| o.timings).unwrap_or_default();
    let body = Body {
        kind: format!("job.{}", job.state),
        timestamp: rfc3339(entered_at),
        data: Data {
            run_id: job.run_id.as_str(),
            state: job.state,
            gpu: &job.gpu,
            queue: &job.queue,
            build: job.build.as_ref(),
            verdict: outcome.map(|o| o.verdict),
            build_state: outcome.map(|o| o.build_state.as_str()),
            timings: Times {
                queued_secs: timings.queued_secs,
                ran_secs: timings.ran_secs,
            },
            error: job
                .failure
                .as_deref()
                .or(outcome.and_then(|o| o.error.as_deref())),
            result: outcome.and_then(|o| o.result.as_ref()),
            cached_from: job.cached_from.as_ref().map(|r| r.as_str()),
        },
    };
    Some(Event {
        id: format!("msg_{}_{}", job.state, job.run_id),
        body: serde_json::to_vec(&body).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::{CallbackOutbox, Transition};
    use crate::result::{Outcome, Timings};
    use serde_json::Value;

    fn job() -> Job {
        let mut job = Job::new(
            "run-1".parse().unwrap(),
            "H100_BK".into(),
            "h100".into(),
            None,
            None,
            1_000,
        );
        job.callback = Some(CallbackOutbox::new(1_000));
        job
    }

    #[test]
    fn a_submitted_job_or_one_without_callbacks_sends_nothing() {
        assert_eq!(render(&job()), None);
        let mut running = job()
            .apply(&Transition::to(JobState::Running, 2_000))
            .unwrap();
        assert!(render(&running).is_some());
        running.callback = None;
        assert_eq!(render(&running), None);
    }

    #[test]
    fn the_body_holds_the_contracts_fields_and_nulls_for_what_is_unknown() {
        let running = job()
            .apply(&Transition::to(JobState::Running, 1_614_265_330_000))
            .unwrap();
        let event = render(&running).unwrap();
        assert_eq!(event.id, "msg_running_run-1");
        let body: Value = serde_json::from_slice(&event.body).unwrap();
        assert_eq!(body["type"], "job.running");
        assert_eq!(body["timestamp"], "2021-02-25T15:02:10.000Z");
        let data = &body["data"];
        for key in ["build", "verdict", "build_state", "result", "error"] {
            assert!(data[key].is_null(), "{key}: {data}");
        }
        assert_eq!(
            data["timings"],
            serde_json::json!({"queued_secs": null, "ran_secs": null})
        );
        assert_eq!(
            (data["run_id"].as_str(), data["gpu"].as_str()),
            (Some("run-1"), Some("H100_BK"))
        );
    }

    #[test]
    fn the_finished_body_carries_verdict_timings_and_result_and_never_changes() {
        let mut outcome = Outcome::judge(
            "passed",
            Some(FullResult {
                success: true,
                ..Default::default()
            }),
            None,
        );
        outcome.timings = Some(Timings {
            queued_secs: Some(3.5),
            ran_secs: Some(41.25),
        });
        let finished = job()
            .apply(&Transition::to(JobState::Finished, 5_000).with_outcome(outcome))
            .unwrap();
        let event = render(&finished).unwrap();
        let body: Value = serde_json::from_slice(&event.body).unwrap();
        assert_eq!(
            body["data"]["verdict"],
            finished.outcome.as_ref().unwrap().verdict.as_str()
        );
        assert_eq!(body["data"]["build_state"], "passed");
        assert_eq!(body["data"]["timings"]["ran_secs"], 41.25);
        assert_eq!(body["data"]["result"]["success"], true);
        // A later write that is not a state change (an outbox record) renders the same bytes.
        let mut later = finished.clone();
        later.updated_at = 9_000;
        later.version += 3;
        assert_eq!(render(&later), Some(event));
    }
}
