//! Which queues' deferred lists this instance last found empty, and when: an event of a
//! queue looks for deferred work, and in a rush that fits Buildkite's window the list is
//! empty nearly always, so a list read empty is not read again for a few seconds. Work
//! another instance defers meanwhile waits that much longer (it waits for a window's reset
//! anyway); what this instance defers is looked for at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::jobs::Queue;
use crate::time::Millis;

/// How long a list read empty is taken to stay so.
pub(crate) const QUIET_MS: Millis = 5_000;

/// Queues whose list was read empty, and when; one per instance (its clones share it).
#[derive(Clone, Debug, Default)]
pub(crate) struct QuietLists(Arc<Mutex<HashMap<Queue, Millis>>>);

impl QuietLists {
    /// Whether `queue`'s list was read empty less than [`QUIET_MS`] before `now`.
    pub(crate) fn quiet(&self, queue: &Queue, now: Millis) -> bool {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(queue)
            .is_some_and(|at| (0..QUIET_MS).contains(&(now - at)))
    }

    /// Notes what a read of `queue`'s list found at `now`: empty, or not (then it is read
    /// again next time).
    pub(crate) fn saw(&self, queue: &Queue, empty: bool, now: Millis) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if empty {
            map.insert(queue.clone(), now);
        } else {
            map.remove(queue);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_read_empty_is_left_alone_a_few_seconds() {
        let lists = QuietLists::default();
        let (q, other) = (Queue::new("h100"), Queue::new("b200"));
        assert!(!lists.quiet(&q, 0), "never read: read it");
        lists.saw(&q, true, 1_000);
        // (now, quiet)
        let cases = [
            (1_000, true),
            (1_000 + QUIET_MS - 1, true),
            (1_000 + QUIET_MS, false),
            (999, false),
        ];
        for (now, quiet) in cases {
            assert_eq!(lists.quiet(&q, now), quiet, "at {now}");
        }
        assert!(
            !lists.quiet(&other, 1_000),
            "another queue's list is its own"
        );
        lists.saw(&q, false, 1_500);
        assert!(!lists.quiet(&q, 1_600), "found work: read it next time");
    }
}
