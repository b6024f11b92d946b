//! The CLI's connection to a running daemon: `daemon.json`, the operator token, NATS.

use std::time::Duration;

use bytes::Bytes;
use canopy_bus::{Bus, BusError};
use canopy_daemon::{Config, DataDir, read_connection_info};
use canopy_proto::{Method, Reply, Subjects, WireError};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why a call did not produce a response.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The daemon answered with a refusal.
    #[error("{0}")]
    Refused(WireError),
    /// The daemon could not be reached.
    #[error("{0}")]
    Unreachable(String),
}

impl From<BusError> for CallError {
    fn from(e: BusError) -> CallError {
        CallError::Unreachable(e.to_string())
    }
}

/// A connected operator client.
pub struct Client {
    pub bus: Bus,
    pub subjects: Subjects,
    token: String,
    timeout: Duration,
}

impl Client {
    pub async fn connect(dir: &DataDir) -> Result<Client, CallError> {
        let info = read_connection_info(dir).map_err(|e| {
            CallError::Unreachable(format!(
                "no running daemon for {} ({}: {e}); start one with `canopy daemon --dir {}`",
                dir.root().display(),
                dir.daemon_json().display(),
                dir.root().display()
            ))
        })?;
        let token = std::fs::read_to_string(dir.operator_token())
            .map_err(|e| CallError::Unreachable(format!("reading {}: {e}", dir.operator_token().display())))?
            .trim()
            .to_owned();
        let timeout = Config::load(&dir.config()).map(|c| c.daemon.request_timeout).unwrap_or(Duration::from_secs(10));
        let bus = Bus::connect(&info.nats_url, info.nats_token.as_deref(), "canopy-cli", false).await?;
        Ok(Client { bus, subjects: Subjects::new(&info.workspace_id), token, timeout })
    }

    /// Calls one API method.
    pub async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: Method,
        request: &Req,
    ) -> Result<Resp, CallError> {
        let payload =
            serde_json::to_vec(request).map_err(|e| CallError::Unreachable(format!("encoding the request: {e}")))?;
        let subject = self.subjects.api(method);
        let reply = self.bus.request(&subject, Some(&self.token), Bytes::from(payload), self.timeout).await?;
        let reply: Reply<Resp> = serde_json::from_slice(&reply).map_err(|e| {
            CallError::Unreachable(format!("the daemon's reply to {} did not parse: {e}", method.as_str()))
        })?;
        reply.into_result().map_err(CallError::Refused)
    }
}
