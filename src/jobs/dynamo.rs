//! The DynamoDB store. The table is defined in `template.yaml` (and only there): partition
//! key `run_id`, TTL on `expires_at`, and the sparse index [`OPEN_JOBS_INDEX`] on
//! (`sweep_shard`, `created_at`), which holds only jobs the sweep still has work for, and
//! those whose message was given up (for an operator's replay).
//!
//! Writes are conditional and ask for the item as it was when the condition failed
//! (`ReturnValuesOnConditionCheckFailure`): the SDK retries a write whose answer was lost, and
//! a failed condition whose item carries our own `write_id` is that write having landed.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};

use super::error::StoreError;
use super::id::RunId;
use super::listed::Listing;
use super::model::Job;
use super::record::{JobRecord, WAITING_BACKGROUND, listed_fields};
use super::store::{
    CacheEntry, Created, Cursor, JobStore, OpenJob, Replaced, Shard, readable_run_id,
};
use crate::time::Millis;

pub(crate) const OPEN_JOBS_INDEX: &str = "open-jobs";
/// Open jobs by queue (sparse: only unfinished jobs carry `open_queue`), with their state,
/// user, whether they wait and the place last shown: queue status, positions and fair share
/// read it.
pub(crate) const QUEUE_JOBS_INDEX: &str = "queue-place";
/// 1 MB pages of two small attributes: tens of thousands of open jobs, far past any queue.
const MAX_QUEUE_PAGES: usize = 10;

/// One DynamoDB call, retries included, never takes longer than this: a function must keep
/// time for its answer and for Discord.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
pub struct DynamoStore {
    client: Client,
    table: String,
}

type Item = HashMap<String, AttributeValue>;

fn unavailable(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::unavailable(e)
}

/// A write's error: an oversize item is permanent, anything else may pass on a later try.
fn write_error(
    e: impl std::error::Error + ProvideErrorMetadata + Send + Sync + 'static,
) -> StoreError {
    let oversize = e.code() == Some("ValidationException")
        && e.message().is_some_and(|m| m.contains("Item size"));
    if oversize {
        StoreError::TooLarge
    } else {
        unavailable(e)
    }
}

fn record_from_item(item: Item) -> Result<JobRecord, StoreError> {
    serde_dynamo::from_item(item).map_err(StoreError::corrupt)
}

/// The item a shared entry is stored as under `key`.
pub(crate) fn cache_item(key: &str, entry: &CacheEntry) -> Item {
    let mut item = Item::from([
        ("run_id".to_owned(), s(key)),
        ("fetched_at".to_owned(), n(entry.fetched_at)),
        ("claimed_at".to_owned(), n(entry.claimed_at)),
        ("entry_version".to_owned(), n(entry.version)),
    ]);
    if let Some(v) = &entry.value {
        item.insert("cache_value".to_owned(), s(v.clone()));
    }
    if let Some(at) = entry.expires_at {
        // The table's TTL attribute, in whole seconds (rounded up: never before its time).
        let secs = at.div_euclid(1000) + i64::from(at.rem_euclid(1000) != 0);
        item.insert("expires_at".to_owned(), n(secs));
    }
    item
}

/// The item a job's record is stored as.
pub(crate) fn item_from_record(record: &JobRecord) -> Result<Item, StoreError> {
    serde_dynamo::to_item(record).map_err(StoreError::corrupt)
}

/// An open job as the queue index's projection holds it; `None` (logged) for one whose run
/// id this version cannot read, which holds back no other.
fn open_job(item: &Item) -> Result<Option<OpenJob>, StoreError> {
    let text = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
    let state = text("state").ok_or_else(|| StoreError::corrupt("open job without a state"))?;
    let Some(run_id) = readable_run_id(text("run_id").unwrap_or_default()) else {
        return Ok(None);
    };
    Ok(Some(OpenJob {
        run_id,
        state: state.parse().map_err(StoreError::corrupt)?,
        created_at: item
            .get("created_at")
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
        user: text("user").map(Into::into),
        waiting: text("waiting").is_some(),
        background: text("waiting").as_deref() == Some(WAITING_BACKGROUND),
        scheduled_at: item
            .get("scheduled_at")
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse().ok()),
        queue_position: item
            .get("queue_position")
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse().ok()),
    }))
}

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

impl DynamoStore {
    pub fn new(client: Client, table: String) -> Self {
        Self { client, table }
    }

    /// Uses the standard AWS configuration chain (`AWS_ENDPOINT_URL_DYNAMODB` included), with
    /// an operation timeout so a slow DynamoDB cannot hold a function past its own deadline.
    pub(crate) async fn from_env(table: String) -> Self {
        let timeouts = TimeoutConfig::builder()
            .operation_timeout(OPERATION_TIMEOUT)
            .operation_attempt_timeout(ATTEMPT_TIMEOUT)
            .build();
        let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .timeout_config(timeouts)
            .load()
            .await;
        Self::new(Client::new(&config), table)
    }

