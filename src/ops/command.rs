//! The operator's commands as `kernelbot-dispatch` takes them, and what each does and says.

use std::time::Duration;

use clap::Subcommand;

use super::{JobsQuery, delivery_word, jobs, jobs_table, not_reopened, show};
use crate::flow::cancel::{Canceled, cancel};
use crate::flow::queues::QueueError;
use crate::flow::resend::{Resent, replay_given_up, resend};
use crate::flow::rules::outbox::NotReopened;
use crate::flow::{Deps, DispatchError, deployment, fleet, sweep};
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
    #[error("{0}: {1}, not ended: nothing to resend")]
    NotEnded(RunId, JobState),
    #[error("{0} changes the deployment: add --yes to do it, or --dry-run to see what it would do")]
    Unconfirmed(&'static str),
    #[error(
        "this store belongs to another deployment ({0}): set the variables as that stack's \
         functions have them, or point JOBS_TABLE at this one's table"
    )]
    WrongDeployment(String),
    /// Some of the work was not done: what was, and what was not.
    #[error("{0}")]
    Incomplete(String),
}

/// Whether a command that changes the deployment may: `--yes` does it, `--dry-run` only says
/// what it would do; neither is refused (a command pasted with the wrong run id does
/// nothing).
#[derive(Clone, Copy, Debug, Default, clap::Args)]
pub struct Confirm {
    /// Do it.
    #[arg(long)]
    pub yes: bool,
    /// Only say what it would do.
    #[arg(long, conflicts_with = "yes")]
    pub dry_run: bool,
}

impl Confirm {
    /// Do it at once (the library's callers: tests, scripts that decided already).
    pub const YES: Self = Self {
        yes: true,
        dry_run: false,
    };

