//! Where the evaluated program runs. Submissions are untrusted code on machines vendors lend
//! us, so every program the runner starts (compiler, warm-up, harness) gets:
//!
//! - a uid of its own when the runner is root: one per GPU index, so neighbouring GPUs'
//!   programs never share one, in the GPU device nodes' groups, with no new privileges;
//! - a cleared environment: only [`ENV_ALLOW`], plus `HOME`/`TMPDIR` in its scratch directory;
//! - a scratch directory of its own inside a root-owned parent it cannot rename;
//! - no network (a network namespace of its own) where the kernel lets us make one;
//! - limits on processes, open files, and no core dumps.
//!
//! After each program every process it left behind is killed: the runner is a child
//! subreaper, so orphans and daemons come back to it, and with a uid of its own `kill(-1)`
//! from a child that switched to that uid reaches whatever is left. A PID namespace is not
//! used: Docker's default seccomp profile refuses one, and the two mechanisms above hold
//! without it. What could not be applied, and why, is logged and goes in `result.json`'s
//! top-level `sandbox` object.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;

/// What a program may see of the runner's environment: what CUDA/ROCm, torch and Python
/// need, and the GPU visibility the node set. Everything else (agent tokens, cloud keys, the
/// payload) stays with the runner.
pub(super) const ENV_ALLOW: &[&str] = &[
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "LD_LIBRARY_PATH",
    "LIBRARY_PATH",
    "CPATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "ROCM_PATH",
    "HIP_PATH",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "HSA_OVERRIDE_GFX_VERSION",
    "PYTORCH_ROCM_ARCH",
    "TORCH_CUDA_ARCH_LIST",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "OMP_NUM_THREADS",
];

/// First sandbox uid; GPU `i` runs its programs as `UID_BASE + i`. Far above the ranges
/// distributions, systemd's dynamic users and subordinate-uid allocations use.
pub(super) const UID_BASE: u32 = 2_100_000_000;
/// Threads count against this too, and torch starts many.
pub(super) const MAX_PROCESSES: u64 = 4096;
pub(super) const MAX_OPEN_FILES: u64 = 65536;
/// How long the runner keeps killing what a program left behind.
const CLEANUP_LIMIT: Duration = Duration::from_secs(5);

/// The uid, gid and groups programs run as.
#[derive(Clone, Debug, PartialEq)]
struct Identity {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

/// What `result.json`'s `sandbox` object says.
#[derive(Clone, Debug, Default, Serialize)]
pub(super) struct SandboxReport {
    /// The uid programs ran as; `null` when the runner could not switch (not root).
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub groups: Vec<u32>,
    /// Whether programs ran in a network namespace of their own (no network).
    pub network_isolated: bool,
    /// The variables programs were given, by name.
    pub environment: Vec<String>,
    pub limits: Limits,
    /// Processes programs left behind, killed before `result.json` was written.
    pub processes_killed: usize,
    /// Processes still alive after cleanup (none expected): pids.
    pub survivors: Vec<u32>,
    /// What could not be applied, and why.
    pub not_applied: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub(super) struct Limits {
    /// Per-uid process (and thread) limit; `null` when not set (shared uid).
    pub processes: Option<u64>,
    pub open_files: u64,
    pub core_dumps: bool,
}

/// One program's scratch: a root-owned parent the program cannot rename or write, holding
/// its working directory (the program's own) and the read-only cases file.
pub(super) struct Scratch {
    _parent: tempfile::TempDir,
    pub work: PathBuf,
    parent: PathBuf,
}

impl Scratch {
    /// A file in the parent: readable by the program, not writable.
    pub(super) fn read_only_file(&self, name: &str, content: &str) -> io::Result<PathBuf> {
        let path = self.parent.join(name);
        std::fs::write(&path, content)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        Ok(path)
    }
}

pub(super) struct Sandbox {
    identity: Option<Identity>,
    /// `CLONE_NEWNET` alone (root) or with `CLONE_NEWUSER` (not root); `None`: not possible.
    unshare_flags: Option<libc::c_int>,
    env: Vec<(String, String)>,
    open_files: u64,
    report: std::sync::Mutex<SandboxReport>,
}

impl Sandbox {
    /// Decides what can be applied on this machine. `lookup` reads the runner's environment.
    pub(super) fn new(lookup: &dyn Fn(&str) -> Option<String>) -> Self {
        let mut report = SandboxReport::default();
        // Orphans of the program are re-parented to us, so we can find and end them.
        // SAFETY: plain prctl on this process.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            report.not_applied.insert(
                "subreaper".into(),
                format!("prctl refused: {}", io::Error::last_os_error()),
            );
        }
        let identity = match identity(lookup) {
            Ok(id) => Some(id),
            Err(why) => {
                report.not_applied.insert("user".into(), why);
                None
            }
        };
        let unshare_flags = network_isolation(identity.is_some(), &mut report);
        let env: Vec<(String, String)> = ENV_ALLOW
            .iter()
            .filter_map(|k| lookup(k).map(|v| ((*k).to_owned(), v)))
            .collect();
        let open_files = hard_limit(libc::RLIMIT_NOFILE).min(MAX_OPEN_FILES);
        report.describe(identity.as_ref(), unshare_flags.is_some(), &env, open_files);
        for (what, why) in &report.not_applied {
            eprintln!("Sandbox: {what} not applied: {why}");
        }
        Self {
            identity,
            unshare_flags,
            env,
            open_files,
            report: std::sync::Mutex::new(report),
        }
    }

