//! The GPU fleet as operators see it: each finished job's tries noted on their agents'
//! records before its report goes out, agent events of our queues noted too, each new
//! incident told once to the operators' Discord channel and counted (`GpuIncidents`,
//! alarmed), and `GET /fleet`. Records live in the store's shared values (`~agent/<name>`,
//! listed in `~fleet`), changed by compare-and-swap, so two instances seeing one finish
//! decide its incident once. An incident is kept on its record until told: what a killed
//! function or a failed post left, and agents that stayed offline, the sweep tells
//! ([`sweep_fleet`]).

use serde::Serialize;
use tracing::{info, warn};

use super::Deps;
use super::queues::{self, QueueError};
use super::rules::fleet::{AgentRecord, DAY_MS, Incident, Pending, SeenTry, Since};
use super::rules::tries::{MAX_NAME_CHARS, clean};
use crate::buildkite::Agent;
use crate::discord::{AllowedMentions, Message, Priority};
use crate::jobs::shared::{self, First};
use crate::jobs::{Job, Queue, SharedKey, StoreError};
use crate::result::{GpuReading, Outcome};
use crate::retry::{Deadline, Policy};
use crate::telemetry::metrics::Unit;
use crate::text::{plain, span};
use crate::time::Millis;

/// Agents the fleet's list holds at most (one item in the store): donated nodes number tens.
const MAX_AGENTS: usize = 1000;
/// The operators' post is one try this long at most: the user's report went first, and an
/// incident whose post fails is told by the sweep.
const OPS_POST: std::time::Duration = std::time::Duration::from_secs(5);

/// An incident decided on an agent's record, to be told.
#[derive(Clone, Debug)]
pub(crate) struct Noted {
    agent: String,
    queue: Queue,
    pending: Pending,
}

/// Before `job`'s report goes out: each try's agent notes it, and each incident it makes is
/// decided (counted, and kept on the agent's record until told). Only a job that ended
/// within the last day is noted: an operator's resend of an old report changes no record.
/// What this instance decided, to tell once the report is out.
pub(crate) async fn note_finish(d: &Deps, job: &Job) -> Vec<Noted> {
    let Some(outcome) = job.outcome.as_deref() else {
        return Vec::new();
    };
    let now = d.clock.now();
    if now - job.created_at >= DAY_MS {
        return Vec::new();
    }
    let last = outcome.tries.len().saturating_sub(1);
    let mut noted = Vec::new();
    for (i, t) in outcome.tries.iter().enumerate() {
        if t.agent.is_empty() {
            continue;
        }
        let seen = SeenTry {
            t,
            run_id: job.run_id.as_str(),
            readings: t.result.then(|| readings_of(outcome)).flatten(),
            retried: i < last,
            ended_at: t.finished_at,
        };
        let decide = |r: &mut AgentRecord| r.saw_try(seen, now);
        match update(d, &t.agent, &job.queue, decide).await {
            Ok(Some(pending)) => {
                count(d, &t.agent, &job.queue, &pending.incident);
                noted.push(Noted {
                    agent: t.agent.clone(),
                    queue: job.queue.clone(),
                    pending,
                });
            }
            Ok(None) => {}
            Err(e) => {
                warn!(error = %e, agent = %t.agent, "the agent's record could not be written")
            }
        }
    }
    noted
}

