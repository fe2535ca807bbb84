//! The outboxes: sending a job's Discord status and its signed callbacks until nothing is
//! owed. Both run side by side; each is a compare-and-swap on its own part of the job.
//!
//! A sender first takes the job's message (a lease, by compare-and-swap), renders the job as
//! it is then, sends, and records what Discord said. Only one sender holds a message at a
//! time, so a render of an older state can never land after a newer one; a state that
//! arrives while a render is in flight is owed afterwards, and the holder sends it next.
//! Whatever is left (no time, Discord down, the holder died) the sweep sends later.

use tracing::{info, warn};

use super::Dispatcher;
use super::rules::{self, Answered, LEASE_SLACK_MS, Sent};
use crate::callback::CallbackError;
use crate::discord::{DiscordError, render};
use crate::jobs::{Job, StoreError, Updated, update_seen};
use crate::retry::Deadline;

/// Renders one sender sends in one go at most (each state once, and a repost).
const MAX_SENDS: usize = 6;

/// A send is only started with time left for its record after it.
const RECORD_RESERVE: std::time::Duration = std::time::Duration::from_secs(2);

fn sent_of(result: Result<Option<String>, DiscordError>) -> Sent {
    match result {
        Ok(posted) => Sent::Accepted { posted },
        Err(DiscordError::MessageGone { .. }) => Sent::MessageGone,
        Err(e @ DiscordError::Gone { .. }) => Sent::TargetGone(e.to_string()),
        Err(e @ DiscordError::Rejected { .. }) => Sent::Refused(e.to_string()),
        Err(e @ DiscordError::Unavailable { .. }) => Sent::Transient(e.to_string()),
    }
}

impl Dispatcher {
    /// Drives both outboxes of the job within `deadline`, starting from `seen` (the job as
    /// last read or written: a stale one costs a refused write, not a wrong send); returns
    /// the job as last seen.
    pub async fn deliver(&self, seen: &Job, deadline: Deadline) -> Result<Option<Job>, StoreError> {
        let (discord, callback) = tokio::join!(
            self.deliver_discord(seen, deadline),
            self.deliver_callback(seen, deadline)
        );
        let newest = [discord?, callback?]
            .into_iter()
            .flatten()
            .max_by_key(|j| j.version);
        Ok(newest)
    }

    /// Drives the job's callback outbox within `deadline`; returns the job as last seen.
    pub async fn deliver_callback(
        &self,
        seen: &Job,
        deadline: Deadline,
    ) -> Result<Option<Job>, StoreError> {
        // A job's outboxes are set when it is created: one without never owes (and a fresh
        // read to confirm that would be wasted).
        if seen.callback.is_none() {
            return Ok(Some(seen.clone()));
        }
        let Some(sender) = &self.callbacks else {
            return Ok(
                update_seen(self.store.as_ref(), seen, rules::abandon_callback)
                    .await?
                    .job(),
            );
        };
        let run_id = &seen.run_id;
        let owner = uuid::Uuid::new_v4().simple().to_string();
        let mut last = None;
        let mut current = seen.clone();
        for _ in 0..MAX_SENDS {
            if deadline.remaining() < sender.timeout() + RECORD_RESERVE {
                info!(%run_id, "no time left for the callback; the sweep will send it");
                break;
            }
            let now = self.clock.now();
            let until = now + deadline.remaining().as_millis() as i64 + LEASE_SLACK_MS;
            let claimed = update_seen(self.store.as_ref(), &current, |j| {
                rules::claim_callback(j, &owner, now, until)
            })
            .await?;
            let job = match claimed {
                Updated::Written(job) => job,
                other => return Ok(other.job().or(last)),
            };
            let answer = match crate::callback::event::render(&job) {
                Some(event) => match sender.send(&event, deadline).await {
                    Ok(()) => Answered::Accepted,
                    Err(CallbackError::Gone) => Answered::Gone,
                    Err(e) => Answered::Failed(e.to_string()),
                },
                None => Answered::Failed("the callback could not be rendered".into()),
            };
            if let Answered::Failed(e) = &answer {
                warn!(%run_id, state = %job.state, error = %e, "the callback was not accepted");
            }
            let sent = job.state;
            let after = update_seen(self.store.as_ref(), &job, |j| {
                rules::record_callback(j, &owner, sent, &answer, self.clock.now())
            })
            .await?
            .job();
            let again =
                after.as_ref().is_some_and(Job::owes_callback) && answer == Answered::Accepted;
            last = after;
            match &last {
                Some(after) if again => current = after.clone(),
                _ => break,
            }
        }
        Ok(last)
    }

    /// Drives the job's Discord outbox within `deadline`; returns the job as last seen.
    pub async fn deliver_discord(
        &self,
        seen: &Job,
        deadline: Deadline,
    ) -> Result<Option<Job>, StoreError> {
        if seen.discord.is_none() {
            return Ok(Some(seen.clone()));
        }
        let run_id = &seen.run_id;
        let owner = uuid::Uuid::new_v4().simple().to_string();
        let mut last = None;
        let mut current = seen.clone();
        for _ in 0..MAX_SENDS {
            if deadline.remaining() < self.discord.timeout() + RECORD_RESERVE {
                info!(%run_id, "no time left for Discord; the sweep will send");
                break;
            }
            let now = self.clock.now();
            let until = now + deadline.remaining().as_millis() as i64 + LEASE_SLACK_MS;
            let claimed = update_seen(self.store.as_ref(), &current, |j| {
                rules::claim(j, &owner, now, until)
            })
            .await?;
            let job = match claimed {
                Updated::Written(job) => job,
                // Nothing owed, or another sender holds the message (and sends what is owed).
                other => return Ok(other.job().or(last)),
            };
            let sent = self.send_render(&job, deadline).await;
            if let Sent::Transient(e) | Sent::Refused(e) | Sent::TargetGone(e) = &sent {
                warn!(%run_id, state = %job.state, error = %e, "Discord did not take the status");
            }
            let rendered = job.state;
            let after = update_seen(self.store.as_ref(), &job, |j| {
                rules::record(j, &owner, rendered, &sent, self.clock.now())
            })
            .await?
            .job();
            let again = after.as_ref().is_some_and(Job::owes_discord)
                && matches!(sent, Sent::Accepted { .. } | Sent::MessageGone);
            last = after;
            match &last {
                Some(after) if again => current = after.clone(),
                _ => break,
            }
        }
        Ok(last)
    }

    /// Posts the job's status message, or edits it if it exists.
    async fn send_render(&self, job: &Job, deadline: Deadline) -> Sent {
        let Some(outbox) = job.discord.as_ref() else {
            return Sent::Refused("no Discord target".into());
        };
        let Some(target) = outbox.target.as_ref() else {
            return Sent::Refused("no Discord target".into());
        };
        let message = render(job);
        let result = match &outbox.message_id {
            Some(id) => self
                .discord
                .edit(target, id, &message, deadline)
                .await
                .map(|()| None),
            None => self
                .discord
                .post(target, &message, deadline)
                .await
                .map(Some),
        };
        sent_of(result)
    }
}
