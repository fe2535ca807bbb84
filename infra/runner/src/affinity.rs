//! Pins the runner, and so every process it starts, to the agent's CPU set
//! (`KERNELBOT_CPUSET`, written by the node's environment hook). Docker's `--cpus` caps how
//! much CPU a job gets; the CPU set decides which cores, so neighbouring GPUs' jobs never
//! share a core.

/// Parses a cpuset list like `0-7,16,18-19`.
pub(super) fn parse_cpuset(s: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let parse = |v: &str| {
            v.trim()
                .parse::<usize>()
                .map_err(|_| format!("{part:?} is not a CPU or CPU range"))
        };
        let (lo, hi) = (parse(lo)?, parse(hi)?);
        if lo > hi || hi >= libc::CPU_SETSIZE as usize {
            return Err(format!("{part:?} is not a valid CPU range"));
        }
        cpus.extend(lo..=hi);
    }
    if cpus.is_empty() {
        return Err("empty CPU set".into());
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Restricts this process to `cpus`.
pub(super) fn pin(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET indexes are below CPU_SETSIZE (checked when
    // parsing) and sched_setaffinity reads the set we pass.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpuset_lists() {
        assert_eq!(parse_cpuset("0-3").unwrap(), [0, 1, 2, 3]);
        assert_eq!(parse_cpuset("8,2-3, 8").unwrap(), [2, 3, 8]);
        for bad in ["", "a", "3-1", "1-", "99999"] {
            assert!(parse_cpuset(bad).is_err(), "{bad:?}");
        }
    }
}
