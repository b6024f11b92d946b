//! The few OS calls Canopy needs that std does not offer, in one place: sending a signal to
//! a process or process group, asking the kernel to kill a child when its parent dies,
//! starting a child in a session of its own, the one wall clock (`unix_us`, and `Clock` for code
//! that takes the time as an argument), writing a private file atomically, Landlock (the ABI this kernel offers, and a
//! TCP-connect and scope ruleset a child enters before it runs anything), and reading the OS
//! random source.
//!
//! This is the only crate with `unsafe` code; each block states why it is sound. Does not
//! decide when to signal anything, nor what a sandbox allows: the supervisors that own the
//! children do (`canopy-harness`'s `sandbox` decides the ports).

pub mod namespace;

use tokio::process::Command;

pub use libc::{SIGCONT, SIGHUP, SIGKILL, SIGSTOP, SIGTERM};

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

/// Starts the child in a new session (`setsid`): it leads its own process group (so
/// `signal_group` reaches its descendants) and has no controlling terminal, so nothing it
/// runs can open the operator's terminal (`/dev/tty`) or push input into it (`TIOCSTI`).
/// Use instead of `process_group(0)`: a group leader cannot call `setsid`.
pub fn new_session(command: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and calls only setsid(2),
    // which is async-signal-safe, without allocating.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The Landlock ABI version this kernel offers; 0 when Landlock is missing or disabled.
/// TCP-connect rules need 4; signal and abstract-socket scoping need 6.
pub fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the kernel only
    // returns a number; no memory is read or written.
    #[allow(unsafe_code)]
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(abi).unwrap_or(0).max(0)
}

/// `struct landlock_ruleset_attr` (ABI 6 layout; older kernels read the first 16 bytes).
#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// `struct landlock_net_port_attr`.
#[repr(C)]
struct NetPortAttr {
    allowed_access: u64,
    port: u64,
}

const LANDLOCK_ACCESS_NET_CONNECT_TCP: u64 = 1 << 1;
const LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const LANDLOCK_SCOPE_SIGNAL: u64 = 1 << 1;
const LANDLOCK_RULE_NET_PORT: libc::c_int = 2;

/// A Landlock ruleset, built in the parent, that a child enters before exec: TCP connect
/// only to the listed ports and, from ABI 6, no signals to and no abstract Unix sockets of
/// processes outside the child's domain. Filesystem access is not handled here (the mount
/// namespace decides what exists), so the child may still set up mounts.
#[derive(Debug)]
pub struct ConnectRules {
    fd: std::os::fd::OwnedFd,
    /// Whether signal and abstract-socket scoping is part of the ruleset (ABI 6 or later).
    pub scoped: bool,
}

impl ConnectRules {
    /// Builds the ruleset. Fails when the kernel offers no TCP-connect rules (ABI < 4).
    pub fn new(ports: &[u16]) -> std::io::Result<ConnectRules> {
        use std::os::fd::FromRawFd;
        let abi = landlock_abi();
        if abi < 4 {
            return Err(std::io::Error::other(format!(
                "this kernel's Landlock ABI is {abi}; TCP-connect rules need ABI 4 or later"
            )));
        }
        let scoped = abi >= 6;
        let attr = RulesetAttr {
            handled_access_fs: 0,
            handled_access_net: LANDLOCK_ACCESS_NET_CONNECT_TCP,
            scoped: if scoped { LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL } else { 0 },
        };
        let size = if scoped { std::mem::size_of::<RulesetAttr>() } else { 16 };
        // SAFETY: `attr` is a live, properly laid out struct of at least `size` bytes; the
        // kernel only reads it. The return value is a new descriptor (O_CLOEXEC) or -1.
        #[allow(unsafe_code)]
        let fd = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, &attr as *const RulesetAttr, size, 0u32) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor and nothing else owns it.
        #[allow(unsafe_code)]
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
        for &port in ports {
            let rule = NetPortAttr { allowed_access: LANDLOCK_ACCESS_NET_CONNECT_TCP, port: u64::from(port) };
            use std::os::fd::AsRawFd;
            // SAFETY: `rule` is a live struct of the layout the rule type names; the kernel
            // only reads it.
            #[allow(unsafe_code)]
            let done = unsafe {
                libc::syscall(
                    libc::SYS_landlock_add_rule,
                    fd.as_raw_fd(),
                    LANDLOCK_RULE_NET_PORT,
                    &rule as *const NetPortAttr,
                    0u32,
                )
            };
            if done < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(ConnectRules { fd, scoped })
    }

