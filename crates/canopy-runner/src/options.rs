//! How a runner is run: its options and settings (from `canopy.toml`, through `wiring`), the
//! API token its parts share, and how long its own calls to the daemon may take.
//!
//! Owns only these values; both the runner actor and every session task read them. Does not
//! start anything and does not call the daemon.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use canopy_bus::ApiClient;
use canopy_core::RunnerId;
use canopy_harness::{HarnessKind, HarnessSettings, SandboxSettings};

/// The longest a runner waits for the daemon's answer to a call of its own (sync, pull,
/// acknowledgement, reports), never more than `[daemon] request_timeout`. The daemon answers
/// these in milliseconds; a reply lost with a NATS server or a daemon that died is noticed
/// after this and the call is retried, instead of holding deliveries for the full request
/// timeout. Tool calls keep the request timeout: a merge's check may take long.
pub(crate) const LIVE_CALL: Duration = Duration::from_secs(2);

/// Knobs from `canopy.toml` `[runner]`.
#[derive(Debug, Clone)]
pub struct RunnerSettings {
    pub sync_interval: Duration,
    pub capacity: u32,
    pub restart_backoff_min: Duration,
    pub restart_backoff_max: Duration,
    pub crash_loop_count: u32,
    pub crash_loop_window: Duration,
    pub ready_timeout: Duration,
    pub stop_grace: Duration,
    pub max_line_bytes: usize,
    pub report_queue: usize,
    /// Turn-start delivery: wake an idle agent after this quiet time...
    pub quiet_window: Duration,
    /// ...or this long after the first doorbell, whichever comes first.
    pub coalesce_cap: Duration,
    /// Most messages injected at one turn start.
    pub delivery_batch: u32,
    /// How often an idle session looks for pending messages without a doorbell.
    pub delivery_resync: Duration,
    /// What this runner offers placement (`[runner] labels`).
    pub labels: Vec<String>,
}

/// How to run a runner.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    pub api: ApiClient,
    /// Its id: its credential's (the NATS login may use only this runner's subjects).
    pub id: RunnerId,
    /// Its credential's API token (the runner methods need it; it names this runner).
    pub token: RunnerToken,
    /// A human name for the roster (`host-pid`).
    pub name: String,
    /// Where session directories go: `<dir>/<agent>/<incarnation>/`, and `<dir>/<agent>/work`.
    pub sessions_dir: PathBuf,
    /// The program that runs the scripted harness, and its leading arguments.
    pub scripted_program: PathBuf,
    pub scripted_args: Vec<String>,
    /// How to run each real harness here (`[harness.<name>]`): program, model, env.
    pub harnesses: HashMap<HarnessKind, HarnessSettings>,
    /// How every session is confined (`[sandbox]`).
    pub sandbox: SandboxSettings,
    pub settings: RunnerSettings,
    /// The checkouts this runner keeps on its own disk (unused by the embedded runner, which
    /// is handed the daemon's).
    pub checkouts: crate::checkouts::Checkouts,
}

/// The runner's API token cannot be read: a thread panicked while replacing it, so the
/// value behind the lock may be torn. No call is made with a guessed (or empty) token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the runner's API token cannot be read: a thread panicked while replacing it")]
pub struct TokenUnreadable;

/// The runner's API token, shared by its parts. Read from its credential file again before
/// every sync, so a rotation (`canopy credentials rotate` rewrites the file) reaches a
/// running runner without a restart.
#[derive(Clone)]
pub struct RunnerToken {
    /// Written only by `refresh`, read before every call to the daemon.
    current: Arc<RwLock<String>>,
    file: Option<PathBuf>,
}

impl std::fmt::Debug for RunnerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerToken").field("file", &self.file).finish_non_exhaustive()
    }
}

impl RunnerToken {
    /// A token that never changes (tests).
    pub fn fixed(token: &str) -> RunnerToken {
        RunnerToken { current: Arc::new(RwLock::new(token.to_owned())), file: None }
    }

    /// `token`, as read from the credential `file`.
    pub fn from_file(token: &str, file: PathBuf) -> RunnerToken {
        RunnerToken { current: Arc::new(RwLock::new(token.to_owned())), file: Some(file) }
    }

    /// The token to call the daemon with now; an error (never an empty token) when its lock
    /// was poisoned.
    pub fn get(&self) -> Result<String, TokenUnreadable> {
        self.current.read().map(|t| t.clone()).map_err(|_| TokenUnreadable)
    }

    /// Takes the token the credential file holds now, if it changed.
    pub(crate) fn refresh(&self) {
        let Some(file) = &self.file else { return };
        match canopy_config::credentials::read::<canopy_config::RunnerCredential>(file) {
            Ok(credential) => match self.current.write() {
                Ok(mut current) if *current != credential.token => {
                    tracing::info!(file = %file.display(), "the runner's credential changed; using the new token");
                    *current = credential.token;
                }
                Ok(_) => {}
                Err(_) => tracing::error!(file = %file.display(), "{TokenUnreadable}; the new token is not taken"),
            },
            Err(e) => tracing::warn!(error = %e, "re-reading the runner's credential failed; keeping the token"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    #[test]
    fn a_token_reads_back() {
        assert_eq!(RunnerToken::fixed("cnr_x").get(), Ok("cnr_x".to_owned()));
    }

    #[test]
    fn a_poisoned_token_lock_is_an_error_not_an_empty_token() {
        let token = RunnerToken::fixed("cnr_x");
        let poisoner = token.clone();
        let panicked = std::thread::spawn(move || {
            let _guard = poisoner.current.write().unwrap();
            panic!("a writer panics while holding the token");
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(token.get(), Err(TokenUnreadable));
    }
}
