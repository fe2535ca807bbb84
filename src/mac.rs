//! HMAC-SHA256 of a message given in parts: the one helper behind every signature the
//! service makes or checks (Buildkite's webhook signature, the callbacks' Standard Webhooks
//! signature, profile links), so each names only its message's layout.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

fn mac(key: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    for part in parts {
        mac.update(part);
    }
    mac
}

/// The HMAC-SHA256 under `key` of `parts` joined as they are.
pub(crate) fn sign(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    mac(key, parts).finalize().into_bytes().into()
}

/// Whether `presented` is the HMAC-SHA256 under `key` of `parts`, compared in constant time.
pub(crate) fn verify(key: &[u8], parts: &[&[u8]], presented: &[u8]) -> bool {
    mac(key, parts).verify_slice(presented).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_rfc_4231_test_case_2() {
        // RFC 4231, 4.3: key "Jefe", data "what do ya want for nothing?", given in parts.
        let expected = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        let parts: [&[u8]; 3] = [b"what do ya", b" want ", b"for nothing?"];
        assert_eq!(hex::encode(sign(b"Jefe", &parts)), expected);
        let whole = hex::decode(expected).expect("hex");
        assert!(verify(b"Jefe", &parts, &whole));
        assert!(
            !verify(b"Jefe", &parts, &whole[..31]),
            "a prefix is no signature"
        );
        assert!(!verify(b"jefe", &parts, &whole), "another key");
        assert!(!verify(b"Jefe", &[b"what do ya want for nothing!"], &whole));
    }
}
