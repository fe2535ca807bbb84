//! Where the local stack finds the GPU node's runner: its own binary (`kernelbot-runner`, the
//! runner crate's), the program the runner image installs. The service links only the
//! protocol crate, never the runner, so the stand-in agent runs the runner as a program, as
//! a real agent's step does.
//!
//! Found, in order: `KERNELBOT_RUNNER` (a path); when cargo ran this process (`cargo run`,
//! `cargo test`), built from this workspace as its code is now (cargo does nothing when it
//! is current); else next to this program (`target/<profile>/`, where `cargo build
//! --workspace` leaves it).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::agent::RUNNER_COMMAND;

/// The runner's package, as the workspace names it.
const RUNNER_PACKAGE: &str = "kernelbot-runner";

/// The variable that names a runner binary to use instead.
pub const RUNNER_VAR: &str = "KERNELBOT_RUNNER";

/// The runner binary the stand-in agent runs (see the module's doc for the order).
pub fn runner_program() -> std::io::Result<PathBuf> {
    if let Some(path) = std::env::var_os(RUNNER_VAR).filter(|p| !p.is_empty()) {
        return named(Path::new(&path));
    }
    // Cargo sets both for the programs it runs; the manifest is this crate's, in the
    // workspace that holds the runner.
    if let (Some(cargo), Some(dir)) = (
        std::env::var_os("CARGO"),
        std::env::var_os("CARGO_MANIFEST_DIR"),
    ) {
        let manifest = Path::new(&dir).join("Cargo.toml");
        if manifest.is_file() {
            return build(cargo, &manifest);
        }
    }
    let found = beside_this_program();
    if let Some((runner, true)) = &found {
        tracing::warn!(
            runner = %runner.display(),
            "the runner beside this program is older than it: `cargo build --workspace --bins` \
             builds both"
        );
    }
    found.map(|(runner, _)| runner).ok_or_else(|| {
        std::io::Error::other(format!(
            "no {RUNNER_COMMAND} binary found: build it with `cargo build --workspace --bins`, \
             run through cargo, or set {RUNNER_VAR} to its path"
        ))
    })
}

/// The runner `path` names, made absolute (the agent links it from a directory of its own);
/// an error at once when it is no file, rather than every step failing later.
fn named(path: &Path) -> std::io::Result<PathBuf> {
    std::fs::canonicalize(path)
        .ok()
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            std::io::Error::other(format!(
                "{RUNNER_VAR}={} names no runner binary",
                path.display()
            ))
        })
}

/// Builds the runner's binary with the profile this program was built with, and returns the
/// path cargo reports for it.
fn build(cargo: OsString, manifest: &Path) -> std::io::Result<PathBuf> {
    eprintln!("Building {RUNNER_COMMAND} (the GPU node's runner, which the local agent runs)...");
    let mut command = Command::new(cargo);
    command
        .args([
            "build",
            "--quiet",
            "--message-format=json-render-diagnostics",
        ])
        .args(["-p", RUNNER_PACKAGE, "--bin", RUNNER_COMMAND])
        .arg("--manifest-path")
        .arg(manifest)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    let out = command.output()?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "building {RUNNER_COMMAND} failed ({}): see cargo's messages above",
            out.status
        )));
    }
    executable(&String::from_utf8_lossy(&out.stdout))
        .ok_or_else(|| std::io::Error::other(format!("cargo built no {RUNNER_COMMAND} executable")))
}

/// The runner's executable in cargo's JSON messages (one object a line).
fn executable(messages: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == RUNNER_COMMAND)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
}

/// `kernelbot-runner` in this program's directory or the one above (a test binary lives in
/// `target/<profile>/deps/`), and whether it is older than this program (built before it,
/// perhaps from older code).
fn beside_this_program() -> Option<(PathBuf, bool)> {
    let exe = std::env::current_exe().ok()?;
    let runner = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(RUNNER_COMMAND))
        .find(|p| p.is_file())?;
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let older = matches!((modified(&runner), modified(&exe)), (Some(r), Some(e)) if r < e);
    Some((runner, older))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runner_is_read_from_cargo_s_messages() {
        let messages = concat!(
            r#"{"reason":"compiler-artifact","target":{"name":"kernelbot_protocol"},"executable":null}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"name":"kernelbot-runner"},"executable":"/t/debug/kernelbot-runner"}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
            "\n"
        );
        assert_eq!(
            executable(messages),
            Some(PathBuf::from("/t/debug/kernelbot-runner"))
        );
        assert_eq!(executable(r#"{"reason":"build-finished"}"#), None);
        assert_eq!(executable("not json\n"), None);
    }

    #[test]
    fn a_named_runner_is_made_absolute_and_must_exist() {
        let dir = tempfile::tempdir().expect("a directory");
        let runner = dir.path().join("kernelbot-runner");
        std::fs::write(&runner, "#!/bin/sh\n").expect("written");
        let relative = dir.path().join("sub/../kernelbot-runner");
        std::fs::create_dir(dir.path().join("sub")).expect("made");
        let found = named(&relative).expect("found");
        assert!(
            found.is_absolute() && found.ends_with("kernelbot-runner"),
            "{found:?}"
        );
        assert_eq!(found, runner.canonicalize().expect("canonical"));
        let missing = named(Path::new("no/such/kernelbot-runner")).expect_err("refused");
        assert!(missing.to_string().contains(RUNNER_VAR), "{missing}");
        assert!(named(dir.path()).is_err(), "a directory is no runner");
    }
}
