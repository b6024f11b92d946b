//! Reaching into a confined session from outside: listening sockets made inside its network
//! namespace (so the runner, in its own namespace, accepts what the session connects to on its
//! loopback), and the limits the kernel enforces per process set on the session's first
//! process before it runs anything.
//!
//! Also the pre-exec join of a command's cgroups (a check's, `canopy-git`). Owns the fork-and-join that makes the sockets (a forked child joins the session's user
//! namespace, where the runner's user holds every capability, then its network namespace,
//! binds, and hands the sockets back over a Unix socket). Does not decide which addresses a
//! session gets nor what arrives on them (`canopy-harness`'s `network` does).

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Most sockets one call makes (the session's MCP endpoint, its model endpoints, the proxy).
pub const MAX_LISTENERS: usize = 32;

/// How long the forked child waits, all addresses together, for the namespace's loopback to
/// come up (bubblewrap brings it up in the sandbox's first process, which may not have got
/// there yet).
const LOOPBACK_WAIT_MS: u32 = 5_000;

/// A control-message buffer aligned for `cmsghdr`, large enough for `MAX_LISTENERS` descriptors.
#[repr(C, align(8))]
struct Control([u8; 256]);

/// Listening TCP sockets bound to `addrs` inside the network namespace of process `pid` (a
/// bubblewrap sandbox's first process). Ports below 1024 are fine: the joining child holds
/// every capability in the user namespace that owns the network namespace.
pub fn listen_in_namespace(pid: u32, addrs: &[SocketAddr]) -> io::Result<Vec<TcpListener>> {
    if addrs.is_empty() || addrs.len() > MAX_LISTENERS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("1 to {MAX_LISTENERS} addresses")));
    }
    let net = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    // The user namespace that owns the network namespace, not the process's own: a runner that
    // is not root has bubblewrap make a second user namespace inside the first (for /dev), in
    // which the runner holds no capability over the network namespace.
    // SAFETY: NS_GET_USERNS takes no argument and returns a new descriptor or -1.
    #[allow(unsafe_code)]
    let user = unsafe { libc::ioctl(net.as_raw_fd(), libc::NS_GET_USERNS) };
    if user < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just returned to us and is owned by nothing else.
    #[allow(unsafe_code)]
    let user = unsafe { OwnedFd::from_raw_fd(user) };
    let (ours, theirs) = socket_pair()?;
    let sockaddrs: Vec<(libc::sockaddr_storage, libc::socklen_t, libc::c_int)> = addrs.iter().map(raw_addr).collect();
    let mut fds = [-1 as RawFd; MAX_LISTENERS];
    let mut control = Control([0; 256]);
    let control_len = space(addrs.len());
    let (user_fd, net_fd, theirs_fd) = (user.as_raw_fd(), net.as_raw_fd(), theirs.as_raw_fd());
    // SAFETY: fork(2) in a multi-threaded process: the child below calls only async-signal-
    // safe syscalls (setns, socket, setsockopt, bind, listen, nanosleep, sendmsg, _exit) on
    // memory allocated before the fork, and never returns from this block.
    #[allow(unsafe_code)]
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(io::Error::last_os_error());
    }
    if child == 0 {
        // SAFETY: see the fork above; the child ends in `_exit` on every path.
        #[allow(unsafe_code)]
        unsafe {
            let code = make_and_send(user_fd, net_fd, theirs_fd, &sockaddrs, &mut fds, &mut control.0[..control_len]);
            libc::_exit(code);
        }
    }
    drop(theirs);
    let status = wait(child)?;
    if status != 0 {
        let step = [
            "",
            "joining its user namespace",
            "joining its network namespace",
            "making a socket",
            "binding",
            "listening",
            "handing the sockets back",
        ];
        let what = step.get(status as usize).copied().unwrap_or("an unknown step");
        return Err(io::Error::other(format!("making the sandbox's listeners failed at {what}")));
    }
    receive(&ours, addrs.len())
}

