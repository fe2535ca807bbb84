//! The DynamoDB store. The table is defined in `template.yaml` (and only there): partition
//! key `run_id`, TTL on `expires_at`, and the sparse index [`OPEN_JOBS_INDEX`] on
//! (`sweep_shard`, `created_at`), which holds only unfinished jobs.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};

use super::model::{Job, Millis, RunId, Transition};
use super::record::{JobRecord, OPEN, encode_outcome};
use super::store::{Created, JobStore, StoreError};

pub const OPEN_JOBS_INDEX: &str = "open-jobs";

#[derive(Clone, Debug)]
pub struct DynamoStore {
    client: Client,
    table: String,
}

fn unavailable(e: impl std::error::Error) -> StoreError {
    StoreError::Unavailable(DisplayErrorContext(e).to_string())
}

fn job_from_item(item: HashMap<String, AttributeValue>) -> Result<Job, StoreError> {
    serde_dynamo::from_item::<_, JobRecord>(item)
        .map_err(|e| StoreError::Corrupt(e.to_string()))?
        .into_job()
}

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// An `UpdateItem` expression with every attribute name escaped, so no attribute can clash
/// with one of DynamoDB's reserved words.
#[derive(Default)]
struct Update {
    sets: Vec<String>,
    removes: Vec<String>,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl Update {
    fn name(&mut self, attr: &str) -> String {
        let key = format!("#{attr}");
        self.names.insert(key.clone(), attr.to_owned());
        key
    }

    fn value(&mut self, attr: &str, v: AttributeValue) -> String {
        let key = format!(":{attr}");
        self.values.insert(key.clone(), v);
        key
    }

    fn set(&mut self, attr: &str, v: AttributeValue) -> &mut Self {
        let (name, value) = (self.name(attr), self.value(attr, v));
        self.sets.push(format!("{name} = {value}"));
        self
    }

    fn remove(&mut self, attr: &str) -> &mut Self {
        let name = self.name(attr);
        self.removes.push(name);
        self
    }

    fn expression(&self) -> String {
        let mut expr = format!("SET {}", self.sets.join(", "));
        if !self.removes.is_empty() {
            expr.push_str(&format!(" REMOVE {}", self.removes.join(", ")));
        }
        expr
    }
}

impl DynamoStore {
    pub fn new(client: Client, table: String) -> Self {
        Self { client, table }
    }

    /// Uses the standard AWS configuration chain (`AWS_ENDPOINT_URL_DYNAMODB` included).
    pub async fn from_env(table: String) -> Self {
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        Self::new(Client::new(&config), table)
    }

    /// Runs `update` on the job only if `condition` (over the same names and values) holds;
    /// returns the job after it, or `None` when the condition failed.
    async fn conditional_update(
        &self,
        run_id: &RunId,
        mut update: Update,
        condition: &str,
    ) -> Result<Option<Job>, StoreError> {
        update.name("run_id");
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("run_id", s(run_id.as_str()))
            .update_expression(update.expression())
            .condition_expression(format!("attribute_exists(#run_id) AND ({condition})"))
            .set_expression_attribute_names(Some(update.names))
            .set_expression_attribute_values(Some(update.values))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match result {
            Ok(out) => out.attributes.map(job_from_item).transpose(),
            Err(e) => match e.into_service_error() {
                e if e.is_conditional_check_failed_exception() => Ok(None),
                e => Err(unavailable(e)),
            },
        }
    }
}

#[async_trait]
impl JobStore for DynamoStore {
    async fn create(&self, job: &Job) -> Result<Created, StoreError> {
        let item = serde_dynamo::to_item(JobRecord::from_job(job))
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(run_id)")
            .send()
            .await;
        match result {
            Ok(_) => Ok(Created::New),
            Err(e) => match e.into_service_error() {
                e if e.is_conditional_check_failed_exception() => {
                    match self.get(&job.run_id).await? {
                        Some(existing) => Ok(Created::Existing(Box::new(existing))),
                        None => Err(StoreError::Unavailable(format!(
                            "job {} vanished while being created",
                            job.run_id
                        ))),
                    }
                }
                e => Err(unavailable(e)),
            },
        }
    }

    async fn get(&self, run_id: &RunId) -> Result<Option<Job>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("run_id", s(run_id.as_str()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| unavailable(e.into_service_error()))?;
        out.item.map(job_from_item).transpose()
    }

    async fn advance(&self, run_id: &RunId, t: &Transition) -> Result<Option<Job>, StoreError> {
        let mut u = Update::default();
        u.set("state", s(t.to.as_str()))
            .set("state_rank", n(t.to.rank()))
            .set("updated_at", n(t.at));
        if let Some(b) = &t.build {
            u.set("build_id", s(&b.id))
                .set("build_number", n(b.number))
                .set("build_url", s(&b.web_url));
        }
        if let Some(f) = &t.failure {
            u.set("failure", s(f));
        }
        if let Some(o) = &t.outcome {
            match encode_outcome(o) {
                super::record::EncodedOutcome { json: Some(j), .. } => {
                    u.set("outcome", s(j)).remove("outcome_z")
                }
                super::record::EncodedOutcome {
                    zlib_b64: Some(z), ..
                } => u.set("outcome_z", s(z)).remove("outcome"),
                _ => &mut u,
            };
        }
        if t.to.is_terminal() {
            // Leaving the sparse index is what keeps the sweep's query cheap.
            u.remove("sweep_shard");
        }
        self.conditional_update(run_id, u, "#state_rank < :state_rank")
            .await
    }

    async fn set_discord_message(
        &self,
        run_id: &RunId,
        message_id: &str,
    ) -> Result<Option<Job>, StoreError> {
        let mut u = Update::default();
        u.set("discord_message_id", s(message_id));
        self.conditional_update(run_id, u, "attribute_not_exists(#discord_message_id)")
            .await
    }

    async fn mark_discord_gone(&self, run_id: &RunId) -> Result<(), StoreError> {
        let mut u = Update::default();
        u.set("discord_gone", AttributeValue::Bool(true));
        self.conditional_update(run_id, u, "attribute_exists(#run_id)")
            .await
            .map(drop)
    }

    async fn list_open(
        &self,
        created_before: Millis,
        limit: usize,
    ) -> Result<Vec<Job>, StoreError> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(OPEN_JOBS_INDEX)
            .key_condition_expression("#shard = :open AND #created < :before")
            .expression_attribute_names("#shard", "sweep_shard")
            .expression_attribute_names("#created", "created_at")
            .expression_attribute_values(":open", s(OPEN))
            .expression_attribute_values(":before", n(created_before))
            .limit(limit.clamp(1, 1000) as i32)
            .send()
            .await
            .map_err(|e| unavailable(e.into_service_error()))?;
        out.items
            .unwrap_or_default()
            .into_iter()
            .map(job_from_item)
            .collect()
    }
}
