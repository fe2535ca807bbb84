//! Secrets read at cold start through a stand-in of the AWS Parameters and Secrets Lambda
//! extension's HTTP endpoint (`GET /secretsmanager/get?secretId=…` on localhost, the session
//! token in `X-Aws-Parameters-Secrets-Token`, Secrets Manager's `GetSecretValue` answer).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kernelbot_dispatch::config::{Config, Role};
use kernelbot_dispatch::devstack::buildkite::deliver;
use kernelbot_dispatch::devstack::stack::{
    API_TOKEN, BK_TOKEN, HOOK_URL, LINK_SECRET, SECRET, submission,
};
use kernelbot_dispatch::jobs::JobState;
use kernelbot_dispatch::secrets::{SecretsError, keys, load, overlay};
use secrecy::ExposeSecret;
use serde_json::json;

use crate::profiles::{click, finished_with_zip};
use crate::support::{StoreKind, TestApp};

const SESSION_TOKEN: &str = "session-token-of-this-sandbox";

#[derive(Default)]
struct Extension {
    /// The secret's `SecretString`, by secret id.
    secrets: BTreeMap<String, String>,
    /// Answers to give before the real one (the extension still starting, say): status and
    /// body.
    failures: Vec<(u16, &'static str)>,
    calls: usize,
}

type Shared = Arc<Mutex<Extension>>;

async fn secrets_manager_get(
    State(ext): State<Shared>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    let mut ext = ext.lock().unwrap();
    ext.calls += 1;
    if headers
        .get("X-Aws-Parameters-Secrets-Token")
        .and_then(|v| v.to_str().ok())
        != Some(SESSION_TOKEN)
    {
        return (StatusCode::UNAUTHORIZED, "not authorized").into_response();
    }
    if !ext.failures.is_empty() {
        let (status, body) = ext.failures.remove(0);
        return (StatusCode::from_u16(status).unwrap(), body).into_response();
    }
    let id = url::form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "secretId")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    match ext.secrets.get(&id) {
        Some(s) => axum::Json(json!({
            "ARN": format!("arn:aws:secretsmanager:eu-west-1:123456789012:secret:{id}-AbCdEf"),
            "Name": id, "SecretString": s, "VersionId": "v1",
            "VersionStages": ["AWSCURRENT"], "CreatedDate": "2026-11-01T00:00:00Z",
        }))
        .into_response(),
        None => (
            StatusCode::BAD_REQUEST,
            "ResourceNotFoundException: Secrets Manager can't find the specified secret.",
        )
            .into_response(),
    }
}

async fn start(ext: Extension) -> (u16, Shared) {
    let shared: Shared = Arc::new(Mutex::new(ext));
    let app = axum::Router::new()
        .route("/secretsmanager/get", get(secrets_manager_get))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, shared)
}

