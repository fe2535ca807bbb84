//! The GPU fleet as operators see it: each finished job's tries noted on their agents'
//! records, agent events of our queues noted too, each new incident told once to the
//! operators' Discord channel and counted (`GpuIncidents`, alarmed), and `GET /fleet`.
//! Records live in the store's shared values (`~agent/<name>`, listed in `~fleet`),
//! changed by compare-and-swap, so two instances seeing one finish tell it once.

use serde::Serialize;
use tracing::{info, warn};

use super::Deps;
use super::queues::{self, QueueError};
use super::rules::fleet::{AgentRecord, DAY_MS, Incident, Since};
use super::rules::tries::{MAX_NAME_CHARS, clean};
use crate::buildkite::Agent;
use crate::discord::{AllowedMentions, Message};
use crate::jobs::{CacheEntry, Job, StoreError};
use crate::result::{GpuReading, Outcome};
use crate::retry::{Deadline, Policy};
use crate::telemetry::metrics::Unit;
use crate::text::{plain, span};
use crate::time::Millis;

/// The store key listing every agent that has a record (`~` never starts a run id).
const FLEET_KEY: &str = "~fleet";
/// A record changed by many at once gives up after this many tries (it is only a count).
const MAX_TRIES: usize = 8;
/// Agents the fleet's list holds at most (one item in the store): donated nodes number tens.
const MAX_AGENTS: usize = 1000;
/// The operators' post is one try this long at most: the user's report went first, and the
/// metric's alarm holds when the post fails.
const OPS_POST: std::time::Duration = std::time::Duration::from_secs(5);

fn agent_key(name: &str) -> String {
    format!("~agent/{name}")
}

/// After `job` ended (written by this instance): each try's agent notes it, and each
/// infrastructure failure is told to the operators once.
pub(crate) async fn record_finish(d: &Deps, job: &Job, deadline: Deadline) {
    let Some(outcome) = job.outcome.as_deref() else {
        return;
    };
    let now = d.clock.now();
    let last = outcome.tries.len().saturating_sub(1);
    for (i, t) in outcome.tries.iter().enumerate() {
        if t.agent.is_empty() {
            continue;
        }
        let readings = t.result.then(|| readings_of(outcome)).flatten();
        let retried = i < last;
        let seen = |r: &mut AgentRecord| r.saw_try(t, readings, retried, now);
        match update(d, &t.agent, &job.queue, seen).await {
            Ok(Some(incident)) => {
                tell(d, &t.agent, &job.queue, &incident, Some(job), deadline).await;
            }
            Ok(None) => {}
            Err(e) => {
                warn!(error = %e, agent = %t.agent, "the agent's record could not be written")
            }
        }
    }
}

/// What the node read before the last try: its failed check's readings, else its
/// pre-flight's.
fn readings_of(outcome: &Outcome) -> Option<&[GpuReading]> {
    let result = outcome.result.as_ref()?;
    match (&result.infra, &result.preflight) {
        (Some(infra), _) if !infra.readings.is_empty() => Some(&infra.readings),
        (_, Some(p)) => Some(&p.readings),
        _ => None,
    }
}

/// An agent event (`agent.lost`, `agent.connected`, …): noted on the agent's record when
/// it serves one of our queues; a new incident is told. Whether it was one of ours.
pub(crate) async fn on_agent_event(
    d: &Deps,
    event: &str,
    agent: &Agent,
    deadline: Deadline,
) -> Result<bool, StoreError> {
    let queue = agent.queue();
    if !d.config.queues.serves(queue) {
        info!(event, queue, "an agent event of a queue we do not serve");
        return Ok(false);
    }
    let name = clean(&agent.name, MAX_NAME_CHARS);
    if name.is_empty() || name.chars().count() < agent.name.trim().chars().count() {
        warn!(
            event,
            queue, "an agent event whose agent name is empty or too long"
        );
        return Ok(false);
    }
    let now = d.clock.now();
    if let Some(incident) = update(d, &name, queue, |r| r.saw_event(event, now)).await? {
        tell(d, &name, queue, &incident, None, deadline).await;
    }
    Ok(true)
}

/// Reads, changes and writes agent `name`'s record if nobody wrote it in between (else
/// again, on what they wrote); what `change` said of the version written.
async fn update<T>(
    d: &Deps,
    name: &str,
    queue: &str,
    change: impl Fn(&mut AgentRecord) -> Option<T>,
) -> Result<Option<T>, StoreError> {
    let key = agent_key(name);
    for _ in 0..MAX_TRIES {
        let entry = d.store.cached(&key).await?;
        let mut record: AgentRecord = entry
            .as_ref()
            .and_then(|e| serde_json::from_str(e.value.as_deref()?).ok())
            .unwrap_or_else(|| AgentRecord::new(name, queue));
        let before = record.clone();
        let said = change(&mut record);
        if record == before {
            return Ok(said);
        }
        let version = entry.as_ref().map(|e| e.claimed_at);
        let next = CacheEntry {
            value: Some(serde_json::to_string(&record).map_err(StoreError::corrupt)?),
            fetched_at: d.clock.now(),
            claimed_at: version.unwrap_or(0) + 1,
        };
        if d.store.put_cached(&key, &next, version).await? {
            // Listed with its first record. A listing that fails loses the agent from the
            // fleet view, never the incident just decided.
            if version.is_none()
                && let Err(e) = list_agent(d, name).await
            {
                warn!(error = %e, agent = name, "the agent could not be added to the fleet's list");
            }
            return Ok(said);
        }
    }
    Err(StoreError::unavailable("the agent's record kept changing"))
}

