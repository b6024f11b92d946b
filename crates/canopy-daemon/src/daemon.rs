//! The daemon's lifecycle: lock the directory, start (or join) NATS, serve the API, stop.
//!
//! Start-up is a list of named stages in dependency order: the directory lock, the store
//! (`open_store`), NATS and the API subscription (`connect`), the areas (`build_api`), what a
//! stopped daemon left (`recover`), serving (`Served`), the console, `daemon.json` and the
//! embedded runner (`Clients`: a CLI that finds `daemon.json` finds a daemon that answers),
//! and the timers (`background`). Shutdown runs it backwards: stop taking requests, let
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

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::{Api, Parts};
use crate::auth::{Secrets, load_or_create, write_private};
use crate::roles::{RoleDefaults, ScriptCheck};
use crate::serve::{InProcess, serve};
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
            Audit,
        ) -> Pin<Box<dyn Future<Output = Result<(String, StopEmbedded), String>> + Send>>
        + Send,
>;

/// Records a line in the audit log that no account wrote (action, detail): how the console
/// audits a failed login, holding no store access of its own.
pub type Audit = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// The console's audit hook: each line written in a task of its own (the console never waits).
fn audit_hook(store: &Store) -> Audit {
    let store = store.clone();
    Arc::new(move |action: &str, detail: &str| {
        let (store, action, detail) = (store.clone(), action.to_owned(), detail.to_owned());
        tokio::spawn(async move {
            let written =
                store.write(move |conn| canopy_store::ops::record_anonymous(conn, &action, "console", &detail)).await;
            if let Err(e) = written {
                tracing::warn!(error = %e, "auditing a console login failed");
            }
        });
    })
}

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
    pub git: canopy_git::Git,
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

/// Runs the daemon until `shutdown` resolves: its stages in dependency order, then backwards.
pub async fn run(options: DaemonOptions, shutdown: impl Future<Output = ()>) -> Result<(), DaemonError> {
    let DaemonOptions { dir, config, nats_url, embedded, web, client, check_script, git } = options;
    let config = Arc::new(config);
    if !dir.db().exists() {
        return Err(DaemonError::NoWorkspace { dir: dir.root().display().to_string() });
    }
    let _lock = lock(&dir)?;
    let (store, workspace) = open_store(&dir, &config).await?;
    let link = connect(&dir, &config, &workspace, nats_url).await?;
    let (git_listener, git_url) = bind_git(&config).await?;
    let git_program = git.program().to_owned();
    let api = build_api(&dir, &config, &store, &link, &workspace, check_script, git, git_url.clone())?;
    recover(&dir, &api, &store).await?;
    let Link { nats, url, bus, requests, subjects, .. } = link;
    let served = Served::start(api.clone(), &config, requests, &bus, &subjects);
    let tools = crate::runner_api::handler(
        served.local.clone(),
        api.auth.clone(),
        subjects.clone(),
        config.limits.max_body_bytes.saturating_mul(4),
    );
    let git_http =
        canopy_git::http::serve(git_listener, git_program, dir.root().join("repos"), api.git_authorize(), Some(tools))
            .map_err(|source| DaemonError::Io { what: "serving git".into(), source })?;
    tracing::info!(url = %git_url, "serving repositories and tool calls to runners over HTTP");
    let urls = Urls { nats: &url, git: &git_url, audit: audit_hook(&store) };
    let clients = Clients::start(&dir, &config, &served.in_process, web, embedded, &workspace, urls).await?;
    if let Some(url) = &clients.web_url {
        api.notifier.console_at(url);
    }
    if let Some(client) = client
        && client.send(served.in_process.clone()).is_err()
    {
        tracing::debug!("the composition root stopped waiting for its in-process client");
    }
    let background = background(&api, &config);

    shutdown.await;
    tracing::info!("canopy daemon stopping");
    for task in background {
        task.abort();
    }
    clients.stop().await;
    git_http.stop();
    served.stop(config.daemon.shutdown_grace).await;
    drop(api);
    if let Err(e) = std::fs::remove_file(dir.daemon_json()) {
        tracing::warn!(error = %e, path = %dir.daemon_json().display(), "removing the connection file failed");
    }
    store.close().await;
    bus.drain().await;
    if let Some(nats) = nats {
        nats.shutdown().await;
    }
    tracing::info!("canopy daemon stopped");
    Ok(())
}

/// Opens the store and reads the workspace row.
async fn open_store(dir: &DataDir, config: &Config) -> Result<(Store, canopy_core::Workspace), DaemonError> {
    let store = Store::open(&dir.db(), config.daemon.store_queue)?;
    let workspace = store
        .read(canopy_store::ops::workspace)
        .await?
        .ok_or_else(|| DaemonError::NoWorkspace { dir: dir.root().display().to_string() })?;
    Ok((store, workspace))
}

/// The daemon's NATS: the managed server (or the given one), its connection, the API
/// subscription.
struct Link {
    nats: Option<Arc<ManagedNats>>,
    url: String,
    bus: Bus,
    requests: Requests,
    subjects: Subjects,
    credentials: crate::logins::Credentials,
}

