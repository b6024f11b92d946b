//! `daemon.json`: what a running daemon writes (mode 0600) so the CLI and standalone runners
//! can reach it. Owns the file's shape; the daemon writes it, clients read it.

use serde::{Deserialize, Serialize};

use crate::DataDir;

/// What a running daemon writes to `daemon.json` for the CLI.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionInfo {
    pub workspace_id: String,
    pub nats_url: String,
    pub pid: u32,
    pub version: String,
    /// The operator console's address (`http://127.0.0.1:<port>`), when `[web]` is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_url: Option<String>,
    /// Where the daemon serves its mirrors to runners over git (`[daemon] git_url`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub git_url: String,
}

/// Reads `daemon.json` from the data directory.
pub fn read_connection_info(dir: &DataDir) -> std::io::Result<ConnectionInfo> {
    let text = std::fs::read_to_string(dir.daemon_json())?;
    serde_json::from_str(&text).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}
