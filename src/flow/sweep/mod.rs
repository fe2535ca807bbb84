//! One sweep pass: deferred creates and open jobs whose webhooks never came ([`builds`]),
//! then every report and callback still owed. One job's trouble is counted and logged; it
//! does not stop the pass. A pipeline- or store-level error does, changing nothing, so the
//! pass exits non-zero naming the cause.

mod builds;
mod report;

use std::time::Duration;

pub use report::SweepReport;

use self::builds::{PASS_RESERVE, buildkite_work, sweep_open};
use self::report::Delivered;
use super::follow::{PipelineSeen, overdue_now};
use super::{Deps, DispatchError, deliver};
use crate::buildkite::CallBudget;
use crate::jobs::{Channel, DeliveryStatus, Job, RunId, Shard};
use crate::retry::Deadline;
use crate::time::Millis;

/// How many jobs of each partition one pass reads.
pub(crate) const SWEEP_BATCH: usize = 1000;

/// One pass over the store within `deadline` and at most `SWEEP_MAX_CALLS` Buildkite
/// calls: deferred creates, then the builds of open jobs (two listings rather than a GET
/// each), then pending reports. Each delivery gets a short slice of the pass, and the pass
/// starts no new work when its deadline is near.
pub async fn sweep(d: &Deps, deadline: Deadline) -> Result<SweepReport, DispatchError> {
    let budget = CallBudget::new(d.config.timing.sweep_max_calls);
    let pass = Deps {
        buildkite: d.buildkite.with_budget(budget.clone()),
        ..d.clone()
    };
    let mut report = SweepReport::default();
    let result = pass_over(&pass, deadline, &mut report).await;
    report.buildkite_calls = budget.made();
    report.budget_spent = budget.spent();
    report.publish(&d.metrics, result.is_err());
    result.map(|()| report)
}

async fn pass_over(
    d: &Deps,
    deadline: Deadline,
    report: &mut SweepReport,
) -> Result<(), DispatchError> {
    let open = d.store.list(Shard::Open, i64::MAX, SWEEP_BATCH).await?;
    report.past_deadline = open.iter().filter(|j| overdue_now(d, j).is_some()).count();
    // Reports need no Buildkite call: they go out even when Buildkite work failed.
    let buildkite = buildkite_work(d, &open, deadline, report).await;
    let outbox = d.store.list(Shard::Outbox, i64::MAX, SWEEP_BATCH).await?;
    let owing = open
        .iter()
        .chain(outbox.iter())
        .filter(|j| j.owes_delivery());
    let mut still_pending = Vec::new();
    for job in owing {
        let (discord, callback) = deliver_both(d, job, deadline).await;
        let discord = discord?;
        if discord == Some(Delivered::Pending) {
            still_pending.push(job);
        }
        report.count_delivery(Channel::Discord, discord);
        report.count_delivery(Channel::Callback, callback?);
    }
    // Measured on every report still owed, tried in this pass or not.
    report.reports_pending = still_pending.len();
    report.oldest_pending_secs = oldest_pending_secs(d.clock.now(), &still_pending);
    buildkite
}

/// How long the oldest of `pending` reports has been owed.
fn oldest_pending_secs(now: Millis, pending: &[&Job]) -> u64 {
    pending
        .iter()
        .map(|j| {
            let since = j
                .delivery(Channel::Discord)
                .and_then(|o| o.pending_since)
                .unwrap_or(j.updated_at);
            (now - since).max(0) as u64 / 1000
        })
        .max()
        .unwrap_or(0)
}

type BothDelivered = (
    Result<Option<Delivered>, DispatchError>,
    Result<Option<Delivered>, DispatchError>,
);

/// One job's Discord report and callback, side by side within a short slice of the
/// pass, so a slow Discord never holds callbacks back, nor the reverse. `None`: that
/// outbox owed nothing.
async fn deliver_both(d: &Deps, job: &Job, deadline: Deadline) -> BothDelivered {
    tokio::join!(
        deliver_one(d, Channel::Discord, job, deadline),
        deliver_one(d, Channel::Callback, job, deadline)
    )
}

/// Nothing more will be sent: given up, or the callback receiver is gone.
fn given_up(channel: Channel, job: &Job) -> bool {
    let status = job.delivery(channel).map(|d| d.status);
    matches!(status, Some(DeliveryStatus::GivenUp))
        || (channel == Channel::Callback && status == Some(DeliveryStatus::Gone))
}

/// Sends what `job` owes to `channel`; where that outbox stands after.
async fn deliver_one(
    d: &Deps,
    channel: Channel,
    job: &Job,
    deadline: Deadline,
) -> Result<Option<Delivered>, DispatchError> {
    if !job.owes(channel) {
        return Ok(None);
    }
    if deadline.remaining() < PASS_RESERVE {
        return Ok(Some(Delivered::Pending));
    }
    let delivered = deliver::drain(d, channel, job, slice(d, deadline)).await?;
    // Nothing seen when it had no time to try: the job as stored says.
    let after = match delivered {
        Some(after) => after,
        None => match d.store.get(&job.run_id).await? {
            Some(after) => after,
            None => return Ok(Some(Delivered::Sent)),
        },
    };
    Ok(Some(if after.owes(channel) {
        Delivered::Pending
    } else if given_up(channel, &after) {
        Delivered::GivenUp
    } else {
        Delivered::Sent
    }))
}

/// The part of the pass one job's delivery may use: one try and a short wait.
fn slice(d: &Deps, deadline: Deadline) -> Deadline {
    let slice = Deadline::after(2 * d.discord.timeout() + Duration::from_secs(3));
    if slice.remaining() < deadline.remaining() {
        slice
    } else {
        deadline
    }
}

/// Re-drives one run: its build is checked whatever its age, and what it owes is sent.
pub async fn sweep_run(
    d: &Deps,
    run_id: &RunId,
    deadline: Deadline,
) -> Result<SweepReport, DispatchError> {
    let mut report = SweepReport::default();
    let Some(job) = d.store.get(run_id).await? else {
        return Ok(report);
    };
    if !job.state.is_terminal() {
        let mut pipeline = PipelineSeen::default();
        sweep_open(d, &job, true, &mut pipeline, deadline, &mut report).await?;
    }
    if let Some(job) = d.store.get(run_id).await? {
        let (discord, callback) = deliver_both(d, &job, deadline).await;
        report.count_delivery(Channel::Discord, discord?);
        report.count_delivery(Channel::Callback, callback?);
    }
    Ok(report)
}
