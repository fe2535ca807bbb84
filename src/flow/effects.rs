//! What an arrow of the flow leaves to be done after its own write, rather than calling up
//! into the arrows above it: a job it ended frees a slot on its queue, and fair share's
//! waiting jobs may then go. The arrow records it here; `settle`, above every arrow
//! that ends jobs, runs it once the arrow returns, whether it returned an error or not (the
//! job has ended either way).

use crate::jobs::Job;

/// Effects owed by the arrows one invocation ran, in the order they arose.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    ended: Vec<Job>,
}

impl Effects {
    /// `job` was ended by this instance's write: its slot on the queue is free.
    pub(crate) fn ended(&mut self, job: Job) {
        self.ended.push(job);
    }

    /// The jobs ended, oldest first; none are left.
    pub(crate) fn take_ended(&mut self) -> Vec<Job> {
        std::mem::take(&mut self.ended)
    }
}

impl Drop for Effects {
    /// A test that drops effects unrun fails here (a job's slot would stay taken until a
    /// sweep's release); a panic already under way is not made an abort.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            debug_assert!(
                self.ended.is_empty(),
                "effects dropped without being settled: {} ended job(s)",
                self.ended.len()
            );
        }
    }
}
