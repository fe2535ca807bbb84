//! A queue's fair-share lease in the store: taken, or marked asked when another holds it;
//! let go, or held again while releases were asked of it ([`rules::lease`] decides). Each
//! move is a compare-and-swap on the entry's version, tried again on what won.

use tracing::warn;

use super::Deps;
use super::rules::lease::{Asked, Lease, Move};
use crate::jobs::{CacheEntry, Queue, SharedKey, StoreError, next_version, shared};
use crate::time::Millis;

/// How long a queue's lease is held at most (a holder that dies frees it this late).
const LEASE_MS: Millis = 5_000;

/// The lease as this holder holds it: until when (which names the holder), and the entry
/// as it wrote it (its value and version), so that letting go needs no read unless an
/// asker or a later holder changed it since.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    until: Millis,
    wrote: (Lease, Millis),
}

/// What a caller got.
pub(crate) enum Taken {
    /// The lease, with the releases asked of it that a holder before left undone.
    Held(Held, Asked),
    /// Another holds it: marked asked, so its holder releases again.
    Asked,
}

fn entry(lease: &Lease, queue: &Queue, version: Millis, now: Millis) -> CacheEntry {
    let value = serde_json::to_string(lease).ok();
    let expires_at = SharedKey::FairLease(queue).expires(now);
    CacheEntry::unclaimed(value, now, version, expires_at)
}

/// The lease as stored, and its version.
async fn read(d: &Deps, key: &str) -> Result<(Lease, Option<Millis>), StoreError> {
    let found = d.store.cached(key).await?;
    let lease = Lease::parse(found.as_ref().and_then(|e| e.value.as_deref()));
    Ok((lease, found.map(|e| e.version)))
}

/// Takes `queue`'s lease, or marks it asked with what the caller `knew`.
pub(crate) async fn take(d: &Deps, queue: &Queue, knew: &Asked) -> Result<Taken, StoreError> {
    let key = SharedKey::FairLease(queue).key();
    for _ in 0..shared::TRIES {
        let (lease, version) = read(d, &key).await?;
        let now = d.clock.now();
        let (value, taken) = match lease.arrive(knew, now, LEASE_MS) {
            Move::Take(value, left) => {
                let until = value.until.unwrap_or(now);
                (value, Some((until, left)))
            }
            Move::Ask(value) => (value, None),
        };
        let next = next_version(version, now);
        if d.store
            .put_cached(&key, &entry(&value, queue, next, now), version)
            .await?
        {
            return Ok(match taken {
                Some((until, left)) => Taken::Held(
                    Held {
                        until,
                        wrote: (value, next),
                    },
                    left,
                ),
                None => Taken::Asked,
            });
        }
    }
    Err(StoreError::unavailable(format!(
        "the lease {key} kept changing"
    )))
}

/// Lets `held` go: `None` once it is free (or no longer this holder's), else the lease held
/// again with the releases asked of it meanwhile. At the `last` round it is freed with the
/// asks kept, for whoever takes it next.
pub(crate) async fn leave(
    d: &Deps,
    queue: &Queue,
    held: Held,
    last: bool,
) -> Result<Option<(Held, Asked)>, StoreError> {
    let key = SharedKey::FairLease(queue).key();
    // First from the entry as this holder wrote it; an asker's mark (or, past its time,
    // another holder) changed its version, and the write is refused: then read.
    let mut wrote = Some((held.wrote.0, Some(held.wrote.1)));
    for _ in 0..shared::TRIES {
        let (lease, version) = match wrote.take() {
            Some(known) => known,
            None => read(d, &key).await?,
        };
        let now = d.clock.now();
        let Some(next) = lease.leave(held.until, (now, LEASE_MS), last) else {
            warn!(%queue, "the fair-share lease outlived its holder; another holds it now");
            return Ok(None);
        };
        let (value, again) = match next {
            Ok(free) => (free, None),
            Err((value, asked)) => (value, Some(asked)),
        };
        let v = next_version(version, now);
        if d.store
            .put_cached(&key, &entry(&value, queue, v, now), version)
            .await?
        {
            let until = value.until.unwrap_or(now);
            return Ok(again.map(|asked| {
                let wrote = (value, v);
                (Held { until, wrote }, asked)
            }));
        }
    }
    Err(StoreError::unavailable(format!(
        "the lease {key} kept changing"
    )))
}
