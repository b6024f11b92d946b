//! The daemon's lifecycle: lock the directory, start (or join) NATS, serve the API, stop.
//!
//! Start-up order is the dependency order: configuration, the directory lock, the store,
//! NATS, the API subscription, and only then `daemon.json`, so a CLI that finds that file
//! finds a daemon that answers. Shutdown runs it backwards: stop taking requests, let
//! in-flight ones finish within the grace period, close the store (its writer drains its
//! queue), drain NATS, stop the managed server, remove `daemon.json`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use canopy_bus::{Bus, ManagedNats, NatsServerConfig, find_nats_server};
use canopy_proto::Subjects;
use canopy_store::Store;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::auth::{random_hex, write_private};
use crate::config::{Config, ConfigError};
use crate::handlers::Api;
use crate::paths::DataDir;

/// NATS queue group of the API subscription, so several daemons could share the load.
pub const API_QUEUE: &str = "canopy-daemon";

/// How to run the daemon.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    pub dir: DataDir,
    /// An existing NATS server; when absent the daemon runs its own.
    pub nats_url: Option<String>,
}

/// What a running daemon writes to `daemon.json` for the CLI.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionInfo {
    pub workspace_id: String,
    pub nats_url: String,
    /// The managed server's client token; `None` for an external server.
    pub nats_token: Option<String>,
    pub pid: u32,
    pub version: String,
}

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    #[error("bad configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("no workspace in {dir}: run `canopy init --dir {dir}` first")]
    NoWorkspace { dir: String },
    #[error("another daemon already serves {dir} (pid {pid})")]
    Locked { dir: String, pid: String },
    #[error("{0}")]
    Store(#[from] canopy_core::Error),
    #[error("{0}")]
    Bus(#[from] canopy_bus::BusError),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
}

/// Runs the daemon until `shutdown` resolves.
pub async fn run(options: DaemonOptions, shutdown: impl Future<Output = ()>) -> Result<(), DaemonError> {
    let dir = options.dir.clone();
    let config = Arc::new(Config::load(&dir.config())?);
    if !dir.db().exists() {
        return Err(DaemonError::NoWorkspace { dir: dir.root().display().to_string() });
    }
    let _lock = lock(&dir)?;
    let store = Store::open(&dir.db(), config.daemon.store_queue)?;
    let workspace = store
        .read(canopy_store::ops::workspace)
        .await?
        .ok_or_else(|| DaemonError::NoWorkspace { dir: dir.root().display().to_string() })?;

    let (nats, url, nats_token) = match &options.nats_url {
        Some(url) => (None, url.clone(), None),
        None => {
            let token = random_hex(24)
                .map_err(|source| DaemonError::Io { what: "generating the NATS token".into(), source })?;
            let nats = ManagedNats::start(NatsServerConfig {
                bin: find_nats_server()?,
                dir: dir.nats_dir(),
                token: Some(token.clone()),
                restart_min: config.nats.restart_backoff_min,
                restart_max: config.nats.restart_backoff_max,
            })
            .await?;
            let url = nats.url().to_owned();
            (Some(nats), url, Some(token))
        }
    };
    let bus = Bus::connect(&url, nats_token.as_deref(), "canopy-daemon", true).await?;
    let subjects = Subjects::new(&workspace.id);
    let mut requests = bus.serve(&subjects.api_wildcard(), API_QUEUE).await?;
    bus.flush().await?;

    let info = ConnectionInfo {
        workspace_id: workspace.id.clone(),
        nats_url: url.clone(),
        nats_token,
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
    };
    let info_text = serde_json::to_string_pretty(&info).unwrap_or_default();
    write_private(&dir.daemon_json(), &info_text)
        .map_err(|source| DaemonError::Io { what: format!("writing {}", dir.daemon_json().display()), source })?;
    tracing::info!(workspace = %workspace.id, nats = %url, dir = %dir.root().display(), "canopy daemon ready");

    let api = Api { store: store.clone(), bus: bus.clone(), subjects, config: config.clone() };
    let permits = Arc::new(Semaphore::new(config.daemon.max_in_flight));
    let tracker = TaskTracker::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            incoming = requests.next() => {
                let Some(incoming) = incoming else {
                    tracing::error!("the API subscription ended; stopping");
                    break;
                };
                let Some(reply) = incoming.reply.clone() else {
                    tracing::debug!(subject = %incoming.subject, "ignoring an API message without a reply subject");
                    continue;
                };
                // Waiting here leaves further requests in NATS, bounded by its buffers.
                let Ok(permit) = permits.clone().acquire_owned().await else { break };
                let api = api.clone();
                tracker.spawn(async move {
                    let answer = api.handle(&incoming.subject, incoming.token.as_deref(), &incoming.payload).await;
                    if let Err(e) = api.bus.publish(&reply, answer).await {
                        tracing::warn!(error = %e, "sending a reply failed");
                    }
                    drop(permit);
                });
            }
        }
    }

    tracing::info!("canopy daemon stopping");
    drop(requests);
    tracker.close();
    if tokio::time::timeout(config.daemon.shutdown_grace, tracker.wait()).await.is_err() {
        tracing::warn!(grace = ?config.daemon.shutdown_grace, "in-flight requests did not finish within the grace period");
    }
    let _ = std::fs::remove_file(dir.daemon_json());
    store.close().await;
    bus.drain().await;
    if let Some(nats) = nats {
        nats.shutdown().await;
    }
    tracing::info!("canopy daemon stopped");
    Ok(())
}

/// Takes the directory lock, or says which daemon holds it.
fn lock(dir: &DataDir) -> Result<std::fs::File, DaemonError> {
    let path = dir.lock();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|source| DaemonError::Io { what: format!("opening {}", path.display()), source })?;
    match file.try_lock() {
        Ok(()) => {
            use std::io::{Seek, Write};
            let mut file = file;
            let _ =
                file.set_len(0).and_then(|()| file.rewind()).and_then(|()| writeln!(file, "{}", std::process::id()));
            Ok(file)
        }
        Err(std::fs::TryLockError::WouldBlock) => Err(DaemonError::Locked {
            dir: dir.root().display().to_string(),
            pid: std::fs::read_to_string(&path).unwrap_or_default().trim().to_owned(),
        }),
        Err(std::fs::TryLockError::Error(source)) => {
            Err(DaemonError::Io { what: format!("locking {}", path.display()), source })
        }
    }
}

/// Reads `daemon.json`, if a daemon has written one.
pub fn read_connection_info(dir: &DataDir) -> std::io::Result<ConnectionInfo> {
    let text = std::fs::read_to_string(dir.daemon_json())?;
    serde_json::from_str(&text).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// How long a CLI waits for a reply by default, before configuration is read.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
