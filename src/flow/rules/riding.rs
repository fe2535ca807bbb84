//! Whether a `build.finished` event can finish its job with no API call: the result that
//! rode its meta-data, and the tries its `job.finished` events told of, stand in for the
//! build and artifact the API would give only when they are the whole story. Anything less
//! and the artifact is read, as before: where both hold the result, the job ends the same
//! either way (where the last try's upload failed, only the event still has its result).

use crate::buildkite::{Build, BuildJob, JobAgent};
use crate::jobs::{Job, MAX_SEEN_TRIES, SeenTry};
use crate::protocol::exit;
use crate::protocol::riding::{RESULT_META_DATA_KEY, RideError, unpack_result};
use crate::result::FullResult;

use super::signal::EVAL_STEP_KEY;
use super::tries::{MAX_NAME_CHARS, clean};

/// Exit statuses the pipeline's step retries automatically (`retry: automatic:` in
/// `infra/buildkite/pipeline.yml`): after one, another try may follow.
pub(crate) const RETRIED_STATUSES: [i64; 4] = [-1, 255, exit::INFRA as i64, exit::THROTTLED as i64];

/// The job's end read from the event alone.
#[derive(Debug)]
pub(crate) struct Ridden {
    pub(crate) result: FullResult,
    /// The event's build with the tries as its jobs, as the API would list them.
    pub(crate) build: Build,
    /// The try whose result it is.
    pub(crate) job_id: String,
}

/// Why the artifact is read instead.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Fallback {
    #[error("the event's build has not ended")]
    NotEnded,
    #[error("no result in the build's meta-data")]
    Absent,
    #[error("a profile run: its zips are listed with the artifacts")]
    Profile,
    #[error("the result in the meta-data is unreadable: {0}")]
    Unreadable(#[source] RideError),
    #[error("the result names no try")]
    Unnamed,
    #[error("the tries seen do not account for the result's")]
    TriesUnseen,
    #[error("its try ended with a status the pipeline retries")]
    MayBeRetried,
}

impl Fallback {
    /// A fixed name, for a metric's dimension.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::NotEnded => "not_ended",
            Self::Absent => "absent",
            Self::Profile => "profile",
            Self::Unreadable(_) => "unreadable",
            Self::Unnamed => "unnamed",
            Self::TriesUnseen => "tries_unseen",
            Self::MayBeRetried => "may_be_retried",
        }
    }
}

/// The end of `build` (a `build.finished` event's) from its meta-data and the tries `seen`,
/// inflating at most `max` bytes of result.
pub(crate) fn ride(build: &Build, seen: &[SeenTry], max: u64) -> Result<Ridden, Fallback> {
    if !build.is_finished() {
        return Err(Fallback::NotEnded);
    }
    let value = build
        .meta_data
        .as_ref()
        .and_then(|m| m.get(RESULT_META_DATA_KEY))
        .and_then(|v| v.as_str())
        .ok_or(Fallback::Absent)?;
    let result = unpack_result(value, max).map_err(Fallback::Unreadable)?;
    let profiled = |(name, run): (&String, &crate::result::EvalResult)| {
        run.profile.is_some() && name.starts_with("profile.")
    };
    if result.runs.iter().any(profiled) {
        return Err(Fallback::Profile);
    }
    let by = result.written_by.as_ref().ok_or(Fallback::Unnamed)?;
    let mut tries: Vec<&SeenTry> = seen.iter().collect();
    // Oldest first, as the API lists them; an unstarted try (lost before it ran) first.
    tries.sort_by(|a, b| a.started_at.cmp(&b.started_at));
    // Every try up to the result's, and none after it (the latest started is the result's).
    let whole = tries.len() == by.retry_count as usize + 1
        && tries.last().is_some_and(|t| t.job_id == by.job_id);
    if !whole {
        return Err(Fallback::TriesUnseen);
    }
    let last = tries.last().map(|t| t.exit_status);
    if last.is_some_and(|s| s.is_none_or(|s| RETRIED_STATUSES.contains(&s))) {
        return Err(Fallback::MayBeRetried);
    }
    let count = tries.len();
    let jobs = tries
        .into_iter()
        .enumerate()
        .map(|(i, t)| as_job(t, i + 1 < count))
        .collect();
    let job_id = by.job_id.clone();
    Ok(Ridden {
        result,
        build: Build {
            jobs,
            ..build.clone()
        },
        job_id,
    })
}

