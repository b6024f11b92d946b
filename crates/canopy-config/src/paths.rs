//! The layout of a data directory (`./.canopy` by default).
//!
//! Owns every file name in it, so the daemon, `init`, the runner and the CLI agree.

use std::path::{Path, PathBuf};

/// The SQLite database's file name in the data directory.
pub const DB_FILE: &str = "canopy.db";

/// A workspace's data directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    pub fn new(root: impl Into<PathBuf>) -> DataDir {
        DataDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The SQLite database, the system of record.
    pub fn db(&self) -> PathBuf {
        self.root.join(DB_FILE)
    }

    /// `canopy.toml`, read by the daemon at start.
    pub fn config(&self) -> PathBuf {
        self.root.join("canopy.toml")
    }

    /// The operator's bearer token (mode 0600).
    pub fn operator_token(&self) -> PathBuf {
        self.root.join("operator.token")
    }

    /// NATS logins and runner credentials (mode 0700; see `credentials`).
    pub fn credentials(&self) -> PathBuf {
        self.root.join("credentials")
    }

    /// The daemon's secret for deriving session tokens (mode 0600).
    pub fn session_secret(&self) -> PathBuf {
        self.root.join("session.secret")
    }

    /// Session directories: `<sessions>/<agent>/<incarnation>/` (prompt, script,
    /// transcript, HOME) and `<sessions>/<agent>/work` (the working directory).
    pub fn sessions(&self) -> PathBuf {
        self.root.join("sessions")
    }

    /// Connection details for the CLI, written by a running daemon (mode 0600).
    pub fn daemon_json(&self) -> PathBuf {
        self.root.join("daemon.json")
    }

    /// Held (flock) by the running daemon so two cannot share a directory.
    pub fn lock(&self) -> PathBuf {
        self.root.join("daemon.lock")
    }

    /// The managed nats-server's config, log, pid and ports files.
    pub fn nats_dir(&self) -> PathBuf {
        self.root.join("nats")
    }

    /// The console's files: `port` (kept across restarts) and `sessions.json` (browser
    /// sessions, 0600, so a restart does not log the operator out).
    pub fn web_dir(&self) -> PathBuf {
        self.root.join("web")
    }
}

/// A path from configuration: absolute, or relative to the project (the data directory's
/// parent, where `canopy` was set up).
pub fn relative_to_project(data_dir: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        return path.to_owned();
    }
    let data_dir = data_dir.canonicalize().unwrap_or_else(|_| data_dir.to_owned());
    data_dir.parent().unwrap_or(&data_dir).join(path)
}
