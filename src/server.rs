//! Runs a function's router: through `lambda_http` under Lambda, as plain HTTP elsewhere.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use lambda_http::tower::ServiceExt;
use tokio::sync::OnceCell;

use crate::config::{Config, Role};
use crate::flow::Dispatcher;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Reads the configuration and opens the store once. Secrets not in the environment come
/// from the Parameters and Secrets extension, which answers only inside an invocation: under
/// Lambda this runs on the first one (see [`run`]).
pub async fn dispatcher(role: Role) -> Result<Arc<Dispatcher>, Error> {
    let env = |name: &str| std::env::var(name).ok();
    let secrets = crate::secrets::extension::load(&env, role.secret_keys()).await?;
    let lookup = crate::secrets::extension::overlay(env, secrets);
    let config = Arc::new(Config::from_lookup(role, &lookup)?);
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

/// The body of a function's `main`: start logging, build state, serve. Under Lambda the
/// state is built on the first invocation and kept; one that fails is tried again on the next.
pub async fn run(role: Role, router: fn(Arc<Dispatcher>) -> Router) -> Result<(), Error> {
    crate::telemetry::init();
    if crate::telemetry::is_lambda() {
        let app: Arc<OnceCell<Router>> = Arc::default();
        let handler = lambda_http::service_fn(move |req: lambda_http::Request| {
            let app = app.clone();
            async move {
                let app = app
                    .get_or_try_init(|| async { dispatcher(role).await.map(router) })
                    .await
                    .inspect_err(|e| tracing::error!(error = %e, "start-up failed"))?;
                Ok::<_, Error>(app.clone().oneshot(req).await?)
            }
        });
        return lambda_http::run(handler).await;
    }
    let dispatcher = dispatcher(role)
        .await
        .inspect_err(|e| tracing::error!(error = %e, "start-up failed"))?;
    let listen = dispatcher.config.listen_addr;
    serve(router(dispatcher), listen).await
}
