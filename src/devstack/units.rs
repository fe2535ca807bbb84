//! A store that counts what its calls would cost on DynamoDB, as DynamoDB bills them: a
//! strongly consistent read 1 read unit per 4 KB of the item, an index query half a unit per
//! 4 KB of the index entries it reads, a write 1 write unit per 1 KB of the larger of the
//! item before and after (a conditional write refused, the item as it stands), and each
//! index entry a write puts, deletes or changes (a moved key: a delete and a put) the same
//! again. An index entry is sized with DynamoDB's 100 bytes of overhead, which makes the
//! count an upper bound. It wraps the real store, whatever
//! it is, and changes nothing it does: the rush benchmark runs on it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;

use crate::jobs::{
    CacheEntry, Created, Cursor, Job, JobRecord, JobStore, Listing, OpenJob, Replaced, RunId,
    Shard, StoreError, cache_item, item_from_record,
};
use crate::time::Millis;

/// The jobs table's global secondary indexes as `template.yaml` defines them: name, the
/// attribute whose presence puts an item in it (its hash key), and the attributes it
/// projects (`None`: all). `tests/it/template.rs` checks these against the template.
pub const INDEXES: [(&str, &str, Option<&[&str]>); 4] = [
    ("open-jobs", "sweep_shard", None),
    ("queue-jobs", "open_queue", Some(&["created_at", "state"])),
    (
        "queue-fair",
        "open_queue",
        Some(&["created_at", "state", "user", "waiting", "scheduled_at"]),
    ),
    (
        "queue-place",
        "open_queue",
        Some(&[
            "created_at",
            "state",
            "user",
            "waiting",
            "scheduled_at",
            "queue_position",
        ]),
    ),
];

/// What every index entry carries beside its attributes (DynamoDB's figure).
const INDEX_ENTRY_OVERHEAD: usize = 100;

/// Read and write units counted so far, and the calls they came from.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Units {
    pub read: f64,
    pub write: f64,
    pub calls: u64,
}

type Item = HashMap<String, AttributeValue>;

/// The size DynamoDB counts of one value.
fn value_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(s) => s.len(),
        // About one byte per two significant digits, plus one.
        AttributeValue::N(n) => n.trim_start_matches('-').len().div_ceil(2) + 1,
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::M(m) => 3 + item_size(m) + m.len(),
        AttributeValue::L(l) => 3 + l.iter().map(|v| value_size(v) + 1).sum::<usize>(),
        AttributeValue::Ss(l) | AttributeValue::Ns(l) => l.iter().map(String::len).sum(),
        _ => 1,
    }
}

/// The size DynamoDB counts of an item: each attribute's name and value.
fn item_size(item: &Item) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

/// One index's entry of an item: the index, its size, its key's value and what it projects
/// (compared to tell whether a write changes the entry at all).
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    index: &'static str,
    size: usize,
    key: String,
    shown: String,
}

/// An item's index entries, one for each index that holds it.
fn index_entries(item: &Item) -> Vec<Entry> {
    let attr = |name: &str| item.get(name).map_or(0, |v| name.len() + value_size(v));
    let shown = |names: &[&str]| -> String {
        names
            .iter()
            .map(|n| format!("{n}={:?};", item.get(*n)))
            .collect()
    };
    INDEXES
        .iter()
        .filter(|(_, key, _)| item.contains_key(*key))
        .map(|(index, key, projected)| {
            let (size, shown) = match projected {
                None => {
                    let mut names: Vec<&str> = item.keys().map(String::as_str).collect();
                    names.sort_unstable();
                    (item_size(item), shown(&names))
                }
                Some(attrs) => {
                    let own = attrs.iter().map(|a| attr(a)).sum::<usize>();
                    (attr(key) + attr("run_id") + own, shown(attrs))
                }
            };
            Entry {
                index,
                size: size + INDEX_ENTRY_OVERHEAD,
                key: format!("{:?}", item.get(*key)),
                shown,
            }
        })
        .collect()
}

