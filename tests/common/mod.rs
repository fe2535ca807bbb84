//! The test harness: the real routers on random ports, the local Buildkite and Discord
//! stand-ins behind them, and either store (SQLite in a temp dir, or DynamoDB on moto).
#![allow(dead_code)]

pub mod dynamo;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kernelbot_dispatch::config::{Config, Role};
use kernelbot_dispatch::devstack::buildkite::{BuildkiteStandin, deliver, unix_now};
use kernelbot_dispatch::devstack::discord::{DiscordCall, DiscordStandin};
use kernelbot_dispatch::devstack::receiver::ReceiverStandin;
use kernelbot_dispatch::flow::Dispatcher;
use kernelbot_dispatch::http;
use kernelbot_dispatch::jobs::dynamo::DynamoStore;
use kernelbot_dispatch::jobs::sqlite::SqliteStore;
use kernelbot_dispatch::jobs::{Job, JobStore, RunId};
use kernelbot_dispatch::retry::{Deadline, Policy};
use kernelbot_dispatch::telemetry::metrics::Metrics;
use reqwest::StatusCode;
use serde_json::{Value, json};

pub const API_TOKEN: &str = "test-submit-token";
pub const BK_TOKEN: &str = "test-buildkite-token";
pub const SECRET: &str = "test-webhook-secret";
pub const HOOK_URL: &str = "https://discord.com/api/webhooks/111111111111111111/hook-token_1";

/// Registers a file's scenarios once per store: `mod sqlite` and `mod dynamodb`, each
/// expanding `$cases!(StoreKind::…)`, so every scenario runs on both.
#[macro_export]
macro_rules! on_both_stores {
    ($cases:ident) => {
        mod sqlite {
            $cases!($crate::common::StoreKind::Sqlite);
        }

        mod dynamodb {
            $cases!($crate::common::StoreKind::Dynamo);
        }
    };
}

#[derive(Clone, Copy, Debug)]
pub enum StoreKind {
    Sqlite,
    Dynamo,
}

/// Opens a fresh, empty store of `kind`; the temp dir (SQLite) lives as long as the guard.
pub async fn open_store(kind: StoreKind) -> (Arc<dyn JobStore>, Option<tempfile::TempDir>) {
    match kind {
        StoreKind::Sqlite => {
            let dir = tempfile::tempdir().expect("temp dir");
            (
                Arc::new(SqliteStore::open(dir.path()).expect("sqlite")),
                Some(dir),
            )
        }
        StoreKind::Dynamo => {
            let client = dynamo::client();
            let table = format!("jobs-{}", uuid::Uuid::new_v4().simple());
            dynamo::create_table(&client, &table).await;
            (Arc::new(DynamoStore::new(client, table)), None)
        }
    }
}

pub struct TestApp {
    pub submit_url: String,
    pub webhook_url: String,
    pub buildkite: BuildkiteStandin,
    pub discord: DiscordStandin,
    /// Where callbacks go when the app was started with a `CALLBACK_SECRET`.
    pub receiver: ReceiverStandin,
    pub store: Arc<dyn JobStore>,
    /// The sweep function's dispatcher.
    pub sweeper: Arc<Dispatcher>,
    /// The routers themselves, for driving them with Lambda events.
    pub submit_router: axum::Router,
    pub webhook_router: axum::Router,
    pub client: reqwest::Client,
    /// The clock all three functions share.
    pub clock: kernelbot_dispatch::flow::Clock,
    /// Every metric the three functions published (EMF objects).
    metrics: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
    _dir: Option<tempfile::TempDir>,
}

fn quick_retries() -> Policy {
    Policy {
        attempts: 4,
        base: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
        max_wait: Duration::from_secs(5),
    }
}

async fn serve(router: axum::Router) -> String {
    let addr = kernelbot_dispatch::devstack::spawn(router)
        .await
        .expect("port");
    format!("http://{addr}")
}

impl TestApp {
    pub async fn spawn(kind: StoreKind) -> Self {
        Self::spawn_with(kind, &[]).await
    }

    /// Starts the app; `vars` add to or override the environment the functions see.
    pub async fn spawn_with(kind: StoreKind, vars: &[(&str, &str)]) -> Self {
        Self::spawn_tuned(kind, vars, Duration::from_secs(5)).await
    }

