//! The flat form a job takes in a store, shared by both implementations.
//!
//! The outcome (which holds `result.json`) is kept as JSON text, or zlib-compressed and
//! base64-encoded when large, so an item stays well under DynamoDB's 400 KB limit.

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use super::model::{BuildRef, Job, JobState};
use super::store::StoreError;
use crate::discord::target::DiscordTarget;
use crate::payload;
use crate::result::Outcome;

/// Outcomes larger than this are compressed.
pub const COMPRESS_ABOVE: usize = 32 * 1024;
/// Above this (after compression) the run logs are dropped: the item must stay < 400 KB.
pub const MAX_STORED_OUTCOME: usize = 300 * 1024;
/// Value of the sparse-index key while a job is unfinished.
pub const OPEN: &str = "open";

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
    #[serde(default)]
    pub discord_gone: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_number: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_url: Option<String>,
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
    /// Sparse-index key: present only while the job is unfinished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_shard: Option<String>,
}

/// An outcome in its stored form: exactly one of the two is set.
#[derive(Debug, Default, PartialEq)]
pub struct EncodedOutcome {
    pub json: Option<String>,
    pub zlib_b64: Option<String>,
}

pub fn encode_outcome(outcome: &Outcome) -> EncodedOutcome {
    let json = serde_json::to_string(outcome).unwrap_or_default();
    if json.len() <= COMPRESS_ABOVE {
        return EncodedOutcome {
            json: Some(json),
            zlib_b64: None,
        };
    }
    let packed = payload::pack(json.as_bytes());
    if packed.len() <= MAX_STORED_OUTCOME {
        return EncodedOutcome {
            json: None,
            zlib_b64: Some(packed),
        };
    }
    // Still too big: keep the verdict and the parsed values, drop the captured logs.
    let mut slim = outcome.clone();
    if let Some(result) = slim.result.as_mut() {
        for eval in result.runs.values_mut() {
            if let Some(c) = eval.compilation.as_mut() {
                c.stdout = "[dropped: too large to store]".into();
                c.stderr.clear();
            }
            if let Some(r) = eval.run.as_mut() {
                r.stdout = "[dropped: too large to store]".into();
                r.stderr.clear();
            }
        }
    }
    let packed = payload::pack(serde_json::to_string(&slim).unwrap_or_default().as_bytes());
    EncodedOutcome {
        json: None,
        zlib_b64: Some(packed),
    }
}

fn decode_outcome(
    json: Option<&str>,
    zlib_b64: Option<&str>,
) -> Result<Option<Outcome>, StoreError> {
    let corrupt = |e: &dyn std::fmt::Display| StoreError::Corrupt(format!("outcome: {e}"));
    let bytes = match (json, zlib_b64) {
        (Some(j), _) => j.as_bytes().to_vec(),
        (None, Some(z)) => payload::unpack(z).map_err(|e| corrupt(&e))?,
        (None, None) => return Ok(None),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| corrupt(&e))
}

impl JobRecord {
    pub fn from_job(job: &Job) -> Self {
        let encoded = job.outcome.as_ref().map(encode_outcome).unwrap_or_default();
        Self {
            run_id: job.run_id.to_string(),
            state: job.state.as_str().to_owned(),
            state_rank: job.state.rank(),
            gpu: job.gpu.clone(),
            queue: job.queue.clone(),
            title: job.title.clone(),
            discord_webhook_id: job.discord.as_ref().map(|d| d.webhook_id.clone()),
            discord_token: job
                .discord
                .as_ref()
                .map(|d| d.token.expose_secret().to_owned()),
            discord_thread_id: job.discord.as_ref().and_then(|d| d.thread_id.clone()),
            discord_message_id: job.discord_message_id.clone(),
            discord_gone: job.discord_gone,
            build_id: job.build.as_ref().map(|b| b.id.clone()),
            build_number: job.build.as_ref().map(|b| b.number),
            build_url: job.build.as_ref().map(|b| b.web_url.clone()),
            failure: job.failure.clone(),
            outcome: encoded.json,
            outcome_z: encoded.zlib_b64,
            created_at: job.created_at,
            updated_at: job.updated_at,
            expires_at: job.expires_at(),
            sweep_shard: (!job.state.is_terminal()).then(|| OPEN.to_owned()),
        }
    }

    pub fn into_job(self) -> Result<Job, StoreError> {
        let run_id = self
            .run_id
            .parse()
            .map_err(|_| StoreError::Corrupt(format!("run_id {:?}", self.run_id)))?;
        let state: JobState = self.state.parse().map_err(StoreError::Corrupt)?;
        let discord = match (self.discord_webhook_id, self.discord_token) {
            (Some(webhook_id), Some(token)) => Some(DiscordTarget {
                webhook_id,
                token: SecretString::from(token),
                thread_id: self.discord_thread_id,
            }),
            _ => None,
        };
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
            discord_message_id: self.discord_message_id,
            discord_gone: self.discord_gone,
            build,
            failure: self.failure,
            outcome: decode_outcome(self.outcome.as_deref(), self.outcome_z.as_deref())?,
            created_at: self.created_at,
            updated_at: self.updated_at,
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
        let z = enc.zlib_b64.as_deref().expect("compressed");
        assert!(z.len() <= MAX_STORED_OUTCOME);
        let back = decode_outcome(None, Some(z)).unwrap().unwrap();
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
    fn the_sweep_index_key_exists_only_while_unfinished() {
        let mut job = Job::new(
            "r".parse().unwrap(),
            "g".into(),
            "q".into(),
            None,
            None,
            5_000,
        );
        assert_eq!(JobRecord::from_job(&job).sweep_shard.as_deref(), Some(OPEN));
        job.state = JobState::Finished;
        let record = JobRecord::from_job(&job);
        assert_eq!(record.sweep_shard, None);
        assert_eq!(record.clone().into_job().unwrap(), job);
    }
}
