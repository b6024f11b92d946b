//! Starting a harness process as `[sandbox]` says: unconfined, or under bubblewrap with a
//! handshake before the harness runs anything. bwrap names its first process (`--info-fd`),
//! then waits (`--block-fd`) while this side sets that process's limits (which everything in
//! the sandbox inherits) and, with a network of its own, makes and serves its listeners
//! (`network`) and puts it in a cgroup of its own where the machine offers one (`cgroup`); one
//! byte then lets the harness start. After that the limits watch runs until the process exits.
//!
//! Owns the order of those steps and their failure (the child is killed, the launch fails
//! naming the step), and the limits watch. Does not decide the grants (`launch::grants`), the
//! namespace's plan (`network`) or the limits (`limits`).

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};

use canopy_sys::namespace::Pidfd;

use crate::cgroup::SessionGroup;
use crate::event::HarnessEvent;
use crate::launch::{LaunchError, LaunchSpec, grants};
use crate::limits::Limits;
use crate::network::{self, Plan, Serving};
use crate::sandbox::{self, Capability, Network, SandboxMode, Unconfinable};

/// How long bwrap has to name its first process.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A confined child waiting for its handshake.
pub(crate) struct Pending {
    /// The read end of bwrap's `--info-fd`.
    info: OwnedFd,
    /// The write end of its `--block-fd`.
    block: OwnedFd,
    plan: Option<Plan>,
}

/// What a confined session runs with once started: its sandbox's first process and the tasks
/// serving its network (stopped when this is dropped).
pub(crate) struct Confined {
    pid: u32,
    /// The same process, for signals that must not reach a later holder of its pid.
    pidfd: Arc<Pidfd>,
    #[allow(dead_code, reason = "held for its Drop: the network's tasks stop with the session")]
    serving: Option<Serving>,
    /// Its cgroup, where the machine offers one (removed when the last holder drops it).
    group: Option<Arc<SessionGroup>>,
}

/// Starts `command` confined as `[sandbox]` says, with its stderr in `stderr.log`, in its own
/// process group, dying with its parent. A confined child waits for `Pending::finish`.
pub(crate) fn start(spec: &LaunchSpec, mut command: Command) -> Result<(Child, Option<Pending>), LaunchError> {
    let stderr_path = spec.session_dir.join("stderr.log");
    let stderr = std::fs::File::create(&stderr_path).map_err(LaunchError::files(stderr_path))?;
    let spawn = |mut command: Command| {
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(stderr).kill_on_drop(true);
        canopy_sys::new_session(&mut command);
        canopy_sys::die_with_parent(&mut command);
        command.spawn().map_err(|source| LaunchError::Spawn { program: spec.program.clone(), source })
    };
    if spec.sandbox.mode == SandboxMode::Off {
        return Ok((spawn(command)?, None));
    }
    let bwrap = Capability::cached(&spec.sandbox.bwrap).usable(spec.sandbox.network)?;
    let mut grants = grants(spec)?;
    let plan = match spec.sandbox.network {
        Network::Host => None,
        Network::Proxy => {
            let plan = network::plan(spec)?;
            let hosts = spec.session_dir.join("hosts");
            // Never through a link the session may have planted in its own directory.
            canopy_sys::write_private(&hosts, plan.hosts.as_bytes()).map_err(LaunchError::files(hosts.clone()))?;
            grants.own_network = true;
            grants.hosts_file = Some(hosts);
            grants.connect_ports.extend(plan.ports());
            grants.connect_ports.sort_unstable();
            grants.connect_ports.dedup();
            command.envs(plan.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            Some(plan)
        }
    };
    let pipe = || canopy_sys::namespace::pipe().map_err(|e| Unconfinable(format!("making bwrap's handshake: {e}")));
    let ((info, info_child), (block_child, block)) = (pipe()?, pipe()?);
    let handshake = [info_child.as_raw_fd(), block_child.as_raw_fd()];
    let (confined, rules) = sandbox::wrap(&bwrap, &grants, &command, Some(handshake))?;
    let child = spawn(confined);
    // The child entered the ruleset and holds its ends of the handshake; ours can go.
    drop((rules, info_child, block_child));
    Ok((child?, Some(Pending { info, block, plan })))
}

impl Pending {
    /// Reads the sandbox's first process, sets its limits, serves its network, and lets the
    /// harness start. On failure the sandbox is killed before it is released, so the harness
    /// never runs unlimited or without its listeners.
    pub(crate) async fn finish(
        self,
        spec: &LaunchSpec,
        child: &mut Child,
        events: mpsc::Sender<HarnessEvent>,
    ) -> Result<Confined, LaunchError> {
        let Pending { info, block, plan } = self;
        let mut first: Option<Arc<Pidfd>> = None;
        let result = handshake(info, plan, child.id(), spec, events, &mut first).await;
        match result {
            Ok(confined) => {
                std::fs::File::from(block)
                    .write_all(b"go")
                    .map_err(|e| Unconfinable(format!("releasing the sandbox: {e}")))?;
                Ok(confined)
            }
            Err(error) => {
                // Killed while still waiting on its block descriptor; its exit is reported by
                // the waiter. bwrap's first process has no death signal yet, so it is killed too.
                if let Some(first) = &first {
                    first.signal(canopy_sys::SIGKILL);
                }
                let _ = child.start_kill();
                drop(block);
                Err(error)
            }
        }
    }
}

/// The handshake's steps before the release: the first process (named in `first` as soon as
/// it is known), its cgroup, its limits, its network.
async fn handshake(
    info: OwnedFd,
    plan: Option<Plan>,
    bwrap: Option<u32>,
    spec: &LaunchSpec,
    events: mpsc::Sender<HarnessEvent>,
    first: &mut Option<Arc<Pidfd>>,
) -> Result<Confined, LaunchError> {
    let failed = |step: &str, e: &dyn std::fmt::Display| Unconfinable(format!("{step}: {e}"));
    let pid = tokio::time::timeout(HANDSHAKE_TIMEOUT, first_pid(info))
        .await
        .map_err(|_| failed("bwrap did not name its first process", &"timed out"))?
        .map_err(|e| failed("reading bwrap's first process", &e))?;
    let pidfd = Arc::new(Pidfd::open(pid).map_err(|e| failed("opening bwrap's first process", &e))?);
    *first = Some(pidfd.clone());
    // The process named must be bwrap's own child, not one that happens to have that pid.
    let parent = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("PPid:").map(|p| p.trim().parse::<u32>().ok()))?);
    if bwrap.is_none() || parent != bwrap {
        return Err(failed("bwrap's first process", &format!("{pid} is not bwrap's child")).into());
    }
    let limits = &spec.sandbox.limits;
    let group = crate::cgroup::create(limits).and_then(|group| match group {
        Some(group) => group.add(pid).map(|()| Some(group)),
        None => Ok(None),
    });
    // A machine whose cgroups refuse this one still has the per-process limits and the watch.
    let group = group.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "no cgroup for this session; its limits are the per-process ones and the watch");
        None
    });
    canopy_sys::namespace::limit_process(pid, u64::from(limits.max_processes), limits.max_open_files, limits.nice())
        .map_err(|e| failed("setting the session's limits", &e))?;
    let serving = match &plan {
        Some(plan) => Some(network::serve(pid, plan, events).await?),
        None => None,
    };
    Ok(Confined { pid, pidfd, serving, group: group.map(Arc::new) })
}

