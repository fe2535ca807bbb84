//! The operator's commands as `kernelbot-dispatch` takes them, and what each does and says.

use std::time::Duration;

use clap::Subcommand;

use super::{JobsQuery, delivery_word, jobs, jobs_table, not_reopened, show};
use crate::flow::cancel::{Canceled, cancel};
use crate::flow::queues::QueueError;
use crate::flow::resend::{Resent, replay_given_up, resend};
use crate::flow::{Deps, DispatchError, fleet, sweep};
use crate::jobs::{Channel, JobState, RunId, StoreError};
use crate::retry::Deadline;
use crate::time::Millis;

/// What went wrong; each keeps its source.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("no job {0}")]
    NoSuchJob(RunId),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Dispatch(#[from] DispatchError),
    #[error("the job cannot be shown: {0}")]
    Json(#[from] serde_json::Error),
    #[error("the fleet cannot be listed: {0}")]
    Fleet(#[from] QueueError),
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Open jobs, and ended ones still owing or given up, oldest first, as a table.
    Jobs {
        /// Only jobs in this state (submitted, scheduled, running, finished, failed).
        #[arg(long)]
        state: Option<JobState>,
        /// Only jobs of this Buildkite queue.
        #[arg(long)]
        queue: Option<String>,
        /// Only jobs submitted at least this long ago (`15m`, `2h`).
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Option<Duration>,
    },
    /// One job, as JSON (no result, no secret).
    Show { run_id: RunId },
    /// Sends an ended job's report (the same Discord message, edited) and callback again.
    Resend { run_id: RunId },
    /// Sends again every report and callback given up for jobs submitted since a time.
    Replay {
        /// Replay given-up deliveries (the only kind there is).
        #[arg(long, required = true)]
        given_up: bool,
        /// An RFC 3339 time (`2026-11-24T00:00:00Z`) or a span before now (`24h`).
        #[arg(long, value_parser = since)]
        since: Millis,
    },
    /// Cancels a run: its build is canceled, or the job ended if it has none yet.
    Cancel { run_id: RunId },
    /// Reads one run's build whatever its age, finishes or fixes the job, sends what it owes.
    Reconcile { run_id: RunId },
    /// Each GPU agent of our queues: connection, pause and why, jobs and infrastructure
    /// failures in the last 24 h, last pre-flight readings.
    Fleet,
}

/// `--since`: a time, or a span before now.
pub fn since(text: &str) -> Result<Millis, String> {
    if let Ok(span) = humantime::parse_duration(text) {
        return Ok(crate::time::now_millis() - span.as_millis() as Millis);
    }
    let at = humantime::parse_rfc3339_weak(text)
        .map_err(|_| format!("{text:?} is neither a time (RFC 3339) nor a span (24h)"))?;
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| format!("{text:?} is before 1970"))?;
    Ok(ms.as_millis() as Millis)
}

fn resent(run_id: &RunId, resent: &Resent) -> String {
    match resent {
        Resent::Unknown => format!("{run_id}: no such job"),
        Resent::NotEnded(state) => format!("{run_id}: {state}, not ended: nothing to resend"),
        Resent::Sent { job, skipped } => {
            let mut line = format!(
                "{run_id}: Discord {}, callback {}",
                delivery_word(job, Channel::Discord),
                delivery_word(job, Channel::Callback)
            );
            for (channel, why) in skipped {
                line.push_str(&format!("; {}", not_reopened(*channel, *why)));
            }
            line
        }
    }
}

/// Carries out `command` within `deadline`: what to print.
pub async fn act(d: &Deps, command: Command, deadline: Deadline) -> Result<String, OpsError> {
    let now = d.clock.now();
    Ok(match command {
        Command::Jobs {
            state,
            queue,
            older_than,
        } => {
            let query = JobsQuery {
                state,
                queue,
                older_than,
            };
            jobs_table(&jobs(d, &query, now).await?, now)
        }
        Command::Show { run_id } => match show(d, &run_id).await? {
            Some(view) => serde_json::to_string_pretty(&view)?,
            None => return Err(OpsError::NoSuchJob(run_id)),
        },
        Command::Resend { run_id } => resent(&run_id, &resend(d, &run_id, deadline).await?),
        Command::Replay { since, .. } => {
            let done = replay_given_up(d, since, deadline).await?;
            let mut lines: Vec<String> = done
                .runs
                .iter()
                .map(|(id, r)| match r {
                    Ok(r) => resent(id, r),
                    Err(e) => format!("{id}: failed: {}", crate::error::chain(e)),
                })
                .collect();
            if done.not_reached > 0 {
                lines.push(format!(
                    "{} more not reached in time: run it again",
                    done.not_reached
                ));
            }
            format!("{} run(s) replayed\n{}", done.runs.len(), lines.join("\n"))
        }
        Command::Cancel { run_id } => match cancel(d, &run_id, deadline).await? {
            Canceled::Accepted(job) => format!("{run_id}: cancel requested ({})", job.state),
            Canceled::AlreadyFinished(job) => format!("{run_id}: already ended ({})", job.state),
            Canceled::Unknown => return Err(OpsError::NoSuchJob(run_id)),
        },
        Command::Fleet => {
            let agents = fleet::view(d, deadline).await?;
            super::fleet_table(&agents, d.clock.now())
        }
        Command::Reconcile { run_id } => {
            let report = sweep::sweep_run(d, &run_id, deadline).await?;
            let state = d.store.get(&run_id).await?.map(|j| j.state);
            let state = state.map_or_else(|| "no such job".to_owned(), |s| s.to_string());
            format!("{run_id}: {state} ({report})")
        }
    })
}
