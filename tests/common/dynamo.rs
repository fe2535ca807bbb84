//! A real DynamoDB-compatible server for the tests (moto), and tables built from the
//! definition in `template.yaml`.

use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification,
};
use serde_yaml_ng::Value;

static ENDPOINT: OnceLock<String> = OnceLock::new();

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The endpoint of a moto server: `KERNELBOT_TEST_DYNAMODB_URL` if set, else one started
/// here from `MOTO_SERVER` (or `moto_server` on PATH) that dies with this process.
pub fn endpoint() -> &'static str {
    ENDPOINT.get_or_init(|| {
        if let Ok(url) = std::env::var("KERNELBOT_TEST_DYNAMODB_URL") {
            return url;
        }
        let bin = std::env::var("MOTO_SERVER").unwrap_or_else(|_| "moto_server".into());
        let port = free_port();
        let (tx, rx) = std::sync::mpsc::channel();
        // The child is tied to this thread's life (PR_SET_PDEATHSIG fires when the spawning
        // thread exits), so the thread lives as long as the test process.
        std::thread::spawn(move || {
            let mut cmd = Command::new(&bin);
            cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            unsafe {
                use std::os::unix::process::CommandExt;
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            let started = cmd.spawn();
            let ok = started.is_ok();
            let _ = tx.send(started.map(|_| ()).map_err(|e| format!("{bin}: {e}")));
            if ok {
                loop {
                    std::thread::park();
                }
            }
        });
        if let Err(e) = rx.recv().expect("moto launcher") {
            panic!("cannot start moto server ({e}); run ./scripts/test.sh, which installs it");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "moto server did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        format!("http://127.0.0.1:{port}")
    })
}

pub fn client() -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .endpoint_url(endpoint())
        .build();
    Client::from_conf(config)
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("template: {key} missing"))
}

fn keys(v: &Value) -> Vec<KeySchemaElement> {
    v.as_sequence()
        .expect("KeySchema list")
        .iter()
        .map(|k| {
            KeySchemaElement::builder()
                .attribute_name(s(k, "AttributeName"))
                .key_type(KeyType::from(s(k, "KeyType")))
                .build()
                .expect("key")
        })
        .collect()
}

/// Creates a table named `name` exactly as `template.yaml` defines `JobsTable`.
pub async fn create_table(client: &Client, name: &str) {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/template.yaml"))
        .expect("template.yaml");
    let template: Value = serde_yaml_ng::from_str(&text).expect("template.yaml parses");
    let table = &template["Resources"]["JobsTable"];
    assert_eq!(table["Type"].as_str(), Some("AWS::DynamoDB::Table"));
    let p = &table["Properties"];
    let mut req = client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::from(s(p, "BillingMode")))
        .set_key_schema(Some(keys(&p["KeySchema"])));
    for a in p["AttributeDefinitions"]
        .as_sequence()
        .expect("AttributeDefinitions")
    {
        req = req.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(s(a, "AttributeName"))
                .attribute_type(ScalarAttributeType::from(s(a, "AttributeType")))
                .build()
                .expect("attribute"),
        );
    }
    for g in p["GlobalSecondaryIndexes"]
        .as_sequence()
        .into_iter()
        .flatten()
    {
        req = req.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(s(g, "IndexName"))
                .set_key_schema(Some(keys(&g["KeySchema"])))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::from(s(
                            &g["Projection"],
                            "ProjectionType",
                        )))
                        .set_non_key_attributes(
                            g["Projection"]["NonKeyAttributes"].as_sequence().map(|a| {
                                a.iter()
                                    .filter_map(|v| v.as_str().map(str::to_owned))
                                    .collect()
                            }),
                        )
                        .build(),
                )
                .build()
                .expect("index"),
        );
    }
    req.send().await.expect("create table");
    let ttl = &p["TimeToLiveSpecification"];
    client
        .update_time_to_live()
        .table_name(name)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .attribute_name(s(ttl, "AttributeName"))
                .enabled(ttl["Enabled"].as_bool().unwrap_or(false))
                .build()
                .expect("ttl"),
        )
        .send()
        .await
        .expect("enable TTL");
}
