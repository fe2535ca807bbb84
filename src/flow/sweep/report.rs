//! What one sweep pass did: its one-line summary, and the metrics the alarms watch.

use super::super::advance::EventOutcome;
use crate::jobs::{Channel, JobState};
use crate::telemetry::metrics::{Metrics, Unit};
use crate::time::Millis;

/// What one sweep pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SweepReport {
    pub checked: usize,
    pub finished: usize,
    pub failed: usize,
    pub advanced: usize,
    pub unchanged: usize,
    pub created: usize,
    pub deferred: usize,
    pub reports_sent: usize,
    pub reports_pending: usize,
    pub errors: usize,
    /// Calls made to the Buildkite API (artifact storage not counted).
    pub buildkite_calls: u32,
    /// The pass stopped its Buildkite work on its call budget or the rate limit.
    pub budget_spent: bool,
    /// The fewest requests Buildkite said were left in its window (the token's or the
    /// organization's), when it said: the quota the dashboard shows.
    pub rate_limit_remaining: Option<i64>,
    /// Reports given up in this pass (a day of failures, or refused for good).
    pub reports_given_up: usize,
    /// Age of the oldest report still pending after the pass.
    pub oldest_pending_secs: u64,
    /// Open jobs past a deadline when the pass began.
    pub past_deadline: usize,
    /// Signed callbacks accepted in this pass, still owed after it, and given up in it.
    pub callbacks_sent: usize,
    pub callbacks_pending: usize,
    pub callbacks_given_up: usize,
    /// GPU incidents told to the operators by this pass (agents that stayed offline, and
    /// incidents a function decided but did not tell).
    pub incidents_told: usize,
}

impl std::fmt::Display for SweepReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sweep: checked {} unfinished jobs: {} finished, {} failed, {} advanced, {} unchanged, \
             {} builds created, {} creates deferred, {} reports sent, {} reports pending, {} errors; \
             {} Buildkite calls{}{}",
            self.checked,
            self.finished,
            self.failed,
            self.advanced,
            self.unchanged,
            self.created,
            self.deferred,
            self.reports_sent,
            self.reports_pending,
            self.errors,
            self.buildkite_calls,
            if self.budget_spent {
                " (budget spent: the next pass goes on)"
            } else {
                ""
            },
            match self.incidents_told {
                0 => String::new(),
                n => format!("; {n} GPU incidents told"),
            }
        )
    }
}

/// Where one outbox of a job stands after a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Delivered {
    Sent,
    /// Still owed, since then.
    Pending(Millis),
    GivenUp,
}

impl SweepReport {
    pub(crate) fn count(&mut self, outcome: &EventOutcome) {
        match outcome {
            EventOutcome::Advanced(JobState::Finished) => self.finished += 1,
            EventOutcome::Advanced(JobState::Failed) => self.failed += 1,
            EventOutcome::Advanced(_) => self.advanced += 1,
            EventOutcome::Ignored(_)
            | EventOutcome::Foreign
            | EventOutcome::AgentNoted
            | EventOutcome::TryNoted => self.unchanged += 1,
        }
    }

    /// Counts one outbox's delivery (`None`: it owed nothing).
    pub(crate) fn count_delivery(&mut self, channel: Channel, delivered: Option<Delivered>) {
        let (sent, pending, given_up) = match channel {
            Channel::Discord => (
                &mut self.reports_sent,
                &mut self.reports_pending,
                &mut self.reports_given_up,
            ),
            Channel::Callback => (
                &mut self.callbacks_sent,
                &mut self.callbacks_pending,
                &mut self.callbacks_given_up,
            ),
        };
        match delivered {
            Some(Delivered::Sent) => *sent += 1,
            Some(Delivered::Pending(_)) => *pending += 1,
            Some(Delivered::GivenUp) => *given_up += 1,
            None => {}
        }
    }

    /// The pass's metrics: what the alarms in `template.yaml` watch.
    pub(crate) fn publish(&self, metrics: &Metrics, failed: bool) {
        let count = |n: usize| n as f64;
        if let Some(left) = self.rate_limit_remaining {
            let left = [("BuildkiteRateLimitRemaining", Unit::Count, left as f64)];
            metrics.put(&[], &left);
        }
        metrics.put(
            &[],
            &[
                ("SweepFailed", Unit::Count, f64::from(u8::from(failed))),
                ("SweepErrors", Unit::Count, count(self.errors)),
                (
                    "SweepBuildkiteCalls",
                    Unit::Count,
                    f64::from(self.buildkite_calls),
                ),
                ("ReportsPending", Unit::Count, count(self.reports_pending)),
                ("ReportsGivenUp", Unit::Count, count(self.reports_given_up)),
                (
                    "OldestPendingReportAge",
                    Unit::Seconds,
                    self.oldest_pending_secs as f64,
                ),
                (
                    "OpenJobsPastDeadline",
                    Unit::Count,
                    count(self.past_deadline),
                ),
                (
                    "CallbacksPending",
                    Unit::Count,
                    count(self.callbacks_pending),
                ),
                (
                    "CallbacksGivenUp",
                    Unit::Count,
                    count(self.callbacks_given_up),
                ),
            ],
        );
    }
}