    pub(super) fn report(&self) -> SandboxReport {
        self.report
            .lock()
            .map(|r| r.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// The uid programs run as: the sandbox's, else the runner's own.
    pub(super) fn program_uid(&self) -> u32 {
        // SAFETY: plain syscall.
        self.identity
            .as_ref()
            .map_or_else(|| unsafe { libc::geteuid() }, |id| id.uid)
    }

    /// A fresh scratch directory: the working directory belongs to the program's uid.
    pub(super) fn scratch(&self) -> io::Result<Scratch> {
        let parent = tempfile::Builder::new().prefix("kernelbot-").tempdir()?;
        std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o755))?;
        let work = parent.path().join("work");
        std::fs::create_dir(&work)?;
        std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o700))?;
        let path = parent.path().to_owned();
        Ok(Scratch {
            _parent: parent,
            work,
            parent: path,
        })
    }

    /// Gives everything under `dir` (written by the runner) to the program's uid. Each
    /// directory is handed over after what it holds: until then only root can change it, so
    /// nothing can swap a directory for a symlink under the walk.
    pub(super) fn hand_over(&self, dir: &Path) -> io::Result<()> {
        let Some(id) = &self.identity else {
            return Ok(());
        };
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if std::fs::symlink_metadata(&path)?.is_dir() {
                self.hand_over(&path)?;
            } else {
                std::os::unix::fs::lchown(&path, Some(id.uid), Some(id.gid))?;
            }
        }
        std::os::unix::fs::lchown(dir, Some(id.uid), Some(id.gid))
    }

    /// Removes files from a directory the program owned. As the program's uid, so a
    /// directory it swapped for a symlink cannot turn this into a root's delete elsewhere.
    pub(super) fn remove_files(&self, paths: &[PathBuf]) {
        let Some(id) = &self.identity else {
            for p in paths {
                let _ = std::fs::remove_file(p);
            }
            return;
        };
        let names: Vec<CString> = paths
            .iter()
            .filter_map(|p| CString::new(p.as_os_str().as_bytes()).ok())
            .collect();
        let _ = fork_wait(|| {
            if !become_program(id) {
                return 1;
            }
            for n in &names {
                // SAFETY: a raw syscall on a path made before the fork.
                unsafe { libc::unlink(n.as_ptr()) };
            }
            0
        });
    }

    /// Moves each `(from, to)` the program left, as the program's uid: with its own rights,
    /// whatever links it made along either path (so never as root).
    pub(super) fn move_files(&self, moves: &[(PathBuf, PathBuf)]) {
        let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).ok();
        let pairs: Vec<(CString, CString)> = moves
            .iter()
            .filter_map(|(from, to)| Some((c(from)?, c(to)?)))
            .collect();
        let Some(id) = &self.identity else {
            for (from, to) in moves {
                let _ = std::fs::rename(from, to);
            }
            return;
        };
        let _ = fork_wait(|| {
            if !become_program(id) {
                return 1;
            }
            for (from, to) in &pairs {
                // SAFETY: a raw syscall on paths made before the fork.
                unsafe { libc::rename(from.as_ptr(), to.as_ptr()) };
            }
            0
        });
    }

    /// A command for `program` in `dir`, with the sandbox applied when it starts.
    pub(super) fn command(&self, program: &str, dir: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.current_dir(dir)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("HOME", dir)
            .env("TMPDIR", dir);
        let identity = self.identity.clone();
        let groups: Vec<libc::gid_t> = identity
            .as_ref()
            .map(|i| i.groups.clone())
            .unwrap_or_default();
        let flags = self.unshare_flags;
        let open_files = self.open_files;
        // SAFETY: runs in the child between fork and exec and makes only async-signal-safe
        // calls (setsid, unshare, setrlimit, setgroups, setresgid, setresuid, prctl) on data moved in
        // before the fork.
        unsafe {
            cmd.pre_exec(move || {
                // A session of its own: a process group to end it by, and no controlling
                // terminal to write into the job's log past the output cap.
                check(libc::setsid())?;
                if let Some(flags) = flags {
                    check(libc::unshare(flags))?;
                }
                set_limit(libc::RLIMIT_CORE, 0)?;
                set_limit(libc::RLIMIT_NOFILE, open_files)?;
                if let Some(id) = &identity {
                    set_limit(libc::RLIMIT_NPROC, MAX_PROCESSES)?;
                    check(libc::setgroups(groups.len(), groups.as_ptr()))?;
                    check(libc::setresgid(id.gid, id.gid, id.gid))?;
                    check(libc::setresuid(id.uid, id.uid, id.uid))?;
                }
                check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
                // Set after the uid change, which clears it: the program dies with us.
                check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0))?;
                Ok(())
            });
        }
        cmd
    }

    /// Kills every process the last program left behind: its process group, everything of
    /// the sandbox uid, and every orphan re-parented to us. Returns how many there were.
    pub(super) fn end_processes(&self, pgid: u32) -> usize {
        let me = std::process::id();
        let uid = self.identity.as_ref().map(|i| i.uid);
        let strays = || {
            processes()
                .into_iter()
                .filter(|p| p.alive() && p.pid != me && (p.ppid == me || Some(p.uid) == uid))
                .collect::<Vec<_>>()
        };
        // Counted before the first kill, which would hide them; a timed-out program itself
        // was not left behind.
        let mut seen: BTreeSet<u32> = strays().iter().map(|p| p.pid).collect();
        seen.remove(&pgid);
        kill_group(pgid);
        // Everything of the uid goes at least once, whatever a scan sees: a process may hide
        // behind a leader that looks ended (a zombie whose other threads still run).
        if let Some(uid) = uid {
            kill_all_of(uid);
        }
        let started = Instant::now();
        let survivors = loop {
            reap();
            let strays = strays();
            if strays.is_empty() || started.elapsed() > CLEANUP_LIMIT {
                break strays;
            }
            for p in strays.iter().filter(|p| p.pid != pgid) {
                seen.insert(p.pid);
            }
            for p in &strays {
                // Our own children stay ours until reaped, so their pid cannot be reused.
                if p.ppid == me {
                    // SAFETY: plain syscall on a child of ours.
                    unsafe { libc::kill(p.pid as libc::pid_t, libc::SIGKILL) };
                }
            }
            if let Some(uid) = uid {
                kill_all_of(uid);
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        reap();
        let killed = seen.len();
        if let Ok(mut r) = self.report.lock() {
            r.processes_killed += killed;
            r.survivors.extend(survivors.iter().map(|p| p.pid));
        }
        if !survivors.is_empty() {
            eprintln!(
                "Sandbox: {} process(es) survived cleanup: {:?}",
                survivors.len(),
                survivors.iter().map(|p| p.pid).collect::<Vec<_>>()
            );
        }
        killed
    }
}

/// The namespaces to unshare for a network of the program's own: a new network namespace
/// (with a user namespace too when not root); `None`, and why in the report, when this
/// machine allows neither.
fn network_isolation(as_root: bool, report: &mut SandboxReport) -> Option<libc::c_int> {
    let wanted = if as_root {
        libc::CLONE_NEWNET
    } else {
        libc::CLONE_NEWUSER | libc::CLONE_NEWNET
    };
    match probe_unshare(wanted) {
        Ok(()) => Some(wanted),
        Err(e) => {
            report.not_applied.insert(
                "network".into(),
                format!("a network namespace could not be made ({e}); the program shares the runner's network"),
            );
            None
        }
    }
}

impl SandboxReport {
    /// Records what was applied: the identity, the network, the environment and the limits.
    fn describe(
        &mut self,
        identity: Option<&Identity>,
        network_isolated: bool,
        env: &[(String, String)],
        open_files: u64,
    ) {
        self.uid = identity.map(|i| i.uid);
        self.gid = identity.map(|i| i.gid);
        self.groups = identity.map(|i| i.groups.clone()).unwrap_or_default();
        self.network_isolated = network_isolated;
        self.environment = env.iter().map(|(k, _)| k.clone()).collect();
        self.environment
            .extend(["HOME", "TMPDIR", "POPCORN_FD"].map(String::from));
        self.limits = Limits {
            processes: identity.map(|_| MAX_PROCESSES),
            open_files,
            core_dumps: false,
        };
        if identity.is_none() {
            self.not_applied.insert(
                "process_limit".into(),
                "the uid is shared with the runner's other processes".into(),
            );
        }
    }
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `setrlimit`'s resource type differs between glibc and musl.
#[cfg(target_env = "gnu")]
type Resource = libc::__rlimit_resource_t;
#[cfg(not(target_env = "gnu"))]
type Resource = libc::c_int;

fn set_limit(resource: Resource, value: u64) -> io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: setrlimit reads the struct we pass.
    check(unsafe { libc::setrlimit(resource, &limit) })
}

fn hard_limit(resource: Resource) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct we pass.
    if unsafe { libc::getrlimit(resource, &mut limit) } == 0 {
        limit.rlim_max
    } else {
        MAX_OPEN_FILES
    }
}

