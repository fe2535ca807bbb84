//! A run id: the idempotency key of a submission, `[A-Za-z0-9_.-]{1,64}`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
}
