//! Runs a function's router: through `lambda_http` under Lambda, as plain HTTP elsewhere.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;

use crate::config::{Config, Role};
use crate::flow::Dispatcher;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Reads the configuration and opens the store once, at start-up (the Lambda cold path).
pub async fn dispatcher(role: Role) -> Result<Arc<Dispatcher>, Error> {
    let config = Arc::new(Config::from_env(role)?);
    let store = crate::jobs::store::open(&config.store).await?;
    let mut dispatcher = Dispatcher::new(config, store)?;
    dispatcher.metrics = crate::telemetry::metrics::Metrics::for_function(role.name());
    Ok(Arc::new(dispatcher))
}

pub async fn serve(router: Router, listen: SocketAddr) -> Result<(), Error> {
    if crate::telemetry::is_lambda() {
        return lambda_http::run(router).await;
    }
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(addr = %listener.local_addr()?, "listening");
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// The body of a function's `main`: start logging, build state, serve.
pub async fn run(role: Role, router: fn(Arc<Dispatcher>) -> Router) -> Result<(), Error> {
    crate::telemetry::init();
    let dispatcher = dispatcher(role)
        .await
        .inspect_err(|e| tracing::error!(error = %e, "start-up failed"))?;
    let listen = dispatcher.config.listen_addr;
    serve(router(dispatcher), listen).await
}
