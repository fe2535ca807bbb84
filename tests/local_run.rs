//! The README's local command: the whole system on this machine, ending with a finished job
//! and its Discord report printed.

use std::process::Command;

#[test]
fn the_local_run_finishes_a_job_and_prints_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_local"))
        .env("KERNELBOT_DATA_DIR", dir.path())
        .env("RUST_LOG", "warn")
        .output()
        .expect("local runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("POST /submissions → 202"), "{stdout}");
    assert!(stdout.contains("\"finished\""), "{stdout}");
    assert!(
        stdout.contains("✅ success") && stdout.contains("Passed 3/3 tests"),
        "{stdout}"
    );
    assert!(
        dir.path().join("jobs.sqlite3").exists(),
        "the embedded store was used"
    );
}
