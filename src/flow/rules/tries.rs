//! Which tries of a build's evaluation step ran, on which agents, and why a retried one
//! ended: read from the build as the REST API shows it (every job, retried ones included)
//! and the meta-data the agents' hooks wrote, at no extra call.

use crate::buildkite::{Build, BuildJob};
use crate::protocol::exit;
use crate::result::health::is_lasting;
use crate::result::{FullResult, Try};
use crate::time::millis_of;

use super::signal::is_eval_step;

/// The meta-data key under which an agent's `post-command` hook (`setup-node.sh`) notes why
/// its job was an infrastructure failure or stayed throttled, followed by the job's id.
pub(crate) const INFRA_NOTE_PREFIX: &str = "kernelbot-infra:";

/// A note longer than this is cut: it comes from a GPU node, and goes into reports.
const MAX_REASON_CHARS: usize = 200;

/// The evaluation step's tries, oldest first. `result_job`: the job whose `result.json` was
/// read, and `result` what it said.
pub(crate) fn tries(
    build: &Build,
    result_job: Option<&str>,
    result: Option<&FullResult>,
) -> Vec<Try> {
    let final_infra = result.and_then(|r| r.infra.as_ref());
    let final_throttled = result.is_some_and(|r| r.throttled.is_some());
    build
        .jobs
        .iter()
        .filter(|j| is_eval_step(j))
        .map(|job| {
            let read = result_job == Some(job.id.as_str());
            let infra =
                job.exit_status == Some(i64::from(exit::INFRA)) || (read && final_infra.is_some());
            let throttled = !infra
                && (job.exit_status == Some(i64::from(exit::THROTTLED))
                    || (read && final_throttled));
            let reason = if read && !infra && !throttled {
                String::new()
            } else {
                reason(build, job, infra, throttled)
            };
            let paused = match final_infra {
                Some(f) if read => f.pauses_agent(),
                _ => infra && is_lasting(reason.split(':').next().unwrap_or("").trim()),
            };
            Try {
                job_id: job.id.clone(),
                agent: clean(
                    job.agent.as_ref().map_or("", |a| a.name.as_str()),
                    MAX_NAME_CHARS,
                ),
                exit_status: job.exit_status,
                infra,
                throttled,
                paused,
                result: read,
                reason,
                finished_at: job.finished_at.as_deref().and_then(millis_of),
            }
        })
        .collect()
}

/// Agent names longer than this are cut: they key the agents' records.
pub(crate) const MAX_NAME_CHARS: usize = 128;

/// Text from a node (an agent's name, its hook's note): control characters blanked, cut to
/// `max` characters, so it reads on one line wherever it is shown.
pub(crate) fn clean(text: &str, max: usize) -> String {
    text.trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect()
}

