//! The flat form a job takes in a store, shared by both implementations.
//!
//! The outcome (which holds `result.json`) is kept as JSON text, or zlib-compressed and
//! base64-encoded when large, and slimmed until the whole item fits DynamoDB's 400 KB limit.

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use super::model::{
    BuildRef, CallbackOutbox, Creation, DeliveryStatus, Job, JobState, Lease, Outbox,
};
use super::store::StoreError;
use crate::discord::target::DiscordTarget;
use crate::payload;
use crate::result::Outcome;

/// Outcomes larger than this are compressed.
pub const COMPRESS_ABOVE: usize = 32 * 1024;
/// The largest stored outcome: the rest of an item is a few KB, DynamoDB's limit 400 KB.
pub const MAX_STORED_OUTCOME: usize = 300 * 1024;
/// Sparse-index key while a job is unfinished.
pub const OPEN: &str = "open";
/// Sparse-index key while a finished job still owes its final report.
pub const OUTBOX: &str = "outbox";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub run_id: String,
    pub state: String,
    pub state_rank: u8,
    pub gpu: String,
    pub queue: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discord_webhook_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discord_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discord_thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discord_message_id: Option<String>,
    /// Written by records from before the outbox: a 404 had been seen.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub discord_gone: bool,
    /// Absent on records from before the outbox, which count as delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discord_status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discord_shown: Option<u8>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub discord_attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discord_pending_since: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discord_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discord_refused: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discord_lease_owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discord_lease_until: Option<i64>,
    /// Absent when the job sends no callbacks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_entered_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_delivered: Option<u8>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub callback_attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_pending_since: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_lease_owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_lease_until: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_number: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_url: Option<String>,
    /// The payload of a build still to be created (see [`Creation`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_payload: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_after: Option<i64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub create_look_up: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queue_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel_requested: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub private: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome_z: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    /// TTL attribute (Unix seconds).
    pub expires_at: i64,
    /// Sparse-index key of the queue index: the job's queue while it is unfinished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_queue: Option<String>,
    /// Sparse-index key: [`OPEN`] while unfinished, [`OUTBOX`] while a report is owed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_shard: Option<String>,
    /// Optimistic-concurrency counter (absent, i.e. 0, on records from before it).
    #[serde(default)]
    pub version: u64,
    /// Unique per write: a retried write whose first try landed recognises itself by it.
    #[serde(default)]
    pub write_id: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// An outcome in its stored form: exactly one of the two is set.
#[derive(Debug, Default, PartialEq)]
pub struct EncodedOutcome {
    pub json: Option<String>,
    pub zlib_b64: Option<String>,
}

fn encode_exact(outcome: &Outcome) -> EncodedOutcome {
    let json = serde_json::to_string(outcome).unwrap_or_default();
    if json.len() <= COMPRESS_ABOVE {
        return EncodedOutcome {
            json: Some(json),
            zlib_b64: None,
        };
    }
    EncodedOutcome {
        json: None,
        zlib_b64: Some(payload::pack(json.as_bytes())),
    }
}

impl EncodedOutcome {
    fn len(&self) -> usize {
        self.json
            .as_ref()
            .or(self.zlib_b64.as_ref())
            .map_or(0, String::len)
    }
}

/// The outcome as the store keeps it: whole if it fits [`MAX_STORED_OUTCOME`], else without
/// its logs, else without its result (the verdict, drawn from the whole result, always
/// survives). Transitions carry it in this form, so what is reported first is what a resend
/// reads back. `None`: it fits as it is.
pub fn fit_outcome(outcome: &Outcome) -> Option<Outcome> {
    fitted(outcome).1
}

/// Encodes an outcome within [`MAX_STORED_OUTCOME`], cut as [`fit_outcome`] cuts it.
pub fn encode_outcome(outcome: &Outcome) -> EncodedOutcome {
    fitted(outcome).0
}

