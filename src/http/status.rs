//! `GET /status`: the public status page, no token. A small server-rendered page (no
//! script; it reads on a phone) or, with `Accept: application/json`, the same figures as
//! JSON. Counts only (see `flow::status`), cached a few seconds by each instance and by
//! whoever sits between.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use super::ApiError;
use super::extract::WantsJson;
use crate::flow::Deps;
use crate::flow::present::summary::format_secs;
use crate::flow::status::{PAGE_FRESH, QueueHealth, StatusPage, cached_page};
use crate::time::rfc3339;

pub(crate) async fn status(
    State(d): State<Arc<Deps>>,
    WantsJson(json): WantsJson,
) -> Result<Response, ApiError> {
    let page = cached_page(&d)
        .await
        .map_err(crate::flow::DispatchError::from)?;
    let mut response = if json {
        Json(&*page).into_response()
    } else {
        Html(render(&page).into_string()).into_response()
    };
    let headers = response.headers_mut();
    let age = format!("public, max-age={}", PAGE_FRESH.as_secs());
    if let Ok(value) = HeaderValue::from_str(&age) {
        headers.insert(header::CACHE_CONTROL, value);
    }
    headers.insert(header::VARY, HeaderValue::from_static("Accept"));
    Ok(response)
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0 auto;max-width:40rem;\
padding:1rem;color:#1f2328}h1{font-size:1.4rem}section{border:1px solid #d0d7de;\
border-radius:8px;padding:.5rem 1rem;margin:1rem 0}h2{font-size:1.1rem;margin:.4rem 0}\
dl{display:grid;grid-template-columns:1fr auto;gap:.2rem 1rem;margin:.4rem 0}\
dd{margin:0;text-align:right;font-variant-numeric:tabular-nums}footer{color:#57606a;\
font-size:.85rem}";

/// The page: one section per queue.
pub(crate) fn render(page: &StatusPage) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "GPU queues · kernelbot-dispatch" }
                style { (STYLE) }
            }
            body {
                h1 { "GPU queues" }
                @for q in &page.queues {
                    (queue(q))
                }
                footer {
                    p { "As of " time datetime=(rfc3339(page.generated_at)) { (rfc3339(page.generated_at)) } "." }
                    @if page.agents_age_ms.is_none() {
                        p { "No agents list has been read yet." }
                    }
                }
            }
        }
    }
}

fn queue(q: &QueueHealth) -> Markup {
    let secs = |s: Option<f64>| s.map_or_else(|| "–".to_owned(), format_secs);
    html! {
        section id={ "queue-" (q.queue) } {
            h2 { (q.queue) " " small { "(" (q.gpus.join(", ")) ")" } }
            dl {
                dt { "Agents busy" } dd data-field="agents_busy" { (q.agents_busy) }
                dt { "Agents idle" } dd data-field="agents_idle" { (q.agents_idle) }
                dt { "Agents paused" } dd data-field="agents_paused" { (q.agents_paused) }
                dt { "Jobs waiting" } dd data-field="jobs_waiting" { (q.jobs_waiting) }
                dt { "Background jobs waiting" } dd data-field="jobs_background" { (q.jobs_background) }
                dt { "Jobs running" } dd data-field="jobs_running" { (q.jobs_running) }
                dt { "Median wait, last hour" } dd data-field="median_wait" { (secs(q.median_wait_secs_last_hour)) }
                dt { "Median run, last hour" } dd data-field="median_run" { (secs(q.median_run_secs_last_hour)) }
                dt { "Jobs, last 24 h" } dd data-field="jobs_last_24h" { (q.jobs_last_24h) }
                dt { "Infrastructure failures, last 24 h" } dd data-field="infra_failures_last_24h" { (q.infra_failures_last_24h) }
            }
        }
    }
}
