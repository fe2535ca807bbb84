//! The cold-start baseline: builds the clients a function builds (an axum router, a reqwest
//! client, a DynamoDB client from the environment) and nothing else, then answers on
//! `LISTEN_ADDR`: `GET /healthz`, and `GET /read`, one DynamoDB `GetItem` from `JOBS_TABLE`
//! (the least a webhook does: what any process pays on its first call, the first webhook is
//! measured against). `benches/cold_start.rs` starts it beside the webhook function, built
//! with the same profile.

use aws_sdk_dynamodb::types::AttributeValue;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

#[derive(Clone)]
struct Clients {
    _http: reqwest::Client,
    dynamo: aws_sdk_dynamodb::Client,
    table: String,
}

async fn read(State(c): State<Clients>) -> StatusCode {
    let got = c
        .dynamo
        .get_item()
        .table_name(&c.table)
        .key("run_id", AttributeValue::S("coldstart-probe".into()))
        .send()
        .await;
    match got {
        Ok(_) => StatusCode::OK,
        Err(_) => StatusCode::BAD_GATEWAY,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let http = reqwest::Client::builder().build()?;
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    let clients = Clients {
        _http: http,
        dynamo: aws_sdk_dynamodb::Client::new(&sdk),
        table: std::env::var("JOBS_TABLE").unwrap_or_default(),
    };
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/read", get(read))
        .with_state(clients);
    let addr = std::env::var("LISTEN_ADDR").unwrap_or_else(|_| "127.0.0.1:0".into());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await?;
    Ok(())
}
