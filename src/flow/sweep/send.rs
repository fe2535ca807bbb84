//! One delivery of a pass: a job read whole, what it owes one receiver sent within a short
//! slice of the pass, the job let go.

use super::super::{Deps, DispatchError, settle};
use super::PASS_RESERVE;
use super::report::Delivered;
use crate::jobs::{Channel, Delivery, DeliveryStatus, Job, RunId};
use crate::retry::Deadline;
use crate::time::Millis;

/// Since when a message has been owed: its first failure, else the job's last change.
pub(super) fn owed_since(delivery: Option<&Delivery>, updated_at: Millis) -> Millis {
    delivery.and_then(|d| d.pending_since).unwrap_or(updated_at)
}

/// Sends what job `run_id` owes `channel`; where that outbox stands after (`None`: it owed
/// nothing, or is gone).
pub(super) async fn send(
    d: &Deps,
    run_id: &RunId,
    channel: Channel,
    deadline: Deadline,
) -> Result<Option<Delivered>, DispatchError> {
    match d.store.get(run_id).await? {
        Some(job) => deliver_one(d, channel, &job, deadline).await,
        None => Ok(None),
    }
}

type BothDelivered = (
    Result<Option<Delivered>, DispatchError>,
    Result<Option<Delivered>, DispatchError>,
);

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
    let delivered = settle::drain(d, channel, job, deadline).await?;
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
