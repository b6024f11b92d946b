//! `[notify] command`: the operator's own command, run when something starts waiting for the
//! operator (a spawn request, a merge request once checked or refused, an agent that began
//! failing or crashed), and once more for an item still waiting after `[notify] remind_after`.
//! The item goes as one JSON object on its stdin with `console_url`, the console page of the
//! decision. Runs `sh -c` as the daemon's user, outside any sandbox (it is the operator's
//! configuration, not an agent's), detached from what caused it, and killed after `[notify]
//! timeout`. Its failure is logged and changes nothing else. Does not decide what waits: the
//! gate, the merge gate, sessions and the reminder timer (`remind`) call it.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, OnceLock};

use canopy_config::Config;
use canopy_core::{MergeRequest, RosterEntry, SpawnRequest};
use canopy_store::{Store, Waiting, ops};
use serde::Serialize;
use tokio::io::AsyncWriteExt;

/// What the command reads on stdin.
#[derive(Serialize)]
struct Notice<'a> {
    /// `spawn_request`, `merge_request`, `merge_refused` or `agent_failing`.
    kind: &'a str,
    /// The spawn or merge request, as the API returns it.
    #[serde(skip_serializing_if = "Option::is_none")]
    request: Option<serde_json::Value>,
    /// The failing agent's roster entry.
    #[serde(skip_serializing_if = "Option::is_none")]
    agent: Option<&'a RosterEntry>,
    /// The console page of the item; absent when the daemon serves no console.
    #[serde(skip_serializing_if = "Option::is_none")]
    console_url: Option<String>,
    /// A second notice for an item still waiting after `[notify] remind_after`.
    reminder: bool,
}

/// Runs `[notify] command` for items that start (or keep) waiting for the operator.
#[derive(Clone)]
pub struct Notifier {
    config: Arc<Config>,
    /// The command's working directory (the data directory).
    dir: PathBuf,
    /// The console's base URL (`[web] public_url`, else where it listens), once it serves.
    console: Arc<OnceLock<String>>,
    /// Where reminders are found and recorded.
    store: Store,
}

impl Notifier {
    pub fn new(config: Arc<Config>, dir: PathBuf, store: Store) -> Self {
        Notifier { config, dir, console: Arc::default(), store }
    }

    /// Records where the console listens (`url`), once it does; `[web] public_url` wins.
    pub fn console_at(&self, url: &str) {
        let public = self.config.web.public_url.trim_end_matches('/');
        let base = if public.is_empty() { url.trim_end_matches('/') } else { public };
        if self.console.set(base.to_owned()).is_err() {
            tracing::debug!("the console's address was already recorded");
        }
    }

    fn url(&self, path: &str) -> Option<String> {
        self.console.get().map(|base| format!("{base}{path}"))
    }

    /// A spawn request waits for the operator (its Waiting entry).
    pub fn spawn(&self, request: &SpawnRequest, reminder: bool) {
        let console_url = self.url(&format!("/#spawn-{}", request.id));
        let request = serde_json::to_value(request).ok();
        self.run(&Notice { kind: "spawn_request", request, agent: None, console_url, reminder });
    }

    /// A merge request waits for the operator (`merge_request`), or was refused on landing
    /// (`merge_refused`).
    pub fn merge(&self, kind: &str, request: &MergeRequest, reminder: bool) {
        // A refused merge is no longer on Waiting: its requester's page says what happened.
        let console_url = match kind {
            "merge_refused" => self.url(&format!("/agents/{}", request.requester)),
            _ => self.url(&format!("/#merge-{}", request.id)),
        };
        let request = serde_json::to_value(request).ok();
        self.run(&Notice { kind, request, agent: None, console_url, reminder });
    }

    /// An agent began failing or crashed (its page).
    pub fn failing(&self, agent: &RosterEntry, reminder: bool) {
        let console_url = self.url(&format!("/agents/{}", agent.handle));
        self.run(&Notice { kind: "agent_failing", request: None, agent: Some(agent), console_url, reminder });
    }

    /// Starts the notify command with `notice`, if one is configured; returns at once.
    fn run(&self, notice: &Notice<'_>) {
        let command = self.config.notify.command.trim().to_owned();
        if command.is_empty() {
            return;
        }
        let kind = notice.kind;
        let mut input = match serde_json::to_vec(notice) {
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

    /// Notifies once more of every item that has waited past `[notify] remind_after`; the store
    /// records each, so none is reminded of twice.
    pub async fn remind(&self) {
        if self.config.notify.command.trim().is_empty() {
            return;
        }
        let older_than = i64::try_from(self.config.notify.remind_after.as_millis()).unwrap_or(i64::MAX);
        let due = match self.store.write(move |conn| ops::due_reminders(conn, older_than)).await {
            Ok(due) => due,
            Err(e) => return tracing::warn!(error = %e, "finding what to remind the operator of failed"),
        };
        for item in &due {
            match item {
                Waiting::Spawn(request) => self.spawn(request, true),
                Waiting::Merge(request) => self.merge("merge_request", request, true),
                Waiting::Agent(agent) => self.failing(agent, true),
            }
        }
    }
}
