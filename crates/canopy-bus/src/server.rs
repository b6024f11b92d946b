//! The managed `nats-server`: a private server on loopback, started and supervised as a
//! child of the daemon.
//!
//! Owns the server's config file, its port, its restarts and its end. The first start
//! takes a free port (`-p -1`, read back from the ports file) and records it (`port` in its
//! directory); restarts of the server, and later starts of the daemon, reuse that port while
//! it is free, so every client (a standalone runner, `tail`) reconnects to the same URL. The child gets `PR_SET_PDEATHSIG` so it dies with
//! the daemon even under `kill -9`, and its pid is recorded so a later start can reap one
//! left behind by any other path. Does not decide when to start: the daemon does.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::BusError;

/// Where and how to run the server.
#[derive(Debug, Clone)]
pub struct NatsServerConfig {
    /// The `nats-server` binary.
    pub bin: PathBuf,
    /// Directory for the generated config, the log, the pid and ports files.
    pub dir: PathBuf,
    /// The users clients log in as, each with its permissions; none leaves the server open
    /// on loopback (the tests' shared server).
    pub users: Vec<NatsUser>,
    /// First restart delay after the server dies; doubles up to `restart_max`.
    pub restart_min: Duration,
    pub restart_max: Duration,
}

/// One login the server accepts.
#[derive(Clone)]
pub struct NatsUser {
    pub user: String,
    /// The password, or its bcrypt hash (`$2a$...`), which the server also accepts.
    pub password: String,
    pub permissions: canopy_proto::Permissions,
}

impl std::fmt::Debug for NatsUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsUser").field("user", &self.user).field("permissions", &self.permissions).finish()
    }
}

/// The `authorization { users = [...] }` block of a `nats-server` configuration.
pub fn render_authorization(users: &[NatsUser]) -> String {
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let list = |subjects: &[String]| subjects.iter().map(|s| quote(s)).collect::<Vec<_>>().join(", ");
    let mut out = String::from("authorization {\n  users = [\n");
    for u in users {
        let p = &u.permissions;
        out.push_str(&format!(
            "    {{ user: {}, password: {}, permissions: {{ publish: {{ allow: [{}] }}, subscribe: {{ allow: [{}] }}{} }} }}\n",
            quote(&u.user),
            quote(&u.password),
            list(&p.publish),
            list(&p.subscribe),
            if p.allow_responses { ", allow_responses: true" } else { "" },
        ));
    }
    out.push_str("  ]\n}\n");
    out
}

/// A running, supervised `nats-server`. Stop it with `shutdown`; dropping it kills it.
#[derive(Debug)]
pub struct ManagedNats {
    dir: PathBuf,
    url: String,
    stop: watch::Sender<bool>,
    supervisor: std::sync::Mutex<Option<JoinHandle<()>>>,
    pid: watch::Receiver<Option<u32>>,
}

/// Finds `nats-server`: `$CANOPY_NATS_SERVER`, then `PATH`, then Debian's `/usr/sbin`.
pub fn find_nats_server() -> Result<PathBuf, BusError> {
    if let Some(explicit) = std::env::var_os("CANOPY_NATS_SERVER") {
        let path = PathBuf::from(explicit);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(BusError::Server(format!("CANOPY_NATS_SERVER={} is not a file", path.display())))
        };
    }
    let path_dirs = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
    path_dirs
        .into_iter()
        .chain(["/usr/sbin", "/usr/local/sbin", "/usr/local/bin"].map(PathBuf::from))
        .map(|dir| dir.join("nats-server"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            BusError::Server(
                "nats-server not found on PATH, in /usr/sbin, or at $CANOPY_NATS_SERVER; \
                 install it (Debian: apt-get install -y nats-server) or pass --nats-url"
                    .into(),
            )
        })
}

impl ManagedNats {
    /// Starts the server and waits until it accepts connections.
    pub async fn start(config: NatsServerConfig) -> Result<ManagedNats, BusError> {
        std::fs::create_dir_all(&config.dir)
            .map_err(|e| BusError::Server(format!("creating {}: {e}", config.dir.display())))?;
        reap_leftover(&config.dir);
        write_config(&config.dir, &config.users)?;
        let (child, port) = spawn_server(&config, previous_port(&config.dir)).await?;
        let port_file = config.dir.join("port");
        if let Err(e) = std::fs::write(&port_file, format!("{port}\n")) {
            // Only the next start's wish for the same port is lost.
            tracing::warn!(error = %e, file = %port_file.display(), "keeping the nats-server's port");
        }
        let url = format!("nats://127.0.0.1:{port}");
        let (stop, stop_rx) = watch::channel(false);
        let (pid_tx, pid) = watch::channel(child.id());
        let dir = config.dir.clone();
        let supervisor = tokio::spawn(supervise(config, child, port, stop_rx, pid_tx));
        tracing::info!(%url, "managed nats-server is up");
        Ok(ManagedNats { dir, url, stop, supervisor: std::sync::Mutex::new(Some(supervisor)), pid })
    }

