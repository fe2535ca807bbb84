//! The cold-start baseline: builds the clients a function builds (an axum router, a reqwest
//! client, a DynamoDB client from the environment) and nothing else, then answers
//! `GET /healthz` on `LISTEN_ADDR`. `benches/cold_start.rs` starts it beside the webhook
//! function, built with the same profile.

use axum::Router;
use axum::routing::get;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let http = reqwest::Client::builder().build()?;
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    let dynamo = aws_sdk_dynamodb::Client::new(&sdk);
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .with_state((http, dynamo));
    let addr = std::env::var("LISTEN_ADDR").unwrap_or_else(|_| "127.0.0.1:0".into());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await?;
    Ok(())
}
