//! Discord: where a job's status is shown, as one webhook message edited through its life.
//! This module speaks Discord's wire format (messages, limits, webhook URLs and answers);
//! turning a job into a message is the flow's (`flow::present`).

mod bucket;
mod message;
mod notifier;
mod target;

pub use bucket::Priority;
pub use message::{AllowedMentions, Embed, Field, Message, REPORT_FILENAME, limits};
pub use notifier::{DiscordError, Notifier};
pub use target::{DiscordTarget, InvalidWebhookUrl};
