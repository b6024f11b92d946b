//! A cgroup per confined session, where this machine lets the runner make one: the kernel then
//! holds the session to `max_processes` and `max_memory` (a fork bomb's forks fail at the
//! limit, an allocation past it is answered by the OOM killer inside the group) and gives it its
//! CPU weight. The limits watch (`limits`) reads the group's counters and ends the session
//! with the reason when the kernel had to act.
//!
//! Two kinds, probed once per process:
//! - cgroup v2 where the runner's own group is delegated to it (writable, with the `pids` and
//!   `memory` controllers available): the runner moves itself into a leaf `canopy-runner`, turns
//!   the controllers on for its group's children, and makes `canopy-<pid>-<n>` beside it;
//! - cgroup v1 where the `pids` and `memory` hierarchies are writable at the runner's own place
//!   in them (a runner running as root on a v1 machine): a group in each. Not in `cpu`: the
//!   niceness gives the CPU share, and each hierarchy a session joins costs its start a kernel
//!   wait (moving a process between groups waits for an RCU grace period, 5-15 ms here).
//!
//! Elsewhere there is none, and the per-process limits and the watch are what holds
//! (`canopy doctor` says which). Owns the groups' files; does not decide the limits.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::limits::Limits;

/// Which cgroups this machine lets the runner make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cgroups {
    /// cgroup v2 delegated at `base` (the runner's own group).
    V2 { base: PathBuf },
    /// cgroup v1: where session groups go in the `pids` and `memory` hierarchies.
    V1 { pids: PathBuf, memory: PathBuf },
    /// None usable, and why.
    Unavailable(String),
}

impl Cgroups {
    /// What `canopy doctor` says about it.
    pub fn describe(&self) -> String {
        match self {
            Cgroups::V2 { base } => format!("cgroup v2 delegated at {}", base.display()),
            Cgroups::V1 { memory, .. } => {
                format!("cgroup v1 (pids, memory) under {}", memory.parent().unwrap_or(memory).display())
            }
            Cgroups::Unavailable(why) => format!("no cgroup the runner may make ({why})"),
        }
    }

    /// The probe, done once per process (a machine's cgroups do not change under a runner).
    pub fn probed() -> &'static Cgroups {
        static PROBE: OnceLock<Cgroups> = OnceLock::new();
        PROBE.get_or_init(|| {
            let found = probe();
            found.sweep();
            found
        })
    }

    /// Removes the groups of runners that are gone (a runner killed with `kill -9` leaves its
    /// sessions' groups behind, empty once their namespaces died).
    fn sweep(&self) {
        let parents: Vec<&PathBuf> = match self {
            Cgroups::V2 { base } => vec![base],
            Cgroups::V1 { pids, memory } => vec![pids, memory],
            Cgroups::Unavailable(_) => Vec::new(),
        };
        for parent in parents {
            let Ok(entries) = std::fs::read_dir(parent) else { continue };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let owner = name.strip_prefix("canopy-").and_then(|rest| rest.split('-').next()?.parse::<u32>().ok());
                if owner.is_some_and(|pid| !canopy_sys::alive(pid)) {
                    // Still busy (a process left in it) or already gone: the next sweep tries again.
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
        }
    }
}

/// This process's place in each hierarchy, from `/proc/self/cgroup`: (controllers, path).
fn own_groups() -> Vec<(String, String)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some((controllers.to_owned(), path.to_owned()))
        })
        .collect()
}

/// Whether the runner may make groups in `dir` (tried by making and removing one).
fn writable(dir: &Path) -> bool {
    let probe = dir.join(format!("canopy-probe-{}", std::process::id()));
    std::fs::create_dir(&probe).is_ok() && std::fs::remove_dir(&probe).is_ok()
}