fn fitted(outcome: &Outcome) -> (EncodedOutcome, Option<Outcome>) {
    let whole = encode_exact(outcome);
    if whole.len() <= MAX_STORED_OUTCOME {
        return (whole, None);
    }
    let mut slim = outcome.clone();
    if let Some(result) = slim.result.as_mut() {
        result.drop_logs();
    }
    let encoded = encode_exact(&slim);
    if encoded.len() <= MAX_STORED_OUTCOME {
        return (encoded, Some(slim));
    }
    let bare = outcome.without_result("the result was too large to store");
    (encode_exact(&bare), Some(bare))
}

fn decode_outcome(
    json: Option<&str>,
    zlib_b64: Option<&str>,
) -> Result<Option<Outcome>, StoreError> {
    let bytes = match (json, zlib_b64) {
        (Some(j), _) => j.as_bytes().to_vec(),
        (None, Some(z)) => {
            payload::unpack(z).map_err(|e| StoreError::Corrupt(format!("outcome: {e}")))?
        }
        (None, None) => return Ok(None),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| StoreError::Corrupt(format!("outcome: {e}")))
}

/// Which sweep partition a job belongs to, if any.
fn shard(job: &Job) -> Option<String> {
    if !job.state.is_terminal() {
        Some(OPEN.to_owned())
    } else if job.owes_delivery() {
        Some(OUTBOX.to_owned())
    } else {
        None
    }
}

impl JobRecord {
    /// The record of `job`, written by the write `write_id`.
    pub fn from_job(job: &Job, write_id: &str) -> Self {
        let encoded = job.outcome.as_ref().map(encode_outcome).unwrap_or_default();
        let mut record = Self {
            run_id: job.run_id.to_string(),
            state: job.state.as_str().to_owned(),
            state_rank: job.state.rank(),
            gpu: job.gpu.clone(),
            queue: job.queue.clone(),
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
            private: job.private,
            failure: job.failure.clone(),
            outcome: encoded.json,
            outcome_z: encoded.zlib_b64,
            created_at: job.created_at,
            updated_at: job.updated_at,
            expires_at: job.expires_at(),
            sweep_shard: shard(job),
            open_queue: (!job.state.is_terminal()).then(|| job.queue.clone()),
            version: job.version,
            write_id: write_id.to_owned(),
            ..Self::default()
        };
        if let Some(o) = &job.discord {
            record.set_outbox(o);
        }
        if let Some(c) = &job.callback {
            record.set_callback(c);
        }
        record
    }

    fn set_callback(&mut self, c: &CallbackOutbox) {
        self.callback_status = Some(c.status.as_str().to_owned());
        self.callback_entered_at = Some(c.entered_at);
        self.callback_delivered = c.delivered;
        self.callback_attempts = c.attempts;
        self.callback_pending_since = c.pending_since;
        self.callback_error.clone_from(&c.last_error);
        self.callback_lease_owner = c.lease.as_ref().map(|l| l.owner.clone());
        self.callback_lease_until = c.lease.as_ref().map(|l| l.until);
    }

    fn callback(&mut self) -> Result<Option<CallbackOutbox>, StoreError> {
        let Some(status) = self.callback_status.take() else {
            return Ok(None);
        };
        Ok(Some(CallbackOutbox {
            entered_at: self.callback_entered_at.unwrap_or(self.updated_at),
            delivered: self.callback_delivered,
            status: status.parse().map_err(StoreError::Corrupt)?,
            attempts: self.callback_attempts,
            pending_since: self.callback_pending_since,
            last_error: self.callback_error.take(),
            lease: self
                .callback_lease_owner
                .take()
                .zip(self.callback_lease_until)
                .map(|(owner, until)| Lease { owner, until }),
        }))
    }

    fn set_outbox(&mut self, o: &Outbox) {
        if let Some(t) = &o.target {
            self.discord_webhook_id = Some(t.webhook_id.clone());
            self.discord_token = Some(t.token.expose_secret().to_owned());
            self.discord_thread_id.clone_from(&t.thread_id);
        }
        self.discord_message_id.clone_from(&o.message_id);
        self.discord_status = Some(o.status.as_str().to_owned());
        self.discord_shown = o.shown;
        self.discord_attempts = o.attempts;
        self.discord_pending_since = o.pending_since;
        self.discord_error.clone_from(&o.last_error);
        self.discord_refused = o.refused;
        self.discord_lease_owner = o.lease.as_ref().map(|l| l.owner.clone());
        self.discord_lease_until = o.lease.as_ref().map(|l| l.until);
    }

