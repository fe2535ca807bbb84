//! Running one evaluation program the way kernelbot's `run_program` does: a pipe whose write
//! end the program finds in `POPCORN_FD` for its `key: value` verdict lines, captured and
//! capped stdout/stderr, and a timeout; the program runs in the runner's [`Sandbox`].

use std::io::{PipeReader, Read};
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use super::sandbox::Sandbox;
use kernelbot_protocol::result::{RunResult, exit_code};

/// Kernelbot keeps at most this much of each output stream.
pub(super) const MAX_OUTPUT: usize = 16 * 1024;
/// We hold at most this much of a stream in memory while the program runs.
const KEEP_BYTES: usize = 64 * 1024;
/// The verdict pipe carries a few KiB at most; more is ignored.
const MAX_PIPE: usize = 1024 * 1024;
/// How long we wait for the output streams to close once the program has ended.
const READER_GRACE: Duration = Duration::from_secs(5);

type Stream = Box<dyn Read + Send>;

/// A stream's head, plus how many lines followed it.
struct Captured {
    head: Vec<u8>,
    dropped_lines: usize,
    dropped_partial: bool,
}

fn capture(mut from: impl Read, keep: usize) -> Captured {
    let mut head = Vec::new();
    let mut dropped_lines = 0;
    let mut dropped_partial = false;
    let mut buf = [0u8; 8192];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let room = keep.saturating_sub(head.len()).min(n);
        head.extend_from_slice(&buf[..room]);
        let rest = &buf[room..n];
        dropped_lines += rest.iter().filter(|b| **b == b'\n').count();
        dropped_partial |= !rest.is_empty();
    }
    Captured {
        head,
        dropped_lines,
        dropped_partial,
    }
}

/// Kernelbot's `_limit_length`: whole lines while they fit, then `[...] N lines omitted`.
pub(super) fn limit_length(text: &str, omitted_after: usize) -> String {
    let lines: Vec<&str> = text.split('\n').collect();
    let mut size = 0;
    for (i, line) in lines.iter().enumerate() {
        size += line.chars().count() + 1;
        if size + 100 > MAX_OUTPUT {
            return format!(
                "{}\n[...] {} lines omitted",
                lines[..i].join("\n"),
                lines.len() - i + omitted_after
            );
        }
    }
    if omitted_after > 0 {
        return format!("{text}\n[...] {omitted_after} lines omitted");
    }
    text.to_owned()
}

impl Captured {
    fn text(&self) -> String {
        let extra =
            self.dropped_lines + usize::from(self.dropped_partial && self.dropped_lines == 0);
        limit_length(&String::from_utf8_lossy(&self.head), extra)
    }
}

fn quote(args: &[String]) -> String {
    shlex::try_join(args.iter().map(String::as_str)).unwrap_or_else(|_| args.join(" "))
}

/// Parses the verdict pipe: `key: value` lines (kernelbot's `line.partition(":")`).
pub(super) fn parse_verdict(text: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(':').unwrap_or((line, ""));
            (!key.is_empty() || !value.is_empty())
                .then(|| (key.trim().to_owned(), value.trim().into()))
        })
        .collect()
}

/// A run that could not start (or whose infrastructure failed), as kernelbot reports one.
fn failed(args: &[String], stderr: String, code: i64) -> RunResult {
    RunResult {
        success: false,
        passed: false,
        command: quote(args),
        stderr,
        exit_code: code,
        ..Default::default()
    }
}

/// Starts `args` in the sandbox with the pipe's write end as `POPCORN_FD`; the child and the
/// pipe's read end.
fn start(
    sandbox: &Sandbox,
    args: &[String],
    dir: &Path,
    env: &[(&str, String)],
) -> Result<(Child, PipeReader), RunResult> {
    let Some((program, rest)) = args.split_first() else {
        return Err(failed(args, "nothing to run".into(), -1));
    };
    let (reader, writer) = std::io::pipe()
        .map_err(|e| failed(args, format!("cannot create the result pipe: {e}"), -1))?;
    let fd = writer.as_raw_fd();
    let mut cmd = sandbox.command(program, dir);
    cmd.args(rest)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("POPCORN_FD", fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: runs in the child between fork and exec and only clears close-on-exec on the
    // pipe's write end, so the program inherits it as POPCORN_FD.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| failed(args, format!("cannot start {program}: {e}"), 127))?;
    // Our copy of the write end must go, or the reader never sees the end of the pipe.
    drop(writer);
    Ok((child, reader))
}

/// Reads stdout (0), stderr (1) and the verdict pipe (2) on threads of their own. They report
/// through a channel, so a process that escaped the group and still holds a stream open
/// cannot keep us waiting past the grace period.
fn read_streams(child: &mut Child, pipe: PipeReader) -> Receiver<(u8, Captured)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let readers: [(u8, Option<Stream>, usize); 3] = [
        (
            0,
            child.stdout.take().map(|s| Box::new(s) as Stream),
            KEEP_BYTES,
        ),
        (
            1,
            child.stderr.take().map(|s| Box::new(s) as Stream),
            KEEP_BYTES,
        ),
        (2, Some(Box::new(pipe)), MAX_PIPE),
    ];
    for (id, stream, keep) in readers {
        if let Some(stream) = stream {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let _ = tx.send((id, capture(stream, keep)));
            });
        }
    }
    rx
}

