//! The decisions, as pure functions of a job, an event and the time: which event moves a
//! job where, what a build's state means, what the Discord outbox does next, and when work
//! deferred to the sweep is due. Everything that talks to the world lives elsewhere.

use crate::buildkite::model::{Build, BuildJob};
use crate::jobs::model::{Creation, DeliveryStatus, Lease, Millis};
use crate::jobs::{Job, JobState};

/// The pipeline's evaluation step (`key:` in `infra/buildkite/pipeline.yml`).
pub const EVAL_STEP_KEY: &str = "evaluate";

/// A report Discord has not accepted for this long is given up.
pub const GIVE_UP_AFTER_MS: Millis = 24 * 3600 * 1000;

/// A lease outlasts its holder's deadline by this much, for an answer still on its way.
pub const LEASE_SLACK_MS: Millis = 30_000;

/// How long a create call may be in flight: nobody else creates or looks up the build of a
/// run before this has passed (it exceeds every function's timeout).
pub const CREATE_HOLD_MS: Millis = 90_000;

/// After a create whose answer was lost, wait this long before looking the build up, so a
/// build Buildkite did create is visible to the lookup.
pub const LOOK_UP_AFTER_MS: Millis = 60_000;

/// What a verified webhook event says about the job of its build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// The build exists (scheduled, or running its pipeline upload).
    Scheduled,
    /// The evaluation step started on a GPU agent.
    Running,
    /// The build may have ended: read its state from the API to be sure.
    Finished,
    Ignore(&'static str),
}

/// What `event` (the signed body's, never the header's) means for our job.
pub fn signal_of(event: &str, job: Option<&BuildJob>) -> Signal {
    match event {
        // The pipeline is uploaded by a first step, so a running build is not yet running
        // the evaluation: only `job.started` for that step is.
        "build.scheduled" | "build.running" | "build.failing" => Signal::Scheduled,
        "job.started" if job.is_some_and(is_eval_step) => Signal::Running,
        "job.started" => Signal::Ignore("a step other than the evaluation"),
        "build.finished" | "build.skipped" => Signal::Finished,
        "ping" => Signal::Ignore("ping"),
        _ => Signal::Ignore("event not handled"),
    }
}

fn is_eval_step(job: &BuildJob) -> bool {
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

/// Takes the job's Discord message for `owner` until `until`, if a render is owed and no one
/// else holds it.
pub fn claim(job: &Job, owner: &str, now: Millis, until: Millis) -> Option<Job> {
    let outbox = job.discord.as_ref()?;
    if !outbox.owes(job.state) || outbox.lease.as_ref().is_some_and(|l| l.until > now) {
        return None;
    }
    let mut next = job.clone();
    next.discord.as_mut()?.lease = Some(Lease {
        owner: owner.to_owned(),
        until,
    });
    Some(next)
}

/// What Discord said to one render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sent {
    /// Accepted; with the new message's id when it was posted.
    Accepted { posted: Option<String> },
    /// Try again later.
    Transient(String),
    /// The message is gone or frozen: post a new one.
    MessageGone,
    /// The webhook is gone: nothing more can be sent.
    TargetGone(String),
    /// This render will never be accepted.
    Refused(String),
}

