//! A submission as the API receives it, validated into typed values at the edge: nothing
//! past here sees an unchecked string.

use serde_json::{Map, Value};

use crate::config::{QueueMap, QueueSpec};
use crate::discord::{DiscordTarget, InvalidWebhookUrl};
use crate::jobs::{InvalidRunId, Queue, RunId, Target, UserId, WebhookAddress};
use crate::payload::{self, PayloadError};
use crate::protocol::{EvalConfig, InvalidConfig};

pub(crate) const MAX_TITLE_CHARS: usize = 200;
const FIELDS: &[&str] = &[
    "run_id",
    "gpu",
    "config",
    "discord",
    "title",
    "max_queue_secs",
    "user",
    "cache",
    "priority",
];
/// The longest a submission's `user` may be (kernelbot's user ids are far shorter).
pub(crate) const MAX_USER_CHARS: usize = 64;
/// The longest a submission may ask to wait for an agent.
pub(crate) const MAX_QUEUE_SECS: u64 = 3600;

/// A valid submission, ready to become a job and a build.
#[derive(Debug, Clone)]
pub struct Submission {
    pub run_id: RunId,
    /// `false` when the caller gave no run id and we generated one.
    pub run_id_given: bool,
    pub gpu: String,
    pub queue: Queue,
    pub title: Option<String>,
    /// How long the evaluation may wait for an agent (at most [`MAX_QUEUE_SECS`]).
    pub max_queue_secs: Option<u64>,
    /// Where the job's status is shown: the webhook the body names, else the deployment's
    /// default when it has one.
    pub discord: Option<Target>,
    /// The config, encoded for `KERNELBOT_PAYLOAD`.
    pub payload: String,
    /// `config.mode == "private"`: Discord shows the verdict only.
    pub private: bool,
    /// Who submitted it (opaque): fair share counts builds in flight per user.
    pub user: Option<UserId>,
    /// What makes it the same as an earlier run that may answer it (`test` and `benchmark`
    /// runs that did not send `"cache": false`; see `rules::reuse`).
    pub identity: Option<String>,
    /// `"priority": "background"`: it runs only on an idle GPU when nothing else waits.
    pub background: bool,
}

/// Why a submission was refused. Each variant names its HTTP status in `http::error`.
#[derive(Debug, thiserror::Error)]
pub enum Invalid {
    /// 400: not JSON.
    #[error("body is not a JSON object: {0}")]
    Json(#[source] serde_json::Error),
    /// 400: JSON, but not an object.
    #[error("body is not a JSON object: expected an object")]
    NotAnObject,
    /// 400: a field is missing or has the wrong shape.
    #[error("{field}: {reason}")]
    Field { field: &'static str, reason: String },
    /// 400: a field we do not know (likely a typo).
    #[error("unknown field {0:?}")]
    UnknownField(String),
    /// 413: the encoded config would not fit in the build's environment.
    #[error("config is {len} bytes compressed and encoded; the limit is {max} bytes")]
    PayloadTooLarge { len: usize, max: usize },
    /// 422: no queue serves this GPU.
    #[error("unknown gpu {gpu:?}; known: {known}")]
    UnknownGpu { gpu: String, known: String },
    /// 422: not a Discord webhook URL.
    #[error("discord.{0}")]
    WebhookUrl(#[from] InvalidWebhookUrl),
    /// 422: a config the runner would refuse, found before it takes a GPU.
    #[error("config: {0}")]
    Config(#[from] InvalidConfig),
}

impl Invalid {
    /// The field a 422 names, as a path from the body's top (`config.lang`).
    pub(crate) fn field_path(&self) -> Option<String> {
        match self {
            Self::Config(e) if e.field.is_empty() => Some("config".into()),
            Self::Config(e) => Some(format!("config.{}", e.field)),
            _ => None,
        }
    }
}

fn field(field: &'static str, reason: impl Into<String>) -> Invalid {
    Invalid::Field {
        field,
        reason: reason.into(),
    }
}

type Object = Map<String, Value>;

fn optional_str<'a>(obj: &'a Object, key: &'static str) -> Result<Option<&'a str>, Invalid> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(field(key, "must be a string")),
    }
}

/// The body as a JSON object of known fields.
fn object(body: &[u8]) -> Result<Object, Invalid> {
    let value: Value = serde_json::from_slice(body).map_err(Invalid::Json)?;
    let Value::Object(obj) = value else {
        return Err(Invalid::NotAnObject);
    };
    if let Some(unknown) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(Invalid::UnknownField(unknown.clone()));
    }
    Ok(obj)
}

/// The caller's run id, or a fresh one; whether it was given.
fn run_id(obj: &Object) -> Result<(RunId, bool), Invalid> {
    Ok(match optional_str(obj, "run_id")? {
        Some(raw) => (
            raw.parse()
                .map_err(|e: InvalidRunId| field("run_id", e.to_string()))?,
            true,
        ),
        None => (RunId::generate(), false),
    })
}

/// The GPU and the queue that serves it.
fn gpu<'a>(obj: &'a Object, queues: &'a QueueMap) -> Result<(&'a str, &'a QueueSpec), Invalid> {
    let gpu = optional_str(obj, "gpu")?.ok_or_else(|| field("gpu", "is required"))?;
    let queue = queues.get(gpu).ok_or_else(|| Invalid::UnknownGpu {
        gpu: gpu.chars().take(64).collect(),
        known: queues.known(),
    })?;
    Ok((gpu, queue))
}

