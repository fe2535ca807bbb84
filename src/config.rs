//! Configuration, read once from the environment at start-up into typed values.
//!
//! A missing or malformed variable stops start-up with a message that names it. Secrets are
//! held in [`SecretString`], whose `Debug` prints nothing of them. This module is a leaf: a
//! value with a format of its own (a Discord webhook URL, a `whsec_` signing key) is kept as
//! given and parsed by the module that owns that format, which reports a bad one as a
//! [`ConfigError`] naming the variable.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use url::Url;

pub(crate) const DEFAULT_BUILDKITE_API_URL: &str = "https://api.buildkite.com/v2";
pub(crate) const DEFAULT_DISCORD_API_URL: &str = "https://discord.com/api/v10";
pub(crate) const DEFAULT_LISTEN_ADDR: &str = "127.0.0.1:3000";
pub(crate) const DEFAULT_GPU_QUEUES: &str = "B200_BK=b200,H100_BK=h100,MI300_BK=mi300,L40S_BK=test";
/// The runner image `infra/buildkite/Dockerfile` builds, which `pipeline.yml` falls back to.
pub(crate) const DEFAULT_IMAGE: &str = "ghcr.io/gpu-mode/kernelbot-runner:latest";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("environment variable {0} is required but not set")]
    Missing(&'static str),
    #[error("environment variable {name} is invalid: {reason}")]
    Invalid { name: &'static str, reason: String },
}

impl ConfigError {
    /// `name` is malformed for `reason` (never the value itself: it may be a secret).
    pub(crate) fn invalid(name: &'static str, reason: impl ToString) -> Self {
        Self::Invalid {
            name,
            reason: reason.to_string(),
        }
    }
}

/// Which function is starting: each requires only the secrets it uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Submit,
    Webhook,
    Sweep,
}

impl Role {
    /// The function's name, as metrics and logs give it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Submit => "submit",
            Self::Webhook => "webhook",
            Self::Sweep => "sweep",
        }
    }

    /// The secrets this function uses: the only ones it keeps from the secrets extension.
    pub fn secret_keys(self) -> Vec<&'static str> {
        SECRET_KEYS
            .iter()
            .filter(|(_, used_by)| used_by.contains(&self))
            .map(|(key, _)| *key)
            .collect()
    }
}

const ALL_ROLES: &[Role] = &[Role::Submit, Role::Webhook, Role::Sweep];

/// Every key the deployment's secret may hold, with the functions that keep it: the one list
/// of secrets. The public webhook function never keeps the submission API's token. A test
/// checks that `template.yaml` and `docs/configuration.md` name exactly these.
pub const SECRET_KEYS: &[(&str, &[Role])] = &[
    ("BUILDKITE_API_TOKEN", ALL_ROLES),
    ("BUILDKITE_WEBHOOK_SECRET", &[Role::Webhook]),
    ("SUBMIT_API_TOKEN", &[Role::Submit]),
    ("DISCORD_WEBHOOK_URL", ALL_ROLES),
    ("CALLBACK_SECRET", ALL_ROLES),
    ("PROFILE_LINK_SECRET", ALL_ROLES),
    ("OPS_DISCORD_WEBHOOK_URL", &[Role::Webhook, Role::Sweep]),
];

#[derive(Debug, Clone)]
pub struct BuildkiteConfig {
    pub api_url: Url,
    pub org: String,
    pub pipeline: String,
    pub token: SecretString,
    pub branch: String,
    pub commit: String,
    pub image: String,
}

#[derive(Debug, Clone)]
pub struct DiscordConfig {
    pub api_url: Url,
    /// `DISCORD_WEBHOOK_URL`, as given: where status goes when a submission names no Discord
    /// target (its token is a credential).
    pub default_webhook: Option<SecretString>,
    /// `OPS_DISCORD_WEBHOOK_URL`: the operators' channel, told of each GPU incident.
    pub ops_webhook: Option<SecretString>,
}

