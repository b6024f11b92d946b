//! What one confined session (with everything it starts) may use: processes, memory, open
//! files and a CPU share (`[sandbox] max_processes`, `max_memory`, `max_open_files`,
//! `cpu_weight`), and the watch that ends a session past its process or memory limit.
//!
//! Three layers, each where the machine offers it (`canopy doctor` says which it found): a
//! cgroup per session (`cgroup`: v2 where delegated, v1 where writable), which the kernel
//! enforces; the per-process limits set on the sandbox's first process before it runs anything
//! (open files; processes, which the kernel counts per user namespace, so per session, except
//! for a runner running as root, which it exempts; niceness for the CPU share); and this
//! watch: every quarter second it reads the cgroup's counters, counts the processes in the
//! session's own PID namespace and adds up their resident anonymous and shared memory, and
//! at a limit it reports `HarnessEvent::LimitReached` and kills the whole namespace. Owns the
//! numbers and the watch; does not start or confine the process (`confine`, `sandbox`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use canopy_core::size::Size;

use crate::cgroup::SessionGroup;
use crate::event::HarnessEvent;

/// How often the watch looks.
const EVERY: Duration = Duration::from_millis(250);

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
fn past(limits: &Limits, (processes, memory): (u32, u64)) -> Option<String> {
    if processes >= limits.max_processes {
        return Some(format!("process limit {} reached", limits.max_processes));
    }
    if memory > limits.max_memory {
        return Some(format!("memory limit {} reached", Size(limits.max_memory)));
    }
    None
}

/// Watches the sandbox whose first process is `pid` (in `group`, where the machine offers
/// one) until it exits; at a limit, or held to one by the kernel, it reports why on `events`
/// and kills the sandbox (its PID namespace dies with its first process).
pub(crate) async fn watch(
    pid: u32,
    limits: Limits,
    group: Option<Arc<SessionGroup>>,
    events: mpsc::Sender<HarnessEvent>,
    mut exited: watch::Receiver<bool>,
) {
    let proc = std::path::PathBuf::from(format!("/proc/{pid}/root/proc"));
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = exited.wait_for(|e| *e) => return,
            _ = tick.tick() => {}
        }
        let held = group.as_ref().and_then(|g| g.hit(&limits));
        let Some(reason) = held.or_else(|| usage(&proc).and_then(|used| past(&limits, used))) else { continue };
        tracing::warn!(pid, %reason, "a session reached its limit; ending it");
        // Said before the kill, so the exit that follows carries the reason.
        let _ = events.send(HarnessEvent::LimitReached { reason }).await;
        canopy_sys::signal(pid, canopy_sys::SIGKILL);
        return;
    }
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
