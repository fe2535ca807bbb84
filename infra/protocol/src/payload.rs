//! The build payload: the submission's config as JSON, zlib-compressed, then standard base64.
//!
//! This is the format kernelbot's launchers already use (`base64(zlib(json))`), so runner
//! images built for kernelbot can read it unchanged.

use std::io::{Read, Write};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use flate2::Compression;
use flate2::read::ZlibDecoder;
use flate2::write::ZlibEncoder;

/// The environment variable the payload travels in.
pub const PAYLOAD_VAR: &str = "KERNELBOT_PAYLOAD";

/// Linux limits one `NAME=value` environment string to `MAX_ARG_STRLEN` (128 KiB, including
/// the terminating NUL). A longer payload would make every exec on the agent fail with E2BIG.
pub const MAX_ENV_STRING: usize = 128 * 1024;

/// The longest encoded payload that still fits in `KERNELBOT_PAYLOAD=<payload>\0`.
pub const MAX_ENCODED_LEN: usize = MAX_ENV_STRING - PAYLOAD_VAR.len() - 2;

/// Upper bound for a decoded payload, so a small zlib bomb cannot exhaust memory.
pub const MAX_DECODED_LEN: u64 = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    #[error("payload is {len} bytes encoded; the limit is {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("payload is not valid base64: {0}")]
    Base64(#[from] base64::DecodeError),
    #[error("payload is not a valid zlib stream: {0}")]
    Zlib(#[source] std::io::Error),
    #[error("decompressed payload exceeds {max} bytes")]
    DecodedTooLarge { max: u64 },
    #[error("payload is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// zlib, then standard base64: the packing of the payload, and of large stored results.
pub fn pack(bytes: &[u8]) -> String {
    let mut encoder = ZlibEncoder::new(Vec::new(), Compression::default());
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(bytes);
    STANDARD.encode(encoder.finish().unwrap_or_default())
}

/// Undoes [`pack`], refusing more than [`MAX_DECODED_LEN`] bytes of output.
pub fn unpack(encoded: &str) -> Result<Vec<u8>, PayloadError> {
    unpack_within(encoded, MAX_DECODED_LEN)
}

/// Undoes [`pack`], refusing more than `max` bytes of output (it stops reading there).
pub fn unpack_within(encoded: &str, max: u64) -> Result<Vec<u8>, PayloadError> {
    let compressed = STANDARD.decode(encoded.trim())?;
    let mut out = Vec::new();
    ZlibDecoder::new(compressed.as_slice())
        .take(max + 1)
        .read_to_end(&mut out)
        .map_err(PayloadError::Zlib)?;
    if out.len() as u64 > max {
        return Err(PayloadError::DecodedTooLarge { max });
    }
    Ok(out)
}

/// A reader of what [`pack`] packed that refuses to yield more than `max` bytes: a large
/// value can be parsed as it is inflated, never held whole.
pub fn unpacking(encoded: &str, max: u64) -> Result<impl Read, PayloadError> {
    let compressed = STANDARD.decode(encoded.trim())?;
    Ok(AtMost {
        inner: ZlibDecoder::new(std::io::Cursor::new(compressed)),
        left: max,
        max,
    })
}

/// A reader that errs rather than yield more than `max` bytes.
struct AtMost<R> {
    inner: R,
    left: u64,
    max: u64,
}

impl<R: Read> Read for AtMost<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            let max = self.max;
            return Err(std::io::Error::other(PayloadError::DecodedTooLarge { max }));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// What a [`Packer`] made of what was written to it.
pub enum Packed {
    /// All of it, as written: it was short.
    Plain(Vec<u8>),
    /// Packed as [`pack`] packs.
    Zlib(String),
}

/// A writer that keeps what is written while it is at most `keep` bytes, then packs it as it
/// is written (so a large value is never held whole); a write past `max` bytes fails.
pub struct Packer {
    plain: Vec<u8>,
    /// Made only once the value outgrows `keep`: a short one is never compressed.
    zlib: Option<ZlibEncoder<Vec<u8>>>,
    keep: usize,
    written: usize,
    max: usize,
}

impl Packer {
    pub fn new(keep: usize, max: usize) -> Self {
        Self {
            plain: Vec::new(),
            zlib: None,
            keep,
            written: 0,
            max,
        }
    }

    pub fn finish(self) -> std::io::Result<Packed> {
        match self.zlib {
            None => Ok(Packed::Plain(self.plain)),
            Some(zlib) => Ok(Packed::Zlib(STANDARD.encode(zlib.finish()?))),
        }
    }
}

impl Write for Packer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.written += buf.len();
        if self.written > self.max {
            return Err(std::io::Error::other("the value is over its size limit"));
        }
        match &mut self.zlib {
            Some(zlib) => zlib.write_all(buf)?,
            None if self.written <= self.keep => self.plain.extend_from_slice(buf),
            None => {
                let mut zlib = ZlibEncoder::new(Vec::new(), Compression::default());
                zlib.write_all(&std::mem::take(&mut self.plain))?;
                zlib.write_all(buf)?;
                self.zlib = Some(zlib);
            }
        }
        Ok(buf.len())
    }

    /// Nothing leaves memory until [`Packer::finish`]; a zlib flush would only cost ratio.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Encodes a config; refuses one whose encoding would not fit in an environment variable.
pub fn encode(config: &serde_json::Value) -> Result<String, PayloadError> {
    let encoded = pack(&serde_json::to_vec(config)?);
    if encoded.len() > MAX_ENCODED_LEN {
        return Err(PayloadError::TooLarge {
            len: encoded.len(),
            max: MAX_ENCODED_LEN,
        });
    }
    Ok(encoded)
}

/// Decodes a payload back into the config JSON.
pub fn decode(encoded: &str) -> Result<serde_json::Value, PayloadError> {
    Ok(serde_json::from_slice(&unpack(encoded)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_a_config() {
        let config = json!({"lang": "py", "mode": "test", "sources": {"eval.py": "print(1)"}});
        let encoded = encode(&config).expect("encodes");
        assert_eq!(decode(&encoded).expect("decodes"), config);
    }

    #[test]
    fn decodes_what_python_writes() {
        // base64.b64encode(zlib.compress(json.dumps({"lang": "py"}).encode())).decode()
        let from_python = "eJyrVspJzEtXslJQKqhUqgUAIaQEZg==";
        assert_eq!(decode(from_python).expect("decodes"), json!({"lang": "py"}));
    }

    #[test]
    fn refuses_a_payload_over_the_env_limit() {
        // Random-looking text barely compresses, so 200 KiB of it cannot fit.
        let mut rng = fastrand::Rng::with_seed(7);
        let noise: String = (0..200_000).map(|_| rng.alphanumeric()).collect();
        let err = encode(&json!({"sources": {"k.py": noise}})).unwrap_err();
        assert!(
            matches!(err, PayloadError::TooLarge { len, max } if len > max && max == MAX_ENCODED_LEN)
        );
    }

    #[test]
    fn a_packer_packs_as_pack_does_and_keeps_short_values_plain() {
        let long = "abc".repeat(10_000);
        let mut packer = Packer::new(100, usize::MAX);
        packer.write_all(long.as_bytes()).expect("written");
        let Ok(Packed::Zlib(packed)) = packer.finish() else {
            panic!("a long value is packed");
        };
        assert_eq!(unpack(&packed).expect("unpacks"), long.as_bytes());
        let mut inflated = Vec::new();
        unpacking(&packed, 30_000)
            .expect("base64")
            .read_to_end(&mut inflated)
            .expect("within its limit");
        assert_eq!(inflated, long.as_bytes());
        let over = unpacking(&packed, 29_999)
            .expect("base64")
            .read_to_end(&mut Vec::new());
        assert!(
            over.unwrap_err()
                .to_string()
                .contains("exceeds 29999 bytes")
        );

        let mut short = Packer::new(100, usize::MAX);
        short.write_all(b"{}").expect("written");
        assert!(matches!(short.finish(), Ok(Packed::Plain(p)) if p == b"{}"));
        let mut capped = Packer::new(100, 10);
        assert!(capped.write_all(&[b' '; 11]).is_err(), "over its limit");
    }

    #[test]
    fn names_the_layer_that_is_corrupt() {
        assert!(matches!(decode("%%%"), Err(PayloadError::Base64(_))));
        assert!(matches!(decode("aGVsbG8="), Err(PayloadError::Zlib(_))));
        // zlib.compress(b"not json")
        assert!(matches!(
            decode("eJzLyy9RyCrOzwMADiYDLA=="),
            Err(PayloadError::Json(_))
        ));
    }
}
