//! The entries every instance shares beside the jobs (the agents list, a queue's records and
//! lists, the fleet's records): one key per kind of entry, and one read-modify-write for
//! those changed by many at once, with one retry policy. Each is a JSON value in a
//! [`CacheEntry`], written by compare-and-swap on the entry's version.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::StoreError;
use super::id::{Queue, RunId, UserId};
use super::store::{CacheEntry, JobStore, next_version};
use crate::time::Millis;

/// A kind of shared entry and what it is of. Every key starts with `~`, which a run id never
/// holds, so an entry never meets a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedKey<'a> {
    /// The agents list as last read from Buildkite, and who may refresh it.
    Agents,
    /// Buildkite's rate-limit window as every instance spends it.
    BuildkiteQuota,
    /// Run `.0`'s profile `.1`: its storage URL while that may be handed out.
    ProfileUrl(&'a RunId, usize),
    /// A queue's fair-share lease.
    FairLease(&'a Queue),
    /// A queue's record of its ended jobs.
    QueueRecord(&'a Queue),
    /// A queue's creates and finishes that Buildkite's rate limit deferred.
    Deferred(&'a Queue),
    /// The names of the agents that have a record.
    Fleet,
    /// One agent's record.
    Agent(&'a str),
    /// A rate-limit window every instance spends (Buildkite's per token, Discord's per
    /// webhook), by name.
    Window(&'a str),
    /// A user's GPU time over the last day (`USER_GPU_SECONDS_PER_DAY`).
    Usage(&'a UserId),
}

impl SharedKey<'_> {
    /// The key it is stored under (as earlier versions stored it).
    pub fn key(self) -> String {
        match self {
            Self::Agents => "~agents".into(),
            Self::BuildkiteQuota => "~buildkite-quota".into(),
            Self::ProfileUrl(run_id, index) => format!("~profile-url/{}/{index}", run_id.as_str()),
            Self::FairLease(queue) => format!("~fair/{queue}"),
            Self::QueueRecord(queue) => format!("~queue/{queue}"),
            Self::Deferred(queue) => format!("~deferred/{queue}"),
            Self::Fleet => "~fleet".into(),
            Self::Agent(name) => format!("~agent/{name}"),
            Self::Window(name) => format!("~window/{name}"),
            Self::Usage(user) => format!("~usage#{user}"),
        }
    }
}

const HOUR_MS: Millis = 3_600_000;
const DAY_MS: Millis = 24 * HOUR_MS;

impl SharedKey<'_> {
    /// How long an entry of this kind outlives its last write (`None`: it does not expire):
    /// past it, the store forgets it (an agent never seen again, a lease nobody took again,
    /// a URL long expired).
    pub fn lifetime(self) -> Option<Millis> {
        match self {
            // Refreshed every few minutes while anyone asks; a window resets each minute.
            // A user's use covers a day: a day after its last write none of it counts.
            Self::Agents | Self::BuildkiteQuota | Self::Window(_) | Self::Usage(_) => Some(DAY_MS),
            // A URL is kept for minutes; a job's deferred work is only a hint to the sweep.
            Self::ProfileUrl(..) | Self::Deferred(_) => Some(2 * DAY_MS),
            // A lease is held for seconds; a day later nobody is waiting on it.
            Self::FairLease(_) => Some(DAY_MS),
            // Kept while the queue or the agent is used: every ended job writes them.
            Self::QueueRecord(_) | Self::Agent(_) => Some(30 * DAY_MS),
            // The list of agents with records: if it expired while they live, they would
            // drop out of the sweep's look. It is bounded, and the sweep takes off it the
            // agents whose records have expired.
            Self::Fleet => None,
        }
    }

    /// When an entry of this kind written at `now` expires.
    pub fn expires(self, now: Millis) -> Option<Millis> {
        self.lifetime().map(|l| now.saturating_add(l))
    }
}

/// Tries of one read-modify-write before it says the entry kept changing: each lost try
/// means another instance wrote in between, so eight in a row is contention, not bad luck.
pub const TRIES: usize = 8;

/// What a read-modify-write did.
#[derive(Debug, PartialEq, Eq)]
pub struct Changed<R> {
    /// What the change said of the value it left.
    pub said: R,
    /// Whether it wrote (the value changed, or an older entry got its expiry), and whether
    /// that made the value (there was none, or it had expired).
    pub wrote: Option<First>,
}

/// Whether a write made the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum First {
    Yes,
    No,
}

/// The value under `key` at `now` with its version (`None`: no entry); a value that
/// does not parse, or has expired (the store forgets it later), is `None` too, so the next
/// write replaces it.
pub async fn read<T: DeserializeOwned>(
    store: &dyn JobStore,
    key: SharedKey<'_>,
    now: Millis,
) -> Result<(Option<T>, Option<Millis>), StoreError> {
    let (value, version, _) = read_entry(store, key, now).await?;
    Ok((value, version))
}

/// As [`read`], with when the entry expires.
async fn read_entry<T: DeserializeOwned>(
    store: &dyn JobStore,
    key: SharedKey<'_>,
    now: Millis,
) -> Result<(Option<T>, Option<Millis>, Option<Millis>), StoreError> {
    let entry = store.cached(&key.key()).await?;
    Ok(parse(entry.as_ref(), now))
}

/// `entry`'s value (`None` where it does not parse or has expired), version and expiry.
pub(crate) fn parse<T: DeserializeOwned>(
    entry: Option<&CacheEntry>,
    now: Millis,
) -> (Option<T>, Option<Millis>, Option<Millis>) {
    let version = entry.map(|e| e.version);
    let expires_at = entry.and_then(|e| e.expires_at);
    let value = entry
        .filter(|e| e.expires_at.is_none_or(|at| at > now))
        .and_then(|e| serde_json::from_str(e.value.as_deref()?).ok());
    (value, version, expires_at)
}

/// Whether an unchanged value is written all the same: an entry of a kind that expires,
/// written before entries had an expiry, gets one at its next read-modify-write.
fn stamp(key: SharedKey<'_>, expires_at: Option<Millis>) -> bool {
    expires_at.is_none() && key.lifetime().is_some()
}

/// Reads the value under `key` (`init` where there is none), lets `change` change it, and
/// writes it back if nobody wrote in between, else again on what they wrote, up to [`TRIES`]
/// times. Each write sets the entry's expiry anew; an unchanged value is not written (but
/// to give an older entry its expiry; a change to nothing, on a value that is gone, is no
/// write either).
pub async fn update<T, R>(
    store: &dyn JobStore,
    key: SharedKey<'_>,
    now: Millis,
    init: impl Fn() -> T,
    change: impl FnMut(&mut T) -> R,
) -> Result<Changed<R>, StoreError>
where
    T: Serialize + DeserializeOwned + Clone + PartialEq,
{
    let (changed, _) = update_seen(store, key, (now, None), init, change).await?;
    Ok(changed)
}

/// As [`update`], starting from `seen`, the entry as this caller last read or wrote it
/// (`None`: read it first), and with the entry as it then stands (`None`: there is none),
/// for the caller's next change. A stale `seen` costs nothing in safety: its write is
/// refused by the version check and the change made again on the entry that refused it
/// (which the refusal brings: no read), and a change to nothing is trusted only on an
/// entry as it stands.
pub async fn update_seen<T, R>(
    store: &dyn JobStore,
    key: SharedKey<'_>,
    (now, seen): (Millis, Option<CacheEntry>),
    init: impl Fn() -> T,
    mut change: impl FnMut(&mut T) -> R,
) -> Result<(Changed<R>, Option<CacheEntry>), StoreError>
where
    T: Serialize + DeserializeOwned + Clone + PartialEq,
{
    let stored = key.key();
    let mut fresh = seen.is_none();
    let mut known = seen.map(Some);
    for _ in 0..TRIES {
        let entry = match known.take() {
            Some(entry) => entry,
            None => {
                fresh = true;
                store.cached(&stored).await?
            }
        };
        let (value, version, expires_at) = parse::<T>(entry.as_ref(), now);
        let existed = value.is_some();
        let mut value = value.unwrap_or_else(&init);
        let before = value.clone();
        let said = change(&mut value);
        if value == before && !(existed && stamp(key, expires_at)) {
            if fresh {
                return Ok((Changed { said, wrote: None }, entry));
            }
            continue;
        }
        let json = serde_json::to_string(&value).map_err(StoreError::corrupt)?;
        let next = CacheEntry::unclaimed(
            Some(json),
            now,
            next_version(version, now),
            key.expires(now),
        );
        match store.swap_cached(&stored, &next, version).await? {
            Ok(()) => {
                let first = if existed { First::No } else { First::Yes };
                let wrote = Some(first);
                return Ok((Changed { said, wrote }, Some(next)));
            }
            Err(standing) => (known, fresh) = (Some(standing), true),
        }
    }
    Err(StoreError::unavailable(format!(
        "the shared entry {stored} kept changing"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_entry_is_stamped_once_and_a_new_one_counts_from_the_time() {
        let run: RunId = "run-7".parse().expect("run id");
        // (kind, its expiry as stored, stamped)
        let cases = [
            (SharedKey::Agent("a"), None, true),
            (SharedKey::Agent("a"), Some(5), false),
            (SharedKey::QueueRecord(&Queue::new("q")), None, true),
            (SharedKey::Deferred(&Queue::new("q")), None, true),
            (SharedKey::ProfileUrl(&run, 0), None, true),
            (SharedKey::Fleet, None, false),
        ];
        for (key, at, stamped) in cases {
            assert_eq!(stamp(key, at), stamped, "{key:?} {at:?}");
        }
        assert_eq!(next_version(Some(7), 1_000), 8);
        assert_eq!(next_version(None, 1_000), 1_000);
        assert_eq!(next_version(None, 0), 1, "never 0");
    }

    #[test]
    fn every_kind_but_the_fleet_s_list_expires_an_agent_a_month_after_its_last_write() {
        let run: RunId = "run-7".parse().expect("run id");
        let kinds = [
            SharedKey::Agents,
            SharedKey::BuildkiteQuota,
            SharedKey::ProfileUrl(&run, 0),
            SharedKey::FairLease(&Queue::new("q")),
            SharedKey::QueueRecord(&Queue::new("q")),
            SharedKey::Deferred(&Queue::new("q")),
            SharedKey::Agent("a"),
        ];
        for key in kinds {
            let at = key.expires(5).expect("an expiry");
            assert!(at > 5 + HOUR_MS, "{key:?} lives at least an hour");
        }
        assert_eq!(SharedKey::Agent("a").expires(0), Some(30 * 24 * 3_600_000));
        assert_eq!(SharedKey::Fleet.expires(0), None);
    }

    #[test]
    fn each_kind_keeps_the_key_earlier_versions_stored_it_under() {
        let run: RunId = "run-7".parse().expect("run id");
        let keys = [
            (SharedKey::Agents, "~agents"),
            (SharedKey::BuildkiteQuota, "~buildkite-quota"),
            (SharedKey::ProfileUrl(&run, 2), "~profile-url/run-7/2"),
            (SharedKey::FairLease(&Queue::new("h100")), "~fair/h100"),
            (SharedKey::QueueRecord(&Queue::new("h100")), "~queue/h100"),
            (SharedKey::Deferred(&Queue::new("h100")), "~deferred/h100"),
            (SharedKey::Fleet, "~fleet"),
            (SharedKey::Agent("node-1-gpu0"), "~agent/node-1-gpu0"),
            (SharedKey::Usage(&UserId::new("ada")), "~usage#ada"),
        ];
        for (key, stored) in keys {
            assert_eq!(key.key(), stored, "{key:?}");
        }
        // The sweep's bookmarks share the table: no entry may be taken for one.
        use crate::jobs::Cursor;
        for cursor in [
            Cursor::Builds,
            Cursor::OpenSends,
            Cursor::Outbox,
            Cursor::Frontier,
            Cursor::OpenPage,
        ] {
            let bookmark = cursor.key();
            assert!(keys.iter().all(|(k, _)| k.key() != bookmark), "{bookmark}");
            assert!(bookmark.starts_with('~'), "{bookmark} never meets a job");
        }
    }
}
