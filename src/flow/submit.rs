//! Submit: record the job, then create its build (or leave that to the sweep), then show it
//! in Discord. The record comes first so a webhook never arrives for a job we do not know.

use tracing::{Instrument, info};

use super::create::{settle_creation, try_create};
use super::rules::creation::CREATE_HOLD_MS;
use super::submission::Submission;
use super::{Deps, DispatchError, deliver};
use crate::jobs::{CallbackOutbox, Created, Creation, Job, RunId};
use crate::retry::Deadline;

/// What a submission did.
#[derive(Debug)]
pub enum Submitted {
    New(Job),
    /// The run id was known: nothing was created.
    Existing(Job),
}

/// The job a submission starts, its create held while this function makes it: if the
/// function dies, the sweep looks the build up once the hold has passed, then creates it.
fn job_of(d: &Deps, sub: &Submission) -> Job {
    let now = d.clock.now();
    let mut job = Job::new(
        sub.run_id.clone(),
        sub.gpu.clone(),
        sub.queue.clone(),
        sub.title.clone(),
        sub.discord.clone(),
        now,
    );
    job.max_queue_secs = sub.max_queue_secs;
    job.private = sub.private;
    if d.callbacks.is_some() {
        job.callback = Some(CallbackOutbox::new(now));
    }
    job.creation = Some(Creation {
        payload: sub.payload.clone(),
        after: now + CREATE_HOLD_MS,
        look_up_first: true,
    });
    job
}

/// Records the job, then creates its build (or defers that to the sweep), then shows it.
pub async fn submit(
    d: &Deps,
    sub: Submission,
    deadline: Deadline,
) -> Result<Submitted, DispatchError> {
    let span = tracing::info_span!("submit", run_id = %sub.run_id, gpu = %sub.gpu);
    async move {
        let job = job_of(d, &sub);
        if let Created::Existing(existing) = d.store.create(&job).await? {
            info!(state = %existing.state, "run id already known; nothing created");
            return Ok(Submitted::Existing(*existing));
        }
        let creating = try_create(d, &job, &sub.payload, d.buildkite_deadline(deadline)).await;
        let job = settle_creation(d, &job, creating, deadline).await?;
        let job = deliver::deliver(d, &job, deadline).await?.unwrap_or(job);
        Ok(Submitted::New(job))
    }
    .instrument(span)
    .await
}

/// The job of `run_id`, as `GET /submissions/{run_id}` shows it.
pub async fn find(d: &Deps, run_id: &RunId) -> Result<Option<Job>, DispatchError> {
    Ok(d.store.get(run_id).await?)
}