    /// Makes the child enter the ruleset (with `no_new_privs`, which Landlock requires)
    /// before it execs. The ruleset must outlive the spawn.
    pub fn apply_in_child(&self, command: &mut Command) {
        use std::os::fd::AsRawFd;
        let fd = self.fd.as_raw_fd();
        // SAFETY: the closure runs in the forked child before exec and makes two raw
        // syscalls (prctl, landlock_restrict_self), both async-signal-safe, without
        // allocating. `fd` is open in the child: it was inherited across the fork, and the
        // parent keeps its `OwnedFd` until the spawn has returned.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

/// Whether a process is alive (not gone, not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

/// Microseconds since the Unix epoch: Canopy's one wall clock (store timestamps, steer
/// latencies, deadlines between processes). 0 if the system clock is before 1970.
pub fn unix_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// A moment in this machine's local time zone (the `TZ` rules `localtime_r` follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalTime {
    pub year: i32,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// Seconds east of UTC.
    pub offset: i32,
}

/// `unix_secs` in local time, or `None` when the C library cannot convert it.
pub fn local_time(unix_secs: i64) -> Option<LocalTime> {
    let time: libc::time_t = unix_secs;
    // SAFETY: `tm` is plain data, zero is a valid value for it; `localtime_r` writes only
    // into it and reads only `time`, both live for the call; it is thread-safe.
    #[allow(unsafe_code)]
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&time, &mut tm).is_null() {
            return None;
        }
        tm
    };
    Some(LocalTime {
        year: tm.tm_year + 1900,
        month: (tm.tm_mon + 1).max(1) as u32,
        day: tm.tm_mday.max(1) as u32,
        hour: tm.tm_hour.max(0) as u32,
        minute: tm.tm_min.max(0) as u32,
        second: tm.tm_sec.max(0) as u32,
        offset: i32::try_from(tm.tm_gmtoff).unwrap_or(0),
    })
}

/// Milliseconds since the Unix epoch, on the same clock as `unix_us`.
pub fn unix_ms() -> i64 {
    i64::try_from(unix_us() / 1000).unwrap_or(i64::MAX)
}

/// The wall clock as a value, so the code that stamps time takes it as an argument: the
/// system clock in production, a hand-driven one in tests (time moves only when the test
/// says, so nothing waits for a deadline to pass).
#[derive(Clone, Debug, Default)]
pub enum Clock {
    /// `unix_ms`.
    #[default]
    System,
    /// Milliseconds since the epoch, moved by `advance`.
    Manual(std::sync::Arc<std::sync::atomic::AtomicI64>),
}

impl Clock {
    /// A hand-driven clock starting at `start_ms`.
    pub fn manual(start_ms: i64) -> Clock {
        Clock::Manual(std::sync::Arc::new(std::sync::atomic::AtomicI64::new(start_ms)))
    }

    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        match self {
            Clock::System => unix_ms(),
            Clock::Manual(ms) => ms.load(std::sync::atomic::Ordering::SeqCst),
        }
    }

    /// Moves a manual clock forward (the system clock moves by itself; this is a no-op there).
    pub fn advance(&self, by: std::time::Duration) {
        if let Clock::Manual(ms) = self {
            ms.fetch_add(i64::try_from(by.as_millis()).unwrap_or(i64::MAX), std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// Writes `bytes` to `path` atomically (a temporary file, synced, then renamed), readable
/// and writable by its owner only: every secret file Canopy writes goes through here.
pub fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    // A leftover temporary file would keep its mode on open: remove it, so it is created 0600.
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // `create_new` (O_EXCL) never follows a symlink planted at `tmp` since the removal above.
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// `n` bytes from the OS random source, as lowercase hex.
pub fn random_hex(n: usize) -> std::io::Result<String> {
    let mut bytes = vec![0u8; n];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(format!("reading the OS random source: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
