//! A job as its Discord status message shows it: one message per job, rendered from the
//! job's current state and fitted to Discord's limits.

use super::summary::{capitalised, conditions_line, short_report, system_lines, timing_line};
use crate::discord::{AllowedMentions, Embed, Field, Message};
use crate::jobs::{Job, JobState};
use crate::result::{Outcome, Verdict};
use crate::text::{plain, span};

const GREEN: u32 = 0x2e_cc_71;
const RED: u32 = 0xe7_4c_3c;

fn build_link(job: &Job) -> String {
    match (&job.build, &job.cached_from) {
        (Some(b), _) => format!("build [#{}](<{}>)", b.number, b.web_url),
        (None, Some(earlier)) => format!(
            "answered from run {}, an earlier run of the same code on this GPU: no new build",
            span(earlier.as_str())
        ),
        (None, None) => "build pending".to_owned(),
    }
}

/// The message for a job as it is now.
pub fn render(job: &Job) -> Message {
    // Text someone else wrote (the title, errors, what a program printed) is escaped where
    // it is shown: it reads as written, never as markdown of its own.
    let title = job
        .title
        .clone()
        .unwrap_or_else(|| format!("Run {}", job.run_id));
    let head = format!("**{}** on {}", plain(&title), span(&job.gpu));
    let (content, embeds) = match job.state {
        JobState::Finished => finished(job, &head),
        _ => (status_line(job, &head), vec![]),
    };
    // A run that did not pass carries kernelbot's full report (never a private one).
    let file = match (&job.outcome, job.state, job.private) {
        (Some(outcome), JobState::Finished, false) => super::report::attachment(outcome),
        _ => None,
    };
    Message {
        content,
        embeds,
        allowed_mentions: AllowedMentions::default(),
        file,
    }
    .fit()
}

/// Where a job not yet running stands, as its message last noted it: its position and, in
/// Discord's timestamp markup (which counts down by itself), when it is expected to start.
fn place(job: &Job) -> String {
    let Some(position) = job.queue_position else {
        return String::new();
    };
    let next = if position == 1 {
        "next to start".to_owned()
    } else {
        format!("{} in line", ordinal(position))
    };
    match job.expected_start {
        Some(ms) => format!(
            "\n> 🧭 {next}, expected to start <t:{}:R>",
            ms.div_euclid(1000)
        ),
        None => format!("\n> 🧭 {next}"),
    }
}

/// `2nd`, `3rd`, `11th`, `22nd`.
fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// The message of a job that has not finished (or failed before its build existed).
fn status_line(job: &Job, head: &str) -> String {
    match job.state {
        JobState::Submitted if job.waiting && job.background => format!(
            "{head}\n> ⏳ Background: runs on queue {} when a GPU is idle and nothing else waits",
            span(&job.queue)
        ),
        JobState::Submitted if job.waiting => format!(
            "{head}\n> ⏳ Waiting for its turn on queue {}: its GPUs go by share, to the user \
             with the fewest runs on them first{}",
            span(&job.queue),
            place(job)
        ),
        JobState::Submitted => {
            format!(
                "{head}\n> ⏳ Submitting to queue {}{}",
                span(&job.queue),
                place(job)
            )
        }
        JobState::Scheduled => {
            format!(
                "{head}\n> ⏳ Queued on {}, {}{}",
                span(&job.queue),
                build_link(job),
                place(job)
            )
        }
        JobState::Running => {
            format!(
                "{head}\n> 🏃 Running on {}, {}",
                span(&job.queue),
                build_link(job)
            )
        }
        JobState::Failed | JobState::Finished => format!(
            "{head} ❌ failure\n> Submission failed: {}",
            plain(job.failure.as_deref().unwrap_or("unknown reason"))
        ),
    }
}

fn finished(job: &Job, head: &str) -> (String, Vec<Embed>) {
    match &job.outcome {
        // A private run shows one verdict line and the build link: no timing, no report.
        Some(outcome) if job.private => (
            format!(
                "{head}\n> {}\n> {}",
                verdict_sentence(outcome.verdict, &job.queue),
                capitalised(&build_link(job))
            ),
            vec![],
        ),
        Some(outcome) => final_report(job, head, outcome),
        None => (
            format!("{head} ❌ failure\n> Finished without an outcome"),
            vec![],
        ),
    }
}

