//! The API's answers as types: what each route returns is a struct here, so its shape is
//! checked by the compiler, not assembled by hand.

use serde::Serialize;

use crate::flow::fair::Standing;
use crate::flow::queues::QueueStatus;
use crate::jobs::{BuildRef, Channel, Delivery, Job, JobState};
use crate::result::{Outcome, Verdict};
use crate::time::rfc3339;

/// `GET /submissions/{run_id}`.
#[derive(Serialize)]
pub(crate) struct JobView<'a> {
    run_id: &'a str,
    state: JobState,
    gpu: &'a str,
    queue: &'a str,
    title: Option<&'a str>,
    build: Option<&'a BuildRef>,
    failure: Option<&'a str>,
    created_at: String,
    updated_at: String,
    verdict: Option<Verdict>,
    result: Option<&'a Outcome>,
    /// The earlier run of the same code whose outcome answered this one (no build of its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    cached_from: Option<&'a str>,
    delivery: DeliveryView<'a>,
    /// `user_limit` while fair share holds it back (its user's builds fill their share),
    /// `background` while a background job waits for an idle GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting: Option<&'static str>,
    /// Where it stands on its queue now (1: next), until it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_position: Option<u32>,
    /// When it is expected to start, once the queue has run times to go by.
    #[serde(skip_serializing_if = "Option::is_none")]
    expected_start: Option<String>,
}

/// Fair share's word for a waiting job, as the API shows it.
fn waiting(job: &Job) -> Option<&'static str> {
    let why = if job.background {
        "background"
    } else {
        "user_limit"
    };
    job.waiting.then_some(why)
}

/// Where the job's messages stand, for operators (never the webhook token).
#[derive(Serialize)]
struct DeliveryView<'a> {
    discord: Option<DiscordView<'a>>,
    callback: Option<CallbackView<'a>>,
}

#[derive(Serialize)]
struct DiscordView<'a> {
    status: &'static str,
    /// The newest state the message has shown.
    shown: Option<&'static str>,
    message_id: Option<&'a str>,
    attempts: u32,
    pending_since: Option<String>,
    last_error: Option<&'a str>,
}

#[derive(Serialize)]
struct CallbackView<'a> {
    status: &'static str,
    /// The newest state the receiver accepted.
    delivered: Option<&'static str>,
    attempts: u32,
    pending_since: Option<String>,
    last_error: Option<&'a str>,
}

/// A state's name by rank (the top rank, shared by two states, is `final`).
fn rank_name(rank: u8) -> &'static str {
    match rank {
        0 => "submitted",
        1 => "scheduled",
        2 => "running",
        _ => "final",
    }
}

/// The state a receiver accepted: the job's own when it is the rank the job is at.
fn accepted_name(rank: u8, job: &Job) -> &'static str {
    if rank == job.state.rank() {
        job.state.as_str()
    } else {
        rank_name(rank)
    }
}

/// `pending` while a message is owed, else how the delivery ended.
fn status(job: &Job, channel: Channel, d: &Delivery) -> &'static str {
    if job.owes(channel) {
        "pending"
    } else {
        d.status.as_str()
    }
}

impl<'a> JobView<'a> {
    /// The job, and where it stands on its queue now (`None` once it runs).
    pub(crate) fn of(job: &'a Job, standing: Option<Standing>) -> Self {
        Self {
            waiting: waiting(job),
            queue_position: standing.map(|s| s.position),
            expected_start: standing.and_then(|s| s.expected_start).map(rfc3339),
            run_id: job.run_id.as_str(),
            state: job.state,
            gpu: &job.gpu,
            queue: &job.queue,
            title: job.title.as_deref(),
            build: job.build.as_ref(),
            failure: job.failure.as_deref(),
            created_at: rfc3339(job.created_at),
            updated_at: rfc3339(job.updated_at),
            verdict: job.outcome.as_ref().map(|o| o.verdict),
            result: job.outcome.as_deref(),
            cached_from: job.cached_from.as_ref().map(|r| r.as_str()),
            delivery: DeliveryView {
                discord: job.discord.as_ref().map(|o| DiscordView {
                    status: status(job, Channel::Discord, &o.delivery),
                    shown: o.delivery.accepted.map(rank_name),
                    message_id: o.message_id.as_deref(),
                    attempts: o.delivery.attempts,
                    pending_since: o.delivery.pending_since.map(rfc3339),
                    last_error: o.delivery.last_error.as_deref(),
                }),
                callback: job.callback.as_ref().map(|c| CallbackView {
                    status: status(job, Channel::Callback, &c.delivery),
                    delivered: c.delivery.accepted.map(|r| accepted_name(r, job)),
                    attempts: c.delivery.attempts,
                    pending_since: c.delivery.pending_since.map(rfc3339),
                    last_error: c.delivery.last_error.as_deref(),
                }),
            },
        }
    }
}

