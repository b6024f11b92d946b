//! The daemon's lifecycle: lock the directory, start (or join) NATS, serve the API, stop.
//!
//! Start-up order is the dependency order: configuration, the directory lock, the store,
//! NATS, the API subscription, and only then `daemon.json`, so a CLI that finds that file
//! finds a daemon that answers. Shutdown runs it backwards: stop taking requests, let
//! in-flight ones finish within the grace period, close the store (its writer drains its
//! queue), drain NATS, stop the managed server, remove `daemon.json`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use canopy_bus::{ApiClient, Bus, Login, ManagedNats, NatsServerConfig, find_nats_server};
use canopy_config::credentials::read_login;
use canopy_proto::{Party, Subjects};
use canopy_store::Store;
use futures_util::StreamExt;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::{load_or_create, write_private};
use crate::context::{Api, Secrets, refusal};
use crate::roles::{RoleDefaults, ScriptCheck};
use canopy_config::{Config, ConfigError};
use canopy_config::{ConnectionInfo, DataDir};

/// NATS queue group of the API subscription, so several daemons could share the load.
pub const API_QUEUE: &str = "canopy-daemon";

/// Stops what `Embedded` started; the daemon awaits it before it stops serving the API.
pub type StopEmbedded = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// Starts what the daemon hosts once its API answers, when `[runner] embedded` is on: the
/// composition root's embedded runner, given the data directory, the configuration and a
/// client of this daemon's API on its own NATS connection.
pub type Embedded = Box<
    dyn FnOnce(DataDir, Config, ApiClient) -> Pin<Box<dyn Future<Output = Result<StopEmbedded, String>> + Send>> + Send,
>;

/// Starts the operator console once the API answers, when `[web] enabled` is on: given the
/// data directory, the configuration and a client of this daemon's API, it returns the
/// console's URL (written to `daemon.json`) and how to stop it. The console calls the API
/// like any client, with the token of the operator who logged in; it holds no store access.
pub type Web = Box<
    dyn FnOnce(
            DataDir,
            Config,
            ApiClient,
        ) -> Pin<Box<dyn Future<Output = Result<(String, StopEmbedded), String>> + Send>>
        + Send,
>;

/// How to run the daemon.
pub struct DaemonOptions {
    pub dir: DataDir,
    /// `canopy.toml`, loaded (and checked) by the composition root.
    pub config: Config,
    /// An existing NATS server; when absent the daemon runs its own.
    pub nats_url: Option<String>,
    /// The embedded runner; `None` runs none even when `[runner] embedded` is on.
    pub embedded: Option<Embedded>,
    /// The operator console; `None` serves none even when `[web] enabled` is on.
    pub web: Option<Web>,
    /// Receives, once the API answers, a client that calls this daemon's handler in process
    /// (`ApiClient::in_process`), for a composition root that runs the daemon in its own
    /// process and calls it (the benchmark).
    pub client: Option<tokio::sync::oneshot::Sender<ApiClient>>,
    /// How scripted-harness scripts are checked (roles at start, an agent's own script).
    pub check_script: ScriptCheck,
    /// How git runs, and the sandbox it gets in a checkout a session has written.
    pub git: canopy_workspace::Git,
}

impl std::fmt::Debug for DaemonOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaemonOptions")
            .field("dir", &self.dir)
            .field("config", &self.config)
            .field("nats_url", &self.nats_url)
            .field("embedded", &self.embedded.is_some())
            .field("web", &self.web.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
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
    #[error("starting the embedded runner: {0}")]
    Runner(String),
}

