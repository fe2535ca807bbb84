//! Local stand-ins for Buildkite, Discord and a callback receiver that speak their documented
//! wire formats, failure modes included (302 to storage, 422, 429 with `retry_after`, 404,
//! 5xx, slow answers); a DynamoDB on moto; the environment that points the functions at
//! them ([`env`]); and the whole system wired to them ([`stack`]).
//! The local run, the tests and the benchmarks use them (cargo feature `devstack`);
//! production never does.

pub mod agent;
pub mod buildkite;
pub mod discord;
mod discord_bucket;
pub mod env;
mod host;
pub mod moto;
pub(crate) mod pipeline;
pub mod receiver;
pub mod runner_program;
pub mod stack;
pub mod units;

use std::net::SocketAddr;

use axum::Router;

/// Serves `router` on a random loopback port until the process ends, to requests addressed
/// to that port only (see [`host`]).
pub async fn spawn(router: Router) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let router = host::loopback_only(router, addr.port());
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(addr)
}
