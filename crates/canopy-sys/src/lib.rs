//! The few OS calls Canopy needs that std does not offer, in one place: sending a signal to
//! a process or process group, asking the kernel to kill a child when its parent dies, and
//! reading the OS random source.
//!
//! This is the only crate with `unsafe` code; each block states why it is sound. Does not
//! decide when to signal anything: the supervisors that own the children do.

use tokio::process::Command;

pub use libc::{SIGCONT, SIGKILL, SIGSTOP, SIGTERM};

/// Sends `signal` to process `pid`. A stale pid only yields ESRCH, which is ignored.
pub fn signal(pid: u32, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    // SAFETY: kill(2) has no memory-safety preconditions.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Sends `signal` to every process in the group led by `pid` (children started with
/// `process_group(0)` lead their own group, so this reaches their descendants too).
pub fn signal_group(pid: u32, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is touched.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(-pid, signal);
    }
}

/// Makes the child SIGKILLed when the thread that spawned it exits, so a `kill -9` of
/// Canopy never leaves children running. Tokio spawns children from its worker threads,
/// which live as long as the runtime.
pub fn die_with_parent(command: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (prctl, getppid) without allocating.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() == 1 {
                return Err(std::io::Error::other("the parent exited before the child started"));
            }
            Ok(())
        });
    }
}

/// Whether a process is alive (not gone, not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

/// `n` bytes from the OS random source, as lowercase hex.
pub fn random_hex(n: usize) -> std::io::Result<String> {
    let mut bytes = vec![0u8; n];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(format!("reading the OS random source: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
