//! One sweep pass: deferred creates and open jobs whose webhooks never came ([`builds`]),
//! the fleet's incidents no function told (agents that stayed offline, posts that failed or
//! never came), then every report and callback still owed ([`deliveries`]). A pass lists jobs without
//! their large parts and reads each whole only to act on it. One job's trouble is counted and logged; it
//! does not stop the pass, and a job whose work kills the pass holds back no other: the
//! bookmark moves past it first. A pipeline- or store-level error stops the pass, changing
//! nothing, so the pass exits non-zero naming the cause.

mod builds;
mod deliveries;
mod lanes;
mod order;
mod pages;
mod report;
mod send;

pub use report::SweepReport;

use std::collections::BTreeSet;
use std::time::Duration;

use self::builds::{buildkite_work, sweep_open};
use self::deliveries::deliver_owed;
use self::send::deliver_both;
use super::follow::{PipelineSeen, overdue_now};
use super::{Deps, DispatchError};
use crate::buildkite::CallBudget;
use crate::jobs::{Channel, Cursor, Listed, Queue, RunId, Shard};
use crate::retry::Deadline;

/// A pass starts no new job's work with less than this left.
pub const PASS_RESERVE: Duration = Duration::from_secs(10);

/// The most of a pass the fleet's look takes: a read per agent, and a short post for each
/// incident to tell (there are few).
const FLEET_SHARE: Duration = Duration::from_secs(20);

/// How many jobs of each partition one pass lists (open jobs a page a pass, from where the
/// last pass's page ended). A listing holds no results or payloads, so this bounds a pass's
/// memory no matter what the jobs hold.
pub const SWEEP_BATCH: usize = 1000;

/// One pass over the store within `deadline` and at most `SWEEP_MAX_CALLS` Buildkite
/// calls: deferred creates, then the builds of open jobs (two listings rather than a GET
/// each), then what is owed to receivers, several at once. Each delivery gets a short slice
/// of the pass, and the pass starts no new work when its deadline is near; where it stops,
/// a bookmark lets the next pass go on.
pub async fn sweep(d: &Deps, deadline: Deadline) -> Result<SweepReport, DispatchError> {
    let budget = CallBudget::new(d.config.timing.sweep_max_calls, d.clock.clone());
    let pass = Deps {
        buildkite: d.buildkite.with_budget(budget.clone()),
        ..sliced(d)
    };
    let mut report = SweepReport::default();
    let result = pass_over(&pass, deadline, &mut report).await;
    report.buildkite_calls = budget.made();
    report.budget_spent = budget.spent();
    report.rate_limit_remaining = budget.remaining();
    report.publish(&d.metrics, result.is_err());
    result.map(|()| report)
}

async fn pass_over(
    d: &Deps,
    deadline: Deadline,
    report: &mut SweepReport,
) -> Result<(), DispatchError> {
    // Which deployment this store is, for the operator command; a failure here is no
    // reason to skip the pass's work.
    if let Err(e) = super::deployment::note(d).await {
        tracing::warn!(error = %e, "the deployment's identity was not noted");
    }
    let (open, mark, paged) = open_page(d, report).await?;
    report.past_deadline = open
        .iter()
        .filter(|j| overdue_now(d, j.timeline()).is_some())
        .count();
    // Reports need no Buildkite call: they go out even when Buildkite work failed, and
    // however long it took, in a share of the pass kept for them.
    // Buildkite work stops (keeping its own reserve) once only the share is left, when
    // anything is owed at all.
    let owed = open
        .iter()
        .any(|j| Channel::ALL.into_iter().any(|c| j.owes(c)))
        // A store that cannot say is taken to owe: the share is kept.
        || d.store.list(Shard::Outbox, 0, 1).await.map_or(true, |l| !l.is_empty());
    let share = if owed {
        deliveries_share(deadline.remaining())
    } else {
        Duration::ZERO
    };
    let buildkite_deadline = deadline.less(share.saturating_sub(PASS_RESERVE));
    release_waiting(d, &open, paged).await;
    let buildkite = buildkite_work(d, &open, buildkite_deadline, report).await;
    stay_on_page(d, mark.as_deref()).await?;
    sweep_fleet(d, deadline, report).await;
    deliver_owed(d, &open, deadline, report).await?;
    buildkite
}

/// This pass's page of open jobs ([`order::open_page`]), where it began, and whether the
/// open jobs take more than this one page; its bookmark moved past it first: a page whose
/// work kills the pass holds back no other.
async fn open_page(
    d: &Deps,
    report: &mut SweepReport,
) -> Result<(Vec<Listed>, Option<String>, bool), DispatchError> {
    let mark = d.store.cursor(Cursor::OpenPage).await?;
    let since = mark.as_deref().map_or(0, order::created_at_of);
    let listing = d.store.list(Shard::Open, since, SWEEP_BATCH + 1).await?;
    report.errors += listing.unreadable;
    let (open, next) = order::open_page(listing, mark.as_deref(), SWEEP_BATCH);
    d.store
        .set_cursor(Cursor::OpenPage, next.as_deref())
        .await?;
    let paged = mark.is_some() || next.is_some();
    Ok((open, mark, paged))
}

