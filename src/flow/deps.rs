//! What every arrow of the flow works with: the store, the service clients, the
//! configuration, the clock and the metrics, built once per function at start-up.

use std::sync::Arc;
use std::time::Duration;

use secrecy::ExposeSecret;

use crate::buildkite::{BuildkiteClient, BuildkiteError};
use crate::callback::{CallbackSender, SenderError};
use crate::config::{Config, ConfigError};
use crate::discord::{DiscordError, DiscordTarget, Notifier, Priority};
use crate::flow::keys::{Keys, LiveKeys, ReadKeys};
use crate::flow::place_buckets::PlaceBuckets;
use crate::flow::profiles::ClickCounter;
use crate::flow::quiet_lists::QuietLists;
use crate::flow::status::PageCache;
use crate::jobs::{Job, JobStore, SeenEntries, StoreWindows, Target};
use crate::retry::{Deadline, Policy};
use crate::telemetry::metrics::Metrics;
use crate::time::Clock;

/// The clients and the store, nothing else.
#[derive(Clone)]
pub struct Deps {
    pub(crate) store: Arc<dyn JobStore>,
    pub(crate) buildkite: BuildkiteClient,
    pub(crate) discord: Notifier,
    /// Signed callbacks, when `CALLBACK_URL` is set.
    pub(crate) callbacks: Option<CallbackSender>,
    pub(crate) config: Arc<Config>,
    /// What inbound requests are checked by: Buildkite's webhook secrets, the submit tokens.
    pub(crate) keys: Arc<LiveKeys>,
    /// Where status goes when a submission names no Discord target (`DISCORD_WEBHOOK_URL`).
    pub(crate) default_discord: Option<DiscordTarget>,
    /// The operators' channel (`OPS_DISCORD_WEBHOOK_URL`): GPU incidents.
    pub(crate) ops_discord: Option<DiscordTarget>,
    pub(crate) clock: Clock,
    pub(crate) metrics: Metrics,
    /// How long one job's sends to one receiver may take (`None`: until the deadline). A
    /// sweep pass sets it, so a hung receiver costs each job a slice, not the pass.
    pub(crate) send_slice: Option<Duration>,
    /// Clicks on profile links per run (submit only).
    pub(crate) profile_clicks: ClickCounter,
    /// The status page this instance read last (submit only).
    pub(crate) status_page: PageCache,
    /// Queues whose deferred list this instance read empty lately.
    pub(crate) quiet_lists: QuietLists,
    /// Waiting jobs' Discord buckets, as this instance last read them (placing).
    pub(crate) place_buckets: PlaceBuckets,
    /// Shared entries (queues' leases and records) as this instance last saw them.
    pub(crate) seen: Arc<SeenEntries>,
}

