//! The CLI's connection to a running daemon: `daemon.json` (a stale one, whose daemon is
//! gone, is reported with the fix), the operator token, NATS logged in as an operator client
//! (or, for `canopy runner`, as that runner), and `Follower`, the connection of `tail` and
//! `watch` that finds the daemon again after it restarts on a new port.

pub use canopy_bus::CallError;
use std::time::Duration;

use crate::writer::errln;
use canopy_bus::{ApiClient, Bus, Login};
use canopy_config::credentials::read_login;
use canopy_config::{Config, ConnectionInfo, DataDir, read_connection_info};
use canopy_proto::Subjects;
use canopy_proto::api::{AgentsListResponse, RosterRequest, RosterResponse};
use canopy_proto::{ApiMethod, Party};

/// A connected operator client.
#[derive(Clone)]
pub struct Client {
    pub api: ApiClient,
    token: String,
    /// The NATS server it is connected to (from `daemon.json`).
    url: String,
}

/// How long a credential change waits for the server to accept (or refuse) the changed login.
pub const APPLIED_WITHIN: Duration = Duration::from_secs(10);

/// Reads `daemon.json`, saying how to start a daemon when there is none, or when the one it
/// names is gone (killed: it had no chance to remove the file).
pub fn connection_info(dir: &DataDir) -> Result<ConnectionInfo, CallError> {
    let info = read_connection_info(dir).map_err(|e| {
        CallError::Unreachable(format!(
            "no running daemon for {} ({}: {e}); start one with `canopy daemon --dir {}`",
            dir.root().display(),
            dir.daemon_json().display(),
            dir.root().display()
        ))
    })?;
    if !canopy_sys::alive(info.pid) {
        return Err(CallError::Unreachable(format!(
            "the daemon for {} is not running: {} names pid {}, which is gone (it was killed or crashed); start \
             it again with `canopy daemon --dir {}`, which replaces the file",
            dir.root().display(),
            dir.daemon_json().display(),
            info.pid,
            dir.root().display()
        )));
    }
    Ok(info)
}

/// Connects to the daemon's NATS (from `daemon.json`) as an operator client; with the URL.
pub async fn api_client(dir: &DataDir) -> Result<(ApiClient, String), CallError> {
    let info = connection_info(dir)?;
    let subjects = Subjects::new(&info.workspace_id);
    let login_file = dir.operator_login();
    let login = Login::reading(move || read_login(&login_file), Some(subjects.inbox(Party::Operator)));
    Ok((connect(dir, &info.nats_url, subjects, &login, "canopy-cli", Duration::ZERO).await?, info.nats_url))
}

/// Connects to `url` with `login`, for the workspace `subjects` belong to; a login the server
/// refuses is tried again for up to `patience` (a runner's credential added a moment ago).
pub async fn connect(
    dir: &DataDir,
    url: &str,
    subjects: Subjects,
    login: &Login,
    name: &str,
    patience: Duration,
) -> Result<ApiClient, CallError> {
    let timeout = Config::load(&dir.config())
        .map(|c| c.daemon.request_timeout)
        .unwrap_or_else(|_| Config::default().daemon.request_timeout);
    let bus = Bus::connect_patiently(url, login, name, patience).await.map_err(|e| {
        let fix = match canopy_bus::refused_login(&e) {
            true => format!(
                " (the server refused this login for {patience:?}: is its credential current? `canopy runners add` \
                 makes one, `canopy credentials rotate` replaces them all)"
            ),
            false => String::new(),
        };
        CallError::Unreachable(format!("{e}{fix}"))
    })?;
    Ok(ApiClient::new(bus, subjects, timeout))
}

/// Reads a token file of the data directory.
pub fn read_token(path: &std::path::Path) -> Result<String, CallError> {
    Ok(std::fs::read_to_string(path)
        .map_err(|e| CallError::Unreachable(format!("reading {}: {e}", path.display())))?
        .trim()
        .to_owned())
}

impl Client {
    pub async fn connect(dir: &DataDir) -> Result<Client, CallError> {
        let (api, url) = api_client(dir).await?;
        Ok(Client { api, token: read_token(&dir.operator_token())?, url })
    }

    /// Calls one API method as the operator.
    /// Waits until the NATS server it is connected to accepts (`accepted`) or refuses the login
    /// `user`/`password`, for up to `APPLIED_WITHIN`: a credential change is done only then.
    pub async fn await_login(&self, user: &str, password: &str, accepted: bool) -> Result<(), CallError> {
        Bus::await_login(&self.url, user, password, accepted, APPLIED_WITHIN)
            .await
            .map_err(|e| CallError::Unreachable(e.to_string()))
    }

    pub async fn send<M: ApiMethod>(&self, request: &M::Request) -> Result<M::Response, CallError> {
        self.api.send::<M>(&self.token, request).await
    }

    /// Every agent account, page by page.
    pub async fn agents(&self) -> Result<AgentsListResponse, CallError> {
        self.api.agents_all(&self.token).await
    }

    /// Every agent's roster line, page by page.
    pub async fn roster(&self) -> Result<RosterResponse, CallError> {
        self.api.roster_all(&self.token, RosterRequest::default()).await
    }
}

/// The connection of a follower (`tail`, `watch`). A daemon restart gives its NATS server a
/// new port: when calls fail, `recover` re-reads `daemon.json` and connects to the server it
/// names now, saying so in one line on stderr; the follower then catches up from its cursor.
pub struct Follower {
    dir: DataDir,
    pub client: Client,
    /// Whether the operator was told the daemon is away (told once per absence).
    away: bool,
}

impl Follower {
    pub fn new(dir: &DataDir, client: Client) -> Follower {
        Follower { dir: dir.clone(), client, away: false }
    }

    /// After a call failed with `why`: true when the follower should try again (connected
    /// anew to a restarted daemon, or the same server, which NATS reconnects to by itself);
    /// false while no daemon is there (told once).
    pub async fn recover(&mut self, why: &str) -> bool {
        let info = match connection_info(&self.dir) {
            Ok(info) => info,
            Err(e) => {
                self.away(&e.to_string());
                return false;
            }
        };
        if info.nats_url == self.client.url {
            self.away(why);
            return true;
        }
        match Client::connect(&self.dir).await {
            Ok(client) => {
                errln!("the daemon is back (pid {}, {}); catching up", info.pid, info.nats_url);
                self.client = client;
                self.away = false;
                true
            }
            Err(e) => {
                self.away(&e.to_string());
                false
            }
        }
    }

    /// A call answered again after an absence on the same server.
    pub fn answered(&mut self) {
        if std::mem::take(&mut self.away) {
            errln!("the daemon answers again; catching up");
        }
    }

    fn away(&mut self, why: &str) {
        if !std::mem::replace(&mut self.away, true) {
            errln!("lost the daemon ({why}); waiting for it to come back");
        }
    }
}