/// Adds `name` to the fleet's list of agents with records.
async fn list_agent(d: &Deps, name: &str) -> Result<(), StoreError> {
    for _ in 0..MAX_TRIES {
        let entry = d.store.cached(FLEET_KEY).await?;
        let mut names = names_in(entry.as_ref());
        if names.iter().any(|n| n == name) {
            return Ok(());
        }
        if names.len() >= MAX_AGENTS {
            warn!(
                agent = name,
                "the fleet's list is full; the agent is not listed"
            );
            return Ok(());
        }
        names.push(name.to_owned());
        let version = entry.as_ref().map(|e| e.claimed_at);
        let next = CacheEntry {
            value: Some(serde_json::to_string(&names).map_err(StoreError::corrupt)?),
            fetched_at: d.clock.now(),
            claimed_at: version.unwrap_or(0) + 1,
        };
        if d.store.put_cached(FLEET_KEY, &next, version).await? {
            return Ok(());
        }
    }
    Err(StoreError::unavailable("the fleet's list kept changing"))
}

fn names_in(entry: Option<&CacheEntry>) -> Vec<String> {
    entry
        .and_then(|e| serde_json::from_str(e.value.as_deref()?).ok())
        .unwrap_or_default()
}

/// Counts the incident and posts it to the operators' channel, when there is one. A post
/// that fails is logged: the metric's alarm still tells the operators.
async fn tell(
    d: &Deps,
    agent: &str,
    queue: &str,
    incident: &Incident,
    job: Option<&Job>,
    deadline: Deadline,
) {
    let kind = match incident {
        Incident::Infra { .. } => "infra",
        Incident::Offline { .. } => "offline",
    };
    // By kind only: the alarm in template.yaml names each series (the queue is in the log
    // line and the message).
    d.metrics
        .put(&[("Kind", kind)], &[("GpuIncidents", Unit::Count, 1.0)]);
    warn!(agent, queue, kind, "GPU incident");
    let Some(target) = &d.ops_discord else {
        return;
    };
    let message = Message {
        content: incident_text(agent, queue, incident, job),
        embeds: Vec::new(),
        allowed_mentions: AllowedMentions::default(),
        file: None,
    };
    let once = d.discord.clone().with_retry(Policy {
        attempts: 1,
        ..Policy::default()
    });
    let deadline = Deadline::after(OPS_POST.min(deadline.remaining()));
    if let Err(e) = once.post(target, &message, deadline).await {
        warn!(error = %e, agent, "the operators' channel could not be told");
    }
}

/// The operators' message: which agent, what happened, and what the service did about it.
pub(crate) fn incident_text(
    agent: &str,
    queue: &str,
    incident: &Incident,
    job: Option<&Job>,
) -> String {
    let who = format!("Agent {} (queue {})", span(agent), span(queue));
    match incident {
        Incident::Infra {
            reason,
            paused,
            retried,
            ..
        } => {
            let run = job.map_or(String::new(), |j| {
                format!(" Run {}.", span(j.run_id.as_str()))
            });
            let then = match (paused, retried) {
                (true, true) => " It paused itself; the job was retried on another agent.",
                (true, false) => {
                    " It paused itself; no retry was left, so the job ended as an infrastructure failure."
                }
                (false, true) => {
                    " Retried on another agent; it was not paused (the fault may pass)."
                }
                (false, false) => " It was not paused (the fault may pass); no retry was left.",
            };
            let resume = if *paused {
                " Resume it once the GPU is healthy: Resume on its page in Buildkite, or `bk agent resume <agent id>`."
            } else {
                ""
            };
            format!(
                "⚠️ {who} failed the GPU checks: {}.{then}{run}{resume}",
                plain(reason)
            )
        }
        Incident::Offline { event } => format!(
            "🔌 {who}: {}. Its jobs run on the queue's other agents until it connects again.",
            plain(event)
        ),
    }
}