/// The sandbox uid: `KERNELBOT_SANDBOX_UID`, else [`UID_BASE`] + `KERNELBOT_GPU_INDEX`.
fn identity(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Identity, String> {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        return Err("the runner is not root, so programs run as the runner's own uid".into());
    }
    let uid = match lookup("KERNELBOT_SANDBOX_UID").filter(|v| !v.trim().is_empty()) {
        Some(v) => v
            .trim()
            .parse::<u32>()
            .map_err(|_| format!("KERNELBOT_SANDBOX_UID={v:?} is not a uid"))?,
        None => {
            let index = lookup("KERNELBOT_GPU_INDEX")
                .filter(|v| !v.trim().is_empty())
                .map_or(Ok(0), |v| v.trim().parse::<u32>())
                .map_err(|_| "KERNELBOT_GPU_INDEX is not a number".to_owned())?;
            UID_BASE
                .checked_add(index)
                .ok_or("KERNELBOT_GPU_INDEX is too large")?
        }
    };
    if uid == 0 || uid >= u32::MAX - 1 {
        return Err(format!("{uid} cannot be a sandbox uid"));
    }
    Ok(Identity {
        uid,
        gid: uid,
        groups: device_groups(),
    })
}

/// The groups of the GPU device nodes, so a program can open its GPU. Root's group is never
/// handed out: a device only root's group may open stays closed.
fn device_groups() -> Vec<u32> {
    let mut nodes: Vec<PathBuf> = ["/dev/kfd", "/dev/nvidiactl", "/dev/nvidia-uvm"]
        .iter()
        .map(PathBuf::from)
        .collect();
    for dir in ["/dev", "/dev/dri"] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            nodes.extend(entries.flatten().map(|e| e.path()).filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with("renderD")
                        || n.strip_prefix("nvidia")
                            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                })
            }));
        }
    }
    let groups: BTreeSet<u32> = nodes
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.gid())
        .filter(|g| *g != 0)
        .collect();
    groups.into_iter().collect()
}