/// Records what Discord said to `owner`'s render of the job in state `rendered`, and
/// releases the lease.
pub fn record(job: &Job, owner: &str, rendered: JobState, sent: &Sent, now: Millis) -> Option<Job> {
    let mut next = job.clone();
    let o = next.discord.as_mut()?;
    // Only the holder records: a sender whose lease passed to another changes nothing (the
    // other sends what is owed), and a repeated record cannot count twice.
    if o.lease.as_ref().is_none_or(|l| l.owner != owner) {
        return None;
    }
    o.lease = None;
    let rank = rendered.rank();
    let failed = |o: &mut crate::jobs::Outbox, error: String| {
        o.attempts += 1;
        o.last_error = Some(error);
        o.pending_since.get_or_insert(now);
    };
    match sent {
        Sent::Accepted { posted } => {
            if o.message_id.is_none() {
                o.message_id.clone_from(posted);
            }
            o.shown = Some(o.shown.map_or(rank, |s| s.max(rank)));
            o.attempts = 0;
            o.pending_since = None;
            o.last_error = None;
            if rendered.is_terminal() {
                o.status = DeliveryStatus::Delivered;
                o.target = None;
            }
        }
        Sent::MessageGone => {
            o.message_id = None;
            failed(
                o,
                "the status message was deleted; posting a new one".into(),
            );
        }
        Sent::TargetGone(e) => {
            o.status = DeliveryStatus::Gone;
            o.target = None;
            o.last_error = Some(e.clone());
        }
        Sent::Refused(e) => {
            o.refused = Some(rank);
            failed(o, e.clone());
            if rendered.is_terminal() {
                give_up(o);
            }
        }
        Sent::Transient(e) => {
            failed(o, e.clone());
            if o.pending_since
                .is_some_and(|since| now - since >= GIVE_UP_AFTER_MS)
            {
                give_up(o);
            }
        }
    }
    Some(next)
}

/// Takes the job's callback for `owner` until `until`, if one is owed and no one else holds
/// it: only one sender at a time, so an accepted callback is never sent again.
pub fn claim_callback(job: &Job, owner: &str, now: Millis, until: Millis) -> Option<Job> {
    let c = job.callback.as_ref()?;
    if !c.owes(job.state) || c.lease.as_ref().is_some_and(|l| l.until > now) {
        return None;
    }
    let mut next = job.clone();
    next.callback.as_mut()?.lease = Some(Lease {
        owner: owner.to_owned(),
        until,
    });
    Some(next)
}

/// What the callback receiver said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answered {
    /// 2xx.
    Accepted,
    /// 410: nothing more is sent for this run.
    Gone,
    /// Anything else (or no answer): sent again later, for up to 24 h.
    Failed(String),
}

/// Records what the receiver said to `owner`'s callback for state `sent`, and releases the
/// lease.
pub fn record_callback(
    job: &Job,
    owner: &str,
    sent: JobState,
    answer: &Answered,
    now: Millis,
) -> Option<Job> {
    let mut next = job.clone();
    let c = next.callback.as_mut()?;
    if c.lease.as_ref().is_none_or(|l| l.owner != owner) {
        return None;
    }
    c.lease = None;
    match answer {
        Answered::Accepted => {
            c.delivered = Some(c.delivered.map_or(sent.rank(), |d| d.max(sent.rank())));
            if job.state == sent {
                c.attempts = 0;
                c.pending_since = None;
                c.last_error = None;
            }
            if sent.is_terminal() {
                c.status = DeliveryStatus::Delivered;
            }
        }
        Answered::Gone => {
            c.status = DeliveryStatus::Gone;
            c.last_error = Some("the receiver answered 410 Gone".into());
        }
        // A failure of a state the job has since left does not count against the new one.
        Answered::Failed(e) if job.state == sent => {
            c.attempts += 1;
            c.last_error = Some(e.clone());
            let since = *c.pending_since.get_or_insert(now);
            if sent.is_terminal() && now - since >= GIVE_UP_AFTER_MS {
                c.status = DeliveryStatus::GivenUp;
            }
        }
        Answered::Failed(_) => {}
    }
    Some(next)
}

/// Gives up the job's owed callback when no receiver is configured any more: it would
/// otherwise stay in the sweep's outbox for ever.
pub fn abandon_callback(job: &Job) -> Option<Job> {
    if !job.owes_callback() {
        return None;
    }
    let mut next = job.clone();
    let c = next.callback.as_mut()?;
    c.status = DeliveryStatus::GivenUp;
    c.last_error = Some("CALLBACK_URL is no longer set".into());
    c.lease = None;
    Some(next)
}

fn give_up(o: &mut crate::jobs::Outbox) {
    o.status = DeliveryStatus::GivenUp;
    o.target = None;
}

