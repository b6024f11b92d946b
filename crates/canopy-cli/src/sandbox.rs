//! A sandbox: a temporary workspace, a private nats-server and the daemon in this process,
//! torn down by `stop`. `canopy demo` plays in one; the benchmark (`canopy-bench`, its own
//! binary) measures in one, which is why this module is public.
//!
//! Owns the sandbox's life (init, start, stop) and its operator's client; what only the
//! benchmark uses (a client in the daemon's process, stopping the daemon alone and starting it
//! again, the configuration read) is behind the `testing` feature, out of the shipped binary.
//! Does not measure anything: the benchmark's raw baselines and stand-in runner are
//! `canopy-bench`'s, and nothing here touches an existing workspace.

use std::path::Path;
use std::time::{Duration, Instant};

use canopy_bus::{ApiClient, Bus, Login, ManagedNats, NatsServerConfig, find_nats_server};
use canopy_config::{Config, DataDir};
use canopy_daemon::InitOptions;
use canopy_proto::Subjects;
use canopy_proto::api::WhoamiRequest;
use canopy_proto::method;
use tokio::sync::oneshot;

/// How a sandbox's workspace differs from a fresh `canopy init`.
#[derive(Debug, Clone, Copy)]
pub struct Setup<'a> {
    /// Text edits (from, to) to the generated `canopy.toml`, each applied once.
    pub edits: &'a [(&'a str, &'a str)],
    /// Files (name, text) written into the data directory before the daemon reads its
    /// configuration (scripts the edits name).
    pub files: &'a [(&'a str, &'a str)],
    /// Runners given a credential before the daemon starts (the daemon reads them once).
    pub runners: &'a [&'a str],
}

/// A running sandbox.
pub struct Sandbox {
    /// The operator's client over NATS, as the CLI calls the daemon.
    pub api: ApiClient,
    /// The same API called in this process, as the embedded runner and the console call it.
    #[cfg(feature = "testing")]
    pub in_process: ApiClient,
    /// The operator's token.
    pub operator: String,
    data: DataDir,
    #[cfg(feature = "testing")]
    config: Config,
    nats: ManagedNats,
    daemon: tokio::task::JoinHandle<Result<(), canopy_daemon::DaemonError>>,
    /// Sent to stop the daemon; its shutdown future waits on the other end.
    stop: oneshot::Sender<()>,
    /// The temporary directory holding everything; removed when dropped.
    dir: tempfile::TempDir,
}

/// A sandbox whose daemon has stopped: its server and workspace remain until dropped.
#[cfg(feature = "testing")]
pub struct Stopped {
    pub nats: ManagedNats,
    pub data: DataDir,
    pub operator: String,
    dir: tempfile::TempDir,
}

impl Sandbox {
    /// A sandbox set up as `setup` says: a fresh workspace, its own nats-server, the daemon.
    pub async fn start(setup: &Setup<'_>) -> Result<Sandbox, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("creating a temporary directory: {e}"))?;
        let data = DataDir::new(dir.path().join("data"));
        let options = InitOptions {
            mission: "benchmark".into(),
            operator: "bench".into(),
            name: "bench".into(),
            check_script: canopy_harness::scripted::check_script,
        };
        let report = canopy_daemon::init(&data, &options).await.map_err(|e| e.to_string())?;
        for id in setup.runners {
            let id = canopy_core::RunnerId::from_trusted((*id).to_owned());
            canopy_daemon::logins::add_runner(&data, &report.workspace.id, &id).map_err(|e| e.to_string())?;
        }
        let mut text = std::fs::read_to_string(data.config()).map_err(|e| e.to_string())?;
        for (from, to) in setup.edits {
            text = text.replacen(from, to, 1);
        }
        std::fs::write(data.config(), text).map_err(|e| e.to_string())?;
        for (name, text) in setup.files {
            std::fs::write(data.root().join(name), text).map_err(|e| format!("writing {name}: {e}"))?;
        }
        let nats = ManagedNats::start(NatsServerConfig {
            bin: find_nats_server().map_err(|e| e.to_string())?,
            dir: dir.path().join("nats"),
            users: Vec::new(),
            restart_min: Duration::from_millis(100),
            restart_max: Duration::from_secs(1),
        })
        .await
        .map_err(|e| e.to_string())?;
        Sandbox::launch(dir, data, nats).await
    }

    /// Starts the daemon again on a stopped sandbox's workspace and server (after its
    /// database was filled, say).
    #[cfg(feature = "testing")]
    pub async fn resume(stopped: Stopped) -> Result<Sandbox, String> {
        Sandbox::launch(stopped.dir, stopped.data, stopped.nats).await
    }

