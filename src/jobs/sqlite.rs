//! The embedded store: one SQLite file, shared by every local process.
//!
//! `cargo lambda watch` and the local stack run each function as its own process, so the
//! store must be a file both can open; WAL mode and a busy timeout let them write side by
//! side. A replace runs inside a `BEGIN IMMEDIATE` transaction, which SQLite serialises, so
//! the version check and the write are one step across processes.

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::error::StoreError;
use super::id::RunId;
use super::listed::Listing;
use super::model::Job;
use super::record::{JobRecord, UNLISTED, WAITING_BACKGROUND};
use super::store::{
    CacheEntry, Created, Cursor, JobStore, OpenJob, Replaced, Shard, readable_run_id,
};
use crate::time::Millis;

/// Largest record either store accepts (DynamoDB's item limit): this store enforces it too,
/// so both fail alike.
const MAX_ITEM_BYTES: usize = 400 * 1024;

pub(crate) const FILE_NAME: &str = "jobs.sqlite3";

/// The store's directory could not be made.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.display())]
struct CannotCreate(std::path::PathBuf, #[source] std::io::Error);

#[derive(Clone)]
pub struct SqliteStore {
    /// The write connection's own thread, fed work in order (see [`spawn_writer`]).
    writer: Sender<Work>,
    /// A second connection for single reads, done in place (see [`JobStore::get`]).
    reader: Arc<Mutex<Connection>>,
}

/// Work for the writer thread; it sends its own answer.
type Work = Box<dyn FnOnce(&mut Connection) + Send>;

/// Whether queued work only reads, and so may be skipped once its caller has gone.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// Gives the write connection a thread of its own. SQLite runs one writer at a time anyway:
/// concurrent requests wait in this queue, not as blocking-pool threads parked on a lock
/// (under load that was dozens of threads, each woken in turn). The thread ends when the
/// last handle to the store is dropped. `tokio-rusqlite` does this too, but pins an older
/// rusqlite.
fn spawn_writer(mut conn: Connection) -> Result<Sender<Work>, StoreError> {
    let (tx, rx) = mpsc::channel::<Work>();
    std::thread::Builder::new()
        .name("sqlite-writer".into())
        .spawn(move || {
            for work in rx {
                // Each work answers its own panic (see `with`); this keeps the thread alive
                // whatever a future caller does.
                let _ = std::panic::catch_unwind(AssertUnwindSafe(|| work(&mut conn)));
            }
        })
        .map_err(unavailable)?;
    Ok(tx)
}

fn unavailable(e: impl Into<crate::error::BoxError>) -> StoreError {
    StoreError::unavailable(e)
}

/// The record's text, refused over the item limit as DynamoDB would.
fn to_json(record: &JobRecord) -> Result<String, StoreError> {
    let text = serde_json::to_string(record).map_err(StoreError::corrupt)?;
    if text.len() > MAX_ITEM_BYTES {
        return Err(StoreError::TooLarge);
    }
    Ok(text)
}

fn parse(text: &str) -> Result<JobRecord, StoreError> {
    serde_json::from_str(text).map_err(StoreError::corrupt)
}

fn read(conn: &Connection, run_id: &str) -> Result<Option<JobRecord>, StoreError> {
    conn.prepare_cached("SELECT record FROM jobs WHERE run_id = ?1")
        .and_then(|mut s| s.query_row([run_id], |r| r.get::<_, String>(0)).optional())
        .map_err(unavailable)?
        .map(|t| parse(&t))
        .transpose()
}

/// A record's version and last write id, read without parsing the record.
fn read_version(conn: &Connection, run_id: &str) -> Result<Option<(u64, String)>, StoreError> {
    conn.prepare_cached(
        "SELECT json_extract(record, '$.version'), json_extract(record, '$.write_id')
         FROM jobs WHERE run_id = ?1",
    )
    .and_then(|mut s| {
        s.query_row([run_id], |r| {
            let version = r.get::<_, Option<i64>>(0)?.unwrap_or(0).max(0) as u64;
            Ok((version, r.get::<_, Option<String>>(1)?.unwrap_or_default()))
        })
        .optional()
    })
    .map_err(unavailable)
}

fn read_cached(conn: &Connection, key: &str) -> Result<Option<CacheEntry>, StoreError> {
    conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| {
        r.get::<_, Option<String>>(0)
    })
    .optional()
    .map_err(unavailable)?
    .flatten()
    .map(|t| cache_entry(&t))
    .transpose()
}

/// A stored entry; one an earlier release wrote has no version, and its claim (what that
/// release compared) stands for it.
fn cache_entry(text: &str) -> Result<CacheEntry, StoreError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(StoreError::corrupt)?;
    let versioned = value.get("version").is_some();
    let mut entry: CacheEntry = serde_json::from_value(value).map_err(StoreError::corrupt)?;
    if !versioned {
        entry.version = entry.claimed_at;
    }
    Ok(entry)
}

