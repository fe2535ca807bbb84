//! The sweep function: sends pending reports, creates deferred builds, finishes jobs whose
//! webhooks never came. Under Lambda it runs on an EventBridge schedule (and an invocation
//! with `{"run_id": "…"}` re-drives that run); elsewhere it makes one pass (or, with
//! `--run-id <id>`, re-drives one run), prints a one-line summary and exits,
//! non-zero on a pipeline- or store-level error.

use std::sync::Arc;

use kernelbot_dispatch::config::Role;
use kernelbot_dispatch::flow::sweep;
use kernelbot_dispatch::jobs::RunId;
use kernelbot_dispatch::retry::Deadline;
use kernelbot_dispatch::{server, telemetry};
use lambda_http::{LambdaEvent, service_fn};

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
        let startup = Arc::new(server::Startup::init(Role::Sweep).await?);
        startup.prebuild().await;
        let handler = service_fn(move |event: LambdaEvent<serde_json::Value>| {
            let startup = startup.clone();
            async move {
                let deps = startup.deps().await?;
                // Kept back: the time to log the summary and answer the runtime.
                let deadline = Deadline::at_unix_millis(event.context.deadline)
                    .less(std::time::Duration::from_secs(2));
                // `aws lambda invoke --payload '{"run_id": "…"}'` re-drives one run.
                let report = match sweep::requested_run(&event.payload)? {
                    Some(id) => sweep::sweep_run(&deps, &id, deadline).await?,
                    None => sweep::sweep(&deps, deadline).await?,
                };
                tracing::info!(%report, "sweep done");
                Ok::<_, server::Error>(report)
            }
        });
        return lambda_http::lambda_runtime::run(handler).await;
    }
    let deps = server::deps(Role::Sweep).await?;
    let deadline = Deadline::after(deps.config().timing.sweep_pass);
    let report = match &run_id {
        Some(id) => sweep::sweep_run(&deps, id, deadline).await,
        None => sweep::sweep(&deps, deadline).await,
    }
    .inspect_err(|e| tracing::error!(error = %e, "sweep failed"))?;
    println!("{report}");
    Ok(())
}
