//! What the service keeps of each GPU agent of its queues, and when an operator must hear
//! of it: a pure record per agent, changed by the tries of finished jobs, by agent events and
//! by the passing of time, which says which incident is new (one message per agent and
//! incident) and keeps it until it is told.

use serde::{Deserialize, Serialize};

use crate::jobs::Queue;
use crate::result::{GpuReading, Try};
use crate::time::Millis;

/// The fleet view counts the last day.
pub(crate) const DAY_MS: Millis = 86_400_000;
/// Jobs kept per agent (a GPU runs a few hundred a day at most; the record is rewritten whole
/// at each try, so it stays small).
const MAX_JOBS: usize = 500;
/// Incidents remembered per agent, so one told is never told again.
const MAX_TOLD: usize = 64;
/// Incidents waiting to be told, per agent: more is an agent failing faster than the
/// operators' channel takes messages; the first of them say what started it, so later ones
/// are left out.
const MAX_PENDING: usize = 16;
/// An agent offline this long is an incident: a restart (every agent of a node, by
/// `setup-node.sh`) or a short network cut comes back well within it.
pub(crate) const OFFLINE_GRACE_MS: Millis = 5 * 60 * 1000;
/// The function that decides an incident tells it, and no one else may for this long: longer
/// than any function runs (the webhook's timeout is at most 15 minutes). Still untold then,
/// it was missed (the function was killed, or its post failed): the sweep tells it.
pub(crate) const DECIDER_LEASE_MS: Millis = 16 * 60 * 1000;
/// How long a sweep that takes an overdue incident holds it: its post is one short try.
pub(crate) const SWEEP_LEASE_MS: Millis = 2 * 60 * 1000;
/// Different submissions slowed down on one agent within a day before it is an incident (a
/// timed run throttled after the submission ran, or a GPU still hot or slowed after the
/// pre-flight's cool-down): one or two may be kernels heating their GPU; three on the same
/// agent point at the agent.
pub(crate) const HEAT_SUBMISSIONS: usize = 3;

/// A job an agent ran.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct SeenJob {
    pub(crate) job_id: String,
    pub(crate) at: Millis,
    pub(crate) infra: bool,
    /// A timed run stayed throttled on this agent after the submission ran.
    pub(crate) throttled: bool,
    /// It met the GPU slowed down or too hot: throttled, or refused by a pre-flight for a
    /// fault that may pass (what heat incidents count).
    pub(crate) hot: bool,
    /// The submission (run id) it was a try of.
    pub(crate) run_id: String,
}

/// Why and since when: a pause the agent's hook made, or an event that took it away.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Since {
    pub(crate) why: String,
    pub(crate) at: Millis,
}

/// An incident an operator must hear of, once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Incident {
    /// The node failed its checks on a job (`paused`: for a lasting fault, and its agent
    /// paused itself; `retried`: a later try ran elsewhere).
    Infra {
        job_id: String,
        reason: String,
        paused: bool,
        retried: bool,
    },
    /// `agent.lost` or `agent.disconnected`, and still not back [`OFFLINE_GRACE_MS`] later.
    Offline { event: String, since: Millis },
    /// [`HEAT_SUBMISSIONS`] different submissions met this agent slowed down or too hot
    /// within a day (a timed run throttled after it ran, or a pre-flight refused after the
    /// cool-down): the agent, not the kernels, may be what heats.
    Heat { submissions: usize, reason: String },
}

impl Incident {
    /// The metric's kind, and the words of logs.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Infra { .. } => "infra",
            Self::Offline { .. } => "offline",
            Self::Heat { .. } => "heat",
        }
    }
}

/// A pre-flight refusal (as its agent's note gives it, `reason: detail`) that may pass by
/// itself: a GPU still hot or slowed down after the cool-down, perhaps from the previous
/// job's kernel.
fn passing_fault(note: &str) -> bool {
    let reason = note.split(':').next().unwrap_or_default().trim();
    matches!(reason, "too_hot" | "clock_slowdown")
}