fn probe() -> Cgroups {
    let root = Path::new("/sys/fs/cgroup");
    let groups = own_groups();
    if root.join("cgroup.controllers").exists() {
        let Some((_, path)) = groups.iter().find(|(c, _)| c.is_empty()) else {
            return Cgroups::Unavailable("this process is in no cgroup v2 group".into());
        };
        let base = root.join(path.trim_start_matches('/'));
        let controllers = std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
        let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
        if !(has("pids") && has("memory")) {
            return Cgroups::Unavailable(format!("{} offers no pids and memory controllers", base.display()));
        }
        return match writable(&base) {
            true => Cgroups::V2 { base },
            false => Cgroups::Unavailable(format!("cgroup v2 group {} is not delegated to this user", base.display())),
        };
    }
    let place = |controller: &str| {
        let (_, path) = groups.iter().find(|(c, _)| c.split(',').any(|x| x == controller))?;
        let dir = root.join(controller).join(path.trim_start_matches('/'));
        writable(&dir).then_some(dir)
    };
    match (place("pids"), place("memory")) {
        (Some(pids), Some(memory)) => Cgroups::V1 { pids, memory },
        _ => Cgroups::Unavailable("cgroup v1's pids and memory hierarchies are not writable here".into()),
    }
}

/// One session's (or check's) group (a directory per hierarchy); removed when dropped.
#[derive(Debug)]
pub struct SessionGroup {
    v2: bool,
    pids: PathBuf,
    memory: PathBuf,
    dirs: Vec<PathBuf>,
}

/// A group made ahead for the next session, with the limits it was made for. Making one costs
/// milliseconds (a memory cgroup most: 7-10 ms here, against a session start of 8), so a
/// start takes the ready one and the next is made off its path.
static SPARE: Mutex<Option<(Limits, SessionGroup)>> = Mutex::new(None);

/// A group for one session with `limits`: the spare one made ahead, or a new one. `None` where
/// the machine offers none.
pub fn create(limits: &Limits) -> std::io::Result<Option<SessionGroup>> {
    let spare = SPARE.lock().ok().and_then(|mut spare| spare.take());
    let group = match spare {
        Some((made_for, group)) if made_for == *limits => Some(group),
        // A spare made for other limits is removed when dropped here.
        _ => make(limits)?,
    };
    if group.is_some() {
        let limits = *limits;
        std::thread::spawn(move || match make(&limits) {
            Ok(Some(next)) => {
                if let Ok(mut spare) = SPARE.lock() {
                    *spare = Some((limits, next));
                }
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "making a spare session cgroup"),
        });
    }
    Ok(group)
}

/// Makes a group with `limits`.
fn make(limits: &Limits) -> std::io::Result<Option<SessionGroup>> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = format!("canopy-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let write = |dir: &Path, file: &str, value: String| {
        std::fs::write(dir.join(file), value)
            .map_err(|e| std::io::Error::new(e.kind(), format!("writing {}: {e}", dir.join(file).display())))
    };
    match Cgroups::probed() {
        Cgroups::Unavailable(_) => Ok(None),
        Cgroups::V2 { base } => {
            if !delegated(base) {
                return Ok(None);
            }
            let dir = base.join(&name);
            std::fs::create_dir(&dir)?;
            let group = SessionGroup { v2: true, pids: dir.clone(), memory: dir.clone(), dirs: vec![dir.clone()] };
            write(&dir, "pids.max", limits.max_processes.to_string())?;
            write(&dir, "memory.max", limits.max_memory.to_string())?;
            // Swap would let a session past its memory; where there is no swap the file is absent.
            let _ = write(&dir, "memory.swap.max", "0".into());
            let _ = write(&dir, "cpu.weight", limits.cpu_weight.to_string());
            Ok(Some(group))
        }
        Cgroups::V1 { pids, memory } => {
            let mut group =
                SessionGroup { v2: false, pids: pids.join(&name), memory: memory.join(&name), dirs: Vec::new() };
            for dir in [group.pids.clone(), group.memory.clone()] {
                std::fs::create_dir(&dir)?;
                group.dirs.push(dir);
            }
            write(&group.pids, "pids.max", limits.max_processes.to_string())?;
            write(&group.memory, "memory.limit_in_bytes", limits.max_memory.to_string())?;
            Ok(Some(group))
        }
    }
}

/// Whether this runner could take its v2 group for its sessions, tried once: cgroup v2's rule
/// that a group whose children have controllers holds no process of its own means moving this
/// process into a leaf `canopy-runner` and turning `pids`, `memory` (and `cpu` where offered)
/// on for the base's children. That fails while other processes share the base (a terminal's
/// shell, a process started before); then sessions have no cgroup, said once in the log.
fn delegated(base: &Path) -> bool {
    static DELEGATED: OnceLock<bool> = OnceLock::new();
    *DELEGATED.get_or_init(|| match delegate(base) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(
                group = %base.display(),
                error = %e,
                "cgroup v2: could not take this group for sessions; they get per-process limits and the watch"
            );
            false
        }
    })
}