/// Tells each incident in `noted` to the operators; one told is no longer pending on its
/// record, one whose post failed stays for the sweep.
pub(crate) async fn tell_noted(d: &Deps, noted: Vec<Noted>, deadline: Deadline) {
    for n in noted {
        tell(d, &n.agent, &n.queue, &n.pending, deadline).await;
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
/// it serves one of our queues (going offline becomes an incident only if it lasts, see
/// [`sweep_fleet`]). Whether it was one of ours.
pub(crate) async fn on_agent_event(
    d: &Deps,
    event: &str,
    agent: &Agent,
) -> Result<bool, StoreError> {
    let queue = Queue::new(agent.queue());
    if !d.config.queues.serves(&queue) {
        info!(event, %queue, "an agent event of a queue we do not serve");
        return Ok(false);
    }
    let name = clean(&agent.name, MAX_NAME_CHARS);
    if name.is_empty() || name.chars().count() < agent.name.trim().chars().count() {
        warn!(
            event,
            %queue, "an agent event whose agent name is empty or too long"
        );
        return Ok(false);
    }
    let now = d.clock.now();
    let noted = |r: &mut AgentRecord| {
        r.saw_event(event, now);
        Some(())
    };
    update(d, &name, &queue, noted).await?;
    Ok(true)
}

/// What the sweep's look at the fleet did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct FleetSwept {
    /// Incidents told to the operators.
    pub(crate) told: usize,
    /// Agents whose record could not be read or written (the next pass looks again).
    pub(crate) errors: usize,
}

/// The sweep's look at the fleet within `deadline`: an agent offline past the grace (and not
/// listed connected by the agents API after all) becomes an incident, and every incident a
/// function decided but did not tell (killed mid-delivery, or its post failed) is told. A
/// pass starts at another agent, so a short one does not always serve the same ones.
pub(crate) async fn sweep_fleet(d: &Deps, deadline: Deadline) -> Result<FleetSwept, StoreError> {
    let names = fleet_names(d).await?;
    // Passes come every few minutes: a hash of the time spreads their starts over the list.
    let spread = (d.clock.now() / 1000)
        .unsigned_abs()
        .wrapping_mul(2_654_435_761)
        >> 16;
    let start = usize::try_from(spread).unwrap_or(0) % names.len().max(1);
    let mut listing = Listing::default();
    let mut swept = FleetSwept::default();
    let mut gone = Vec::new();
    for name in names.iter().cycle().skip(start).take(names.len()) {
        if deadline.remaining() < OPS_POST {
            break;
        }
        match sweep_agent(d, name, &mut listing, deadline).await {
            Ok(Some(told)) => swept.told += told,
            Ok(None) => gone.push(name.as_str()),
            Err(e) => {
                warn!(error = %e, agent = %name, "the agent's record could not be swept");
                swept.errors += 1;
            }
        }
    }
    if let Err(e) = forget_gone(d, gone).await {
        warn!(error = %e, "agents whose records expired could not be taken off the fleet's list");
        swept.errors += 1;
    }
    Ok(swept)
}

/// Takes `gone` (agents whose records had expired when the pass looked) off the fleet's
/// list, but for any whose record has been made again since (the agent came back).
async fn forget_gone(d: &Deps, gone: Vec<&str>) -> Result<(), StoreError> {
    let mut still = Vec::new();
    for name in gone {
        if read_record(d, name).await?.is_none() {
            still.push(name);
        }
    }
    if still.is_empty() {
        return Ok(());
    }
    let prune = |names: &mut Vec<String>| names.retain(|n| !still.contains(&n.as_str()));
    let now = d.clock.now();
    shared::update(d.store.as_ref(), SharedKey::Fleet, now, Vec::new, prune).await?;
    info!(
        ?still,
        "agents not seen for a month taken off the fleet's list"
    );
    Ok(())
}

/// The agents the agents API lists connected, read once a pass and only when an agent's
/// offline incident is due: an event lost or come out of order must not make one.
#[derive(Default)]
struct Listing {
    read: bool,
    connected: Option<(Vec<String>, Millis)>,
}

impl Listing {
    /// When a list that names `name` was read, if one does.
    async fn connected_at(&mut self, d: &Deps, name: &str, deadline: Deadline) -> Option<Millis> {
        if !self.read {
            self.read = true;
            // The list may be a cached one (another instance refreshed it, or Buildkite's
            // window is spent): what it says is as of when it was read.
            let listed = match queues::agents(d, deadline).await {
                Ok(list) => queues::agents_read_at(d)
                    .await
                    .map(|at| at.map(|at| (list, at)))
                    .map_err(QueueError::Store),
                Err(e) => Err(e),
            };
            match listed {
                Ok(Some((list, at))) => {
                    let names = list.into_iter().map(|a| a.name).collect();
                    self.connected = Some((names, at));
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(error = %e, "the agents list could not be read; offline agents are judged by their events")
                }
            }
        }
        let (names, at) = self.connected.as_ref()?;
        names.iter().any(|n| n == name).then_some(*at)
    }
}

/// One agent's record swept: its offline incident decided (unless it is listed connected),
/// and what no one tells taken and told. How many were told; `None` when it has no record
/// (it expired).
async fn sweep_agent(
    d: &Deps,
    name: &str,
    listing: &mut Listing,
    deadline: Deadline,
) -> Result<Option<usize>, StoreError> {
    let Some(record) = read_record(d, name).await? else {
        return Ok(None);
    };
    let now = d.clock.now();
    let listed_at = match record.offline_due_soon(now) {
        true => listing.connected_at(d, name, deadline).await,
        false => None,
    };
    let look = |r: &mut AgentRecord| {
        if let Some(at) = listed_at {
            r.seen_connected(at);
        }
        let offline = r.offline_due(now);
        Some((offline, r.take_overdue(now)))
    };
    let Some((offline, mut to_tell)) = update(d, name, &record.queue, look).await? else {
        return Ok(Some(0));
    };
    if let Some(pending) = offline {
        count(d, name, &record.queue, &pending.incident);
        to_tell.push(pending);
    }
    let mut told = 0;
    for pending in to_tell {
        told += usize::from(tell(d, name, &record.queue, &pending, deadline).await);
    }
    Ok(Some(told))
}

/// Agent `name`'s record as stored, if it has one.
async fn read_record(d: &Deps, name: &str) -> Result<Option<AgentRecord>, StoreError> {
    Ok(
        shared::read(d.store.as_ref(), SharedKey::Agent(name), d.clock.now())
            .await?
            .0,
    )
}

/// Reads, changes and writes agent `name`'s record if nobody wrote it in between (else
/// again, on what they wrote); what `change` said of the version written.
async fn update<T>(
    d: &Deps,
    name: &str,
    queue: &Queue,
    change: impl Fn(&mut AgentRecord) -> Option<T>,
) -> Result<Option<T>, StoreError> {
    let key = SharedKey::Agent(name);
    let init = || AgentRecord::new(name, queue);
    // What only the sweep, which walks the fleet's list, may tell: a pending incident, or an
    // agent gone offline.
    let changed = shared::update(d.store.as_ref(), key, d.clock.now(), init, |record| {
        let said = change(record);
        (said, !record.pending.is_empty() || record.offline.is_some())
    })
    .await?;
    let (said, sweep_needs) = changed.said;
    // Listed with its first record, and again (a read, if it is) whenever the record holds
    // what the sweep must tell: a listing that failed once is made good. A listing that
    // fails loses the agent from the fleet view, never the incident just decided.
    let listed = match changed.wrote {
        Some(First::Yes) => true,
        Some(First::No) => sweep_needs,
        None => false,
    };
    if listed && let Err(e) = list_agent(d, name).await {
        warn!(error = %e, agent = name, "the agent could not be added to the fleet's list");
    }
    Ok(said)
}

/// Adds `name` to the fleet's list of agents with records.
async fn list_agent(d: &Deps, name: &str) -> Result<(), StoreError> {
    let add = |names: &mut Vec<String>| {
        if names.iter().any(|n| n == name) {
            return;
        }
        if names.len() >= MAX_AGENTS {
            warn!(
                agent = name,
                "the fleet's list is full; the agent is not listed"
            );
            return;
        }
        names.push(name.to_owned());
    };
    shared::update(
        d.store.as_ref(),
        SharedKey::Fleet,
        d.clock.now(),
        Vec::new,
        add,
    )
    .await?;
    Ok(())
}

/// The names of the agents that have a record.
async fn fleet_names(d: &Deps) -> Result<Vec<String>, StoreError> {
    let (names, _) = shared::read(d.store.as_ref(), SharedKey::Fleet, d.clock.now()).await?;
    Ok(names.unwrap_or_default())
}

/// Counts a newly decided incident: the metric's alarm tells the operators even when the
/// post does not.
fn count(d: &Deps, agent: &str, queue: &Queue, incident: &Incident) {
    let kind = incident.kind();
    // By kind only: the alarm in template.yaml names each series (the queue is in the log
    // line and the message).
    d.metrics
        .put(&[("Kind", kind)], &[("GpuIncidents", Unit::Count, 1.0)]);
    warn!(agent, %queue, kind, "GPU incident");
}

/// Posts `pending` to the operators' channel (one short try) and, once it went, marks it
/// told on the agent's record. Whether it is told; without a channel there is nothing to
/// post, so it is.
async fn tell(d: &Deps, agent: &str, queue: &Queue, pending: &Pending, deadline: Deadline) -> bool {
    if let Some(target) = &d.ops_discord {
        let message = Message {
            content: incident_text(agent, queue, &pending.incident, pending.run_id.as_deref()),
            embeds: Vec::new(),
            allowed_mentions: AllowedMentions::default(),
            file: None,
        };
        let once = d.discord.clone().with_retry(Policy {
            attempts: 1,
            ..Policy::default()
        });
        let deadline = Deadline::after(OPS_POST.min(deadline.remaining()));
        if let Err(e) = once
            .post((target, Priority::First), &message, deadline)
            .await
        {
            warn!(error = %e, agent, "the operators' channel could not be told; the sweep will try again");
            return false;
        }
    }
    let key = pending.key.clone();
    let done = |r: &mut AgentRecord| {
        r.was_told(&key);
        Some(())
    };
    if let Err(e) = update(d, agent, queue, done).await {
        warn!(error = %e, agent, "a told incident could not be marked so; it may be told again");
    }
    true
}

/// The operators' message: which agent, what happened, and what the service did about it.
pub(crate) fn incident_text(
    agent: &str,
    queue: &Queue,
    incident: &Incident,
    run_id: Option<&str>,
) -> String {
    let who = format!("Agent {} (queue {})", span(agent), span(queue));
    let run = run_id.map_or(String::new(), |r| format!(" Run {}.", span(r)));
    match incident {
        Incident::Infra {
            reason,
            paused,
            retried,
            ..
        } => {
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
        Incident::Offline { event, since } => format!(
            "🔌 {who}: {} <t:{}:R>, and not back since. Its jobs run on the queue's other \
             agents until it connects again.",
            plain(event),
            since / 1000
        ),
        Incident::Heat {
            submissions,
            reason,
        } => format!(
            "🌡 {who}: {submissions} different submissions met it slowed down or too hot \
             within a day (the last: {}).{run} One can be a kernel's own heat; several on one \
             agent point at its cooling or power. It was not paused: check it, and pause it \
             in Buildkite if it needs work.",
            plain(reason)
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
    /// Its tries whose timed run stayed throttled after the submission ran (perhaps the
    /// kernel's own heat): an incident only at three submissions a day.
    pub throttled_24h: usize,
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
    let names = fleet_names(d).await?;
    let mut records = Vec::new();
    for name in &names {
        records.extend(read_record(d, name).await?);
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
    let (jobs_24h, infra_failures_24h, throttled_24h) = r.counts_since(now - DAY_MS);
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
        throttled_24h,
        readings: r.readings,
        readings_at: r.readings_at,
        name: r.name,
        queue: r.queue.to_string(),
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
        let text = incident_text("node-gpu0", &Queue::new("h100"), &infra(false, false), None);
        assert!(
            text.contains("not paused") && text.contains("no retry was left"),
            "{text}"
        );
        assert!(!text.contains("Resume"), "{text}");
        let text = incident_text("node-gpu0", &Queue::new("h100"), &infra(true, true), None);
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
            since: 1_795_600_000_000,
        };
        let text = incident_text("node-gpu0", &Queue::new("h100"), &offline, None);
        assert!(
            text.contains("agent.lost <t:1795600000:R>, and not back since")
                && text.contains("other agents"),
            "{text}"
        );
        let heat = Incident::Heat {
            submissions: 3,
            reason: "throttled: SwThermalSlowdown *hot*".into(),
        };
        let text = incident_text("node-gpu0", &Queue::new("h100"), &heat, Some("run-7"));
        assert!(
            text.starts_with(
                "🌡 Agent `node-gpu0` (queue `h100`): 3 different submissions met it slowed down"
            ) && text.contains("Run `run-7`.")
                && text.contains("not paused")
                && !text.contains("*hot*"),
            "{text}"
        );
    }
}
