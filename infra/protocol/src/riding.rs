//! `result.json` as it rides the build's signed `build.finished` event: the runner packs it
//! (zlib, then standard base64, as the payload is packed) into [`RESULT_META_FILE`], the
//! agent's `post-command` hook sets it as build meta-data [`RESULT_META_DATA_KEY`], and the
//! service reads it back within the result's caps. A value Buildkite would refuse is never
//! written: the artifact is there either way.

use crate::payload::{self, PayloadError};
use crate::result::FullResult;

/// The build meta-data key the hook sets.
pub const RESULT_META_DATA_KEY: &str = "kernelbot-result";

/// The file beside `result.json` that holds the packed value for the hook, which reads no
/// JSON and links no zlib; absent when the packed result would be too long.
pub const RESULT_META_FILE: &str = "result.meta";

/// Buildkite's limit on one meta-data value, in bytes.
pub const MAX_META_DATA_VALUE: usize = 100_000;

/// Why a value from the meta-data gave no result (the artifact is read instead).
#[derive(Debug, thiserror::Error)]
pub enum RideError {
    #[error("the value is {len} bytes; Buildkite keeps at most {MAX_META_DATA_VALUE}")]
    TooLong { len: usize },
    #[error(transparent)]
    Packing(#[from] PayloadError),
    #[error("the unpacked value is not a result.json: {0}")]
    Json(#[from] serde_json::Error),
}

/// `result.json` packed for the meta-data, or `None` when it would not fit in one value.
pub fn pack_result(json: &[u8]) -> Option<String> {
    Some(payload::pack(json)).filter(|v| v.len() <= MAX_META_DATA_VALUE)
}

/// Reads a packed `result.json` back, inflating at most `max` bytes (a zip bomb stops
/// there) and parsing it with the same bounded reader as the artifact.
pub fn unpack_result(value: &str, max: u64) -> Result<FullResult, RideError> {
    if value.len() > MAX_META_DATA_VALUE {
        return Err(RideError::TooLong { len: value.len() });
    }
    let json = payload::unpack_within(value, max)?;
    Ok(FullResult::parse(&json)?)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use flate2::Compression;
    use flate2::write::ZlibEncoder;

    use super::*;

    fn zlib(bytes: &[u8]) -> Vec<u8> {
        let mut e = ZlibEncoder::new(Vec::new(), Compression::best());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn a_result_comes_back_as_the_bounded_reader_reads_the_file() {
        let json = br#"{"success": true, "error": "", "runs": {"test": {"start": "t0"}},
            "written_by": {"job_id": "0194-a", "retry_count": 1}}"#;
        let packed = pack_result(json).expect("small enough");
        let back = unpack_result(&packed, 1 << 20).unwrap();
        assert_eq!(back, FullResult::parse(json).unwrap());
        assert_eq!(
            back.written_by.map(|w| (w.job_id, w.retry_count)),
            Some(("0194-a".into(), 1))
        );
    }

    #[test]
    fn a_result_too_long_for_one_value_is_not_packed() {
        // Random text compresses little: 150,000 letters and digits pack to more than 100,000.
        let mut rng = fastrand::Rng::with_seed(7);
        let noise: String = (0..150_000).map(|_| rng.alphanumeric()).collect();
        let json = format!(r#"{{"success": true, "error": "{noise}"}}"#);
        assert!(pack_result(json.as_bytes()).is_none());
        // Repetitive logs compress well: a megabyte of them still rides.
        let logs = "line of output\n".repeat(70_000);
        let json = format!(r#"{{"success": true, "error": {logs:?}}}"#);
        assert!(json.len() > 1_000_000);
        assert!(pack_result(json.as_bytes()).is_some());
    }

    #[test]
    fn broken_values_are_refused_each_for_its_own_reason() {
        let bomb = STANDARD.encode(zlib(&vec![b' '; 64 << 20]));
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let cases: Vec<(String, &str)> = vec![
            ("not base64 at all!".into(), "base64"),
            (STANDARD.encode(b"plain text, not zlib"), "zlib"),
            (STANDARD.encode(zlib(b"{not json")), "json"),
            (STANDARD.encode(zlib(br#"{"success": "yes"}"#)), "json"),
            (STANDARD.encode(zlib(deep.as_bytes())), "json"),
            (bomb, "too large"),
            ("A".repeat(MAX_META_DATA_VALUE + 4), "long"),
        ];
        for (value, why) in cases {
            let err = unpack_result(&value, 8 << 20).expect_err(why);
            let kind = match err {
                RideError::TooLong { .. } => "long",
                RideError::Packing(PayloadError::Base64(_)) => "base64",
                RideError::Packing(PayloadError::Zlib(_)) => "zlib",
                RideError::Packing(PayloadError::DecodedTooLarge { .. }) => "too large",
                RideError::Packing(_) => "other packing",
                RideError::Json(_) => "json",
            };
            assert_eq!(kind, why, "{}", &value[..value.len().min(40)]);
        }
    }
}
