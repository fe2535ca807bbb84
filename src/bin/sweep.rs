//! The sweep function: finishes jobs whose webhooks never came. Under Lambda it runs on an
//! EventBridge schedule; elsewhere it makes one pass, prints a one-line summary and exits.

use kernelbot_dispatch::config::Role;
use kernelbot_dispatch::{server, telemetry};
use lambda_http::{LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), server::Error> {
    telemetry::init();
    let dispatcher = server::dispatcher(Role::Sweep)
        .await
        .inspect_err(|e| tracing::error!(error = %e, "start-up failed"))?;
    let min_age = dispatcher.config.sweep_min_age;
    if telemetry::is_lambda() {
        let handler = service_fn(move |_: LambdaEvent<serde_json::Value>| {
            let dispatcher = dispatcher.clone();
            async move {
                let report = dispatcher.sweep(min_age).await?;
                tracing::info!(%report, "sweep done");
                Ok::<_, server::Error>(report)
            }
        });
        return lambda_http::lambda_runtime::run(handler).await;
    }
    let report = dispatcher.sweep(min_age).await?;
    println!("{report}");
    Ok(())
}
