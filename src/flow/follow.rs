//! Following one build: from Buildkite's view of it to the job's next state, deadlines
//! included (an overdue job's live build is canceled).

use tracing::info;

use super::advance::{EventOutcome, advance, build_ref};
use super::effects::Effects;
use super::outcome::read_outcome;
use super::rules::ending::{Overdue, overdue};
use super::rules::signal::progress_of;
use super::stop::stop_build;
use super::{Deps, DispatchError};
use crate::buildkite::{Build, BuildkiteError};
use crate::jobs::{Job, JobState, Timeline, Transition, Updated, update_seen};
use crate::result::{Outcome, Verdict};
use crate::retry::Deadline;

/// Whether a sweep pass has reached the pipeline (`None`: not asked yet): a build's 404
/// ends its job only once the pipeline is known to be there.
#[derive(Default)]
pub(crate) struct PipelineSeen(Option<bool>);

impl PipelineSeen {
    /// A call on the pipeline answered.
    pub(crate) fn reached(&mut self) {
        self.0 = Some(true);
    }
}

/// A job with a build: read its build and move the job as the build has moved.
pub(crate) async fn look_at_build(
    d: &Deps,
    job: &Job,
    pipeline: &mut PipelineSeen,
    deadline: Deadline,
    effects: &mut Effects,
) -> Result<EventOutcome, DispatchError> {
    let Some(b) = &job.build else {
        return Ok(EventOutcome::Ignored("no build"));
    };
    let bk_deadline = d.buildkite_deadline(deadline);
    let build = match d.buildkite.get_build(b.number, bk_deadline).await {
        Ok(build) => {
            pipeline.reached();
            build
        }
        Err(BuildkiteError::Rejected { status: 404, .. }) => {
            reach_pipeline(d, pipeline, bk_deadline).await?;
            // The pipeline is there and the build is not: it will never finish.
            let outcome = Outcome::decided(
                "unknown",
                Verdict::Error,
                "the build no longer exists in Buildkite",
            );
            let t = Transition::to(JobState::Finished, d.clock.now()).with_outcome(outcome);
            return advance(d, job, t, effects).await;
        }
        Err(e) => return Err(e.into()),
    };
    follow(d, job, &build, deadline, effects).await
}

/// Moves `job` as `build` (read from the API, with its jobs, perhaps a listing's
/// moments ago) says: finished, started, past a deadline (canceled then), or waiting.
pub(crate) async fn follow(
    d: &Deps,
    job: &Job,
    build: &Build,
    deadline: Deadline,
    effects: &mut Effects,
) -> Result<EventOutcome, DispatchError> {
    let Some(b) = &job.build else {
        return Ok(EventOutcome::Ignored("no build"));
    };
    if b.id != build.id {
        // Numbers start again when a pipeline is recreated: never take another's build. The
        // job's own deadlines still end it (nothing of ours runs under that number).
        return match overdue_now(d, job.timeline()) {
            Some(overdue) => end_at_deadline(d, job, overdue, effects).await,
            None => Ok(EventOutcome::Ignored(
                "a different build under the job's number",
            )),
        };
    }
    let target = progress_of(build);
    if target == JobState::Finished {
        return finish(d, job, build, deadline, effects).await;
    }
    let mut seen = job.clone();
    seen.state = if target.rank() > job.state.rank() {
        target
    } else {
        job.state
    };
    if let Some(overdue) = overdue_now(d, seen.timeline()) {
        return end_overdue(d, &seen, overdue, deadline, effects).await;
    }
    if job.cancel_requested {
        // An earlier cancel call failed: try again until the build ends.
        stop_build(d, b.number, d.buildkite_deadline(deadline)).await;
    }
    if target.rank() <= job.state.rank() {
        return Ok(EventOutcome::Ignored("build has not moved on"));
    }
    let t = Transition::to(target, d.clock.now()).with_build(build_ref(build));
    advance(d, job, t, effects).await
}

/// Finishes `job` with its ended build's outcome. A result that Buildkite keeps from us is
/// tried again on later passes, until the job's maximum age: then it ends as `error`. One
/// whose reads never come back ends so after a few (see [`read_outcome`]).
async fn finish(
    d: &Deps,
    job: &Job,
    build: &Build,
    deadline: Deadline,
    effects: &mut Effects,
) -> Result<EventOutcome, DispatchError> {
    let t = Transition::to(JobState::Finished, d.clock.now()).with_build(build_ref(build));
    let bk_deadline = d.buildkite_deadline(deadline);
    let Some(read) = read_outcome(d, job, build, None, bk_deadline).await? else {
        // It ended meanwhile: the transition changes nothing, and what it owes is sent.
        return advance(d, job, t, effects).await;
    };
    let outcome = match read.outcome {
        Ok(outcome) => outcome,
        Err(DispatchError::Buildkite(e @ BuildkiteError::Unavailable(_)))
            if overdue_now(d, job.timeline()) == Some(Overdue::Expired) =>
        {
            Outcome::decided(
                build.final_state(),
                Verdict::Error,
                format!(
                    "the result could not be read before the job's maximum age: {}",
                    e.public()
                ),
            )
        }
        Err(e) => return Err(e),
    };
    advance(d, &read.job, t.with_outcome(outcome), effects).await
}

