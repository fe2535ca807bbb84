//! A job's outboxes: its Discord status message and its signed callbacks. Both keep one
//! [`Delivery`] (where the message owed now stands, who holds it, how its tries went), and
//! only the current state is ever owed: an earlier one still pending is dropped once a later
//! one is accepted.

use std::fmt;
use std::str::FromStr;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use super::state::JobState;
use crate::time::Millis;

/// Where a job stands with one receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Messages may still be owed (see [`Delivery::owes`]).
    Active,
    /// The receiver accepted the final message; nothing more is ever sent.
    Delivered,
    /// The receiver is gone (a deleted webhook, a 410): nothing more can be sent.
    Gone,
    /// The final message could not be delivered (24 h of failures, or refused for good).
    GivenUp,
}

impl DeliveryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Delivered => "delivered",
            Self::Gone => "gone",
            Self::GivenUp => "given_up",
        }
    }
}

/// A stored delivery status this version does not know.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown delivery status {0:?}")]
pub struct UnknownStatus(String);

impl FromStr for DeliveryStatus {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "active" => Self::Active,
            "delivered" => Self::Delivered,
            "gone" => Self::Gone,
            "given_up" => Self::GivenUp,
            other => return Err(UnknownStatus(other.to_owned())),
        })
    }
}

/// A sender's exclusive hold on one receiver's message: one sender at a time, so an older
/// message can never land after a newer one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub owner: String,
    pub until: Millis,
}

/// The two receivers a job reports to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// The status message in a Discord channel.
    Discord,
    /// Signed callbacks to `CALLBACK_URL`.
    Callback,
}

impl Channel {
    pub const ALL: [Self; 2] = [Self::Discord, Self::Callback];
}

/// How the message owed to one receiver is going.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    pub status: DeliveryStatus,
    /// Rank of the newest job state whose message the receiver accepted.
    pub accepted: Option<u8>,
    /// Failed tries of the message now owed.
    pub attempts: u32,
    /// When the message now owed first failed (the 24 h give-up clock).
    pub pending_since: Option<Millis>,
    pub last_error: Option<String>,
    pub lease: Option<Lease>,
}

impl Default for Delivery {
    fn default() -> Self {
        Self {
            status: DeliveryStatus::Active,
            accepted: None,
            attempts: 0,
            pending_since: None,
            last_error: None,
            lease: None,
        }
    }
}

impl Delivery {
    /// Whether the message of a job state of `rank` is still owed.
    pub fn owes(&self, rank: u8) -> bool {
        self.status == DeliveryStatus::Active && self.accepted.is_none_or(|a| a < rank)
    }

    /// Whether another sender holds the message at `now`.
    pub(crate) fn held_at(&self, now: Millis) -> bool {
        self.lease.as_ref().is_some_and(|l| l.until > now)
    }

    /// A new state owes a new message: its own tries, its own 24 hours.
    pub(crate) fn restart(&mut self) {
        self.attempts = 0;
        self.pending_since = None;
        self.last_error = None;
    }

    /// One more failed try of the message now owed.
    pub(crate) fn fail(&mut self, error: &str, now: Millis) {
        self.attempts += 1;
        self.last_error = Some(error.to_owned());
        self.pending_since.get_or_insert(now);
    }

    /// How long the message now owed has been failing, at `now`.
    pub(crate) fn failing_for(&self, now: Millis) -> Millis {
        self.pending_since.map_or(0, |since| now - since)
    }
}

/// A Discord webhook as a job keeps it: its id, its token (a credential: anyone holding it
/// can post as the webhook, so it is never printed), and the thread to post into.
#[derive(Clone)]
pub struct WebhookAddress {
    pub webhook_id: String,
    pub token: SecretString,
    pub thread_id: Option<String>,
}

impl PartialEq for WebhookAddress {
    fn eq(&self, other: &Self) -> bool {
        self.webhook_id == other.webhook_id
            && self.token.expose_secret() == other.token.expose_secret()
            && self.thread_id == other.thread_id
    }
}

impl fmt::Debug for WebhookAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookAddress")
            .field("webhook_id", &self.webhook_id)
            .field("token", &"[redacted]")
            .field("thread_id", &self.thread_id)
            .finish()
    }
}

/// Where a job's Discord message goes.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// The deployment's default webhook (`DISCORD_WEBHOOK_URL`), looked up when sending: its
    /// token stays in the deployment's secret, out of every job record.
    Default,
    /// A webhook the submission named.
    Webhook(WebhookAddress),
}

/// The job's Discord outbox: the one status message and what it still owes.
#[derive(Clone, Debug, PartialEq)]
pub struct DiscordOutbox {
    /// `None` once nothing more will be sent: a webhook token is not kept longer than needed.
    pub target: Option<Target>,
    pub message_id: Option<String>,
    /// Discord refused the message of this rank for good (a 4xx): not retried until the job
    /// moves on.
    pub refused: Option<u8>,
    pub delivery: Delivery,
}

impl DiscordOutbox {
    pub fn new(target: Target) -> Self {
        Self {
            target: Some(target),
            message_id: None,
            refused: None,
            delivery: Delivery::default(),
        }
    }

    /// Whether the message of a job in `state` is still owed.
    pub fn owes(&self, state: JobState) -> bool {
        let rank = state.rank();
        self.delivery.owes(rank) && self.target.is_some() && self.refused != Some(rank)
    }
}

/// Whether a job in `state` with these outboxes owes a message to `channel`.
pub(crate) fn owes(
    discord: Option<&DiscordOutbox>,
    callback: Option<&CallbackOutbox>,
    state: JobState,
    channel: Channel,
) -> bool {
    match channel {
        Channel::Discord => discord.is_some_and(|o| o.owes(state)),
        Channel::Callback => callback.is_some_and(|c| c.owes(state)),
    }
}

/// How the message to `channel` is going, for a job with these outboxes.
pub(crate) fn delivery<'a>(
    discord: Option<&'a DiscordOutbox>,
    callback: Option<&'a CallbackOutbox>,
    channel: Channel,
) -> Option<&'a Delivery> {
    match channel {
        Channel::Discord => discord.map(|o| &o.delivery),
        Channel::Callback => callback.map(|c| &c.delivery),
    }
}

/// The job's signed callbacks: `submitted` sends none; every later state sends one.
#[derive(Clone, Debug, PartialEq)]
pub struct CallbackOutbox {
    /// When the job entered its current state: the callback's `timestamp`.
    pub entered_at: Millis,
    pub delivery: Delivery,
}

impl CallbackOutbox {
    pub fn new(now: Millis) -> Self {
        Self {
            entered_at: now,
            delivery: Delivery::default(),
        }
    }

    /// Whether the callback of a job in `state` is still owed.
    pub fn owes(&self, state: JobState) -> bool {
        state != JobState::Submitted && self.delivery.owes(state.rank())
    }
}