/// The child's exit, or `None` once `timeout` has passed since `started`.
fn wait(child: &mut Child, started: Instant, timeout: Duration) -> Option<ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if started.elapsed() >= timeout => return None,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => return None,
        }
    }
}

/// What the streams captured (stdout, stderr, verdict), as far as they closed in time.
fn collect(rx: &Receiver<(u8, Captured)>) -> (String, String, String) {
    let mut streams: [Option<Captured>; 3] = [None, None, None];
    let grace = Instant::now() + READER_GRACE;
    while let Ok((id, captured)) = rx.recv_timeout(grace.saturating_duration_since(Instant::now()))
    {
        streams[usize::from(id)] = Some(captured);
    }
    let [stdout, stderr, verdict] = streams;
    (
        stdout.map(|c| c.text()).unwrap_or_default(),
        stderr.map(|c| c.text()).unwrap_or_default(),
        verdict
            .map(|c| String::from_utf8_lossy(&c.head).into_owned())
            .unwrap_or_default(),
    )
}

/// Runs `args` in `dir` inside `sandbox` with `env` added, and returns kernelbot's
/// `RunResult`. Every process the program started is gone when this returns.
pub(super) fn run_program(
    sandbox: &Sandbox,
    args: &[String],
    dir: &Path,
    env: &[(&str, String)],
    timeout: Duration,
) -> RunResult {
    let started = Instant::now();
    let (mut child, pipe) = match start(sandbox, args, dir, env) {
        Ok(started) => started,
        Err(failed) => return failed,
    };
    let pgid = child.id();
    let streams = read_streams(&mut child, pipe);
    let status = wait(&mut child, started, timeout);
    let duration = started.elapsed().as_secs_f64();
    // Whatever the program left behind (daemons, background jobs) goes too, and on a
    // timeout the program itself. Its zombie may be reaped there, so `wait` may find none.
    sandbox.end_processes(pgid);
    if status.is_none() {
        let _ = child.wait();
    }
    let (stdout, stderr, verdict) = collect(&streams);
    let Some(status) = status else {
        return RunResult {
            success: false,
            passed: false,
            command: quote(args),
            stdout,
            stderr,
            exit_code: exit_code::TIMEOUT_EXPIRED,
            duration: timeout.as_secs_f64(),
            result: Default::default(),
        };
    };
    let code = status
        .code()
        .map_or_else(|| -i64::from(status.signal().unwrap_or(0)), i64::from);
    let result = parse_verdict(&verdict);
    RunResult {
        success: code == 0 || code == exit_code::VALIDATE_FAIL,
        passed: result.get("check").and_then(|v| v.as_str()) == Some("pass"),
        command: quote(args),
        stdout,
        stderr,
        exit_code: code,
        duration,
        result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_verdict_lines_like_kernelbot() {
        let r = parse_verdict("check: pass\ntest-count: 2\n\nmessage: a: b\nnocolon\n");
        assert_eq!(r["check"], "pass");
        assert_eq!(r["message"], "a: b");
        assert_eq!(r["nocolon"], "");
        assert_eq!(r.len(), 4);
    }

    #[test]
    fn limits_output_by_whole_lines() {
        let text = "x".repeat(100) + "\n";
        let long = text.repeat(500);
        let limited = limit_length(&long, 0);
        assert!(limited.len() <= MAX_OUTPUT);
        assert!(
            limited.ends_with("lines omitted"),
            "{}",
            &limited[limited.len() - 40..]
        );
        assert_eq!(limit_length("short", 0), "short");
        assert_eq!(limit_length("short", 3), "short\n[...] 3 lines omitted");
    }
}
