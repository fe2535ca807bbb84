//! An operator sends an ended job's final messages again: its report (the same Discord
//! message, edited) and its signed callback (the same message id, so kernelbot keeps one).
//! Used to repair what a receiver lost or refused, and to replay every delivery given up
//! since a time, once the receiver is back.

use std::collections::BTreeSet;

use super::rules::outbox::{NotReopened, reopen};
use super::{Deps, DispatchError, settle};
use crate::jobs::{Channel, Job, JobState, RunId, Shard, Target, Updated, View, update};
use crate::retry::Deadline;
use crate::time::Millis;

/// What a resend did.
#[derive(Debug)]
pub enum Resent {
    Unknown,
    /// The job has not ended: its messages are still on their way.
    NotEnded(JobState),
    /// The messages were owed again and sent (as far as the deadline allowed): the job as
    /// last seen, and the receivers that could not be sent to, with why.
    Sent {
        job: Box<Job>,
        skipped: Vec<(Channel, NotReopened)>,
    },
}

/// Whether this configuration can send `job`'s message to `channel` at all: an operator's
/// shell without `CALLBACK_URL` or the default webhook must not give a message up.
fn configured(d: &Deps, job: &Job, channel: Channel) -> bool {
    match channel {
        Channel::Callback => d.callbacks.is_some(),
        Channel::Discord => job.discord.as_ref().is_none_or(|o| {
            !matches!(o.target, Some(Target::Default)) || d.config.discord.default_webhook.is_some()
        }),
    }
}

/// Owes every receiver of `job` its final message again: the job, and the receivers left
/// out with why. `None` when there is nothing to send again.
fn reopen_all(d: &Deps, job: &Job) -> (Option<Job>, Vec<(Channel, NotReopened)>) {
    let mut next: Option<Job> = None;
    let mut skipped = Vec::new();
    for channel in Channel::ALL {
        let reopened = if configured(d, job, channel) {
            reopen(next.as_ref().unwrap_or(job), channel)
        } else if job.delivery(channel).is_some() {
            Err(NotReopened::Unconfigured)
        } else {
            Err(NotReopened::NoReceiver)
        };
        match reopened {
            Ok(j) => next = Some(j),
            // A receiver the job never had is nothing to report.
            Err(NotReopened::NoReceiver) => {}
            Err(why) => skipped.push((channel, why)),
        }
    }
    (next, skipped)
}

/// Sends `run_id`'s final messages again within `deadline`.
pub async fn resend(d: &Deps, run_id: &RunId, deadline: Deadline) -> Result<Resent, DispatchError> {
    let mut skipped = Vec::new();
    let updated = update(d.store.as_ref(), run_id, |j| {
        let (next, left_out) = reopen_all(d, j);
        skipped = left_out;
        next
    })
    .await?;
    let job = match updated {
        Updated::Missing => return Ok(Resent::Unknown),
        Updated::Unchanged(j) if !j.state.is_terminal() => return Ok(Resent::NotEnded(j.state)),
        Updated::Unchanged(j) | Updated::Written(j) => j,
    };
    let job = settle::deliver(d, (&job, View::Own), deadline)
        .await?
        .unwrap_or(job);
    Ok(Resent::Sent {
        job: Box::new(job),
        skipped,
    })
}

/// Jobs listed a page at a time while replaying.
const PAGE: usize = 100;

/// What a replay did: each run reached and what came of it (one failing does not stop the
/// others), and how many given-up runs it listed but had no time left for.
#[derive(Debug, Default)]
pub struct Replayed {
    pub runs: Vec<(RunId, Result<Resent, DispatchError>)>,
    pub not_reached: usize,
}

/// Sends again every final message given up for jobs submitted since `since`, oldest
/// first, within `deadline`; each run's sends are held to a slice of it, as in a sweep pass,
/// so one hung receiver cannot take the whole replay.
pub async fn replay_given_up(
    d: &Deps,
    since: Millis,
    deadline: Deadline,
) -> Result<Replayed, DispatchError> {
    let d = &super::sweep::sliced(d);
    let mut replayed = Replayed::default();
    let mut seen = BTreeSet::new();
    let mut from = since;
    loop {
        let page = d.store.list(Shard::GivenUp, from, PAGE).await?;
        for listed in &page.jobs {
            if !seen.insert(listed.run_id.as_str().to_owned()) {
                continue;
            }
            if deadline.remaining().is_zero() {
                replayed.not_reached += 1;
                continue;
            }
            let resent = resend(d, &listed.run_id, deadline).await;
            replayed.runs.push((listed.run_id.clone(), resent));
        }
        // A full page goes on from its last job (ties at that millisecond are read again
        // and skipped); the same start twice means no progress.
        match page.last {
            Some((last, _)) if page.len() == PAGE && last != from => from = last,
            _ => return Ok(replayed),
        }
    }
}