fn delegate(base: &Path) -> std::io::Result<()> {
    let leaf = base.join("canopy-runner");
    match std::fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    std::fs::write(leaf.join("cgroup.procs"), std::process::id().to_string())?;
    let offered = std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    let wanted: Vec<String> = ["pids", "memory", "cpu"]
        .into_iter()
        .filter(|c| offered.split_whitespace().any(|x| x == *c))
        .map(|c| format!("+{c}"))
        .collect();
    std::fs::write(base.join("cgroup.subtree_control"), wanted.join(" "))
}

/// The `name N` counter in a cgroup file of `key value` lines (0 when absent).
fn counter(path: &Path, name: &str) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse().ok())).unwrap_or(0)
}

impl SessionGroup {
    /// Puts process `pid` (and so everything it starts from now on) in the group.
    pub(crate) fn add(&self, pid: u32) -> std::io::Result<()> {
        for dir in &self.dirs {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string())
                .map_err(|e| std::io::Error::new(e.kind(), format!("adding the session to {}: {e}", dir.display())))?;
        }
        Ok(())
    }

    /// Its `cgroup.procs` files, for a command to join before it runs
    /// (`canopy_sys::namespace::join_cgroups_in_child`).
    pub fn procs_files(&self) -> Vec<std::ffi::CString> {
        use std::os::unix::ffi::OsStrExt;
        self.dirs
            .iter()
            .filter_map(|d| std::ffi::CString::new(d.join("cgroup.procs").as_os_str().as_bytes()).ok())
            .collect()
    }

    /// The limit the kernel had to hold the session to, if it had to: a fork refused at
    /// `pids.max`, or a process killed at the memory limit.
    pub fn hit(&self, limits: &Limits) -> Option<String> {
        if counter(&self.pids.join("pids.events"), "max ") > 0 {
            return Some(format!("process limit {} reached", limits.max_processes));
        }
        let oom = match self.v2 {
            true => counter(&self.memory.join("memory.events"), "oom_kill "),
            false => counter(&self.memory.join("memory.oom_control"), "oom_kill "),
        };
        (oom > 0).then(|| format!("memory limit {} reached", canopy_core::size::Size(limits.max_memory)))
    }
}

impl Drop for SessionGroup {
    /// Removes the group once its processes are gone (a dying PID namespace takes a moment):
    /// tried for a few seconds off the caller's thread, then left, empty, for the next probe.
    fn drop(&mut self) {
        let dirs = std::mem::take(&mut self.dirs);
        std::thread::spawn(move || {
            for _ in 0..50 {
                let left: Vec<&PathBuf> =
                    dirs.iter().filter(|d| d.exists() && std::fs::remove_dir(d).is_err()).collect();
                if left.is_empty() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            tracing::warn!(groups = ?dirs, "a session's cgroup outlived it");
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    #[test]
    fn counters_are_read_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("events"), "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n").unwrap();
        assert_eq!(counter(&dir.path().join("events"), "max "), 3);
        assert_eq!(counter(&dir.path().join("events"), "oom_kill "), 2);
        assert_eq!(counter(&dir.path().join("events"), "absent "), 0);
        assert_eq!(counter(&dir.path().join("missing"), "max "), 0);
    }

    /// Where the machine offers cgroups (this one, running as root on cgroup v1, does), a group
    /// holds a real process to its limit and says so.
    #[test]
    fn a_group_holds_its_processes_to_the_limit_where_the_machine_offers_one() {
        if let Cgroups::Unavailable(why) = Cgroups::probed() {
            eprintln!("skipped: {why}");
            return;
        }
        let limits = Limits { max_processes: 16, ..Limits::default() };
        let group = create(&limits).unwrap().unwrap();
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read go; for i in $(seq 1 40); do sleep 5 & done; wait"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        group.add(child.id()).unwrap();
        assert_eq!(group.hit(&limits), None);
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while group.hit(&limits).is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(group.hit(&limits).as_deref(), Some("process limit 16 reached"));
        let _ = child.kill();
        let _ = child.wait();
    }
}
