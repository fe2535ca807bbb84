//! Discord: where a job's status is shown, as one webhook message edited through its life.

pub mod message;
pub mod notifier;
pub mod report;
pub mod target;

pub use message::{Message, render};
pub use notifier::{DiscordError, Notifier};
pub use target::DiscordTarget;