/// A deadline an open job has passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overdue {
    /// Its evaluation did not start in time after its build was created.
    QueueTimeout,
    /// It is older than the deployment's maximum job age.
    Expired,
}

/// Which deadline, if any, `job` has passed at `now`. `queue_timeout_ms` applies unless the
/// submission set its own.
pub fn overdue(
    job: &Job,
    now: Millis,
    queue_timeout_ms: Millis,
    max_age_ms: Millis,
) -> Option<Overdue> {
    if job.state.is_terminal() {
        return None;
    }
    if now - job.created_at >= max_age_ms {
        return Some(Overdue::Expired);
    }
    let limit = job
        .max_queue_secs
        .map_or(queue_timeout_ms, |s| s as Millis * 1000);
    let waiting_since = job.scheduled_at?;
    (job.state == JobState::Scheduled && now - waiting_since >= limit)
        .then_some(Overdue::QueueTimeout)
}

/// What asking to cancel `job` does to it: `None` when it has ended (or was already asked).
pub fn request_cancel(job: &Job, now: Millis) -> Option<Job> {
    if job.state.is_terminal() || job.cancel_requested {
        return None;
    }
    let mut next = job.clone();
    next.cancel_requested = true;
    next.updated_at = now;
    if job.build.is_none() {
        // No build to wait for: it ends here (a build created later is canceled on sight).
        let outcome = crate::result::Outcome::decided(
            "not_created",
            crate::result::Verdict::Canceled,
            "canceled before its build was created",
        );
        return next
            .apply(&crate::jobs::Transition::to(JobState::Finished, now).with_outcome(outcome));
    }
    Some(next)
}

/// Takes a deferred creation that is due, holding it for [`CREATE_HOLD_MS`]; returns the job
/// as written and the creation as it was (which says whether to look the build up first).
pub fn claim_creation(job: &Job, now: Millis) -> Option<(Job, Creation)> {
    let creation = job.creation.as_ref()?;
    if job.state != JobState::Submitted || job.build.is_some() || creation.after > now {
        return None;
    }
    let mut next = job.clone();
    next.creation.as_mut()?.after = now + CREATE_HOLD_MS;
    Some((next, creation.clone()))
}

/// What a create call did, for [`defer_creation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateMiss {
    /// 429: create once the rate limit resets (`reset_ms` from now).
    RateLimited { reset_ms: Millis },
    /// The call may have created the build: look it up before creating another.
    Unconfirmed,
    /// The call surely did not reach Buildkite: create on the next pass.
    NotSent,
}