/// Forks; the child runs `f` and exits with its value. Returns the child's exit code.
///
/// `f` runs in a child of a possibly multi-threaded process: it must make only
/// async-signal-safe calls and must not allocate.
/// In a forked child: takes the program's groups, gid and uid, in that order (groups and
/// gid while still root, which may set them), so the child holds none of root's groups.
/// Raw syscalls only: async-signal-safe, and for this thread alone (the child has no other).
fn become_program(id: &Identity) -> bool {
    // SAFETY: raw syscalls on data made before the fork.
    unsafe {
        libc::syscall(libc::SYS_setgroups, id.groups.len(), id.groups.as_ptr()) == 0
            && libc::syscall(libc::SYS_setresgid, id.gid, id.gid, id.gid) == 0
            && libc::syscall(libc::SYS_setresuid, id.uid, id.uid, id.uid) == 0
    }
}

fn fork_wait(f: impl FnOnce() -> i32) -> io::Result<i32> {
    // SAFETY: the child only runs `f` (async-signal-safe by contract) and `_exit`s.
    unsafe {
        match libc::fork() {
            -1 => Err(io::Error::last_os_error()),
            0 => libc::_exit(f()),
            pid => {
                let mut status = 0;
                if libc::waitpid(pid, &mut status, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    -1
                })
            }
        }
    }
}

