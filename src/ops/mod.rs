//! The operator's command (`kernelbot-dispatch`): what an operator reads and does during a
//! season, on the same store and with the same configuration as the functions. Reading
//! (`jobs`, `show`) is here; acting goes through the flow's own arrows (resend, replay,
//! cancel, reconcile), so an operator can do nothing the service would not.

mod command;
mod table;

use std::time::Duration;

use serde_json::{Value, json};

use crate::flow::Deps;
use crate::flow::rules::outbox::NotReopened;
use crate::jobs::{Channel, Delivery, Job, JobState, Listed, RunId, Shard, StoreError, Target};
use crate::time::{Millis, rfc3339};

pub use command::{Command, Confirm, OpsError, act, since};
pub use table::{fleet_table, jobs_table};

/// Which jobs `kernelbot-dispatch jobs` lists.
#[derive(Clone, Debug, Default)]
pub struct JobsQuery {
    pub state: Option<JobState>,
    pub queue: Option<String>,
    /// Only jobs submitted at least this long ago.
    pub older_than: Option<Duration>,
}

/// How many jobs one listing reads at most: a season's open jobs and owed messages fit.
const MAX_LISTED: usize = 10_000;
const PAGE: usize = 500;

/// The jobs the store can list by partition, oldest first: every open job, and the ended
/// ones still owing a message or with one given up (an ended job that owes nothing is only
/// found by its run id: `show`).
pub async fn jobs(d: &Deps, query: &JobsQuery, now: Millis) -> Result<Vec<Listed>, StoreError> {
    let ended = query.state.is_none_or(JobState::is_terminal);
    let shards: &[Shard] = if ended {
        &[Shard::Open, Shard::Outbox, Shard::GivenUp]
    } else {
        &[Shard::Open]
    };
    let mut rows = Vec::new();
    for shard in shards {
        rows.extend(all_of(d, *shard, 0).await?);
    }
    let cutoff = query
        .older_than
        .map_or(Millis::MAX, |age| now - age.as_millis() as Millis);
    rows.retain(|j| {
        query.state.is_none_or(|s| j.state == s)
            && query.queue.as_ref().is_none_or(|q| j.queue == q.as_str())
            && j.created_at <= cutoff
    });
    rows.sort_by(|a, b| (a.created_at, a.run_id.as_str()).cmp(&(b.created_at, b.run_id.as_str())));
    Ok(rows)
}

/// The jobs whose delivery was given up, from `since` on (as `replay` goes over them).
pub(crate) async fn given_up_since(d: &Deps, since: Millis) -> Result<Vec<Listed>, StoreError> {
    all_of(d, Shard::GivenUp, since).await
}

/// The jobs as `jobs --json` prints them: what the table shows, times in RFC 3339.
pub(crate) fn jobs_json(jobs: &[Listed]) -> Vec<Value> {
    let word = |j: &Listed, c: Channel| standing(j.delivery(c), j.owes(c));
    jobs.iter()
        .map(|j| {
            json!({
                "run_id": j.run_id.as_str(),
                "state": j.state.as_str(),
                "queue": j.queue.to_string(),
                "created_at": rfc3339(j.created_at),
                "build": j.build.as_ref().map(|b| b.number),
                "discord": word(j, Channel::Discord),
                "callback": word(j, Channel::Callback),
            })
        })
        .collect()
}

/// Every job of one partition from `from` on, a page at a time.
async fn all_of(d: &Deps, shard: Shard, from: Millis) -> Result<Vec<Listed>, StoreError> {
    let mut rows: Vec<Listed> = Vec::new();
    let mut from = from;
    loop {
        let page = d.store.list(shard, from, PAGE).await?;
        let full = page.len() == PAGE;
        for job in page.jobs {
            if !rows.iter().rev().take(PAGE).any(|r| r.run_id == job.run_id) {
                rows.push(job);
            }
        }
        match page.last {
            Some((last, _)) if full && last != from && rows.len() < MAX_LISTED => from = last,
            _ => return Ok(rows),
        }
    }
}

/// One job as an operator reads it: everything but the result itself and the secrets (a
/// webhook the submission named shows as `"named"`, never its URL).
pub async fn show(d: &Deps, run_id: &RunId) -> Result<Option<Value>, StoreError> {
    Ok(d.store.get(run_id).await?.map(|job| job_view(&job)))
}

fn delivery_view(d: Option<&Delivery>) -> Value {
    d.map_or(Value::Null, |d| {
        json!({
            "status": d.status.as_str(),
            "attempts": d.attempts,
            "pending_since": d.pending_since.map(rfc3339),
            "last_error": d.last_error,
        })
    })
}

fn job_view(job: &Job) -> Value {
    let outcome = job.outcome.as_deref();
    let mut discord = delivery_view(job.delivery(Channel::Discord));
    if let (Some(o), Value::Object(view)) = (&job.discord, &mut discord) {
        let target = match o.target {
            Some(Target::Default) => Some("default"),
            Some(Target::Webhook(_)) => Some("named"),
            None => None,
        };
        view.insert("target".into(), json!(target));
        view.insert("message_id".into(), json!(o.message_id));
    }
    json!({
        "run_id": job.run_id.as_str(),
        "state": job.state.as_str(),
        "gpu": job.gpu,
        "queue": job.queue,
        "title": job.title,
        "created_at": rfc3339(job.created_at),
        "updated_at": rfc3339(job.updated_at),
        "build": job.build.as_ref().map(|b| json!({"number": b.number, "url": b.web_url})),
        "cancel_requested": job.cancel_requested,
        "failure": job.failure,
        "build_state": outcome.map(|o| o.build_state.as_str()),
        "verdict": outcome.map(|o| o.verdict),
        "error": outcome.and_then(|o| o.error.as_deref()),
        "discord": discord,
        "callback": delivery_view(job.delivery(Channel::Callback)),
    })
}

/// Why a receiver was left out of a resend, in an operator's words.
pub fn not_reopened(channel: Channel, why: NotReopened) -> String {
    let receiver = match channel {
        Channel::Discord => "Discord",
        Channel::Callback => "callback",
    };
    let why = match why {
        NotReopened::NotEnded => "the job has not ended",
        NotReopened::NoReceiver => "the job reports to none",
        NotReopened::WebhookForgotten => "the webhook the submission named is no longer kept",
        NotReopened::Unconfigured => {
            "no such receiver configured here: set it as the functions have it"
        }
    };
    format!("{receiver}: not sent ({why})")
}

/// How a receiver's message stands, in one word: `None` when the job has no such receiver.
pub(crate) fn standing(delivery: Option<&Delivery>, owed: bool) -> Option<&'static str> {
    delivery.map(|d| if owed { "owed" } else { d.status.as_str() })
}

/// How the job's message to `channel` stands, in one word.
pub(crate) fn delivery_word(job: &Job, channel: Channel) -> &'static str {
    standing(job.delivery(channel), job.owes(channel)).unwrap_or("none")
}
