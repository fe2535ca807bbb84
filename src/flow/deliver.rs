//! The outboxes: sending a job's Discord status and its signed callbacks until nothing is
//! owed. Both run side by side, the same way; each is a compare-and-swap on its own part of
//! the job (see [`rules::outbox`](super::rules::outbox)).
//!
//! A sender first takes the job's message (a lease), renders the job as it is then, sends,
//! and records the answer. Only one sender holds a message at a time, so an older state can
//! never land after a newer one; a state that arrives while a message is in flight is owed
//! afterwards, and the holder sends it next. Whatever is left (no time, the receiver down,
//! the holder died) the sweep sends later.

use std::time::Duration;

use tracing::{info, warn};

use super::Deps;
use super::present;
use super::rules::outbox::{self, Answer, LEASE_SLACK_MS};
use crate::callback::CallbackError;
use crate::discord::{DiscordError, Priority};
use crate::jobs::{
    Channel, DeliveryStatus, Job, JobState, StoreError, Updated, View, update_from, update_seen,
};
use crate::retry::Deadline;
use crate::telemetry::metrics::Unit;

/// Messages one sender sends in one go at most (each state once, and a repost).
const MAX_SENDS: usize = 6;

/// A send is only started with time left for its record after it.
const RECORD_RESERVE: Duration = Duration::from_secs(2);

/// Drives both outboxes of the job within `deadline`, starting from `seen` (the job as last
/// read or written: a stale one costs a refused write, not a wrong send; the caller's own
/// view spares a read when another sender holds the message or nothing is owed); returns the
/// job as last seen. (The fleet's notes of an ended job's tries are made around this by
/// `settle`, which runs every delivery the arrows owe.)
pub async fn deliver(
    d: &Deps,
    seen: (&Job, View),
    deadline: Deadline,
) -> Result<Option<Job>, StoreError> {
    let (discord, callback) = tokio::join!(
        drain(d, Channel::Discord, seen, deadline),
        drain(d, Channel::Callback, seen, deadline)
    );
    let newest = [discord?, callback?]
        .into_iter()
        .flatten()
        .max_by_key(|j| j.version);
    Ok(newest)
}

/// The receiver's name, for logs.
fn name(channel: Channel) -> &'static str {
    match channel {
        Channel::Discord => "Discord",
        Channel::Callback => "the callback receiver",
    }
}

/// The outbox to `channel` driven within `deadline`; the job as last seen.
pub(crate) async fn drain(
    d: &Deps,
    channel: Channel,
    (seen, view): (&Job, View),
    deadline: Deadline,
) -> Result<Option<Job>, StoreError> {
    // A job's outboxes are set when it is created: one without never owes (and a fresh
    // read to confirm that would be wasted).
    if seen.delivery(channel).is_none() {
        return Ok(Some(seen.clone()));
    }
    let Some(call_timeout) = timeout(d, channel) else {
        let reason = "CALLBACK_URL is no longer set";
        let abandoned = update_seen(d.store.as_ref(), seen, |j| {
            outbox::abandon(j, channel, reason)
        });
        let after = abandoned.await?.job();
        count_given_up(d, channel, seen, after.as_ref());
        return Ok(after);
    };
    let deadline = d.send_slice.map_or(deadline, |span| deadline.within(span));
    let owner = uuid::Uuid::new_v4().simple().to_string();
    let (mut last, mut current) = (None, (seen.clone(), view));
    for _ in 0..MAX_SENDS {
        if deadline.remaining() < call_timeout + RECORD_RESERVE {
            info!(run_id = %seen.run_id, receiver = name(channel), "no time left; the sweep will send");
            break;
        }
        let now = d.clock.now();
        let until = now + deadline.remaining().as_millis() as i64 + LEASE_SLACK_MS;
        let claimed = update_from(d.store.as_ref(), &current.0, current.1, |j| {
            outbox::claim(j, channel, &owner, now, until)
        })
        .await?;
        let job = match claimed {
            Updated::Written(job) => job,
            // Nothing owed, or another sender holds the message (and sends what is owed).
            other => return Ok(other.job().or(last)),
        };
        // Every try of the send ends with time left to record what it did.
        let answer = send(d, channel, &job, deadline.less(RECORD_RESERVE)).await;
        let after = record(d, channel, &owner, &job, &answer).await?;
        let again = after.as_ref().is_some_and(|j| j.owes(channel))
            && matches!(answer, Answer::Accepted { .. } | Answer::MessageGone);
        last = after;
        match &last {
            // As this sender's record wrote it (or read it, refused).
            Some(after) if again => current = (after.clone(), View::Own),
            _ => break,
        }
    }
    Ok(last)
}

/// The time one try to `channel` may take; `None` when no such receiver is configured.
fn timeout(d: &Deps, channel: Channel) -> Option<Duration> {
    match channel {
        Channel::Discord => Some(d.discord.timeout()),
        Channel::Callback => d.callbacks.as_ref().map(|c| c.timeout()),
    }
}