    /// Replaces the users: rewrites the configuration (which a restart reads too) and has the
    /// server reload it (SIGHUP). A user that is gone, or renamed, is disconnected.
    pub fn reload(&self, users: &[NatsUser]) -> Result<(), BusError> {
        write_config(&self.dir, users)?;
        if let Some(pid) = self.pid() {
            canopy_sys::signal(pid, canopy_sys::SIGHUP);
        }
        Ok(())
    }

    /// The URL clients connect to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The current server process id (changes after a restart).
    pub fn pid(&self) -> Option<u32> {
        *self.pid.borrow()
    }

    /// Stops the server: SIGTERM, a grace period, then SIGKILL.
    pub async fn shutdown(&self) {
        self.stop.send_replace(true);
        let supervisor = self.supervisor.lock().ok().and_then(|mut s| s.take());
        if let Some(supervisor) = supervisor
            && let Err(e) = supervisor.await
        {
            tracing::warn!(error = %e, "the nats-server supervisor ended abnormally");
        }
    }
}

impl Drop for ManagedNats {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        if let Some(pid) = *self.pid.borrow() {
            // Shutdown was not awaited (a panic or an early return): do not leave it running.
            canopy_sys::signal(pid, canopy_sys::SIGKILL);
        }
    }
}

async fn supervise(
    config: NatsServerConfig,
    mut child: Child,
    port: u16,
    mut stop: watch::Receiver<bool>,
    pid: watch::Sender<Option<u32>>,
) {
    let mut delay = config.restart_min;
    loop {
        tokio::select! {
            _ = stop.changed() => {
                stop_child(&mut child).await;
                pid.send_replace(None);
                remove_pid_file(&config.dir);
                return;
            }
            status = child.wait() => {
                tracing::warn!(?status, "managed nats-server exited; restarting on port {port} in {delay:?}");
                pid.send_replace(None);
                loop {
                    tokio::select! {
                        _ = stop.changed() => { remove_pid_file(&config.dir); return; }
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(config.restart_max);
                    match spawn_server(&config, Some(port)).await {
                        Ok((new_child, _)) => {
                            child = new_child;
                            pid.send_replace(child.id());
                            tracing::info!(port, "managed nats-server restarted");
                            break;
                        }
                        Err(e) => tracing::error!(error = %e, "restarting nats-server failed; retrying"),
                    }
                }
            }
            // A server that stayed up for a minute has recovered: reset the backoff.
            _ = tokio::time::sleep(Duration::from_secs(60)), if delay != config.restart_min => {
                delay = config.restart_min;
            }
        }
    }
}

async fn stop_child(child: &mut Child) {
    if let Some(pid) = child.id() {
        canopy_sys::signal(pid, canopy_sys::SIGTERM);
        if tokio::time::timeout(Duration::from_secs(5), child.wait()).await.is_ok() {
            return;
        }
        tracing::warn!(pid, "nats-server ignored SIGTERM for 5s; killing it");
    }
    if let Err(e) = child.kill().await {
        tracing::warn!(error = %e, "killing nats-server");
    }
}

fn write_config(dir: &Path, users: &[NatsUser]) -> Result<(), BusError> {
    let mut text = String::from(
        "# Generated by canopy daemon at every start and credential change; edits are overwritten.\n\
         # A private server for one workspace, on loopback only.\n\
         max_payload: 4MB\n",
    );
    if !users.is_empty() {
        text.push_str(&render_authorization(users));
    }
    write_private(&dir.join("nats.conf"), &text)
}

/// Writes a file readable by its owner only (it holds the users' passwords).
fn write_private(path: &Path, text: &str) -> Result<(), BusError> {
    canopy_sys::write_private(path, text.as_bytes())
        .map_err(|e| BusError::Server(format!("writing {}: {e}", path.display())))
}

async fn spawn_server(config: &NatsServerConfig, port: Option<u16>) -> Result<(Child, u16), BusError> {
    let ports_dir = config.dir.join("ports");
    match std::fs::remove_dir_all(&ports_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        // An old ports file left here is ignored: the new one is named by the new pid.
        Err(e) => tracing::debug!(error = %e, dir = %ports_dir.display(), "clearing old nats-server ports files"),
    }
    std::fs::create_dir_all(&ports_dir)
        .map_err(|e| BusError::Server(format!("creating {}: {e}", ports_dir.display())))?;
    let port_arg = port.map_or_else(|| "-1".to_owned(), |p| p.to_string());
    let log = config.dir.join("nats-server.log");
    let mut command = Command::new(&config.bin);
    command
        .arg("-c")
        .arg(config.dir.join("nats.conf"))
        .args(["-a", "127.0.0.1", "-p", &port_arg])
        .arg("--ports_file_dir")
        .arg(&ports_dir)
        .arg("-l")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .process_group(0);
    canopy_sys::die_with_parent(&mut command);
    let child = command.spawn().map_err(|e| BusError::Server(format!("starting {}: {e}", config.bin.display())))?;
    let pid = child.id().unwrap_or(0);
    let pid_file = config.dir.join("nats-server.pid");
    if let Err(e) = std::fs::write(&pid_file, format!("{pid}\n")) {
        // Only the next daemon's reaping of a server this one leaves behind is lost.
        tracing::warn!(error = %e, file = %pid_file.display(), "recording the nats-server's pid");
    }
    let port = wait_for_port(&ports_dir, pid, &log).await?;
    Ok((child, port))
}

/// The port an earlier start recorded, if nothing listens on it now (a port another program
/// took is given up for a free one: clients then re-read `daemon.json`).
fn previous_port(dir: &Path) -> Option<u16> {
    let port: u16 = std::fs::read_to_string(dir.join("port")).ok()?.trim().parse().ok()?;
    // Bound and dropped at once: free now. A race with another program is caught by the
    // server failing to listen, which `wait_for_port` reports.
    std::net::TcpListener::bind(("127.0.0.1", port)).ok().map(|_| port)
}

/// Reads the port from `nats-server_<pid>.ports` and waits until it accepts a TCP connection.
async fn wait_for_port(ports_dir: &Path, pid: u32, log: &Path) -> Result<u16, BusError> {
    let ports_file = ports_dir.join(format!("nats-server_{pid}.ports"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(&ports_file)
            && let Some(port) = parse_ports_file(&text)
            && tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok()
        {
            return Ok(port);
        }
        if tokio::time::Instant::now() > deadline {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            return Err(BusError::Server(format!(
                "nats-server (pid {pid}) did not start listening within 10s; last log lines: {}",
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `{"nats":["nats://127.0.0.1:44631"], ...}` -> 44631
fn parse_ports_file(text: &str) -> Option<u16> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    let url = value.get("nats")?.get(0)?.as_str()?;
    url.rsplit(':').next()?.parse().ok()
}

/// Kills a server a previous daemon left behind (recorded pid, still a nats-server using
/// this directory's config).
fn reap_leftover(dir: &Path) {
    let Ok(text) = std::fs::read_to_string(dir.join("nats-server.pid")) else { return };
    let Ok(pid) = text.trim().parse::<u32>() else { return };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline);
    let conf = dir.join("nats.conf");
    if cmdline.contains("nats-server") && cmdline.contains(&*conf.to_string_lossy()) {
        tracing::warn!(pid, "killing a nats-server left behind by an earlier daemon");
        canopy_sys::signal(pid, canopy_sys::SIGKILL);
    }
    remove_pid_file(dir);
}

fn remove_pid_file(dir: &Path) {
    let pid_file = dir.join("nats-server.pid");
    match std::fs::remove_file(&pid_file) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(error = %e, file = %pid_file.display(), "removing the nats-server's pid file"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_port_from_the_ports_file() {
        assert_eq!(parse_ports_file(r#"{"nats":["nats://127.0.0.1:44631"],"monitoring":[]}"#), Some(44631));
        assert_eq!(parse_ports_file("garbage"), None);
    }

    #[tokio::test]
    async fn restarts_a_dead_server_on_the_same_port() {
        let bin = find_nats_server().unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let nats = ManagedNats::start(NatsServerConfig {
            bin,
            dir: dir.path().to_owned(),
            users: vec![NatsUser {
                user: "u".into(),
                password: "p4ss".into(),
                permissions: canopy_proto::Permissions {
                    publish: vec![">".into()],
                    subscribe: vec![">".into()],
                    allow_responses: false,
                },
            }],
            restart_min: Duration::from_millis(50),
            restart_max: Duration::from_millis(200),
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let first = nats.pid().unwrap_or_else(|| panic!("no pid"));
        canopy_sys::signal(first, canopy_sys::SIGKILL);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(pid) = nats.pid()
                && pid != first
                && crate::Bus::connect(nats.url(), &crate::Login::fixed("u", "p4ss", None), "test", false).await.is_ok()
            {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "nats-server was not restarted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let last = nats.pid();
        nats.shutdown().await;
        let last = last.unwrap_or(0);
        assert!(!canopy_sys::alive(last), "server survived shutdown");
    }

    #[tokio::test]
    async fn a_later_start_keeps_the_port_while_it_is_free() {
        let bin = find_nats_server().unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let config = || NatsServerConfig {
            bin: bin.clone(),
            dir: dir.path().to_owned(),
            users: Vec::new(),
            restart_min: Duration::from_millis(50),
            restart_max: Duration::from_millis(200),
        };
        let first = ManagedNats::start(config()).await.unwrap_or_else(|e| panic!("{e}"));
        let url = first.url().to_owned();
        first.shutdown().await;
        let second = ManagedNats::start(config()).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(second.url(), url, "a restarted daemon's clients find the server where it was");
        second.shutdown().await;
        let port: u16 = url.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{url}"));
        let _taken = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap_or_else(|e| panic!("{e}"));
        let third = ManagedNats::start(config()).await.unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(third.url(), url, "a port another program took is given up");
        third.shutdown().await;
    }
}