/// Whether `unshare(flags)` works here, tried in a throwaway child.
fn probe_unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY (closure): unshare is a raw syscall; the errno read is async-signal-safe.
    let code = fork_wait(|| unsafe {
        if libc::unshare(flags) == 0 {
            0
        } else {
            (*libc::__errno_location()).clamp(1, 255)
        }
    })?;
    match code {
        0 => Ok(()),
        -1 => Err(io::Error::other("the probe died")),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// `kill(-1, SIGKILL)` as `uid`: every process of that uid, whoever its parent, in one call
/// the kernel checks (no pid of ours can name an unrelated process).
fn kill_all_of(uid: u32) {
    // SAFETY (closure): raw syscalls only, in the forked child.
    let _ = fork_wait(|| unsafe {
        if libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0 {
            return 1;
        }
        libc::kill(-1, libc::SIGKILL);
        0
    });
}

fn kill_group(pgid: u32) {
    // SAFETY: plain syscall; a group that is already gone answers ESRCH, which is fine.
    unsafe {
        libc::killpg(pgid as libc::pid_t, libc::SIGKILL);
    }
}

/// Reaps every ended child (orphans re-parented to us included).
fn reap() {
    let mut status = 0;
    // SAFETY: plain syscall.
    while unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } > 0 {}
}

#[derive(Debug)]
pub(crate) struct Proc {
    pub pid: u32,
    pub ppid: u32,
    pub uid: u32,
    pub state: char,
    pub threads: u32,
}

impl Proc {
    /// Not ended: running, or a zombie leader whose other threads still run.
    pub(super) fn alive(&self) -> bool {
        self.state != 'Z' || self.threads > 1
    }
}

/// Every process on the machine: pid, parent, real uid and state, from `/proc`.
pub(crate) fn processes() -> Vec<Proc> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The command name may hold spaces and parentheses: fields follow the last ')'.
            let mut rest = stat.rsplit_once(") ")?.1.split(' ');
            let state = rest.next()?.chars().next()?;
            let ppid = rest.next()?.parse().ok()?;
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let field = |name: &str| -> Option<u32> {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            };
            Some(Proc {
                pid,
                ppid,
                uid: field("Uid:")?,
                state,
                threads: field("Threads:").unwrap_or(1),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uid_follows_the_gpu_index_and_can_be_named() {
        // SAFETY: plain syscall.
        if unsafe { libc::geteuid() } != 0 {
            assert!(identity(&|_| None).is_err());
            return;
        }
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(identity(&env(&[])).unwrap().uid, UID_BASE);
        assert_eq!(
            identity(&env(&[("KERNELBOT_GPU_INDEX", "3")])).unwrap().uid,
            UID_BASE + 3
        );
        assert_eq!(
            identity(&env(&[("KERNELBOT_SANDBOX_UID", "4242")]))
                .unwrap()
                .uid,
            4242
        );
        for bad in [
            &[("KERNELBOT_SANDBOX_UID", "0")][..],
            &[("KERNELBOT_SANDBOX_UID", "x")],
            &[("KERNELBOT_GPU_INDEX", "-1")],
            &[("KERNELBOT_GPU_INDEX", "4294967295")],
        ] {
            assert!(identity(&env(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lists_processes_with_their_parent_and_uid() {
        let me = std::process::id();
        let procs = processes();
        let mine = procs.iter().find(|p| p.pid == me).expect("this process");
        // SAFETY: plain syscalls.
        assert_eq!(mine.uid, unsafe { libc::getuid() });
        assert_eq!(mine.ppid, unsafe { libc::getppid() } as u32);
    }

    #[test]
    fn a_helper_process_holds_the_program_s_ids_and_none_of_root_s_groups() {
        // SAFETY: plain syscall.
        if unsafe { libc::geteuid() } != 0 {
            return; // only root changes ids; the suite runs as root in CI
        }
        let id = Identity {
            uid: 1_600_000_123,
            gid: 1_600_000_123,
            groups: vec![],
        };
        let code = fork_wait(|| {
            if !become_program(&id) {
                return 1;
            }
            let mut groups = [0 as libc::gid_t; 64];
            // SAFETY: plain syscalls into a buffer of ours.
            let n = unsafe { libc::getgroups(64, groups.as_mut_ptr()) };
            let (gid, uid) = unsafe { (libc::getegid(), libc::geteuid()) };
            i32::from(!(n == 0 && gid == id.gid && uid == id.uid)) * 2
        });
        assert_eq!(code.unwrap(), 0, "groups, gid and uid are the program's");
    }
}