/// Files written before the outbox had an `open` flag instead of a shard: carry their jobs
/// over once (records keep their own fields; missing ones read as delivered).
fn migrate_v1(conn: &Connection) -> Result<(), StoreError> {
    let old: bool = conn
        .query_row(
            "SELECT COUNT(*) FROM pragma_table_info('jobs') WHERE name = 'open'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(unavailable)?
        > 0;
    if old {
        conn.execute_batch(
            "BEGIN IMMEDIATE;
             ALTER TABLE jobs RENAME TO jobs_v1;
             DROP INDEX IF EXISTS jobs_open;
             CREATE TABLE jobs (run_id TEXT PRIMARY KEY, shard TEXT,
                                created_at INTEGER NOT NULL, record TEXT NOT NULL);
             INSERT INTO jobs SELECT run_id, CASE WHEN open = 1 THEN 'open' END, created_at, record
                              FROM jobs_v1;
             DROP TABLE jobs_v1;
             COMMIT;",
        )
        .map_err(unavailable)?;
    }
    Ok(())
}

impl SqliteStore {
    /// Opens (creating if needed) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| unavailable(CannotCreate(dir.to_owned(), e)))?;
        let conn = Connection::open(dir.join(FILE_NAME)).map_err(unavailable)?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(unavailable)?;
        migrate_v1(&conn)?;
        // WAL with `synchronous = NORMAL`: a commit survives the process crashing, and
        // is synced to disk at each checkpoint rather than each commit (a power cut can
        // lose the last few). This store is for local runs; deployments use DynamoDB.
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = NORMAL;
             CREATE TABLE IF NOT EXISTS jobs (
                 run_id     TEXT PRIMARY KEY,
                 shard      TEXT,
                 created_at INTEGER NOT NULL,
                 record     TEXT NOT NULL
             );
             CREATE INDEX IF NOT EXISTS jobs_shard ON jobs (shard, created_at);
             CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);",
        )
        .map_err(unavailable)?;
        let reader = Connection::open(dir.join(FILE_NAME)).map_err(unavailable)?;
        reader
            .busy_timeout(Duration::from_secs(5))
            .map_err(unavailable)?;
        Ok(Self {
            writer: spawn_writer(conn)?,
            reader: Arc::new(Mutex::new(reader)),
        })
    }

    /// Runs blocking SQLite work on the writer thread, off the async runtime.
    async fn with<T: Send + 'static>(
        &self,
        access: Access,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (done, answer) = tokio::sync::oneshot::channel();
        // The caller's span goes along, so the work is timed as the request's own.
        let span = tracing::Span::current();
        let work: Work = Box::new(move |conn| {
            // A reader that gave up (its request timed out) is owed nothing: under overload
            // the queue drains instead of doing work nobody waits for. A write always runs:
            // it may record an effect already had (a Discord message's id), and one dropped
            // here would have the sweep repeat that effect.
            if access == Access::Read && done.is_closed() {
                return;
            }
            let _entered = span.enter();
            let answer = std::panic::catch_unwind(AssertUnwindSafe(|| f(conn)))
                .unwrap_or_else(|_| Err(unavailable("the store's work panicked")));
            let _ = done.send(answer);
        });
        let stopped = || unavailable("the store's writer thread has stopped");
        self.writer.send(work).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

#[async_trait]
impl JobStore for SqliteStore {
    async fn create(&self, job: &Job) -> Result<Created, StoreError> {
        let record = JobRecord::from_job(job, "create");
        self.with(Access::Write, move |conn| {
            let inserted = conn
                .execute(
                    "INSERT INTO jobs (run_id, shard, created_at, record)
                     VALUES (?1, ?2, ?3, ?4) ON CONFLICT (run_id) DO NOTHING",
                    params![
                        record.run_id,
                        record.sweep_shard,
                        record.created_at,
                        to_json(&record)?
                    ],
                )
                .map_err(unavailable)?;
            if inserted == 1 {
                return Ok(Created::New);
            }
            let existing = read(conn, &record.run_id)?
                .ok_or_else(|| unavailable("job vanished while being created"))?;
            Ok(Created::Existing(Box::new(existing.into_job()?)))
        })
        .await
    }

    async fn get(&self, run_id: &RunId) -> Result<Option<Job>, StoreError> {
        let id = run_id.to_string();
        // One indexed read takes microseconds and, in WAL mode, never waits for a writer:
        // done in place when the read connection is free, not queued behind the writes.
        if let Ok(reader) = self.reader.try_lock() {
            return read(&reader, &id)?.map(JobRecord::into_job).transpose();
        }
        self.with(Access::Read, move |conn| {
            read(conn, &id)?.map(JobRecord::into_job).transpose()
        })
        .await
    }