pub(crate) fn overdue_now(d: &Deps, job: Timeline) -> Option<Overdue> {
    let timing = &d.config.timing;
    overdue(
        job,
        d.clock.now(),
        timing.queue_timeout.as_millis() as i64,
        timing.job_max_age.as_millis() as i64,
    )
}

/// Ends an overdue job. Its build is read afresh first (a listing can be moments old):
/// one that has ended gives the job its real outcome, one whose evaluation started is no
/// queue timeout. Otherwise the build is canceled and the job ends with the deadline's
/// verdict, unless it moved on meanwhile. Another build under the job's number (a pipeline
/// recreated) is not ours to cancel: the job ends all the same.
async fn end_overdue(
    d: &Deps,
    job: &Job,
    overdue: Overdue,
    deadline: Deadline,
    effects: &mut Effects,
) -> Result<EventOutcome, DispatchError> {
    let Some(b) = &job.build else {
        return Ok(EventOutcome::Ignored("no build"));
    };
    let bk_deadline = d.buildkite_deadline(deadline);
    let fresh = d.buildkite.get_build(b.number, bk_deadline).await?;
    if fresh.id == b.id {
        match progress_of(&fresh) {
            JobState::Finished => return finish(d, job, &fresh, deadline, effects).await,
            JobState::Running if overdue == Overdue::QueueTimeout => {
                let t =
                    Transition::to(JobState::Running, d.clock.now()).with_build(build_ref(&fresh));
                return advance(d, job, t, effects).await;
            }
            _ => {}
        }
        if !stop_build(d, b.number, bk_deadline).await {
            // A build we could not stop is not reported as stopped: next pass.
            return Ok(EventOutcome::Ignored(
                "overdue; its build could not be canceled yet",
            ));
        }
        info!(?overdue, "job overdue; its build is canceled");
    }
    end_at_deadline(d, job, overdue, effects).await
}

/// Ends `job` with the verdict of the deadline it passed, only from the state the decision
/// was made on: a webhook may have moved it since.
async fn end_at_deadline(
    d: &Deps,
    job: &Job,
    overdue: Overdue,
    effects: &mut Effects,
) -> Result<EventOutcome, DispatchError> {
    let t = Transition::to(JobState::Finished, d.clock.now())
        .with_outcome(deadline_outcome(d, job, overdue));
    let decided_on = job.state;
    let written = update_seen(d.store.as_ref(), job, |j| {
        (j.state == decided_on).then(|| j.apply(&t)).flatten()
    })
    .await?;
    match written {
        Updated::Written(j) => {
            let state = j.state;
            // Its report, then its slot on the queue freed: fair share's waiting jobs may go.
            effects.ended(j);
            Ok(EventOutcome::Advanced(state))
        }
        _ => Ok(EventOutcome::Ignored("the job moved on meanwhile")),
    }
}

fn deadline_outcome(d: &Deps, job: &Job, overdue: Overdue) -> Outcome {
    match overdue {
        Overdue::QueueTimeout => {
            let waited = job
                .max_queue_secs
                .unwrap_or(d.config.timing.queue_timeout.as_secs());
            Outcome::decided(
                "canceled",
                Verdict::QueueTimeout,
                format!(
                    "no agent on queue `{}` started it within {waited} s",
                    job.queue
                ),
            )
        }
        Overdue::Expired => Outcome::decided(
            "canceled",
            Verdict::Expired,
            format!(
                "still unfinished {} s after submission",
                d.config.timing.job_max_age.as_secs()
            ),
        ),
    }
}

/// Confirms once per pass that the pipeline itself is readable.
pub(crate) async fn reach_pipeline(
    d: &Deps,
    seen: &mut PipelineSeen,
    deadline: Deadline,
) -> Result<(), DispatchError> {
    match seen.0 {
        Some(true) => Ok(()),
        Some(false) => Err(DispatchError::Pipeline(BuildkiteError::Rejected {
            status: 404,
            message: "pipeline not found".into(),
        })),
        None => match d.buildkite.check_pipeline(deadline).await {
            Ok(()) => {
                seen.reached();
                Ok(())
            }
            Err(e @ (BuildkiteError::Rejected { .. } | BuildkiteError::Misconfigured { .. })) => {
                seen.0 = Some(false);
                Err(DispatchError::Pipeline(e))
            }
            Err(e) => Err(e.into()),
        },
    }
}