/// The one sentence Discord shows for each verdict. Fixed texts: nothing a third party wrote
/// reaches the channel through them.
pub fn verdict_sentence(verdict: Verdict, queue: &str) -> String {
    match verdict {
        Verdict::Passed => "✅ Passed: every run succeeded.".into(),
        Verdict::Failed => {
            "❌ Failed: a test, benchmark or compile step failed, or the build failed.".into()
        }
        Verdict::Canceled => "❌ Canceled: the build was canceled.".into(),
        Verdict::Skipped => "❌ Skipped: Buildkite skipped the build.".into(),
        Verdict::QueueTimeout => {
            let queue = span(queue);
            format!("❌ Timed out in the queue: no agent on queue {queue} started it in time.")
        }
        Verdict::Expired => "❌ Expired: the job ran past its maximum age and was stopped.".into(),
        Verdict::Error => "❌ Error: the build left no usable result.".into(),
        Verdict::Infra => {
            "⚠️ Infrastructure failure — not your code: the GPU it was given failed its checks, \
             so nothing was ranked; submit again."
                .into()
        }
        Verdict::Throttled => {
            "⚠️ Not ranked: the GPU slowed down while your run was timed, on every GPU it was \
             tried on. Your results stand; a kernel can heat its own GPU, so its time could not \
             be measured fairly."
                .into()
        }
    }
}

/// What became of the tries before the last, in one line: never the user's failure.
fn retried_line(outcome: &Outcome) -> Option<String> {
    let reasons = outcome.retried_reasons();
    let first = plain(reasons.first()?);
    let more = match reasons.len() {
        1 => String::new(),
        n => format!(", and {} more", n - 1),
    };
    Some(if outcome.verdict == Verdict::Infra {
        format!(
            "🔁 Tried on {} GPUs; each failed its checks ({first}{more}).",
            reasons.len() + 1
        )
    } else if same_agent(outcome) {
        // Buildkite gives a retry to any free agent of the queue, the same one included.
        format!("🔁 Tried again ({first}{more}).")
    } else {
        format!("🔁 Retried on another GPU ({first}{more}).")
    })
}

/// Every try ran on one (named) agent.
fn same_agent(outcome: &Outcome) -> bool {
    let mut agents = outcome.tries.iter().map(|t| t.agent.as_str());
    let first = agents.next().unwrap_or_default();
    outcome.tries.len() > 1 && !first.is_empty() && agents.all(|a| a == first)
}

