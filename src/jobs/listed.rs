//! A job as the sweep's listing shows it: what a pass chooses and orders its work by, never
//! the parts that may be large (the outcome, the build payload, the title), which a pass
//! reads one job at a time. Not a [`Job`]: nothing takes it for one, so no write can put a
//! listing's cut-down view back in the store.

use super::id::{Queue, RunId};
use super::model::{BuildRef, Job, Timeline};
use super::outbox::{CallbackOutbox, Channel, Delivery, DiscordOutbox, delivery, owes};
use super::state::JobState;
use crate::time::Millis;

#[derive(Clone, Debug, PartialEq)]
pub struct Listed {
    pub run_id: RunId,
    pub state: JobState,
    pub queue: Queue,
    pub build: Option<BuildRef>,
    pub discord: Option<DiscordOutbox>,
    pub callback: Option<CallbackOutbox>,
    pub scheduled_at: Option<Millis>,
    pub max_queue_secs: Option<u64>,
    pub cancel_requested: bool,
    pub created_at: Millis,
    pub updated_at: Millis,
}

impl Listed {
    /// Whether a message to `channel` is owed for the job as listed.
    pub fn owes(&self, channel: Channel) -> bool {
        owes(
            self.discord.as_ref(),
            self.callback.as_ref(),
            self.state,
            channel,
        )
    }

    pub fn delivery(&self, channel: Channel) -> Option<&Delivery> {
        delivery(self.discord.as_ref(), self.callback.as_ref(), channel)
    }

    pub(crate) fn timeline(&self) -> Timeline {
        Timeline {
            state: self.state,
            created_at: self.created_at,
            scheduled_at: self.scheduled_at,
            max_queue_secs: self.max_queue_secs,
        }
    }
}

/// What one listing read: the jobs it could, and how many records this version cannot read
/// (each logged with its run id), which a pass counts and goes on without.
#[derive(Debug, Default)]
pub struct Listing {
    pub jobs: Vec<Listed>,
    pub unreadable: usize,
    /// The index key (creation time, run id) of the last record read, readable or not:
    /// where a listing that goes on resumes.
    pub last: Option<(Millis, String)>,
}

impl Listing {
    /// Records read, readable or not.
    pub fn len(&self) -> usize {
        self.jobs.len() + self.unreadable
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds the record read under (`created_at`, `run_id`): its job, or (logged) why it
    /// cannot be read.
    pub fn push(
        &mut self,
        created_at: Millis,
        run_id: &str,
        read: Result<Listed, super::error::StoreError>,
    ) {
        self.last = Some((created_at, run_id.to_owned()));
        match read {
            Ok(job) => self.jobs.push(job),
            Err(e) => {
                tracing::warn!(run_id, error = %e, "a listed job cannot be read");
                self.unreadable += 1;
            }
        }
    }
}

/// What a listing shows of `job` (the stores' contract tests compare against it).
impl From<&Job> for Listed {
    fn from(job: &Job) -> Self {
        Self {
            run_id: job.run_id.clone(),
            state: job.state,
            queue: job.queue.clone(),
            build: job.build.clone(),
            discord: job.discord.clone(),
            callback: job.callback.clone(),
            scheduled_at: job.scheduled_at,
            max_queue_secs: job.max_queue_secs,
            cancel_requested: job.cancel_requested,
            created_at: job.created_at,
            updated_at: job.updated_at,
        }
    }
}
