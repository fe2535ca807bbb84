//! The operator's command: list and show jobs, resend a report and callback, replay given-up
//! deliveries, cancel, reconcile one run against Buildkite. It reads the same configuration
//! as the functions, from the environment (the secret's keys exported: the secrets extension
//! only runs beside a function), and works on their store: DynamoDB when `JOBS_TABLE` is
//! set, else the embedded one. Logs go to stderr, answers to stdout.

use std::time::Duration;

use clap::Parser;
use kernelbot_dispatch::config::Role;
use kernelbot_dispatch::ops::{Command, act};
use kernelbot_dispatch::retry::Deadline;
use kernelbot_dispatch::{server, telemetry};

#[derive(Parser)]
#[command(
    name = "kernelbot-dispatch",
    version,
    about = "Operate a kernelbot-dispatch deployment"
)]
struct Cli {
    /// How long a command may take (Buildkite, Discord and callback calls included).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    telemetry::init();
    let deadline = Deadline::after(cli.timeout);
    // The secrets extension runs only beside a function: outside one, its port on this
    // machine could be anyone's, and the request carries the AWS session token.
    if std::env::var_os("KERNELBOT_SECRET_ID").is_some() && !telemetry::is_lambda() {
        eprintln!("kernelbot-dispatch: export the secret's keys instead of KERNELBOT_SECRET_ID");
        return std::process::ExitCode::FAILURE;
    }
    let answer = match server::deps(Role::Sweep).await {
        Ok(d) => act(&d, cli.command, deadline).await.map_err(Into::into),
        Err(e) => Err(e),
    };
    match answer {
        Ok(text) => {
            println!("{}", text.trim_end());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "kernelbot-dispatch: {}",
                kernelbot_dispatch::error::chain(e.as_ref())
            );
            std::process::ExitCode::FAILURE
        }
    }
}