/// A multi-GPU task runs only where each agent holds several GPUs, and only such a task
/// runs there: on one GPU it cannot run, and a single-GPU one would leave the rest idle.
fn fits_queue(gpu: &str, queue: &QueueSpec, multi_gpu: bool) -> Result<(), InvalidConfig> {
    let message = match (multi_gpu, queue.gpus) {
        (true, 1) => format!(
            "a multi-GPU task cannot run on {gpu}: its queue `{}` has one GPU per agent; \
             submit it to a GPU whose queue has several",
            queue.name
        ),
        (false, n) if n > 1 => format!(
            "{gpu} is for multi-GPU tasks (its queue `{}` has {n} GPUs per agent); this \
             config does not set multi_gpu",
            queue.name
        ),
        _ => return Ok(()),
    };
    Err(InvalidConfig {
        field: "multi_gpu".into(),
        message,
    })
}

/// The config object and its encoding for `KERNELBOT_PAYLOAD`.
fn config(obj: &Object) -> Result<(&Value, String), Invalid> {
    let config = match obj.get("config") {
        Some(c @ Value::Object(_)) => c,
        Some(_) => return Err(field("config", "must be an object")),
        None => return Err(field("config", "is required")),
    };
    let payload = payload::encode(config).map_err(|e| match e {
        PayloadError::TooLarge { len, max } => Invalid::PayloadTooLarge { len, max },
        other => field("config", other.to_string()),
    })?;
    Ok((config, payload))
}

fn title(obj: &Object) -> Result<Option<String>, Invalid> {
    let title = optional_str(obj, "title")?
        .map(str::trim)
        .filter(|t| !t.is_empty());
    if title.is_some_and(|t| t.chars().count() > MAX_TITLE_CHARS || t.chars().any(char::is_control))
    {
        return Err(field(
            "title",
            format!("must be at most {MAX_TITLE_CHARS} characters on one line"),
        ));
    }
    Ok(title.map(str::to_owned))
}

/// The submitter, opaque: 1 to 64 printable characters (kernelbot passes its user id).
fn user(obj: &Object) -> Result<Option<UserId>, Invalid> {
    let Some(user) = optional_str(obj, "user")? else {
        return Ok(None);
    };
    user_id(user).map(Some)
}

/// A user id as the API takes one, in a body or a path.
pub(crate) fn user_id(user: &str) -> Result<UserId, Invalid> {
    if user.is_empty()
        || user.chars().count() > MAX_USER_CHARS
        || user.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(field(
            "user",
            format!("must be 1 to {MAX_USER_CHARS} characters without spaces"),
        ));
    }
    Ok(UserId::new(user))
}

/// `priority`: `"normal"` (the default) or `"background"`.
fn background(obj: &Object) -> Result<bool, Invalid> {
    match optional_str(obj, "priority")? {
        None | Some("normal") => Ok(false),
        Some("background") => Ok(true),
        Some(_) => Err(field("priority", "must be \"normal\" or \"background\"")),
    }
}

/// `cache`: `false` asks for a run of its own even when an earlier one could answer.
fn cache(obj: &Object) -> Result<bool, Invalid> {
    match obj.get("cache") {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(field("cache", "must be true or false")),
    }
}

fn max_queue_secs(obj: &Object) -> Result<Option<u64>, Invalid> {
    match obj.get("max_queue_secs") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|s| (1..=MAX_QUEUE_SECS).contains(s))
            .map(Some)
            .ok_or_else(|| {
                field(
                    "max_queue_secs",
                    format!("must be a whole number of seconds from 1 to {MAX_QUEUE_SECS}"),
                )
            }),
    }
}

/// The Discord target the body names, else the deployment's default (if it has one).
fn discord(obj: &Object, has_default: bool) -> Result<Option<Target>, Invalid> {
    match obj.get("discord") {
        None | Some(Value::Null) => Ok(has_default.then_some(Target::Default)),
        Some(Value::Object(d)) => {
            if let Some(unknown) = d
                .keys()
                .find(|k| !matches!(k.as_str(), "webhook_url" | "thread_id"))
            {
                return Err(Invalid::UnknownField(format!("discord.{unknown}")));
            }
            let url = optional_str(d, "webhook_url")?
                .ok_or_else(|| field("discord", "webhook_url is required"))?;
            let target = DiscordTarget::parse(url, optional_str(d, "thread_id")?)?;
            Ok(Some(Target::Webhook(address(&target))))
        }
        Some(_) => Err(field("discord", "must be an object")),
    }
}