    /// As `spawn_with`, with `timeout` on every Buildkite and Discord call.
    pub async fn spawn_tuned(kind: StoreKind, vars: &[(&str, &str)], timeout: Duration) -> Self {
        if std::env::var_os("TEST_LOG").is_some() {
            kernelbot_dispatch::telemetry::init();
        }
        let buildkite = BuildkiteStandin::start(BK_TOKEN, "test-org", "kernelbot")
            .await
            .expect("buildkite stand-in");
        let discord = DiscordStandin::start().await.expect("discord stand-in");
        let receiver = ReceiverStandin::start().await.expect("receiver stand-in");
        let (store, dir) = open_store(kind).await;
        let mut env: BTreeMap<String, String> = BTreeMap::from([
            ("BUILDKITE_API_URL".into(), buildkite.api_url.clone()),
            ("BUILDKITE_API_TOKEN".into(), BK_TOKEN.into()),
            ("BUILDKITE_ORG".into(), buildkite.org.clone()),
            ("BUILDKITE_PIPELINE".into(), buildkite.pipeline.clone()),
            (
                "BUILDKITE_WEBHOOK_SECRET".into(),
                format!("old-secret,{SECRET}"),
            ),
            ("DISCORD_API_URL".into(), discord.api_url.clone()),
            ("SUBMIT_API_TOKEN".into(), API_TOKEN.into()),
        ]);
        if vars.iter().any(|(k, _)| *k == "CALLBACK_SECRET") {
            env.insert("CALLBACK_URL".into(), receiver.url.clone());
        }
        for (k, v) in vars {
            env.insert((*k).into(), (*v).into());
        }
        let clock = kernelbot_dispatch::flow::Clock::default();
        let metrics = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let dispatcher = |role: Role| {
            let config = Config::from_lookup(role, &|k| env.get(k).cloned()).expect("config");
            let mut d = Dispatcher::new(Arc::new(config), store.clone()).expect("dispatcher");
            d.clock = clock.clone();
            d.metrics = Metrics::shared(role.name(), metrics.clone());
            d.buildkite = d
                .buildkite
                .clone()
                .with_retry(quick_retries())
                .with_timeout(timeout);
            d.discord = d
                .discord
                .clone()
                .with_retry(quick_retries())
                .with_timeout(timeout);
            d.callbacks = d.callbacks.clone().map(|c| c.with_timeout(timeout));
            Arc::new(d)
        };
        let submit_router = http::submit::router(dispatcher(Role::Submit));
        let webhook_router = http::webhook::router(dispatcher(Role::Webhook));
        let submit_url = serve(submit_router.clone()).await;
        let webhook_url = serve(webhook_router.clone()).await;
        let sweeper = dispatcher(Role::Sweep);
        Self {
            submit_url,
            webhook_url: format!("{webhook_url}/webhooks/buildkite"),
            buildkite,
            discord,
            receiver,
            store,
            sweeper,
            submit_router,
            webhook_router,
            client: reqwest::Client::new(),
            clock,
            metrics,
            _dir: dir,
        }
    }

    pub async fn submit(&self, body: &Value) -> (StatusCode, Value) {
        self.submit_raw(serde_json::to_vec(body).expect("json"), Some(API_TOKEN))
            .await
    }

    pub async fn submit_raw(&self, body: Vec<u8>, token: Option<&str>) -> (StatusCode, Value) {
        let mut req = self
            .client
            .post(format!("{}/submissions", self.submit_url))
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        answer(req).await
    }

    pub async fn cancel(&self, run_id: &str) -> (StatusCode, Value) {
        let url = format!("{}/submissions/{run_id}/cancel", self.submit_url);
        answer(self.client.post(url).bearer_auth(API_TOKEN)).await
    }

    pub async fn status(&self, run_id: &str) -> (StatusCode, Value) {
        let url = format!("{}/submissions/{run_id}", self.submit_url);
        answer(self.client.get(url).bearer_auth(API_TOKEN)).await
    }

    pub async fn job(&self, run_id: &str) -> Job {
        let id: RunId = run_id.parse().expect("run id");
        self.store
            .get(&id)
            .await
            .expect("store")
            .expect("job exists")
    }

    /// Sends `event` for build `number` as Buildkite would, signed with the current secret.
    pub async fn event(&self, event: &str, number: u64) -> StatusCode {
        let body = self.buildkite.webhook_body(event, number);
        deliver(&self.webhook_url, SECRET, event, body, unix_now())
            .await
            .expect("webhook answers")
            .status()
    }

    /// Ends build `number` in `state` with `result` uploaded, and sends `build.finished`.
    pub async fn finish(&self, number: u64, state: &str, result: Option<Vec<u8>>) -> StatusCode {
        if let Some(bytes) = result {
            self.buildkite
                .upload(number, "result.json", bytes, "finished", false);
        }
        self.buildkite.set_state(number, state);
        self.event("build.finished", number).await
    }

    /// One pass of the sweep function, as its schedule would run it.
    pub async fn sweep(&self) -> kernelbot_dispatch::flow::SweepReport {
        self.sweeper
            .sweep(Deadline::after(Duration::from_secs(30)))
            .await
            .expect("sweep pass")
    }

    /// Moves every function's clock forward (deadlines and give-ups without waiting).
    pub fn advance_clock(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// The values of metric `name` published so far, with their objects' dimensions.
    pub fn metric(&self, name: &str) -> Vec<(Value, f64)> {
        self.metrics
            .lock()
            .unwrap()
            .iter()
            .filter_map(|m| Some((m.clone(), m.get(name)?.as_f64()?)))
            .collect()
    }

    pub fn discord_calls(&self) -> Vec<DiscordCall> {
        self.discord.calls()
    }

    /// The current text of the job's Discord message (content and embed description).
    pub fn discord_text(&self) -> String {
        self.discord
            .messages()
            .values()
            .map(|m| {
                format!(
                    "{}\n{}",
                    m["content"].as_str().unwrap_or(""),
                    m["embeds"][0]["description"].as_str().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("\n---\n")
    }
}

/// Sends a request to the submit API: its status and JSON body (null if none).
async fn answer(req: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let resp = req.send().await.expect("the submit API answers");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// A valid submission body for `run_id`.
pub fn submission(run_id: &str) -> Value {
    json!({
        "run_id": run_id,
        "gpu": "H100_BK",
        "title": "vectoradd",
        "config": {"lang": "py", "mode": "test", "main": "eval.py", "sources": {"eval.py": "print('hi')"}, "tests": [{"size": 1}]},
        "discord": {"webhook_url": HOOK_URL}
    })
}