/// The job with its creation rescheduled after `miss`.
pub fn defer_creation(job: &Job, miss: CreateMiss, now: Millis) -> Option<Job> {
    let mut next = job.clone();
    let c = next.creation.as_mut()?;
    match miss {
        CreateMiss::RateLimited { reset_ms } => c.after = now + reset_ms,
        CreateMiss::Unconfirmed => {
            c.after = now + LOOK_UP_AFTER_MS;
            c.look_up_first = true;
        }
        CreateMiss::NotSent => c.after = now,
    }
    next.updated_at = now;
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discord::DiscordTarget;
    use crate::jobs::Transition;

    fn job(state: JobState) -> Job {
        let target = DiscordTarget::parse("https://discord.com/api/webhooks/1/t", None).unwrap();
        let mut j = Job::new(
            "r".parse().unwrap(),
            "g".into(),
            "q".into(),
            None,
            Some(target),
            0,
        );
        j.state = state;
        j
    }

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

    #[test]
    fn one_sender_at_a_time_and_a_lease_expires() {
        let j = job(JobState::Running);
        let held = claim(&j, "a", 1_000, 5_000).expect("owed and free");
        assert_eq!(claim(&held, "b", 2_000, 9_000), None, "held by a");
        assert!(
            claim(&held, "b", 5_001, 9_000).is_some(),
            "a's lease ran out"
        );
        let shown = record(
            &held,
            "a",
            JobState::Running,
            &Sent::Accepted {
                posted: Some("m".into()),
            },
            2_000,
        )
        .unwrap();
        assert_eq!(claim(&shown, "b", 2_000, 9_000), None, "nothing owed");
        let o = shown.discord.as_ref().unwrap();
        assert_eq!(
            (o.shown, o.message_id.as_deref(), o.lease.as_ref()),
            (Some(2), Some("m"), None)
        );
    }

    /// `job` with its message held by `owner`.
    fn held(job: &Job, owner: &str) -> Job {
        claim(job, owner, 0, Millis::MAX).expect("owed and free")
    }

    /// One send by `owner` of the job as it is, answered `sent` at `now`.
    fn send(job: &Job, owner: &str, sent: Sent, now: Millis) -> Job {
        let h = held(job, owner);
        record(&h, owner, h.state, &sent, now).expect("the holder records")
    }

    #[test]
    fn a_render_of_an_older_state_never_counts_as_the_newer() {
        // The job moved on while a render of `running` was in flight.
        let h = held(&job(JobState::Running), "a");
        let finished = h.apply(&Transition::to(JobState::Finished, 5)).unwrap();
        let after = record(
            &finished,
            "a",
            JobState::Running,
            &Sent::Accepted { posted: None },
            6,
        )
        .unwrap();
        assert!(after.owes_discord(), "the final report is still owed");
        let done = send(&after, "b", Sent::Accepted { posted: None }, 7);
        let o = done.discord.unwrap();
        assert_eq!(o.status, DeliveryStatus::Delivered);
        assert!(
            o.target.is_none(),
            "the token is dropped once the final report is accepted"
        );
    }

    #[test]
    fn only_the_lease_holder_records() {
        let h = held(&job(JobState::Finished), "a");
        assert_eq!(
            record(&h, "b", JobState::Finished, &Sent::MessageGone, 1),
            None
        );
        let once = record(
            &h,
            "a",
            JobState::Finished,
            &Sent::Transient("503".into()),
            1,
        )
        .unwrap();
        assert_eq!(
            record(
                &once,
                "a",
                JobState::Finished,
                &Sent::Transient("503".into()),
                2
            ),
            None,
            "a repeated record does not count twice"
        );
    }

    #[test]
    fn discord_answers_decide_what_happens_next() {
        let j = job(JobState::Finished);
        let gone_msg = send(&j, "a", Sent::MessageGone, 1);
        assert!(gone_msg.owes_discord() && gone_msg.discord.as_ref().unwrap().message_id.is_none());
        let gone = send(&j, "a", Sent::TargetGone("10015".into()), 1);
        assert_eq!(gone.discord.as_ref().unwrap().status, DeliveryStatus::Gone);
        assert!(!gone.owes_discord());
        let refused = send(&j, "a", Sent::Refused("50035".into()), 1);
        assert_eq!(
            refused.discord.as_ref().unwrap().status,
            DeliveryStatus::GivenUp
        );
        let refused = send(&job(JobState::Running), "a", Sent::Refused("x".into()), 1);
        assert!(!refused.owes_discord(), "that render is not retried");
        let moved = refused
            .apply(&Transition::to(JobState::Finished, 2))
            .unwrap();
        assert!(moved.owes_discord(), "the next state is tried again");
    }

    #[test]
    fn a_report_failing_for_a_day_is_given_up() {
        let down = || Sent::Transient("503".into());
        let once = send(&job(JobState::Running), "a", down(), 1_000);
        // The job moving on starts a new render's clock.
        let finished = once
            .apply(&Transition::to(JobState::Finished, 2_000))
            .unwrap();
        let first = send(&finished, "a", down(), 5_000);
        let later = send(&first, "a", down(), 5_000 + GIVE_UP_AFTER_MS - 1);
        assert!(later.owes_discord());
        assert_eq!(later.discord.as_ref().unwrap().attempts, 2);
        let day = send(&later, "a", down(), 5_000 + GIVE_UP_AFTER_MS);
        assert_eq!(day.discord.unwrap().status, DeliveryStatus::GivenUp);
    }

    #[test]
    fn a_submission_fails_only_before_its_build_exists() {
        let mut scheduled = job(JobState::Scheduled);
        scheduled.build = Some(crate::jobs::BuildRef {
            id: "b".into(),
            number: 1,
            web_url: String::new(),
        });
        assert_eq!(scheduled.apply(&Transition::to(JobState::Failed, 1)), None);
        assert!(
            job(JobState::Submitted)
                .apply(&Transition::to(JobState::Failed, 1))
                .is_some()
        );
    }

    #[test]
    fn deadlines_run_from_creation_and_from_the_build() {
        let mut j = job(JobState::Scheduled);
        j.scheduled_at = Some(1_000);
        assert_eq!(overdue(&j, 900_999, 900_000, 21_600_000), None);
        assert_eq!(
            overdue(&j, 901_000, 900_000, 21_600_000),
            Some(Overdue::QueueTimeout)
        );
        j.max_queue_secs = Some(3600);
        assert_eq!(
            overdue(&j, 901_000, 900_000, 21_600_000),
            None,
            "its own deadline"
        );
        let running = Job {
            state: JobState::Running,
            ..j.clone()
        };
        assert_eq!(
            overdue(&running, 3_700_000, 900_000, 21_600_000),
            None,
            "it started"
        );
        assert_eq!(
            overdue(&running, 21_600_000, 900_000, 21_600_000),
            Some(Overdue::Expired)
        );
        let done = Job {
            state: JobState::Finished,
            ..j
        };
        assert_eq!(overdue(&done, i64::MAX, 0, 0), None);
    }

    #[test]
    fn a_cancel_ends_a_buildless_job_at_once_and_marks_one_with_a_build() {
        let buildless = request_cancel(&job(JobState::Submitted), 5).unwrap();
        assert_eq!(buildless.state, JobState::Finished);
        assert_eq!(
            buildless.outcome.unwrap().verdict,
            crate::result::Verdict::Canceled
        );
        let mut scheduled = job(JobState::Scheduled);
        scheduled.build = Some(crate::jobs::BuildRef {
            id: "b".into(),
            number: 1,
            web_url: String::new(),
        });
        let asked = request_cancel(&scheduled, 5).unwrap();
        assert_eq!(
            (asked.state, asked.cancel_requested),
            (JobState::Scheduled, true)
        );
        assert_eq!(request_cancel(&asked, 6), None, "asked once");
        assert_eq!(request_cancel(&job(JobState::Finished), 6), None);
    }

    #[test]
    fn deferred_creations_are_claimed_once_and_rescheduled() {
        let mut j = job(JobState::Submitted);
        j.creation = Some(Creation {
            payload: "p".into(),
            after: 100,
            look_up_first: false,
        });
        assert_eq!(claim_creation(&j, 99), None, "not due");
        let (held, was) = claim_creation(&j, 100).unwrap();
        assert!(!was.look_up_first);
        assert_eq!(
            claim_creation(&held, 101),
            None,
            "held by the first claimant"
        );
        let unconfirmed = defer_creation(&held, CreateMiss::Unconfirmed, 200).unwrap();
        let c = unconfirmed.creation.as_ref().unwrap();
        assert_eq!((c.after, c.look_up_first), (200 + LOOK_UP_AFTER_MS, true));
        let limited =
            defer_creation(&held, CreateMiss::RateLimited { reset_ms: 42_000 }, 200).unwrap();
        assert_eq!(limited.creation.unwrap().after, 42_200);
        let scheduled = held
            .apply(
                &Transition::to(JobState::Scheduled, 300).with_build(crate::jobs::BuildRef {
                    id: "b".into(),
                    number: 1,
                    web_url: String::new(),
                }),
            )
            .unwrap();
        assert_eq!(
            scheduled.creation, None,
            "a recorded build ends the creation"
        );
    }

    fn with_callback(state: JobState) -> Job {
        let mut j = job(JobState::Submitted);
        j.callback = Some(crate::jobs::CallbackOutbox::new(0));
        j.apply(&Transition::to(state, 10)).unwrap()
    }

    #[test]
    fn one_callback_sender_at_a_time_and_an_accepted_one_is_never_owed_again() {
        let running = with_callback(JobState::Running);
        let held = claim_callback(&running, "a", 100, 1_000).expect("owed");
        assert_eq!(claim_callback(&held, "b", 200, 1_000), None, "held by a");
        assert!(
            claim_callback(&held, "b", 1_000, 2_000).is_some(),
            "a's lease passed"
        );
        assert_eq!(
            record_callback(&held, "b", JobState::Running, &Answered::Accepted, 300),
            None
        );
        let done =
            record_callback(&held, "a", JobState::Running, &Answered::Accepted, 300).unwrap();
        assert!(!done.owes_callback());
        assert_eq!(claim_callback(&done, "c", 400, 1_000), None);
        let finished = done
            .apply(&Transition::to(JobState::Finished, 500))
            .unwrap();
        assert!(
            finished.owes_callback(),
            "a new state owes its own callback"
        );
    }

    #[test]
    fn failures_are_retried_for_a_day_and_a_410_stops_at_once() {
        let finished = with_callback(JobState::Finished);
        let mut j = finished.clone();
        for now in [1_000, 2_000] {
            let held = claim_callback(&j, "s", now, now + 10).unwrap();
            j = record_callback(
                &held,
                "s",
                JobState::Finished,
                &Answered::Failed("500".into()),
                now,
            )
            .unwrap();
        }
        let c = j.callback.as_ref().unwrap();
        assert_eq!(
            (c.attempts, c.pending_since, c.status),
            (2, Some(1_000), DeliveryStatus::Active)
        );
        let late = 1_000 + GIVE_UP_AFTER_MS;
        let held = claim_callback(&j, "s", late, late + 10).unwrap();
        let j = record_callback(
            &held,
            "s",
            JobState::Finished,
            &Answered::Failed("500".into()),
            late,
        )
        .unwrap();
        assert_eq!(j.callback.as_ref().unwrap().status, DeliveryStatus::GivenUp);
        assert!(!j.owes_callback());

        let held = claim_callback(&finished, "s", 5, 10).unwrap();
        let gone = record_callback(&held, "s", JobState::Finished, &Answered::Gone, 5).unwrap();
        assert_eq!(gone.callback.as_ref().unwrap().status, DeliveryStatus::Gone);
        assert!(!gone.owes_callback());
    }

    #[test]
    fn an_earlier_states_answer_does_not_touch_the_later_state_now_owed() {
        let running = with_callback(JobState::Running);
        let held = claim_callback(&running, "s", 100, 1_000).unwrap();
        // The build finished while the `running` callback was in flight.
        let finished = held
            .apply(&Transition::to(JobState::Finished, 150))
            .unwrap();
        let failed = record_callback(
            &finished,
            "s",
            JobState::Running,
            &Answered::Failed("503".into()),
            200,
        )
        .unwrap();
        let c = failed.callback.as_ref().unwrap();
        assert_eq!(
            (c.attempts, c.pending_since, c.lease.as_ref()),
            (0, None, None)
        );
        let accepted =
            record_callback(&finished, "s", JobState::Running, &Answered::Accepted, 200).unwrap();
        assert!(accepted.owes_callback(), "finished is still owed");
        assert_eq!(
            accepted.callback.unwrap().delivered,
            Some(JobState::Running.rank())
        );
    }

    #[test]
    fn a_submitted_job_owes_no_callback_and_an_unset_receiver_gives_up() {
        let mut submitted = job(JobState::Submitted);
        submitted.callback = Some(crate::jobs::CallbackOutbox::new(0));
        assert_eq!(claim_callback(&submitted, "s", 0, 10), None);
        assert_eq!(abandon_callback(&submitted), None);
        let abandoned = abandon_callback(&with_callback(JobState::Finished)).unwrap();
        assert_eq!(abandoned.callback.unwrap().status, DeliveryStatus::GivenUp);
    }
}