/// Keeps the next pass on this page (from `mark`) while its builds' bookmark says the
/// pass's time or call budget ran out within it: the next pass goes on where this one
/// stopped rather than at another page, leaving the rest a whole round to wait.
async fn stay_on_page(d: &Deps, mark: Option<&str>) -> Result<(), DispatchError> {
    if d.store.cursor(Cursor::Builds).await?.is_some() {
        d.store.set_cursor(Cursor::OpenPage, mark).await?;
    }
    Ok(())
}

/// Agents that stayed offline, and incidents a function decided but did not tell, within a
/// short share of the pass: a sixth of what is left, at least two operators' posts' time and
/// at most [`FLEET_SHARE`] (the look is a read per agent; only posts to a slow operators'
/// channel take long, and the deliveries that follow keep the rest).
async fn sweep_fleet(d: &Deps, deadline: Deadline, report: &mut SweepReport) {
    // Shared entries past their lifetime go first (DynamoDB's TTL does this by itself).
    match d.store.forget_expired(d.clock.now()).await {
        Ok(0) => {}
        Ok(forgotten) => tracing::info!(forgotten, "expired shared entries forgotten"),
        Err(e) => {
            tracing::warn!(error = %e, "expired shared entries could not be forgotten");
            report.errors += 1;
        }
    }
    let span = (deadline.remaining() / 6).clamp(FLEET_SHARE / 2, FLEET_SHARE);
    let share = deadline.within(span);
    match super::fleet::sweep_fleet(d, share).await {
        Ok(swept) => {
            report.incidents_told = swept.told;
            report.errors += swept.errors;
        }
        Err(e) => {
            tracing::warn!(error = %e, "the fleet's list could not be read");
            report.errors += 1;
        }
    }
}

/// Fair share's waiting jobs that a slot lets go, released on each queue with jobs without
/// a build on this page, and on every queue of ours while the open jobs take more than one
/// page (its waiting jobs may be on another): the creates of those on this page follow in
/// this pass, the others' at the next end or pass. A queue whose release fails is logged;
/// the rest of the pass goes on.
async fn release_waiting(d: &Deps, open: &[Listed], paged: bool) {
    let mut queues: BTreeSet<Queue> = open
        .iter()
        .filter(|j| j.build.is_none())
        .map(|j| j.queue.clone())
        .collect();
    if paged {
        queues.extend(d.config.queues.names().into_iter().map(Queue::new));
    }
    for queue in &queues {
        if let Err(e) = super::fair::release(d, queue, Default::default()).await {
            tracing::warn!(error = %e, %queue, "the queue's waiting jobs could not be released");
        }
    }
}

/// The part of a pass's remaining time kept for deliveries (their reserve included): a
/// third, and at least enough for a few sends (all of it when less is left).
fn deliveries_share(remaining: Duration) -> Duration {
    let floor = PASS_RESERVE + Duration::from_secs(10);
    (remaining / 3).max(floor).min(remaining)
}

/// `d` with each job's sends to a receiver held to one try of a message and a short wait.
pub(crate) fn sliced(d: &Deps) -> Deps {
    Deps {
        send_slice: Some(2 * d.discord.timeout() + Duration::from_secs(3)),
        ..d.clone()
    }
}

/// Re-drives one run: its build is checked whatever its age, and what it owes is sent.
pub async fn sweep_run(
    d: &Deps,
    run_id: &RunId,
    deadline: Deadline,
) -> Result<SweepReport, DispatchError> {
    let d = &sliced(d);
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

/// What a sweep invocation asks for: a pass (the schedule's event, or `{}`), or one run
/// re-driven (`{"run_id": "…"}`, as `aws lambda invoke` sends it). A `run_id` that is not a
/// run id is refused, never taken for a pass.
pub fn requested_run(event: &serde_json::Value) -> Result<Option<RunId>, String> {
    match event.get("run_id") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(id)) => id
            .parse()
            .map(Some)
            .map_err(|e| format!("run_id {id:?}: {e}")),
        Some(other) => Err(format!("run_id must be a string, not {other}")),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::requested_run;

    #[test]
    fn deliveries_keep_a_share_of_every_pass() {
        let s = Duration::from_secs;
        for (remaining, share) in [
            (s(117), s(39)),
            (s(90), s(30)),
            (s(48), s(20)),
            (s(30), s(20)),
            (s(12), s(12)),
        ] {
            assert_eq!(super::deliveries_share(remaining), share, "{remaining:?}");
        }
    }

    #[test]
    fn an_invocation_asks_for_a_pass_or_one_run() {
        let schedule = json!({"version": "0", "source": "aws.events",
            "detail-type": "Scheduled Event", "detail": {}});
        for (event, asked) in [
            (schedule, Ok(None)),
            (json!({}), Ok(None)),
            (json!({"run_id": null}), Ok(None)),
            (json!({"run_id": "run-42"}), Ok(Some("run-42"))),
            (json!({"run_id": ""}), Err("run_id \"\"")),
            (json!({"run_id": "a/b"}), Err("run_id \"a/b\"")),
            (json!({"run_id": 42}), Err("must be a string")),
        ] {
            let got = requested_run(&event);
            match asked {
                Ok(id) => assert_eq!(
                    got.map(|r| r.map(|r| r.as_str().to_owned())),
                    Ok(id.map(str::to_owned)),
                    "{event}"
                ),
                Err(says) => assert!(
                    got.as_ref().is_err_and(|e| e.contains(says)),
                    "{event}: {got:?}"
                ),
            }
        }
    }
}
