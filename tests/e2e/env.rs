//! `TestEnv`: a temp data directory, a real `nats-server` on a free port, and the daemon as
//! a child process, all torn down on drop.
//!
//! The server comes from `canopy_bus::ManagedNats` (the same code the daemon uses for its
//! private server), started here by the test so the daemon runs in `--nats-url` mode and
//! the test can kill and restart NATS under it. A missing `nats-server` fails loudly with
//! the install command.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use canopy_bus::{Bus, ManagedNats, NatsServerConfig, find_nats_server};
use serde_json::Value;

pub const CANOPY: &str = env!("CARGO_BIN_EXE_canopy-under-test");

/// Retries an expression until it is true, failing after the patience runs out (30 s, or
/// `within = <Duration>` first for work that is slow on purpose).
#[macro_export]
macro_rules! assert_eventually {
    (within = $patience:expr, $cond:expr, $($msg:tt)+) => {{
        let deadline = std::time::Instant::now() + $patience;
        loop {
            if $cond { break; }
            assert!(std::time::Instant::now() < deadline, $($msg)+);
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
    }};
    ($cond:expr, $($msg:tt)+) => {{
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if $cond { break; }
            assert!(std::time::Instant::now() < deadline, $($msg)+);
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
    }};
}

pub struct TestEnv {
    pub rt: tokio::runtime::Runtime,
    pub dir: tempfile::TempDir,
    pub nats: Option<ManagedNats>,
    pub daemon: Option<Child>,
}

impl TestEnv {
    /// A fresh environment with an initialised workspace and a running daemon without
    /// sessions (no embedded runner), for tests of the store and the API.
    pub fn started() -> TestEnv {
        TestEnv::started_with(&[("embedded = true", "embedded = false")])
    }

    /// A fresh environment whose daemon runs sessions (the embedded runner), with
    /// `canopy.toml` edits applied as (from, to) replacements of its default lines.
    pub fn started_with(edits: &[(&str, &str)]) -> TestEnv {
        let mut env = TestEnv::new();
        env.ok(&["init", "--operator", "ops", "--mission", "Keep the build green"]);
        env.edit_config(edits);
        env.start_daemon();
        env
    }

    /// Replaces lines of `canopy.toml`; each `from` must be there.
    pub fn edit_config(&self, edits: &[(&str, &str)]) {
        let path = self.data_dir().join("canopy.toml");
        let mut text = std::fs::read_to_string(&path).unwrap();
        for (from, to) in edits {
            assert!(text.contains(from), "canopy.toml has no {from:?}");
            text = text.replacen(from, to, 1);
        }
        std::fs::write(&path, text).unwrap();
    }

    /// A temp directory and a real nats-server; no workspace, no daemon.
    pub fn new() -> TestEnv {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let bin = find_nats_server().unwrap_or_else(|e| {
            panic!("{e}\nThe e2e tests need a real nats-server: run scripts/test.sh, which installs it")
        });
        let nats = rt
            .block_on(ManagedNats::start(NatsServerConfig {
                bin,
                dir: dir.path().join("test-nats"),
                users: Vec::new(),
                restart_min: Duration::from_millis(100),
                restart_max: Duration::from_millis(500),
            }))
            .unwrap();
        TestEnv { rt, dir, nats: Some(nats), daemon: None }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn nats_url(&self) -> String {
        self.nats.as_ref().map(|n| n.url().to_owned()).unwrap_or_default()
    }

    /// A `canopy` command for this workspace.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(CANOPY);
        command.arg("--dir").arg(self.data_dir()).args(args);
        command.env_remove("CANOPY_DIR").env_remove("CANOPY_NATS_URL").env("RUST_LOG", "warn");
        command
    }

    /// Runs `canopy ARGS` and returns its output.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).stdin(Stdio::null()).output().unwrap()
    }

    /// Runs `canopy ARGS` with `input` on stdin.
    pub fn run_with_stdin(&self, args: &[&str], input: &str) -> Output {
        use std::io::Write;
        let mut child =
            self.command(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }

    /// Runs a command that must succeed and returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "canopy {args:?} failed ({}): {}{}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// Runs `canopy --json ARGS`, which must succeed, and parses the result.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut full = vec!["--json"];
        full.extend_from_slice(args);
        let stdout = self.ok(&full);
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("canopy {args:?} printed non-JSON ({e}): {stdout}"))
    }

    /// Runs `canopy --json ARGS`, which must fail with exit code 1, and returns the error object.
    pub fn refused(&self, args: &[&str]) -> Value {
        let mut full = vec!["--json"];
        full.extend_from_slice(args);
        let out = self.run(&full);
        assert_eq!(
            out.status.code(),
            Some(1),
            "canopy {args:?} should be refused: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        let value: Value = serde_json::from_slice(&out.stdout).unwrap();
        value["error"].clone()
    }

    /// Starts `canopy daemon --nats-url` on the test's server and waits until it answers.
    pub fn start_daemon(&mut self) {
        let url = self.nats_url();
        self.spawn_daemon(&["daemon", "--nats-url", &url]);
    }

    /// Runs `canopy ARGS` as the daemon process (`daemon` or `up`), logging to `daemon.log`,
    /// and waits until it answers.
    pub fn spawn_daemon(&mut self, args: &[&str]) {
        assert!(self.daemon.is_none(), "a daemon is already running");
        let log = std::fs::File::create(self.dir.path().join("daemon.log")).unwrap();
        let child = self
            .command(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.daemon = Some(child);
        self.wait_ready();
    }

    /// Starts a standalone runner (`canopy runner --id second`, its credential made first) on
    /// this workspace's NATS, its output discarded; dropping the guard kills it.
    pub fn spawn_runner(&self) -> Guarded {
        self.runner_credential("second");
        Guarded(
            self.command(&["runner", "--id", "second", "--nats-url", &self.nats_url()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    /// Runs `command` (a `canopy runner`) logging to `<name>.log`, and waits until it says it
    /// registered with the daemon; dropping the guard kills it.
    pub fn spawn_registered_runner(&self, mut command: Command, name: &str) -> Guarded {
        let log = self.dir.path().join(format!("{name}.log"));
        let runner = Guarded(
            command
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        crate::assert_eventually!(
            std::fs::read_to_string(&log).is_ok_and(|l| l.contains("registered with the daemon")),
            "runner {name} never registered: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        runner
    }

    /// Waits until `whoami` succeeds.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.run(&["whoami"]).status.success() {
                return;
            }
            if let Some(child) = self.daemon.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("the daemon exited ({status}) before it was ready; log: {}", self.daemon_log());
            }
            assert!(Instant::now() < deadline, "the daemon did not become ready; log: {}", self.daemon_log());
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    pub fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    /// `kill -9` the daemon and reap it.
    pub fn kill_daemon(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            signal(child.id(), canopy_sys::SIGKILL);
            let _ = child.wait();
        }
    }

    /// SIGTERM the daemon and wait for it; returns its exit status code.
    pub fn stop_daemon(&mut self) -> Option<i32> {
        let mut child = self.daemon.take()?;
        signal(child.id(), canopy_sys::SIGTERM);
        wait_timeout(&mut child, Duration::from_secs(20)).and_then(|s| s.code())
    }

    /// A raw NATS client on the test server (no login: the test server is open), taking its
    /// replies on an inbox of the workspace (the daemon answers only there).
    pub fn bus(&self) -> Bus {
        let inbox = self.subjects().inbox(canopy_proto::Party::Operator);
        let login = canopy_bus::Login { read: None, inbox: Some(inbox) };
        self.rt.block_on(Bus::connect(&self.nats_url(), &login, "e2e", false)).unwrap()
    }

    /// The workspace's subject map, from `daemon.json`.
    pub fn subjects(&self) -> canopy_proto::Subjects {
        let info: Value =
            serde_json::from_str(&std::fs::read_to_string(self.data_dir().join("daemon.json")).unwrap()).unwrap();
        canopy_proto::Subjects::new(info["workspace_id"].as_str().unwrap())
    }

    /// A runner's credential (`canopy runners add ID`, once), as JSON.
    pub fn runner_credential(&self, id: &str) -> Value {
        let path = self.data_dir().join("credentials/runners").join(format!("{id}.json"));
        if !path.exists() {
            self.ok(&["runners", "add", id]);
        }
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    }

    /// A runner's API token.
    pub fn runner_token(&self, id: &str) -> String {
        self.runner_credential(id)["token"].as_str().unwrap().to_owned()
    }

    /// The operator's token.
    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data_dir().join("operator.token")).unwrap().trim().to_owned()
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        self.kill_daemon();
        if let Some(nats) = self.nats.take() {
            self.rt.block_on(nats.shutdown());
        }
    }
}

/// A child process that is killed (and reaped) when the test ends, even when it fails.
pub struct Guarded(pub Child);

impl Drop for Guarded {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub use canopy_sys::{alive, signal};

pub fn wait_timeout(child: &mut Child, patience: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + patience;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads a pid file.
pub fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}
