//! The sweep's deliveries: every report and callback still owed, in bookmark order from
//! where the last pass stopped, several at once in lanes (see [`lanes`](super::lanes)).
//! Each send reads its job whole and lets it go when done, so a pass holds no more jobs
//! than it has sends in flight, whatever the backlog.

use std::collections::HashMap;
use std::time::Duration;

use tokio::task::JoinSet;
use tracing::warn;

use super::super::{Deps, DispatchError, deliver};
use super::PASS_RESERVE;
use super::lanes::Lanes;
use super::order::{bookmark, rotate_to};
use super::report::{Delivered, SweepReport};
use crate::jobs::{
    Channel, Cursor, Delivery, DeliveryStatus, Job, Listed, RunId, StoreError, Target,
};
use crate::retry::Deadline;
use crate::time::Millis;

/// Who receives a delivery: sends to one receiver share its lane.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Lane {
    /// A Discord webhook, by id.
    Webhook(String),
    /// The deployment's default Discord webhook.
    DefaultWebhook,
    Callback,
}

/// One delivery a listing showed owed.
#[derive(Clone)]
struct Owed {
    run_id: RunId,
    channel: Channel,
    /// The job's place in the pass's order.
    mark: String,
    /// Since when it has been owed, as listed.
    since: Millis,
}

fn lane(job: &Listed, channel: Channel) -> Lane {
    let target = job.discord.as_ref().and_then(|o| o.target.as_ref());
    match (channel, target) {
        (Channel::Callback, _) => Lane::Callback,
        (Channel::Discord, Some(Target::Webhook(w))) => Lane::Webhook(w.webhook_id.clone()),
        (Channel::Discord, _) => Lane::DefaultWebhook,
    }
}

/// Since when a message has been owed: its first failure, else the job's last change.
fn owed_since(delivery: Option<&Delivery>, updated_at: Millis) -> Millis {
    delivery.and_then(|d| d.pending_since).unwrap_or(updated_at)
}

/// Every delivery `jobs` owe, starting at the bookmark the last pass left; and their lanes.
async fn plan(d: &Deps, mut jobs: Vec<&Listed>) -> Result<(Vec<Owed>, Vec<Lane>), StoreError> {
    let mark = d.store.cursor(Cursor::Deliveries).await?;
    rotate_to(&mut jobs, mark.as_deref());
    let owed = jobs.into_iter().flat_map(|job| {
        Channel::ALL
            .into_iter()
            .filter(|c| job.owes(*c))
            .map(move |channel| {
                let owed = Owed {
                    run_id: job.run_id.clone(),
                    channel,
                    mark: bookmark(job),
                    since: owed_since(job.delivery(channel), job.updated_at),
                };
                (owed, lane(job, channel))
            })
    });
    Ok(owed.unzip())
}

/// Sends what `jobs` owe within `deadline`, lanes side by side; leaves the bookmark at the
/// first delivery it did not start. A store that cannot be reached stops the pass (what is
/// in flight ends first); one job's trouble is counted.
pub(super) async fn deliver_owed(
    d: &Deps,
    jobs: Vec<&Listed>,
    deadline: Deadline,
    report: &mut SweepReport,
) -> Result<(), DispatchError> {
    let (owed, lanes) = plan(d, jobs).await?;
    let mut lanes = Lanes::new(lanes);
    let mut running = JoinSet::new();
    let mut started = HashMap::new();
    let mut tally = Tally::default();
    loop {
        while tally.stopped.is_none() && deadline.remaining() >= PASS_RESERVE {
            let Some(i) = lanes.start_next() else { break };
            let (d, item) = (d.clone(), owed[i].clone());
            let task = running.spawn(async move { send(&d, &item, deadline).await });
            started.insert(task.id(), i);
        }
        let Some(joined) = running.join_next_with_id().await else {
            break;
        };
        let (id, sent) = match joined {
            Ok((id, sent)) => (id, Some(sent)),
            Err(e) => {
                // A send that panicked: its job is owed still and goes out next pass.
                warn!(error = %e, "a delivery ended abnormally");
                report.errors += 1;
                (e.id(), None)
            }
        };
        if let Some(i) = started.remove(&id) {
            lanes.finish(i);
            tally.add(&owed[i], sent, report);
        }
    }
    for i in lanes.not_started() {
        let item = &owed[i];
        tally.add(item, Some(Ok(Some(Delivered::Pending(item.since)))), report);
    }
    report.oldest_pending_secs = oldest_secs(d.clock.now(), &tally.since);
    let cursor = lanes.first_not_started().map(|i| owed[i].mark.as_str());
    d.store.set_cursor(Cursor::Deliveries, cursor).await?;
    tally.stopped.map_or(Ok(()), Err)
}

/// What a pass's deliveries came to, beyond the report's counts.
#[derive(Default)]
struct Tally {
    /// Since when each report still owed has been owed.
    since: Vec<Millis>,
    /// The store could not be reached: the pass starts nothing more.
    stopped: Option<DispatchError>,
}

impl Tally {
    /// Counts one delivery (`None`: it ended abnormally, already counted).
    fn add(
        &mut self,
        item: &Owed,
        sent: Option<Result<Option<Delivered>, DispatchError>>,
        report: &mut SweepReport,
    ) {
        match sent {
            Some(Ok(delivered)) => {
                if let (Channel::Discord, Some(Delivered::Pending(since))) =
                    (item.channel, delivered)
                {
                    self.since.push(since);
                }
                report.count_delivery(item.channel, delivered);
            }
            Some(Err(DispatchError::Store(e @ StoreError::Unavailable(_)))) => {
                self.stopped.get_or_insert(DispatchError::Store(e));
            }
            Some(Err(e)) => {
                warn!(run_id = %item.run_id, error = %e, "the sweep could not deliver");
                report.errors += 1;
            }
            None => {}
        }
    }
}

/// How long the oldest of reports owed `since` has been owed.
fn oldest_secs(now: Millis, since: &[Millis]) -> u64 {
    since
        .iter()
        .map(|s| (now - s).max(0) as u64 / 1000)
        .max()
        .unwrap_or(0)
}

/// One delivery: the job read whole, what it owes `item.channel` sent, the job let go.
async fn send(
    d: &Deps,
    item: &Owed,
    deadline: Deadline,
) -> Result<Option<Delivered>, DispatchError> {
    match d.store.get(&item.run_id).await? {
        Some(job) => deliver_one(d, item.channel, &job, deadline).await,
        None => Ok(None),
    }
}

/// One job's Discord report and callback, side by side within a short slice of the
/// pass. `None`: that outbox owed nothing.
pub(super) async fn deliver_both(d: &Deps, job: &Job, deadline: Deadline) -> BothDelivered {
    if deadline.remaining() < PASS_RESERVE {
        let pending = |c: Channel| {
            let since = owed_since(job.delivery(c), job.updated_at);
            Ok(job.owes(c).then_some(Delivered::Pending(since)))
        };
        return (pending(Channel::Discord), pending(Channel::Callback));
    }
    tokio::join!(
        deliver_one(d, Channel::Discord, job, deadline),
        deliver_one(d, Channel::Callback, job, deadline)
    )
}

type BothDelivered = (
    Result<Option<Delivered>, DispatchError>,
    Result<Option<Delivered>, DispatchError>,
);

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
        Delivered::Pending(owed_since(after.delivery(channel), after.updated_at))
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