/// How a job keeps a webhook a submission named.
fn address(target: &DiscordTarget) -> WebhookAddress {
    WebhookAddress {
        webhook_id: target.webhook_id.clone(),
        token: target.token.clone(),
        thread_id: target.thread_id.clone(),
    }
}

/// Validates a request body. A body that names no Discord target reports to the
/// deployment's default when `has_default_discord`.
pub fn parse(
    body: &[u8],
    queues: &QueueMap,
    has_default_discord: bool,
) -> Result<Submission, Invalid> {
    let obj = object(body)?;
    let (run_id, run_id_given) = run_id(&obj)?;
    let (gpu, queue) = gpu(&obj, queues)?;
    let (config, payload) = config(&obj)?;
    let title = title(&obj)?;
    let max_queue_secs = max_queue_secs(&obj)?;
    let user = user(&obj)?;
    let cache = cache(&obj)?;
    let background = background(&obj)?;
    let discord = discord(&obj, has_default_discord)?;
    // Last, once the body's shape is right: the runner's own rules, so a config it would
    // refuse never takes a GPU slot.
    let eval = EvalConfig::from_json(config)?;
    fits_queue(gpu, queue, eval.multi_gpu)?;
    let private = eval.mode == "private";
    let identity = super::rules::reuse::identity(gpu, config, cache);
    Ok(Submission {
        run_id,
        run_id_given,
        gpu: gpu.to_owned(),
        queue: Queue::new(queue.name.clone()),
        title,
        max_queue_secs,
        discord,
        payload,
        private,
        user,
        identity,
        background,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn queues() -> QueueMap {
        QueueMap::parse(crate::config::DEFAULT_GPU_QUEUES).unwrap()
    }

    fn try_parse(v: Value) -> Result<Submission, Invalid> {
        parse(v.to_string().as_bytes(), &queues(), false)
    }

    const HOOK: &str = "https://discord.com/api/webhooks/1/tok";

    fn valid() -> Value {
        json!({"lang": "py", "mode": "test", "main": "eval.py", "sources": {"eval.py": "print(1)"}})
    }

    #[test]
    fn a_config_the_runner_would_refuse_is_named_by_its_field() {
        for (config, path, says) in [
            (json!({"mode": "test"}), "config.lang", "lang is required"),
            (
                json!({"lang": "py", "mode": "fast"}),
                "config.mode",
                "mode must be one of",
            ),
            (
                json!({"lang": "py", "mode": "test", "main": "a.py", "sources": {"a.py": "", "../x.py": ""}}),
                "config.sources.../x.py",
                "relative path",
            ),
            (
                json!({"lang": "cu", "mode": "test", "sources": {"k.cu": ""}, "tests": [1]}),
                "config.tests",
                "each entry of tests",
            ),
        ] {
            let err = try_parse(json!({"gpu": "H100_BK", "config": config})).unwrap_err();
            assert!(matches!(err, Invalid::Config(_)), "{err}");
            assert_eq!(err.field_path().as_deref(), Some(path));
            assert!(err.to_string().contains(says), "{err}");
        }
    }

    /// Each task where its GPUs are: a table over the task's kind and the queue's agents.
    #[test]
    fn multi_gpu_tasks_go_only_to_multi_gpu_queues() {
        let queues = QueueMap::parse("H100_BK=h100,MI300x8_BK=mi300x8:8").unwrap();
        let multi = |on: bool| {
            let mut config = valid();
            config["multi_gpu"] = json!(on);
            config
        };
        for (gpu, config, refused) in [
            ("H100_BK", valid(), None),
            ("H100_BK", multi(false), None),
            ("MI300x8_BK", multi(true), None),
            ("H100_BK", multi(true), Some("cannot run on H100_BK")),
            (
                "MI300x8_BK",
                valid(),
                Some("MI300x8_BK is for multi-GPU tasks"),
            ),
            ("MI300x8_BK", multi(false), Some("has 8 GPUs per agent")),
        ] {
            let body = json!({"gpu": gpu, "config": config}).to_string();
            match (parse(body.as_bytes(), &queues, false), refused) {
                (Ok(s), None) => assert_eq!(s.queue, queues.queue_for(gpu).unwrap()),
                (Err(e), Some(says)) => {
                    assert_eq!(e.field_path().as_deref(), Some("config.multi_gpu"));
                    assert!(e.to_string().contains(says), "{e}");
                }
                (got, _) => panic!("{gpu} {config}: {:?}", got.map(|s| s.queue)),
            }
        }
    }

    #[test]
    fn a_full_submission_becomes_typed_values() {
        let s = try_parse(json!({"run_id": "r-1", "gpu": "H100_BK", "config": valid(),
            "discord": {"webhook_url": HOOK, "thread_id": "5"}, "title": " My kernel "}))
        .unwrap();
        assert_eq!(
            (s.run_id.as_str(), s.queue.as_str(), s.title.as_deref()),
            ("r-1", "h100", Some("My kernel"))
        );
        let Some(Target::Webhook(hook)) = s.discord else {
            panic!("the named webhook: {:?}", s.discord);
        };
        assert_eq!(hook.thread_id.as_deref(), Some("5"));
        assert_eq!(payload::decode(&s.payload).unwrap(), valid());
        assert!(s.run_id_given);
    }

    #[test]
    fn a_missing_run_id_is_generated() {
        let s = try_parse(json!({"gpu": "L40S_BK", "config": valid()})).unwrap();
        assert!(!s.run_id_given);
        assert!(s.run_id.as_str().starts_with("run-"));
        assert!(s.discord.is_none());
    }

    #[test]
    fn the_default_discord_target_applies_when_none_is_named() {
        let body = json!({"gpu": "H100_BK", "config": valid()}).to_string();
        let s = parse(body.as_bytes(), &queues(), true).unwrap();
        assert_eq!(s.discord, Some(Target::Default));
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases = [
            (json!([1]), "body is not a JSON object: expected an object"),
            (json!({"config": valid()}), "gpu: is required"),
            (
                json!({"gpu": 5, "config": valid()}),
                "gpu: must be a string",
            ),
            (json!({"gpu": "H100_BK"}), "config: is required"),
            (
                json!({"gpu": "H100_BK", "config": "x"}),
                "config: must be an object",
            ),
            (
                json!({"gpu": "H100_BK", "config": valid(), "run_id": "a b"}),
                "run_id: run_id must be 1-64 characters of A-Z, a-z, 0-9, '_', '.', '-'",
            ),
            (
                json!({"gpu": "H100_BK", "config": valid(), "title": "x".repeat(201)}),
                "title: must be at most 200 characters on one line",
            ),
            (
                json!({"gpu": "H100_BK", "config": valid(), "gpuu": 1}),
                "unknown field \"gpuu\"",
            ),
            (
                json!({"gpu": "H100_BK", "config": valid(), "user": "u".repeat(65)}),
                "user: must be 1 to 64 characters without spaces",
            ),
            (
                json!({"gpu": "H100_BK", "config": valid(), "user": "a b"}),
                "user: must be 1 to 64 characters without spaces",
            ),
            (
                json!({"gpu": "H100_BK", "config": valid(), "user": 42}),
                "user: must be a string",
            ),
            (
                json!({"gpu": "H100_BK", "config": valid(), "discord": {}}),
                "discord: webhook_url is required",
            ),
            (
                json!({"gpu": "H100_BK", "config": valid(), "max_queue_secs": 3601}),
                "max_queue_secs: must be a whole number of seconds from 1 to 3600",
            ),
            (
                json!({"gpu": "H100_BK", "config": valid(), "max_queue_secs": "60"}),
                "max_queue_secs: must be a whole number of seconds from 1 to 3600",
            ),
        ];
        for (body, message) in cases {
            assert_eq!(
                try_parse(body.clone()).unwrap_err().to_string(),
                message,
                "{body}"
            );
        }
        assert!(matches!(
            parse(b"{", &queues(), false),
            Err(Invalid::Json(_))
        ));
    }

    #[test]
    fn unknown_gpus_and_foreign_urls_are_unprocessable() {
        let err = try_parse(json!({"gpu": "TPU", "config": valid()})).unwrap_err();
        assert!(
            matches!(&err, Invalid::UnknownGpu { gpu, known } if gpu == "TPU" && known.contains("H100_BK"))
        );
        let err = try_parse(
            json!({"gpu": "H100_BK", "config": valid(), "discord": {"webhook_url": "https://evil.example/api/webhooks/1/t"}}),
        );
        assert!(matches!(
            err,
            Err(Invalid::WebhookUrl(InvalidWebhookUrl::WrongHost))
        ));
    }

    #[test]
    fn an_oversize_config_is_refused_before_anything_happens() {
        let mut rng = fastrand::Rng::with_seed(7);
        let noise: String = (0..300_000).map(|_| rng.alphanumeric()).collect();
        let err = try_parse(json!({"gpu": "H100_BK", "config": {"sources": {"k.py": noise}}}))
            .unwrap_err();
        assert!(matches!(err, Invalid::PayloadTooLarge { len, max } if len > max));
    }
}