fn env(pairs: Vec<(&'static str, String)>) -> impl Fn(&str) -> Option<String> + Sync + Clone {
    let map: BTreeMap<&'static str, String> = pairs.into_iter().collect();
    move |k: &str| map.get(k).cloned()
}

async fn load_all(
    vars: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<BTreeMap<String, secrecy::SecretString>, SecretsError> {
    load(vars, &keys()).await
}

fn stored() -> String {
    json!({
        "BUILDKITE_API_TOKEN": "bk-from-extension",
        "SUBMIT_API_TOKEN": "submit-from-extension,second-token",
        "BUILDKITE_WEBHOOK_SECRET": "webhook-from-extension",
        "SOMETHING_ELSE": "ignored",
    })
    .to_string()
}

#[tokio::test]
async fn secrets_come_from_the_extension_and_the_environment_wins() {
    let (port, ext) = start(Extension {
        secrets: BTreeMap::from([("kernelbot-dispatch".into(), stored())]),
        ..Default::default()
    })
    .await;
    let vars = env(vec![
        ("KERNELBOT_SECRET_ID", "kernelbot-dispatch".into()),
        ("AWS_SESSION_TOKEN", SESSION_TOKEN.into()),
        ("PARAMETERS_SECRETS_EXTENSION_HTTP_PORT", port.to_string()),
        ("BUILDKITE_ORG", "org".into()),
        ("BUILDKITE_PIPELINE", "kernelbot".into()),
        // Set in the environment: kept over the extension's value.
        ("BUILDKITE_API_TOKEN", "bk-from-env".into()),
    ]);
    let secrets = load(&vars, &Role::Submit.secret_keys())
        .await
        .expect("read through the extension");
    assert_eq!(ext.lock().unwrap().calls, 1);
    assert!(!secrets.contains_key("SOMETHING_ELSE"));
    // The submit function keeps no webhook secret, nor the webhook function the submission
    // API's token.
    assert!(!secrets.contains_key("BUILDKITE_WEBHOOK_SECRET"));
    let for_webhook = load(&vars, &Role::Webhook.secret_keys()).await.unwrap();
    assert!(!for_webhook.contains_key("SUBMIT_API_TOKEN"));
    assert!(for_webhook.contains_key("BUILDKITE_WEBHOOK_SECRET"));
    let lookup = overlay(vars.clone(), secrets);
    let config = Config::from_lookup(Role::Submit, &lookup).unwrap();
    let tokens: Vec<&str> = config
        .submit_tokens
        .iter()
        .map(|t| t.expose_secret())
        .collect();
    assert_eq!(tokens, ["submit-from-extension", "second-token"]);
    assert_eq!(config.buildkite.token.expose_secret(), "bk-from-env");
    let webhook = Config::from_lookup(Role::Webhook, &overlay(vars, for_webhook)).unwrap();
    assert_eq!(webhook.webhook.secrets.len(), 1);
}

#[tokio::test]
async fn without_a_secret_id_nothing_is_asked() {
    let (port, ext) = start(Extension::default()).await;
    let vars = env(vec![
        ("AWS_SESSION_TOKEN", SESSION_TOKEN.into()),
        ("PARAMETERS_SECRETS_EXTENSION_HTTP_PORT", port.to_string()),
    ]);
    assert!(load(&vars, &keys()).await.unwrap().is_empty());
    assert_eq!(ext.lock().unwrap().calls, 0);
}

#[tokio::test]
async fn a_starting_extension_is_waited_for() {
    let (port, ext) = start(Extension {
        secrets: BTreeMap::from([("s".into(), stored())]),
        // Starting, failing, rate limited, and Secrets Manager's throttling passed on as a 400.
        failures: vec![
            (503, ""),
            (500, ""),
            (429, ""),
            (400, "ThrottlingException: Rate exceeded"),
        ],
        ..Default::default()
    })
    .await;
    let vars = env(vec![
        ("KERNELBOT_SECRET_ID", "s".into()),
        ("AWS_SESSION_TOKEN", SESSION_TOKEN.into()),
        ("PARAMETERS_SECRETS_EXTENSION_HTTP_PORT", port.to_string()),
    ]);
    let secrets = load(&vars, &keys()).await.unwrap();
    assert_eq!(
        secrets["BUILDKITE_WEBHOOK_SECRET"].expose_secret(),
        "webhook-from-extension"
    );
    assert_eq!(ext.lock().unwrap().calls, 5);
}

#[tokio::test]
async fn failures_are_clear_and_never_show_a_secret() {
    let (port, ext) = start(Extension {
        secrets: BTreeMap::from([
            ("plain".into(), "hunter2-not-json".into()),
            (
                "typed".into(),
                json!({"SUBMIT_API_TOKEN": ["hunter3"]}).to_string(),
            ),
        ]),
        ..Default::default()
    })
    .await;
    let with = |id: &str, token: Option<&str>| {
        let mut pairs = vec![
            ("KERNELBOT_SECRET_ID", id.to_owned()),
            ("PARAMETERS_SECRETS_EXTENSION_HTTP_PORT", port.to_string()),
        ];
        if let Some(t) = token {
            pairs.push(("AWS_SESSION_TOKEN", t.to_owned()));
        }
        env(pairs)
    };
    let err = load_all(&with("plain", None)).await.unwrap_err();
    assert!(matches!(err, SecretsError::MissingSessionToken), "{err}");
    let err = load_all(&with("plain", Some("wrong-session")))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SecretsError::Refused { status: 401, .. }),
        "{err}"
    );
    assert!(!err.to_string().contains("wrong-session"));
    let err = load_all(&with("missing", Some(SESSION_TOKEN)))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the secrets extension answered HTTP 400 for secret missing"
    );
    for id in ["plain", "typed"] {
        let err = load_all(&with(id, Some(SESSION_TOKEN))).await.unwrap_err();
        let text = format!("{err} {err:?}");
        assert!(matches!(err, SecretsError::Malformed { .. }), "{text}");
        assert!(!text.contains("hunter"), "{text}");
    }
    // Refusals are not retried; only the starting-up kind is.
    assert_eq!(ext.lock().unwrap().calls, 4);
    let down = env(vec![
        ("KERNELBOT_SECRET_ID", "s".into()),
        ("AWS_SESSION_TOKEN", SESSION_TOKEN.into()),
        ("PARAMETERS_SECRETS_EXTENSION_HTTP_PORT", "1".into()),
    ]);
    let err = load(&down, &keys()).await.unwrap_err();
    assert!(matches!(err, SecretsError::Unreachable(_)), "{err}");
    let bad_port = env(vec![
        ("KERNELBOT_SECRET_ID", "s".into()),
        ("AWS_SESSION_TOKEN", SESSION_TOKEN.into()),
        ("PARAMETERS_SECRETS_EXTENSION_HTTP_PORT", "http".into()),
    ]);
    assert!(matches!(
        load(&bad_port, &keys()).await.unwrap_err(),
        SecretsError::BadPort(_)
    ));
}

