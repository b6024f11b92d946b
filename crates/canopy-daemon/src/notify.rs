//! `[notify] command`: the operator's own command, run when a request starts waiting for the
//! operator (a spawn request, a merge request once checked), with the request as one JSON
//! object on its stdin. Runs `sh -c` as the daemon's user, outside any sandbox (it is the
//! operator's configuration, not an agent's), detached from the request that caused it, and
//! killed after `[notify] timeout`. Its failure is logged and changes nothing else. Does not
//! decide what waits: the gate and the merge gate call it.

use std::process::Stdio;

use serde::Serialize;
use tokio::io::AsyncWriteExt;

use std::path::PathBuf;
use std::sync::Arc;

use canopy_config::Config;

/// What the command reads on stdin.
#[derive(Serialize)]
struct Notice<'a, T: Serialize> {
    /// `spawn_request` or `merge_request`.
    kind: &'a str,
    request: &'a T,
}

/// Runs `[notify] command` for requests that start waiting for the operator.
#[derive(Clone)]
pub struct Notifier {
    config: Arc<Config>,
    /// The command's working directory (the data directory).
    dir: PathBuf,
}

impl Notifier {
    pub fn new(config: Arc<Config>, dir: PathBuf) -> Self {
        Notifier { config, dir }
    }

    /// Starts the notify command for `request`, if one is configured; returns at once.
    pub fn notify<T: Serialize>(&self, kind: &str, request: &T) {
        let command = self.config.notify.command.trim().to_owned();
        if command.is_empty() {
            return;
        }
        let mut input = match serde_json::to_vec(&Notice { kind, request }) {
            Ok(input) => input,
            Err(e) => {
                tracing::warn!(error = %e, kind, "the [notify] command's input did not encode; it is not run");
                return;
            }
        };
        input.push(b'\n');
        let timeout = self.config.notify.timeout;
        let dir = self.dir.clone();
        tokio::spawn(async move {
            let mut child = match tokio::process::Command::new("sh")
                .arg("-c")
                .arg(&command)
                .current_dir(&dir)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
            {
                Ok(child) => child,
                Err(e) => {
                    tracing::warn!(error = %e, %command, "the [notify] command did not start");
                    return;
                }
            };
            if let Some(mut stdin) = child.stdin.take() {
                // A command that does not read its stdin is fine: a closed pipe is not its failure.
                if let Err(e) = stdin.write_all(&input).await {
                    tracing::debug!(error = %e, %command, "the [notify] command did not read its input");
                }
            }
            match tokio::time::timeout(timeout, child.wait()).await {
                Ok(Ok(status)) if status.success() => {}
                Ok(Ok(status)) => tracing::warn!(%status, %command, "the [notify] command failed"),
                Ok(Err(e)) => tracing::warn!(error = %e, %command, "waiting for the [notify] command failed"),
                Err(_) => {
                    if let Err(e) = child.kill().await {
                        tracing::warn!(error = %e, %command, "killing the [notify] command failed");
                    }
                    tracing::warn!(?timeout, %command, "the [notify] command ran past [notify] timeout and was killed");
                }
            }
        });
    }
}
