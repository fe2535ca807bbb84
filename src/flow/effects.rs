//! What an arrow of the flow owes once its own write is made, rather than calling up into
//! the arrows above it or out to the receivers: the job's messages sent (its report, a status
//! edit, its callback, the fleet's notes of its tries), and, for a job it ended, its queue's
//! slot freed for fair share's waiting jobs. The arrow records them here; `settle`, above
//! every arrow, runs them once the arrow returns, whether it returned an error or not (what
//! it wrote stands either way).

use std::collections::VecDeque;

use crate::jobs::{Job, View};

/// One thing owed.
#[derive(Debug)]
pub(crate) enum Effect {
    /// The job (as written, or read, and how) owes its outboxes a send: a new state, or one
    /// not yet sent.
    Deliver(Job, View),
    /// The job was ended by this instance's write: its slot on the queue is free.
    Ended(Job),
}

/// Effects owed by the arrows one invocation ran, in the order they arose.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    owed: VecDeque<Effect>,
}

impl Effects {
    /// `job`'s messages are owed (a no-op send when nothing is); `view` says how the arrow
    /// came by `job` (its own write or read spares the senders a read to confirm that
    /// another holds the message, or that nothing is owed).
    pub(crate) fn deliver(&mut self, job: Job, view: View) {
        self.owed.push_back(Effect::Deliver(job, view));
    }

    /// `job` was ended by this instance's write (as written): its messages are owed, and
    /// then (never before they are tried) its slot on the queue is free.
    pub(crate) fn ended(&mut self, job: Job) {
        self.owed.push_back(Effect::Deliver(job.clone(), View::Own));
        self.owed.push_back(Effect::Ended(job));
    }

    /// The oldest effect not yet run.
    pub(crate) fn next(&mut self) -> Option<Effect> {
        self.owed.pop_front()
    }

    /// How many effects are owed.
    pub(crate) fn len(&self) -> usize {
        self.owed.len()
    }
}

impl Drop for Effects {
    /// A test that drops effects unrun fails here (a report would wait for the sweep, a
    /// job's slot stay taken until a sweep's release); a panic already under way is not made
    /// an abort.
    fn drop(&mut self) {
        if self.owed.is_empty() || std::thread::panicking() {
            return;
        }
        // A deployment logs it (the sweep sends what is owed, and releases at its next pass).
        tracing::warn!(
            owed = self.owed.len(),
            "effects dropped without being settled; the sweep takes them up"
        );
        if cfg!(debug_assertions) {
            panic!("effects dropped without being settled: {:?}", self.owed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str) -> Job {
        Job::new(
            id.parse().unwrap(),
            "H100".into(),
            "h100".into(),
            None,
            None,
            0,
        )
    }

    /// Effects come out in the order the arrows owed them: a job's report before its slot.
    #[test]
    fn effects_are_run_in_the_order_they_arose() {
        let mut e = Effects::default();
        e.ended(job("a"));
        e.deliver(job("b"), View::Earlier);
        assert_eq!(e.len(), 3, "an end owes its messages first");
        let order: Vec<(bool, String)> = std::iter::from_fn(|| e.next())
            .map(|x| match x {
                Effect::Deliver(j, _) => (false, j.run_id.to_string()),
                Effect::Ended(j) => (true, j.run_id.to_string()),
            })
            .collect();
        let want = [(false, "a"), (true, "a"), (false, "b")].map(|(e, id)| (e, id.to_owned()));
        assert_eq!(order, want);
        assert_eq!(e.len(), 0);
    }
}
