//! Running the GPUs' vendor tools: which one this node has, what it says about the GPUs and
//! their compute processes, and which devices this agent was given. The decisions on what
//! they said are in [`super::preflight`].

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::nvidia::MaskName;
use super::{Unreadable, amd, nvidia};
use kernelbot_protocol::result::{GpuProcess, GpuReading};

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
    /// The tool refused the query for a field it does not know: `Field "x" is not a valid
    /// field to query.`, as `nvidia-smi` says it.
    fn refuses_a_field(&self) -> bool {
        matches!(self, Self::Failed { why, .. } if why.contains("not a valid field"))
    }

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

/// How this node's GPUs are read: the vendor's tool, and for NVIDIA the name of the
/// clock-event mask its driver takes (found once, by [`Reader::open`]).
#[derive(Clone, Debug)]
pub(crate) struct Reader {
    pub(crate) vendor: Vendor,
    program: PathBuf,
    mask: MaskName,
}

impl Reader {
    /// Finds the query the driver takes, newest field names first: a driver refuses a whole
    /// query that names a field it does not know (saying so), so each older one is asked in
    /// turn. Any other failure (a driver that cannot reach its GPUs, a tool that hangs) is
    /// the answer: it would not pass with older names, and asking again only costs time.
    /// The reader and the first readings; when every name is refused, the first refusal.
    pub(crate) fn open(
        vendor: Vendor,
        program: PathBuf,
    ) -> Result<(Self, Vec<GpuReading>), ProbeError> {
        let mut reader = Self {
            vendor,
            program,
            mask: MaskName::Event,
        };
        let mut first_failure = None;
        loop {
            match reader.readings() {
                Ok(readings) => return Ok((reader, readings)),
                Err(e @ ProbeError::Failed { .. })
                    if vendor == Vendor::Nvidia && e.refuses_a_field() =>
                {
                    first_failure.get_or_insert(e);
                    match reader.mask.older() {
                        Some(older) => reader.mask = older,
                        None => break,
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(first_failure.unwrap_or_else(|| ProbeError::Failed {
            tool: vendor.tool(),
            args: String::new(),
            why: "no query was answered".into(),
        }))
    }

    /// The GPUs' readings.
    pub(crate) fn readings(&self) -> Result<Vec<GpuReading>, ProbeError> {
        let tool = self.vendor.tool();
        Ok(match self.vendor {
            Vendor::Nvidia => nvidia::parse_gpus(
                &output(tool, &self.program, &nvidia::gpu_query(self.mask))?,
                self.mask,
            )?,
            Vendor::Amd => amd::parse_metrics(&output(tool, &self.program, &amd::metric_query())?)?,
        })
    }

    /// The compute processes on the GPUs.
    pub(crate) fn processes(&self) -> Result<Vec<GpuProcess>, ProbeError> {
        let (tool, program) = (self.vendor.tool(), &self.program);
        Ok(match self.vendor {
            Vendor::Nvidia => {
                nvidia::parse_processes(&output(tool, program, &nvidia::process_query())?)?
            }
            Vendor::Amd => amd::parse_processes(&output(tool, program, &amd::process_query())?)?,
        })
    }

    /// What an operator should know of how the GPUs are read, when the driver is older than
    /// the runner expects.
    pub(crate) fn note(&self) -> Option<String> {
        match self.mask {
            MaskName::Event => None,
            MaskName::Throttle => Some(
                "this driver knows the clock-event reasons by their older name \
                 (clocks_throttle_reasons)"
                    .into(),
            ),
            MaskName::Neither => {
                Some("this driver reports no clock-event reasons: slowdowns cannot be seen".into())
            }
        }
    }
}

/// The variable that gives this agent GPUs, its value, and the tool that reads them, when
/// one is set to any device: such a machine must be checked, never taken for a CPU-only one.
pub(crate) fn assigned(
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Option<(&'static str, String, Vendor)> {
    [
        ("CUDA_VISIBLE_DEVICES", Vendor::Nvidia),
        ("ROCR_VISIBLE_DEVICES", Vendor::Amd),
        ("HIP_VISIBLE_DEVICES", Vendor::Amd),
    ]
    .into_iter()
    .find_map(|(var, vendor)| {
        let value = lookup(var)?;
        // "" and "-1" hide every device: nothing is assigned.
        let any = given_list(&value).iter().any(|d| d != "-1");
        any.then_some((var, value, vendor))
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
    fn gpus_are_assigned_by_any_device_in_the_vendors_variables() {
        type Vars = &'static [(&'static str, &'static str)];
        let cases: &[(Vars, Option<(&str, Vendor)>)] = &[
            (&[], None),
            (&[("CUDA_VISIBLE_DEVICES", "")], None),
            (&[("CUDA_VISIBLE_DEVICES", "-1")], None),
            (
                &[("CUDA_VISIBLE_DEVICES", "0")],
                Some(("CUDA_VISIBLE_DEVICES", Vendor::Nvidia)),
            ),
            (
                &[
                    ("CUDA_VISIBLE_DEVICES", ""),
                    ("ROCR_VISIBLE_DEVICES", "0,1"),
                ],
                Some(("ROCR_VISIBLE_DEVICES", Vendor::Amd)),
            ),
            (
                &[("HIP_VISIBLE_DEVICES", "GPU-7")],
                Some(("HIP_VISIBLE_DEVICES", Vendor::Amd)),
            ),
        ];
        for (vars, want) in cases {
            let lookup = |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            };
            let got = assigned(&lookup).map(|(var, _, vendor)| (var, vendor));
            assert_eq!(got, *want, "{vars:?}");
        }
    }

    /// A driver that refuses the newer field name is asked the older one, then neither; one
    /// that fails whatever it is asked gives the first failure.
    #[test]
    fn an_older_driver_is_asked_the_names_it_knows() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("nvidia-smi");
        let script = |body: &str| {
            std::fs::write(&tool, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        };
        let refuse = |field: &str| {
            format!(
                "case \"$1\" in *{field}*) echo 'Field \"{field}.active\" is not a valid field to query.'; exit 2;; esac"
            )
        };
        let line = "echo '0, GPU-1, H100, 40, 70.5, 345, 2619, 1980, 0x0000000000000001, 0, No, 700.00, 700.00'";
        let short = "echo '0, GPU-1, H100, 40, 70.5, 345, 2619, 1980, 0, No, 700.00, 700.00'";
        // Old driver: only the throttle name.
        script(&format!("{}\n{line}", refuse("clocks_event_reasons")));
        let (reader, readings) = Reader::open(Vendor::Nvidia, tool.clone()).unwrap();
        assert_eq!(readings[0].clock_events, ["GpuIdle"]);
        assert!(reader.note().unwrap().contains("older name"));
        // Neither name: read without the mask.
        script(&format!(
            "{}\n{}\n{short}",
            refuse("clocks_event_reasons"),
            refuse("clocks_throttle_reasons")
        ));
        let (reader, readings) = Reader::open(Vendor::Nvidia, tool.clone()).unwrap();
        assert_eq!(readings[0].clock_event_reasons, None);
        assert_eq!(readings[0].temperature_c, Some(40.0));
        assert!(reader.note().unwrap().contains("cannot be seen"));
        assert!(reader.readings().is_ok(), "the same query again");
        // A driver that cannot talk to its GPUs: its answer, asked once (an older name would
        // not help, and a hung tool would cost its timeout again).
        let asked = dir.path().join("asked");
        script(&format!(
            "echo x >> {}; echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9",
            asked.display()
        ));
        let err = Reader::open(Vendor::Nvidia, tool.clone()).unwrap_err();
        assert_eq!(std::fs::read_to_string(&asked).unwrap().lines().count(), 1);
        assert_eq!(err.reason(), "tool_failed");
        assert!(
            err.to_string().contains("clocks_event_reasons")
                && err.to_string().contains("NVIDIA-SMI has failed"),
            "{err}"
        );
        // A new driver: the newest name, no note.
        script(line);
        let (reader, _) = Reader::open(Vendor::Nvidia, tool).unwrap();
        assert_eq!(reader.note(), None);
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