/// What is known of a stored item: its size and its index entries.
#[derive(Clone, Default)]
struct Stored {
    size: usize,
    entries: Vec<Entry>,
}

impl Stored {
    fn of(item: &Item) -> Self {
        Self {
            size: item_size(item),
            entries: index_entries(item),
        }
    }
}

/// Write units of the index writes that turn `before`'s entries into `after`'s: an entry put
/// or deleted costs its size; one whose key moved, a delete and a put; one whose projected
/// attributes changed, the larger of the two; one unchanged, nothing.
fn index_writes(before: &[Entry], after: &[Entry]) -> f64 {
    let mut units = 0.0;
    for a in after {
        units += match before.iter().find(|b| b.index == a.index) {
            None => write_units(a.size),
            Some(b) if b.key != a.key => write_units(b.size) + write_units(a.size),
            Some(b) if b.shown != a.shown => write_units(b.size.max(a.size)),
            Some(_) => 0.0,
        };
    }
    for b in before {
        if !after.iter().any(|a| a.index == b.index) {
            units += write_units(b.size);
        }
    }
    units
}

fn write_units(bytes: usize) -> f64 {
    bytes.max(1).div_ceil(1024) as f64
}

fn read_units(bytes: usize) -> f64 {
    bytes.max(1).div_ceil(4096) as f64
}

/// What a call's units are counted under: the call, and the kind of item it touched (a
/// job, or a shared entry by its key's first part: `~window`, `~fair`, ...).
fn kind_of(call: &str, key: &str) -> String {
    let item = match key.strip_prefix('~') {
        Some(rest) => format!("~{}", rest.split('/').next().unwrap_or(rest)),
        None => "job".to_owned(),
    };
    format!("{call} {item}")
}

/// The real store, counted.
pub struct CountingStore {
    inner: Arc<dyn JobStore>,
    units: Mutex<Units>,
    /// The same units by call and kind of item ([`kind_of`]): where they go.
    by_kind: Mutex<BTreeMap<String, Units>>,
    /// Every item written through this store, by key, as last written.
    items: Mutex<HashMap<String, Stored>>,
    /// Reads of each item, by key.
    reads: Mutex<HashMap<String, u64>>,
}

impl CountingStore {
    pub fn new(inner: Arc<dyn JobStore>) -> Self {
        Self {
            inner,
            units: Mutex::default(),
            by_kind: Mutex::default(),
            items: Mutex::default(),
            reads: Mutex::default(),
        }
    }