    async fn replace(&self, job: &Job, write_id: &str) -> Result<Replaced, StoreError> {
        let record = JobRecord::from_job(job, write_id);
        self.with(Access::Write, move |conn| {
            let text = to_json(&record)?;
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(unavailable)?;
            // The check needs two fields, not the whole record: it is parsed only on a conflict.
            let Some((version, write_id)) = read_version(&tx, &record.run_id)? else {
                return Ok(Replaced::Conflict(None));
            };
            if write_id == record.write_id {
                return Ok(Replaced::Written);
            }
            if version + 1 != record.version {
                let current = read(&tx, &record.run_id)?
                    .map(JobRecord::into_job)
                    .transpose()?;
                return Ok(Replaced::Conflict(current.map(Box::new)));
            }
            tx.prepare_cached("UPDATE jobs SET shard = ?2, record = ?3 WHERE run_id = ?1")
                .and_then(|mut s| s.execute(params![record.run_id, record.sweep_shard, text]))
                .map_err(unavailable)?;
            tx.commit().map_err(unavailable)?;
            Ok(Replaced::Written)
        })
        .await
    }

    async fn list(&self, shard: Shard, from: Millis, limit: usize) -> Result<Listing, StoreError> {
        // SQLite drops the large fields itself: what is parsed here is what a listing shows.
        let unlisted: Vec<String> = UNLISTED.iter().map(|f| format!("'$.{f}'")).collect();
        let sql = format!(
            "SELECT run_id, created_at, json_remove(record, {}) FROM jobs
             WHERE shard = ?1 AND created_at >= ?2
             ORDER BY created_at, run_id LIMIT ?3",
            unlisted.join(", ")
        );
        self.with(Access::Read, move |conn| {
            let mut stmt = conn.prepare(&sql).map_err(unavailable)?;
            let rows = stmt
                .query_map(params![shard.key(), from, limit as i64], |r| {
                    Ok((r.get::<_, String>(0)?, r.get(1)?, r.get::<_, String>(2)?))
                })
                .map_err(unavailable)?;
            let mut listing = Listing::default();
            for row in rows {
                let (run_id, created_at, text) = row.map_err(unavailable)?;
                let read = parse(&text).and_then(JobRecord::into_listed);
                listing.push(created_at, &run_id, read);
            }
            Ok(listing)
        })
        .await
    }

