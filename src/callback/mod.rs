//! Signed completion callbacks to the caller (`CALLBACK_URL`), per the Standard Webhooks
//! spec: [`signature`] signs, [`sender`] posts one [`Event`]. What an event says about a job
//! is the flow's (`flow::present`); they go through the job's callback outbox like Discord
//! reports.

mod sender;
mod signature;

pub(crate) use sender::{CallbackError, CallbackSender, SenderError};

/// One callback, ready to sign and send.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Event {
    /// `webhook-id`: the same on every attempt of one message.
    pub id: String,
    pub body: Vec<u8>,
}