/// An incident decided but not yet told to the operators.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Pending {
    /// The key it was claimed by (`infra:<job>`, `offline:<since>`, `heat:<at>`).
    pub(crate) key: String,
    pub(crate) incident: Incident,
    /// When it was decided.
    pub(crate) at: Millis,
    /// Until when whoever holds it (the function that decided it, then a sweep that took
    /// it) may tell it and no one else may.
    #[serde(default)]
    pub(crate) until: Millis,
    /// The submission it came with, if any, for the message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) run_id: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct AgentRecord {
    pub(crate) name: String,
    pub(crate) queue: Queue,
    pub(crate) jobs: Vec<SeenJob>,
    /// Paused by its own hook after an infrastructure failure (until it runs a job again).
    pub(crate) paused: Option<Since>,
    /// Lost or disconnected (until it connects again or runs a job).
    pub(crate) offline: Option<Since>,
    /// What its last pre-flight (or failed check) read, and when.
    pub(crate) readings: Vec<GpuReading>,
    pub(crate) readings_at: Option<Millis>,
    /// The incidents already decided (told or waiting to be).
    pub(crate) told: Vec<String>,
    /// The incidents decided and not yet told, oldest first.
    pub(crate) pending: Vec<Pending>,
    /// When its last heat incident was decided: at most one a day.
    pub(crate) heat_told_at: Option<Millis>,
}

/// A try of a finished job, as an agent's record notes it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SeenTry<'a> {
    pub(crate) t: &'a Try,
    /// The submission it was a try of.
    pub(crate) run_id: &'a str,
    /// What the node read, for the try that left the result.
    pub(crate) readings: Option<&'a [GpuReading]>,
    /// A later try ran elsewhere.
    pub(crate) retried: bool,
    /// When this try ended, as Buildkite says (else when it was noted): a try older than a
    /// pause says nothing of what happened since.
    pub(crate) ended_at: Option<Millis>,
}

impl AgentRecord {
    pub(crate) fn new(name: &str, queue: &Queue) -> Self {
        Self {
            name: name.to_owned(),
            queue: queue.clone(),
            ..Self::default()
        }
    }

    /// Notes a try of a job that ended, at `now`; the incident it decided, if this try makes
    /// a new one (kept pending until told).
    pub(crate) fn saw_try(&mut self, seen: SeenTry<'_>, now: Millis) -> Option<Pending> {
        let t = seen.t;
        if self.jobs.iter().any(|j| j.job_id == t.job_id) {
            return None;
        }
        let hot = t.throttled || (t.infra && !t.paused && passing_fault(&t.reason));
        self.jobs.push(SeenJob {
            job_id: t.job_id.clone(),
            at: now,
            infra: t.infra,
            throttled: t.throttled,
            hot,
            run_id: seen.run_id.to_owned(),
        });
        self.forget_before(now - DAY_MS);
        if let Some(r) = seen.readings.filter(|r| !r.is_empty()) {
            self.readings = r.to_vec();
            self.readings_at = Some(now);
        }
        self.ran_job(t, seen.ended_at.unwrap_or(now));
        if hot {
            return self.heat(&t.reason, seen.run_id, now);
        }
        if !t.infra {
            return None;
        }
        let incident = Incident::Infra {
            job_id: t.job_id.clone(),
            reason: t.reason.clone(),
            paused: t.paused,
            retried: seen.retried,
        };
        let key = format!("infra:{}", t.job_id);
        self.decide(key, incident, Some(seen.run_id), now, DECIDER_LEASE_MS)
    }

    /// What a try it ran says of its pause: paused itself when its hook said so; resumed
    /// when a job it ran ended after the pause (a try noted late says nothing of since, and
    /// one whose agent was lost says nothing at all). Whether it is online is for agent events
    /// and the agents list to say: a try of a job that ended later may have been cut off by
    /// the very loss.
    fn ran_job(&mut self, t: &Try, ended_at: Millis) {
        if matches!(t.exit_status, None | Some(-1) | Some(255)) {
            return;
        }
        if t.paused {
            self.paused = Some(Since {
                why: t.reason.clone(),
                at: ended_at,
            });
        } else if self.paused.as_ref().is_some_and(|p| ended_at > p.at) {
            self.paused = None;
        }
    }