/// The deployed functions hold no secret in their configuration: they get the secret's name,
/// the extension's layer and the right to read that one secret; the public ones can be capped.
#[test]
fn the_template_reads_secrets_through_the_extension() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/template.yaml"))
        .expect("template.yaml");
    assert!(
        !text.contains("{{resolve:"),
        "no secret resolved into the configuration"
    );
    let t: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("parses");
    let globals = &t["Globals"]["Function"];
    let vars = &globals["Environment"]["Variables"];
    assert!(vars.get("KERNELBOT_SECRET_ID").is_some());
    assert!(
        globals["Layers"]
            .as_sequence()
            .is_some_and(|l| l.len() == 1)
    );
    for key in keys() {
        assert!(vars.get(key).is_none(), "{key} in plain text");
    }
    for function in ["SubmitFunction", "WebhookFunction", "SweepFunction"] {
        let props = &t["Resources"][function]["Properties"];
        if let Some(own) = props["Environment"]["Variables"].as_mapping() {
            for key in keys() {
                assert!(own.get(key).is_none(), "{function}: {key} in plain text");
            }
        }
        let policies = serde_yaml_ng::to_string(&props["Policies"]).unwrap();
        assert!(
            policies.contains("secretsmanager:GetSecretValue")
                && policies.contains("${SecretName}-*"),
            "{function} cannot read its secret: {policies}"
        );
    }
    for (function, parameter) in [
        ("SubmitFunction", "SubmitReservedConcurrency"),
        ("WebhookFunction", "WebhookReservedConcurrency"),
        ("SweepFunction", "SweepReservedConcurrency"),
    ] {
        let reserved = serde_yaml_ng::to_string(
            &t["Resources"][function]["Properties"]["ReservedConcurrentExecutions"],
        )
        .unwrap();
        assert!(
            reserved.contains(parameter) && reserved.contains("AWS::NoValue"),
            "{reserved}"
        );
        assert_eq!(t["Parameters"][parameter]["Default"].as_u64(), Some(0));
    }
}

/// Under Lambda the extension answers only inside an invocation: start-up opens the store
/// and waits for the first one to read secrets and build the rest; without a secret id it
/// builds everything at once, so no request pays for it.
#[tokio::test]
async fn start_up_defers_only_what_needs_the_extension() {
    use kernelbot_dispatch::server::Startup;
    let (port, ext) = start(Extension {
        secrets: BTreeMap::from([("kernelbot-dispatch".into(), stored())]),
        ..Default::default()
    })
    .await;
    let data = tempfile::tempdir().unwrap();
    let base = vec![
        ("BUILDKITE_ORG", "org".to_owned()),
        ("BUILDKITE_PIPELINE", "kernelbot".into()),
        ("KERNELBOT_DATA_DIR", data.path().display().to_string()),
    ];
    let with_extension = [
        base.clone(),
        vec![
            ("KERNELBOT_SECRET_ID", "kernelbot-dispatch".into()),
            ("AWS_SESSION_TOKEN", SESSION_TOKEN.into()),
            ("PARAMETERS_SECRETS_EXTENSION_HTTP_PORT", port.to_string()),
        ],
    ]
    .concat();
    let startup = Startup::init_with(Role::Webhook, Arc::new(env(with_extension)))
        .await
        .expect("store opened at init");
    startup.prebuild().await;
    assert!(startup.ready().is_none(), "nothing needing secrets at init");
    assert_eq!(
        ext.lock().unwrap().calls,
        0,
        "the extension is not asked at init"
    );
    // The first invocation finds the extension refusing: tried again on the next one.
    ext.lock().unwrap().failures = vec![(403, "AccessDeniedException")];
    assert!(startup.deps().await.is_err());
    assert!(startup.ready().is_none());
    let first = startup.deps().await.expect("built on the next use");
    let again = startup.deps().await.unwrap();
    assert!(Arc::ptr_eq(&first, &again));
    assert_eq!(
        ext.lock().unwrap().calls,
        2,
        "read until it answered, then kept"
    );
    assert_eq!(first.config().webhook.secrets.len(), 1);

    let in_env = [
        base,
        vec![
            ("BUILDKITE_API_TOKEN", "bk".into()),
            ("BUILDKITE_WEBHOOK_SECRET", "whsec".into()),
        ],
    ]
    .concat();
    let startup = Startup::init_with(Role::Webhook, Arc::new(env(in_env)))
        .await
        .expect("store opened at init");
    startup.prebuild().await;
    assert!(startup.ready().is_some(), "all of it built at init");
}

