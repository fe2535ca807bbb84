//! Runs a function's router: through `lambda_http` under Lambda, as plain HTTP elsewhere.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use lambda_http::tower::ServiceExt;
use tokio::sync::OnceCell;

use crate::config::{Config, Role, StoreConfig};
use crate::flow::Deps;
use crate::flow::keys::{Keys, ReadKeys};
use crate::jobs::JobStore;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Reads one configuration variable: the process environment, or a test's map.
pub type Lookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// A function's state, built in two steps. The store (the AWS SDK's client, the costliest
/// part) needs no secret, so it is opened at once. Secrets not in the environment come from
/// the Parameters and Secrets extension, which answers only inside an invocation: only then,
/// under Lambda, is the rest built, on the first invocation. Without such secrets
/// [`Startup::prebuild`] builds all of it at init, so no request pays for start-up.
pub struct Startup {
    role: Role,
    env: Lookup,
    store: Arc<dyn JobStore>,
    ready: OnceCell<Arc<Deps>>,
}

impl Startup {
    pub async fn init(role: Role) -> Result<Self, Error> {
        Self::init_with(role, Arc::new(|name: &str| std::env::var(name).ok())).await
    }

    pub async fn init_with(role: Role, env: Lookup) -> Result<Self, Error> {
        let store = open_store(env.as_ref())
            .await
            .inspect_err(|e| tracing::error!(error = %e, "start-up failed"))?;
        Ok(Self {
            role,
            env,
            store,
            ready: OnceCell::new(),
        })
    }

    /// Builds the rest now unless it needs the secrets extension. A failure is logged and
    /// left for the first invocation to try again, so the sandbox stays up to report it.
    pub async fn prebuild(&self) {
        if !crate::secrets::configured(self.env.as_ref()) {
            let _ = self.deps().await;
        }
    }

    /// The dependencies, built on the first call; one that fails is tried again on the next.
    pub async fn deps(&self) -> Result<Arc<Deps>, Error> {
        self.ready
            .get_or_try_init(|| self.build())
            .await
            .cloned()
            .inspect_err(|e| tracing::error!(error = %e, "start-up failed"))
    }

    /// The dependencies if they are built already.
    pub fn ready(&self) -> Option<Arc<Deps>> {
        self.ready.get().cloned()
    }

    async fn build(&self) -> Result<Arc<Deps>, Error> {
        let started = Instant::now();
        let env = self.env.as_ref();
        let config = Arc::new(configure(self.role, env).await?);
        let metrics = crate::telemetry::metrics::Metrics::for_function(self.role.name());
        let deps = Deps::new(config, self.store.clone())?.with_metrics(metrics);
        let deps = match key_reader(self.role, &self.env) {
            Some(reader) => deps.with_key_reader(reader),
            None => deps,
        };
        tracing::info!(
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "configuration read, clients built"
        );
        Ok(Arc::new(deps))
    }
}

/// A function's configuration: the environment first, then the secrets the extension holds
/// (when `KERNELBOT_SECRET_ID` names one) for what the environment lacks.
pub async fn configure(
    role: Role,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Config, Error> {
    let secrets = crate::secrets::load(env, &role.secret_keys()).await?;
    let lookup = crate::secrets::overlay(env, secrets);
    Ok(Config::from_lookup(role, &lookup)?)
}

/// How an instance reads its inbound keys again while it lives: the configuration as at
/// start-up, when the secrets extension holds some of it (`None`: all from the environment,
/// which does not change under a running instance).
pub fn key_reader(role: Role, env: &Lookup) -> Option<ReadKeys> {
    if !crate::secrets::configured(env.as_ref()) {
        return None;
    }
    let env = env.clone();
    Some(Arc::new(move || {
        let env = env.clone();
        Box::pin(async move {
            let config = configure(role, env.as_ref()).await?;
            Ok(Keys::of(&config))
        })
    }))
}

async fn open_store(
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Arc<dyn JobStore>, Error> {
    Ok(crate::jobs::open(&StoreConfig::from_lookup(env)?).await?)
}

/// Reads the configuration and builds the whole state now (outside Lambda, where every
/// secret is in the environment or the extension answers at any time).
pub async fn deps(role: Role) -> Result<Arc<Deps>, Error> {
    Startup::init(role).await?.deps().await
}

/// Serves `router` as plain HTTP on `listen` until Ctrl-C. Outside Lambda only: [`run`]
/// hands Lambda its own handler.
async fn serve(router: Router, listen: SocketAddr) -> Result<(), Error> {
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
pub async fn run(role: Role, router: fn(Arc<Deps>) -> Router) -> Result<(), Error> {
    crate::telemetry::init();
    if crate::telemetry::is_lambda() {
        let startup = Arc::new(Startup::init(role).await?);
        startup.prebuild().await;
        let app: Arc<OnceCell<Router>> = Arc::default();
        if let Some(deps) = startup.ready() {
            let _ = app.set(router(deps));
        }
        let handler = lambda_http::service_fn(move |req: lambda_http::Request| {
            let (app, startup) = (app.clone(), startup.clone());
            async move {
                let app = app
                    .get_or_try_init(|| async { startup.deps().await.map(router) })
                    .await?;
                Ok::<_, Error>(app.clone().oneshot(req).await?)
            }
        });
        return lambda_http::run(handler).await;
    }
    let deps = deps(role).await?;
    let listen = deps.config().listen_addr();
    serve(router(deps), listen).await
}