/// The control-message space for `n` descriptors (at most `MAX_LISTENERS`: within `Control`).
fn space(n: usize) -> usize {
    // SAFETY: CMSG_SPACE is a pure size computation.
    #[allow(unsafe_code)]
    let space = unsafe { libc::CMSG_SPACE((n * std::mem::size_of::<RawFd>()) as u32) } as usize;
    space.min(std::mem::size_of::<Control>())
}

fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut pair = [-1 as RawFd; 2];
    // SAFETY: socketpair writes two descriptors into the array it is given.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0, pair.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nothing else.
    #[allow(unsafe_code)]
    unsafe {
        Ok((OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])))
    }
}

/// The address as the kernel takes it, with its length and family.
fn raw_addr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t, libc::c_int) {
    // SAFETY: an all-zero sockaddr_storage is a valid value.
    #[allow(unsafe_code)]
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage, which is aligned for it.
            #[allow(unsafe_code)]
            unsafe {
                std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin)
            };
            (storage, std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t, libc::AF_INET)
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: v6.ip().octets() },
                sin6_scope_id: 0,
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage, which is aligned for it.
            #[allow(unsafe_code)]
            unsafe {
                std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6)
            };
            (storage, std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t, libc::AF_INET6)
        }
    }
}

/// The forked child's work: join, bind each address, send the sockets; the exit code names
/// the step that failed (0: none).
///
/// # Safety
/// Runs in a forked child of a multi-threaded process: only raw syscalls, no allocation.
#[allow(unsafe_code)]
unsafe fn make_and_send(
    user: RawFd,
    net: RawFd,
    out: RawFd,
    addrs: &[(libc::sockaddr_storage, libc::socklen_t, libc::c_int)],
    fds: &mut [RawFd; MAX_LISTENERS],
    control: &mut [u8],
) -> libc::c_int {
    // SAFETY: raw syscalls on descriptors and buffers owned by this (forked) process.
    unsafe {
        let mut waited = 0;
        if libc::setns(user, libc::CLONE_NEWUSER) != 0 {
            return 1;
        }
        if libc::setns(net, libc::CLONE_NEWNET) != 0 {
            return 2;
        }
        for (i, (storage, len, family)) in addrs.iter().enumerate() {
            let fd = libc::socket(*family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if fd < 0 {
                return 3;
            }
            let one: libc::c_int = 1;
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
            loop {
                if libc::bind(fd, (storage as *const libc::sockaddr_storage).cast(), *len) == 0 {
                    break;
                }
                // The loopback is not up yet: wait for the sandbox to bring it up.
                if *libc::__errno_location() != libc::EADDRNOTAVAIL || waited >= LOOPBACK_WAIT_MS {
                    return 4;
                }
                let pause = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
                libc::nanosleep(&pause, std::ptr::null_mut());
                waited += 1;
            }
            if libc::listen(fd, 1024) != 0 {
                return 5;
            }
            fds[i] = fd;
        }
        let mut byte = [0u8; 1];
        let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control.len() as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return 6;
        }
        let data_len = std::mem::size_of_val(&fds[..addrs.len()]);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(data_len as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(cmsg), data_len);
        if libc::sendmsg(out, &msg, 0) != 1 {
            return 6;
        }
        0
    }
}

/// Waits for the forked child and returns its exit code.
fn wait(child: libc::pid_t) -> io::Result<libc::c_int> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: waitpid writes the status of our own child into `status`.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::waitpid(child, &mut status, 0) };
        if rc == child {
            break;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
    if libc::WIFEXITED(status) {
        Ok(libc::WEXITSTATUS(status))
    } else {
        Err(io::Error::other("the helper that makes the sandbox's listeners was killed"))
    }
}

