//! The sweep's deliveries: every report and callback still owed, in bookmark order from
//! where the last pass stopped, several at once in lanes (see [`lanes`](super::lanes)), the
//! outbox listed a page at a time as the lanes have room (see [`pages`](super::pages)).
//! Each send reads its job whole and lets it go when done, so a pass holds no more jobs
//! than it has sends in flight, whatever the backlog.

use std::collections::{HashMap, HashSet};

use tokio::task::JoinSet;
use tracing::warn;

use super::super::{Deps, DispatchError};
use super::PASS_RESERVE;
use super::lanes::Lanes;
use super::order::{bookmark, rotate_to};
use super::pages::Pages;
use super::report::{Delivered, SweepReport};
use super::send::{owed_since, send};
use crate::jobs::{Channel, Cursor, Listed, RunId, StoreError, Target};
use crate::retry::Deadline;
use crate::time::Millis;

/// Who receives a delivery: sends to one receiver share its lane.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Lane {
    /// A Discord webhook, by id.
    Webhook(String),
    /// The deployment's default Discord webhook, when none is configured any more.
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

/// The receiver of `job`'s message to `channel` (the default webhook is the webhook it is).
fn lane(d: &Deps, job: &Listed, channel: Channel) -> Lane {
    let target = job.discord.as_ref().and_then(|o| o.target.as_ref());
    match (channel, target) {
        (Channel::Callback, _) => Lane::Callback,
        (Channel::Discord, Some(Target::Webhook(w))) => Lane::Webhook(w.webhook_id.clone()),
        (Channel::Discord, _) => d
            .default_discord
            .as_ref()
            .map_or(Lane::DefaultWebhook, |t| {
                Lane::Webhook(t.webhook_id.clone())
            }),
    }
}

/// A pass's deliveries, in its order, and their lanes.
struct Plan {
    owed: Vec<Owed>,
    lanes: Lanes<Lane>,
    /// Each job once, though an open listing and the outbox may both show it.
    seen: HashSet<RunId>,
}

impl Plan {
    fn new() -> Self {
        Self {
            owed: Vec::new(),
            lanes: Lanes::new(),
            seen: HashSet::new(),
        }
    }

    /// Adds what `jobs` (in order) owe.
    fn add<'a>(&mut self, d: &Deps, jobs: impl IntoIterator<Item = &'a Listed>) {
        for job in jobs {
            if !self.seen.insert(job.run_id.clone()) {
                continue;
            }
            for channel in Channel::ALL.into_iter().filter(|c| job.owes(*c)) {
                self.owed.push(Owed {
                    run_id: job.run_id.clone(),
                    channel,
                    mark: bookmark(job),
                    since: owed_since(job.delivery(channel), job.updated_at),
                });
                self.lanes.push(lane(d, job, channel));
            }
        }
    }
}

/// Sends what the `open` jobs and the outbox owe within `deadline`, lanes side by side;
/// leaves the bookmark at the first delivery it did not start. A store that cannot be
/// reached stops the pass (what is in flight ends first); one job's trouble is counted.
pub(super) async fn deliver_owed(
    d: &Deps,
    open: &[Listed],
    deadline: Deadline,
    report: &mut SweepReport,
) -> Result<(), DispatchError> {
    let mark = d.store.cursor(Cursor::Deliveries).await?;
    let mut pages = Pages::from(mark.clone());
    let first = pages.next(d, report).await?;
    let mut jobs: Vec<&Listed> = open.iter().chain(&first).collect();
    rotate_to(&mut jobs, mark.as_deref());
    let mut plan = Plan::new();
    plan.add(d, jobs);
    drop(first);
    let tally = run(d, (&mut plan, &mut pages), deadline, report).await;
    report.oldest_pending_secs = oldest_secs(d.clock.now(), &tally.since);
    let cursor = match plan.lanes.first_not_started() {
        Some(i) => Some(plan.owed[i].mark.clone()),
        None => pages.resume(),
    };
    d.store
        .set_cursor(Cursor::Deliveries, cursor.as_deref())
        .await?;
    tally.stopped.map_or(Ok(()), Err)
}

/// Starts what the lanes have room for, listing another page when they have room and
/// nothing to start, until the pass's time is up; then counts what was never started.
async fn run(
    d: &Deps,
    (plan, pages): (&mut Plan, &mut Pages),
    deadline: Deadline,
    report: &mut SweepReport,
) -> Tally {
    let mut running = JoinSet::new();
    let mut started = HashMap::new();
    let mut tally = Tally::default();
    loop {
        while tally.stopped.is_none() && deadline.remaining() >= PASS_RESERVE {
            if let Some(i) = plan.lanes.start_next() {
                let (d, item) = (d.clone(), plan.owed[i].clone());
                let task = running
                    .spawn(async move { send(&d, &item.run_id, item.channel, deadline).await });
                started.insert(task.id(), i);
            } else if plan.lanes.has_room() && pages.more() {
                match pages.next(d, report).await {
                    Ok(page) => plan.add(d, &page),
                    Err(e) => tally.stopped = Some(e),
                }
            } else {
                break;
            }
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
            plan.lanes.finish(i);
            tally.add(&plan.owed[i], sent, report);
        }
    }
    for i in plan.lanes.not_started() {
        let item = &plan.owed[i];
        tally.add(item, Some(Ok(Some(Delivered::Pending(item.since)))), report);
    }
    tally
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
    /// Counts one delivery (`sent`: `None` when it ended abnormally, already counted as an
    /// error); one that did not go out is still owed.
    fn add(
        &mut self,
        item: &Owed,
        sent: Option<Result<Option<Delivered>, DispatchError>>,
        report: &mut SweepReport,
    ) {
        let delivered = match sent {
            Some(Ok(delivered)) => delivered,
            None => Some(Delivered::Pending(item.since)),
            Some(Err(DispatchError::Store(e @ StoreError::Unavailable(_)))) => {
                self.stopped.get_or_insert(DispatchError::Store(e));
                Some(Delivered::Pending(item.since))
            }
            Some(Err(e)) => {
                warn!(run_id = %item.run_id, error = %e, "the sweep could not deliver");
                report.errors += 1;
                Some(Delivered::Pending(item.since))
            }
        };
        if let (Channel::Discord, Some(Delivered::Pending(since))) = (item.channel, delivered) {
            self.since.push(since);
        }
        report.count_delivery(item.channel, delivered);
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