    /// Writes shared entry `entry` under `key` if the entry there is still at version
    /// `expected`; a refusal carries the entry that refused it, where the answer has it.
    async fn put_entry(
        &self,
        key: &str,
        entry: &CacheEntry,
        expected: Option<Millis>,
    ) -> Result<Result<(), Option<Item>>, StoreError> {
        let item = cache_item(key, entry);
        match expected {
            None => {
                self.put_if(item, "attribute_not_exists(run_id)", &[], &[])
                    .await
            }
            // An entry an earlier release wrote has no version and is matched on its claim,
            // as `cached` reads it (that release writes such entries still, mid-upgrade).
            Some(version) => {
                let matches = "#v = :v OR (attribute_not_exists(#v) AND #c = :v)";
                let names = [("#v", "entry_version"), ("#c", "claimed_at")];
                self.put_if(item, matches, &names, &[(":v", n(version))])
                    .await
            }
        }
    }

    /// A conditional put; on a failed condition, the item as it is.
    async fn put_if(
        &self,
        item: Item,
        condition: &str,
        names: &[(&str, &str)],
        values: &[(&str, AttributeValue)],
    ) -> Result<Result<(), Option<Item>>, StoreError> {
        let mut req = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression(condition)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        for (k, v) in names {
            req = req.expression_attribute_names(*k, *v);
        }
        for (k, v) in values {
            req = req.expression_attribute_values(*k, v.clone());
        }
        match req.send().await {
            Ok(_) => Ok(Ok(())),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(c) => {
                    Ok(Err(c.item))
                }
                e => Err(write_error(e)),
            },
        }
    }
}

