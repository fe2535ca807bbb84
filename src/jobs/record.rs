//! The flat form a job takes in a store, shared by both implementations. Its field names are
//! the stored format: records written by earlier versions must keep reading.
//!
//! The outcome is kept in its stored form (see [`super::outcome`]).

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::listed::Listed;
use super::model::{BuildRef, Creation, Job, SeenTry};
use super::outbox::{
    CallbackOutbox, Delivery, DeliveryStatus, DiscordOutbox, Lease, Target, WebhookAddress,
};
use super::outcome::{decode_outcome, encode_outcome};
use super::state::JobState;
use super::store::Shard;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub(crate) run_id: String,
    pub(crate) state: String,
    pub(crate) state_rank: u8,
    pub(crate) gpu: String,
    pub(crate) queue: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) discord_webhook_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) discord_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) discord_thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) discord_message_id: Option<String>,
    /// The message goes to the deployment's default webhook (no token in the record).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) discord_default: bool,
    /// Written by records from before the outbox: a 404 had been seen.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) discord_gone: bool,
    /// Absent on records from before the outbox, which count as delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) discord_status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) discord_shown: Option<u8>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) discord_attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) discord_pending_since: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) discord_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) discord_refused: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) discord_lease_owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) discord_lease_until: Option<i64>,
    /// Absent when the job sends no callbacks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) callback_status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) callback_entered_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) callback_delivered: Option<u8>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) callback_attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) callback_pending_since: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) callback_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) callback_lease_owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) callback_lease_until: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) build_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) build_number: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) build_url: Option<String>,
    /// The payload of a build still to be created (see [`Creation`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) create_payload: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) create_after: Option<i64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) create_look_up: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) scheduled_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_queue_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) cancel_requested: bool,
    /// Reads of the ended build's result begun (see [`Job::finish_attempts`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) finish_attempts: u32,
    /// See [`Job::tries_seen`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) tries_seen: Vec<SeenTry>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) private: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) user: Option<String>,
    /// See [`Job::identity`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) identity: Option<String>,
    /// See [`Job::cached_from`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cached_from: Option<String>,
    /// See [`Job::background`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) background: bool,
    /// `user_limit` while fair share holds the job back, `background` while a background
    /// job waits for an idle GPU: the queue index projects this attribute, so it says both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) waiting: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) queue_position: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expected_start: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) failure: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) outcome_z: Option<String>,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
    /// TTL attribute (Unix seconds).
    pub(crate) expires_at: i64,
    /// Sparse-index key of the queue index: the job's queue while it is unfinished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) open_queue: Option<String>,
    /// Sparse-index key: [`Shard::Open`] while unfinished, [`Shard::Outbox`] while a report is
    /// owed, [`Shard::GivenUp`] once a final message was given up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sweep_shard: Option<String>,
    /// Optimistic-concurrency counter (absent, i.e. 0, on records from before it).
    #[serde(default)]
    pub(crate) version: u64,
    /// Unique per write: a retried write whose first try landed recognises itself by it.
    #[serde(default)]
    pub(crate) write_id: String,
}

/// The fields a listing leaves out: those that may be large (a result decompresses to
/// megabytes, a payload is up to 128 KiB), read one job at a time. Everything else is listed.
pub(crate) const UNLISTED: &[&str] =
    &["outcome", "outcome_z", "create_payload", "title", "failure"];

/// The record's fields a listing reads: every field but the [`UNLISTED`] ones.
pub(crate) fn listed_fields() -> Vec<&'static str> {
    fields::of::<JobRecord>()
        .iter()
        .copied()
        .filter(|f| !UNLISTED.contains(f))
        .collect()
}

/// A struct's serde field names, as serde hands them to a deserializer: the stored names,
/// with no second list to keep in step.
mod fields {
    use serde::de::{self, Deserialize, Deserializer, Visitor};

