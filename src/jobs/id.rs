//! The names a job is known by: its run id (the idempotency key of a submission,
//! `[A-Za-z0-9_.-]{1,64}`), its queue and its user. Each its own type, so fair share, the
//! deferred lists and the fleet cannot take one for another.

use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RunId(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("run_id must be 1-64 characters of A-Z, a-z, 0-9, '_', '.', '-'")]
pub struct InvalidRunId;

impl RunId {
    /// A fresh random id for submissions that bring none.
    pub(crate) fn generate() -> Self {
        Self(format!("run-{}", uuid::Uuid::new_v4().simple()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for RunId {
    type Err = InvalidRunId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = (1..=64).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidRunId)
        }
    }
}

impl TryFrom<String> for RunId {
    type Error = InvalidRunId;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<RunId> for String {
    fn from(id: RunId) -> Self {
        id.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A name whose text is whatever the deployment or the submission gave: typed, not checked.
macro_rules! name {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn new(name: impl Into<String>) -> Self {
                Self(name.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        // Read as text wherever text is wanted (logs, keys, messages); never the other way.
        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl From<String> for $name {
            fn from(name: String) -> Self {
                Self(name)
            }
        }

        impl From<&str> for $name {
            fn from(name: &str) -> Self {
                Self(name.to_owned())
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

name!(
    /// A Buildkite queue: where a GPU type's agents take jobs (the deployment's `QUEUES`).
    Queue
);

name!(
    /// Who submitted a job (opaque, the submission's `user`): fair share counts per user.
    UserId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_validated() {
        assert!("sub-42_H100.v2".parse::<RunId>().is_ok());
        assert!("a".repeat(64).parse::<RunId>().is_ok());
        assert_eq!("".parse::<RunId>(), Err(InvalidRunId));
        assert_eq!("a".repeat(65).parse::<RunId>(), Err(InvalidRunId));
        assert_eq!("a/b".parse::<RunId>(), Err(InvalidRunId));
        assert_eq!("ünï".parse::<RunId>(), Err(InvalidRunId));
        assert!(RunId::generate().as_str().parse::<RunId>().is_ok());
    }

    #[test]
    fn a_queue_and_a_user_are_stored_as_their_text() {
        let queue = Queue::new("h100");
        assert_eq!(serde_json::to_string(&queue).unwrap(), r#""h100""#);
        let user: UserId = serde_json::from_str(r#""alice""#).unwrap();
        assert_eq!((user.as_str(), user.to_string()), ("alice", "alice".into()));
        assert!(queue == "h100" && queue != "b200");
    }
}
