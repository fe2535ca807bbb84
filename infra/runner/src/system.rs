//! What the evaluation ran on, as kernelbot's `make_system_info` reports it.

use std::process::{Command, Stdio};

use kernelbot_protocol::result::SystemInfo;

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn python() -> &'static str {
    static PYTHON: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    PYTHON.get_or_init(|| {
        if output("python", &["--version"]).is_some() {
            "python"
        } else {
            "python3"
        }
    })
}

/// The Python interpreter submissions run with: `python` where it exists (kernelbot's
/// images), else `python3`.
pub(super) fn python_command() -> String {
    std::env::var("KERNELBOT_PYTHON").unwrap_or_else(|_| python().to_owned())
}

fn uname() -> Option<(String, String)> {
    // SAFETY: uname fills the zeroed struct; its fields are NUL-terminated C strings.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return None;
        }
        let field = |f: &[libc::c_char]| {
            std::ffi::CStr::from_ptr(f.as_ptr())
                .to_string_lossy()
                .into_owned()
        };
        Some((field(&u.release), field(&u.machine)))
    }
}

/// Reads the GPU (nvidia-smi, else rocm-smi), CPU, platform, torch and hostname.
pub(super) fn detect() -> SystemInfo {
    let mut info = SystemInfo {
        device_count: 1,
        ..Default::default()
    };
    if let Some(names) = output("nvidia-smi", &["--query-gpu=name", "--format=csv,noheader"]) {
        let gpus: Vec<&str> = names
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        info.gpu = gpus.first().copied().unwrap_or_default().to_owned();
        info.device_count = gpus.len() as i64;
        info.runtime = "CUDA".into();
    } else if let Some(json) = output("rocm-smi", &["--showproductname", "--json"]) {
        let cards: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&json).unwrap_or_default();
        info.gpu = cards
            .values()
            .next()
            .and_then(|c| c["Card Series"].as_str())
            .unwrap_or_default()
            .to_owned();
        info.device_count = cards.len() as i64;
        info.runtime = "ROCm".into();
    }
    if let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo") {
        let field = |name: &str| {
            cpuinfo.lines().find_map(|l| {
                l.split_once(':')
                    .filter(|(k, _)| k.trim() == name)
                    .map(|(_, v)| v.trim().to_owned())
            })
        };
        info.cpu = field("model name")
            .filter(|c| c != "unknown")
            .or_else(|| field("vendor_id"))
            .unwrap_or_default();
    }
    if let Some((release, machine)) = uname() {
        info.platform = format!("Linux-{release}-{machine}");
    }
    info.torch = output(
        &python_command(),
        &["-c", "import torch; print(torch.__version__)"],
    )
    .map(|v| v.trim().to_owned())
    .unwrap_or_default();
    info.hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    info
}