    /// A heat incident when the last day's tries on this agent that met it slowed down are
    /// of [`HEAT_SUBMISSIONS`] different submissions, and none was decided that day.
    fn heat(&mut self, reason: &str, run_id: &str, now: Millis) -> Option<Pending> {
        let mut runs: Vec<&str> = self
            .jobs
            .iter()
            .filter(|j| (j.hot || j.throttled) && j.at >= now - DAY_MS)
            .map(|j| j.run_id.as_str())
            .collect();
        runs.sort_unstable();
        runs.dedup();
        let recent = self.heat_told_at.is_some_and(|at| now - at < DAY_MS);
        if runs.len() < HEAT_SUBMISSIONS || recent {
            return None;
        }
        self.heat_told_at = Some(now);
        let incident = Incident::Heat {
            submissions: runs.len(),
            reason: reason.to_owned(),
        };
        let key = format!("heat:{now}");
        self.decide(key, incident, Some(run_id), now, DECIDER_LEASE_MS)
    }

    /// Notes an agent event at `now`: going offline is noted (an incident only once it has
    /// lasted [`OFFLINE_GRACE_MS`] and the agents list does not show it back, which the
    /// sweep decides: [`Self::offline_due`]), connecting clears it.
    pub(crate) fn saw_event(&mut self, event: &str, now: Millis) {
        match event {
            "agent.lost" | "agent.disconnected" if self.offline.is_none() => {
                self.offline = Some(Since {
                    why: event.to_owned(),
                    at: now,
                });
            }
            "agent.connected" => self.offline = None,
            _ => {}
        }
    }

    /// Whether it has been away [`OFFLINE_GRACE_MS`] with no incident decided for it yet:
    /// the moment to ask whether it is listed connected after all (an event lost or out of
    /// order) before deciding one.
    pub(crate) fn offline_due_soon(&self, now: Millis) -> bool {
        self.offline.as_ref().is_some_and(|o| {
            now - o.at >= OFFLINE_GRACE_MS && !self.told.contains(&format!("offline:{}", o.at))
        })
    }

    /// Listed connected by the agents API (in a list read at `listed_at`): back, if that was
    /// after it went away.
    pub(crate) fn seen_connected(&mut self, listed_at: Millis) {
        if self.offline.as_ref().is_some_and(|o| listed_at > o.at) {
            self.offline = None;
        }
    }

    /// The offline incident, once the agent has been away [`OFFLINE_GRACE_MS`]. The sweep
    /// decides it and tells it at once: held for [`SWEEP_LEASE_MS`] only.
    pub(crate) fn offline_due(&mut self, now: Millis) -> Option<Pending> {
        let since = self.offline.clone()?;
        if now - since.at < OFFLINE_GRACE_MS {
            return None;
        }
        let incident = Incident::Offline {
            event: since.why,
            since: since.at,
        };
        let key = format!("offline:{}", since.at);
        self.decide(key, incident, None, now, SWEEP_LEASE_MS)
    }

    /// The pending incidents no one holds at `now` (their decider's lease, or a sweep's, has
    /// run out), taken for a sweep to tell: held for [`SWEEP_LEASE_MS`]. Incidents a day old
    /// are dropped untold: the metric counted them, and a day late they help no one.
    pub(crate) fn take_overdue(&mut self, now: Millis) -> Vec<Pending> {
        self.pending.retain(|p| now - p.at < DAY_MS);
        let mut taken = Vec::new();
        for p in self.pending.iter_mut().filter(|p| p.until <= now) {
            p.until = now + SWEEP_LEASE_MS;
            taken.push(p.clone());
        }
        taken
    }

    /// Incident `key` was told: no longer pending.
    pub(crate) fn was_told(&mut self, key: &str) {
        self.pending.retain(|p| p.key != key);
    }

    /// Jobs, infrastructure failures and throttled runs since `from`.
    pub(crate) fn counts_since(&self, from: Millis) -> (usize, usize, usize) {
        let recent = self.jobs.iter().filter(|j| j.at >= from);
        let infra = recent.clone().filter(|j| j.infra).count();
        let throttled = recent.clone().filter(|j| j.throttled).count();
        (recent.count(), infra, throttled)
    }

    /// Decides `incident` under `key` unless it was decided before: kept pending until told,
    /// its decider's to tell for `lease`. The incident decided, to count and tell.
    fn decide(
        &mut self,
        key: String,
        incident: Incident,
        run_id: Option<&str>,
        now: Millis,
        lease: Millis,
    ) -> Option<Pending> {
        if !self.claim(key.clone()) {
            return None;
        }
        let pending = Pending {
            key,
            incident,
            at: now,
            until: now + lease,
            run_id: run_id.map(str::to_owned),
        };
        self.pending.retain(|p| now - p.at < DAY_MS);
        // Over the bound it is still decided, counted and told once, only not kept for the
        // sweep to tell again.
        if self.pending.len() < MAX_PENDING {
            self.pending.push(pending.clone());
        }
        Some(pending)
    }