    /// The units counted so far.
    pub fn units(&self) -> Units {
        *self.units.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many times the item under `key` (a job's run id) was read so far.
    pub fn reads_of(&self, key: &str) -> u64 {
        let reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        reads.get(key).copied().unwrap_or(0)
    }

    /// The units counted so far by call and kind of item, largest read first.
    pub fn units_by_kind(&self) -> Vec<(String, Units)> {
        let by = self.by_kind.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<(String, Units)> = by.iter().map(|(k, u)| (k.clone(), *u)).collect();
        all.sort_by(|a, b| b.1.read.total_cmp(&a.1.read).then(a.0.cmp(&b.0)));
        all
    }

    fn add(&self, kind: String, read: f64, write: f64) {
        let mut total = self.units.lock().unwrap_or_else(|p| p.into_inner());
        total.read += read;
        total.write += write;
        total.calls += 1;
        let mut by = self.by_kind.lock().unwrap_or_else(|p| p.into_inner());
        let u = by.entry(kind).or_default();
        u.read += read;
        u.write += write;
        u.calls += 1;
    }

    fn stored(&self, key: &str) -> Option<Stored> {
        let items = self.items.lock().unwrap_or_else(|p| p.into_inner());
        items.get(key).cloned()
    }

    /// Counts a write of `item` under `key` and remembers it if it landed. A write that
    /// landed costs the larger of the item before and after, and its index writes; a
    /// conditional write refused costs the item as it stands.
    fn wrote(&self, key: &str, item: &Item, landed: bool) {
        let before = self.stored(key).unwrap_or_default();
        if !landed {
            self.add(kind_of("write", key), 0.0, write_units(before.size));
            return;
        }
        let after = Stored::of(item);
        let table = write_units(before.size.max(after.size));
        let index = index_writes(&before.entries, &after.entries);
        self.add(kind_of("write", key), 0.0, table + index);
        let mut items = self.items.lock().unwrap_or_else(|p| p.into_inner());
        items.insert(key.to_owned(), after);
    }

    /// Counts a strongly consistent read of the item under `key`.
    fn read(&self, key: &str) {
        let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        *reads.entry(key.to_owned()).or_default() += 1;
        drop(reads);
        let size = self.stored(key).map_or(1, |s| s.size);
        self.add(kind_of("read", key), read_units(size), 0.0);
    }

    /// Counts a query of `index` that read the entries of `keys`: eventually consistent,
    /// half a unit per 4 KB of them all.
    fn queried<'k>(&self, index: &str, keys: impl Iterator<Item = &'k str>) {
        let mut bytes = 0;
        for key in keys {
            let entries = self.stored(key).map(|s| s.entries).unwrap_or_default();
            bytes += entries
                .iter()
                .find(|e| e.index == index)
                .map_or(0, |e| e.size);
        }
        self.add(format!("query {index}"), read_units(bytes) / 2.0, 0.0);
    }
}

/// The job's item as the DynamoDB store writes it (a write id of the length it uses).
fn job_item(job: &Job) -> Item {
    let record = JobRecord::from_job(job, "0123456789abcdef0123456789abcdef");
    // A record that does not convert would fail the real store's write too: priced empty.
    item_from_record(&record).unwrap_or_default()
}

#[async_trait]
impl JobStore for CountingStore {
    async fn create(&self, job: &Job) -> Result<Created, StoreError> {
        let created = self.inner.create(job).await?;
        let landed = matches!(created, Created::New);
        self.wrote(job.run_id.as_str(), &job_item(job), landed);
        Ok(created)
    }

    async fn get(&self, run_id: &RunId) -> Result<Option<Job>, StoreError> {
        self.read(run_id.as_str());
        self.inner.get(run_id).await
    }

    async fn replace(&self, job: &Job, write_id: &str) -> Result<Replaced, StoreError> {
        let replaced = self.inner.replace(job, write_id).await?;
        let landed = matches!(replaced, Replaced::Written);
        self.wrote(job.run_id.as_str(), &job_item(job), landed);
        Ok(replaced)
    }

    async fn list(&self, shard: Shard, from: Millis, limit: usize) -> Result<Listing, StoreError> {
        let listing = self.inner.list(shard, from, limit).await?;
        self.queried("open-jobs", listing.jobs.iter().map(|j| j.run_id.as_str()));
        Ok(listing)
    }

    async fn open_in_queue(&self, queue: &str) -> Result<Vec<OpenJob>, StoreError> {
        let open = self.inner.open_in_queue(queue).await?;
        self.queried("queue-place", open.iter().map(|j| j.run_id.as_str()));
        Ok(open)
    }

    async fn cached(&self, key: &str) -> Result<Option<CacheEntry>, StoreError> {
        self.read(key);
        self.inner.cached(key).await
    }

    async fn put_cached(
        &self,
        key: &str,
        entry: &CacheEntry,
        expected: Option<Millis>,
    ) -> Result<bool, StoreError> {
        let landed = self.inner.put_cached(key, entry, expected).await?;
        self.wrote(key, &cache_item(key, entry), landed);
        Ok(landed)
    }

    /// A refused write answers with the entry that refused it, as DynamoDB's does (no read);
    /// where it says there is none, DynamoDB's store reads to be sure, and so is counted.
    async fn swap_cached(
        &self,
        key: &str,
        entry: &CacheEntry,
        expected: Option<Millis>,
    ) -> Result<Result<(), Option<CacheEntry>>, StoreError> {
        let swapped = self.inner.swap_cached(key, entry, expected).await?;
        self.wrote(key, &cache_item(key, entry), swapped.is_ok());
        if matches!(swapped, Err(None)) {
            self.read(key);
        }
        Ok(swapped)
    }

