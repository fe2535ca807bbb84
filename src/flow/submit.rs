//! Submit: record the job, then create its build (or leave that to the sweep), then show it
//! in Discord. The record comes first so a webhook never arrives for a job we do not know.
//! A submission that would wait past its user's `USER_MAX_WAITING` is refused before it.

use tracing::{Instrument, info, warn};

use super::create::{settle_creation, try_create};
use super::effects::Effects;
use super::rules::creation::CREATE_HOLD_MS;
use super::rules::fair as fair_rules;
use super::settle::{deliver, settle, settle_after};
use super::submission::Submission;
use super::{Deps, DispatchError, fair};
use super::{budget, reuse};
use crate::jobs::{
    CallbackOutbox, Created, Creation, Job, JobState, RunId, StoreError, Transition, View,
};
use crate::retry::Deadline;
use crate::telemetry::metrics::Unit;

/// What a submission did.
#[derive(Debug)]
pub enum Submitted {
    New(Job),
    /// The run id was known: nothing was created.
    Existing(Job),
    /// Its user has as many jobs waiting on the queue as allowed: nothing was recorded.
    TooManyWaiting(TooManyWaiting),
    /// Its user used their daily GPU time: nothing was recorded.
    OverBudget(budget::Usage),
}

/// A submission refused at its user's `USER_MAX_WAITING` on its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooManyWaiting {
    pub waiting: usize,
    pub limit: usize,
    /// About when one of them should have started (the queue's median run time).
    pub retry_after_secs: u64,
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
    job.user.clone_from(&sub.user);
    // Kept only while answers are on: every write of the job carries it.
    job.identity = sub
        .identity
        .as_deref()
        .filter(|_| d.config.result_cache_secs > 0)
        .map(|id| super::rules::reuse::on_runner(id, &d.config.buildkite.image));
    // With fair share a named user's submission starts waiting: the queue's release decides,
    // under its lease, whether its user has a slot. One without a user is a user of its own,
    // whose slot is always free.
    job.waiting = d.config.user_max_in_flight > 0 && sub.user.is_some();
    // A background job always waits: a release lets it go onto an idle GPU.
    job.background = sub.background;
    job.waiting |= sub.background;
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
        if let Some(earlier) = answer_from(d, &job).await
            && let Some(answered) = answer(d, &job, &earlier, deadline).await?
        {
            return Ok(answered);
        }
        if let Some(refused) = refusal(d, &job).await? {
            return Ok(refused);
        }
        if let Created::Existing(existing) = d.store.create(&job).await? {
            info!(state = %existing.state, "run id already known; nothing created");
            return Ok(Submitted::Existing(*existing));
        }
        let (mut own, mut others) = (Effects::default(), Effects::default());
        let made = make(d, job, &sub.payload, deadline, &mut own, &mut others).await;
        // What its own create owed (a refused build's report) goes out before the answer;
        // then the released jobs' first messages, never this submission's failure.
        let made = settle_after(d, own, deadline, made).await;
        if let Err(e) = settle(d, others, deadline).await {
            warn!(error = %e, "a released job's message is left to the sweep");
        }
        let (job, seen) = made?;
        let job = match fair::place(d, &job, seen.as_ref()).await {
            Ok(placed) => placed,
            Err(e) => {
                warn!(error = %e, "the job's place could not be noted");
                job
            }
        };
        let job = deliver(d, (&job, View::Earlier), deadline)
            .await?
            .unwrap_or(job);
        Ok(Submitted::New(job))
    }
    .instrument(span)
    .await
}

/// A submission refused before anything of it is recorded (its user's GPU budget, then its
/// waiting limit), or, for a retry of one recorded already, the job as it is.
async fn refusal(d: &Deps, job: &Job) -> Result<Option<Submitted>, DispatchError> {
    let refused = match over_budget(d, job).await? {
        Some(usage) => Submitted::OverBudget(usage),
        None => match over_waiting(d, job).await? {
            Some(waiting) => Submitted::TooManyWaiting(waiting),
            None => return Ok(None),
        },
    };
    if let Some(existing) = d.store.get(&job.run_id).await? {
        return Ok(Some(Submitted::Existing(existing)));
    }
    match &refused {
        Submitted::OverBudget(u) => info!(used = u.used_secs, "refused: over its user's GPU time"),
        Submitted::TooManyWaiting(w) => info!(waiting = w.waiting, "refused: too many waiting"),
        _ => {}
    }
    Ok(Some(refused))
}

/// The user's use when it is past their budget (one read, only with a budget and a user).
async fn over_budget(d: &Deps, job: &Job) -> Result<Option<budget::Usage>, DispatchError> {
    let Some(user) = job.user.as_ref() else {
        return Ok(None);
    };
    if d.config.user_gpu_seconds_per_day == 0 {
        return Ok(None);
    }
    let usage = budget::usage(d, user).await?;
    Ok(usage.exhausted().then_some(usage))
}

/// The earlier run that answers `job`, if one may (a failed read: none, the job runs).
async fn answer_from(d: &Deps, job: &Job) -> Option<Job> {
    let identity = job.identity.as_deref()?;
    match reuse::earlier(d, identity).await {
        Ok(earlier) => earlier,
        Err(e) => {
            warn!(error = %e, "no earlier run could be looked up; this one runs");
            None
        }
    }
}