    pub(super) fn of<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
        let mut names = Names(&[]);
        let _ = T::deserialize(&mut names);
        names.0
    }

    struct Names(&'static [&'static str]);

    #[derive(Debug, thiserror::Error)]
    #[error("field names only")]
    struct NamesOnly;

    impl de::Error for NamesOnly {
        fn custom<T: std::fmt::Display>(_: T) -> Self {
            Self
        }
    }

    impl<'de> Deserializer<'de> for &mut Names {
        type Error = NamesOnly;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, NamesOnly> {
            Err(NamesOnly)
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, NamesOnly> {
            self.0 = fields;
            Err(NamesOnly)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
}

/// The stored `waiting` of a job its user's limit holds back.
pub(crate) const WAITING_USER_LIMIT: &str = "user_limit";
/// What `waiting` says of a background job (see [`WAITING_USER_LIMIT`]).
pub(crate) const WAITING_BACKGROUND: &str = "background";

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Which sweep partition a job belongs to, if any.
fn shard(job: &Job) -> Option<String> {
    if !job.state.is_terminal() {
        Some(Shard::Open.key().to_owned())
    } else if job.owes_delivery() {
        Some(Shard::Outbox.key().to_owned())
    } else if job.given_up() {
        Some(Shard::GivenUp.key().to_owned())
    } else {
        None
    }
}

fn lease(owner: Option<String>, until: Option<i64>) -> Option<Lease> {
    owner
        .zip(until)
        .map(|(owner, until)| Lease { owner, until })
}

impl JobRecord {
    /// The record of `job`, written by the write `write_id`.
    pub fn from_job(job: &Job, write_id: &str) -> Self {
        let encoded = job
            .outcome
            .as_deref()
            .map(encode_outcome)
            .unwrap_or_default();
        let mut record = Self {
            run_id: job.run_id.to_string(),
            state: job.state.as_str().to_owned(),
            state_rank: job.state.rank(),
            gpu: job.gpu.clone(),
            queue: job.queue.to_string(),
            title: job.title.clone(),
            build_id: job.build.as_ref().map(|b| b.id.clone()),
            build_number: job.build.as_ref().map(|b| b.number),
            build_url: job.build.as_ref().map(|b| b.web_url.clone()),
            create_payload: job.creation.as_ref().map(|c| c.payload.clone()),
            create_after: job.creation.as_ref().map(|c| c.after),
            create_look_up: job.creation.as_ref().is_some_and(|c| c.look_up_first),
            scheduled_at: job.scheduled_at,
            max_queue_secs: job.max_queue_secs,
            cancel_requested: job.cancel_requested,
            finish_attempts: job.finish_attempts,
            tries_seen: job.tries_seen.clone(),
            private: job.private,
            user: job.user.as_ref().map(ToString::to_string),
            identity: job.identity.clone(),
            cached_from: job.cached_from.as_ref().map(ToString::to_string),
            background: job.background,
            waiting: job.waiting.then(|| {
                let why = if job.background {
                    WAITING_BACKGROUND
                } else {
                    WAITING_USER_LIMIT
                };
                why.to_owned()
            }),
            queue_position: job.queue_position,
            expected_start: job.expected_start,
            failure: job.failure.clone(),
            outcome: encoded.json,
            outcome_z: encoded.zlib_b64,
            created_at: job.created_at,
            updated_at: job.updated_at,
            expires_at: job.expires_at(),
            sweep_shard: shard(job),
            open_queue: (!job.state.is_terminal()).then(|| job.queue.to_string()),
            version: job.version,
            write_id: write_id.to_owned(),
            ..Self::default()
        };
        if let Some(o) = &job.discord {
            record.set_discord(o);
        }
        if let Some(c) = &job.callback {
            record.set_callback(c);
        }
        record
    }

    /// How many bytes the stored outcome takes, compressed or not.
    pub fn stored_outcome_bytes(&self) -> usize {
        self.outcome
            .as_ref()
            .or(self.outcome_z.as_ref())
            .map_or(0, String::len)
    }

    fn set_callback(&mut self, c: &CallbackOutbox) {
        let d = &c.delivery;
        self.callback_status = Some(d.status.as_str().to_owned());
        self.callback_entered_at = Some(c.entered_at);
        self.callback_delivered = d.accepted;
        self.callback_attempts = d.attempts;
        self.callback_pending_since = d.pending_since;
        self.callback_error.clone_from(&d.last_error);
        self.callback_lease_owner = d.lease.as_ref().map(|l| l.owner.clone());
        self.callback_lease_until = d.lease.as_ref().map(|l| l.until);
    }

    fn callback(&mut self) -> Result<Option<CallbackOutbox>, StoreError> {
        let Some(status) = self.callback_status.take() else {
            return Ok(None);
        };
        Ok(Some(CallbackOutbox {
            entered_at: self.callback_entered_at.unwrap_or(self.updated_at),
            delivery: Delivery {
                status: status.parse().map_err(StoreError::corrupt)?,
                accepted: self.callback_delivered,
                attempts: self.callback_attempts,
                pending_since: self.callback_pending_since,
                last_error: self.callback_error.take(),
                lease: lease(self.callback_lease_owner.take(), self.callback_lease_until),
            },
        }))
    }

    fn set_discord(&mut self, o: &DiscordOutbox) {
        match &o.target {
            Some(Target::Webhook(t)) => {
                self.discord_webhook_id = Some(t.webhook_id.clone());
                self.discord_token = Some(t.token.expose_secret().to_owned());
                self.discord_thread_id.clone_from(&t.thread_id);
            }
            Some(Target::Default) => self.discord_default = true,
            None => {}
        }
        let d = &o.delivery;
        self.discord_message_id.clone_from(&o.message_id);
        self.discord_status = Some(d.status.as_str().to_owned());
        self.discord_shown = d.accepted;
        self.discord_attempts = d.attempts;
        self.discord_pending_since = d.pending_since;
        self.discord_error.clone_from(&d.last_error);
        self.discord_refused = o.refused;
        self.discord_lease_owner = d.lease.as_ref().map(|l| l.owner.clone());
        self.discord_lease_until = d.lease.as_ref().map(|l| l.until);
    }

    /// The job's Discord outbox. Records from before the outbox count as delivered: the first
    /// deploy must not re-send every past report.
    fn discord(&mut self, state: JobState) -> Result<Option<DiscordOutbox>, StoreError> {
        let target = match (self.discord_webhook_id.take(), self.discord_token.take()) {
            _ if self.discord_default => Some(Target::Default),
            (Some(webhook_id), Some(token)) => Some(Target::Webhook(WebhookAddress {
                webhook_id,
                token: SecretString::from(token),
                thread_id: self.discord_thread_id.take(),
            })),
            _ => None,
        };
        let status = match self.discord_status.as_deref() {
            Some(s) => s.parse().map_err(StoreError::corrupt)?,
            None if target.is_none() => return Ok(None),
            None if self.discord_gone => DeliveryStatus::Gone,
            // What it showed before the outbox counts as shown; an unfinished job still owes
            // its later states.
            None if state.is_terminal() => DeliveryStatus::Delivered,
            None => DeliveryStatus::Active,
        };
        let legacy = self.discord_status.is_none();
        Ok(Some(DiscordOutbox {
            target,
            message_id: self.discord_message_id.take(),
            refused: self.discord_refused,
            delivery: Delivery {
                status,
                accepted: if legacy {
                    Some(state.rank())
                } else {
                    self.discord_shown
                },
                attempts: self.discord_attempts,
                pending_since: self.discord_pending_since,
                last_error: self.discord_error.take(),
                lease: lease(self.discord_lease_owner.take(), self.discord_lease_until),
            },
        }))
    }

    fn build(&mut self) -> Option<BuildRef> {
        match (
            self.build_id.take(),
            self.build_number,
            self.build_url.take(),
        ) {
            (Some(id), Some(number), web_url) => Some(BuildRef {
                id,
                number,
                web_url: web_url.unwrap_or_default(),
            }),
            _ => None,
        }
    }

    /// The job as a listing shows it: from a record read without its [`UNLISTED`] fields.
    pub(crate) fn into_listed(mut self) -> Result<Listed, StoreError> {
        let state: JobState = self.state.parse().map_err(StoreError::corrupt)?;
        Ok(Listed {
            run_id: self.run_id.parse().map_err(StoreError::corrupt)?,
            state,
            queue: std::mem::take(&mut self.queue).into(),
            build: self.build(),
            discord: self.discord(state)?,
            callback: self.callback()?,
            scheduled_at: self.scheduled_at,
            max_queue_secs: self.max_queue_secs,
            cancel_requested: self.cancel_requested,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }

    pub fn into_job(mut self) -> Result<Job, StoreError> {
        let run_id = self.run_id.parse().map_err(StoreError::corrupt)?;
        let state: JobState = self.state.parse().map_err(StoreError::corrupt)?;
        let discord = self.discord(state)?;
        let callback = self.callback()?;
        let build = self.build();
        Ok(Job {
            run_id,
            state,
            gpu: self.gpu,
            queue: self.queue.into(),
            title: self.title,
            discord,
            callback,
            build,
            creation: self.create_payload.map(|payload| Creation {
                payload,
                after: self.create_after.unwrap_or(0),
                look_up_first: self.create_look_up,
            }),
            scheduled_at: self.scheduled_at,
            max_queue_secs: self.max_queue_secs,
            cancel_requested: self.cancel_requested,
            finish_attempts: self.finish_attempts,
            tries_seen: self.tries_seen,
            private: self.private,
            user: self.user.map(Into::into),
            identity: self.identity,
            cached_from: self
                .cached_from
                .map(|id| id.parse())
                .transpose()
                .map_err(StoreError::corrupt)?,
            background: self.background,
            waiting: self.waiting.is_some(),
            queue_position: self.queue_position,
            expected_start: self.expected_start,
            failure: self.failure,
            outcome: decode_outcome(self.outcome.as_deref(), self.outcome_z.as_deref())?
                .map(std::sync::Arc::new),
            created_at: self.created_at,
            updated_at: self.updated_at,
            version: self.version,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::Channel;

    fn job(state: JobState) -> Job {
        let target = Target::Webhook(WebhookAddress {
            webhook_id: "1".into(),
            token: "tok".into(),
            thread_id: None,
        });
        let mut job = Job::new(
            "r".parse().unwrap(),
            "g".into(),
            "q".into(),
            None,
            Some(target),
            5_000,
        );
        job.state = state;
        job
    }

    #[test]
    fn the_sweep_index_key_follows_what_the_job_still_needs() {
        let open = job(JobState::Running);
        assert_eq!(
            JobRecord::from_job(&open, "w").sweep_shard.as_deref(),
            Some("open")
        );
        let owing = job(JobState::Finished);
        assert_eq!(
            JobRecord::from_job(&owing, "w").sweep_shard.as_deref(),
            Some("outbox")
        );
        let mut done = job(JobState::Finished);
        let outbox = done.discord.as_mut().unwrap();
        outbox.delivery.status = DeliveryStatus::Delivered;
        outbox.target = None;
        let record = JobRecord::from_job(&done, "w");
        assert_eq!(record.sweep_shard, None);
        let mut given_up = done.clone();
        given_up.discord.as_mut().unwrap().delivery.status = DeliveryStatus::GivenUp;
        assert_eq!(
            JobRecord::from_job(&given_up, "w").sweep_shard.as_deref(),
            Some("given_up")
        );
        assert_eq!(record.discord_token, None);
        assert_eq!(record.clone().into_job().unwrap(), done);
        assert_eq!(JobRecord::from_job(&owing, "w").into_job().unwrap(), owing);
    }

    #[test]
    fn a_callback_outbox_round_trips_and_keeps_a_finished_job_in_the_outbox_shard() {
        let mut owing = job(JobState::Finished);
        owing.discord = None;
        let mut c = CallbackOutbox::new(7_000);
        c.delivery.accepted = Some(JobState::Running.rank());
        c.delivery.attempts = 2;
        c.delivery.pending_since = Some(8_000);
        c.delivery.last_error = Some("the callback receiver answered 500".into());
        c.delivery.lease = Some(Lease {
            owner: "o".into(),
            until: 9_000,
        });
        owing.callback = Some(c);
        let record = JobRecord::from_job(&owing, "w");
        assert_eq!(record.sweep_shard.as_deref(), Some("outbox"));
        assert_eq!(record.clone().into_job().unwrap(), owing);
        owing.callback.as_mut().unwrap().delivery.status = DeliveryStatus::Delivered;
        assert_eq!(JobRecord::from_job(&owing, "w").sweep_shard, None);
    }

    #[test]
    fn a_job_s_result_reads_round_trip_and_take_no_field_until_one_begins() {
        let mut job = job(JobState::Running);
        let record = serde_json::to_value(JobRecord::from_job(&job, "w")).unwrap();
        assert!(record.get("finish_attempts").is_none(), "{record}");
        job.finish_attempts = 2;
        let record = JobRecord::from_job(&job, "w");
        assert_eq!(record.finish_attempts, 2);
        assert_eq!(record.into_job().unwrap(), job);
    }

    #[test]
    fn records_from_before_the_outbox_count_as_delivered() {
        let legacy = r#"{"run_id":"old","state":"running","state_rank":2,"gpu":"g","queue":"q",
            "discord_webhook_id":"1","discord_token":"tok","discord_message_id":"9",
            "created_at":1,"updated_at":2,"expires_at":3}"#;
        let job = serde_json::from_str::<JobRecord>(legacy)
            .unwrap()
            .into_job()
            .unwrap();
        assert!(!job.owes(Channel::Discord), "its running state was shown");
        assert_eq!(job.version, 0);
        let finished = job
            .apply(&crate::jobs::Transition::to(JobState::Finished, 5))
            .unwrap();
        assert!(
            finished.owes(Channel::Discord),
            "a job running at deploy still gets its report"
        );
        let done = legacy.replace(
            r#""state":"running","state_rank":2"#,
            r#""state":"finished","state_rank":3"#,
        );
        let job = serde_json::from_str::<JobRecord>(&done)
            .unwrap()
            .into_job()
            .unwrap();
        assert_eq!(
            job.discord.as_ref().unwrap().delivery.status,
            DeliveryStatus::Delivered
        );
        assert!(
            !job.owes(Channel::Discord),
            "past reports are not sent again"
        );
        let gone = legacy.replace(r#""created_at""#, r#""discord_gone":true,"created_at""#);
        let job = serde_json::from_str::<JobRecord>(&gone)
            .unwrap()
            .into_job()
            .unwrap();
        assert_eq!(job.discord.unwrap().delivery.status, DeliveryStatus::Gone);
    }

    #[test]
    fn a_listing_reads_every_field_but_the_large_ones() {
        let listed = listed_fields();
        for field in [
            "run_id",
            "state",
            "created_at",
            "discord_lease_until",
            "version",
        ] {
            assert!(listed.contains(&field), "{field}");
        }
        for field in UNLISTED {
            assert!(!listed.contains(field), "{field}");
        }
        assert_eq!(
            listed.len() + UNLISTED.len(),
            fields::of::<JobRecord>().len()
        );
    }

    #[test]
    fn a_record_read_without_its_unlisted_fields_lists_the_job() {
        let mut job = job(JobState::Finished);
        job.title = Some("t".repeat(200));
        job.failure = Some("f".into());
        job.build = Some(BuildRef {
            id: "b".into(),
            number: 7,
            web_url: "u".into(),
        });
        job.scheduled_at = Some(6_000);
        job.max_queue_secs = Some(60);
        job.cancel_requested = true;
        job.callback = Some(CallbackOutbox::new(7_000));
        job.outcome = Some(std::sync::Arc::new(crate::result::Outcome::decided(
            "passed",
            crate::result::Verdict::Passed,
            "x".repeat(40_000),
        )));
        let mut value = serde_json::to_value(JobRecord::from_job(&job, "w")).unwrap();
        let fields = value.as_object_mut().unwrap();
        for field in UNLISTED {
            fields.remove(*field);
        }
        assert!(!fields.contains_key("outcome_z") && !fields.contains_key("title"));
        let listed = serde_json::from_value::<JobRecord>(value)
            .unwrap()
            .into_listed()
            .unwrap();
        assert_eq!(listed, Listed::from(&job));
    }
}
