//! An outcome (which holds `result.json`) in its stored form: JSON text, or zlib-compressed
//! and base64-encoded when large, and cut until it fits DynamoDB's 400 KB item limit.

use super::error::StoreError;
use crate::payload;
use crate::result::Outcome;

/// Outcomes larger than this are compressed.
pub(crate) const COMPRESS_ABOVE: usize = 32 * 1024;
/// The largest stored outcome: the rest of an item is a few KB, DynamoDB's limit 400 KB.
pub const MAX_STORED_OUTCOME: usize = 300 * 1024;
/// The most one outcome may decompress to when written. A sweep holds a few jobs at once,
/// so this bounds its memory whatever a submission printed; it is above what a runner of
/// ours writes (its result pipe takes 1 MiB a run).
pub(crate) const MAX_OUTCOME_JSON: usize = 4 * 1024 * 1024;
/// The most one stored outcome may decompress to when read: records written before the cap
/// above hold up to a whole `result.json`, which is accepted up to 8 MiB. More is no record
/// of ours (a bomb), and is refused.
const MAX_READ_OUTCOME_JSON: u64 = 16 * 1024 * 1024;

/// An outcome in its stored form: exactly one of the two is set.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct EncodedOutcome {
    pub(crate) json: Option<String>,
    pub(crate) zlib_b64: Option<String>,
}

impl EncodedOutcome {
    fn len(&self) -> usize {
        self.json
            .as_ref()
            .or(self.zlib_b64.as_ref())
            .map_or(0, String::len)
    }
}

/// The outcome encoded if its JSON is at most `max` bytes: plain when short, else packed as
/// it is written, so the whole JSON of a large one is never held.
fn encode_at_most(outcome: &Outcome, max: usize) -> Option<EncodedOutcome> {
    // Buffered: the serializer writes a token at a time.
    let mut writer = std::io::BufWriter::new(payload::Packer::new(COMPRESS_ABOVE, max));
    serde_json::to_writer(&mut writer, outcome).ok()?;
    let packer = writer.into_inner().ok()?;
    Some(match packer.finish().ok()? {
        payload::Packed::Plain(bytes) => EncodedOutcome {
            json: Some(String::from_utf8(bytes).ok()?),
            zlib_b64: None,
        },
        payload::Packed::Zlib(packed) => EncodedOutcome {
            json: None,
            zlib_b64: Some(packed),
        },
    })
}

/// The outcome encoded, if it fits both limits: what the store takes, and what it will
/// decompress to.
fn encode_within_limits(outcome: &Outcome) -> Option<EncodedOutcome> {
    encode_at_most(outcome, MAX_OUTCOME_JSON).filter(|e| e.len() <= MAX_STORED_OUTCOME)
}

/// The outcome as the store keeps it: whole if it fits [`MAX_STORED_OUTCOME`] and
/// [`MAX_OUTCOME_JSON`], else without its logs, else without its result (the verdict, drawn
/// from the whole result, always survives). Transitions carry it in this form, so what is reported first is what a resend
/// reads back. `None`: it fits as it is.
pub(crate) fn fit_outcome(outcome: &Outcome) -> Option<Outcome> {
    fitted(outcome).1
}

/// Encodes an outcome within [`MAX_STORED_OUTCOME`], cut as [`fit_outcome`] cuts it.
pub(crate) fn encode_outcome(outcome: &Outcome) -> EncodedOutcome {
    fitted(outcome).0
}

fn fitted(outcome: &Outcome) -> (EncodedOutcome, Option<Outcome>) {
    if let Some(whole) = encode_within_limits(outcome) {
        return (whole, None);
    }
    let mut slim = outcome.clone();
    if let Some(result) = slim.result.as_mut() {
        result.drop_logs();
    }
    if let Some(encoded) = encode_within_limits(&slim) {
        return (encoded, Some(slim));
    }
    let bare = outcome.without_result("the result was too large to store");
    (
        encode_at_most(&bare, usize::MAX).unwrap_or_default(),
        Some(bare),
    )
}

pub(crate) fn decode_outcome(
    json: Option<&str>,
    zlib_b64: Option<&str>,
) -> Result<Option<Outcome>, StoreError> {
    let parsed = match (json, zlib_b64) {
        (Some(j), _) => serde_json::from_str(j),
        (None, Some(z)) => {
            // Parsed as it is inflated: the whole JSON is never held.
            let reader =
                payload::unpacking(z, MAX_READ_OUTCOME_JSON).map_err(StoreError::corrupt)?;
            serde_json::from_reader(std::io::BufReader::new(reader))
        }
        (None, None) => return Ok(None),
    };
    parsed.map(Some).map_err(StoreError::corrupt)
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

    #[test]
    fn no_stored_outcome_decompresses_past_the_cap() {
        let mut o = outcome_with_log(10, false);
        let run = o.result.as_mut().unwrap().runs.get_mut("test").unwrap();
        let entries = &mut run.run.as_mut().unwrap().result;
        for i in 0..2600 {
            entries.insert(format!("test.{i}.message"), "x".repeat(2048).into());
        }
        let json_len = serde_json::to_string(&o).unwrap().len();
        assert!(json_len > MAX_OUTCOME_JSON, "{json_len}");
        let whole = encode_at_most(&o, usize::MAX).unwrap();
        assert!(
            whole.len() <= MAX_STORED_OUTCOME,
            "compressed, it would fit the store"
        );
        let enc = encode_outcome(&o);
        let back = decode_outcome(enc.json.as_deref(), enc.zlib_b64.as_deref())
            .unwrap()
            .unwrap();
        assert!(serde_json::to_string(&back).unwrap().len() <= MAX_OUTCOME_JSON);
        assert_eq!(back.verdict, o.verdict);
        assert_eq!(fit_outcome(&o), Some(back));
    }

    #[test]
    fn a_record_written_before_the_cap_still_reads() {
        let mut o = outcome_with_log(10, false);
        let run = o.result.as_mut().unwrap().runs.get_mut("test").unwrap();
        let entries = &mut run.run.as_mut().unwrap().result;
        for i in 0..3000 {
            entries.insert(format!("test.{i}.message"), "y".repeat(2048).into());
        }
        let json = serde_json::to_string(&o).unwrap();
        assert!(json.len() > MAX_OUTCOME_JSON);
        let legacy = payload::pack(json.as_bytes());
        assert_eq!(decode_outcome(None, Some(&legacy)).unwrap(), Some(o));
    }

    #[test]
    fn a_stored_outcome_over_the_cap_is_refused_not_inflated() {
        let bomb = payload::pack(&vec![b' '; MAX_READ_OUTCOME_JSON as usize + 1]);
        assert!(bomb.len() < 64 * 1024);
        let err = decode_outcome(None, Some(&bomb)).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
        assert!(err.to_string().contains("exceeds"), "{err}");
    }
}
