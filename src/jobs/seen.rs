//! Shared entries as this instance last read or wrote them, by key. A change starts from
//! there ([`shared::update_seen`]): no read while nobody else wrote, and none when somebody
//! did (the refusal brings their entry); only a change to nothing reads, to be sure. A read
//! for display may take an entry seen a few seconds before.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::StoreError;
use super::shared::{self, Changed, SharedKey};
use super::store::{CacheEntry, JobStore};
use crate::time::Millis;

/// One entry as last seen, and when this instance saw it.
#[derive(Clone, Debug)]
struct Seen {
    entry: CacheEntry,
    at: Millis,
}

/// The entries one instance saw (its clones share them).
#[derive(Debug, Default)]
pub(crate) struct SeenEntries(Mutex<HashMap<String, Seen>>);

impl SeenEntries {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The entry under `key` as last seen.
    pub(crate) fn get(&self, key: &str) -> Option<CacheEntry> {
        self.map().get(key).map(|s| s.entry.clone())
    }

    /// Notes the entry under `key` as it stands after a read or write at `at` (`None`:
    /// there is none, or it is in doubt: the next change reads). A change of this instance's
    /// that ended later may have seen a newer entry: the newest version is kept.
    pub(crate) fn keep(&self, key: &str, standing: Option<CacheEntry>, at: Millis) {
        let mut map = self.map();
        match standing {
            Some(entry)
                if map
                    .get(key)
                    .is_none_or(|s| s.entry.version <= entry.version) =>
            {
                map.insert(key.to_owned(), Seen { entry, at });
            }
            Some(_) => {}
            None => {
                map.remove(key);
            }
        }
    }

    /// [`shared::update`] from the entry as last seen; the entry it leaves is kept.
    pub(crate) async fn update<T, R>(
        &self,
        store: &dyn JobStore,
        (key, now): (SharedKey<'_>, Millis),
        init: impl Fn() -> T,
        change: impl FnMut(&mut T) -> R,
    ) -> Result<Changed<R>, StoreError>
    where
        T: Serialize + DeserializeOwned + Clone + PartialEq,
    {
        let stored = key.key();
        let seen = self.get(&stored);
        match shared::update_seen(store, key, (now, seen), init, change).await {
            Ok((changed, standing)) => {
                self.keep(&stored, standing, now);
                Ok(changed)
            }
            Err(e) => {
                // Whatever this instance saw is in doubt.
                self.keep(&stored, None, now);
                Err(e)
            }
        }
    }

    /// The value under `key` as [`shared::read`] gives it, from the entry seen less than
    /// `within` before `now` where there is one (what is shown can be that old), else read.
    pub(crate) async fn read_within<T: DeserializeOwned>(
        &self,
        store: &dyn JobStore,
        (key, now): (SharedKey<'_>, Millis),
        within: Millis,
    ) -> Result<Option<T>, StoreError> {
        let entry = self.entry_within(store, (key, now), within).await?;
        Ok(shared::parse(entry.as_ref(), now).0)
    }

    /// The entry under `key`: as seen less than `within` before `now`, else as read (and
    /// kept).
    pub(crate) async fn entry_within(
        &self,
        store: &dyn JobStore,
        (key, now): (SharedKey<'_>, Millis),
        within: Millis,
    ) -> Result<Option<CacheEntry>, StoreError> {
        let stored = key.key();
        let recent = self.map().get(&stored).cloned();
        if let Some(seen) = recent.filter(|s| (0..within).contains(&(now - s.at))) {
            return Ok(Some(seen.entry));
        }
        let entry = store.cached(&stored).await?;
        self.keep(&stored, entry.clone(), now);
        Ok(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(version: Millis) -> CacheEntry {
        CacheEntry::unclaimed(Some(format!("{version}")), 0, version, None)
    }

    #[test]
    fn the_newest_entry_seen_is_kept_and_a_doubt_forgets_it() {
        let seen = SeenEntries::default();
        assert!(seen.get("~queue/h100").is_none(), "nothing seen yet");
        seen.keep("~queue/h100", Some(entry(5)), 1_000);
        // A change that ended later but saw an older entry does not replace the newer one.
        seen.keep("~queue/h100", Some(entry(4)), 1_100);
        assert_eq!(seen.get("~queue/h100").map(|e| e.version), Some(5));
        seen.keep("~queue/h100", Some(entry(6)), 1_200);
        assert_eq!(seen.get("~queue/h100").map(|e| e.version), Some(6));
        seen.keep("~queue/h100", None, 1_300);
        assert!(
            seen.get("~queue/h100").is_none(),
            "in doubt: read next time"
        );
    }

    /// Counted as DynamoDB bills them: a change from the entry this instance left reads
    /// nothing, nor does one after another instance wrote (the refusal brings its entry),
    /// and a read for display takes the entry seen within its bound.
    #[cfg(feature = "devstack")]
    #[tokio::test]
    async fn changes_and_recent_reads_start_from_the_entry_seen() {
        use crate::devstack::units::CountingStore;
        use crate::jobs::{Queue, SqliteStore};
        use std::sync::Arc;

        let dir = tempfile::tempdir().expect("a temporary directory");
        let inner = Arc::new(SqliteStore::open(dir.path()).expect("a store"));
        let store = CountingStore::new(inner.clone());
        let reads = || {
            let by_kind = store.units_by_kind();
            let reads = by_kind.iter().filter(|(k, _)| k.starts_with("read"));
            reads.map(|(_, u)| u.calls).sum::<u64>()
        };
        let queue = Queue::new("h100");
        let key = SharedKey::QueueRecord(&queue);
        let push = |n: u32| move |v: &mut Vec<u32>| v.push(n);
        let seen = SeenEntries::default();

        seen.update(&store, (key, 1_000), Vec::new, push(1))
            .await
            .unwrap();
        assert_eq!(reads(), 1, "the first change reads");
        seen.update(&store, (key, 1_000), Vec::new, push(2))
            .await
            .unwrap();
        assert_eq!(reads(), 1, "from the entry this instance left");
        let shown: Option<Vec<u32>> = seen.read_within(&store, (key, 3_000), 5_000).await.unwrap();
        assert_eq!((shown, reads()), (Some(vec![1, 2]), 1), "seen 2 s before");
        let shown: Option<Vec<u32>> = seen.read_within(&store, (key, 6_000), 5_000).await.unwrap();
        assert_eq!(
            (shown, reads()),
            (Some(vec![1, 2]), 2),
            "seen 5 s before: read"
        );

        shared::update(inner.as_ref(), key, 6_000, Vec::new, push(3))
            .await
            .unwrap();
        seen.update(&store, (key, 6_000), Vec::new, push(4))
            .await
            .unwrap();
        assert_eq!(reads(), 2, "the refusal brought the other's entry");
        let (stored, _) = shared::read::<Vec<u32>>(inner.as_ref(), key, 6_000)
            .await
            .unwrap();
        assert_eq!(
            stored,
            Some(vec![1, 2, 3, 4]),
            "nothing of the other's lost"
        );
    }
}
