//! The decisions, as pure functions of a job, an event and the time: what an event or a
//! build's state means ([`signal`]), what an outbox does next ([`outbox`]), when a deferred
//! create is due ([`creation`]), when a job ends without its build's word ([`ending`]), which
//! tries of a build ran where ([`tries`]), whether a finished event carries the whole end
//! ([`riding`]), what an agent's record says ([`fleet`]), and what a caller does with a queue's
//! fair-share lease ([`lease`]), when a submission is answered from an earlier run
//! ([`reuse`]), and a user's daily GPU budget ([`budget`]).
//! Everything that talks to the world lives elsewhere.

pub(crate) mod budget;
pub mod creation;
pub mod ending;
pub(crate) mod fair;
pub(crate) mod fleet;
pub(crate) mod lease;
pub mod outbox;
pub(crate) mod reuse;
pub(crate) mod riding;
pub mod signal;
pub(crate) mod stats;
pub(crate) mod tries;

pub use signal::{progress_of, signal_of};

/// What the rules' table tests start from.
#[cfg(test)]
mod fixtures {
    use crate::jobs::{BuildRef, Job, JobState};

    /// A job in `state`, reporting to no receiver.
    pub(super) fn job(state: JobState) -> Job {
        let mut j = Job::new("r".parse().unwrap(), "g".into(), "q".into(), None, None, 0);
        j.state = state;
        j
    }

    /// A build as a job records it.
    pub(super) fn build() -> BuildRef {
        BuildRef {
            id: "b".into(),
            number: 1,
            web_url: String::new(),
        }
    }
}
