//! Whether a presented token (a bearer token, Buildkite's clear-text webhook token) is ours,
//! without its timing telling how close a guess came.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Whether `presented` equals `secret`, in time that depends on neither's content nor on
/// their lengths' relation: both are hashed to 32 bytes first, and the digests compared in
/// constant time (a slice compare returns at once on a length mismatch).
pub(crate) fn same(secret: &[u8], presented: &[u8]) -> bool {
    compare_with(secret, presented, |a, b| bool::from(a.ct_eq(b)))
}

/// `same` with the final compare given, so a test can see what reaches it.
fn compare_with(secret: &[u8], presented: &[u8], eq: impl Fn(&[u8], &[u8]) -> bool) -> bool {
    let (a, b) = (Sha256::digest(secret), Sha256::digest(presented));
    eq(a.as_slice(), b.as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_only_when_the_bytes_are() {
        assert!(same(b"s3cret-token", b"s3cret-token"));
        for other in [&b""[..], b"s3cret", b"s3cret-token!", b"S3cret-token", b"x"] {
            assert!(!same(b"s3cret-token", other), "{other:?}");
        }
        assert!(same(b"", b""));
    }

    #[test]
    fn the_compare_sees_the_same_length_whatever_was_presented() {
        // `ct_eq` on slices of different lengths returns at once: a guess's length would
        // show in the time taken. Whatever the lengths, the compare gets two 32-byte values.
        let secret = b"a-submit-token-of-forty-characters-long!";
        for guess in [&b""[..], b"a", &secret[..20], &secret[..], &[b'x'; 4096]] {
            let seen = std::cell::RefCell::new(Vec::new());
            compare_with(secret, guess, |a, b| {
                seen.borrow_mut().push((a.len(), b.len()));
                a == b
            });
            assert_eq!(seen.into_inner(), [(32, 32)], "{} bytes", guess.len());
        }
    }
}