/// Why a try ended without the result: the agent's own note, else what its exit status says.
fn reason(build: &Build, job: &BuildJob, infra: bool, throttled: bool) -> String {
    let key = format!("{INFRA_NOTE_PREFIX}{}", job.id);
    let note = build
        .meta_data
        .as_ref()
        .and_then(|m| m.get(&key))
        .and_then(|v| v.as_str())
        .map(str::trim)
        .filter(|n| !n.is_empty());
    if let Some(note) = note {
        return clean(note, MAX_REASON_CHARS);
    }
    match job.exit_status {
        _ if infra => "the GPU failed its checks".into(),
        _ if throttled => "the GPU slowed down while the run was timed".into(),
        Some(-1) => "the agent was lost".into(),
        Some(255) => "the agent failed before the runner reported".into(),
        Some(code) => format!("exit status {code}"),
        None => "it did not finish".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::{InfraFailure, Throttled};
    use serde_json::json;

    fn build(jobs: serde_json::Value, meta: serde_json::Value) -> Build {
        serde_json::from_value(json!({"id": "b", "number": 1, "jobs": jobs, "meta_data": meta}))
            .unwrap()
    }

    fn job(id: &str, agent: &str, exit: Option<i64>, retried: bool) -> serde_json::Value {
        json!({"id": id, "step_key": "evaluate", "exit_status": exit, "retried": retried,
               "finished_at": "2026-11-21T10:03:10.250Z",
               "agent": {"id": format!("a-{agent}"), "name": agent}})
    }

    /// A result whose node failed at `stage` for `reason`.
    fn node_failed(stage: &str, reason: &str) -> FullResult {
        FullResult {
            infra: Some(InfraFailure {
                stage: stage.into(),
                reason: reason.into(),
                ..InfraFailure::default()
            }),
            ..FullResult::default()
        }
    }

    /// The build's jobs and meta-data, whether its result said infra, and the tries wanted
    /// as (agent, infra, reason).
    type Case = (
        serde_json::Value,
        serde_json::Value,
        bool,
        Vec<(&'static str, bool, &'static str)>,
    );

    #[test]
    fn each_try_says_where_it_ran_and_why_it_was_retried() {
        let note = "ecc_errors: GPU 0 has 3 uncorrected ECC errors";
        let cases: Vec<Case> = vec![
            // One try that gave the result.
            (
                json!([job("j1", "gpu0", Some(0), false)]),
                json!({}),
                false,
                vec![("gpu0", false, "")],
            ),
            // Retried after the node failed, with the hook's note; the retry passed.
            (
                json!([
                    job("j1", "gpu0", Some(75), true),
                    job("j2", "gpu1", Some(0), false)
                ]),
                json!({"kernelbot-infra:j1": note, "run_id": "r"}),
                false,
                vec![("gpu0", true, note), ("gpu1", false, "")],
            ),
            // No note (the hook could not write it): the exit status says it.
            (
                json!([
                    job("j1", "gpu0", Some(75), true),
                    job("j2", "gpu1", Some(-1), true),
                    job("j3", "gpu2", Some(75), false)
                ]),
                json!({}),
                true,
                vec![
                    ("gpu0", true, "the GPU failed its checks"),
                    ("gpu1", false, "the agent was lost"),
                    ("gpu2", true, "the GPU failed its checks"),
                ],
            ),
            // The upload step is no try.
            (
                json!([{"id": "u", "step_key": "upload", "exit_status": 0},
                       job("j1", "gpu0", Some(1), false)]),
                json!({}),
                false,
                vec![("gpu0", false, "")],
            ),
        ];
        for (jobs, meta, final_infra, want) in cases {
            let b = build(jobs.clone(), meta);
            let last = b.jobs.last().map(|j| j.id.clone());
            let infra = node_failed("preflight", "ecc_errors");
            let got: Vec<(String, bool, String)> =
                tries(&b, last.as_deref(), final_infra.then_some(&infra))
                    .into_iter()
                    .map(|t| (t.agent, t.infra, t.reason))
                    .collect();
            let want: Vec<(String, bool, String)> = want
                .into_iter()
                .map(|(a, i, r)| (a.to_owned(), i, r.to_owned()))
                .collect();
            assert_eq!(got, want, "{jobs}");
        }
    }

    #[test]
    fn the_node_s_failure_is_pinned_on_the_try_read_and_only_lasting_faults_pause() {
        // The last try was lost without a result: the one read is the second's.
        let b = build(
            json!([
                job("j1", "gpu0", Some(75), true),
                job("j2", "gpu1", Some(75), true),
                job("j3", "gpu2", Some(-1), false)
            ]),
            json!({"kernelbot-infra:j1": "ecc_errors: GPU 0 has 3 uncorrected ECC errors",
                   "kernelbot-infra:j2": "throttled: HwThermalSlowdown twice"}),
        );
        let throttled = node_failed("measurement", "throttled");
        let got: Vec<(String, bool, bool, bool)> = tries(&b, Some("j2"), Some(&throttled))
            .into_iter()
            .map(|t| (t.agent, t.infra, t.paused, t.result))
            .collect();
        let want = [
            ("gpu0", true, true, false),
            ("gpu1", true, false, true),
            ("gpu2", false, false, false),
        ];
        let want: Vec<(String, bool, bool, bool)> = want
            .into_iter()
            .map(|(a, i, p, r)| (a.to_owned(), i, p, r))
            .collect();
        assert_eq!(got, want);
    }

    /// A run that stayed throttled after the submission ran (exit 76 on the first try, then
    /// the result read said so again) is never an infrastructure failure and pauses nothing.
    #[test]
    fn a_throttled_try_is_its_own_kind_and_pauses_nothing() {
        let b = build(
            json!([
                job("j1", "gpu0", Some(76), true),
                job("j2", "gpu1", Some(0), false)
            ]),
            json!({"kernelbot-infra:j1": "throttled: the leaderboard run was slowed down (SwThermalSlowdown)"}),
        );
        let read = FullResult {
            throttled: Some(Throttled::default()),
            ..FullResult::default()
        };
        let got: Vec<(String, bool, bool, bool, String)> = tries(&b, Some("j2"), Some(&read))
            .into_iter()
            .map(|t| (t.agent, t.infra, t.throttled, t.paused, t.reason))
            .collect();
        let want = [
            (
                "gpu0",
                false,
                true,
                false,
                "throttled: the leaderboard run was slowed down (SwThermalSlowdown)",
            ),
            (
                "gpu1",
                false,
                true,
                false,
                "the GPU slowed down while the run was timed",
            ),
        ];
        let want: Vec<(String, bool, bool, bool, String)> = want
            .into_iter()
            .map(|(a, i, t, p, r)| (a.to_owned(), i, t, p, r.to_owned()))
            .collect();
        assert_eq!(got, want);
        // Without the note, the exit status says it; a passing retry is no throttled try.
        let b = build(
            json!([
                job("j1", "gpu0", Some(76), true),
                job("j2", "gpu1", Some(0), false)
            ]),
            json!({}),
        );
        let got = tries(&b, Some("j2"), Some(&FullResult::default()));
        assert_eq!(
            (got[0].throttled, got[0].reason.as_str(), got[1].throttled),
            (true, "the GPU slowed down while the run was timed", false)
        );
        // When each try ended, as Buildkite says: what the fleet judges pauses by.
        assert_eq!(got[0].finished_at, Some(1_795_255_390_250));
    }

    #[test]
    fn a_node_s_note_is_cut_to_a_line() {
        let long = "x".repeat(5000);
        let b = build(
            json!([
                job("j1", "gpu0", Some(75), true),
                job("j2", "gpu1", Some(0), false)
            ]),
            json!({"kernelbot-infra:j1": format!("{long}\u{1b}[2J")}),
        );
        assert_eq!(
            tries(&b, Some("j2"), None)[0].reason.chars().count(),
            MAX_REASON_CHARS
        );
    }
}
