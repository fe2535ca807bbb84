//! The runner image's build stage (`infra/buildkite/Dockerfile`), replayed as Docker runs it:
//! exactly what its `COPY` lines copy (through `.dockerignore`) into an empty directory, its
//! `cargo` command there, then the binary the final stage takes, run on a payload. No Docker
//! and no base image are needed: the stage's other commands only install the toolchain this
//! machine already has.

use std::path::{Path, PathBuf};
use std::process::Command;

use kernelbot_dispatch::payload;

use crate::runner::{checkout, config, run_binary};

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// One instruction, continuation lines joined.
fn instructions(dockerfile: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in dockerfile.lines() {
        let line = line.trim();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => pending.push_str(part),
            None => {
                pending.push_str(line);
                let (op, args) = pending.split_once(' ').unwrap_or((&pending, ""));
                out.push((op.to_uppercase(), args.trim().to_owned()));
                pending.clear();
            }
        }
    }
    out
}

/// What the image build does, read off the Dockerfile.
#[derive(Default)]
struct Recipe {
    workdir: String,
    /// `COPY <sources…> <dest>` of the build stage.
    copies: Vec<(Vec<String>, String)>,
    /// The build stage's `cargo …` commands.
    builds: Vec<String>,
    /// `COPY --from=build <path> <dest>` of the final stage.
    taken: Vec<(String, String)>,
}

fn recipe(dockerfile: &str) -> Recipe {
    let mut recipe = Recipe::default();
    let mut stage = String::new();
    for (op, args) in instructions(dockerfile) {
        let words: Vec<String> = args.split_whitespace().map(str::to_owned).collect();
        match op.as_str() {
            "FROM" => {
                stage = match words.as_slice() {
                    [_, as_, name] if as_.eq_ignore_ascii_case("as") => name.clone(),
                    _ => String::new(),
                }
            }
            "WORKDIR" if stage == "build" => recipe.workdir = args,
            "COPY" if stage == "build" => {
                let (dest, sources) = words.split_last().expect("COPY has a destination");
                assert!(
                    sources.iter().all(|s| !s.starts_with("--")),
                    "the build stage copies from the context only: {args}"
                );
                recipe.copies.push((sources.to_vec(), dest.clone()));
            }
            "RUN" if stage == "build" && args.starts_with("cargo ") => recipe.builds.push(args),
            "COPY" if words.first().is_some_and(|w| w == "--from=build") => {
                recipe.taken.push((words[1].clone(), words[2].clone()));
            }
            _ => {}
        }
    }
    recipe
}

/// The build context: the paths `.dockerignore` lets in. It is written as an allowlist
/// (`*`, then `!path` lines); the replay understands only that form, and says so.
fn context() -> Vec<PathBuf> {
    let ignore = std::fs::read_to_string(Path::new(REPO).join(".dockerignore"))
        .expect(".dockerignore keeps the context small");
    let patterns: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        patterns.first(),
        Some(&"*"),
        "an allowlist: everything out first"
    );
    patterns[1..]
        .iter()
        .map(|p| {
            let path = p.strip_prefix('!').expect("then only exceptions");
            assert!(!path.contains(['*', '?', '[']), "plain paths only: {p}");
            PathBuf::from(path)
        })
        .collect()
}

fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap();
    }
}

/// Copies what one `COPY` line copies: a source names a path of the context (`.` all of it);
/// a directory's contents land in the destination, a file in it.
fn copy(context: &[PathBuf], sources: &[String], dest: &Path) {
    for source in sources {
        let source = Path::new(source.trim_end_matches('/'));
        for admitted in context {
            let (from, to) = if source == Path::new(".") {
                (Path::new(REPO).join(admitted), dest.join(admitted))
            } else if let Ok(rest) = source.strip_prefix(admitted) {
                let from = Path::new(REPO).join(admitted).join(rest);
                let to = if from.is_dir() {
                    dest.to_owned()
                } else {
                    dest.join(source.file_name().unwrap())
                };
                (from, to)
            } else {
                continue;
            };
            assert!(from.exists(), "the context lacks {}", from.display());
            copy_tree(&from, &to);
        }
    }
}