/// A deployment as the docs set it up: every secret in the deployment's secret, none in the
/// environment. Submit, webhook and sweep read theirs through the extension, and a profile run
/// goes end to end: the submission is accepted, the signed webhook finishes it, the report and
/// the callback go out, the profile's link is made, opens with 302, and a tampered one is 403.
async fn every_secret_from_the_secret_and_none_from_the_environment(kind: StoreKind) {
    let values = BTreeMap::from([
        ("BUILDKITE_API_TOKEN", BK_TOKEN.to_owned()),
        ("BUILDKITE_WEBHOOK_SECRET", SECRET.to_owned()),
        ("SUBMIT_API_TOKEN", API_TOKEN.to_owned()),
        ("DISCORD_WEBHOOK_URL", HOOK_URL.to_owned()),
        (
            "CALLBACK_SECRET",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned(),
        ),
        ("PROFILE_LINK_SECRET", LINK_SECRET.to_owned()),
        ("OPS_DISCORD_WEBHOOK_URL", OPS_URL.to_owned()),
    ]);
    // The secret holds every key the docs list, and nothing else.
    assert_eq!(
        values.keys().map(|k| (*k).to_owned()).collect::<Vec<_>>(),
        crate::docs::documented_secret_keys()
    );
    let secret = serde_json::to_string(&values).unwrap();
    let ext = Extension {
        secrets: BTreeMap::from([("kernelbot-dispatch".to_owned(), secret)]),
        ..Extension::default()
    };
    let (port, ext) = start(ext).await;
    let port = port.to_string();
    let app = TestApp::spawn_with(
        kind,
        &[
            ("KERNELBOT_SECRET_ID", "kernelbot-dispatch"),
            ("AWS_SESSION_TOKEN", SESSION_TOKEN),
            ("PARAMETERS_SECRETS_EXTENSION_HTTP_PORT", &port),
        ],
    )
    .await;
    assert_eq!(
        ext.lock().unwrap().calls,
        3,
        "each function read the secret"
    );

    let zip = b"PK\x03\x04 the profiler's files".to_vec();
    let link = finished_with_zip(&app, "secret-only", "profile", &zip).await;
    assert!(
        link.starts_with(&format!(
            "{}/submissions/secret-only/profiles/0?",
            app.submit_url
        )),
        "{link}"
    );
    let (status, location, _) = click(&link).await;
    assert_eq!(status, StatusCode::FOUND);
    assert!(location.is_some_and(|l| l.contains("/storage/")));
    let mut tampered = link.into_bytes();
    let last = tampered.len() - 1;
    tampered[last] = if tampered[last] == b'0' { b'1' } else { b'0' };
    let (status, _, _) = click(&String::from_utf8(tampered).unwrap()).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // The report went to the deployment's Discord webhook, and the callback was signed.
    let messages = serde_json::to_string(&app.discord.messages()).unwrap();
    assert!(
        messages.contains("/submissions/secret-only/profiles/0?"),
        "{messages}"
    );
    let received = app.receiver.received();
    assert!(received.iter().any(|r| r.id == "msg_finished_secret-only"));
    // The operators' channel, from the secret too: an agent of our queue lost, and still
    // away when the sweep looks minutes later, reaches it.
    app.buildkite.autorun(
        &app.webhook_url,
        SECRET,
        std::sync::Arc::new(|_| Default::default()),
    );
    app.buildkite.add_agent("h100-gpu0", "h100", &[]);
    assert!(app.buildkite.agent_event("agent.lost", "h100-gpu0").await);
    app.clock.advance(std::time::Duration::from_secs(6 * 60));
    assert_eq!(app.sweep().await.incidents_told, 1);
    let ops: Vec<_> = app
        .discord
        .calls()
        .into_iter()
        .filter(|c| OPS_URL.contains(&c.webhook_id))
        .collect();
    assert_eq!(ops.len(), 1, "{ops:?}");
}

