//! What one confined session (with everything it starts) may use: processes, memory, open
//! files and a CPU share (`[sandbox] max_processes`, `max_memory`, `max_open_files`,
//! `cpu_weight`), what a session uses now, and which limit that is past.
//!
//! Three layers, each where the machine offers it (`canopy doctor` says which it found): a
//! cgroup per session (`cgroup`: v2 where delegated, v1 where writable), which the kernel
//! enforces; the per-process limits set on the sandbox's first process before it runs anything
//! (open files; processes, which the kernel counts per user namespace, so per session, except
//! for a runner running as root, which it exempts; niceness for the CPU share); and this
//! watch (`confine`): every quarter second it reads the cgroup's counters, counts the processes
//! in the session's own PID namespace and adds up their resident anonymous and shared memory
//! (`usage` here), and at a limit it reports `HarnessEvent::LimitReached` and kills the whole
//! namespace. Owns the numbers; does not start, confine or watch the process.

use std::path::Path;

use canopy_core::size::Size;

/// A session's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Processes (and threads, where the kernel counts them) at once.
    pub max_processes: u32,
    /// Resident memory of all its processes together, in bytes.
    pub max_memory: u64,
    /// Open files per process.
    pub max_open_files: u64,
    /// Its CPU share against the daemon's 100 (1 to 100; applied as niceness).
    pub cpu_weight: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_processes: 1024, max_memory: 4 << 30, max_open_files: 4096, cpu_weight: 50 }
    }
}

impl Limits {
    /// The niceness that gives `cpu_weight` against a weight of 100 at niceness 0: the
    /// scheduler's weight falls by a factor of 1.25 per step.
    pub fn nice(&self) -> i32 {
        let weight = f64::from(self.cpu_weight.clamp(1, 100));
        ((100.0 / weight).ln() / 1.25f64.ln()).round().clamp(0.0, 19.0) as i32
    }
}

/// What the session uses now: processes in its PID namespace and their resident memory.
/// `proc` is the namespace's own `/proc` as seen from outside (`/proc/<pid>/root/proc`).
pub(crate) fn usage(proc: &Path) -> Option<(u32, u64)> {
    let mut processes = 0u32;
    let mut memory = 0u64;
    for entry in std::fs::read_dir(proc).ok()?.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        processes += 1;
        // A process that exited meanwhile has no status: it uses nothing.
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else { continue };
        for line in status.lines() {
            if let Some(rest) = line.strip_prefix("RssAnon:").or_else(|| line.strip_prefix("RssShmem:")) {
                let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
                memory += kib * 1024;
            }
        }
    }
    Some((processes, memory))
}

/// Which limit `used` is past, as the reason the session ends.
pub(crate) fn past(limits: &Limits, (processes, memory): (u32, u64)) -> Option<String> {
    if processes >= limits.max_processes {
        return Some(format!("process limit {} reached", limits.max_processes));
    }
    if memory > limits.max_memory {
        return Some(format!("memory limit {} reached", Size(limits.max_memory)));
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    #[test]
    fn weights_become_niceness_and_a_limit_passed_is_named() {
        let nice = |w| Limits { cpu_weight: w, ..Limits::default() }.nice();
        assert_eq!((nice(100), nice(50), nice(10), nice(1)), (0, 3, 10, 19));
        let limits = Limits { max_processes: 10, max_memory: 1 << 20, ..Limits::default() };
        assert_eq!(past(&limits, (10, 0)).unwrap(), "process limit 10 reached");
        assert_eq!(past(&limits, (1, 2 << 20)).unwrap(), "memory limit 1 MiB reached");
        assert_eq!(past(&limits, (9, 1 << 20)), None);
    }

    #[test]
    fn this_process_s_own_namespace_is_counted() {
        let (processes, memory) = usage(Path::new("/proc")).unwrap();
        assert!(processes >= 1 && memory > 0, "{processes} {memory}");
    }
}