/// A shared entry as stored: an earlier release's entry has no version, and its claim was
/// what it compared.
fn cache_entry(item: &Item) -> CacheEntry {
    let number = |name: &str| {
        item.get(name)
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let ttl: Millis = number("expires_at");
    let expires_at = (ttl > 0).then(|| ttl.saturating_mul(1000));
    let claimed_at = number("claimed_at");
    let version = if item.contains_key("entry_version") {
        number("entry_version")
    } else {
        claimed_at
    };
    CacheEntry {
        value: item.get("cache_value").and_then(|v| v.as_s().ok()).cloned(),
        fetched_at: number("fetched_at"),
        claimed_at,
        version,
        expires_at,
    }
}

#[async_trait]
impl JobStore for DynamoStore {
    async fn create(&self, job: &Job) -> Result<Created, StoreError> {
        let write_id = uuid::Uuid::new_v4().simple().to_string();
        let item = item_from_record(&JobRecord::from_job(job, &write_id))?;
        let existing = match self
            .put_if(item, "attribute_not_exists(run_id)", &[], &[])
            .await?
        {
            Ok(()) => return Ok(Created::New),
            Err(Some(item)) => record_from_item(item)?,
            Err(None) => self
                .get_record(&job.run_id)
                .await?
                .ok_or_else(|| StoreError::unavailable("job vanished while created"))?,
        };
        if existing.write_id == write_id {
            // Our own first try landed and its answer was lost.
            return Ok(Created::New);
        }
        Ok(Created::Existing(Box::new(existing.into_job()?)))
    }

    async fn get(&self, run_id: &RunId) -> Result<Option<Job>, StoreError> {
        self.get_record(run_id)
            .await?
            .map(JobRecord::into_job)
            .transpose()
    }

    async fn replace(&self, job: &Job, write_id: &str) -> Result<Replaced, StoreError> {
        let item = item_from_record(&JobRecord::from_job(job, write_id))?;
        let expected = job.version.saturating_sub(1);
        // Records from before versioning have none: they are version 0.
        let condition = if expected == 0 {
            "attribute_exists(run_id) AND (attribute_not_exists(#v) OR #v = :v)"
        } else {
            "#v = :v"
        };
        let outcome = self
            .put_if(
                item,
                condition,
                &[("#v", "version")],
                &[(":v", n(expected))],
            )
            .await?;
        let current = match outcome {
            Ok(()) => return Ok(Replaced::Written),
            Err(Some(item)) => record_from_item(item)?,
            Err(None) => match self.get_record(&job.run_id).await? {
                Some(record) => record,
                None => return Ok(Replaced::Conflict(None)),
            },
        };
        if current.write_id == write_id {
            return Ok(Replaced::Written);
        }
        Ok(Replaced::Conflict(Some(Box::new(current.into_job()?))))
    }

    async fn list(&self, shard: Shard, from: Millis, limit: usize) -> Result<Listing, StoreError> {
        let mut listing = Listing::default();
        let mut start: Option<Item> = None;
        // Pages end at 1 MB of items read: follow them until `limit` jobs are listed.
        loop {
            let out = self
                .listing(shard, from)
                .limit((limit - listing.len()).clamp(1, 1000) as i32)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| unavailable(e.into_service_error()))?;
            for item in out.items.unwrap_or_default() {
                // The index's keys: present on every item it holds, readable or not.
                let run_id = item.get("run_id").and_then(|v| v.as_s().ok()).cloned();
                let created_at = item
                    .get("created_at")
                    .and_then(|v| v.as_n().ok())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(from);
                let read = record_from_item(item).and_then(JobRecord::into_listed);
                listing.push(created_at, run_id.as_deref().unwrap_or_default(), read);
            }
            match out.last_evaluated_key {
                Some(key) if listing.len() < limit => start = Some(key),
                _ => return Ok(listing),
            }
        }
    }

    async fn open_in_queue(&self, queue: &str) -> Result<Vec<OpenJob>, StoreError> {
        let mut jobs = Vec::new();
        let mut start: Option<Item> = None;
        for _ in 0..MAX_QUEUE_PAGES {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(QUEUE_JOBS_INDEX)
                .key_condition_expression("#q = :q")
                .projection_expression("#id, #s, #created, #u, #w, #sched, #place")
                .expression_attribute_names("#q", "open_queue")
                .expression_attribute_names("#id", "run_id")
                .expression_attribute_names("#s", "state")
                .expression_attribute_names("#created", "created_at")
                // `user` is one of DynamoDB's reserved words.
                .expression_attribute_names("#u", "user")
                .expression_attribute_names("#w", "waiting")
                .expression_attribute_names("#sched", "scheduled_at")
                .expression_attribute_names("#place", "queue_position")
                .expression_attribute_values(":q", s(queue))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| unavailable(e.into_service_error()))?;
            for item in out.items.unwrap_or_default() {
                jobs.extend(open_job(&item)?);
            }
            match out.last_evaluated_key {
                Some(key) => start = Some(key),
                None => break,
            }
        }
        Ok(jobs)
    }

    async fn cached(&self, key: &str) -> Result<Option<CacheEntry>, StoreError> {
        Ok(self.get_item(key).await?.map(|item| cache_entry(&item)))
    }

    async fn put_cached(
        &self,
        key: &str,
        entry: &CacheEntry,
        expected: Option<Millis>,
    ) -> Result<bool, StoreError> {
        Ok(self.put_entry(key, entry, expected).await?.is_ok())
    }

    async fn swap_cached(
        &self,
        key: &str,
        entry: &CacheEntry,
        expected: Option<Millis>,
    ) -> Result<Result<(), Option<CacheEntry>>, StoreError> {
        match self.put_entry(key, entry, expected).await? {
            Ok(()) => Ok(Ok(())),
            // The refusal carries the entry that refused it (`ALL_OLD`).
            Err(Some(item)) => Ok(Err(Some(cache_entry(&item)))),
            // None with it: there was no entry, or the answer left it out; a read tells.
            Err(None) => Ok(Err(self.cached(key).await?)),
        }
    }

    async fn forget_expired(&self, _now: Millis) -> Result<usize, StoreError> {
        // The table's TTL on `expires_at` deletes expired entries (within a day or two;
        // readers treat them as gone meanwhile).
        Ok(0)
    }

    async fn cursor(&self, which: Cursor) -> Result<Option<String>, StoreError> {
        Ok(self
            .get_item(which.key())
            .await?
            .and_then(|item| item.get("cursor")?.as_s().ok().cloned()))
    }

    async fn set_cursor(&self, which: Cursor, at: Option<&str>) -> Result<(), StoreError> {
        let mut item = Item::from([("run_id".to_owned(), s(which.key()))]);
        if let Some(c) = at {
            item.insert("cursor".to_owned(), s(c));
        }
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| unavailable(e.into_service_error()))?;
        Ok(())
    }
}

impl DynamoStore {
    /// The index query of a listing: every attribute but the large ones (aliased, as some
    /// are reserved words).
    fn listing(&self, shard: Shard, from: Millis) -> QueryFluentBuilder {
        let fields = listed_fields();
        let aliases: Vec<String> = (0..fields.len()).map(|i| format!("#f{i}")).collect();
        let mut query = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(OPEN_JOBS_INDEX)
            .key_condition_expression("#shard = :shard AND #created >= :from")
            .projection_expression(aliases.join(", "))
            .expression_attribute_names("#shard", "sweep_shard")
            .expression_attribute_names("#created", "created_at")
            .expression_attribute_values(":shard", s(shard.key()))
            .expression_attribute_values(":from", n(from));
        for (alias, field) in aliases.iter().zip(fields) {
            query = query.expression_attribute_names(alias, field);
        }
        query
    }

    async fn get_item(&self, key: &str) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("run_id", s(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| unavailable(e.into_service_error()))?;
        Ok(out.item)
    }

    async fn get_record(&self, run_id: &RunId) -> Result<Option<JobRecord>, StoreError> {
        self.get_item(run_id.as_str())
            .await?
            .map(record_from_item)
            .transpose()
    }
}
