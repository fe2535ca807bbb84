//! A queue's fair-share lease in the store: taken, or marked asked when another holds it;
//! let go, or held again while releases were asked of it ([`rules::lease`] decides). Each
//! move is a compare-and-swap on the entry's version, from the entry as this instance last
//! saw it, tried again on what won (which the refusal brings: no read).

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

/// The lease in `entry`, and its version.
fn parse(entry: Option<&CacheEntry>) -> (Lease, Option<Millis>) {
    let lease = Lease::parse(entry.and_then(|e| e.value.as_deref()));
    (lease, entry.map(|e| e.version))
}

/// The lease entry to decide from: `known` (as this instance last saw it, or as a refusal
/// brought it), else as stored.
async fn current(
    d: &Deps,
    key: &str,
    known: Option<Option<CacheEntry>>,
) -> Result<Option<CacheEntry>, StoreError> {
    match known {
        Some(entry) => Ok(entry),
        None => d.store.cached(key).await,
    }
}

/// Writes `value` over the entry of `version`: whether it landed, else the entry that
/// refused it. What stands after is noted as this instance's view of the lease.
async fn swap(
    d: &Deps,
    (key, queue): (&str, &Queue),
    (value, next, version): (&Lease, Millis, Option<Millis>),
    now: Millis,
) -> Result<Result<(), Option<CacheEntry>>, StoreError> {
    let written = entry(value, queue, next, now);
    let swapped = d.store.swap_cached(key, &written, version).await;
    match &swapped {
        Ok(Ok(())) => d.seen.keep(key, Some(written), now),
        Ok(Err(standing)) => d.seen.keep(key, standing.clone(), now),
        Err(_) => d.seen.keep(key, None, now),
    }
    swapped
}

/// Takes `queue`'s lease, or marks it asked with what the caller `knew`: from the lease as
/// this instance last saw it (a write over an entry since changed is refused, and decided
/// again on the entry that refused it).
pub(crate) async fn take(d: &Deps, queue: &Queue, knew: &Asked) -> Result<Taken, StoreError> {
    let key = SharedKey::FairLease(queue).key();
    let mut known = d.seen.get(&key).map(Some);
    for _ in 0..shared::TRIES {
        let (lease, version) = parse(current(d, &key, known.take()).await?.as_ref());
        let now = d.clock.now();
        let (value, taken) = match lease.arrive(knew, now, LEASE_MS) {
            Move::Take(value, left) => {
                let until = value.until.unwrap_or(now);
                (value, Some((until, left)))
            }
            Move::Ask(value) => (value, None),
        };
        let next = next_version(version, now);
        match swap(d, (&key, queue), (&value, next, version), now).await? {
            Ok(()) => {
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
            Err(standing) => known = Some(standing),
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
    // another holder) changed its version, and the write is refused with their entry.
    let mut wrote = Some((held.wrote.0, Some(held.wrote.1)));
    let mut known = None;
    for _ in 0..shared::TRIES {
        let (lease, version) = match wrote.take() {
            Some(mine) => mine,
            None => parse(current(d, &key, known.take()).await?.as_ref()),
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
        match swap(d, (&key, queue), (&value, v, version), now).await? {
            Ok(()) => {
                let until = value.until.unwrap_or(now);
                return Ok(again.map(|asked| {
                    let wrote = (value, v);
                    (Held { until, wrote }, asked)
                }));
            }
            Err(standing) => known = Some(standing),
        }
    }
    Err(StoreError::unavailable(format!(
        "the lease {key} kept changing"
    )))
}
