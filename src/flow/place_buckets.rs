//! Which Discord bucket each waiting job's message goes to, as this instance last read the
//! job. An end places the jobs whose place moved, and in a rush their webhook's bucket has
//! no room for a place edit nearly always (reports, first messages and starts come first):
//! a job whose bucket this instance knows is passed by unread while that bucket is full.
//! A job's target does not change while it waits; its entry goes once it leaves the queue.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::jobs::{OpenJob, Queue, RunId};

/// Jobs known at most; past it the memo starts again (each job costs one read to relearn).
const MAX_KNOWN: usize = 20_000;

/// What a read of a waiting job showed: its queue, and its message's bucket (`None`: it has
/// no Discord message to edit).
#[derive(Clone, Debug)]
struct Known {
    queue: Queue,
    bucket: Option<String>,
}

/// Each waiting job's bucket as last read; one per instance (its clones share it).
#[derive(Clone, Debug, Default)]
pub(crate) struct PlaceBuckets(Arc<Mutex<HashMap<RunId, Known>>>);

impl PlaceBuckets {
    /// The bucket of `run_id`'s message as last read: `None` when the job was not read,
    /// `Some(None)` when it has no Discord message.
    pub(crate) fn bucket(&self, run_id: &RunId) -> Option<Option<String>> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(run_id).map(|k| k.bucket.clone())
    }

    /// Notes what a read of `run_id` (waiting on `queue`) showed.
    pub(crate) fn note(&self, run_id: &RunId, queue: &Queue, bucket: Option<String>) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_KNOWN && !map.contains_key(run_id) {
            map.clear();
        }
        let queue = queue.clone();
        map.insert(run_id.clone(), Known { queue, bucket });
    }

    /// Forgets the jobs of `queue` that are no longer among its `open` ones.
    pub(crate) fn keep_open(&self, queue: &Queue, open: &[OpenJob]) {
        let open: HashSet<&RunId> = open.iter().map(|o| &o.run_id).collect();
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|id, k| &k.queue != queue || open.contains(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::JobState;

    fn open(id: &str) -> OpenJob {
        OpenJob {
            run_id: id.parse().unwrap(),
            created_at: 0,
            state: JobState::Submitted,
            user: None,
            waiting: true,
            background: false,
            scheduled_at: None,
            queue_position: Some(3),
        }
    }

    #[test]
    fn a_job_s_bucket_is_known_while_it_is_open_on_its_queue() {
        let known = PlaceBuckets::default();
        let (h100, b200) = (Queue::new("h100"), Queue::new("b200"));
        let [a, b, c] = ["a", "b", "c"].map(|id| id.parse::<RunId>().unwrap());
        assert_eq!(known.bucket(&a), None, "never read");
        known.note(&a, &h100, Some("hook/1".into()));
        known.note(&b, &h100, None);
        known.note(&c, &b200, Some("hook/2".into()));
        assert_eq!(known.bucket(&a), Some(Some("hook/1".into())));
        assert_eq!(known.bucket(&b), Some(None), "no message: known as such");

        // `a` left h100; `c` is another queue's, kept whatever h100 shows.
        known.keep_open(&h100, &[open("b")]);
        assert_eq!(known.bucket(&a), None, "forgotten once off its queue");
        assert_eq!(known.bucket(&b), Some(None));
        assert_eq!(known.bucket(&c), Some(Some("hook/2".into())));
    }
}