    /// Whether `what` acts (`--yes`) or only says what it would do (`--dry-run`); neither
    /// is refused.
    fn acts(self, what: &'static str) -> Result<bool, OpsError> {
        match (self.yes, self.dry_run) {
            (_, true) => Ok(false),
            (true, false) => Ok(true),
            (false, false) => Err(OpsError::Unconfirmed(what)),
        }
    }
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
        /// A JSON array instead of the table.
        #[arg(long)]
        json: bool,
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
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Cancels a run: its build is canceled, or the job ended if it has none yet.
    Cancel {
        run_id: RunId,
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Reads one run's build whatever its age, finishes or fixes the job, sends what it owes.
    Reconcile { run_id: RunId },
    /// Each GPU agent of our queues: connection, pause and why, jobs and infrastructure
    /// failures in the last 24 h, last pre-flight readings.
    Fleet {
        /// A JSON array instead of the table.
        #[arg(long)]
        json: bool,
    },
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

/// Whether a resend left nothing owed it could have sent: a message still owed (its send
/// failed again) or a receiver this configuration lacks is work not done.
fn all_sent(resent: &Resent) -> bool {
    match resent {
        Resent::Sent { job, skipped } => {
            let owed = [Channel::Discord, Channel::Callback]
                .into_iter()
                .any(|c| job.owes(c));
            let unconfigured = skipped
                .iter()
                .any(|(_, why)| *why == NotReopened::Unconfigured);
            !owed && !unconfigured
        }
        Resent::Unknown | Resent::NotEnded(_) => false,
    }
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

/// Carries out `command` within `deadline`: what to print. Anything asked and not done is
/// an error (its text says what was done), so a script can trust the exit status.
pub async fn act(d: &Deps, command: Command, deadline: Deadline) -> Result<String, OpsError> {
    let now = d.clock.now();
    if command.changes() {
        same_deployment(d).await?;
    }
    Ok(match command {
        Command::Jobs {
            state,
            queue,
            older_than,
            json,
        } => {
            let query = JobsQuery {
                state,
                queue,
                older_than,
            };
            let listed = jobs(d, &query, now).await?;
            match json {
                true => serde_json::to_string_pretty(&super::jobs_json(&listed))?,
                false => jobs_table(&listed, now),
            }
        }
        Command::Show { run_id } => match show(d, &run_id).await? {
            Some(view) => serde_json::to_string_pretty(&view)?,
            None => return Err(OpsError::NoSuchJob(run_id)),
        },
        Command::Resend { run_id } => match resend(d, &run_id, deadline).await? {
            Resent::Unknown => return Err(OpsError::NoSuchJob(run_id)),
            Resent::NotEnded(state) => return Err(OpsError::NotEnded(run_id, state)),
            sent if !all_sent(&sent) => return Err(OpsError::Incomplete(resent(&run_id, &sent))),
            sent => resent(&run_id, &sent),
        },
        Command::Replay { since, confirm, .. } => replay(d, since, confirm, deadline).await?,
        Command::Cancel { run_id, confirm } => cancel_run(d, run_id, confirm, deadline).await?,
        Command::Fleet { json } => {
            let agents = fleet::view(d, deadline).await?;
            match json {
                true => serde_json::to_string_pretty(&agents)?,
                false => super::fleet_table(&agents, d.clock.now()),
            }
        }
        Command::Reconcile { run_id } => {
            let report = sweep::sweep_run(d, &run_id, deadline).await?;
            let state = d.store.get(&run_id).await?.map(|j| j.state);
            let state = state.ok_or_else(|| OpsError::NoSuchJob(run_id.clone()))?;
            format!("{run_id}: {state} ({report})")
        }
    })
}

impl Command {
    /// Whether it may change a build, a message or a job (and so must not run against
    /// another deployment's store).
    fn changes(&self) -> bool {
        matches!(
            self,
            Self::Resend { .. }
                | Self::Replay { .. }
                | Self::Cancel { .. }
                | Self::Reconcile { .. }
        )
    }
}

/// Refuses a store whose functions noted another deployment than this configuration's (a
/// store they never noted, new or from before this release, is taken as it is).
async fn same_deployment(d: &Deps) -> Result<(), OpsError> {
    let Some(recorded) = deployment::recorded(d).await? else {
        tracing::warn!("the store names no deployment yet (no sweep pass since this release)");
        return Ok(());
    };
    match deployment::Identity::of(d).differs(&recorded) {
        Some(why) => Err(OpsError::WrongDeployment(why)),
        None => Ok(()),
    }
}

/// `cancel`: with `--dry-run` what it would do, with `--yes` done.
async fn cancel_run(
    d: &Deps,
    run_id: RunId,
    confirm: Confirm,
    deadline: Deadline,
) -> Result<String, OpsError> {
    if !confirm.acts("cancel")? {
        let job = d.store.get(&run_id).await?;
        let job = job.ok_or_else(|| OpsError::NoSuchJob(run_id.clone()))?;
        let build = job
            .build
            .as_ref()
            .map_or("no build yet".into(), |b| format!("build #{}", b.number));
        return Ok(match job.state.is_terminal() {
            true => format!("{run_id}: already ended ({}): nothing to cancel", job.state),
            false => format!("{run_id}: would cancel ({}, {build})", job.state),
        });
    }
    Ok(match cancel(d, &run_id, deadline).await? {
        Canceled::Accepted(job) => format!("{run_id}: cancel requested ({})", job.state),
        Canceled::AlreadyFinished(job) => format!("{run_id}: already ended ({})", job.state),
        Canceled::Unknown => return Err(OpsError::NoSuchJob(run_id)),
    })
}

/// `replay --given-up`: with `--dry-run` the runs it would send again, with `--yes` sent;
/// a run that failed or was not reached in time fails the command.
async fn replay(
    d: &Deps,
    since: Millis,
    confirm: Confirm,
    deadline: Deadline,
) -> Result<String, OpsError> {
    if !confirm.acts("replay")? {
        let runs = super::given_up_since(d, since).await?;
        let mut lines = vec![format!("{} run(s) would be replayed", runs.len())];
        lines.extend(runs.iter().map(|j| j.run_id.to_string()));
        return Ok(lines.join("\n"));
    }
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
    let failed = done
        .runs
        .iter()
        .filter(|(_, r)| r.as_ref().map_or(true, |r| !all_sent(r)))
        .count();
    let text = format!("{} run(s) replayed\n{}", done.runs.len(), lines.join("\n"));
    match failed + done.not_reached {
        0 => Ok(text),
        _ => Err(OpsError::Incomplete(text)),
    }
}
