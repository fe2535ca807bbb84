//! What goes into the Lambda binaries: `cargo lambda build` (and so `sam build`) builds them
//! without the embedded SQLite store and the local stand-ins, which only local runs, tests
//! and benchmarks use.

use std::process::Command;

fn cargo(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The crates linked into a build with `features`, one name per line.
fn linked(features: &[&str]) -> Vec<String> {
    let mut args = vec!["tree", "--locked", "-p", "kernelbot-dispatch"];
    args.extend_from_slice(&["-e", "normal", "--prefix", "none"]);
    args.extend_from_slice(features);
    cargo(&args)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn the_lambda_build_leaves_the_embedded_store_out() {
    let meta: serde_json::Value =
        serde_json::from_str(&cargo(&["metadata", "--format-version", "1", "--no-deps"]))
            .expect("metadata");
    let service = meta["packages"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "kernelbot-dispatch"))
        .expect("the service's package");
    assert_eq!(
        service["metadata"]["lambda"]["build"]["no_default_features"],
        serde_json::Value::Bool(true),
        "cargo lambda build must build without default features"
    );
    let sqlite = |crates: &[String]| crates.iter().any(|c| c == "rusqlite");
    assert!(sqlite(&linked(&[])), "local builds have the embedded store");
    let lambda = linked(&["--no-default-features"]);
    assert!(!sqlite(&lambda), "{lambda:?}");
    // The stand-ins' own dependency (the template reader) stays out with them.
    assert!(!lambda.iter().any(|c| c == "serde_yaml_ng"), "{lambda:?}");
    assert!(lambda.iter().any(|c| c == "aws-sdk-dynamodb"));
}

/// The Lambda zips as the docs build them: `sam build` on a copy of the repository as a clone
/// has it (the tracked files: the template's `CodeUri` is the whole tree), for x86_64 (this
/// machine has no aarch64 Rust target; the arm64 build is the same recipe for another
/// target). Each function's `bootstrap` is built, an executable of that architecture.
/// Minutes of release builds: run with the rest of the suite by `--include-ignored`.
#[test]
#[ignore = "sam build: three release builds (several minutes)"]
fn sam_builds_every_function_from_a_fresh_clone() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let clone = tempfile::tempdir().unwrap();
    let tracked = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(repo)
        .output()
        .expect("git runs");
    assert!(tracked.status.success());
    for path in tracked.stdout.split(|b| *b == 0).filter(|p| !p.is_empty()) {
        let path = std::path::Path::new(std::str::from_utf8(path).unwrap());
        let to = clone.path().join(path);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(repo.join(path), &to).unwrap();
    }
    let out = Command::new("sam")
        .args([
            "build",
            "--beta-features",
            "--parameter-overrides",
            "Architecture=x86_64",
        ])
        .current_dir(clone.path())
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("sam (aws-sam-cli, installed by scripts/test.sh) runs");
    let log = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "sam build failed:\n{log}");
    for function in ["SubmitFunction", "WebhookFunction", "SweepFunction"] {
        let bootstrap = clone
            .path()
            .join(".aws-sam/build")
            .join(function)
            .join("bootstrap");
        let bytes = std::fs::read(&bootstrap).unwrap_or_else(|e| panic!("{function}: {e}"));
        // An ELF executable for x86-64 (e_machine 62).
        assert_eq!(&bytes[..4], b"\x7fELF", "{function}");
        assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), 62, "{function}");
    }
}