fn final_report(job: &Job, head: &str, outcome: &Outcome) -> (String, Vec<Embed>) {
    let passed = outcome.verdict == Verdict::Passed;
    let mark = match outcome.verdict {
        Verdict::Passed => "✅ success",
        Verdict::Throttled => "⚠️ not ranked",
        _ => "❌ failure",
    };
    let mut content = format!(
        "{head} {mark}\n> {}\n> {} ({})",
        verdict_sentence(outcome.verdict, &job.queue),
        capitalised(&build_link(job)),
        plain(&outcome.build_state)
    );
    if let Some(line) = outcome.timings.as_ref().and_then(timing_line) {
        content.push_str(&format!("\n> ⏱ {line}"));
    }
    if let Some(line) = outcome.result.as_ref().and_then(conditions_line) {
        content.push_str(&format!("\n> 🌡 {line}"));
    }
    if let Some(line) = retried_line(outcome) {
        content.push_str(&format!("\n> {line}"));
    }
    let mut lines = Vec::new();
    if let Some(error) = &outcome.error {
        lines.push(format!("❌ {}", plain(error)));
    }
    let mut fields = Vec::new();
    if let Some(result) = &outcome.result {
        lines.extend(short_report(result));
        fields.extend(super::profile::fields(result));
        if let Some(system) = system_lines(result) {
            fields.push(Field {
                name: "Running on".into(),
                value: system,
                inline: false,
            });
        }
    }
    let embed = Embed {
        title: Some(format!("Report for {}", job.run_id)),
        url: job.build.as_ref().map(|b| b.web_url.clone()),
        description: Some(lines.join("\n")),
        color: Some(if passed { GREEN } else { RED }),
        fields,
    };
    (content, vec![embed])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::Try;

    #[test]
    fn a_job_not_yet_running_shows_its_place_and_a_self_updating_start() {
        let mut job = Job::new(
            "r1".parse().unwrap(),
            "H100_BK".into(),
            "h100".into(),
            None,
            None,
            0,
        );
        assert!(!render(&job).content.contains('🧭'), "no place noted yet");
        job.waiting = true;
        job.queue_position = Some(3);
        job.expected_start = Some(1_795_600_061_999);
        let text = render(&job).content;
        assert!(
            text.contains("Waiting for its turn on queue `h100`"),
            "{text}"
        );
        assert!(
            text.contains("3rd in line, expected to start <t:1795600061:R>"),
            "{text}"
        );
        job.waiting = false;
        job.queue_position = Some(1);
        job.expected_start = None;
        assert!(
            render(&job).content.ends_with("🧭 next to start"),
            "{}",
            render(&job).content
        );
        job.state = JobState::Running;
        assert!(!render(&job).content.contains('🧭'), "running: no place");
        let ordinals: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111]
            .into_iter()
            .map(ordinal)
            .collect();
        assert_eq!(
            ordinals,
            [
                "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st",
                "111th"
            ]
        );
    }

    #[test]
    fn a_retry_on_another_gpu_is_said_and_never_blamed_on_the_user() {
        let t = |infra: bool, reason: &str| Try {
            infra,
            reason: reason.into(),
            ..Try::default()
        };
        let with = |verdict: Verdict, tries: Vec<Try>| {
            let mut o = Outcome::decided("passed", verdict, "x");
            o.tries = tries;
            o
        };
        let table = [
            (with(Verdict::Passed, vec![t(false, "")]), None),
            (
                with(
                    Verdict::Passed,
                    vec![t(true, "ecc_errors: 3"), t(false, "")],
                ),
                Some("🔁 Retried on another GPU (ecc\\_errors: 3)."),
            ),
            (
                with(
                    Verdict::Failed,
                    vec![
                        t(true, "too_hot"),
                        t(false, "the agent was lost"),
                        t(false, ""),
                    ],
                ),
                Some("🔁 Retried on another GPU (too\\_hot, and 1 more)."),
            ),
            (
                with(
                    Verdict::Infra,
                    vec![t(true, "a"), t(true, "b"), t(true, "c")],
                ),
                Some("🔁 Tried on 3 GPUs; each failed its checks (a, and 1 more)."),
            ),
            (
                with(
                    Verdict::Throttled,
                    vec![
                        Try {
                            throttled: true,
                            agent: "gpu0".into(),
                            ..t(false, "throttled: slowed down (SwThermalSlowdown)")
                        },
                        Try {
                            throttled: true,
                            result: true,
                            agent: "gpu1".into(),
                            ..t(false, "")
                        },
                    ],
                ),
                Some("🔁 Retried on another GPU (throttled: slowed down (SwThermalSlowdown))."),
            ),
            (
                // Buildkite gave the retry to the same agent: not "another GPU".
                with(
                    Verdict::Throttled,
                    vec![
                        Try {
                            agent: "gpu0".into(),
                            ..t(false, "throttled: hot")
                        },
                        Try {
                            agent: "gpu0".into(),
                            result: true,
                            ..t(false, "")
                        },
                    ],
                ),
                Some("🔁 Tried again (throttled: hot)."),
            ),
        ];
        for (outcome, line) in table {
            assert_eq!(
                retried_line(&outcome).as_deref(),
                line,
                "{:?}",
                outcome.tries
            );
        }
    }
    use crate::jobs::{BuildRef, Transition};

    #[test]
    fn every_state_renders_with_mentions_disabled() {
        let mut job = Job::new(
            "r1".parse().unwrap(),
            "H100_BK".into(),
            "h100".into(),
            Some("@everyone".into()),
            None,
            0,
        );
        let json = serde_json::to_value(render(&job)).unwrap();
        assert_eq!(json["allowed_mentions"], serde_json::json!({"parse": []}));
        job = job
            .apply(&Transition::to(JobState::Running, 1).with_build(BuildRef {
                id: "i".into(),
                number: 9,
                web_url: "https://bk/9".into(),
            }))
            .unwrap();
        assert!(
            render(&job)
                .content
                .contains("Running on `h100`, build [#9](<https://bk/9>)")
        );
        let outcome = Outcome::judge("canceled", None, None);
        job = job
            .apply(&Transition::to(JobState::Finished, 2).with_outcome(outcome))
            .unwrap();
        let msg = render(&job);
        assert!(msg.content.contains("❌ failure"));
        assert_eq!(
            msg.embeds[0].description.as_deref(),
            Some("❌ Build canceled")
        );
    }
}
