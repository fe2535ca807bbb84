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
use super::pages::{PAGE, Pages};
use super::report::{Delivered, SweepReport};
use super::send::{owed_since, send};
use crate::jobs::{Channel, Cursor, Listed, RunId, Shard, StoreError, Target};
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

/// A pass's deliveries, in its order (open jobs', then the outbox's, each from its own
/// bookmark), and their lanes.
struct Plan {
    owed: Vec<Owed>,
    lanes: Lanes<Lane>,
    /// Deliveries before this are open jobs' (those of the pass's page, in bookmark order).
    open: usize,
    /// Each job once, though an open listing and the outbox may both show it.
    seen: HashSet<RunId>,
}

impl Plan {
    /// A plan that starts with what `open` jobs owe, from `mark` round to it again.
    fn new(d: &Deps, open: &[Listed], mark: Option<&str>) -> Self {
        let mut plan = Self {
            owed: Vec::new(),
            lanes: Lanes::new(),
            open: 0,
            seen: HashSet::new(),
        };
        let mut open: Vec<&Listed> = open.iter().collect();
        rotate_to(&mut open, mark);
        plan.add(d, open);
        plan.open = plan.owed.len();
        plan
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

    /// Where the next pass begins with open jobs' sends and the outbox's: the first send of
    /// each not started (for the outbox, else where its listing got to); and how far the
    /// outbox's listing may skip ahead after its first page: past its last send started.
    fn bookmarks(&self, pages: &Pages) -> Bookmarks {
        let started = |i: &usize| self.lanes.is_started(*i);
        let mark = |i: usize| self.owed.get(i).map(|o| o.mark.clone());
        let outbox = self.open..self.owed.len();
        let frontier = match outbox.clone().rev().find(started) {
            Some(last) => mark(last + 1).or_else(|| pages.reached()),
            None => None,
        };
        let first_unstarted = |mut range: std::ops::Range<usize>| range.find(|i| !started(i));
        Bookmarks {
            open: first_unstarted(0..self.open).and_then(mark),
            outbox: first_unstarted(outbox)
                .and_then(mark)
                .or_else(|| pages.reached()),
            frontier,
        }
    }
}

/// Where the next pass's sends begin.
struct Bookmarks {
    open: Option<String>,
    outbox: Option<String>,
    frontier: Option<String>,
}

/// The next page of the outbox, its unreadable records counted in `report`.
async fn next_page(
    d: &Deps,
    pages: &mut Pages,
    report: &mut SweepReport,
) -> Result<Vec<Listed>, DispatchError> {
    let listing = d.store.list(Shard::Outbox, pages.since(), PAGE + 1).await?;
    report.errors += listing.unreadable;
    Ok(pages.take(listing))
}

/// Sends what the `open` jobs and the outbox owe within `deadline`, lanes side by side,
/// and leaves the bookmarks for the next pass. A store that cannot be reached stops the
/// pass (what is in flight ends first); one job's trouble is counted.
pub(super) async fn deliver_owed(
    d: &Deps,
    open: &[Listed],
    deadline: Deadline,
    report: &mut SweepReport,
) -> Result<(), DispatchError> {
    let open_mark = d.store.cursor(Cursor::OpenSends).await?;
    let mark = d.store.cursor(Cursor::Outbox).await?;
    let frontier = d.store.cursor(Cursor::Frontier).await?;
    let mut pages = Pages::new(mark, frontier);
    let mut plan = Plan::new(d, open, open_mark.as_deref());
    let first = next_page(d, &mut pages, report).await?;
    plan.add(d, &first);
    drop(first);
    let tally = run(d, (&mut plan, &mut pages), deadline, report).await;
    report.oldest_pending_secs = oldest_secs(d.clock.now(), &tally.since);
    let marks = plan.bookmarks(&pages);
    for (cursor, mark) in [
        (Cursor::OpenSends, marks.open),
        (Cursor::Outbox, marks.outbox),
        (Cursor::Frontier, marks.frontier),
    ] {
        d.store.set_cursor(cursor, mark.as_deref()).await?;
    }
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
                match next_page(d, pages, report).await {
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
            // One job contended by its other writers is its own trouble: counted below.
            Some(Err(DispatchError::Store(e @ StoreError::Unavailable(_))))
                if !e.is_contention() =>
            {
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
