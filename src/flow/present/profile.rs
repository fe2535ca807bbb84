//! A profile run as Discord shows it: the benchmark it profiled, the headline of Nsight's
//! tables (the first kernel and its throughput), and the link to its files.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use crate::discord::Field;
use crate::result::FullResult;
use crate::text::{plain, span};

/// Profile runs a message shows (Discord allows 25 fields an embed).
const MAX_SHOWN: usize = 5;
/// Lines of a profile's tables a field shows.
const HEADLINE_LINES: usize = 3;
/// Characters of a line a field shows (a templated kernel's name can run to thousands).
const LINE_CHARS: usize = 150;

/// A field for each profile run, in order: its benchmark, its tables' headline, its link.
pub(super) fn fields(result: &FullResult) -> Vec<Field> {
    let mut runs: Vec<(usize, &crate::result::EvalResult)> = result
        .runs
        .iter()
        .filter_map(|(name, eval)| Some((name.strip_prefix("profile.")?.parse().ok()?, eval)))
        .collect();
    runs.sort_by_key(|(i, _)| *i);
    runs.into_iter()
        .take(MAX_SHOWN)
        .filter_map(|(i, eval)| {
            let profile = eval.profile.as_ref()?;
            // The link first: whatever follows may be cut to fit.
            let mut lines = vec![match &profile.download_url {
                // Our own link (a program's is never kept): shown as it is.
                Some(url) => format!(
                    "[Download the {} files](<{url}>)",
                    plain(&short(&profile.profiler))
                ),
                None => "No download for this run.".into(),
            }];
            let run = eval.run.as_ref();
            if let Some(spec) = run.and_then(|r| r.value("benchmark.0.spec")) {
                lines.push(span(&short(&spec)));
            }
            let report = run.and_then(|r| r.value("benchmark.0.report"));
            lines.extend(report.as_deref().map(headline).unwrap_or_default());
            Some(Field {
                name: format!("Profile {i}"),
                value: lines.join("\n"),
                inline: false,
            })
        })
        .collect()
}

/// The first lines of a profile's tables (base64, with kernelbot's `+*` alphabet or the
/// standard one): the first kernel and the first rows of its first table.
fn headline(encoded: &str) -> Vec<String> {
    let Ok(bytes) = STANDARD.decode(encoded.trim().replace('*', "/")) else {
        return vec![];
    };
    let text = String::from_utf8_lossy(&bytes);
    text.lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with("---")
                && !l.starts_with("Table Name")
                && !l.starts_with("Metric Name")
        })
        .take(HEADLINE_LINES)
        .map(|l| span(&short(l)))
        .collect()
}

/// `line`, cut to [`LINE_CHARS`] characters.
fn short(line: &str) -> String {
    match line.char_indices().nth(LINE_CHARS) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::{EvalResult, ProfileResult, RunResult};

    fn profiled(report: &str, url: Option<&str>) -> EvalResult {
        let mut run = RunResult {
            success: true,
            passed: true,
            ..Default::default()
        };
        run.result
            .insert("benchmark.0.spec".into(), "size: 1024".into());
        run.result
            .insert("benchmark.0.report".into(), STANDARD.encode(report).into());
        EvalResult {
            run: Some(run),
            profile: Some(ProfileResult {
                profiler: "Nsight-Compute".into(),
                trace: None,
                download_url: url.map(str::to_owned),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn each_profile_shows_its_benchmark_headline_and_link() {
        let report = "  custom_kernel(float*) (1, 1, 1)x(1, 1, 1)\n\n    Table Name : GPU Throughput\n    ----\n    Metric Name  Unit  Value\n    Memory Throughput  %  71.93\n    Compute (SM) Throughput  %  12.07\n    L1/TEX Hit Rate  %  10.00\n";
        let mut result = FullResult::default();
        result
            .runs
            .insert("profile.1".into(), profiled(report, None));
        result.runs.insert(
            "profile.0".into(),
            profiled(
                report,
                Some("https://s.example/submissions/kb/profiles/0?expires=1&signature=ab"),
            ),
        );
        result.runs.insert("test".into(), EvalResult::default());
        let fields = fields(&result);
        assert_eq!(
            fields.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
            ["Profile 0", "Profile 1"]
        );
        let shown = &fields[0].value;
        assert!(shown.contains("`size: 1024`"), "{shown}");
        assert!(shown.contains("custom_kernel(float*)"), "{shown}");
        assert!(shown.contains("Memory Throughput  %  71.93"), "{shown}");
        assert!(
            shown.contains("Compute (SM) Throughput  %  12.07"),
            "{shown}"
        );
        assert!(!shown.contains("L1/TEX"), "three lines at most: {shown}");
        assert!(
            shown.contains(
                "[Download the Nsight-Compute files](<https://s.example/submissions/kb/profiles/0?"
            ),
            "{shown}"
        );
        assert!(fields[1].value.contains("No download"));
    }

    #[test]
    fn long_lines_are_cut_so_the_link_always_shows() {
        let kernel = format!("  kernel<{}>()", "float, ".repeat(500));
        let mut result = FullResult::default();
        let mut eval = profiled(&kernel, Some("https://s.example/l"));
        if let Some(run) = eval.run.as_mut() {
            run.result
                .insert("benchmark.0.spec".into(), "x".repeat(2048).into());
        }
        result.runs.insert("profile.0".into(), eval);
        let value = &fields(&result)[0].value;
        assert!(value.starts_with("[Download the Nsight-Compute files](<https://s.example/l>)"));
        assert!(value.len() < 1024, "{}", value.len());
    }

    #[test]
    fn a_report_that_is_not_base64_shows_no_headline() {
        assert!(headline("%%% not base64").is_empty());
        assert_eq!(headline(&STANDARD.encode("  k()\n")), ["`k()`"]);
    }
}
