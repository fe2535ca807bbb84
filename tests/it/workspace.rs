//! The workspace's shape as `cargo metadata` reads it: the service, the GPU node's runner and
//! the protocol crate both speak; the service names no crate that ships a binary (the local
//! stack runs the runner as a program), and the runner names nothing of the service.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// `cargo metadata` of the workspace, offline and without the dependency graph.
fn metadata() -> Value {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--no-deps",
        ])
        .current_dir(REPO)
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

fn package<'a>(meta: &'a Value, name: &str) -> &'a Value {
    meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("the workspace has no package {name}"))
}

/// The names of a package's dependencies of every kind (normal, dev, build).
fn dependencies(package: &Value) -> Vec<String> {
    package["dependencies"]
        .as_array()
        .map(|ds| {
            ds.iter()
                .filter_map(|d| d["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn ships_a_binary(package: &Value) -> bool {
    package["targets"].as_array().is_some_and(|ts| {
        ts.iter().any(|t| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"))
        })
    })
}

/// The directory a package's manifest is in, relative to the repository.
fn dir_of(package: &Value) -> String {
    let manifest = Path::new(package["manifest_path"].as_str().expect("a manifest path"));
    let dir = manifest.parent().expect("the manifest's directory");
    let repo = Path::new(REPO)
        .canonicalize()
        .expect("the repository's path");
    let dir = dir.canonicalize().expect("the package's path");
    dir.strip_prefix(&repo)
        .expect("a member under the repository")
        .display()
        .to_string()
}

#[test]
fn the_runner_and_the_protocol_crate_sit_side_by_side_and_only_the_protocol_is_shared() {
    let meta = metadata();
    let service = package(&meta, "kernelbot-dispatch");
    let runner = package(&meta, "kernelbot-runner");
    let protocol = package(&meta, "kernelbot-protocol");
    assert_eq!(dir_of(service), "");
    assert_eq!(dir_of(runner), "infra/runner");
    assert_eq!(dir_of(protocol), "infra/protocol");

    // Each side names the protocol; neither names the other.
    let (service_deps, runner_deps) = (dependencies(service), dependencies(runner));
    assert!(service_deps.iter().any(|d| d == "kernelbot-protocol"));
    assert!(runner_deps.iter().any(|d| d == "kernelbot-protocol"));
    assert!(!service_deps.iter().any(|d| d == "kernelbot-runner"));
    assert!(!runner_deps.iter().any(|d| d == "kernelbot-dispatch"));
    // The protocol is a library that names neither side.
    assert!(!ships_a_binary(protocol));
    assert!(ships_a_binary(runner));
    let protocol_deps = dependencies(protocol);
    assert!(
        !protocol_deps.iter().any(|d| d.starts_with("kernelbot")),
        "{protocol_deps:?}"
    );
}

#[test]
fn the_service_s_manifest_names_no_crate_that_ships_a_binary() {
    let meta = metadata();
    let service = package(&meta, "kernelbot-dispatch");
    // The workspace's crates (the ones this repository ships) that have a binary besides the
    // service's own: the check can fail, since the runner is one.
    let with_bins: Vec<&str> = meta["packages"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter(|p| p["name"] != "kernelbot-dispatch" && ships_a_binary(p))
                .filter_map(|p| p["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    assert!(with_bins.contains(&"kernelbot-runner"), "{with_bins:?}");
    for dep in dependencies(service) {
        assert!(
            !with_bins.contains(&dep.as_str()),
            "the service names {dep}, which ships a binary"
        );
    }
}