    async fn open_in_queue(&self, queue: &str) -> Result<Vec<OpenJob>, StoreError> {
        let queue = queue.to_owned();
        self.with(Access::Read, move |conn| {
            // The shard index holds only open jobs; their queue is read from the record.
            let mut stmt = conn
                .prepare(
                    "SELECT run_id, json_extract(record, '$.state'), created_at,
                            json_extract(record, '$.user'), json_extract(record, '$.waiting'),
                            json_extract(record, '$.scheduled_at'),
                            json_extract(record, '$.queue_position')
                     FROM jobs WHERE shard = ?1 AND json_extract(record, '$.queue') = ?2",
                )
                .map_err(unavailable)?;
            let rows = stmt
                .query_map(params![Shard::Open.key(), queue], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, Option<String>>(3)?,
                        r.get::<_, Option<String>>(4)?,
                        r.get::<_, Option<i64>>(5)?,
                        r.get::<_, Option<u32>>(6)?,
                    ))
                })
                .map_err(unavailable)?;
            rows.filter_map(|r| {
                let (run_id, state, created_at, user, waiting, scheduled_at, queue_position) =
                    match r {
                        Ok(row) => row,
                        Err(e) => return Some(Err(unavailable(e))),
                    };
                let run_id = readable_run_id(run_id)?;
                let state = match state.parse() {
                    Ok(state) => state,
                    Err(e) => return Some(Err(StoreError::corrupt(e))),
                };
                Some(Ok(OpenJob {
                    run_id,
                    state,
                    created_at,
                    user: user.map(Into::into),
                    background: waiting.as_deref() == Some(WAITING_BACKGROUND),
                    waiting: waiting.is_some(),
                    scheduled_at,
                    queue_position,
                }))
            })
            .collect()
        })
        .await
    }

    async fn cached(&self, key: &str) -> Result<Option<CacheEntry>, StoreError> {
        let key = key.to_owned();
        self.with(Access::Read, move |conn| read_cached(conn, &key))
            .await
    }

    async fn put_cached(
        &self,
        key: &str,
        entry: &CacheEntry,
        expected: Option<Millis>,
    ) -> Result<bool, StoreError> {
        let key = key.to_owned();
        let text = serde_json::to_string(entry).map_err(StoreError::corrupt)?;
        self.with(Access::Write, move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(unavailable)?;
            if read_cached(&tx, &key)?.map(|e| e.version) != expected {
                return Ok(false);
            }
            tx.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                params![key, text],
            )
            .map_err(unavailable)?;
            tx.commit().map_err(unavailable)?;
            Ok(true)
        })
        .await
    }

    async fn forget_expired(&self, now: Millis) -> Result<usize, StoreError> {
        self.with(Access::Write, move |conn| {
            // Only shared entries carry an expiry; the sweep's bookmarks are plain text (a
            // CASE, since SQLite may test the terms of an AND in any order).
            conn.execute(
                "DELETE FROM meta WHERE
                   CASE WHEN json_valid(value) THEN json_extract(value, '$.expires_at') END < ?1",
                [now],
            )
            .map_err(unavailable)
        })
        .await
    }

    async fn cursor(&self, which: Cursor) -> Result<Option<String>, StoreError> {
        self.with(Access::Read, move |conn| {
            conn.query_row(
                "SELECT value FROM meta WHERE key = ?1",
                [which.key()],
                |r| r.get::<_, Option<String>>(0),
            )
            .optional()
            .map(Option::flatten)
            .map_err(unavailable)
        })
        .await
    }

    async fn set_cursor(&self, which: Cursor, at: Option<&str>) -> Result<(), StoreError> {
        let cursor = at.map(str::to_owned);
        self.with(Access::Write, move |conn| {
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                params![which.key(), cursor],
            )
            .map(drop)
            .map_err(unavailable)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Holds the writer thread until the returned sender is dropped or sent to.
    fn hold_writer(store: &SqliteStore) -> mpsc::Sender<()> {
        let (release, held) = mpsc::channel::<()>();
        let work: Work = Box::new(move |_| {
            let _ = held.recv();
        });
        store.writer.send(work).expect("writer runs");
        release
    }

    fn job() -> Job {
        Job::new(
            "r1".parse().expect("valid id"),
            "H100_BK".into(),
            "h100".into(),
            None,
            None,
            1_000,
        )
    }

    #[tokio::test]
    async fn a_queued_write_lands_even_if_its_caller_gave_up() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path()).expect("store opens");
        let release = hold_writer(&store);
        // Polled once (the write is queued behind the held writer), then dropped.
        let gave_up = tokio::time::timeout(Duration::ZERO, store.create(&job())).await;
        assert!(gave_up.is_err(), "the write waited behind the held writer");
        drop(release);
        // The next queued work runs after the abandoned write: it must see the job.
        let listed = store.list(Shard::Open, 0, 10).await.expect("lists");
        assert_eq!(listed.jobs.len(), 1, "the abandoned write was still made");
    }

    #[tokio::test]
    async fn a_queued_read_is_skipped_once_its_caller_gave_up() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path()).expect("store opens");
        let release = hold_writer(&store);
        let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&reads);
        let read = store.with(Access::Read, move |_| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        assert!(tokio::time::timeout(Duration::ZERO, read).await.is_err());
        drop(release);
        // Work runs in order: once this answers, the abandoned read has had its turn.
        store.cursor(Cursor::Builds).await.expect("reads");
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_listing_skips_what_it_cannot_read_and_never_reads_results() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path()).expect("store opens");
        let conn = Connection::open(dir.path().join(FILE_NAME)).expect("opens");
        let row = |run_id: &str, extra: &str| {
            let record = format!(
                r#"{{"run_id":"{run_id}","state":"finished","state_rank":3,"gpu":"g","queue":"q",
                "discord_default":true,"discord_status":"{extra}","created_at":1,"updated_at":2,
                "expires_at":3,"outcome_z":"not base64 and not zlib","sweep_shard":"outbox"}}"#
            );
            conn.execute(
                "INSERT INTO jobs (run_id, shard, created_at, record) VALUES (?1, 'outbox', 1, ?2)",
                params![run_id, record],
            )
            .expect("inserted");
        };
        row("readable", "active");
        row("from-a-later-version", "deferred");
        let listing = store.list(Shard::Outbox, 0, 10).await.expect("lists");
        let ids: Vec<String> = listing.jobs.iter().map(|j| j.run_id.to_string()).collect();
        assert_eq!(ids, ["readable"], "its result was never decoded");
        assert_eq!(listing.unreadable, 1);
        let whole = store.get(&"readable".parse().expect("run id")).await;
        assert!(
            matches!(whole, Err(StoreError::Corrupt(_))),
            "read whole, it is corrupt"
        );
    }
}
