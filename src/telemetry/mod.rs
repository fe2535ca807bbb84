//! Logging. Under Lambda the runtime's subscriber is used: it honours `AWS_LAMBDA_LOG_LEVEL`
//! and switches to JSON with `AWS_LAMBDA_LOG_FORMAT=JSON` (set in `template.yaml`). Locally,
//! human-readable lines filtered by `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

/// The span each HTTP request runs in (see `http::in_span`), and the span of each outbound
/// call within it (see `retry::Policy::run`): the benchmarks time our own work as the first
/// less the second.
pub const REQUEST_SPAN: &str = "request";
pub const OUTBOUND_SPAN: &str = "outbound";

pub fn is_lambda() -> bool {
    std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some()
}

pub fn init() {
    if is_lambda() {
        lambda_http::tracing::init_default_subscriber();
        return;
    }
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    // Colour only for a person at a terminal: not in a file, a pipe or a CI log.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    // `try_init`: a second call (tests) keeps the first subscriber.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

pub mod metrics;
