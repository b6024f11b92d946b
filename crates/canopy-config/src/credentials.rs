//! The workspace's credentials on disk: one NATS login per party (the daemon, the operators'
//! clients, each runner) and each runner's API token, under `credentials/` (0700, every file
//! 0600, never inside what a session's sandbox binds).
//!
//! Owns the files' names and shapes. Does not generate secrets or decide what a login may do:
//! the daemon generates and rotates them, `canopy_proto::access` says what each may publish
//! and subscribe, and the bus hands a login to NATS.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::DataDir;

/// The id of the runner that runs inside the daemon's process.
pub const EMBEDDED_RUNNER: &str = "embedded";

/// A NATS user and its password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsLogin {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for NatsLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsLogin").field("user", &self.user).finish_non_exhaustive()
    }
}

/// Everything one runner needs to join a workspace, as one file it can carry to another
/// machine: which workspace, its id, its NATS login and its API token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerCredential {
    pub workspace_id: String,
    pub runner_id: String,
    pub nats: NatsLogin,
    /// The bearer token of its API calls (`cnr_...`); the daemon keeps only its hash.
    pub token: String,
}

impl std::fmt::Debug for RunnerCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerCredential")
            .field("workspace_id", &self.workspace_id)
            .field("runner_id", &self.runner_id)
            .field("nats", &self.nats)
            .finish_non_exhaustive()
    }
}

/// Where each credential lives.
impl DataDir {
    /// The daemon's NATS login.
    pub fn daemon_login(&self) -> PathBuf {
        self.credentials().join("nats-daemon.json")
    }

    /// The NATS login of operator clients (the CLI, the console).
    pub fn operator_login(&self) -> PathBuf {
        self.credentials().join("nats-operator.json")
    }

    /// The runner credentials, one file each.
    pub fn runner_credentials(&self) -> PathBuf {
        self.credentials().join("runners")
    }

    /// One runner's credential.
    pub fn runner_credential(&self, id: &str) -> PathBuf {
        self.runner_credentials().join(format!("{id}.json"))
    }
}

/// Why a credential file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a Canopy credential file: {reason}")]
    Malformed { path: PathBuf, reason: String },
}

/// A credential file's text (`NatsLogin` or `RunnerCredential`): what `read` reads back.
/// The caller writes it owner-only.
pub fn to_text<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default() + "\n"
}

/// Reads a JSON credential file (`NatsLogin` or `RunnerCredential`).
pub fn read<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, CredentialError> {
    let text = std::fs::read_to_string(path).map_err(|source| CredentialError::Io { path: path.to_owned(), source })?;
    serde_json::from_str(&text).map_err(|e| CredentialError::Malformed { path: path.to_owned(), reason: e.to_string() })
}

/// The NATS user and password in a login file or a runner's credential file, as
/// `canopy_bus::Login` reads them at every connect.
pub fn read_login(path: &Path) -> std::io::Result<(String, String)> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Login(NatsLogin),
        Runner(RunnerCredential),
    }
    let text = std::fs::read_to_string(path)?;
    let login = match serde_json::from_str::<Either>(&text) {
        Ok(Either::Login(login)) => login,
        Ok(Either::Runner(runner)) => runner.nats,
        Err(e) => {
            let reason = format!("{} is not a NATS login or runner credential: {e}", path.display());
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, reason));
        }
    };
    Ok((login.user, login.password))
}

/// Every runner credential in the data directory, by id.
pub fn runners(dir: &DataDir) -> Result<Vec<RunnerCredential>, CredentialError> {
    let root = dir.runner_credentials();
    let entries = match std::fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(CredentialError::Io { path: root, source }),
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "json") {
            out.push(read::<RunnerCredential>(&path)?);
        }
    }
    out.sort_by(|a, b| a.runner_id.cmp(&b.runner_id));
    Ok(out)
}
