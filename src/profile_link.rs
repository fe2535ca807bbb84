//! Signed links to a profile run's files: `/submissions/{run_id}/profiles/{i}?expires=<unix
//! seconds>&signature=<hex HMAC-SHA256 of "{path}\n{expires}">`. Anyone holding one may open
//! it until it expires, without the submit token (Discord users click it); another path
//! (another run or profile), another expiry or another signature is refused.

/// Why a link is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error("the link's signature does not match it")]
    Signature,
    #[error("the link has expired")]
    Expired,
}

/// The path a link opens.
pub(crate) fn path(run_id: &str, index: usize) -> String {
    format!("/submissions/{run_id}/profiles/{index}")
}

/// What a link signs: `{path}\n{expires}`.
fn signed(path: &str, expires: i64) -> String {
    format!("{path}\n{expires}")
}

/// The signature of `path` until `expires`.
pub(crate) fn sign(key: &[u8], path: &str, expires: i64) -> String {
    hex::encode(crate::mac::sign(key, &[signed(path, expires).as_bytes()]))
}

/// The query of a link to `path` valid until `expires`.
pub(crate) fn query(key: &[u8], path: &str, expires: i64) -> String {
    format!("expires={expires}&signature={}", sign(key, path, expires))
}

/// Whether `signature` signs `path` until `expires`, and that is not before `now` (unix
/// seconds). The signature is checked first, in constant time: an expired link with a
/// forged expiry says so no differently than any other forgery.
pub(crate) fn verify(
    key: &[u8],
    path: &str,
    expires: i64,
    signature: &str,
    now: i64,
) -> Result<(), Refused> {
    let presented = hex::decode(signature).map_err(|_| Refused::Signature)?;
    if !crate::mac::verify(key, &[signed(path, expires).as_bytes()], &presented) {
        return Err(Refused::Signature);
    }
    if expires < now {
        return Err(Refused::Expired);
    }
    Ok(())
}

/// [`verify`] with each of `keys` (several while one is rotated): a link any of them signed
/// is ours, and then refused only if it has expired.
pub(crate) fn verify_any<'k>(
    keys: impl IntoIterator<Item = &'k [u8]>,
    path: &str,
    expires: i64,
    signature: &str,
    now: i64,
) -> Result<(), Refused> {
    let mut refused = Refused::Signature;
    for key in keys {
        match verify(key, path, expires, signature, now) {
            Ok(()) => return Ok(()),
            Err(Refused::Expired) => refused = Refused::Expired,
            Err(Refused::Signature) => {}
        }
    }
    Err(refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"profile-link-key";

    #[test]
    fn a_link_opens_its_own_path_until_it_expires() {
        let p = path("kb-1", 0);
        assert_eq!(p, "/submissions/kb-1/profiles/0");
        let sig = sign(KEY, &p, 1_000);
        assert_eq!(sig.len(), 64);
        assert_eq!(verify(KEY, &p, 1_000, &sig, 999), Ok(()));
        assert_eq!(verify(KEY, &p, 1_000, &sig, 1_000), Ok(()));
        assert_eq!(verify(KEY, &p, 1_000, &sig, 1_001), Err(Refused::Expired));
        assert!(query(KEY, &p, 1_000).starts_with("expires=1000&signature="));
    }

    #[test]
    fn while_a_key_is_rotated_links_of_either_open() {
        let (old, new) = (&b"old-key"[..], &b"new-key"[..]);
        let p = path("kb-1", 0);
        for signer in [old, new] {
            let sig = sign(signer, &p, 1_000);
            assert_eq!(verify_any([old, new], &p, 1_000, &sig, 0), Ok(()));
            assert_eq!(
                verify_any([old, new], &p, 1_000, &sig, 2_000),
                Err(Refused::Expired)
            );
            assert_eq!(
                verify_any([b"other".as_slice()], &p, 1_000, &sig, 0),
                Err(Refused::Signature)
            );
        }
        assert_eq!(
            verify_any([new], &p, 1_000, &sign(old, &p, 1_000), 0),
            Err(Refused::Signature)
        );
    }

    #[test]
    fn any_change_to_a_link_is_refused() {
        let p = path("kb-1", 0);
        let sig = sign(KEY, &p, 1_000);
        let mut flipped = sig.clone().into_bytes();
        flipped[10] = if flipped[10] == b'a' { b'b' } else { b'a' };
        let flipped = String::from_utf8(flipped).unwrap();
        for (path, expires, sig, key) in [
            (path("kb-2", 0), 1_000, sig.as_str(), KEY),
            (path("kb-1", 1), 1_000, &sig, KEY),
            (p.clone(), 2_000, &sig, KEY),
            (p.clone(), 1_000, &flipped, KEY),
            (p.clone(), 1_000, &sig[..62], KEY),
            (p.clone(), 1_000, "not hex", KEY),
            (p.clone(), 1_000, "", KEY),
            (p.clone(), 1_000, &sig, b"another-key"),
        ] {
            assert_eq!(
                verify(key, &path, expires, sig, 0),
                Err(Refused::Signature),
                "{path} {expires} {sig}"
            );
        }
    }
}
