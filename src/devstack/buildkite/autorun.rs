//! Playing the agent: each new build is scheduled, runs its step, uploads `result.json` and
//! finishes, with a webhook at every step (dropped, repeated or late at the chaos rate).

use std::time::Duration;

use super::BuildkiteStandin;
use super::state::{AutoRun, Shared, lock};
use super::webhooks::{deliver, unix_now};

/// The agent's side of a build: webhooks for scheduled and running, the step, the upload,
/// and build.finished.
pub(super) async fn play_agent(inner: Shared, run: AutoRun, number: u64) {
    let bk = BuildkiteStandin::from_shared(inner);
    let send = |event: &'static str| {
        let (bk, run) = (bk.clone(), run.clone());
        async move {
            let body = bk.webhook_body(event, number);
            let post = move || {
                let (run, body) = (run.clone(), body.clone());
                async move {
                    if let Err(e) =
                        deliver(&run.webhook_url, &run.secret, event, body, unix_now()).await
                    {
                        tracing::warn!(error = %e.without_url(), event, "stand-in could not deliver webhook");
                    }
                }
            };
            let fault = lock(&bk.inner).roll(3);
            match fault {
                // Lost on the way.
                Some(0) => {}
                Some(1) => {
                    post().await;
                    post().await;
                }
                // Overtaken by the next event.
                Some(_) => {
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        post().await;
                    });
                }
                None => post().await,
            }
        }
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    send("build.scheduled").await;
    bk.set_state(number, "running");
    send("build.running").await;
    bk.start_eval(number);
    send("job.started").await;
    let env = bk.build(number).map(|b| b.env).unwrap_or_default();
    let step = run.step.clone();
    let outcome = tokio::task::spawn_blocking(move || step(&env))
        .await
        .unwrap_or_default();
    if bk.build(number).is_some_and(|b| b.state == "canceled") {
        // Canceled while it ran: the agent stops; the cancel sent build.finished.
        return;
    }
    for (path, bytes) in outcome.artifacts {
        bk.upload(number, &path, bytes, "finished", false);
    }
    if let Some(bytes) = outcome.result {
        bk.upload(number, "result.json", bytes, "finished", false);
    }
    bk.set_state(number, if outcome.passed { "passed" } else { "failed" });
    send("build.finished").await;
}
