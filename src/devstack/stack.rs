//! The whole system on this machine, for the tests and the benchmarks: the real routers of
//! the three functions on random ports, one store behind them (SQLite in a temp dir, or
//! DynamoDB on moto), the Buildkite, Discord and callback-receiver stand-ins in front, and
//! one clock they share.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::buildkite::{BuildkiteStandin, deliver};
use super::discord::{DiscordCall, DiscordStandin};
use super::env::{Secrets, function_env};
use super::receiver::ReceiverStandin;
use super::units::CountingStore;
use crate::config::Role;
use crate::error::BoxError;
use crate::flow::{Deps, sweep};
use crate::http;
use crate::jobs::{DynamoStore, Job, JobStore, RunId, SqliteStore};
use crate::retry::{Deadline, Policy};
use crate::telemetry::metrics::Metrics;
use crate::time::Clock;

pub const API_TOKEN: &str = "test-submit-token";
pub const BK_TOKEN: &str = "test-buildkite-token";
pub const SECRET: &str = "test-webhook-secret";
/// Signs the stack's profile links.
pub const LINK_SECRET: &str = "test-profile-link-secret-of-32-bytes-or-more";
pub const HOOK_URL: &str = "https://discord.com/api/webhooks/111111111111111111/hook-token_1";

/// Which store the stack keeps jobs in.
#[derive(Clone, Copy, Debug)]
pub enum StoreKind {
    Sqlite,
    Dynamo,
}

/// Opens a fresh, empty store of `kind`; the temp dir (SQLite) lives as long as the guard.
pub async fn open_store(
    kind: StoreKind,
) -> Result<(Arc<dyn JobStore>, Option<tempfile::TempDir>), BoxError> {
    let (store, dir, _) = fresh_store(kind).await?;
    Ok((store, dir))
}

/// A store as [`open_store`] opens it, with the environment that names it to a function.
async fn fresh_store(kind: StoreKind) -> Result<OpenedStore, BoxError> {
    Ok(match kind {
        StoreKind::Sqlite => {
            let dir = tempfile::tempdir()?;
            let env = [("KERNELBOT_DATA_DIR", dir.path().display().to_string())];
            (
                Arc::new(SqliteStore::open(dir.path())?),
                Some(dir),
                named(env),
            )
        }
        StoreKind::Dynamo => {
            let client = super::moto::client()?;
            let table = format!("jobs-{}", uuid::Uuid::new_v4().simple());
            super::moto::create_table(&client, &table).await?;
            // The credentials and region the moto client uses.
            let env = [
                ("JOBS_TABLE", table.clone()),
                (
                    "AWS_ENDPOINT_URL_DYNAMODB",
                    super::moto::endpoint()?.to_owned(),
                ),
                ("AWS_REGION", "us-east-1".into()),
                ("AWS_ACCESS_KEY_ID", "test".into()),
                ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ];
            (Arc::new(DynamoStore::new(client, table)), None, named(env))
        }
    })
}

/// A store, its temp dir (SQLite), and the environment that names it.
type OpenedStore = (
    Arc<dyn JobStore>,
    Option<tempfile::TempDir>,
    BTreeMap<String, String>,
);