/// The API subscription's requests.
type Requests = std::pin::Pin<Box<dyn futures_util::Stream<Item = canopy_bus::Incoming> + Send>>;

/// Starts (or joins) NATS and subscribes to the API.
async fn connect(
    dir: &DataDir,
    config: &Config,
    workspace: &canopy_core::Workspace,
    nats_url: Option<String>,
) -> Result<Link, DaemonError> {
    let subjects = Subjects::new(&workspace.id);
    let credentials = crate::logins::ensure(dir, &workspace.id)?;
    let (nats, url) = match nats_url {
        Some(url) => (None, url),
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
    let requests: Requests = Box::pin(bus.serve(&subjects.api_wildcard(), API_QUEUE).await?);
    bus.flush().await?;
    Ok(Link { nats, url, bus, requests, subjects, credentials })
}

/// Binds the git endpoint (`[daemon] git_listen`); the URL runners are told.
async fn bind_git(config: &Config) -> Result<(tokio::net::TcpListener, String), DaemonError> {
    let bad = |e: String| ConfigError {
        path: std::path::PathBuf::from("canopy.toml"),
        key: "daemon.git_listen".into(),
        message: e,
    };
    let addr = config.daemon.git_address().map_err(bad)?;
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| DaemonError::Io {
        what: format!("binding the git endpoint at {addr} ([daemon] git_listen)"),
        source,
    })?;
    let bound = listener
        .local_addr()
        .map_err(|source| DaemonError::Io { what: "the git endpoint's address".into(), source })?;
    let url = match config.daemon.git_url.is_empty() {
        true => format!("http://{bound}"),
        false => config.daemon.git_url.trim_end_matches('/').to_owned(),
    };
    Ok((listener, url))
}

/// Builds the areas from the configuration, the bundle, the role defaults and the secrets.
#[allow(clippy::too_many_arguments)]
fn build_api(
    dir: &DataDir,
    config: &Arc<Config>,
    store: &Store,
    link: &Link,
    workspace: &canopy_core::Workspace,
    check_script: ScriptCheck,
    git: canopy_git::Git,
    git_url: String,
) -> Result<Api, DaemonError> {
    let secrets = Arc::new(Secrets {
        runners: std::sync::RwLock::new(link.credentials.runner_tokens()),
        session_secret: secret(&dir.session_secret(), "")?,
    });
    let roles = Arc::new(RoleDefaults::resolve(config, &dir.config(), dir.root(), check_script)?);
    for (key, why) in &roles.warnings {
        tracing::warn!(key = %key, "{why}");
    }
    let bundles = Arc::new(crate::bundle::Bundles::open(config, &dir.config(), dir.root())?);
    Ok(Api::build(Parts {
        store: store.clone(),
        wire: Arc::new(link.bus.clone()),
        subjects: link.subjects.clone(),
        config: config.clone(),
        roles,
        bundles,
        secrets,
        data_dir: dir.root().to_owned(),
        nats: link.nats.clone(),
        git: Arc::new(git),
        workspace_id: workspace.id.clone(),
        git_url,
    }))
}

/// What a stopped daemon left: configured repositories registered, half-done merges and
/// checkouts picked up, the previous embedded runner's sessions ended, budgets read.
async fn recover(dir: &DataDir, api: &Api, store: &Store) -> Result<(), DaemonError> {
    api.repos
        .register_configured_repos()
        .await
        .map_err(|(key, e)| DaemonError::Config(ConfigError { path: dir.config(), key, message: e.to_string() }))?;
    api.checks.recover().await;
    api.merges.recover().await;
    api.repos.prepare_checkouts().await;
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
    api.budgets.tree_changed().await;
    api.budgets.check_budgets().await;
    Ok(())
}

/// The API being served: over NATS in its own task (so it keeps answering while the runner
/// shuts down), and in process for the clients in this process.
struct Served {
    server: tokio::task::JoinHandle<()>,
    serving: CancellationToken,
    tracker: TaskTracker,
    in_process: ApiClient,
    /// The handler in process, for the runners' tool calls over HTTP.
    local: Arc<dyn canopy_bus::api::LocalApi>,
}

impl Served {
    fn start(api: Api, config: &Config, requests: Requests, bus: &Bus, subjects: &Subjects) -> Served {
        let serving = CancellationToken::new();
        let tracker = TaskTracker::new();
        // One bound on requests in flight, over NATS or in process.
        let permits = Arc::new(Semaphore::new(config.daemon.max_in_flight));
        let shared = Arc::new(api);
        let wire: Arc<dyn crate::wire::Wire> = Arc::new(bus.clone());
        let server =
            tokio::spawn(serve(wire, shared.clone(), permits.clone(), requests, serving.clone(), tracker.clone()));
        // The clients in this process (the embedded runner, the console) call the handler directly.
        let local: Arc<dyn canopy_bus::api::LocalApi> =
            Arc::new(InProcess { api: shared, permits, tracker: tracker.clone() });
        let in_process =
            ApiClient::new(bus.clone(), subjects.clone(), config.daemon.request_timeout).in_process(local.clone());
        Served { server, serving, tracker, in_process, local }
    }