/// The operators' channel of the secret above.
const OPS_URL: &str = "https://discord.com/api/webhooks/222222222222222222/ops-token_2";

/// A rotation as the runbook does it, with no restart: the secret's webhook key and submit
/// token change under running instances and Buildkite and the client switch at once. The
/// first request with each new key succeeds (the instance reads the secret again, once), the
/// old keys are refused from then on, and each refused webhook is counted for its alarm.
async fn keys_rotate_under_running_instances(kind: StoreKind) {
    const NEW_SECRET: &str = "webhook-secret-after-rotation";
    const NEW_TOKEN: &str = "submit-token-after-rotation";
    // Every key the docs list, as the deployment's secret holds them.
    let secret = |webhook: &str, token: &str| {
        json!({
            "BUILDKITE_API_TOKEN": BK_TOKEN, "BUILDKITE_WEBHOOK_SECRET": webhook,
            "SUBMIT_API_TOKEN": token, "DISCORD_WEBHOOK_URL": HOOK_URL,
            "CALLBACK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "PROFILE_LINK_SECRET": LINK_SECRET, "OPS_DISCORD_WEBHOOK_URL": OPS_URL,
        })
        .to_string()
    };
    let id = "kernelbot-dispatch".to_owned();
    let ext = Extension {
        secrets: BTreeMap::from([(id.clone(), secret(SECRET, API_TOKEN))]),
        ..Extension::default()
    };
    let (port, ext) = start(ext).await;
    let port = port.to_string();
    let vars = [
        ("KERNELBOT_SECRET_ID", "kernelbot-dispatch"),
        ("AWS_SESSION_TOKEN", SESSION_TOKEN),
        ("PARAMETERS_SECRETS_EXTENSION_HTTP_PORT", port.as_str()),
    ];
    let app = TestApp::spawn_with(kind, &vars).await;
    let body = |run: &str| serde_json::to_vec(&submission(run)).unwrap();
    let (status, _) = app.submit_raw(body("before"), Some(API_TOKEN)).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    app.buildkite.start_eval(1);
    assert_eq!(app.event("job.started", 1).await, StatusCode::OK);
    assert_eq!(app.job("before").await.state, JobState::Running);

    ext.lock()
        .unwrap()
        .secrets
        .insert(id, secret(NEW_SECRET, NEW_TOKEN));
    let read_before = ext.lock().unwrap().calls;
    app.clock.advance(std::time::Duration::from_secs(31));
    let (status, _) = app.submit_raw(body("after"), Some(NEW_TOKEN)).await;
    assert_eq!(
        status,
        StatusCode::ACCEPTED,
        "the first request with the new token"
    );
    let signed_anew = |event: &str, number: u64| {
        let body = app.buildkite.webhook_body(event, number);
        let at = app.buildkite.now_secs();
        let url = app.webhook_url.clone();
        let event = event.to_owned();
        async move {
            deliver(&url, NEW_SECRET, &event, body, at)
                .await
                .unwrap()
                .status()
        }
    };
    app.buildkite.start_eval(2);
    assert_eq!(signed_anew("job.started", 2).await, StatusCode::OK);
    assert_eq!(
        ext.lock().unwrap().calls,
        read_before + 2,
        "submit and webhook read once each"
    );
    assert_eq!(app.job("after").await.state, JobState::Running);

    let (status, _) = app.submit_raw(body("old-token"), Some(API_TOKEN)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        app.event("build.finished", 1).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        ext.lock().unwrap().calls,
        read_before + 2,
        "no read within 30 s"
    );
    let refused = app.metric("WebhookRequests");
    let unknown = refused
        .iter()
        .filter(|(m, _)| m["Outcome"] == "unknown_key");
    assert_eq!(unknown.map(|(_, v)| v).sum::<f64>(), 1.0);
    // An unsigned request (a scanner) is refused too, but not counted as a key unknown.
    let body = app.buildkite.webhook_body("build.finished", 1);
    let unsigned = app
        .client
        .post(&app.webhook_url)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(unsigned.status(), StatusCode::UNAUTHORIZED);
    let counted = app.metric("WebhookRequests");
    let outcomes: Vec<&str> = counted
        .iter()
        .filter_map(|(m, _)| m["Outcome"].as_str())
        .collect();
    assert_eq!(
        outcomes.iter().filter(|o| **o == "unknown_key").count(),
        1,
        "{outcomes:?}"
    );
    assert!(outcomes.contains(&"refused"), "{outcomes:?}");
}

on_both_stores!(
    every_secret_from_the_secret_and_none_from_the_environment,
    keys_rotate_under_running_instances
);
