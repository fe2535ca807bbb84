//! Running the GPUs' vendor tools: which one this node has, what it says about the GPUs and
//! their compute processes, and which devices this agent was given. The decisions on what
//! they said are in [`super::preflight`].

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Unreadable, amd, nvidia};
use crate::result::{GpuProcess, GpuReading};

/// A tool that has not answered in this long is stuck on a GPU in trouble.
const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// The vendor whose tool reads this node's GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Vendor {
    Nvidia,
    Amd,
}

impl Vendor {
    pub(crate) fn tool(self) -> &'static str {
        match self {
            Self::Nvidia => "nvidia-smi",
            Self::Amd => "amd-smi",
        }
    }
}

/// `name` as found on `path` (a `PATH` value), if it is there.
fn on_path(name: &str, path: &str) -> Option<PathBuf> {
    std::env::split_paths(path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The vendor whose tool is on `PATH`: NVIDIA's first, as the system report does. `None` on
/// a machine with neither (a CPU-only demo): there is nothing to check.
pub(crate) fn vendor(lookup: &dyn Fn(&str) -> Option<String>) -> Option<(Vendor, PathBuf)> {
    let path = lookup("PATH").unwrap_or_default();
    [Vendor::Nvidia, Vendor::Amd]
        .into_iter()
        .find_map(|v| on_path(v.tool(), &path).map(|p| (v, p)))
}

/// The devices given to this agent, as the container numbers them (setup-node.sh writes
/// these variables into each agent's hook, the pipeline passes them in), split on commas.
/// `None` when none is set (a local run: every visible GPU is the agent's).
pub(crate) fn given_devices(
    vendor: Vendor,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Option<Vec<String>> {
    let value = match vendor {
        Vendor::Nvidia => lookup("CUDA_VISIBLE_DEVICES"),
        Vendor::Amd => lookup("ROCR_VISIBLE_DEVICES").or_else(|| lookup("HIP_VISIBLE_DEVICES")),
    }?;
    Some(given_list(&value))
}

/// `"0, 1"` → `["0", "1"]`; `""` gives nothing (no device at all).
pub(crate) fn given_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Why the tool's answer could not be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    #[error("{0}")]
    Unreadable(#[from] Unreadable),
    #[error("{tool} {args} failed: {why}")]
    Failed {
        tool: &'static str,
        args: String,
        why: String,
    },
}

impl ProbeError {
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::Unreadable(_) => "tool_output_unreadable",
            Self::Failed { .. } => "tool_failed",
        }
    }
}

/// Runs `program args`, stdout as text; a failure says the first line it printed.
fn output(tool: &'static str, program: &Path, args: &[String]) -> Result<String, ProbeError> {
    let failed = |why: String| ProbeError::Failed {
        tool,
        args: args.join(" "),
        why,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(format!("cannot start it: {e}")))?;
    // Read while it runs, so a long answer never fills the pipe and stalls it.
    let readers = [
        child.stdout.take().map(read_all),
        child.stderr.take().map(read_all),
    ];
    let deadline = Instant::now() + TOOL_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(failed(format!("no answer in {} s", TOOL_TIMEOUT.as_secs())));
            }
            Err(e) => return Err(failed(e.to_string())),
        }
    };
    let [stdout, stderr] = readers.map(|r| r.and_then(|h| h.join().ok()).unwrap_or_default());
    if status.success() {
        return Ok(stdout);
    }
    let said = stderr
        .lines()
        .chain(stdout.lines())
        .find(|l| !l.trim().is_empty());
    Err(failed(format!("{status}: {}", said.unwrap_or("no output"))))
}

fn read_all(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = from.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// The GPUs' readings, by the vendor's tool at `program`.
pub(crate) fn readings(vendor: Vendor, program: &Path) -> Result<Vec<GpuReading>, ProbeError> {
    let tool = vendor.tool();
    Ok(match vendor {
        Vendor::Nvidia => nvidia::parse_gpus(&output(tool, program, &nvidia::gpu_query())?)?,
        Vendor::Amd => amd::parse_metrics(&output(tool, program, &amd::metric_query())?)?,
    })
}

/// The compute processes on the GPUs, by the vendor's tool at `program`.
pub(crate) fn processes(vendor: Vendor, program: &Path) -> Result<Vec<GpuProcess>, ProbeError> {
    let tool = vendor.tool();
    Ok(match vendor {
        Vendor::Nvidia => {
            nvidia::parse_processes(&output(tool, program, &nvidia::process_query())?)?
        }
        Vendor::Amd => amd::parse_processes(&output(tool, program, &amd::process_query())?)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_devices_come_from_the_vendors_variables() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        type Vars = &'static [(&'static str, &'static str)];
        let cases: &[(Vendor, Vars, Option<&[&str]>)] = &[
            (
                Vendor::Nvidia,
                &[("CUDA_VISIBLE_DEVICES", "0")],
                Some(&["0"]),
            ),
            (
                Vendor::Nvidia,
                &[("CUDA_VISIBLE_DEVICES", "0,1, 2")],
                Some(&["0", "1", "2"]),
            ),
            (Vendor::Nvidia, &[("CUDA_VISIBLE_DEVICES", "")], Some(&[])),
            (Vendor::Nvidia, &[("ROCR_VISIBLE_DEVICES", "0")], None),
            (
                Vendor::Amd,
                &[
                    ("ROCR_VISIBLE_DEVICES", "0,1"),
                    ("HIP_VISIBLE_DEVICES", "0"),
                ],
                Some(&["0", "1"]),
            ),
            (Vendor::Amd, &[("HIP_VISIBLE_DEVICES", "0")], Some(&["0"])),
            (Vendor::Amd, &[], None),
        ];
        for (vendor, vars, want) in cases {
            let got = given_devices(*vendor, &env(vars));
            let want = want.map(|w| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
            assert_eq!(got, want, "{vendor:?} {vars:?}");
        }
    }

    #[test]
    fn a_failing_tool_says_what_it_printed() {
        let err = output(
            "sh",
            Path::new("/bin/sh"),
            &[
                "-c".into(),
                "echo 'NVIDIA-SMI has failed' >&2; exit 9".into(),
            ],
        )
        .unwrap_err();
        assert!(err.to_string().contains("NVIDIA-SMI has failed"), "{err}");
        assert_eq!(err.reason(), "tool_failed");
        let ok = output(
            "sh",
            Path::new("/bin/sh"),
            &["-c".into(), "echo fine".into()],
        )
        .unwrap();
        assert_eq!(ok, "fine\n");
    }
}
