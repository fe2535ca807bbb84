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
