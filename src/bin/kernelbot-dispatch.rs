//! The operator's command: list and show jobs, resend a report and callback, replay given-up
//! deliveries, cancel, reconcile one run against Buildkite. It reads the same configuration
//! as the functions: from their stack with `--stack NAME` (the sweep function's environment and
//! its secret), or from the environment (the secret's keys exported: the secrets extension only
//! runs beside a function). It works on the store it is told: the stack's, DynamoDB's
//! `JOBS_TABLE`, or an embedded one under `KERNELBOT_DATA_DIR` or `--local`; never one it
//! guessed. Logs go to stderr, answers to stdout; any failure exits non-zero.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use kernelbot_dispatch::config::Role;
use kernelbot_dispatch::ops::{Command, OpsError, act};
use kernelbot_dispatch::retry::Deadline;
#[cfg(feature = "stack")]
use kernelbot_dispatch::secrets;
use kernelbot_dispatch::server::{Lookup, Startup};
use kernelbot_dispatch::telemetry;

/// The variable that names the stack as `--stack` does.
#[cfg(feature = "stack")]
const STACK_VAR: &str = "KERNELBOT_STACK";

/// Where a local run (`cargo run --bin local`) keeps its store.
const LOCAL_DATA_DIR: &str = "./.kernelbot";

const AFTER_HELP: &str = "\
Examples:
  kernelbot-dispatch --stack kernelbot-dispatch jobs --state running --older-than 30m
  export KERNELBOT_STACK=kernelbot-dispatch         # or name it once for the shell
  kernelbot-dispatch jobs --json | jq '.[] | select(.discord == \"given_up\")'
  kernelbot-dispatch cancel 8f14e45f --dry-run      # then again with --yes
  kernelbot-dispatch replay --given-up --since 24h --yes
  kernelbot-dispatch --local jobs                   # the local run's store

Environment:
  KERNELBOT_STACK       the deployment's stack, as --stack: its configuration and secret are
                        read from it, and the variables below are not
  JOBS_TABLE            the deployment's DynamoDB table (its stack's JobsTableName output)
  KERNELBOT_DATA_DIR    an embedded store's directory (local runs and tests)
  BUILDKITE_ORG, BUILDKITE_PIPELINE, BUILDKITE_API_TOKEN, DISCORD_WEBHOOK_URL,
  CALLBACK_URL, CALLBACK_SECRET, ...   as the functions have them (docs/configuration.md)
  AWS_REGION, AWS_PROFILE  the AWS account the table is in
  RUST_LOG              log level on stderr (default info); NO_COLOR turns colour off";