/// A `job.finished` event's try as its job notes it, each text cut as tries' texts are.
pub(crate) fn seen_try(job: &BuildJob) -> SeenTry {
    let time = |t: &Option<String>| t.as_deref().map(|t| clean(t, MAX_TIME_CHARS));
    SeenTry {
        job_id: clean(&job.id, MAX_NAME_CHARS),
        agent: job.agent.as_ref().map(|a| clean(&a.name, MAX_NAME_CHARS)),
        exit_status: job.exit_status,
        started_at: time(&job.started_at),
        finished_at: time(&job.finished_at),
    }
}

/// An RFC 3339 time is shorter than this.
const MAX_TIME_CHARS: usize = 64;

/// `job` with `seen` (a try of build `build_id`) noted; `None` when the job has ended, the
/// build is not its build, the try is noted already, or the job has noted as many as it keeps.
pub(crate) fn with_try(job: &Job, build_id: &str, seen: &SeenTry) -> Option<Job> {
    let its_build = job.build.as_ref().is_some_and(|b| b.id == build_id);
    let noted = job.tries_seen.iter().any(|t| t.job_id == seen.job_id);
    if job.state.is_terminal() || !its_build || noted || job.tries_seen.len() >= MAX_SEEN_TRIES {
        return None;
    }
    let mut next = job.clone();
    next.tries_seen.push(seen.clone());
    Some(next)
}