/// `POST /submissions`: 202 for a new job, 200 for a run id already known.
#[derive(Serialize)]
pub(crate) struct SubmittedView<'a> {
    run_id: &'a str,
    state: JobState,
    build: Option<&'a BuildRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_position: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expected_start: Option<String>,
    /// Answered from this earlier run: finished already, with no build of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    cached_from: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    verdict: Option<Verdict>,
}

impl<'a> SubmittedView<'a> {
    pub(crate) fn of(job: &'a Job) -> Self {
        let placed = job.state.rank() < JobState::Running.rank();
        Self {
            run_id: job.run_id.as_str(),
            state: job.state,
            build: job.build.as_ref(),
            waiting: waiting(job),
            queue_position: job.queue_position.filter(|_| placed),
            expected_start: job.expected_start.filter(|_| placed).map(rfc3339),
            cached_from: job.cached_from.as_ref().map(|r| r.as_str()),
            verdict: job.outcome.as_ref().map(|o| o.verdict),
        }
    }
}

/// `POST /submissions/{run_id}/cancel`.
#[derive(Serialize)]
pub(crate) struct CanceledView<'a> {
    run_id: &'a str,
    state: JobState,
}

impl<'a> CanceledView<'a> {
    pub(crate) fn of(job: &'a Job) -> Self {
        Self {
            run_id: job.run_id.as_str(),
            state: job.state,
        }
    }
}

/// `POST /webhooks/buildkite`: what the event did.
#[derive(Serialize)]
pub(crate) struct EventView {
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<JobState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ignored: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    agent: Option<&'static str>,
    /// `job.finished`: the try was noted on its job.
    #[serde(rename = "try", skip_serializing_if = "Option::is_none")]
    tried: Option<&'static str>,
}

impl EventView {
    pub(crate) fn advanced(state: JobState) -> Self {
        Self {
            ok: true,
            state: Some(state),
            ignored: None,
            agent: None,
            tried: None,
        }
    }

    pub(crate) fn ignored(reason: &'static str) -> Self {
        Self {
            ok: true,
            state: None,
            ignored: Some(reason),
            agent: None,
            tried: None,
        }
    }

    /// An agent event of one of our queues, noted on the agent's record.
    pub(crate) fn agent_noted() -> Self {
        Self {
            ok: true,
            state: None,
            ignored: None,
            agent: Some("noted"),
            tried: None,
        }
    }

    /// A try of the evaluation step, noted on its job for the build's end.
    pub(crate) fn try_noted() -> Self {
        Self {
            ok: true,
            state: None,
            ignored: None,
            agent: None,
            tried: Some("noted"),
        }
    }
}

/// `GET /queues/{gpu}`.
#[derive(Serialize)]
pub(crate) struct QueueView<'a> {
    gpu: &'a str,
    queue: &'a str,
    agents: AgentsView<'a>,
    jobs: JobsView,
    oldest_queued_secs: Option<u64>,
}

#[derive(Serialize)]
struct AgentsView<'a> {
    total: usize,
    idle: usize,
    busy: usize,
    paused: usize,
    list: Vec<AgentView<'a>>,
}

#[derive(Serialize)]
struct AgentView<'a> {
    name: &'a str,
    busy: bool,
    paused: bool,
}

#[derive(Serialize)]
struct JobsView {
    queued: usize,
    running: usize,
    background: usize,
}

impl<'a> QueueView<'a> {
    pub(crate) fn of(s: &'a QueueStatus) -> Self {
        let agents = &s.agents;
        Self {
            gpu: &s.gpu,
            queue: &s.queue,
            agents: AgentsView {
                total: agents.total,
                idle: agents.idle,
                busy: agents.busy,
                paused: agents.paused,
                list: agents
                    .list
                    .iter()
                    .map(|a| AgentView {
                        name: &a.name,
                        busy: a.busy,
                        paused: a.paused,
                    })
                    .collect(),
            },
            jobs: JobsView {
                queued: s.jobs.queued,
                running: s.jobs.running,
                background: s.jobs.background,
            },
            oldest_queued_secs: s.oldest_queued_secs,
        }
    }
}

/// Every error: `{"error": "<code>", "message": "<text>"}`, with the field a 422
/// `invalid_config` names.
#[derive(Serialize)]
pub(crate) struct ErrorBody {
    pub(crate) error: &'static str,
    pub(crate) message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) field: Option<String>,
}

/// `GET /fleet`: every agent of our queues.
#[derive(Serialize)]
pub(crate) struct FleetView {
    pub(crate) agents: Vec<crate::flow::fleet::FleetAgent>,
}
