//! Following one build: from Buildkite's view of it to the job's next state, deadlines
//! included (an overdue job's live build is canceled).

use tracing::info;

use super::rules::{self, Overdue};
use super::submit::build_ref;
use super::sweep::PipelineSeen;
use super::{DispatchError, Dispatcher, EventOutcome};
use crate::buildkite::{Build, BuildkiteError};
use crate::jobs::{Job, JobState, Transition, Updated, update_seen};
use crate::result::{Outcome, Verdict};
use crate::retry::Deadline;

impl Dispatcher {
    /// A job with a build: read its build and move the job as the build has moved.
    pub(super) async fn look_at_build(
        &self,
        job: &Job,
        pipeline: &mut PipelineSeen,
        deadline: Deadline,
    ) -> Result<EventOutcome, DispatchError> {
        let Some(b) = &job.build else {
            return Ok(EventOutcome::Ignored("no build"));
        };
        let bk_deadline = self.buildkite_deadline(deadline);
        let build = match self.buildkite.get_build(b.number, bk_deadline).await {
            Ok(build) => {
                pipeline.0 = Some(true);
                build
            }
            Err(BuildkiteError::Rejected { status: 404, .. }) => {
                self.reach_pipeline(pipeline, bk_deadline).await?;
                // The pipeline is there and the build is not: it will never finish.
                let outcome = Outcome::decided(
                    "unknown",
                    Verdict::Error,
                    "the build no longer exists in Buildkite",
                );
                let t = Transition::to(JobState::Finished, self.clock.now()).with_outcome(outcome);
                return self.advance(job, t, deadline).await;
            }
            Err(e) => return Err(e.into()),
        };
        self.follow(job, &build, deadline).await
    }

    /// Moves `job` as `build` (read from the API, with its jobs, perhaps a listing's
    /// moments ago) says: finished, started, past a deadline (canceled then), or waiting.
    pub(super) async fn follow(
        &self,
        job: &Job,
        build: &Build,
        deadline: Deadline,
    ) -> Result<EventOutcome, DispatchError> {
        let Some(b) = &job.build else {
            return Ok(EventOutcome::Ignored("no build"));
        };
        if b.id != build.id {
            // Numbers start again when a pipeline is recreated: never take another's build.
            return Ok(EventOutcome::Ignored(
                "a different build under the job's number",
            ));
        }
        let target = rules::progress_of(build);
        if target == JobState::Finished {
            return self.finish(job, build, deadline).await;
        }
        let mut seen = job.clone();
        seen.state = if target.rank() > job.state.rank() {
            target
        } else {
            job.state
        };
        if let Some(overdue) = self.overdue(&seen) {
            return self.end_overdue(&seen, overdue, deadline).await;
        }
        if job.cancel_requested {
            // An earlier cancel call failed: try again until the build ends.
            self.cancel_build(b.number, self.buildkite_deadline(deadline))
                .await;
        }
        if target.rank() <= job.state.rank() {
            return Ok(EventOutcome::Ignored("build has not moved on"));
        }
        let t = Transition::to(target, self.clock.now()).with_build(build_ref(build));
        self.advance(job, t, deadline).await
    }

    /// Finishes `job` with its ended build's outcome. A result that cannot be read is tried
    /// again on later passes, until the job's maximum age: then it ends as `error`.
    async fn finish(
        &self,
        job: &Job,
        build: &Build,
        deadline: Deadline,
    ) -> Result<EventOutcome, DispatchError> {
        let outcome = match self
            .outcome_of(build, self.buildkite_deadline(deadline))
            .await
        {
            Ok(outcome) => outcome,
            Err(DispatchError::Buildkite(e @ BuildkiteError::Unavailable(_)))
                if self.overdue(job) == Some(Overdue::Expired) =>
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
        let t = Transition::to(JobState::Finished, self.clock.now())
            .with_build(build_ref(build))
            .with_outcome(outcome);
        self.advance(job, t, deadline).await
    }

    pub(super) fn overdue(&self, job: &Job) -> Option<Overdue> {
        rules::overdue(
            job,
            self.clock.now(),
            self.config.queue_timeout.as_millis() as i64,
            self.config.job_max_age.as_millis() as i64,
        )
    }

    /// Ends an overdue job. Its build is read afresh first (a listing can be moments old):
    /// one that has ended gives the job its real outcome, one whose evaluation started is no
    /// queue timeout. Otherwise the build is canceled and the job ends with the deadline's
    /// verdict, unless it moved on meanwhile.
    async fn end_overdue(
        &self,
        job: &Job,
        overdue: Overdue,
        deadline: Deadline,
    ) -> Result<EventOutcome, DispatchError> {
        let Some(b) = &job.build else {
            return Ok(EventOutcome::Ignored("no build"));
        };
        let bk_deadline = self.buildkite_deadline(deadline);
        let fresh = self.buildkite.get_build(b.number, bk_deadline).await?;
        if fresh.id != b.id {
            return Ok(EventOutcome::Ignored(
                "a different build under the job's number",
            ));
        }
        match rules::progress_of(&fresh) {
            JobState::Finished => return self.finish(job, &fresh, deadline).await,
            JobState::Running if overdue == Overdue::QueueTimeout => {
                let t = Transition::to(JobState::Running, self.clock.now())
                    .with_build(build_ref(&fresh));
                return self.advance(job, t, deadline).await;
            }
            _ => {}
        }
        if !self.cancel_build(b.number, bk_deadline).await {
            // A build we could not stop is not reported as stopped: next pass.
            return Ok(EventOutcome::Ignored(
                "overdue; its build could not be canceled yet",
            ));
        }
        info!(?overdue, "job overdue; its build is canceled");
        let t = Transition::to(JobState::Finished, self.clock.now())
            .with_outcome(self.deadline_outcome(job, overdue));
        // Only from the state the decision was made on: a webhook may have moved it since.
        let decided_on = job.state;
        let written = update_seen(self.store.as_ref(), job, |j| {
            (j.state == decided_on).then(|| j.apply(&t)).flatten()
        })
        .await?;
        match written {
            Updated::Written(j) => {
                self.deliver(&j, deadline).await?;
                Ok(EventOutcome::Advanced(j.state))
            }
            _ => Ok(EventOutcome::Ignored("the job moved on meanwhile")),
        }
    }

    fn deadline_outcome(&self, job: &Job, overdue: Overdue) -> Outcome {
        match overdue {
            Overdue::QueueTimeout => {
                let waited = job
                    .max_queue_secs
                    .unwrap_or(self.config.queue_timeout.as_secs());
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
                    self.config.job_max_age.as_secs()
                ),
            ),
        }
    }

    /// Confirms once per pass that the pipeline itself is readable.
    pub(super) async fn reach_pipeline(
        &self,
        seen: &mut PipelineSeen,
        deadline: Deadline,
    ) -> Result<(), DispatchError> {
        match seen.0 {
            Some(true) => Ok(()),
            Some(false) => Err(DispatchError::Pipeline(BuildkiteError::Rejected {
                status: 404,
                message: "pipeline not found".into(),
            })),
            None => match self.buildkite.check_pipeline(deadline).await {
                Ok(()) => {
                    seen.0 = Some(true);
                    Ok(())
                }
                Err(e @ BuildkiteError::Rejected { .. }) => {
                    seen.0 = Some(false);
                    Err(DispatchError::Pipeline(e))
                }
                Err(e) => Err(e.into()),
            },
        }
    }
}
