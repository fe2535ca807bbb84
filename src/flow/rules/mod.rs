//! The decisions, as pure functions of a job, an event and the time: what an event or a
//! build's state means ([`signal`]), what an outbox does next ([`outbox`]), when a deferred
//! create is due ([`creation`]), and when a job ends without its build's word ([`ending`]).
//! Everything that talks to the world lives elsewhere.

pub mod creation;
pub mod ending;
pub mod outbox;
pub mod signal;

pub use signal::{progress_of, signal_of};