/// A seen try as the API lists a job of the evaluation step.
fn as_job(t: &SeenTry, retried: bool) -> BuildJob {
    BuildJob {
        id: t.job_id.clone(),
        kind: "script".into(),
        step_key: Some(EVAL_STEP_KEY.into()),
        started_at: t.started_at.clone(),
        finished_at: t.finished_at.clone(),
        exit_status: t.exit_status,
        retried,
        agent: t.agent.as_ref().map(|name| JobAgent {
            id: String::new(),
            name: name.clone(),
        }),
        ..BuildJob::default()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::riding::pack_result;

    fn result(job: &str, retry: u32) -> String {
        packed(job, retry, json!({"test": {"run": {"success": true}}}))
    }

    fn packed(job: &str, retry: u32, runs: serde_json::Value) -> String {
        let json = json!({"success": true, "error": "", "runs": runs,
            "written_by": {"job_id": job, "retry_count": retry}});
        pack_result(json.to_string().as_bytes()).unwrap()
    }

    fn build(state: &str, value: Option<String>) -> Build {
        let mut meta = json!({"run_id": "r1"});
        if let Some(v) = value {
            meta[RESULT_META_DATA_KEY] = json!(v);
        }
        serde_json::from_value(json!({"id": "b", "number": 4, "state": state,
            "created_at": "2026-11-28T10:00:00Z", "meta_data": meta}))
        .unwrap()
    }

    fn seen(id: &str, minute: u32, exit: Option<i64>) -> SeenTry {
        SeenTry {
            job_id: id.into(),
            agent: Some(format!("gpu-{id}")),
            exit_status: exit,
            started_at: Some(format!("2026-11-28T10:{minute:02}:00Z")),
            finished_at: Some(format!("2026-11-28T10:{minute:02}:30Z")),
        }
    }

    #[test]
    fn the_event_finishes_the_job_only_when_it_tells_the_whole_story() {
        let one = vec![seen("j1", 1, Some(0))];
        let retried = vec![seen("j2", 5, Some(0)), seen("j1", 1, Some(75))];
        let profiled = packed("j1", 0, json!({"profile.0": {"profile": {"trace": null}}}));
        // (name, the event's build, the tries seen, the tries of the end or why not)
        type Case = (
            &'static str,
            Build,
            Vec<SeenTry>,
            Result<usize, &'static str>,
        );
        let cases: Vec<Case> = vec![
            (
                "one try",
                build("passed", Some(result("j1", 0))),
                one.clone(),
                Ok(1),
            ),
            (
                "a failed run is an end too",
                build("failed", Some(result("j1", 0))),
                vec![seen("j1", 1, Some(1))],
                Ok(1),
            ),
            (
                "after a retry",
                build("passed", Some(result("j2", 1))),
                retried.clone(),
                Ok(2),
            ),
            (
                "still running",
                build("running", Some(result("j1", 0))),
                one.clone(),
                Err("not_ended"),
            ),
            (
                "no value",
                build("passed", None),
                one.clone(),
                Err("absent"),
            ),
            (
                "a profile run",
                build("passed", Some(profiled)),
                one.clone(),
                Err("profile"),
            ),
            (
                "not packed",
                build("passed", Some("{}".into())),
                one.clone(),
                Err("unreadable"),
            ),
            (
                "unnamed",
                build("passed", Some(pack_result(b"{\"success\":true}").unwrap())),
                one.clone(),
                Err("unnamed"),
            ),
            (
                "its try not seen yet",
                build("passed", Some(result("j1", 0))),
                vec![],
                Err("tries_unseen"),
            ),
            (
                "an earlier try not seen",
                build("passed", Some(result("j2", 1))),
                vec![seen("j2", 5, Some(0))],
                Err("tries_unseen"),
            ),
            (
                "a later try seen",
                build("passed", Some(result("j1", 0))),
                retried.clone(),
                Err("tries_unseen"),
            ),
            (
                "an earlier try's result",
                build("passed", Some(result("j1", 1))),
                retried,
                Err("tries_unseen"),
            ),
            (
                "ended on the node's fault",
                build("failed", Some(result("j1", 0))),
                vec![seen("j1", 1, Some(75))],
                Err("may_be_retried"),
            ),
            (
                "the agent lost",
                build("failed", Some(result("j1", 0))),
                vec![seen("j1", 1, Some(-1))],
                Err("may_be_retried"),
            ),
            (
                "no exit status",
                build("failed", Some(result("j1", 0))),
                vec![seen("j1", 1, None)],
                Err("may_be_retried"),
            ),
        ];
        for (name, build, seen, want) in cases {
            let got = ride(&build, &seen, 1 << 20);
            match (got, want) {
                (Ok(r), Ok(n)) => {
                    assert_eq!(r.build.jobs.len(), n, "{name}");
                    let last = r.build.jobs.last().unwrap();
                    assert_eq!((last.id.as_str(), last.retried), (r.job_id.as_str(), false));
                    assert!(r.build.jobs[..n - 1].iter().all(|j| j.retried), "{name}");
                    assert_eq!(r.build.run_id(), Some("r1"), "{name}");
                }
                (Err(e), Err(w)) => assert_eq!(e.name(), w, "{name}: {e}"),
                (got, want) => panic!("{name}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn a_try_is_noted_once_on_its_own_build_s_open_job() {
        use super::super::fixtures;
        use crate::jobs::JobState;
        let mut job = fixtures::job(JobState::Running);
        job.build = Some(fixtures::build());
        let mut ended = job.clone();
        ended.state = JobState::Finished;
        let mut full = job.clone();
        full.tries_seen = (0..MAX_SEEN_TRIES)
            .map(|i| seen(&i.to_string(), 1, None))
            .collect();
        let noted = with_try(&job, "b", &seen("j1", 1, Some(0))).expect("noted");
        let cases = [
            ("a first try", &job, "b", "j2", true),
            ("a second try", &noted, "b", "j2", true),
            ("the same try again", &noted, "b", "j1", false),
            ("another build's", &job, "other", "j2", false),
            ("an ended job", &ended, "b", "j2", false),
            ("a full list", &full, "b", "j2", false),
        ];
        for (name, job, build, id, want) in cases {
            let got = with_try(job, build, &seen(id, 2, Some(0)));
            assert_eq!(got.is_some(), want, "{name}");
            if let Some(next) = got {
                assert_eq!(next.tries_seen.len(), job.tries_seen.len() + 1, "{name}");
                assert_eq!(next.tries_seen.last().map(|t| t.job_id.as_str()), Some(id));
            }
        }
    }

    #[test]
    fn an_event_s_job_is_noted_with_its_texts_cut() {
        let job: BuildJob = serde_json::from_value(json!({"id": "j1", "step_key": "evaluate",
            "exit_status": 0, "started_at": "2026-11-28T10:01:00.250Z",
            "finished_at": "2026-11-28T10:03:10.250Z",
            "agent": {"id": "a1", "name": format!("gpu\n{}", "x".repeat(300))}}))
        .unwrap();
        let t = seen_try(&job);
        assert_eq!((t.job_id.as_str(), t.exit_status), ("j1", Some(0)));
        assert_eq!(t.finished_at.as_deref(), Some("2026-11-28T10:03:10.250Z"));
        let agent = t.agent.unwrap();
        assert_eq!(agent.chars().count(), MAX_NAME_CHARS);
        assert!(agent.starts_with("gpu "), "{agent}");
    }

    /// The statuses the pipeline retries are exactly those its step lists.
    #[cfg(feature = "devstack")]
    #[test]
    fn the_retried_statuses_are_the_pipeline_s() {
        let mut listed: Vec<i64> = crate::devstack::pipeline::retry_limits()
            .into_iter()
            .map(|(status, _)| i64::from(status))
            .collect();
        listed.sort_unstable();
        let mut ours = RETRIED_STATUSES.to_vec();
        ours.sort_unstable();
        assert_eq!(listed, ours);
    }
}