#[derive(Parser)]
#[command(
    name = "kernelbot-dispatch",
    version,
    about = "Operate a kernelbot-dispatch deployment",
    after_help = AFTER_HELP
)]
struct Cli {
    /// How long a command may take (Buildkite, Discord and callback calls included).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Work on the local run's embedded store (./.kernelbot) when no store is named.
    #[arg(long)]
    local: bool,
    /// Work on the deployment of this CloudFormation stack, configured as its functions are
    /// (needs AWS credentials that may read the stack, its sweep function and its secret).
    #[cfg(feature = "stack")]
    #[arg(long, value_name = "NAME", env = STACK_VAR)]
    stack: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init();
    let deadline = Deadline::after(cli.timeout);
    let env = match configured(&cli).await {
        Ok(env) => env,
        Err((why, code)) => {
            eprintln!("kernelbot-dispatch: {why}");
            return ExitCode::from(code);
        }
    };
    let answer = match Startup::init_with(Role::Sweep, env).await {
        Ok(startup) => match startup.deps().await {
            Ok(d) => act(&d, cli.command, deadline).await.map_err(Into::into),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    match answer {
        Ok(text) => {
            println!("{}", text.trim_end());
            ExitCode::SUCCESS
        }
        // What was done goes to stdout as any answer does; the status says not all of it.
        Err(e)
            if e.downcast_ref::<OpsError>()
                .is_some_and(|e| matches!(e, OpsError::Incomplete(_))) =>
        {
            println!("{}", e.to_string().trim_end());
            eprintln!("kernelbot-dispatch: not everything asked was done");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!(
                "kernelbot-dispatch: {}",
                kernelbot_dispatch::error::chain(e.as_ref())
            );
            ExitCode::FAILURE
        }
    }
}

/// The configuration the command works with, or why not and the exit status that says so.
async fn configured(cli: &Cli) -> Result<Lookup, (String, u8)> {
    #[cfg(feature = "stack")]
    if let Some(stack) = &cli.stack {
        return from_stack(stack.trim(), cli.local, cli.timeout).await;
    }
    environment(cli.local).map_err(|why| (why, 2))
}

/// The stack's configuration alone: the shell's store or Buildkite variables may be another
/// deployment's.
#[cfg(feature = "stack")]
async fn from_stack(stack: &str, local: bool, timeout: Duration) -> Result<Lookup, (String, u8)> {
    if stack.is_empty() {
        return Err((format!("--stack (or {STACK_VAR}) is empty"), 2));
    }
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    if local || set("JOBS_TABLE") || set("KERNELBOT_DATA_DIR") {
        return Err((
            format!(
                "--stack names the store (here, or {STACK_VAR}): drop --local and unset \
                 JOBS_TABLE and KERNELBOT_DATA_DIR"
            ),
            2,
        ));
    }
    let read = kernelbot_dispatch::stack::configuration(stack);
    let config = match tokio::time::timeout(timeout, read).await {
        Ok(Ok(config)) => config,
        Ok(Err(e)) => return Err((kernelbot_dispatch::error::chain(&e), 1)),
        Err(_) => return Err((format!("stack {stack} could not be read in {timeout:?}"), 1)),
    };
    let environment = config.environment;
    if !environment.contains_key("JOBS_TABLE") {
        return Err((format!("stack {stack}'s functions name no JOBS_TABLE"), 1));
    }
    let lookup = secrets::overlay(
        move |name: &str| environment.get(name).cloned(),
        config.secrets,
    );
    Ok(Arc::new(lookup))
}

/// The process environment as the command reads it, once it names a store.
fn environment(local: bool) -> Result<Lookup, String> {
    // The secrets extension runs only beside a function: outside one, its port on this
    // machine could be anyone's, and the request carries the AWS session token.
    if std::env::var_os("KERNELBOT_SECRET_ID").is_some() && !telemetry::is_lambda() {
        return Err("export the secret's keys instead of KERNELBOT_SECRET_ID".into());
    }
    let set = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let (table, dir) = (
        set("JOBS_TABLE").is_some(),
        set("KERNELBOT_DATA_DIR").is_some(),
    );
    if table && dir {
        return Err(
            "both JOBS_TABLE and KERNELBOT_DATA_DIR are set: unset the one you do not \
                    mean"
                .into(),
        );
    }
    let named = table || dir;
    if named && local {
        return Err(
            "--local with a store named (JOBS_TABLE or KERNELBOT_DATA_DIR): unset it \
                    for the local store, or drop --local"
                .into(),
        );
    }
    if !named && !local {
        return Err(
            "no store named: set JOBS_TABLE to the deployment's table (its stack's \
             JobsTableName output), or KERNELBOT_DATA_DIR, or pass --local for the local \
             run's store"
                .into(),
        );
    }
    if !named && !std::path::Path::new(LOCAL_DATA_DIR).is_dir() {
        return Err(format!(
            "--local: no local store at {LOCAL_DATA_DIR} (run the local stack here first)"
        ));
    }
    Ok(Arc::new(move |name: &str| match name {
        "KERNELBOT_DATA_DIR" if !named => Some(LOCAL_DATA_DIR.to_owned()),
        _ => std::env::var(name).ok(),
    }))
}