    /// The job's outbox. Records from before the outbox count as delivered: the first deploy
    /// must not re-send every past report.
    fn outbox(&mut self, state: JobState) -> Result<Option<Outbox>, StoreError> {
        let target = match (self.discord_webhook_id.take(), self.discord_token.take()) {
            (Some(webhook_id), Some(token)) => Some(DiscordTarget {
                webhook_id,
                token: SecretString::from(token),
                thread_id: self.discord_thread_id.take(),
            }),
            _ => None,
        };
        let status = match self.discord_status.as_deref() {
            Some(s) => s.parse().map_err(StoreError::Corrupt)?,
            None if target.is_none() => return Ok(None),
            None if self.discord_gone => DeliveryStatus::Gone,
            // What it showed before the outbox counts as shown; an unfinished job still owes
            // its later states.
            None if state.is_terminal() => DeliveryStatus::Delivered,
            None => DeliveryStatus::Active,
        };
        let legacy = self.discord_status.is_none();
        Ok(Some(Outbox {
            target,
            message_id: self.discord_message_id.take(),
            shown: if legacy {
                Some(state.rank())
            } else {
                self.discord_shown
            },
            status,
            attempts: self.discord_attempts,
            pending_since: self.discord_pending_since,
            last_error: self.discord_error.take(),
            refused: self.discord_refused,
            lease: self
                .discord_lease_owner
                .take()
                .zip(self.discord_lease_until)
                .map(|(owner, until)| Lease { owner, until }),
        }))
    }

