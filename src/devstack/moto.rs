//! A real DynamoDB-compatible server for the tests and benchmarks (moto), and tables built
//! from the definition in `template.yaml`, the only place the table is defined.

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

use crate::error::BoxError;

static ENDPOINT: OnceLock<Result<String, String>> = OnceLock::new();

/// The endpoint of a moto server: `KERNELBOT_TEST_DYNAMODB_URL` if set, else one started
/// here from `MOTO_SERVER` (or `moto_server` on PATH) that dies with this process.
pub fn endpoint() -> Result<&'static str, BoxError> {
    let started = ENDPOINT.get_or_init(|| match std::env::var("KERNELBOT_TEST_DYNAMODB_URL") {
        Ok(url) => Ok(url),
        Err(_) => start().map_err(|e| e.to_string()),
    });
    match started {
        Ok(url) => Ok(url),
        Err(e) => Err(e.clone().into()),
    }
}

/// Starts a moto server on a free port and waits until it listens.
fn start() -> Result<String, BoxError> {
    let bin = std::env::var("MOTO_SERVER").unwrap_or_else(|_| "moto_server".into());
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let (tx, rx) = std::sync::mpsc::channel();
    // The child is tied to this thread's life (PR_SET_PDEATHSIG fires when the spawning
    // thread exits), so the thread lives as long as the process.
    std::thread::spawn(move || {
        let mut cmd = Command::new(&bin);
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only asks the kernel, between fork and exec, to kill the child with us.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let started = cmd.spawn();
        let ok = started.is_ok();
        let _ = tx.send(started.map(drop).map_err(|e| format!("{bin}: {e}")));
        if ok {
            loop {
                std::thread::park();
            }
        }
    });
    rx.recv()?.map_err(|e| {
        format!("cannot start moto server ({e}); run ./scripts/test.sh, which installs it")
    })?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err(format!("moto server did not listen on {port}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(format!("http://127.0.0.1:{port}"))
}

/// A DynamoDB client of the moto server.
pub fn client() -> Result<Client, BoxError> {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .endpoint_url(endpoint()?)
        .build();
    Ok(Client::from_conf(config))
}

fn s<'a>(v: &'a Value, key: &str) -> Result<&'a str, BoxError> {
    v[key]
        .as_str()
        .ok_or_else(|| format!("template.yaml: {key} missing").into())
}

fn keys(v: &Value) -> Result<Vec<KeySchemaElement>, BoxError> {
    let list = v
        .as_sequence()
        .ok_or("template.yaml: KeySchema is not a list")?;
    list.iter()
        .map(|k| {
            Ok(KeySchemaElement::builder()
                .attribute_name(s(k, "AttributeName")?)
                .key_type(KeyType::from(s(k, "KeyType")?))
                .build()?)
        })
        .collect()
}

fn index(g: &Value) -> Result<GlobalSecondaryIndex, BoxError> {
    let projection = &g["Projection"];
    let non_key = projection["NonKeyAttributes"].as_sequence().map(|a| {
        a.iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    });
    Ok(GlobalSecondaryIndex::builder()
        .index_name(s(g, "IndexName")?)
        .set_key_schema(Some(keys(&g["KeySchema"])?))
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::from(s(projection, "ProjectionType")?))
                .set_non_key_attributes(non_key)
                .build(),
        )
        .build()?)
}

/// The `JobsTable` resource's properties in `template.yaml`.
fn table_properties() -> Result<Value, BoxError> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/template.yaml"))?;
    let template: Value = serde_yaml_ng::from_str(&text)?;
    let table = &template["Resources"]["JobsTable"];
    if table["Type"].as_str() != Some("AWS::DynamoDB::Table") {
        return Err("template.yaml: JobsTable is not a DynamoDB table".into());
    }
    Ok(table["Properties"].clone())
}

/// Creates a table named `name` exactly as `template.yaml` defines `JobsTable`.
pub async fn create_table(client: &Client, name: &str) -> Result<(), BoxError> {
    let p = table_properties()?;
    let mut req = client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::from(s(&p, "BillingMode")?))
        .set_key_schema(Some(keys(&p["KeySchema"])?));
    for a in p["AttributeDefinitions"]
        .as_sequence()
        .into_iter()
        .flatten()
    {
        req = req.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(s(a, "AttributeName")?)
                .attribute_type(ScalarAttributeType::from(s(a, "AttributeType")?))
                .build()?,
        );
    }
    for g in p["GlobalSecondaryIndexes"]
        .as_sequence()
        .into_iter()
        .flatten()
    {
        req = req.global_secondary_indexes(index(g)?);
    }
    req.send().await?;
    let ttl = &p["TimeToLiveSpecification"];
    let spec = TimeToLiveSpecification::builder()
        .attribute_name(s(ttl, "AttributeName")?)
        .enabled(ttl["Enabled"].as_bool().unwrap_or(false))
        .build()?;
    client
        .update_time_to_live()
        .table_name(name)
        .time_to_live_specification(spec)
        .send()
        .await?;
    Ok(())
}
