//! The docs and the code agree, read from the docs' own text: every environment variable the
//! code reads is documented in `docs/configuration.md` and every documented one is read; the
//! deployment's secret holds exactly the keys `template.yaml` and the docs list.

use std::collections::BTreeSet;
use std::path::Path;

use kernelbot_dispatch::config::SECRET_KEYS;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(REPO).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A name of the environment's shape: `NVCC`, `KERNELBOT_PAYLOAD`.
fn is_variable(s: &str) -> bool {
    s.len() >= 4
        && s.starts_with(|c: char| c.is_ascii_uppercase())
        && s.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// The names in backticks in the first cell of each table row of `doc`'s section `heading`
/// (the whole document when `None`); `LOG_FORMAT=json` names `LOG_FORMAT`.
fn first_cells(doc: &str, heading: Option<&str>) -> BTreeSet<String> {
    let mut inside = heading.is_none();
    let mut names = BTreeSet::new();
    for line in doc.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            inside = heading.is_none_or(|want| h.trim() == want);
            continue;
        }
        let Some(row) = line.strip_prefix('|').filter(|_| inside) else {
            continue;
        };
        let cell = row.split('|').next().unwrap_or_default();
        for quoted in cell.split('`').skip(1).step_by(2) {
            let name = quoted.split('=').next().unwrap_or_default();
            if is_variable(name) {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// The calls through which the code reads a variable: the standard library's and the
/// configuration's own readers (`src/config.rs`, `src/secrets.rs`), which all take the name
/// as a literal.
const READERS: &[&str] = &[
    "var",
    "var_os",
    "lookup",
    "required",
    "secs",
    "url",
    "exact_url",
    "flag",
    "number",
    "present",
    "non_empty",
    "get",
    "or",
    "secrets",
];

/// The function whose call the text before a literal is inside: `lookup(` or `non_empty(lookup, `.
fn calling(before: &str) -> Option<&str> {
    let before = before.trim_end().trim_end_matches('&');
    let open = if before.ends_with('(') {
        before.len() - 1
    } else if before.ends_with(',') {
        before.rfind('(')?
    } else {
        return None;
    };
    // The name is the call's first literal: `or(lookup, "BUILDKITE_COMMIT", "HEAD")` reads one.
    if before[open..].contains('"') {
        return None;
    }
    let name_start = before[..open]
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    Some(&before[name_start..open])
}

/// Variables `text` reads: literal names passed to a reader, and `*_VAR` constants.
fn reads_in(text: &str) -> BTreeSet<String> {
    // Unit tests sit at the end of a file; what they set up is not configuration.
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut names = BTreeSet::new();
    // tracing-subscriber's filter reads its variable by itself.
    if text.contains("EnvFilter::try_from_default_env()") {
        names.insert("RUST_LOG".to_owned());
    }
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (i, literal) in line.split('"').enumerate().skip(1).step_by(2) {
            if !is_variable(literal) {
                continue;
            }
            let before: String = line.split('"').take(i).collect::<Vec<_>>().join("\"");
            let constant = before.contains("_VAR: &str =") || before.contains("_VARS: &[&str] =");
            if constant || calling(&before).is_some_and(|f| READERS.contains(&f)) {
                names.insert(literal.to_owned());
            }
        }
    }
    names
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// What the service, the operator command, the runner and the protocol crate read. The local stand-ins
/// (`src/devstack`) are test machinery: their variables are the test suite's
/// (`tests/README.md`).
fn read_by_the_code() -> BTreeSet<String> {
    let mut files = Vec::new();
    rust_files(&Path::new(REPO).join("src"), &mut files);
    rust_files(&Path::new(REPO).join("infra/runner/src"), &mut files);
    rust_files(&Path::new(REPO).join("infra/protocol/src"), &mut files);
    files
        .iter()
        .filter(|f| !f.components().any(|c| c.as_os_str() == "devstack"))
        .flat_map(|f| reads_in(&std::fs::read_to_string(f).unwrap()))
        .collect()
}

#[test]
fn the_scanner_finds_reads_and_only_reads() {
    let code = r#"
const SECRET_ID_VAR: &str = "KERNELBOT_SECRET_ID";
let python = std::env::var("KERNELBOT_PYTHON").unwrap_or_default();
let port = present("PARAMETERS_SECRETS_EXTENSION_HTTP_PORT");
let s = non_empty(lookup, "SUBMIT_API_TOKEN");
cmd.env("POPCORN_FD", fd.to_string());
// lookup("IN_A_COMMENT")
let gpu = queue_for("H100_BK");
let commit = or(lookup, "BUILDKITE_COMMIT", "HEAD");
pub(crate) const PAYLOAD_VARS: &[&str] = &[payload::PAYLOAD_VAR, "SUBMISSION_PAYLOAD"];
#[cfg(test)]
mod tests { fn t() { lookup("ONLY_IN_TESTS"); } }
"#;
    let found: Vec<String> = reads_in(code).into_iter().collect();
    assert_eq!(
        found,
        [
            "BUILDKITE_COMMIT",
            "KERNELBOT_PYTHON",
            "KERNELBOT_SECRET_ID",
            "PARAMETERS_SECRETS_EXTENSION_HTTP_PORT",
            "SUBMISSION_PAYLOAD",
            "SUBMIT_API_TOKEN"
        ]
    );
}

#[test]
fn every_variable_read_is_documented_and_every_documented_one_is_read() {
    let documented = first_cells(&read("docs/configuration.md"), None);
    let read = read_by_the_code();
    let undocumented: Vec<_> = read.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "read but not in docs/configuration.md: {undocumented:?}"
    );
    let unread: Vec<_> = documented.difference(&read).collect();
    assert!(unread.is_empty(), "documented but never read: {unread:?}");
}

/// The keys the deployment's secret holds, as the docs list them: the section
/// "The deployment's secret" of `docs/configuration.md`.
pub(crate) fn documented_secret_keys() -> Vec<String> {
    first_cells(
        &read("docs/configuration.md"),
        Some("The deployment's secret"),
    )
    .into_iter()
    .collect()
}

/// The keys `template.yaml`'s `SecretName` parameter tells an operator to put in the secret.
fn template_secret_keys() -> Vec<String> {
    let template: serde_yaml_ng::Value = serde_yaml_ng::from_str(&read("template.yaml")).unwrap();
    let description = template["Parameters"]["SecretName"]["Description"]
        .as_str()
        .expect("SecretName describes the secret");
    let words = description.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
    words
        .filter(|w| is_variable(w) && w.contains('_'))
        .map(str::to_owned)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[test]
fn the_secret_holds_the_keys_the_docs_list() {
    let mut code: Vec<String> = SECRET_KEYS.iter().map(|(k, _)| (*k).to_owned()).collect();
    code.sort();
    assert_eq!(documented_secret_keys(), code, "docs/configuration.md");
    assert_eq!(template_secret_keys(), code, "template.yaml's SecretName");
    // And each is a documented variable (a key in the environment wins over the secret).
    let documented = first_cells(&read("docs/configuration.md"), None);
    for key in &code {
        assert!(documented.contains(key), "{key}");
    }
}