    pub fn into_job(mut self) -> Result<Job, StoreError> {
        let run_id = self
            .run_id
            .parse()
            .map_err(|_| StoreError::Corrupt(format!("run_id {:?}", self.run_id)))?;
        let state: JobState = self.state.parse().map_err(StoreError::Corrupt)?;
        let discord = self.outbox(state)?;
        let callback = self.callback()?;
        let build = match (self.build_id, self.build_number, self.build_url) {
            (Some(id), Some(number), web_url) => Some(BuildRef {
                id,
                number,
                web_url: web_url.unwrap_or_default(),
            }),
            _ => None,
        };
        Ok(Job {
            run_id,
            state,
            gpu: self.gpu,
            queue: self.queue,
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
            private: self.private,
            failure: self.failure,
            outcome: decode_outcome(self.outcome.as_deref(), self.outcome_z.as_deref())?,
            created_at: self.created_at,
            updated_at: self.updated_at,
            version: self.version,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::{EvalResult, FullResult, RunResult};

    fn outcome_with_log(len: usize, noisy: bool) -> Outcome {
        let stdout: String = if noisy {
            {
                let mut rng = fastrand::Rng::with_seed(len as u64);
                (0..len).map(|_| rng.alphanumeric()).collect()
            }
        } else {
            "a".repeat(len)
        };
        let mut result = FullResult {
            success: true,
            ..Default::default()
        };
        for name in ["test", "benchmark", "leaderboard", "profile.0", "profile.1"] {
            let run = RunResult {
                stdout: stdout.clone(),
                stderr: stdout.clone(),
                ..Default::default()
            };
            result.runs.insert(
                name.into(),
                EvalResult {
                    run: Some(run),
                    ..Default::default()
                },
            );
        }
        Outcome::judge("passed", Some(result), None)
    }

    #[test]
    fn small_outcomes_stay_readable_json() {
        let o = outcome_with_log(10, false);
        let enc = encode_outcome(&o);
        assert!(enc.json.is_some() && enc.zlib_b64.is_none());
        assert_eq!(decode_outcome(enc.json.as_deref(), None).unwrap(), Some(o));
    }

    #[test]
    fn large_outcomes_are_compressed_losslessly() {
        let o = outcome_with_log(16_000, false);
        let enc = encode_outcome(&o);
        let z = enc.zlib_b64.as_deref().expect("compressed");
        assert!(z.len() < COMPRESS_ABOVE);
        assert_eq!(decode_outcome(None, Some(z)).unwrap(), Some(o));
    }

    #[test]
    fn incompressible_outcomes_drop_logs_to_fit() {
        let o = outcome_with_log(60_000, true);
        let enc = encode_outcome(&o);
        assert!(enc.len() <= MAX_STORED_OUTCOME);
        let back = decode_outcome(enc.json.as_deref(), enc.zlib_b64.as_deref())
            .unwrap()
            .unwrap();
        assert_eq!(back.verdict, o.verdict);
        assert!(
            back.result.unwrap().runs["test"]
                .run
                .as_ref()
                .unwrap()
                .stdout
                .starts_with("[dropped")
        );
    }

    #[test]
    fn results_too_large_even_without_logs_keep_their_verdict() {
        let mut o = outcome_with_log(10, false);
        let run = o.result.as_mut().unwrap().runs.get_mut("test").unwrap();
        let mut rng = fastrand::Rng::with_seed(3);
        let entries = run.run.as_mut().unwrap();
        for i in 0..400 {
            let noise: String = (0..2000).map(|_| rng.alphanumeric()).collect();
            entries
                .result
                .insert(format!("test.{i}.message"), noise.into());
        }
        let enc = encode_outcome(&o);
        assert!(enc.len() <= MAX_STORED_OUTCOME, "{}", enc.len());
        let back = decode_outcome(enc.json.as_deref(), enc.zlib_b64.as_deref())
            .unwrap()
            .unwrap();
        assert_eq!(back.verdict, o.verdict);
        assert!(back.result.is_none());
        assert!(back.error.unwrap().contains("too large to store"));
    }

    fn job(state: JobState) -> Job {
        let target = DiscordTarget::parse("https://discord.com/api/webhooks/1/tok", None).unwrap();
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
            Some(OPEN)
        );
        let owing = job(JobState::Finished);
        assert_eq!(
            JobRecord::from_job(&owing, "w").sweep_shard.as_deref(),
            Some(OUTBOX)
        );
        let mut done = job(JobState::Finished);
        let outbox = done.discord.as_mut().unwrap();
        outbox.status = DeliveryStatus::Delivered;
        outbox.target = None;
        let record = JobRecord::from_job(&done, "w");
        assert_eq!(record.sweep_shard, None);
        assert_eq!(record.discord_token, None);
        assert_eq!(record.clone().into_job().unwrap(), done);
        assert_eq!(JobRecord::from_job(&owing, "w").into_job().unwrap(), owing);
    }

    #[test]
    fn a_callback_outbox_round_trips_and_keeps_a_finished_job_in_the_outbox_shard() {
        let mut owing = job(JobState::Finished);
        owing.discord = None;
        let mut c = CallbackOutbox::new(7_000);
        c.delivered = Some(JobState::Running.rank());
        c.attempts = 2;
        c.pending_since = Some(8_000);
        c.last_error = Some("the callback receiver answered 500".into());
        c.lease = Some(Lease {
            owner: "o".into(),
            until: 9_000,
        });
        owing.callback = Some(c);
        let record = JobRecord::from_job(&owing, "w");
        assert_eq!(record.sweep_shard.as_deref(), Some(OUTBOX));
        assert_eq!(record.clone().into_job().unwrap(), owing);
        owing.callback.as_mut().unwrap().status = DeliveryStatus::Delivered;
        assert_eq!(JobRecord::from_job(&owing, "w").sweep_shard, None);
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
        assert!(!job.owes_discord(), "its running state was shown");
        assert_eq!(job.version, 0);
        let finished = job
            .apply(&crate::jobs::Transition::to(JobState::Finished, 5))
            .unwrap();
        assert!(
            finished.owes_discord(),
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
            job.discord.as_ref().unwrap().status,
            DeliveryStatus::Delivered
        );
        assert!(!job.owes_discord(), "past reports are not sent again");
        let gone = legacy.replace(r#""created_at""#, r#""discord_gone":true,"created_at""#);
        let job = serde_json::from_str::<JobRecord>(&gone)
            .unwrap()
            .into_job()
            .unwrap();
        assert_eq!(job.discord.unwrap().status, DeliveryStatus::Gone);
    }
}