    /// The daemon in this process on an initialised workspace, and the operator's clients.
    async fn launch(dir: tempfile::TempDir, data: DataDir, nats: ManagedNats) -> Result<Sandbox, String> {
        let config = Config::load(&data.config()).map_err(|e| e.to_string())?;
        let (stop, stopped) = oneshot::channel::<()>();
        #[cfg(feature = "testing")]
        let (client, in_process) = oneshot::channel::<ApiClient>();
        #[cfg(feature = "testing")]
        let client = Some(client);
        #[cfg(not(feature = "testing"))]
        let client = None;
        let daemon_options = canopy_daemon::DaemonOptions {
            dir: data.clone(),
            git: canopy_runner::wiring::git(&config, data.root()),
            config: config.clone(),
            nats_url: Some(nats.url().to_owned()),
            embedded: Some(Box::new(canopy_runner::wiring::embedded)),
            web: None,
            client,
            check_script: canopy_harness::scripted::check_script,
        };
        let daemon = tokio::spawn(canopy_daemon::run(daemon_options, async move {
            // Either `stop` was sent or the sandbox was dropped without it: both mean stop.
            if stopped.await.is_err() {
                tracing::debug!("the sandbox was dropped without stopping its daemon; stopping it now");
            }
        }));
        let deadline = Instant::now() + Duration::from_secs(120);
        let info = loop {
            if let Ok(info) = canopy_config::read_connection_info(&data) {
                break info;
            }
            if Instant::now() > deadline {
                return Err("the daemon did not start".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let subjects = Subjects::new(&info.workspace_id);
        let login = Login { read: None, inbox: Some(subjects.inbox(canopy_proto::Party::Operator)) };
        let bus = Bus::connect(nats.url(), &login, "canopy-bench", false).await.map_err(|e| e.to_string())?;
        let api = ApiClient::new(bus, subjects, Duration::from_secs(30));
        let operator = std::fs::read_to_string(data.operator_token())
            .map(|t| t.trim().to_owned())
            .map_err(|e| format!("{}: {e}", data.operator_token().display()))?;
        // A resumed workspace may still hold the previous daemon's `daemon.json`: wait for
        // this one to answer.
        while api.send::<method::Whoami>(&operator, &WhoamiRequest {}).await.is_err() {
            if Instant::now() > deadline {
                return Err("the daemon did not answer".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        #[cfg(feature = "testing")]
        let in_process = in_process.await.map_err(|_| "the daemon gave no client in this process".to_owned())?;
        Ok(Sandbox {
            api,
            #[cfg(feature = "testing")]
            in_process,
            operator,
            data,
            #[cfg(feature = "testing")]
            config,
            nats,
            daemon,
            stop,
            dir,
        })
    }

    /// The workspace's data directory.
    pub fn data(&self) -> &DataDir {
        &self.data
    }

    /// The workspace's configuration, as the daemon read it.
    #[cfg(feature = "testing")]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A directory of the sandbox's own beside the workspace (not in it), removed with it.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// Stops the daemon and the server; the workspace is removed.
    pub async fn stop(self) {
        self.halt().await.0.shutdown().await;
    }

    /// Stops the in-process daemon, keeping the server and the workspace (for a figure that
    /// restarts the daemon as its own process).
    #[cfg(feature = "testing")]
    pub async fn stop_daemon(self) -> Stopped {
        let (nats, data, operator, dir) = self.halt().await;
        Stopped { nats, data, operator, dir }
    }

    /// Stops the in-process daemon; what remains is the server, the workspace, the operator's
    /// token and the directory.
    async fn halt(self) -> (ManagedNats, DataDir, String, tempfile::TempDir) {
        if self.stop.send(()).is_err() {
            // The daemon's shutdown future is gone: it has ended already; the join says how.
            tracing::debug!("the sandbox's daemon had stopped before it was asked to");
        }
        match self.daemon.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("the sandbox's daemon ended with an error: {e}"),
            Err(e) => tracing::warn!("the sandbox's daemon task failed: {e}"),
        }
        (self.nats, self.data, self.operator, self.dir)
    }
}

/// Runs git in `dir` as the operator would (a fixed identity), for the repositories
/// `canopy demo` and the benchmark make: its stdout, or what failed.
pub fn operator_git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "Demo Operator")
        .env("GIT_AUTHOR_EMAIL", "operator@example.com")
        .env("GIT_COMMITTER_NAME", "Demo Operator")
        .env("GIT_COMMITTER_EMAIL", "operator@example.com")
        .output()
        .map_err(|e| format!("running git: {e}"))?;
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
        false => Err(format!("git {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())),
    }
}