/// Runs one of the stage's commands in `dir` with only what a build container would have:
/// the toolchain on PATH, nothing of this test run's Cargo settings.
fn run_build(command: &str, dir: &Path) {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(command).current_dir(dir).env_clear();
    for keep in [
        "PATH",
        "HOME",
        "CARGO_HOME",
        "RUSTUP_HOME",
        "RUSTUP_TOOLCHAIN",
    ] {
        if let Some(v) = std::env::var_os(keep) {
            cmd.env(keep, v);
        }
    }
    let out = cmd.output().expect("sh runs");
    assert!(
        out.status.success(),
        "`{command}` failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The crates a package's build links, by name.
fn linked_crates(dir: &Path, package: &str) -> Vec<String> {
    let out = Command::new("cargo")
        .args(["tree", "--locked", "--offline", "-p", package])
        .args(["-e", "normal", "--prefix", "none", "--format", "{p}"])
        .current_dir(dir)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The stage builds from what it copies, and the binary it leaves runs a submission. Minutes
/// of a release build: run with the rest of the suite by `--include-ignored`.
#[test]
#[ignore = "a release build of the runner (a minute or two)"]
fn the_runner_image_builds_from_exactly_what_it_copies() {
    let dockerfile = std::fs::read_to_string(Path::new(REPO).join("infra/buildkite/Dockerfile"))
        .expect("the Dockerfile");
    let recipe = recipe(&dockerfile);
    assert!(!recipe.builds.is_empty(), "the build stage runs cargo");
    let root = tempfile::tempdir().unwrap();
    let workdir = root.path().join(recipe.workdir.trim_start_matches('/'));
    std::fs::create_dir_all(&workdir).unwrap();
    let context = context();
    for (sources, dest) in &recipe.copies {
        copy(&context, sources, &workdir.join(dest));
    }
    for command in &recipe.builds {
        run_build(command, &workdir);
    }

    let [(built, installed)] = recipe.taken.as_slice() else {
        panic!("the final stage takes one binary from the build stage");
    };
    let rel = Path::new(built)
        .strip_prefix(&recipe.workdir)
        .expect("the binary is under the build's WORKDIR");
    let binary = workdir.join(rel);
    assert!(binary.is_file(), "{built} was not built");

    // Neither the service's clients nor its store: nothing of them is linked, or named.
    let crates = linked_crates(&workdir, "kernelbot-runner");
    assert!(crates.iter().any(|c| c == "serde_json"), "{crates:?}");
    // What it shares with the service comes through the protocol crate only.
    assert!(
        crates.iter().any(|c| c == "kernelbot-protocol"),
        "{crates:?}"
    );
    for absent in [
        "aws-",
        "rusqlite",
        "libsqlite3-sys",
        "kernelbot-dispatch",
        "reqwest",
    ] {
        assert!(
            !crates.iter().any(|c| c.starts_with(absent)),
            "the runner links {absent}: {crates:?}"
        );
    }
    let bytes = std::fs::read(&binary).unwrap();
    for absent in [
        &b"aws-smithy"[..],
        b"aws-sdk",
        b"rusqlite",
        b"SQLite format",
    ] {
        assert!(
            !bytes.windows(absent.len()).any(|w| w == absent),
            "the binary holds {:?}",
            String::from_utf8_lossy(absent)
        );
    }

    // What the pipeline calls it by, and what it does with a payload.
    let dir = tempfile::tempdir().unwrap();
    let named = dir.path().join(Path::new(installed).file_name().unwrap());
    std::fs::copy(&binary, &named).unwrap();
    let checkout = checkout();
    let run = run_binary(
        &named,
        checkout.path(),
        &[(
            "KERNELBOT_PAYLOAD",
            payload::encode(&config("pass", "test")).unwrap(),
        )],
        None,
    );
    assert_eq!(run.code, 0, "{}", run.stdout);
    let result = run.result.expect("result.json");
    assert!(result.success, "{:?}", result.error);
    let test = result.runs["test"].run.as_ref().expect("the tests ran");
    assert!(test.passed, "{test:?}");
}
