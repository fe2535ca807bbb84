//! Signed completion callbacks to the caller (`CALLBACK_URL`), per the Standard Webhooks
//! spec: [`signature`] signs, [`event`] renders a job's state change, [`sender`] posts it.
//! They go through the job's callback outbox (see `flow::deliver`) like Discord reports.

pub mod event;
pub mod sender;
pub mod signature;

pub use event::Event;
pub use sender::{CallbackError, CallbackSender};
pub use signature::{InvalidKey, SigningKey};