/// Receives `n` descriptors sent by the child and makes them listeners.
fn receive(socket: &OwnedFd, n: usize) -> io::Result<Vec<TcpListener>> {
    let refused = || io::Error::other("the sandbox's listeners were not handed back");
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    let mut control = Control([0; 256]);
    // SAFETY: an all-zero msghdr is valid; its pointers are set to live buffers below.
    #[allow(unsafe_code)]
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = space(n) as _;
    // SAFETY: recvmsg writes into the buffers `msg` points at, which outlive the call;
    // MSG_DONTWAIT because the child has exited, so the message is there or never will be.
    #[allow(unsafe_code)]
    let got = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
    if got != 1 {
        return Err(refused());
    }
    // SAFETY: the control buffer (aligned for cmsghdr) was filled by the kernel; CMSG_FIRSTHDR
    // and CMSG_DATA read within it, and the header's length is checked before the descriptors
    // it says follow are read.
    #[allow(unsafe_code)]
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() || (*cmsg).cmsg_level != libc::SOL_SOCKET || (*cmsg).cmsg_type != libc::SCM_RIGHTS {
            return Err(refused());
        }
        let header = libc::CMSG_LEN(0) as usize;
        let length = (*cmsg).cmsg_len as usize;
        let count = length.saturating_sub(header) / std::mem::size_of::<RawFd>();
        let mut listeners = Vec::with_capacity(count);
        for i in 0..count.min(n) {
            let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>().add(i));
            listeners.push(TcpListener::from_raw_fd(fd));
        }
        if count != n || msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::other(format!("{count} of {n} listeners were handed back")));
        }
        Ok(listeners)
    }
}

/// A process named by a descriptor, so a signal never reaches another process that was
/// given its pid after it exited.
#[derive(Debug)]
pub struct Pidfd(OwnedFd);

impl Pidfd {
    /// The process `pid`, now.
    pub fn open(pid: u32) -> io::Result<Pidfd> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        #[allow(unsafe_code)]
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the descriptor was just returned to us and is owned by nothing else.
        #[allow(unsafe_code)]
        Ok(Pidfd(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }))
    }

    /// Sends `signal` to it; a process that has exited is not signalled (ESRCH, ignored).
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: pidfd_send_signal on our own descriptor with no siginfo.
        #[allow(unsafe_code)]
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0u32,
            );
        }
    }
}

/// The per-process limits set on a sandbox's first process, which everything it starts
/// inherits: processes (counted per user namespace, so per session; the kernel exempts a
/// runner that runs as root, whose sessions the runner's own watch limits), open files, and
/// the scheduling niceness.
pub fn limit_process(pid: u32, max_processes: u64, max_open_files: u64, nice: i32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
    for (resource, value) in [(libc::RLIMIT_NPROC, max_processes), (libc::RLIMIT_NOFILE, max_open_files)] {
        let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
        // SAFETY: prlimit reads the limit it is given and writes nothing (null old limit).
        #[allow(unsafe_code)]
        let rc = unsafe { libc::prlimit(pid, resource, &limit, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: setpriority has no memory-safety preconditions.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, pid as libc::id_t, nice) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A pipe whose ends are closed on exec; `inherit` keeps one end open across an exec.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nothing else.
    #[allow(unsafe_code)]
    unsafe {
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

/// Keeps the descriptors `fds` open across the child's exec (they are closed-on-exec in the
/// parent, so no other child inherits them). They must stay open until the spawn returns.
pub fn inherit(command: &mut tokio::process::Command, fds: [RawFd; 2]) {
    // SAFETY: the closure runs in the forked child before exec and calls only fcntl(2),
    // which is async-signal-safe, without allocating.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            for fd in fds {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Makes the child join the cgroups whose `cgroup.procs` files are `procs` before it execs (it
/// writes `0`, "this process", into each), so everything it starts is in them from the start.
pub fn join_cgroups_in_child(command: &mut tokio::process::Command, procs: Vec<std::ffi::CString>) {
    // SAFETY: the closure runs in the forked child before exec and calls only open, write and
    // close, which are async-signal-safe, on C strings made before the fork; it allocates
    // nothing.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            for path in &procs {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if written != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}
