//! Where a job is in its life. The order of the variants is the order of progress.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Submitted,
    Scheduled,
    Running,
    Finished,
    Failed,
}

impl JobState {
    /// A job only ever moves to a higher rank. `finished` and `failed` share the top rank:
    /// neither can follow the other.
    pub(crate) fn rank(self) -> u8 {
        match self {
            Self::Submitted => 0,
            Self::Scheduled => 1,
            Self::Running => 2,
            Self::Finished | Self::Failed => 3,
        }
    }

    pub fn is_terminal(self) -> bool {
        self.rank() == 3
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Submitted => "submitted",
            Self::Scheduled => "scheduled",
            Self::Running => "running",
            Self::Finished => "finished",
            Self::Failed => "failed",
        }
    }
}

/// A stored state this version does not know.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown job state {0:?}")]
pub struct UnknownState(String);

impl FromStr for JobState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "submitted" => Self::Submitted,
            "scheduled" => Self::Scheduled,
            "running" => Self::Running,
            "finished" => Self::Finished,
            "failed" => Self::Failed,
            other => return Err(UnknownState(other.to_owned())),
        })
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
