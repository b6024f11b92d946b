//! The CLI's connection to a running daemon: `daemon.json`, the operator token, NATS.

pub use canopy_bus::CallError;
use canopy_bus::{ApiClient, Bus};
use canopy_config::{Config, ConnectionInfo, DataDir, read_connection_info};
use canopy_proto::ApiMethod;
use canopy_proto::Subjects;

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

/// Connects to the daemon's NATS (`url` overrides the one in `daemon.json`).
pub async fn api_client(dir: &DataDir, url: Option<&str>) -> Result<ApiClient, CallError> {
    let info = connection_info(dir)?;
    let timeout = Config::load(&dir.config())
        .map(|c| c.daemon.request_timeout)
        .unwrap_or_else(|_| Config::default().daemon.request_timeout);
    let url = url.unwrap_or(&info.nats_url);
    let token = if url == info.nats_url { info.nats_token.as_deref() } else { None };
    let bus = Bus::connect(url, token, "canopy-cli", false).await.map_err(|e| CallError::Unreachable(e.to_string()))?;
    Ok(ApiClient::new(bus, Subjects::new(&info.workspace_id), timeout))
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
        let api = api_client(dir, None).await?;
        Ok(Client { api, token: read_token(&dir.operator_token())? })
    }

    /// Calls one API method as the operator.
    pub async fn send<M: ApiMethod>(&self, request: &M::Request) -> Result<M::Response, CallError> {
        self.api.send::<M>(&self.token, request).await
    }
}