    /// Whether `key` is newly decided (and now remembered).
    fn claim(&mut self, key: String) -> bool {
        if self.told.contains(&key) {
            return false;
        }
        self.told.push(key);
        let over = self.told.len().saturating_sub(MAX_TOLD);
        self.told.drain(..over);
        true
    }

    fn forget_before(&mut self, from: Millis) {
        self.jobs.retain(|j| j.at >= from);
        let over = self.jobs.len().saturating_sub(MAX_JOBS);
        self.jobs.drain(..over);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(job: &str, infra: bool) -> Try {
        Try {
            job_id: job.into(),
            agent: "gpu0".into(),
            exit_status: Some(if infra { 75 } else { 0 }),
            infra,
            paused: infra,
            result: !infra,
            reason: if infra {
                "ecc_errors: 3".into()
            } else {
                String::new()
            },
            ..Try::default()
        }
    }

    fn seen<'a>(t: &'a Try, run_id: &'a str, retried: bool) -> SeenTry<'a> {
        SeenTry {
            t,
            run_id,
            readings: None,
            retried,
            ended_at: None,
        }
    }

    /// Notes try `t` of `run_id`, of a job that ended at `at`, noted then.
    fn note(
        r: &mut AgentRecord,
        t: &Try,
        run_id: &str,
        retried: bool,
        at: Millis,
    ) -> Option<Incident> {
        let seen = SeenTry {
            ended_at: Some(at),
            ..seen(t, run_id, retried)
        };
        r.saw_try(seen, at).map(|p| p.incident)
    }

    #[test]
    fn an_infrastructure_failure_is_told_once_and_pauses_until_a_job_runs() {
        let mut r = AgentRecord::new("gpu0", &Queue::new("h100"));
        let first = note(&mut r, &t("j1", true), "r1", true, 1_000);
        assert_eq!(
            first,
            Some(Incident::Infra {
                job_id: "j1".into(),
                reason: "ecc_errors: 3".into(),
                paused: true,
                retried: true,
            })
        );
        assert_eq!(
            r.paused.as_ref().map(|p| p.why.as_str()),
            Some("ecc_errors: 3")
        );
        assert_eq!(r.pending.len(), 1, "kept until told");
        assert_eq!(r.pending[0].run_id.as_deref(), Some("r1"));
        // The same finish seen again (a webhook and the sweep): nothing new.
        assert_eq!(note(&mut r, &t("j1", true), "r1", true, 2_000), None);
        assert_eq!(r.counts_since(0), (1, 1, 0));
        // Another failure is another incident.
        assert!(note(&mut r, &t("j2", true), "r2", true, 3_000).is_some());
        // A job that ran: resumed.
        assert_eq!(note(&mut r, &t("j3", false), "r3", false, 4_000), None);
        assert_eq!(r.paused, None);
        assert_eq!(r.counts_since(0), (3, 2, 0));
        // A fault that does not last (a tool missing from the image) is told at once, and
        // pauses nothing.
        let missing = Try {
            paused: false,
            reason: "tool_missing: nvidia-smi is not on PATH".into(),
            ..t("j4", true)
        };
        assert!(note(&mut r, &missing, "r4", true, 5_000).is_some());
        assert_eq!(r.paused, None);
        // A GPU still hot after the pre-flight's cool-down may be the last kernel's heat:
        // counted with the throttled runs, no incident at first sight.
        let hot = Try {
            paused: false,
            reason: "too_hot: GPU 0 is at 90 °C, still after a 30 s cool-down".into(),
            ..t("j5", true)
        };
        assert_eq!(note(&mut r, &hot, "r5", true, 6_000), None);
        assert_eq!(r.counts_since(0), (5, 4, 0));
        // Told: no longer pending; the rest still are.
        let key = r.pending[0].key.clone();
        r.was_told(&key);
        assert_eq!(r.pending.len(), 2);
    }

    /// Three different submissions refused on one agent whose GPU stayed hot (or throttled
    /// after they ran) within a day are one heat incident, whichever mix.
    #[test]
    fn hot_pre_flights_and_throttled_runs_count_together() {
        let hot = |job: &str| Try {
            job_id: job.into(),
            infra: true,
            reason: "clock_slowdown: GPU 0 is slowed down: SwThermalSlowdown".into(),
            ..Try::default()
        };
        let throttled = Try {
            job_id: "j3".into(),
            throttled: true,
            reason: "throttled: SwThermalSlowdown".into(),
            ..Try::default()
        };
        let mut r = AgentRecord::new("gpu0", &Queue::new("h100"));
        assert_eq!(note(&mut r, &hot("j1"), "r1", true, 0), None);
        assert_eq!(note(&mut r, &hot("j2"), "r2", true, 1), None);
        let third = note(&mut r, &throttled, "r3", true, 2);
        assert!(
            matches!(third, Some(Incident::Heat { submissions: 3, .. })),
            "{third:?}"
        );
    }

    /// A job noted late (the sweep sending an old report) says nothing of what happened to
    /// the agent since it ended: it neither brings it back online nor lifts its pause.
    #[test]
    fn a_job_noted_late_does_not_undo_a_later_event() {
        let mut r = AgentRecord::new("gpu0", &Queue::new("h100"));
        r.saw_event("agent.lost", 10_000);
        r.paused = Some(Since {
            why: "ecc_errors: 1".into(),
            at: 10_000,
        });
        let ran = t("old", false);
        let late = SeenTry {
            ended_at: Some(5_000),
            ..seen(&ran, "r0", false)
        };
        r.saw_try(late, 600_000);
        assert!(r.offline.is_some() && r.paused.is_some(), "{r:?}");
        // Listed connected in a list read before it went away: still away; after: back.
        r.seen_connected(9_000);
        assert!(r.offline.is_some());
        r.seen_connected(11_000);
        assert_eq!(r.offline, None);
        // A try whose agent was lost says nothing, whenever it ended.
        let lost = Try {
            exit_status: Some(-1),
            ..t("lost", false)
        };
        note(&mut r, &lost, "r2", true, 650_000);
        assert!(r.paused.is_some(), "a lost try lifts no pause");
        // A job that ended after the pause: it was resumed.
        note(&mut r, &t("new", false), "r1", false, 700_000);
        assert_eq!(r.paused, None);
    }

    /// A run that stayed throttled after the submission ran is not the agent's incident at
    /// first sight: only the third submission within a day on the same agent is, once.
    #[test]
    fn throttled_runs_are_an_incident_only_for_three_submissions_a_day() {
        let throttled = |job: &str| Try {
            job_id: job.into(),
            exit_status: Some(76),
            throttled: true,
            reason: "throttled: SwThermalSlowdown".into(),
            ..Try::default()
        };
        let hour = 3_600_000;
        // (job, run, at, an incident?)
        let table: &[(&str, &str, Millis, bool)] = &[
            ("j1", "r1", 0, false),
            // The same submission again (a retry that came back here): one submission.
            ("j2", "r1", hour, false),
            ("j3", "r2", 2 * hour, false),
            ("j4", "r3", 3 * hour, true),
            // A fourth the same day: told already.
            ("j5", "r4", 4 * hour, false),
            // A day on, the first ones forgotten, but within a day of the incident: none.
            ("j6", "r5", DAY_MS + 2 * hour, false),
            // A day after it, r4, r5 and r6 are three again: a new one.
            ("j7", "r6", DAY_MS + 4 * hour, true),
        ];
        let mut r = AgentRecord::new("gpu0", &Queue::new("h100"));
        r.paused = Some(Since::default());
        for (job, run, at, incident) in table {
            let got = note(&mut r, &throttled(job), run, true, *at);
            assert_eq!(got.is_some(), *incident, "{job} {run}");
            if let Some(Incident::Heat { submissions, .. }) = got {
                assert_eq!(submissions, 3, "{job}");
            }
        }
        assert_eq!(r.paused, None, "a throttled run never pauses; it ran a job");
        assert_eq!(r.counts_since(0), (3, 0, 3), "the last day's: j5, j6, j7");
    }

    #[test]
    fn an_agent_offline_is_an_incident_only_when_it_stays_away() {
        let grace = OFFLINE_GRACE_MS;
        // (what happens, at, an incident?)
        let table: &[(&str, Millis, bool)] = &[
            ("agent.lost", 0, false),
            ("agent.lost", 1_000, false),
            ("agent.disconnected", 2_000, false),
            ("due", grace - 1, false),
            ("due", grace, true),
            ("due", grace + 60_000, false),
            ("agent.stopping", grace + 120_000, false),
            // Back, then a restart: away for seconds only.
            ("agent.connected", grace + 180_000, false),
            ("agent.disconnected", 2 * grace, false),
            ("agent.connected", 2 * grace + 10_000, false),
            ("due", 4 * grace, false),
            // Away again: a later event of it decides nothing (the sweep decides, once it has
            // asked the agents list).
            ("agent.lost", 5 * grace, false),
            ("agent.stopped", 6 * grace, false),
            ("due", 6 * grace, true),
        ];
        let mut r = AgentRecord::new("gpu0", &Queue::new("h100"));
        for (i, (what, at, told)) in table.iter().enumerate() {
            let got = match *what {
                "due" => r.offline_due(*at).is_some(),
                event => {
                    r.saw_event(event, *at);
                    false
                }
            };
            assert_eq!(got, *told, "{i}: {what} at {at}");
        }
        // A try it ran says nothing of whether it is online: the job may have ended after the
        // very loss (retried elsewhere). The agents list does.
        r.offline = Some(Since::default());
        note(&mut r, &t("j1", false), "r1", false, 7 * grace);
        assert!(r.offline.is_some());
        r.seen_connected(7 * grace);
        assert_eq!(r.offline, None);
    }

    /// The decider holds an incident for its lease; then a sweep may take it, once, for its
    /// own lease; a day old, it is dropped. The first [`MAX_PENDING`] are kept.
    #[test]
    fn pending_incidents_are_held_by_one_teller_at_a_time_and_bounded() {
        let mut r = AgentRecord::new("gpu0", &Queue::new("h100"));
        note(&mut r, &t("j1", true), "r1", false, 0);
        assert!(
            r.take_overdue(DECIDER_LEASE_MS - 1).is_empty(),
            "its decider's"
        );
        let taken = r.take_overdue(DECIDER_LEASE_MS);
        assert_eq!(taken.len(), 1);
        assert!(
            r.take_overdue(DECIDER_LEASE_MS + 1).is_empty(),
            "a second sweep finds it taken"
        );
        let again = DECIDER_LEASE_MS + SWEEP_LEASE_MS;
        assert_eq!(r.take_overdue(again).len(), 1, "the sweep's post failed");
        assert!(r.take_overdue(DAY_MS).is_empty(), "a day old: dropped");
        assert!(r.pending.is_empty());
        for i in 0..40 {
            note(&mut r, &t(&format!("k{i}"), true), "r", false, DAY_MS + i);
        }
        assert_eq!(r.pending.len(), MAX_PENDING);
        assert_eq!(r.pending[0].key, "infra:k0", "the first are kept");
    }

    #[test]
    fn the_last_day_is_counted_and_older_jobs_forgotten() {
        let mut r = AgentRecord::new("gpu0", &Queue::new("h100"));
        note(&mut r, &t("old", true), "r0", false, 0);
        let readings = [GpuReading::default()];
        let ran = t("new", false);
        let new = SeenTry {
            readings: Some(&readings),
            ..seen(&ran, "r1", false)
        };
        r.saw_try(new, DAY_MS + 10);
        assert_eq!(r.counts_since(10), (1, 0, 0));
        assert_eq!(r.jobs.len(), 1, "the job of a day ago is forgotten");
        assert_eq!(r.readings_at, Some(DAY_MS + 10));
    }

    #[test]
    fn a_record_of_before_reads_with_nothing_pending() {
        let old = r#"{"name":"gpu0","queue":"h100","jobs":[{"job_id":"j","at":1,"infra":true}],
            "paused":null,"offline":null,"readings":[],"readings_at":null,"told":["infra:j"]}"#;
        let r: AgentRecord = serde_json::from_str(old).unwrap();
        assert!(r.pending.is_empty() && r.heat_told_at.is_none());
        assert_eq!(r.counts_since(0), (1, 1, 0));
    }
}