/// One agent of our queues, as `GET /fleet` shows it.
#[derive(Debug, PartialEq, Serialize)]
pub struct FleetAgent {
    pub name: String,
    pub queue: String,
    /// `connected` when the agents API lists it; else the last event's state (`lost`, …).
    pub connection_state: String,
    pub busy: bool,
    pub paused: bool,
    /// Why, and since when (ms since the epoch), as its hook or the API said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_why: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_since: Option<Millis>,
    pub jobs_24h: usize,
    pub infra_failures_24h: usize,
    /// Its last pre-flight's readings (or its failed check's), and when.
    pub readings: Vec<GpuReading>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readings_at: Option<Millis>,
}

/// Every agent of our queues: those the (cached) agents API lists, and those we have a
/// record of, by queue and name.
pub async fn view(d: &Deps, deadline: Deadline) -> Result<Vec<FleetAgent>, QueueError> {
    // The records are the store's: shown even when the agents API fails, with the last
    // list that came (an agent not in it reads as not connected).
    let seen = match queues::agents(d, deadline).await {
        Ok(seen) => seen,
        Err(QueueError::Store(e)) => return Err(QueueError::Store(e)),
        Err(e) => {
            warn!(error = %e, "the agents list could not be read; the last one is shown");
            queues::cached_agents(d).await?
        }
    };
    let names = names_in(d.store.cached(FLEET_KEY).await?.as_ref());
    let mut records = Vec::new();
    for name in &names {
        let entry = d.store.cached(&agent_key(name)).await?;
        if let Some(r) = entry.and_then(|e| serde_json::from_str(e.value.as_deref()?).ok()) {
            records.push(r);
        }
    }
    Ok(fleet(d, &seen, records))
}

/// The rows, from the agents seen connected and the records kept.
fn fleet(d: &Deps, seen: &[queues::SeenAgent], records: Vec<AgentRecord>) -> Vec<FleetAgent> {
    let now = d.clock.now();
    let ours = |q: &str| d.config.queues.serves(q);
    let mut rows: Vec<FleetAgent> = records
        .into_iter()
        .filter(|r| ours(&r.queue))
        .map(|r| row(r, seen, now))
        .collect();
    for a in seen.iter().filter(|a| ours(&a.queue)) {
        if !rows.iter().any(|r| r.name == a.name) {
            rows.push(row(AgentRecord::new(&a.name, &a.queue), seen, now));
        }
    }
    rows.sort_by(|a, b| (&a.queue, &a.name).cmp(&(&b.queue, &b.name)));
    rows
}

fn row(r: AgentRecord, seen: &[queues::SeenAgent], now: Millis) -> FleetAgent {
    let listed = seen.iter().find(|a| a.name == r.name);
    let connection_state = match (listed, &r.offline) {
        (Some(_), _) => "connected".to_owned(),
        (None, Some(Since { why, .. })) => why.trim_start_matches("agent.").to_owned(),
        (None, None) => "not connected".to_owned(),
    };
    let (jobs_24h, infra_failures_24h) = r.counts_since(now - DAY_MS);
    // The agents API says whether it is paused now (resumed by hand, or timed out); the
    // record says why its hook paused it, and since when.
    let ours = r.paused.as_ref().map(|p| (p.why.clone(), p.at));
    let (paused_why, paused_since) = match listed {
        Some(a) if !a.paused => (None, None),
        Some(a) => match ours {
            Some((why, at)) => (Some(why), Some(at)),
            None => (
                Some(clean(a.paused_note.as_deref().unwrap_or("paused"), 200)),
                None,
            ),
        },
        None => ours.map_or((None, None), |(why, at)| (Some(why), Some(at))),
    };
    FleetAgent {
        connection_state,
        busy: listed.is_some_and(|a| a.busy),
        paused: paused_why.is_some(),
        paused_why,
        paused_since,
        jobs_24h,
        infra_failures_24h,
        readings: r.readings,
        readings_at: r.readings_at,
        name: r.name,
        queue: r.queue,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_incident_names_the_agent_and_what_to_do_and_pings_no_one() {
        let infra = |paused, retried| Incident::Infra {
            job_id: "j".into(),
            reason: "ecc_errors: 3 @everyone **now**".into(),
            paused,
            retried,
        };
        let text = incident_text("node-gpu0", "h100", &infra(false, false), None);
        assert!(
            text.contains("not paused") && text.contains("no retry was left"),
            "{text}"
        );
        assert!(!text.contains("Resume"), "{text}");
        let text = incident_text("node-gpu0", "h100", &infra(true, true), None);
        assert!(
            text.starts_with("⚠️ Agent `node-gpu0` (queue `h100`)"),
            "{text}"
        );
        assert!(
            text.contains("retried on another agent") && text.contains("bk agent resume"),
            "{text}"
        );
        assert!(
            !text.contains("**now**"),
            "the node's note is plain text: {text}"
        );
        let offline = Incident::Offline {
            event: "agent.lost".into(),
        };
        let text = incident_text("node-gpu0", "h100", &offline, None);
        assert!(
            text.contains("agent.lost") && text.contains("other agents"),
            "{text}"
        );
    }
}