    async fn cursor(&self, which: Cursor) -> Result<Option<String>, StoreError> {
        self.read(which.key());
        self.inner.cursor(which).await
    }

    async fn set_cursor(&self, which: Cursor, at: Option<&str>) -> Result<(), StoreError> {
        let mut item = Item::from([("run_id".to_owned(), AttributeValue::S(which.key().into()))]);
        if let Some(c) = at {
            item.insert("cursor".to_owned(), AttributeValue::S(c.to_owned()));
        }
        self.inner.set_cursor(which, at).await?;
        self.wrote(which.key(), &item, true);
        Ok(())
    }

    async fn forget_expired(&self, now: Millis) -> Result<usize, StoreError> {
        // DynamoDB's TTL deletes cost nothing.
        self.inner.forget_expired(now).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_kept_by_call_and_kind_of_item() {
        let cases = [
            ("read", "~window/buildkite/0123abcd", "read ~window"),
            ("write", "~agents", "write ~agents"),
            ("read", "~fair/h100", "read ~fair"),
            ("write", "run-17", "write job"),
        ];
        for (call, key, expected) in cases {
            assert_eq!(kind_of(call, key), expected, "{call} {key}");
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        let inner = crate::jobs::SqliteStore::open(dir.path()).expect("a store");
        let store = CountingStore::new(Arc::new(inner));
        store.add(kind_of("read", "run-1"), 1.0, 0.0);
        store.add(kind_of("read", "~fair/q"), 2.0, 0.0);
        store.add(kind_of("read", "run-2"), 2.0, 0.0);
        let by = store.units_by_kind();
        assert_eq!(by[0].0, "read job", "largest read first");
        assert_eq!((by[0].1.read, by[0].1.calls), (3.0, 2));
        assert_eq!(store.units().read, 5.0, "the total counts each once");
    }

    #[test]
    fn sizes_are_counted_as_dynamodb_counts_them() {
        let item = Item::from([
            ("run_id".to_owned(), AttributeValue::S("abc".into())),
            ("n".to_owned(), AttributeValue::N("12345".into())),
            ("flag".to_owned(), AttributeValue::Bool(true)),
        ]);
        // "run_id"+"abc" = 9, "n" + 3 bytes for 5 digits + 1 = 1 + 4 = 5, "flag" + 1 = 5.
        assert_eq!(item_size(&item), 19);
        assert_eq!(write_units(1024), 1.0);
        assert_eq!(write_units(1025), 2.0);
        assert_eq!(read_units(4097), 2.0);
        let open = Item::from([
            ("run_id".to_owned(), AttributeValue::S("abc".into())),
            ("open_queue".to_owned(), AttributeValue::S("h100".into())),
            ("payload".to_owned(), AttributeValue::S("x".repeat(5_000))),
        ]);
        let entries = index_entries(&open);
        let names: Vec<&str> = entries.iter().map(|e| e.index).collect();
        assert_eq!(
            names,
            ["queue-jobs", "queue-fair", "queue-place"],
            "no sweep_shard: not in open-jobs"
        );
        assert!(
            entries.iter().all(|e| e.size < 200),
            "a projected index holds no payload: {entries:?}"
        );
        // The payload changes: no projected index is written; the queue moves: all three
        // are, a delete and a put each.
        let mut paid = open.clone();
        paid.insert("payload".to_owned(), AttributeValue::S("y".into()));
        assert_eq!(index_writes(&entries, &index_entries(&paid)), 0.0);
        let mut moved = open.clone();
        moved.insert("open_queue".to_owned(), AttributeValue::S("b200".into()));
        assert_eq!(index_writes(&entries, &index_entries(&moved)), 6.0);
        assert_eq!(index_writes(&entries, &[]), 3.0, "taken out of all three");
    }
}