/// Runs the daemon until `shutdown` resolves.
pub async fn run(options: DaemonOptions, shutdown: impl Future<Output = ()>) -> Result<(), DaemonError> {
    let dir = options.dir.clone();
    tokio::pin!(shutdown);
    let config = Arc::new(options.config);
    if !dir.db().exists() {
        return Err(DaemonError::NoWorkspace { dir: dir.root().display().to_string() });
    }
    let _lock = lock(&dir)?;
    let store = Store::open(&dir.db(), config.daemon.store_queue)?;
    let workspace = store
        .read(canopy_store::ops::workspace)
        .await?
        .ok_or_else(|| DaemonError::NoWorkspace { dir: dir.root().display().to_string() })?;

    let subjects = Subjects::new(&workspace.id);
    let credentials = crate::credentials::ensure(&dir, &workspace.id)?;
    let (nats, url) = match &options.nats_url {
        Some(url) => (None, url.clone()),
        None => {
            let nats = ManagedNats::start(NatsServerConfig {
                bin: find_nats_server()?,
                dir: dir.nats_dir(),
                users: credentials.users(&subjects),
                restart_min: config.nats.restart_backoff_min,
                restart_max: config.nats.restart_backoff_max,
            })
            .await?;
            let url = nats.url().to_owned();
            (Some(Arc::new(nats)), url)
        }
    };
    let login_file = dir.daemon_login();
    let login = Login::reading(move || read_login(&login_file), Some(subjects.inbox(Party::Daemon)));
    let bus = Bus::connect(&url, &login, "canopy-daemon", true).await?;
    let requests = bus.serve(&subjects.api_wildcard(), API_QUEUE).await?;
    bus.flush().await?;

    let secrets = Arc::new(Secrets {
        runners: std::sync::RwLock::new(credentials.runner_tokens()),
        session_secret: secret(&dir.session_secret(), "")?,
    });
    let roles = Arc::new(RoleDefaults::resolve(&config, &dir.config(), dir.root(), options.check_script)?);
    for (key, why) in &roles.warnings {
        tracing::warn!(key = %key, "{why}");
    }
    let prompts = Arc::new(crate::prompts::Prompts::open(&config, &dir.config(), dir.root())?);
    let api = Api {
        store: store.clone(),
        bus: bus.clone(),
        subjects: subjects.clone(),
        config: config.clone(),
        roles,
        secrets,
        data_dir: dir.root().to_owned(),
        loops: Arc::default(),
        operators: Arc::default(),
        session_tokens: Arc::default(),
        revocations: Arc::default(),
        prompts,
        role_cache: Arc::default(),
        nats: nats.clone(),
        credentials_lock: Arc::default(),
        workspace_id: workspace.id.clone(),
        git: Arc::new(options.git.clone()),
        repo_locks: Arc::default(),
        finishing: Arc::default(),
        preparing: Arc::default(),
        budgets: Arc::default(),
        role_budgets: Arc::new(crate::budgets::role_budgets(&config)),
    };
    api.register_configured_repos()
        .await
        .map_err(|(key, e)| DaemonError::Config(ConfigError { path: dir.config(), key, message: e.to_string() }))?;
    api.recover_workspaces().await;
    // The embedded runner of an earlier daemon process died with it: its sessions end now,
    // not when its heartbeat expires, so nothing is shown or routed to a dead runner.
    let embedded = canopy_core::RunnerId::from_trusted(canopy_config::EMBEDDED_RUNNER.to_owned());
    match store
        .write(move |conn| {
            canopy_store::ops::retire_runner(conn, &embedded, "the daemon restarted; its session ended with it")
        })
        .await
    {
        Ok(0) => {}
        Ok(ended) => tracing::info!(ended, "ended the previous embedded runner's sessions"),
        Err(e) => tracing::warn!(error = %e, "ending the previous embedded runner's sessions failed"),
    }
    api.tree_changed().await;
    api.check_budgets().await;

    // Serve the API in its own task, so it keeps answering while the runner shuts down.
    let serving = CancellationToken::new();
    let tracker = TaskTracker::new();
    // One bound on requests in flight, over NATS or in process.
    let permits = Arc::new(Semaphore::new(config.daemon.max_in_flight));
    let shared = Arc::new(api.clone());
    let server = tokio::spawn(serve(shared.clone(), permits.clone(), requests, serving.clone(), tracker.clone()));
    // The clients in this process (the embedded runner, the console) call the handler directly.
    let local: Arc<dyn canopy_bus::api::LocalApi> =
        Arc::new(InProcess { api: shared, permits, tracker: tracker.clone() });
    let in_process = ApiClient::new(bus.clone(), subjects.clone(), config.daemon.request_timeout).in_process(local);

    // The console, when on: a failure to serve it (its port taken) is logged, not fatal, so
    // the agents keep running; `canopy web` then says the daemon serves no console.
    let web = match options.web {
        Some(start) if config.web.enabled => match start(dir.clone(), (*config).clone(), in_process.clone()).await {
            Ok(started) => Some(started),
            Err(e) => {
                tracing::error!(error = %e, "the operator console could not start; the daemon runs without it");
                None
            }
        },
        _ => None,
    };
    let info = ConnectionInfo {
        workspace_id: workspace.id.clone(),
        nats_url: url.clone(),
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        web_url: web.as_ref().map(|(url, _)| url.clone()),
    };
    let info_text = serde_json::to_string_pretty(&info).unwrap_or_default();
    write_private(&dir.daemon_json(), &info_text)
        .map_err(|source| DaemonError::Io { what: format!("writing {}", dir.daemon_json().display()), source })?;
    tracing::info!(workspace = %workspace.id, nats = %url, dir = %dir.root().display(), "canopy daemon ready");

    let runner = match options.embedded {
        Some(start) if config.runner.embedded => {
            Some(start(dir.clone(), (*config).clone(), in_process.clone()).await.map_err(DaemonError::Runner)?)
        }
        _ => None,
    };
    if let Some(client) = options.client {
        let _ = client.send(in_process);
    }
    let stall_check = tokio::spawn({
        let api = api.clone();
        let every = (config.sessions.stall_after.min(config.runs.timeout) / 4)
            .clamp(Duration::from_millis(200), Duration::from_secs(30));
        let prune_every = config.retention.interval;
        async move {
            let mut tick = tokio::time::interval(every);
            let mut last_prune: Option<tokio::time::Instant> = None;
            loop {
                tick.tick().await;
                api.check_stalled().await;
                api.check_runners().await;
                api.check_mailboxes().await;
                api.check_requests().await;
                api.check_budgets().await;
                if let Err(e) = api.expire_runs().await {
                    tracing::warn!(error = %e, "checking subagent run deadlines failed");
                }
                if last_prune.is_none_or(|at| at.elapsed() >= prune_every) {
                    last_prune = Some(tokio::time::Instant::now());
                    api.prune_records().await;
                    api.prune_checkouts().await;
                }
            }
        }
    });

    let text_index = tokio::spawn({
        let api = api.clone();
        async move { api.fill_text_index().await }
    });

    shutdown.await;
    tracing::info!("canopy daemon stopping");
    stall_check.abort();
    text_index.abort();
    if let Some((_, stop)) = web {
        stop().await;
    }
    if let Some(stop) = runner {
        stop().await;
    }
    serving.cancel();
    let _ = server.await;
    tracker.close();
    if tokio::time::timeout(config.daemon.shutdown_grace, tracker.wait()).await.is_err() {
        tracing::warn!(grace = ?config.daemon.shutdown_grace, "in-flight requests did not finish within the grace period");
    }
    drop(api);
    let _ = std::fs::remove_file(dir.daemon_json());
    store.close().await;
    bus.drain().await;
    if let Some(nats) = nats {
        nats.shutdown().await;
    }
    tracing::info!("canopy daemon stopped");
    Ok(())
}