/// Records the job already ended with `earlier`'s outcome, in one write: no build, nothing
/// left to create, no slot on its queue, nothing on the queue's record of run times; its own
/// report and callback are sent. `None`: it cannot be recorded so (too large for the store),
/// and runs.
async fn answer(
    d: &Deps,
    job: &Job,
    earlier: &Job,
    deadline: Deadline,
) -> Result<Option<Submitted>, DispatchError> {
    let t = Transition::to(JobState::Finished, d.clock.now()).answered_from(earlier);
    let Some(answered) = job.apply(&t) else {
        return Ok(None);
    };
    let created = match d.store.create(&answered).await {
        Err(StoreError::TooLarge) => {
            warn!("the earlier run's outcome does not fit this job's record; it runs");
            return Ok(None);
        }
        other => other?,
    };
    if let Created::Existing(existing) = created {
        return Ok(Some(Submitted::Existing(*existing)));
    }
    info!(cached_from = %earlier.run_id, "answered from an earlier run; no build");
    d.metrics
        .put(&[], &[("JobsAnsweredFromEarlier", Unit::Count, 1.0)]);
    // The outboxes alone: the earlier run's tries are that run's, noted on the fleet once.
    let job = super::deliver::deliver(d, (&answered, View::Earlier), deadline)
        .await?
        .unwrap_or(answered);
    Ok(Some(Submitted::New(job)))
}

/// The refusal of a job that would wait past its user's `USER_MAX_WAITING` on its queue
/// (one read of the queue's open jobs, only for a job of a named user under fair share).
async fn over_waiting(d: &Deps, job: &Job) -> Result<Option<TooManyWaiting>, DispatchError> {
    let limit = d.config.user_max_waiting;
    let counted = job.waiting && !job.background && limit > 0;
    let Some(user) = job.user.as_ref().filter(|_| counted) else {
        return Ok(None);
    };
    let open = d.store.open_in_queue(&job.queue).await?;
    let Err(waiting) = fair_rules::may_wait(&open, user.as_str(), limit) else {
        return Ok(None);
    };
    // Without the queue's record the answer is still a refusal, with the default wait.
    let median = match fair::queue_record(d, &job.queue).await {
        Ok(record) => record.median_run(),
        Err(e) => {
            warn!(error = %e, "the queue's record could not be read; Retry-After is a guess");
            None
        }
    };
    Ok(Some(TooManyWaiting {
        waiting,
        limit,
        retry_after_secs: fair_rules::retry_waiting_after(median),
    }))
}

/// Takes the new job's turn, and creates its build when it has one; creates the builds of
/// the others its release let go. The job as it is then, and the queue as the release saw
/// it; what its create owes is left to `own`, what the others' owe to `others`.
async fn make(
    d: &Deps,
    job: Job,
    payload: &str,
    deadline: Deadline,
    own: &mut Effects,
    others: &mut Effects,
) -> Result<(Job, Option<fair::Seen>), DispatchError> {
    let (turn, released, seen) = take_turn(d, job).await?;
    let job = match turn {
        Turn::Go(job) => {
            let bk_deadline = d.buildkite_deadline(deadline);
            let creating = try_create(d, &job, payload, bk_deadline).await;
            // A refused build ends here: the others are left to the sweep, as at any failure.
            // Its first create: none before it may have made a build.
            settle_creation(d, &job, (creating, false), deadline, own).await?
        }
        Turn::Wait(job) => {
            info!(user = ?job.user, "waiting: its user has builds in flight");
            job
        }
    };
    // Others the release let go: best effort (the sweep creates what this does not), and
    // never this submission's failure.
    fair::create_released(d, released, deadline, others).await;
    Ok((job, seen))
}

/// Whether a new job's build is made now.
enum Turn {
    Go(Job),
    /// Its user's limit holds it back: fair share releases it later.
    Wait(Job),
}

/// Asks fair share for the new job's turn: released (this submit creates its build), or
/// left waiting; the others the release let go, and the queue as it saw it.
async fn take_turn(
    d: &Deps,
    job: Job,
) -> Result<(Turn, Vec<Job>, Option<fair::Seen>), DispatchError> {
    if !job.waiting {
        return Ok((Turn::Go(job), Vec::new(), None));
    }
    let fresh = fair::Fresh {
        mine: Some(&job),
        ended: None,
    };
    // The job is recorded as waiting: a release that cannot be made now (the queue's lease
    // fought over in a burst, the store failing) leaves it to the next end or sweep pass,
    // never fails the submission. One that let this job go before it failed leaves its
    // create to the sweep (another instance's release may have let it go too, and creates
    // it: a create here could make a second build).
    let released = match fair::release(d, &job.queue, fresh).await {
        Ok(released) => released,
        Err(e) => {
            warn!(error = %e, queue = %job.queue, "no release at submit; the job waits for the next");
            return Ok((Turn::Wait(job), Vec::new(), None));
        }
    };
    let turn = match released.mine {
        Some(mine) => Turn::Go(mine),
        None => Turn::Wait(job),
    };
    Ok((turn, released.others, released.seen))
}

/// The job of `run_id`, as `GET /submissions/{run_id}` shows it.
pub async fn find(d: &Deps, run_id: &RunId) -> Result<Option<Job>, DispatchError> {
    Ok(d.store.get(run_id).await?)
}
