//! The old way of reading `result.json`, kept as the oracle the streaming read is checked
//! against: parse the whole file, then cap it. Exactly what it kept, the streaming read keeps.

use std::collections::BTreeMap;

use super::{EvalResult, FullResult, RunResult, SystemInfo, cap, caps, is_report};

/// Parses `result.json` whole, then caps it.
pub(super) fn parse(bytes: &[u8]) -> Result<FullResult, serde_json::Error> {
    let mut parsed: FullResult = serde_json::from_slice(bytes)?;
    parsed.cap();
    Ok(parsed)
}

impl FullResult {
    fn cap(&mut self) {
        cap(&mut self.error, caps::TEXT);
        self.system.cap();
        self.runs.retain(|name, _| name.len() <= caps::NAME);
        if self.runs.len() > caps::RUNS {
            // Kernelbot's own runs are kept first.
            let keep: Vec<String> = self
                .ordered_runs()
                .into_iter()
                .take(caps::RUNS)
                .map(|(name, _)| name.to_owned())
                .collect();
            self.runs.retain(|name, _| keep.contains(name));
        }
        for eval in self.runs.values_mut() {
            eval.cap();
        }
        if let Some(by) = self.written_by.as_mut() {
            by.cap();
        }
    }
}

impl SystemInfo {
    fn cap(&mut self) {
        for s in [
            &mut self.gpu,
            &mut self.cpu,
            &mut self.runtime,
            &mut self.platform,
            &mut self.torch,
            &mut self.hostname,
        ] {
            cap(s, caps::SHORT);
        }
    }
}

impl EvalResult {
    fn cap(&mut self) {
        for t in [self.start.as_mut(), self.end.as_mut()]
            .into_iter()
            .flatten()
        {
            cap(t, caps::SHORT);
        }
        if let Some(c) = self.compilation.as_mut() {
            cap(&mut c.nvcc_version, caps::SHORT);
            cap(&mut c.command, caps::TEXT);
            cap(&mut c.stdout, caps::LOG);
            cap(&mut c.stderr, caps::LOG);
        }
        if let Some(r) = self.run.as_mut() {
            cap(&mut r.command, caps::TEXT);
            cap(&mut r.stdout, caps::LOG);
            cap(&mut r.stderr, caps::LOG);
            r.cap_result();
        }
        if let Some(p) = self.profile.as_mut() {
            cap(&mut p.profiler, caps::SHORT);
            if let Some(t) = p.trace.as_mut() {
                cap(t, caps::LOG);
            }
            if let Some(u) = p.download_url.as_mut() {
                cap(u, caps::TEXT);
            }
        }
    }
}

impl RunResult {
    /// Keeps at most [`caps::ENTRIES`] entries with short keys; every value becomes text of
    /// at most [`caps::VALUE`] characters (the pipe protocol only ever carries text).
    /// The profiler's reports are the exception: kept whole up to [`caps::REPORTS`] in all,
    /// and beyond that dropped with a note in `<key>_dropped`.
    fn cap_result(&mut self) {
        let entries = std::mem::take(&mut self.result);
        let mut reports_left = caps::REPORTS;
        let mut kept = BTreeMap::new();
        for (k, v) in entries
            .into_iter()
            .filter(|(k, _)| k.len() <= caps::NAME)
            .take(caps::ENTRIES)
        {
            let mut text = match v {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            if is_report(&k) {
                if text.len() > reports_left {
                    let note = format!(
                        "{} bytes: over the {} KiB kept",
                        text.len(),
                        caps::REPORTS / 1024
                    );
                    kept.insert(format!("{k}_dropped"), serde_json::Value::String(note));
                    continue;
                }
                reports_left -= text.len();
            } else {
                cap(&mut text, caps::VALUE);
            }
            kept.insert(k, serde_json::Value::String(text));
        }
        self.result = kept;
    }
}