/// Where signed completion callbacks go (`CALLBACK_URL`), and the keys that sign them.
#[derive(Clone)]
pub struct CallbackConfig {
    pub url: Url,
    /// `CALLBACK_SECRET`: space-separated `whsec_` keys, every one signing while a rotation
    /// is under way.
    pub secret: SecretString,
}

impl std::fmt::Debug for CallbackConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallbackConfig")
            // Its query may carry a token of the receiver's.
            .field(
                "url",
                &format_args!(
                    "{}{}",
                    self.url.origin().ascii_serialization(),
                    self.url.path()
                ),
            )
            .field("secret", &"[redacted]")
            .finish()
    }
}

/// Signed links to profile runs' files (`PROFILE_LINK_SECRET`).
#[derive(Clone)]
pub struct ProfileLinkConfig {
    /// The keys: the first signs new links, any verifies one (space-separated while a key
    /// is rotated, so links already sent keep opening).
    pub secret: SecretString,
    /// The submit API's public URL (`PUBLIC_URL`), which the links open; without it a
    /// function verifies links but makes none.
    pub base_url: Option<Url>,
    /// How long a link opens (`PROFILE_LINK_TTL_SECS`, default 7 days).
    pub ttl: Duration,
}

impl ProfileLinkConfig {
    /// Every key a link may be signed with.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.secret
            .expose_secret()
            .split_whitespace()
            .map(str::as_bytes)
    }

    /// The key new links are signed with: the first. A rotation appends the new key
    /// everywhere first (every instance then opens its links), and only then moves it to the
    /// front: an instance still holding the old keys alone never meets a link it cannot open.
    pub(crate) fn signing_key(&self) -> &[u8] {
        self.keys().next().unwrap_or_default()
    }
}

impl std::fmt::Debug for ProfileLinkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfileLinkConfig")
            .field("secret", &"[redacted]")
            .field("base_url", &self.base_url.as_ref().map(Url::as_str))
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// How Buildkite's webhook requests are verified.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Every secret a signature may be made with (several while rotating).
    pub secrets: Vec<SecretString>,
    /// Accept the clear-text `X-Buildkite-Token` header (weaker: no replay protection).
    pub allow_token: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    Dynamo { table: String },
    Embedded { dir: PathBuf },
}

impl StoreConfig {
    /// Where jobs are kept: DynamoDB when `JOBS_TABLE` is set, else an embedded file under
    /// `KERNELBOT_DATA_DIR` in builds that have one. Needs no secret, so a function can open
    /// its store at init, before the secrets extension answers.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let env = Env(lookup);
        match env.get("JOBS_TABLE") {
            Some(table) => Ok(Self::Dynamo { table }),
            None if cfg!(feature = "embedded-store") => Ok(Self::Embedded {
                dir: env
                    .get("KERNELBOT_DATA_DIR")
                    .unwrap_or_else(|| "./.kernelbot".into())
                    .into(),
            }),
            // The Lambda builds leave the embedded store out (see Cargo.toml).
            None => Err(ConfigError::Missing("JOBS_TABLE")),
        }
    }
}

/// A profile link's key is as long as a SHA-256 block's worth of guessing needs.
const MIN_LINK_SECRET_BYTES: usize = 32;
/// Profile links open for at most this long (Buildkite keeps artifacts about six months).
const MAX_LINK_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The longest duration a `*_SECS` variable may give.
const MAX_SECS: u64 = 365 * 24 * 3600;

/// The most GPUs one agent may hold (`GPU=queue:N`).
const MAX_GPUS_PER_AGENT: u32 = 64;

/// The Buildkite queue that serves a GPU, and how many GPUs each of its agents holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueSpec {
    pub(crate) name: String,
    /// More than 1: a queue for multi-GPU tasks only.
    pub(crate) gpus: u32,
}

/// GPU name → Buildkite queue (`GPU=queue`, or `GPU=queue:N` for agents of N GPUs).
/// Configuration, not code: new hardware is a deploy, not a release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueMap(BTreeMap<String, QueueSpec>);

