//! The sweep function: sends pending reports, creates deferred builds, finishes jobs whose
//! webhooks never came. Under Lambda it runs on an EventBridge schedule; elsewhere it makes one
//! pass (or, with `--run-id <id>`, re-drives one run), prints a one-line summary and exits,
//! non-zero on a pipeline- or store-level error.

use std::sync::Arc;

use kernelbot_dispatch::config::Role;
use kernelbot_dispatch::flow::Dispatcher;
use kernelbot_dispatch::jobs::RunId;
use kernelbot_dispatch::retry::{Deadline, LOCAL_BUDGET};
use kernelbot_dispatch::{server, telemetry};
use lambda_http::{LambdaEvent, service_fn};
use tokio::sync::OnceCell;

fn run_id_arg() -> Result<Option<RunId>, server::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => Ok(None),
        [flag, id] if flag == "--run-id" => Ok(Some(
            id.parse().map_err(|e| format!("--run-id {id:?}: {e}"))?,
        )),
        _ => Err("usage: sweep [--run-id <run id>]".into()),
    }
}

#[tokio::main]
async fn main() -> Result<(), server::Error> {
    telemetry::init();
    let run_id = run_id_arg()?;
    if telemetry::is_lambda() {
        // Built on the first invocation: the secrets extension answers only inside one.
        let state: Arc<OnceCell<Arc<Dispatcher>>> = Arc::default();
        let handler = service_fn(move |event: LambdaEvent<serde_json::Value>| {
            let state = state.clone();
            async move {
                let dispatcher = state
                    .get_or_try_init(|| server::dispatcher(Role::Sweep))
                    .await
                    .inspect_err(|e| tracing::error!(error = %e, "start-up failed"))?;
                // Kept back: the time to log the summary and answer the runtime.
                let deadline = Deadline::at_unix_millis(event.context.deadline)
                    .less(std::time::Duration::from_secs(2));
                let report = dispatcher.sweep(deadline).await?;
                tracing::info!(%report, "sweep done");
                Ok::<_, server::Error>(report)
            }
        });
        return lambda_http::lambda_runtime::run(handler).await;
    }
    let dispatcher = server::dispatcher(Role::Sweep)
        .await
        .inspect_err(|e| tracing::error!(error = %e, "start-up failed"))?;
    let deadline = Deadline::after(LOCAL_BUDGET);
    let report = match &run_id {
        Some(id) => dispatcher.sweep_run(id, deadline).await,
        None => dispatcher.sweep(deadline).await,
    }
    .inspect_err(|e| tracing::error!(error = %e, "sweep failed"))?;
    println!("{report}");
    Ok(())
}