fn named<const N: usize>(vars: [(&str, String); N]) -> BTreeMap<String, String> {
    vars.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

pub struct Stack {
    pub submit_url: String,
    pub webhook_url: String,
    pub buildkite: BuildkiteStandin,
    pub discord: DiscordStandin,
    /// Where callbacks go when the stack was started with a `CALLBACK_SECRET`.
    pub receiver: ReceiverStandin,
    pub store: Arc<dyn JobStore>,
    /// The sweep function's dependencies.
    pub sweeper: Arc<Deps>,
    /// The routers themselves, for driving them with Lambda events.
    pub submit_router: axum::Router,
    pub webhook_router: axum::Router,
    pub client: reqwest::Client,
    /// The clock all three functions share.
    pub clock: Clock,
    /// Every metric the three functions published (EMF objects).
    metrics: Arc<Mutex<Vec<Value>>>,
    /// What a function started as a process of its own needs to be one of this stack's:
    /// the stand-ins, the secrets and the store.
    pub env: BTreeMap<String, String>,
    /// The limit of each outbound call.
    timeout: Duration,
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

async fn serve(router: axum::Router) -> Result<String, BoxError> {
    Ok(format!("http://{}", super::spawn(router).await?))
}

/// The stand-ins a stack's functions call.
struct StandIns {
    buildkite: BuildkiteStandin,
    discord: DiscordStandin,
    receiver: ReceiverStandin,
}

impl StandIns {
    async fn start(clock: &Clock) -> Result<Self, BoxError> {
        let buildkite =
            BuildkiteStandin::start_with_clock(BK_TOKEN, "test-org", "kernelbot", clock.clone());
        Ok(Self {
            buildkite: buildkite.await?,
            discord: DiscordStandin::start_with_clock(clock.clone()).await?,
            receiver: ReceiverStandin::start().await?,
        })
    }

    /// The functions' environment: the stand-ins' URLs and the test secrets, then `vars`.
    fn env(&self, vars: &[(&str, &str)]) -> BTreeMap<String, String> {
        let secrets = Secrets {
            buildkite_token: BK_TOKEN.into(),
            // Two, as during a rotation: a webhook signed with either verifies.
            webhook_secret: format!("old-secret,{SECRET}"),
            submit_token: API_TOKEN.into(),
            profile_link_secret: LINK_SECRET.into(),
        };
        let mut env = function_env(&self.buildkite, &self.discord, &secrets);
        let named = |key: &str| vars.iter().any(|(k, _)| *k == key);
        // A stack reading its secrets through the extension holds none in its environment.
        if named(crate::secrets::SECRET_ID_VAR) {
            env.retain(|k, _| !crate::secrets::keys().contains(&k.as_str()));
        }
        if named("CALLBACK_SECRET") || named(crate::secrets::SECRET_ID_VAR) {
            env.insert("CALLBACK_URL".into(), self.receiver.url.clone());
        }
        // The tests and benchmarks send the same code again and again as submissions each
        // meant to run: answers from earlier runs only where one asks for them.
        env.insert("RESULT_CACHE_SECS".into(), "0".into());
        env.extend(vars.iter().map(|(k, v)| ((*k).into(), (*v).into())));
        env
    }
}

/// What the stack's functions share: one store, one clock, one metrics sink.
struct Wiring {
    store: Arc<dyn JobStore>,
    clock: Clock,
    metrics: Arc<Mutex<Vec<Value>>>,
    timeout: Duration,
}

impl Wiring {
    /// One function's dependencies, configured as a deployed function's are
    /// ([`crate::server::configure`]: its environment, then the secrets extension).
    async fn deps(&self, env: BTreeMap<String, String>, role: Role) -> Result<Arc<Deps>, BoxError> {
        let env: crate::server::Lookup = Arc::new(move |k: &str| env.get(k).cloned());
        let config = crate::server::configure(role, env.as_ref()).await?;
        let deps = Deps::new(Arc::new(config), self.store.clone())?.with_clock(self.clock.clone());
        let deps = match crate::server::key_reader(role, &env) {
            Some(reader) => deps.with_key_reader(reader),
            None => deps,
        };
        let deps = deps
            .with_metrics(Metrics::shared(role.name(), self.metrics.clone()))
            .with_outbound(quick_retries(), self.timeout);
        Ok(Arc::new(deps))
    }
}

impl Stack {
    pub async fn spawn(kind: StoreKind) -> Result<Self, BoxError> {
        Self::spawn_with(kind, &[]).await
    }

    /// Starts the stack; `vars` add to or override the environment the functions see.
    pub async fn spawn_with(kind: StoreKind, vars: &[(&str, &str)]) -> Result<Self, BoxError> {
        Self::spawn_tuned(kind, vars, Duration::from_secs(5)).await
    }

    /// As `spawn_with`, with `timeout` on every Buildkite, Discord and callback call.
    pub async fn spawn_tuned(
        kind: StoreKind,
        vars: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Self, BoxError> {
        Self::spawn_on(kind, vars, timeout, Clock::default()).await
    }

    /// As `spawn_with`, every function and stand-in on `clock` (a benchmark's runs faster
    /// than real time).
    pub async fn spawn_on(
        kind: StoreKind,
        vars: &[(&str, &str)],
        timeout: Duration,
        clock: Clock,
    ) -> Result<Self, BoxError> {
        Self::start(kind, (vars, timeout, clock), |store| store).await
    }

    /// As `spawn_on`, the functions' store counted as DynamoDB would bill its calls.
    pub async fn spawn_counted(
        kind: StoreKind,
        vars: &[(&str, &str)],
        timeout: Duration,
        clock: Clock,
    ) -> Result<(Self, Arc<CountingStore>), BoxError> {
        let mut counted = None;
        let stack = Self::start(kind, (vars, timeout, clock), |store| {
            let c = Arc::new(CountingStore::new(store));
            counted = Some(c.clone());
            c
        })
        .await?;
        let counted = counted.ok_or("the store was not opened")?;
        Ok((stack, counted))
    }

    /// Starts the stack over a fresh store of `kind` as `wrap` gives it to the functions.
    async fn start(
        kind: StoreKind,
        (vars, timeout, clock): (&[(&str, &str)], Duration, Clock),
        wrap: impl FnOnce(Arc<dyn JobStore>) -> Arc<dyn JobStore>,
    ) -> Result<Self, BoxError> {
        if std::env::var_os("TEST_LOG").is_some() {
            crate::telemetry::init();
        }
        let stand_ins = StandIns::start(&clock).await?;
        let (store, dir, store_env) = fresh_store(kind).await?;
        let mut env = stand_ins.env(vars);
        let metrics = Arc::new(Mutex::new(Vec::new()));
        // The functions' store as `wrap` gives it; the stack's own reads (the tests' and the
        // benchmarks') go to the store itself.
        let wiring = Wiring {
            store: wrap(store.clone()),
            clock: clock.clone(),
            metrics: metrics.clone(),
            timeout,
        };
        let deps = |env: &BTreeMap<String, String>, role| wiring.deps(env.clone(), role);
        let submit_router = http::submit::router(deps(&env, Role::Submit).await?);
        let submit_url = serve(submit_router.clone()).await?;
        // Profile links open the submit API: the others make them.
        env.entry("PUBLIC_URL".into())
            .or_insert_with(|| submit_url.clone());
        let webhook_router = http::webhook::router(deps(&env, Role::Webhook).await?);
        let sweeper = deps(&env, Role::Sweep).await?;
        env.extend(store_env);
        Ok(Self {
            submit_url,
            webhook_url: format!(
                "{}/webhooks/buildkite",
                serve(webhook_router.clone()).await?
            ),
            buildkite: stand_ins.buildkite,
            discord: stand_ins.discord,
            receiver: stand_ins.receiver,
            store,
            sweeper,
            submit_router,
            webhook_router,
            client: reqwest::Client::new(),
            clock,
            metrics,
            env,
            timeout,
            _dir: dir,
        })
    }

    /// Another instance of the submit function over this stack's store and clock, with
    /// dependencies of its own, as a second Lambda instance has (its own view of each rate
    /// limit): the base URL it is served on.
    pub async fn another_submit(&self) -> Result<String, BoxError> {
        let wiring = Wiring {
            store: self.store.clone(),
            clock: self.clock.clone(),
            metrics: self.metrics.clone(),
            timeout: self.timeout,
        };
        let deps = wiring.deps(self.env.clone(), Role::Submit).await?;
        serve(http::submit::router(deps)).await
    }

    pub async fn submit(&self, body: &Value) -> Result<(StatusCode, Value), BoxError> {
        self.submit_raw(body.to_string().into_bytes(), Some(API_TOKEN))
            .await
    }

    pub async fn submit_raw(
        &self,
        body: Vec<u8>,
        token: Option<&str>,
    ) -> Result<(StatusCode, Value), BoxError> {
        let mut req = self
            .client
            .post(format!("{}/submissions", self.submit_url))
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        answer(req).await
    }

    pub async fn cancel(&self, run_id: &str) -> Result<(StatusCode, Value), BoxError> {
        let url = format!("{}/submissions/{run_id}/cancel", self.submit_url);
        answer(self.client.post(url).bearer_auth(API_TOKEN)).await
    }

    pub async fn status(&self, run_id: &str) -> Result<(StatusCode, Value), BoxError> {
        let url = format!("{}/submissions/{run_id}", self.submit_url);
        answer(self.client.get(url).bearer_auth(API_TOKEN)).await
    }

    /// The job as stored; `None` if there is none (or the store failed).
    pub async fn job(&self, run_id: &str) -> Option<Job> {
        let id: RunId = run_id.parse().ok()?;
        self.store.get(&id).await.ok().flatten()
    }

    /// Sends `event` for build `number` as Buildkite would, signed with the current secret;
    /// the answer's status (`None`: no answer).
    pub async fn event(&self, event: &str, number: u64) -> Option<StatusCode> {
        let body = self.buildkite.webhook_body(event, number);
        let at = self.buildkite.now_secs();
        let sent = deliver(&self.webhook_url, SECRET, event, body, at).await;
        sent.ok().map(|r| r.status())
    }

    /// Ends build `number` in `state` with `result` uploaded, and sends `build.finished`.
    pub async fn finish(
        &self,
        number: u64,
        state: &str,
        result: Option<Vec<u8>>,
    ) -> Option<StatusCode> {
        if let Some(bytes) = result {
            self.buildkite
                .upload(number, "result.json", bytes, "finished", false);
        }
        self.buildkite.set_state(number, state);
        self.event("build.finished", number).await
    }

    /// Ends build `number`'s try on `agent` as a node does today: `result` (which the runner
    /// stamps with the try) uploaded and, packed, set as the build's meta-data by the hook,
    /// `job.finished` sent; then the build ends in `state` and `build.finished` is sent.
    pub async fn finish_riding(
        &self,
        number: u64,
        agent: &str,
        state: &str,
        result: &[u8],
    ) -> Option<StatusCode> {
        self.end_riding(number, agent, state, result).await?;
        self.event("build.finished", number).await
    }

    /// All of [`Self::finish_riding`] but its `build.finished` (which the caller sends).
    pub async fn end_riding(
        &self,
        number: u64,
        agent: &str,
        state: &str,
        result: &[u8],
    ) -> Option<()> {
        let job_id = self.buildkite.end_try_now(number, agent, 0)?;
        let mut stamped: Value = serde_json::from_slice(result).ok()?;
        stamped["written_by"] = json!({"job_id": job_id, "retry_count": 0});
        let bytes = serde_json::to_vec(&stamped).ok()?;
        if let Some(value) = crate::protocol::riding::pack_result(&bytes) {
            let key = crate::protocol::riding::RESULT_META_DATA_KEY;
            self.buildkite.set_meta_data(number, key, &value);
        }
        self.buildkite
            .upload(number, "result.json", bytes, "finished", false);
        self.event("job.finished", number).await;
        self.buildkite.set_state(number, state);
        Some(())
    }

    /// One pass of the sweep function, as its schedule would run it: within the pass's
    /// time (`SWEEP_PASS_SECS`), as the `sweep` binary gives it.
    pub async fn sweep(&self) -> Result<sweep::SweepReport, crate::flow::DispatchError> {
        let pass = self.sweeper.config().timing.sweep_pass;
        sweep::sweep(&self.sweeper, Deadline::after(pass)).await
    }

    /// Moves every function's clock forward (deadlines and give-ups without waiting).
    pub fn advance_clock(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// The values of metric `name` published so far, with their objects' dimensions.
    pub fn metric(&self, name: &str) -> Vec<(Value, f64)> {
        self.metrics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
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
async fn answer(req: reqwest::RequestBuilder) -> Result<(StatusCode, Value), BoxError> {
    let resp = req.send().await.map_err(reqwest::Error::without_url)?;
    let status = resp.status();
    Ok((status, resp.json().await.unwrap_or(Value::Null)))
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