/// One `queue` or `queue:N` of `GPU_QUEUES`.
fn queue(pair: &str, spec: &str) -> Result<QueueSpec, String> {
    let (name, gpus) = match spec.split_once(':') {
        None => (spec, 1),
        Some((name, n)) => {
            let gpus = n
                .trim()
                .parse()
                .ok()
                .filter(|n| (1..=MAX_GPUS_PER_AGENT).contains(n))
                .ok_or_else(|| {
                    format!("{pair:?}: GPUs per agent must be from 1 to {MAX_GPUS_PER_AGENT}")
                })?;
            (name.trim(), gpus)
        }
    };
    if name.is_empty() {
        return Err(format!("{pair:?} is not GPU=queue"));
    }
    Ok(QueueSpec {
        name: name.to_owned(),
        gpus,
    })
}

impl QueueMap {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (gpu, spec) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not GPU=queue"))?;
            let gpu = gpu.trim();
            if gpu.is_empty() {
                return Err(format!("{pair:?} is not GPU=queue"));
            }
            map.insert(gpu.to_owned(), queue(pair, spec.trim())?);
        }
        if map.is_empty() {
            return Err("no GPU=queue pairs".into());
        }
        Ok(Self(map))
    }

    pub(crate) fn queue_for(&self, gpu: &str) -> Option<&str> {
        self.get(gpu).map(|q| q.name.as_str())
    }

    pub(crate) fn get(&self, gpu: &str) -> Option<&QueueSpec> {
        self.0.get(gpu)
    }

    pub(crate) fn gpus(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// Every queue of ours, once each.
    pub(crate) fn names(&self) -> std::collections::BTreeSet<&str> {
        self.0.values().map(|q| q.name.as_str()).collect()
    }

    /// Whether `queue` is one of ours (an agent event of another queue is not).
    pub(crate) fn serves(&self, queue: &str) -> bool {
        self.0.values().any(|q| q.name == queue)
    }

    /// The GPU names, as an error message lists them.
    pub(crate) fn known(&self) -> String {
        self.gpus().collect::<Vec<_>>().join(", ")
    }
}

/// The sweep's and the deadlines' settings.
#[derive(Debug, Clone)]
pub struct Timing {
    /// The sweep leaves younger jobs alone: their webhooks may still come.
    pub sweep_min_age: Duration,
    /// A job whose build has not been created (or whose evaluation has not started) this
    /// long after submission is given up.
    pub queue_timeout: Duration,
    /// An open job this old gets a last look at its build, which is canceled if still live.
    pub job_max_age: Duration,
    /// Buildkite calls one sweep pass may make.
    pub sweep_max_calls: u32,
    /// How long a pass run by hand (or by cron) may take; under Lambda the invocation's own
    /// deadline rules.
    pub sweep_pass: Duration,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub buildkite: BuildkiteConfig,
    pub discord: DiscordConfig,
    pub store: StoreConfig,
    pub queues: QueueMap,
    pub listen_addr: SocketAddr,
    /// Bearer tokens accepted by the submission API (submit only).
    pub submit_tokens: Vec<SecretString>,
    /// How webhook requests are verified (webhook only).
    pub webhook: WebhookConfig,
    pub timing: Timing,
    /// Signed callbacks on every state change; `None` when `CALLBACK_URL` is unset.
    pub callback: Option<CallbackConfig>,
    /// Links to profile runs' files; `None` when `PROFILE_LINK_SECRET` is unset.
    pub profile_links: Option<ProfileLinkConfig>,
    /// `USER_MAX_IN_FLIGHT`: at most this many of a user's jobs per queue have a build at
    /// once (0: no fair share, first come first served).
    pub user_max_in_flight: usize,
    /// `USER_MAX_WAITING`: at most this many of a user's jobs per queue wait for fair share
    /// (0: no limit); a submission past it is refused (429, `Retry-After`), nothing recorded.
    pub user_max_waiting: usize,
    /// `RESULT_CACHE_SECS`: how long a `test` or `benchmark` run's end answers identical
    /// submissions without a build (0: never).
    pub result_cache_secs: u64,
    /// `USER_GPU_SECONDS_PER_DAY`: a user's evaluation time over a rolling 24 hours past
    /// which their submissions are refused until enough frees (0: no budget).
    pub user_gpu_seconds_per_day: u64,
}

