//! The embedded store: one SQLite file, shared by every local process.
//!
//! `cargo lambda watch` and the local stack run each function as its own process, so the
//! store must be a file both can open; WAL mode and a busy timeout let them write side by
//! side. Conditional updates run inside `BEGIN IMMEDIATE` transactions, which SQLite
//! serialises, so the forward-only rule holds across processes.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::model::{Job, Millis, RunId, Transition};
use super::record::JobRecord;
use super::store::{Created, JobStore, StoreError};

pub const FILE_NAME: &str = "jobs.sqlite3";

#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn to_json(job: &Job) -> Result<String, StoreError> {
    serde_json::to_string(&JobRecord::from_job(job)).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn from_json(text: &str) -> Result<Job, StoreError> {
    serde_json::from_str::<JobRecord>(text)
        .map_err(|e| StoreError::Corrupt(e.to_string()))?
        .into_job()
}

impl SqliteStore {
    /// Opens (creating if needed) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| unavailable(format!("{}: {e}", dir.display())))?;
        let conn = Connection::open(dir.join(FILE_NAME)).map_err(unavailable)?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(unavailable)?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE IF NOT EXISTS jobs (
                 run_id     TEXT PRIMARY KEY,
                 state_rank INTEGER NOT NULL,
                 open       INTEGER NOT NULL,
                 created_at INTEGER NOT NULL,
                 record     TEXT NOT NULL
             );
             CREATE INDEX IF NOT EXISTS jobs_open ON jobs (open, created_at);",
        )
        .map_err(unavailable)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs blocking SQLite work off the async runtime.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn
                .lock()
                .map_err(|_| unavailable("connection lock poisoned"))?;
            f(&mut guard)
        })
        .await
        .map_err(unavailable)?
    }

    /// Reads, changes and writes one job inside an immediate transaction.
    async fn update(
        &self,
        run_id: &RunId,
        change: impl FnOnce(Job) -> Option<Job> + Send + 'static,
    ) -> Result<Option<Job>, StoreError> {
        let id = run_id.to_string();
        self.with(move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(unavailable)?;
            let current: Option<String> = tx
                .query_row("SELECT record FROM jobs WHERE run_id = ?1", [&id], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(unavailable)?;
            let Some(next) = current.map(|t| from_json(&t)).transpose()?.and_then(change) else {
                return Ok(None);
            };
            tx.execute(
                "UPDATE jobs SET state_rank = ?2, open = ?3, record = ?4 WHERE run_id = ?1",
                params![
                    id,
                    next.state.rank(),
                    !next.state.is_terminal(),
                    to_json(&next)?
                ],
            )
            .map_err(unavailable)?;
            tx.commit().map_err(unavailable)?;
            Ok(Some(next))
        })
        .await
    }
}

#[async_trait]
impl JobStore for SqliteStore {
    async fn create(&self, job: &Job) -> Result<Created, StoreError> {
        let job = job.clone();
        self.with(move |conn| {
            let inserted = conn
                .execute(
                    "INSERT INTO jobs (run_id, state_rank, open, created_at, record)
                     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (run_id) DO NOTHING",
                    params![
                        job.run_id.as_str(),
                        job.state.rank(),
                        !job.state.is_terminal(),
                        job.created_at,
                        to_json(&job)?
                    ],
                )
                .map_err(unavailable)?;
            if inserted == 1 {
                return Ok(Created::New);
            }
            let text: String = conn
                .query_row(
                    "SELECT record FROM jobs WHERE run_id = ?1",
                    [job.run_id.as_str()],
                    |r| r.get(0),
                )
                .map_err(unavailable)?;
            Ok(Created::Existing(Box::new(from_json(&text)?)))
        })
        .await
    }

    async fn get(&self, run_id: &RunId) -> Result<Option<Job>, StoreError> {
        let id = run_id.to_string();
        self.with(move |conn| {
            conn.query_row("SELECT record FROM jobs WHERE run_id = ?1", [&id], |r| {
                r.get::<_, String>(0)
            })
            .optional()
            .map_err(unavailable)?
            .map(|t| from_json(&t))
            .transpose()
        })
        .await
    }

    async fn advance(&self, run_id: &RunId, t: &Transition) -> Result<Option<Job>, StoreError> {
        let t = t.clone();
        self.update(run_id, move |job| job.apply(&t)).await
    }

    async fn set_discord_message(
        &self,
        run_id: &RunId,
        message_id: &str,
    ) -> Result<Option<Job>, StoreError> {
        let message_id = message_id.to_owned();
        self.update(run_id, move |mut job| {
            job.discord_message_id.is_none().then(|| {
                job.discord_message_id = Some(message_id);
                job
            })
        })
        .await
    }

    async fn mark_discord_gone(&self, run_id: &RunId) -> Result<(), StoreError> {
        self.update(run_id, |mut job| {
            job.discord_gone = true;
            Some(job)
        })
        .await
        .map(drop)
    }

    async fn list_open(
        &self,
        created_before: Millis,
        limit: usize,
    ) -> Result<Vec<Job>, StoreError> {
        self.with(move |conn| {
            let mut stmt = conn
                .prepare(
                    "SELECT record FROM jobs WHERE open = 1 AND created_at < ?1
                     ORDER BY created_at LIMIT ?2",
                )
                .map_err(unavailable)?;
            let rows = stmt
                .query_map(params![created_before, limit as i64], |r| {
                    r.get::<_, String>(0)
                })
                .map_err(unavailable)?;
            rows.map(|r| r.map_err(unavailable).and_then(|t| from_json(&t)))
                .collect()
        })
        .await
    }
}