/// The `child-pid` bwrap writes to its info descriptor (a JSON object).
async fn first_pid(info: OwnedFd) -> std::io::Result<u32> {
    let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(info)?;
    let mut read = Vec::with_capacity(256);
    let mut buf = [0u8; 256];
    loop {
        let n = pipe.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::Error::other("bwrap closed its info descriptor without naming a process"));
        }
        read.extend_from_slice(&buf[..n]);
        if let Ok(info) = serde_json::from_slice::<serde_json::Value>(&read) {
            return info
                .get("child-pid")
                .and_then(serde_json::Value::as_u64)
                .and_then(|p| u32::try_from(p).ok())
                .ok_or_else(|| std::io::Error::other(format!("bwrap's info names no child-pid: {info}")));
        }
        if read.len() > 64 * 1024 {
            return Err(std::io::Error::other("bwrap's info is not JSON"));
        }
    }
}

/// Runs the limits watch for a confined session until `exited`.
pub(crate) fn watch_limits(
    spec: &LaunchSpec,
    confined: &Confined,
    events: mpsc::Sender<HarnessEvent>,
    exited: watch::Receiver<bool>,
) {
    tokio::spawn(watch(
        confined.pidfd.clone(),
        confined.pid,
        spec.sandbox.limits,
        confined.group.clone(),
        events,
        exited,
    ));
}

/// How often the watch looks.
const EVERY: Duration = Duration::from_millis(250);

/// Watches the sandbox whose first process is `pid` (in `group`, where the machine offers
/// one) until it exits; at a limit, or held to one by the kernel, it reports why on `events`
/// and kills the sandbox (its PID namespace dies with its first process).
async fn watch(
    first: Arc<Pidfd>,
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
        // With a cgroup the kernel holds the session to its limits and says when it had to; the
        // sum of its processes' resident memory would count shared pages more than once.
        let reason = match &group {
            Some(group) => group.hit(&limits),
            None => crate::limits::usage(&proc).and_then(|used| crate::limits::past(&limits, used)),
        };
        let Some(reason) = reason else { continue };
        tracing::warn!(pid, %reason, "a session reached its limit; ending it");
        // Said before the kill, so the exit that follows carries the reason.
        let _ = events.send(HarnessEvent::LimitReached { reason }).await;
        first.signal(canopy_sys::SIGKILL);
        return;
    }
}
