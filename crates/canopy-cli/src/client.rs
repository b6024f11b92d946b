//! The CLI's connection to a running daemon: `daemon.json`, the operator token, and NATS
//! logged in as an operator client (or, for `canopy runner`, as that runner).

pub use canopy_bus::CallError;
use canopy_bus::{ApiClient, Bus, Login};
use canopy_config::credentials::read_login;
use canopy_config::{Config, ConnectionInfo, DataDir, read_connection_info};
use canopy_proto::Subjects;
use canopy_proto::{ApiMethod, Party};

/// A connected operator client.
pub struct Client {
    pub api: ApiClient,
    token: String,
}

/// Reads `daemon.json`, saying how to start a daemon when there is none.
pub fn connection_info(dir: &DataDir) -> Result<ConnectionInfo, CallError> {
    read_connection_info(dir).map_err(|e| {
        CallError::Unreachable(format!(
            "no running daemon for {} ({}: {e}); start one with `canopy daemon --dir {}`",
            dir.root().display(),
            dir.daemon_json().display(),
            dir.root().display()
        ))
    })
}

/// Connects to the daemon's NATS (from `daemon.json`) as an operator client.
pub async fn api_client(dir: &DataDir) -> Result<ApiClient, CallError> {
    let info = connection_info(dir)?;
    let subjects = Subjects::new(&info.workspace_id);
    let login_file = dir.operator_login();
    let login = Login::reading(move || read_login(&login_file), Some(subjects.inbox(Party::Operator)));
    connect(dir, &info.nats_url, subjects, &login, "canopy-cli").await
}

/// Connects to `url` with `login`, for the workspace `subjects` belong to.
pub async fn connect(
    dir: &DataDir,
    url: &str,
    subjects: Subjects,
    login: &Login,
    name: &str,
) -> Result<ApiClient, CallError> {
    let timeout = Config::load(&dir.config())
        .map(|c| c.daemon.request_timeout)
        .unwrap_or_else(|_| Config::default().daemon.request_timeout);
    let bus = Bus::connect(url, login, name, false).await.map_err(|e| CallError::Unreachable(e.to_string()))?;
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
        let api = api_client(dir).await?;
        Ok(Client { api, token: read_token(&dir.operator_token())? })
    }

    /// Calls one API method as the operator.
    pub async fn send<M: ApiMethod>(&self, request: &M::Request) -> Result<M::Response, CallError> {
        self.api.send::<M>(&self.token, request).await
    }
}
