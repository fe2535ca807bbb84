//! The webhook function: `POST /webhooks/buildkite`.

use kernelbot_dispatch::{config::Role, http, server};

#[tokio::main]
async fn main() -> Result<(), server::Error> {
    server::run(Role::Webhook, http::webhook::router).await
}