/// Records what the receiver said to the message of `job` (as it was sent).
async fn record(
    d: &Deps,
    channel: Channel,
    owner: &str,
    job: &Job,
    answer: &Answer,
) -> Result<Option<Job>, StoreError> {
    if let Answer::Failed(e) | Answer::Refused(e) | Answer::Gone(e) = answer {
        warn!(run_id = %job.run_id, state = %job.state, receiver = name(channel), error = %e,
            "the message was not accepted");
    }
    let sent = job.state;
    let now = d.clock.now();
    let written = update_seen(d.store.as_ref(), job, |j| {
        outbox::record(j, channel, owner, sent, answer, now)
    });
    let after = written.await?.job();
    count_given_up(d, channel, job, after.as_ref());
    if let (Channel::Discord, Answer::Accepted { .. }) = (channel, answer) {
        time_final_report(d, job, now);
    }
    Ok(after)
}

/// How long after its build ended a final report reached Discord (the build's end: its
/// creation plus the queued and run times Buildkite gave), for the dashboard.
fn time_final_report(d: &Deps, job: &Job, now: crate::time::Millis) {
    let timings = job.outcome.as_ref().and_then(|o| o.timings);
    let (Some(created), Some(t)) = (job.scheduled_at, timings) else {
        return;
    };
    let (Some(queued), Some(ran)) = (t.queued_secs, t.ran_secs) else {
        return;
    };
    let ended = created as f64 / 1e3 + queued + ran;
    let latency = (now as f64 / 1e3 - ended).max(0.0);
    d.metrics
        .put(&[], &[("ReportLatency", Unit::Seconds, latency)]);
}

/// A message given up is counted where it happens, in whichever function (the alarms sum
/// them): a Discord refusal in the webhook function gives a report up at once.
fn count_given_up(d: &Deps, channel: Channel, before: &Job, after: Option<&Job>) {
    let given_up = |j: &Job| {
        j.delivery(channel)
            .is_some_and(|x| x.status == DeliveryStatus::GivenUp)
    };
    if after.is_some_and(given_up) && !given_up(before) {
        let receiver = match channel {
            Channel::Discord => "discord",
            Channel::Callback => "callback",
        };
        let counted = [("DeliveriesGivenUp", Unit::Count, 1.0)];
        d.metrics.put(&[("Channel", receiver)], &counted);
    }
}

/// Sends the job as it is to `channel`: what the receiver said.
async fn send(d: &Deps, channel: Channel, job: &Job, deadline: Deadline) -> Answer {
    match channel {
        Channel::Discord => send_discord(d, job, deadline).await,
        Channel::Callback => send_callback(d, job, deadline).await,
    }
}

/// How a job's message ranks in its webhook's bucket: the final report first, then a first
/// message, then a build created or started; an edit of a job still waiting only shows its
/// place.
fn priority(state: JobState, posted: bool) -> Priority {
    if state.is_terminal() {
        Priority::Final
    } else if !posted {
        Priority::First
    } else if state.rank() >= JobState::Scheduled.rank() {
        Priority::Start
    } else {
        Priority::Place
    }
}

/// Posts the job's status message, or edits it if it exists.
async fn send_discord(d: &Deps, job: &Job, deadline: Deadline) -> Answer {
    let Some((outbox, target)) = job
        .discord
        .as_ref()
        .and_then(|o| Some((o, o.target.as_ref()?)))
    else {
        return Answer::Refused("no Discord target".into());
    };
    let Some(target) = d.discord_target(target) else {
        return Answer::Gone("DISCORD_WEBHOOK_URL is no longer set".into());
    };
    let message = present::render(job);
    let priority = priority(job.state, outbox.message_id.is_some());
    let result = match &outbox.message_id {
        Some(id) => d
            .discord
            .edit((&target, priority), id, &message, deadline)
            .await
            .map(|()| None),
        None => d
            .discord
            .post((&target, priority), &message, deadline)
            .await
            .map(Some),
    };
    match result {
        Ok(posted) => Answer::Accepted { posted },
        Err(DiscordError::MessageGone { .. }) => Answer::MessageGone,
        Err(e @ DiscordError::Gone { .. }) => Answer::Gone(e.to_string()),
        Err(e @ DiscordError::Rejected { .. }) => Answer::Refused(e.to_string()),
        // Only a waiting job's place meets this: its message keeps the place it shows (true
        // when shown) until the next move, start or report, with nothing owed, counted or
        // alarmed meanwhile.
        Err(DiscordError::NoRoom { .. }) => Answer::Accepted { posted: None },
        Err(e @ (DiscordError::Unavailable { .. } | DiscordError::Unconfirmed { .. })) => {
            Answer::Failed(e.to_string())
        }
    }
}

/// Posts the callback of the job's state, signed.
async fn send_callback(d: &Deps, job: &Job, deadline: Deadline) -> Answer {
    let (Some(sender), Some(event)) = (&d.callbacks, present::callback::render(job)) else {
        return Answer::Failed("the callback could not be rendered".into());
    };
    match sender.send(&event, deadline).await {
        Ok(()) => Answer::Accepted { posted: None },
        Err(CallbackError::Gone) => Answer::Gone("the receiver answered 410 Gone".into()),
        Err(e) => Answer::Failed(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_ranks_by_what_it_tells() {
        use JobState::*;
        use Priority::*;
        // (state, posted already, priority)
        let cases = [
            (Submitted, false, First),
            (Scheduled, false, First),
            (Finished, false, Final),
            (Failed, false, Final),
            (Submitted, true, Place),
            (Scheduled, true, Start),
            (Running, true, Start),
            (Finished, true, Final),
            (Failed, true, Final),
        ];
        for (state, posted, expected) in cases {
            assert_eq!(
                priority(state, posted),
                expected,
                "{state:?}, posted {posted}"
            );
        }
    }
}
