//! What the service keeps of each GPU agent of its queues, and when an operator must hear
//! of it: a pure record per agent, changed by the tries of finished jobs and by agent
//! events, which says which incident is new (one message per agent and incident).

use serde::{Deserialize, Serialize};

use crate::result::{GpuReading, Try};
use crate::time::Millis;

/// The fleet view counts the last day.
pub(crate) const DAY_MS: Millis = 86_400_000;
/// Jobs kept per agent (a GPU runs a few hundred a day at most; the record is rewritten whole
/// at each try, so it stays small).
const MAX_JOBS: usize = 500;
/// Incidents remembered per agent, so one told is never told again.
const MAX_TOLD: usize = 64;

/// A job an agent ran.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct SeenJob {
    pub(crate) job_id: String,
    pub(crate) at: Millis,
    pub(crate) infra: bool,
}

/// Why and since when: a pause the agent's hook made, or an event that took it away.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Since {
    pub(crate) why: String,
    pub(crate) at: Millis,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct AgentRecord {
    pub(crate) name: String,
    pub(crate) queue: String,
    pub(crate) jobs: Vec<SeenJob>,
    /// Paused by its own hook after an infrastructure failure (until it runs a job again).
    pub(crate) paused: Option<Since>,
    /// Lost or disconnected (until it connects again).
    pub(crate) offline: Option<Since>,
    /// What its last pre-flight (or failed check) read, and when.
    pub(crate) readings: Vec<GpuReading>,
    pub(crate) readings_at: Option<Millis>,
    /// The incidents already told to the operators.
    pub(crate) told: Vec<String>,
}

/// An incident an operator must hear of, once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Incident {
    /// The node failed its checks on a job (`paused`: for a lasting fault, and its agent
    /// paused itself; `retried`: a later try ran elsewhere).
    Infra {
        job_id: String,
        reason: String,
        paused: bool,
        retried: bool,
    },
    /// `agent.lost` or `agent.disconnected`.
    Offline { event: String },
}

impl AgentRecord {
    pub(crate) fn new(name: &str, queue: &str) -> Self {
        Self {
            name: name.to_owned(),
            queue: queue.to_owned(),
            ..Self::default()
        }
    }

    /// Notes try `t` of a job that ended at `now`, with what the node read (`readings`,
    /// for the try that left the result). The incident to tell, if this try is one and new.
    pub(crate) fn saw_try(
        &mut self,
        t: &Try,
        readings: Option<&[GpuReading]>,
        retried: bool,
        now: Millis,
    ) -> Option<Incident> {
        if self.jobs.iter().any(|j| j.job_id == t.job_id) {
            return None;
        }
        self.jobs.push(SeenJob {
            job_id: t.job_id.clone(),
            at: now,
            infra: t.infra,
        });
        self.forget_before(now - DAY_MS);
        if let Some(r) = readings.filter(|r| !r.is_empty()) {
            self.readings = r.to_vec();
            self.readings_at = Some(now);
        }
        if !t.infra {
            // It ran a job: whatever paused it is over.
            self.paused = None;
            return None;
        }
        if t.paused {
            self.paused = Some(Since {
                why: t.reason.clone(),
                at: now,
            });
        }
        self.claim(format!("infra:{}", t.job_id))
            .then(|| Incident::Infra {
                job_id: t.job_id.clone(),
                reason: t.reason.clone(),
                paused: t.paused,
                retried,
            })
    }

    /// Notes an agent event at `now`; the incident to tell, if it starts one.
    pub(crate) fn saw_event(&mut self, event: &str, now: Millis) -> Option<Incident> {
        match event {
            "agent.lost" | "agent.disconnected" if self.offline.is_none() => {
                self.offline = Some(Since {
                    why: event.to_owned(),
                    at: now,
                });
                self.claim(format!("offline:{now}"))
                    .then(|| Incident::Offline {
                        event: event.to_owned(),
                    })
            }
            "agent.connected" => {
                self.offline = None;
                None
            }
            _ => None,
        }
    }

    /// Jobs and infrastructure failures since `from`.
    pub(crate) fn counts_since(&self, from: Millis) -> (usize, usize) {
        let recent = self.jobs.iter().filter(|j| j.at >= from);
        let infra = recent.clone().filter(|j| j.infra).count();
        (recent.count(), infra)
    }

    /// Whether `key` is newly told (and now remembered as told).
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
        }
    }

    #[test]
    fn an_infrastructure_failure_is_told_once_and_pauses_until_a_job_runs() {
        let mut r = AgentRecord::new("gpu0", "h100");
        let first = r.saw_try(&t("j1", true), None, true, 1_000);
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
        // The same finish seen again (a webhook and the sweep): nothing new.
        assert_eq!(r.saw_try(&t("j1", true), None, true, 2_000), None);
        assert_eq!(r.counts_since(0), (1, 1));
        // Another failure is another incident.
        assert!(r.saw_try(&t("j2", true), None, true, 3_000).is_some());
        // A job that ran: resumed.
        assert_eq!(r.saw_try(&t("j3", false), None, false, 4_000), None);
        assert_eq!(r.paused, None);
        assert_eq!(r.counts_since(0), (3, 2));
        // A passing fault (a hot GPU) is told, and pauses nothing.
        let hot = Try {
            paused: false,
            ..t("j4", true)
        };
        assert!(r.saw_try(&hot, None, true, 5_000).is_some());
        assert_eq!(r.paused, None);
    }

    #[test]
    fn an_agent_lost_is_one_incident_until_it_connects_again() {
        let table: &[(&str, bool)] = &[
            ("agent.lost", true),
            ("agent.lost", false),
            ("agent.disconnected", false),
            ("agent.stopping", false),
            ("agent.connected", false),
            ("agent.disconnected", true),
        ];
        let mut r = AgentRecord::new("gpu0", "h100");
        for (i, (event, told)) in table.iter().enumerate() {
            let got = r.saw_event(event, i as Millis);
            assert_eq!(got.is_some(), *told, "{i}: {event}");
        }
    }

    #[test]
    fn the_last_day_is_counted_and_older_jobs_forgotten() {
        let mut r = AgentRecord::new("gpu0", "h100");
        r.saw_try(&t("old", true), None, false, 0);
        r.saw_try(
            &t("new", false),
            Some(&[GpuReading::default()]),
            false,
            DAY_MS + 10,
        );
        assert_eq!(r.counts_since(10), (1, 0));
        assert_eq!(r.jobs.len(), 1, "the job of a day ago is forgotten");
        assert_eq!(r.readings_at, Some(DAY_MS + 10));
    }
}