struct Env<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Env<'_> {
    fn get(&self, name: &str) -> Option<String> {
        (self.0)(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    fn required(&self, name: &'static str) -> Result<String, ConfigError> {
        self.get(name).ok_or(ConfigError::Missing(name))
    }

    fn or(&self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or_else(|| default.to_owned())
    }

    /// A base URL (a trailing `/` dropped: paths are appended to it).
    fn url(&self, name: &'static str, default: &str) -> Result<Url, ConfigError> {
        self.exact_url(name, self.or(name, default).trim_end_matches('/'))
    }

    /// A URL used as it is written (a receiver's route may need its trailing `/`).
    fn exact_url(&self, name: &'static str, raw: &str) -> Result<Url, ConfigError> {
        let url = Url::parse(raw).map_err(|e| ConfigError::invalid(name, e))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ConfigError::invalid(name, "must be an http(s) URL"));
        }
        Ok(url)
    }

    /// A comma-separated list of secrets; required when `needed`.
    fn secrets(&self, name: &'static str, needed: bool) -> Result<Vec<SecretString>, ConfigError> {
        let secrets: Vec<SecretString> = self
            .get(name)
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(SecretString::from)
            .collect();
        if needed && secrets.is_empty() {
            return Err(ConfigError::Missing(name));
        }
        Ok(secrets)
    }

    /// `CALLBACK_URL` and the `CALLBACK_SECRET` that must come with it.
    fn callback(&self) -> Result<Option<CallbackConfig>, ConfigError> {
        let Some(raw) = self.get("CALLBACK_URL") else {
            return Ok(None);
        };
        let url = self.exact_url("CALLBACK_URL", &raw)?;
        let secret = self.required("CALLBACK_SECRET")?.into();
        Ok(Some(CallbackConfig { url, secret }))
    }

    fn profile_links(&self) -> Result<Option<ProfileLinkConfig>, ConfigError> {
        let Some(secret) = self.get("PROFILE_LINK_SECRET") else {
            return Ok(None);
        };
        let base_url = self
            .get("PUBLIC_URL")
            .map(|raw| self.exact_url("PUBLIC_URL", raw.trim_end_matches('/')));
        let base_url = base_url.transpose()?;
        if secret
            .split_whitespace()
            .any(|key| key.len() < MIN_LINK_SECRET_BYTES)
        {
            return Err(ConfigError::invalid(
                "PROFILE_LINK_SECRET",
                format!("each key must be at least {MIN_LINK_SECRET_BYTES} bytes"),
            ));
        }
        let ttl = self.secs("PROFILE_LINK_TTL_SECS", 7 * 24 * 3600)?;
        if ttl.is_zero() || ttl > MAX_LINK_TTL {
            return Err(ConfigError::invalid(
                "PROFILE_LINK_TTL_SECS",
                "must be from 1 second to 30 days",
            ));
        }
        Ok(Some(ProfileLinkConfig {
            secret: secret.into(),
            base_url,
            ttl,
        }))
    }

    fn number(&self, name: &'static str, default: u64) -> Result<u64, ConfigError> {
        self.get(name).map_or(Ok(default), |v| {
            v.parse().map_err(|e| ConfigError::invalid(name, e))
        })
    }

    /// A duration in whole seconds, at most [`MAX_SECS`]: a larger one is a typo, and would
    /// overflow the clock arithmetic (a deadline, a time in milliseconds) it is used in.
    fn secs(&self, name: &'static str, default: u64) -> Result<Duration, ConfigError> {
        match self.number(name, default)? {
            secs if secs > MAX_SECS => Err(ConfigError::invalid(
                name,
                format!("must be at most {MAX_SECS} seconds (a year)"),
            )),
            secs => Ok(Duration::from_secs(secs)),
        }
    }

    fn flag(&self, name: &'static str) -> Result<bool, ConfigError> {
        match self.get(name).map(|v| v.to_ascii_lowercase()).as_deref() {
            None | Some("0" | "false" | "no") => Ok(false),
            Some("1" | "true" | "yes") => Ok(true),
            Some(_) => Err(ConfigError::invalid(name, "expected true or false")),
        }
    }

    fn buildkite(&self) -> Result<BuildkiteConfig, ConfigError> {
        Ok(BuildkiteConfig {
            api_url: self.url("BUILDKITE_API_URL", DEFAULT_BUILDKITE_API_URL)?,
            org: self.required("BUILDKITE_ORG")?,
            pipeline: self.required("BUILDKITE_PIPELINE")?,
            token: SecretString::from(self.required("BUILDKITE_API_TOKEN")?),
            branch: self.or("BUILDKITE_BRANCH", "main"),
            commit: self.or("BUILDKITE_COMMIT", "HEAD"),
            image: self.or("KERNELBOT_IMAGE", DEFAULT_IMAGE),
        })
    }

    fn discord(&self) -> Result<DiscordConfig, ConfigError> {
        Ok(DiscordConfig {
            api_url: self.url("DISCORD_API_URL", DEFAULT_DISCORD_API_URL)?,
            default_webhook: self.get("DISCORD_WEBHOOK_URL").map(SecretString::from),
            ops_webhook: self.get("OPS_DISCORD_WEBHOOK_URL").map(SecretString::from),
        })
    }

    fn timing(&self) -> Result<Timing, ConfigError> {
        let max_calls = self.number("SWEEP_MAX_CALLS", 40)?;
        Ok(Timing {
            sweep_min_age: self.secs("SWEEP_MIN_AGE_SECS", 600)?,
            queue_timeout: self.secs("QUEUE_TIMEOUT_SECS", 900)?,
            job_max_age: self.secs("JOB_MAX_AGE_SECS", 21_600)?,
            sweep_max_calls: u32::try_from(max_calls)
                .map_err(|_| ConfigError::invalid("SWEEP_MAX_CALLS", "too large"))?,
            sweep_pass: self.secs("SWEEP_PASS_SECS", 50)?,
        })
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env(role: Role) -> Result<Self, ConfigError> {
        Self::from_lookup(role, &|name| std::env::var(name).ok())
    }

    /// Reads configuration through `lookup`, so tests need not touch the process environment.
    pub fn from_lookup(
        role: Role,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let env = Env(lookup);
        let queues = QueueMap::parse(&env.or("GPU_QUEUES", DEFAULT_GPU_QUEUES))
            .map_err(|reason| ConfigError::invalid("GPU_QUEUES", reason))?;
        let listen_addr = env
            .or("LISTEN_ADDR", DEFAULT_LISTEN_ADDR)
            .parse()
            .map_err(|e| ConfigError::invalid("LISTEN_ADDR", e))?;
        Ok(Self {
            buildkite: env.buildkite()?,
            discord: env.discord()?,
            store: StoreConfig::from_lookup(lookup)?,
            queues,
            listen_addr,
            submit_tokens: env.secrets("SUBMIT_API_TOKEN", role == Role::Submit)?,
            webhook: WebhookConfig {
                secrets: env.secrets("BUILDKITE_WEBHOOK_SECRET", role == Role::Webhook)?,
                allow_token: env.flag("BUILDKITE_WEBHOOK_ALLOW_TOKEN")?,
            },
            timing: env.timing()?,
            callback: env.callback()?,
            profile_links: env.profile_links()?,
            user_max_in_flight: usize::try_from(env.number("USER_MAX_IN_FLIGHT", 2)?)
                .map_err(|_| ConfigError::invalid("USER_MAX_IN_FLIGHT", "too large"))?,
            user_max_waiting: usize::try_from(env.number("USER_MAX_WAITING", 20)?)
                .map_err(|_| ConfigError::invalid("USER_MAX_WAITING", "too large"))?,
            result_cache_secs: env.number("RESULT_CACHE_SECS", 86_400)?,
            user_gpu_seconds_per_day: env.number("USER_GPU_SECONDS_PER_DAY", 0)?,
        })
    }

    /// Where the functions listen outside Lambda (`LISTEN_ADDR`).
    pub(crate) fn listen_addr(&self) -> SocketAddr {
        self.listen_addr
    }

    /// Where jobs are kept.
    pub fn store(&self) -> &StoreConfig {
        &self.store
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn load(role: Role, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(role, &move |k| map.get(k).cloned())
    }

    const BASE: &[(&str, &str)] = &[
        ("BUILDKITE_ORG", "org"),
        ("BUILDKITE_PIPELINE", "pipe"),
        ("BUILDKITE_API_TOKEN", "bk-secret"),
    ];

    #[test]
    fn defaults_apply_and_secrets_stay_hidden() {
        let cfg = load(
            Role::Submit,
            &[BASE, &[("SUBMIT_API_TOKEN", "a, b")]].concat(),
        )
        .unwrap();
        assert_eq!(
            cfg.buildkite.api_url.as_str(),
            "https://api.buildkite.com/v2"
        );
        assert_eq!(cfg.queues.queue_for("L40S_BK"), Some("test"));
        // Builds without the embedded store require JOBS_TABLE instead.
        #[cfg(feature = "embedded-store")]
        assert_eq!(
            cfg.store,
            StoreConfig::Embedded {
                dir: "./.kernelbot".into()
            }
        );
        assert_eq!(cfg.submit_tokens.len(), 2);
        let debug = format!("{cfg:?}");
        assert!(
            !debug.contains("bk-secret") && !debug.contains("\"a\""),
            "{debug}"
        );
    }

    #[test]
    fn each_role_requires_its_own_secret() {
        assert_eq!(
            load(Role::Submit, BASE).unwrap_err(),
            ConfigError::Missing("SUBMIT_API_TOKEN")
        );
        assert_eq!(
            load(Role::Webhook, BASE).unwrap_err(),
            ConfigError::Missing("BUILDKITE_WEBHOOK_SECRET")
        );
        assert!(load(Role::Sweep, BASE).is_ok());
        let err = load(Role::Sweep, &BASE[..2]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "environment variable BUILDKITE_API_TOKEN is required but not set"
        );
    }

    #[test]
    fn malformed_values_name_the_variable() {
        // DISCORD_WEBHOOK_URL is parsed where Discord targets are: see `flow::deps`.
        let bad = [
            ("GPU_QUEUES", "H100"),
            ("LISTEN_ADDR", "nope"),
            ("BUILDKITE_API_URL", "ftp://x"),
            // Past a year: a deadline that far would overflow the clock.
            ("SWEEP_PASS_SECS", "18446744073709551615"),
            ("QUEUE_TIMEOUT_SECS", "31536001"),
        ];
        for (name, value) in bad {
            match load(Role::Sweep, &[BASE, &[(name, value)]].concat()) {
                Err(ConfigError::Invalid { name: n, .. }) => assert_eq!(n, name),
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn callbacks_need_a_signing_key_that_is_never_shown() {
        // The keys themselves are parsed where they sign: see `flow::deps`.
        let key = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let url = ("CALLBACK_URL", "https://kernelbot.example/cb");
        assert!(load(Role::Sweep, BASE).unwrap().callback.is_none());
        assert_eq!(
            load(Role::Sweep, &[BASE, &[url]].concat()).unwrap_err(),
            ConfigError::Missing("CALLBACK_SECRET")
        );
        // Used as written: a route mounted under a prefix answers its bare path with a 307.
        let mounted = (
            "CALLBACK_URL",
            "https://kernelbot.example/cb/?t=receiver-token",
        );
        let cfg = load(
            Role::Sweep,
            &[BASE, &[mounted, ("CALLBACK_SECRET", key)]].concat(),
        )
        .unwrap();
        assert!(!format!("{cfg:?}").contains("receiver-token"));
        assert_eq!(
            cfg.callback.as_ref().map(|c| c.url.as_str()),
            Some("https://kernelbot.example/cb/?t=receiver-token")
        );
        assert!(!format!("{cfg:?}").contains("MfKQ9r8"));
    }

    #[test]
    fn profile_links_need_a_secret_that_is_never_shown() {
        assert!(load(Role::Sweep, BASE).unwrap().profile_links.is_none());
        let vars = [
            (
                "PROFILE_LINK_SECRET",
                "link-key-123-and-more-to-be-32-bytes",
            ),
            ("PUBLIC_URL", "https://submit.example/"),
        ];
        let cfg = load(Role::Sweep, &[BASE, &vars].concat()).unwrap();
        let links = cfg.profile_links.as_ref().unwrap();
        assert_eq!(
            links.base_url.as_ref().map(Url::as_str),
            Some("https://submit.example/")
        );
        assert_eq!(links.ttl, Duration::from_secs(604_800));
        assert!(!format!("{cfg:?}").contains("link-key-123"));
        let two = format!("{} {}", "a".repeat(32), "b".repeat(40));
        let rotating = load(
            Role::Sweep,
            &[BASE, &[("PROFILE_LINK_SECRET", two.as_str())]].concat(),
        );
        let rotating = rotating.unwrap().profile_links.unwrap();
        assert_eq!(rotating.keys().count(), 2);
        // Mid-rotation the new key is appended: the old one still signs, so instances not
        // yet holding the new key open every link made.
        assert_eq!(
            rotating.signing_key(),
            "a".repeat(32).as_bytes(),
            "the first signs"
        );
        let short = [BASE, &[("PROFILE_LINK_SECRET", "short")]].concat();
        assert!(matches!(
            load(Role::Sweep, &short),
            Err(ConfigError::Invalid {
                name: "PROFILE_LINK_SECRET",
                ..
            })
        ));
        for ttl in ["0", "2592001", "99999999999999999"] {
            let bad = [BASE, &vars, &[("PROFILE_LINK_TTL_SECS", ttl)]].concat();
            let refused = matches!(
                load(Role::Sweep, &bad),
                Err(ConfigError::Invalid {
                    name: "PROFILE_LINK_TTL_SECS",
                    ..
                })
            );
            assert!(refused, "{ttl}");
        }
    }

    #[test]
    fn a_queue_may_say_how_many_gpus_its_agents_hold() {
        let map = QueueMap::parse("H100_BK=h100, MI300x8_BK = mi300x8:8").unwrap();
        let q = |gpu| map.get(gpu).map(|q| (q.name.as_str(), q.gpus));
        assert_eq!(q("H100_BK"), Some(("h100", 1)));
        assert_eq!(q("MI300x8_BK"), Some(("mi300x8", 8)));
        assert_eq!(map.queue_for("MI300x8_BK"), Some("mi300x8"));
        for (bad, says) in [
            ("A=a:0", "GPUs per agent must be from 1 to 64"),
            ("A=a:65", "GPUs per agent must be from 1 to 64"),
            ("A=a:x", "GPUs per agent must be from 1 to 64"),
            ("A=a:-2", "GPUs per agent must be from 1 to 64"),
            ("A=:8", "is not GPU=queue"),
            ("=a", "is not GPU=queue"),
            ("A=", "is not GPU=queue"),
        ] {
            let err = QueueMap::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn queue_map_is_configuration() {
        let cfg = load(
            Role::Sweep,
            &[BASE, &[("GPU_QUEUES", "A=a, B=b"), ("JOBS_TABLE", "jobs")]].concat(),
        )
        .unwrap();
        assert_eq!(cfg.queues.queue_for("B"), Some("b"));
        assert_eq!(cfg.queues.queue_for("H100_BK"), None);
        assert_eq!(cfg.queues.get("A").map(|q| q.gpus), Some(1));
        assert_eq!(
            cfg.store,
            StoreConfig::Dynamo {
                table: "jobs".into()
            }
        );
    }
}
