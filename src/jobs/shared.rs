//! The entries every instance shares beside the jobs (the agents list, a queue's records and
//! lists, the fleet's records): one key per kind of entry, and one read-modify-write for
//! those changed by many at once, with one retry policy. Each is a JSON value in a
//! [`CacheEntry`], written by compare-and-swap on the entry's count of writes.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::StoreError;
use super::id::RunId;
use super::store::{CacheEntry, JobStore};
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
    FairLease(&'a str),
    /// A queue's record of its ended jobs.
    QueueRecord(&'a str),
    /// A queue's creates and finishes that Buildkite's rate limit deferred.
    Deferred(&'a str),
    /// The names of the agents that have a record.
    Fleet,
    /// One agent's record.
    Agent(&'a str),
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
        }
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
    /// Whether it wrote (the value changed), and whether that was the entry's first write.
    pub wrote: Option<First>,
}

/// Whether a write made the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum First {
    Yes,
    No,
}

/// The value under `key` with its count of writes (`None`: no entry); a value that does
/// not parse is `None` too, so the next write replaces it.
pub async fn read<T: DeserializeOwned>(
    store: &dyn JobStore,
    key: SharedKey<'_>,
) -> Result<(Option<T>, Option<Millis>), StoreError> {
    let entry = store.cached(&key.key()).await?;
    let version = entry.as_ref().map(|e| e.claimed_at);
    let value = entry.and_then(|e| serde_json::from_str(e.value.as_deref()?).ok());
    Ok((value, version))
}

/// Reads the value under `key` (`init` where there is none), lets `change` change it, and
/// writes it back if nobody wrote in between, else again on what they wrote, up to [`TRIES`]
/// times. An unchanged value is not written.
pub async fn update<T, R>(
    store: &dyn JobStore,
    key: SharedKey<'_>,
    now: Millis,
    init: impl Fn() -> T,
    mut change: impl FnMut(&mut T) -> R,
) -> Result<Changed<R>, StoreError>
where
    T: Serialize + DeserializeOwned + Clone + PartialEq,
{
    let stored = key.key();
    for _ in 0..TRIES {
        let (value, version) = read::<T>(store, key).await?;
        let mut value = value.unwrap_or_else(&init);
        let before = value.clone();
        let said = change(&mut value);
        if value == before {
            return Ok(Changed { said, wrote: None });
        }
        let next = CacheEntry {
            value: Some(serde_json::to_string(&value).map_err(StoreError::corrupt)?),
            fetched_at: now,
            claimed_at: version.unwrap_or(0) + 1,
        };
        if store.put_cached(&stored, &next, version).await? {
            let first = if version.is_none() {
                First::Yes
            } else {
                First::No
            };
            return Ok(Changed {
                said,
                wrote: Some(first),
            });
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
    fn each_kind_keeps_the_key_earlier_versions_stored_it_under() {
        let run: RunId = "run-7".parse().expect("run id");
        let keys = [
            (SharedKey::Agents, "~agents"),
            (SharedKey::BuildkiteQuota, "~buildkite-quota"),
            (SharedKey::ProfileUrl(&run, 2), "~profile-url/run-7/2"),
            (SharedKey::FairLease("h100"), "~fair/h100"),
            (SharedKey::QueueRecord("h100"), "~queue/h100"),
            (SharedKey::Deferred("h100"), "~deferred/h100"),
            (SharedKey::Fleet, "~fleet"),
            (SharedKey::Agent("node-1-gpu0"), "~agent/node-1-gpu0"),
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
        ] {
            let bookmark = cursor.key();
            assert!(keys.iter().all(|(k, _)| k.key() != bookmark), "{bookmark}");
            assert!(bookmark.starts_with('~'), "{bookmark} never meets a job");
        }
    }
}
