//! The submit function: `POST /submissions`, `GET /submissions/{run_id}`.

use kernelbot_dispatch::{config::Role, http, server};

#[tokio::main]
async fn main() -> Result<(), server::Error> {
    server::run(Role::Submit, http::submit::router).await
}
