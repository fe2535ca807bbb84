//! The GPUs' health, read through their vendors' tools: pure parsers of `nvidia-smi`'s CSV
//! and `amd-smi`'s JSON ([`nvidia`], [`amd`]), the pre-flight's and the measurements'
//! decisions ([`preflight`], [`measure`]), and the only I/O, running the tools ([`probe`]),
//! the pre-flight as the runner runs it ([`gate`]) and the readings around timed runs
//! ([`watch`]).

pub(crate) mod amd;
pub(crate) mod gate;
pub(crate) mod measure;
pub(crate) mod nvidia;
pub(crate) mod preflight;
pub(crate) mod probe;
pub(crate) mod watch;

/// What a reading's clock-event reasons mean is the result format's: the service reads it too.
pub(crate) use kernelbot_protocol::result::health::{AMD_POWER_CAP, clock_event_names};

/// Output of a GPU tool that cannot be read: why, and the raw line (or document) it was in,
/// so an operator sees what the tool said.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{tool} printed something unreadable ({why}): {line:?}")]
pub(crate) struct Unreadable {
    pub(crate) tool: &'static str,
    pub(crate) why: String,
    pub(crate) line: String,
}

/// The most of a raw line kept in an error: a tool in trouble may print a lot.
const MAX_RAW: usize = 300;

impl Unreadable {
    pub(crate) fn new(tool: &'static str, why: impl Into<String>, line: &str) -> Self {
        let mut kept: String = line.chars().take(MAX_RAW).collect();
        if kept.len() < line.len() {
            kept.push('…');
        }
        Self {
            tool,
            why: why.into(),
            line: kept,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_event_masks_are_named() {
        let cases: &[(u64, &[&str])] = &[
            (0x0, &[]),
            (0x1, &["GpuIdle"]),
            (0x4, &["SwPowerCap"]),
            (0x60, &["SwThermalSlowdown", "HwThermalSlowdown"]),
            (0x201, &["GpuIdle", "Unknown(0x200)"]),
        ];
        for (mask, names) in cases {
            assert_eq!(clock_event_names(*mask), *names, "{mask:#x}");
        }
    }

    #[test]
    fn a_raw_line_is_kept_but_bounded() {
        let long = "x".repeat(1000);
        let e = Unreadable::new("nvidia-smi", "garbage", &long);
        assert_eq!(e.line.chars().count(), MAX_RAW + 1);
        assert!(
            e.to_string()
                .starts_with("nvidia-smi printed something unreadable (garbage)")
        );
        assert_eq!(Unreadable::new("t", "w", "short").line, "short");
    }
}