/// Why a function could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("the Buildkite client could not be built")]
    Buildkite(#[source] BuildkiteError),
    #[error("the Discord client could not be built")]
    Discord(#[source] DiscordError),
    #[error("the callback client could not be built")]
    Callback(#[source] reqwest::Error),
}

/// Time kept back after Buildkite work for the state write (DynamoDB's own bound is 5 s).
const STORE_RESERVE: Duration = Duration::from_secs(5);

/// A webhook URL of the configuration (`var`), parsed as a submission's webhook URL is.
fn discord_target(
    raw: Option<&secrecy::SecretString>,
    var: &'static str,
) -> Result<Option<DiscordTarget>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    DiscordTarget::parse(raw.expose_secret(), None)
        .map(Some)
        .map_err(|e| ConfigError::invalid(var, e))
}

/// The callback sender `CALLBACK_URL` and `CALLBACK_SECRET` describe.
fn callbacks(config: &Config) -> Result<Option<CallbackSender>, StartError> {
    let Some(c) = &config.callback else {
        return Ok(None);
    };
    match CallbackSender::new(c.url.clone(), c.secret.expose_secret()) {
        Ok(sender) => Ok(Some(sender)),
        // The key's error never quotes it.
        Err(SenderError::Key(e)) => Err(ConfigError::invalid("CALLBACK_SECRET", e).into()),
        Err(SenderError::Client(e)) => Err(StartError::Callback(e)),
    }
}

impl Deps {
    pub fn new(config: Arc<Config>, store: Arc<dyn JobStore>) -> Result<Self, StartError> {
        let windows = StoreWindows::of(store.clone());
        Ok(Self {
            store,
            // Buildkite's window and each webhook's bucket are spent by every instance
            // together: counted in the store.
            buildkite: BuildkiteClient::new(&config.buildkite)
                .map_err(StartError::Buildkite)?
                .with_windows(windows.clone()),
            discord: Notifier::new(config.discord.api_url.clone())
                .map_err(StartError::Discord)?
                .with_windows(windows),
            callbacks: callbacks(&config)?,
            keys: Arc::new(LiveKeys::new(Keys::of(&config), None, 0)),
            default_discord: discord_target(
                config.discord.default_webhook.as_ref(),
                "DISCORD_WEBHOOK_URL",
            )?,
            // The operators' channel is optional: a malformed one is logged and left out
            // (its alarm still holds) rather than stopping every user's report.
            ops_discord: discord_target(
                config.discord.ops_webhook.as_ref(),
                "OPS_DISCORD_WEBHOOK_URL",
            )
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "the operators' channel is left out");
                None
            }),
            config,
            clock: Clock::default(),
            metrics: Metrics::for_function("local"),
            send_slice: None,
            profile_clicks: ClickCounter::default(),
            status_page: PageCache::default(),
            quiet_lists: QuietLists::default(),
            place_buckets: PlaceBuckets::default(),
            seen: Arc::default(),
        })
    }

    /// The webhook `target` names, as Discord's client takes it; `None` when it names the
    /// deployment's default and there is none any more.
    pub(crate) fn discord_target(&self, target: &Target) -> Option<DiscordTarget> {
        match target {
            Target::Default => self.default_discord.clone(),
            Target::Webhook(a) => Some(DiscordTarget {
                webhook_id: a.webhook_id.clone(),
                token: a.token.clone(),
                thread_id: a.thread_id.clone(),
            }),
        }
    }

    /// The bucket of the webhook `job`'s message goes to (by name) and how many messages of
    /// `priority` it has room for now, as this instance sees it; `None` when the job has none.
    pub(crate) fn discord_room(&self, job: &Job, priority: Priority) -> Option<(String, i64)> {
        let target = job.discord.as_ref()?.target.as_ref()?;
        let target = self.discord_target(target)?;
        let room = self.discord.room(&target, priority);
        Some((target.bucket(), room))
    }

    /// These dependencies, on `clock` (tests move it forward).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.buildkite = self.buildkite.with_clock(clock.clone());
        self.discord = self.discord.with_clock(clock.clone());
        self.clock = clock;
        self
    }

    /// These dependencies, reading their inbound keys again through `reader` (a deployment
    /// whose keys come from the secrets extension: they rotate while an instance lives);
    /// those held were read now, on this clock.
    pub fn with_key_reader(mut self, reader: ReadKeys) -> Self {
        let held = self.keys.current().as_ref().clone();
        self.keys = Arc::new(LiveKeys::new(held, Some(reader), self.clock.now()));
        self
    }

    /// These dependencies, publishing metrics to `metrics`.
    pub(crate) fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Every outbound call with `retry` and at most `timeout` per try (tests and benchmarks
    /// use short ones).
    pub fn with_outbound(mut self, retry: Policy, timeout: Duration) -> Self {
        self.buildkite = self.buildkite.with_retry(retry).with_timeout(timeout);
        self.discord = self.discord.with_retry(retry).with_timeout(timeout);
        self.callbacks = self.callbacks.map(|c| c.with_timeout(timeout));
        self
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The part of `deadline` Buildkite work may use: the state write and one Discord attempt
    /// must still fit after it, or a function could die between the two.
    pub(crate) fn buildkite_deadline(&self, deadline: Deadline) -> Deadline {
        deadline.less(STORE_RESERVE + self.discord.timeout())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    use crate::config::Role;

    fn start(vars: &[(&str, &str)]) -> Result<Deps, StartError> {
        let mut map: HashMap<String, String> = [
            ("BUILDKITE_ORG", "org"),
            ("BUILDKITE_PIPELINE", "pipe"),
            ("BUILDKITE_API_TOKEN", "bk-secret"),
            ("JOBS_TABLE", "jobs"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        map.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let config = Config::from_lookup(Role::Sweep, &move |k| map.get(k).cloned())?;
        // Start-up makes no call: a client that could reach no DynamoDB will do.
        let client = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::Config::builder()
                .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
                .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
                .build(),
        );
        let store = crate::jobs::DynamoStore::new(client, "jobs".into());
        Deps::new(Arc::new(config), Arc::new(store))
    }

    fn invalid(result: Result<Deps, StartError>) -> Option<&'static str> {
        match result {
            Err(StartError::Config(ConfigError::Invalid { name, .. })) => Some(name),
            _ => None,
        }
    }

    #[test]
    fn a_malformed_default_discord_webhook_names_its_variable() {
        let bad = start(&[("DISCORD_WEBHOOK_URL", "https://x.com/a")]);
        assert_eq!(invalid(bad), Some("DISCORD_WEBHOOK_URL"));
        let good = start(&[(
            "DISCORD_WEBHOOK_URL",
            "https://discord.com/api/webhooks/1/tok",
        )]);
        assert!(good.is_ok_and(|d| d.default_discord.is_some()));
    }

    #[test]
    fn every_callback_key_signs_and_a_bad_one_is_named_never_shown() {
        let key = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let url = ("CALLBACK_URL", "https://kernelbot.example/cb");
        let two = format!("{key} whsec_c2Vjb25k");
        let deps = start(&[url, ("CALLBACK_SECRET", &two)]).expect("starts");
        assert_eq!(deps.callbacks.as_ref().map(CallbackSender::keys), Some(2));
        for bad in [
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_not*base64",
            "whsec_",
        ] {
            let err = start(&[url, ("CALLBACK_SECRET", bad)])
                .err()
                .expect("refused");
            assert!(
                matches!(
                    &err,
                    StartError::Config(ConfigError::Invalid {
                        name: "CALLBACK_SECRET",
                        ..
                    })
                ),
                "{bad}: {err:?}"
            );
            assert!(!err.to_string().contains(bad), "{err}");
        }
    }
}