    /// Stops taking requests and lets those in flight finish within `grace`.
    async fn stop(self, grace: Duration) {
        self.serving.cancel();
        if let Err(e) = self.server.await {
            tracing::warn!(error = %e, "the API's request loop ended abnormally");
        }
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait()).await.is_err() {
            tracing::warn!(?grace, "in-flight requests did not finish within the grace period");
        }
    }
}

/// The addresses `daemon.json` gives clients: the NATS server's and the git endpoint's; and
/// the console's audit hook.
struct Urls<'a> {
    nats: &'a str,
    git: &'a str,
    audit: Audit,
}

/// What the daemon hosts once its API answers: the console and the embedded runner, and
/// `daemon.json` written between them (so a CLI that finds it finds a daemon that answers).
struct Clients {
    web: Option<StopEmbedded>,
    /// Where the console listens, when it does.
    web_url: Option<String>,
    runner: Option<StopEmbedded>,
}

impl Clients {
    async fn start(
        dir: &DataDir,
        config: &Arc<Config>,
        in_process: &ApiClient,
        web: Option<Web>,
        embedded: Option<Embedded>,
        workspace: &canopy_core::Workspace,
        urls: Urls<'_>,
    ) -> Result<Clients, DaemonError> {
        let Urls { nats: url, git: git_url, audit } = urls;
        // The console, when on: a failure to serve it (its port taken) is logged, not fatal, so
        // the agents keep running; `canopy web` then says the daemon serves no console.
        let web = match web {
            Some(start) if config.web.enabled => {
                match start(dir.clone(), (**config).clone(), in_process.clone(), audit).await {
                    Ok(started) => Some(started),
                    Err(e) => {
                        tracing::error!(error = %e, "the operator console could not start; the daemon runs without it");
                        None
                    }
                }
            }
            _ => None,
        };
        let info = ConnectionInfo {
            workspace_id: workspace.id.clone(),
            nats_url: url.to_owned(),
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            web_url: web.as_ref().map(|(url, _)| url.clone()),
            git_url: git_url.to_owned(),
        };
        let info_text = serde_json::to_string_pretty(&info)
            .map_err(|e| DaemonError::Io { what: "encoding daemon.json".into(), source: std::io::Error::other(e) })?;
        write_private(&dir.daemon_json(), &info_text)
            .map_err(|source| DaemonError::Io { what: format!("writing {}", dir.daemon_json().display()), source })?;
        tracing::info!(workspace = %workspace.id, nats = %url, dir = %dir.root().display(), "canopy daemon ready");
        let runner = match embedded {
            Some(start) if config.runner.embedded => {
                Some(start(dir.clone(), (**config).clone(), in_process.clone()).await.map_err(DaemonError::Runner)?)
            }
            _ => None,
        };
        Ok(Clients { web: web.map(|(_, stop)| stop), web_url: info.web_url, runner })
    }

    async fn stop(self) {
        if let Some(stop) = self.web {
            stop().await;
        }
        if let Some(stop) = self.runner {
            stop().await;
        }
    }
}

/// The daemon's own timers: the periodic checks, and the text index filled behind posts.
fn background(api: &Api, config: &Config) -> Vec<tokio::task::JoinHandle<()>> {
    let every = (config.sessions.stall_after.min(config.runs.timeout).min(config.notify.remind_after) / 4)
        .clamp(Duration::from_millis(200), Duration::from_secs(30));
    let prune_every = config.retention.interval;
    let checks = tokio::spawn({
        let api = api.clone();
        async move {
            let mut tick = tokio::time::interval(every);
            let mut last_prune: Option<tokio::time::Instant> = None;
            loop {
                tick.tick().await;
                api.sessions.check_stalled().await;
                api.sessions.check_runners().await;
                api.sessions.check_failback().await;
                api.sessions.check_mailboxes().await;
                api.gate.check_requests().await;
                api.budgets.check_budgets().await;
                api.notifier.remind().await;
                if let Err(e) = api.runs.expire().await {
                    tracing::warn!(error = %e, "checking subagent run deadlines failed");
                }
                if last_prune.is_none_or(|at| at.elapsed() >= prune_every) {
                    last_prune = Some(tokio::time::Instant::now());
                    api.history.prune_records().await;
                    api.repos.prune_checkouts().await;
                    api.checks.prune().await;
                }
            }
        }
    });
    let history = api.history.clone();
    let text_index = tokio::spawn(async move { history.fill_text_index().await });
    // Branches and bases are watched on their own timer: a look runs git, and a slow one must
    // not delay the checks above.
    let watch = api.watch.clone();
    let watch_every = config.git.watch_interval;
    let branches = tokio::spawn(async move {
        let mut tick = tokio::time::interval(watch_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            watch.look().await;
        }
    });
    vec![checks, text_index, branches]
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
            // The pid is a courtesy for `Locked`'s message; the lock itself is what counts.
            if let Err(e) =
                file.set_len(0).and_then(|()| file.rewind()).and_then(|()| writeln!(file, "{}", std::process::id()))
            {
                tracing::debug!(error = %e, path = %path.display(), "writing the daemon's pid into its lock failed");
            }
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