/// The handler for clients in the daemon's process: each call runs under the same bound and
/// tracker as a request over NATS, polled by its caller (no task of its own: a spawn wakes
/// the other worker, which cost more than a short call). A call whose caller stops waiting
/// once it holds its permit is not dropped with it: the rest runs in a task
/// (`FinishOnDrop`), so it finishes, and shutdown waits for it, as for a request over NATS;
/// one dropped while still queued for a permit never runs. A panic in the handler is a
/// refusal, as it was when each call had a task.
struct InProcess {
    api: Arc<Api>,
    permits: Arc<Semaphore>,
    tracker: TaskTracker,
}

impl canopy_bus::api::LocalApi for InProcess {
    fn handle(
        &self,
        subject: String,
        token: String,
        payload: bytes::Bytes,
    ) -> Pin<Box<dyn Future<Output = bytes::Bytes> + Send>> {
        let (api, permits) = (self.api.clone(), self.permits.clone());
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let running = started.clone();
        let call = self.tracker.track_future(async move {
            let Ok(permit) = permits.acquire_owned().await else {
                return refusal(&canopy_core::Error::Unavailable("the daemon is stopping".into()));
            };
            running.store(true, std::sync::atomic::Ordering::Relaxed);
            let answer = std::panic::AssertUnwindSafe(api.handle(&subject, Some(&token), &payload));
            let answer = futures_util::FutureExt::catch_unwind(answer).await;
            drop(permit);
            answer.unwrap_or_else(|_| refusal(&canopy_core::Error::Internal("a request's handler panicked".into())))
        });
        Box::pin(FinishOnDrop { call: Some(Box::pin(call)), started })
    }
}

/// A call polled in its caller's task; dropped unfinished after it started, it hands the
/// rest to a task of its own on the current runtime.
struct FinishOnDrop {
    call: Option<Pin<Box<dyn Future<Output = bytes::Bytes> + Send>>>,
    started: Arc<std::sync::atomic::AtomicBool>,
}

impl Future for FinishOnDrop {
    type Output = bytes::Bytes;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<bytes::Bytes> {
        let Some(call) = self.call.as_mut() else {
            return std::task::Poll::Ready(refusal(&canopy_core::Error::Internal(
                "an in-process call was polled after it finished".into(),
            )));
        };
        let answer = std::task::ready!(call.as_mut().poll(cx));
        self.call = None;
        std::task::Poll::Ready(answer)
    }
}

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else { return };
        if !self.started.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(call)),
            Err(_) => tracing::warn!("an in-process call was dropped unfinished outside the runtime"),
        }
    }
}

/// Answers API requests until `stop`, each in its own task, at most `permits` at once.
async fn serve(
    api: Arc<Api>,
    permits: Arc<Semaphore>,
    mut requests: impl futures_util::Stream<Item = canopy_bus::Incoming> + Unpin,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let inboxes = format!("_INBOX.{}.", api.workspace_id);
    loop {
        let incoming = tokio::select! {
            () = stop.cancelled() => return,
            incoming = requests.next() => incoming,
        };
        let Some(incoming) = incoming else {
            tracing::error!("the API subscription ended");
            return;
        };
        let Some(reply) = incoming.reply.clone() else {
            tracing::debug!(subject = %incoming.subject, "ignoring an API message without a reply subject");
            continue;
        };
        // The daemon may publish anywhere in the workspace: it answers only on an inbox, never
        // on a subject a caller chose (a runner's doorbell, an event).
        if !reply.starts_with(&inboxes) {
            tracing::debug!(%reply, "ignoring an API request whose reply subject is no inbox");
            continue;
        }
        // Waiting here leaves further requests in NATS, bounded by its buffers.
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
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

fn secret(path: &std::path::Path, prefix: &str) -> Result<String, DaemonError> {
    load_or_create(path, prefix)
        .map_err(|source| DaemonError::Io { what: format!("reading {}", path.display()), source })
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
