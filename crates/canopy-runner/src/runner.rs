//! The runner actor: sync with the daemon, start and stop session tasks, restart policy.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use canopy_bus::{ApiClient, CallError};
use canopy_core::{Incarnation, RunnerId};
use canopy_harness::{HarnessKind, HarnessSettings, SandboxSettings};
use canopy_proto::api::{
    DeliverDoorbell, InterruptReply, InterruptRequest, ReportedActivity, RunnersSyncRequest, RunnersSyncResponse,
    RunningSession, SessionReport, SteerReply, SteerRequest,
};
use canopy_proto::method;
use canopy_tools::http::{HttpEndpoint, TokenCheck};
use canopy_tools::{CanopyTools, TokenSource};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::session::{self, SessionCommand, SessionExit, SessionSlot};

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
}

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("starting the MCP endpoint: {0}")]
    Endpoint(std::io::Error),
    #[error("subscribing to runner doorbells: {0}")]
    Subscribe(String),
}

/// A running runner. `shutdown` stops every session gracefully.
#[derive(Debug)]
pub struct RunnerHandle {
    pub id: RunnerId,
    pub mcp_url: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl RunnerHandle {
    /// Stops every session (shutdown, grace, SIGTERM, grace, SIGKILL) and the runner.
    pub async fn shutdown(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// The runner's API token, shared by its parts. Read from its credential file again before
/// every sync, so a rotation (`canopy credentials rotate` rewrites the file) reaches a
/// running runner without a restart.
#[derive(Clone)]
pub struct RunnerToken {
    current: Arc<RwLock<String>>,
    file: Option<std::path::PathBuf>,
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
    pub fn from_file(token: &str, file: std::path::PathBuf) -> RunnerToken {
        RunnerToken { current: Arc::new(RwLock::new(token.to_owned())), file: Some(file) }
    }

    pub fn get(&self) -> String {
        self.current.read().map(|t| t.clone()).unwrap_or_default()
    }

    /// Takes the token the credential file holds now, if it changed.
    fn refresh(&self) {
        let Some(file) = &self.file else { return };
        match canopy_config::credentials::read::<canopy_config::RunnerCredential>(file) {
            Ok(credential) => {
                if let Ok(mut current) = self.current.write()
                    && *current != credential.token
                {
                    tracing::info!(file = %file.display(), "the runner's credential changed; using the new token");
                    *current = credential.token;
                }
            }
            Err(e) => tracing::warn!(error = %e, "re-reading the runner's credential failed; keeping the token"),
        }
    }
}

/// Starts a runner: its MCP endpoint, its reporter, and its sync loop.
pub async fn spawn(options: RunnerOptions) -> Result<RunnerHandle, RunnerError> {
    let id = options.id.clone();
    // Which process of this runner this is: a new one ends what an earlier one left live.
    let boot = format!("{}-{:x}", std::process::id(), random_suffix());
    let tokens: Arc<RwLock<HashMap<String, String>>> = Arc::new(RwLock::new(HashMap::new()));
    let check_tokens = tokens.clone();
    let check: TokenCheck = Arc::new(move |token| check_tokens.read().is_ok_and(|t| t.contains_key(token)));
    let tools = CanopyTools::new(options.api.clone(), TokenSource::Header);
    let endpoint = canopy_tools::http::serve(tools, check).await.map_err(RunnerError::Endpoint)?;
    let subscribe = |subject: String| {
        let bus = options.api.bus.clone();
        async move { bus.subscribe(&subject).await.map_err(|e| RunnerError::Subscribe(e.to_string())) }
    };
    let pokes = subscribe(options.api.subjects.runner_poke()).await?;
    let doorbells = subscribe(options.api.subjects.runner_deliver(&id)).await?;
    let steers = options
        .api
        .bus
        .serve(&options.api.subjects.runner_steer(&id), id.as_str())
        .await
        .map_err(|e| RunnerError::Subscribe(e.to_string()))?;
    let interrupts = options
        .api
        .bus
        .serve(&options.api.subjects.runner_interrupt(&id), id.as_str())
        .await
        .map_err(|e| RunnerError::Subscribe(e.to_string()))?;
    let (reports, reporter) = crate::reporter::spawn(
        options.api.with_timeout(crate::LIVE_CALL),
        options.token.clone(),
        id.clone(),
        options.settings.report_queue,
    );
    let stop = CancellationToken::new();
    let mcp_url = endpoint.url.clone();
    let actor = RunnerActor {
        id: id.clone(),
        options,
        endpoint,
        tokens,
        reports,
        sessions: HashMap::new(),
        stopping: HashMap::new(),
        crashes: HashMap::new(),
        not_before: HashMap::new(),
        stop: stop.clone(),
        resync_now: false,
        registered: false,
        boot,
    };
    let task = tokio::spawn(async move {
        actor.run(pokes, doorbells, steers, interrupts).await;
        let _ = reporter.await;
    });
    tracing::info!(runner = %id, mcp = %mcp_url, "runner started");
    Ok(RunnerHandle { id, mcp_url, stop, task })
}

fn random_suffix() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    (nanos as u64) ^ (u64::from(std::process::id()) << 32)
}

struct RunnerActor {
    id: RunnerId,
    options: RunnerOptions,
    endpoint: HttpEndpoint,
    /// token -> agent, for the MCP endpoint's admission check.
    tokens: Arc<RwLock<HashMap<String, String>>>,
    reports: mpsc::Sender<SessionReport>,
    /// agent -> its running session.
    sessions: HashMap<String, SessionSlot>,
    /// agent -> a session asked to stop and not yet gone. The agent's next session waits for
    /// it, so two harness processes never share the agent's conversation state on disk.
    stopping: HashMap<String, tokio::task::JoinHandle<()>>,
    /// agent -> recent crash times, for the crash-loop rule.
    crashes: HashMap<String, VecDeque<Instant>>,
    /// agent -> earliest restart time (backoff after a crash).
    not_before: HashMap<String, Instant>,
    stop: CancellationToken,
    /// This process's boot, sent with every sync.
    boot: String,
    /// Set when the last sync said more sessions wait to be started.
    resync_now: bool,
    /// Whether a sync has succeeded yet (the daemon knows this runner).
    registered: bool,
}

impl RunnerActor {
    async fn run(
        mut self,
        mut pokes: impl futures_util::Stream<Item = canopy_bus::Received> + Unpin,
        mut doorbells: impl futures_util::Stream<Item = canopy_bus::Received> + Unpin,
        mut steers: impl futures_util::Stream<Item = canopy_bus::Incoming> + Unpin,
        mut interrupts: impl futures_util::Stream<Item = canopy_bus::Incoming> + Unpin,
    ) {
        let (exits_tx, mut exits) = mpsc::channel::<SessionExit>(64);
        let mut tick = tokio::time::interval(self.options.settings.sync_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.stop.cancelled() => break,
                _ = tick.tick() => self.sync(&exits_tx).await,
                () = std::future::ready(()), if self.resync_now => {
                    self.resync_now = false;
                    self.sync(&exits_tx).await;
                }
                Some(_) = pokes.next() => self.sync(&exits_tx).await,
                Some(doorbell) = doorbells.next() => self.ring(&doorbell.payload),
                Some(request) = steers.next() => self.steer(request),
                Some(request) = interrupts.next() => self.interrupt(request),
                Some(exit) = exits.recv() => {
                    self.on_exit(exit).await;
                    self.sync(&exits_tx).await;
                }
            }
        }
        self.stop_all().await;
        self.endpoint.stop();
        tracing::info!(runner = %self.id, "runner stopped");
    }

    async fn sync(&mut self, exits: &mpsc::Sender<SessionExit>) {
        self.options.token.refresh();
        let running = self
            .sessions
            .iter()
            .map(|(agent, slot)| RunningSession { agent: agent.clone(), incarnation: slot.incarnation })
            .collect();
        let api = self.options.api.with_timeout(crate::LIVE_CALL);
        let request = RunnersSyncRequest {
            runner_id: self.id.clone(),
            boot: self.boot.clone(),
            name: self.options.name.clone(),
            mcp_url: self.endpoint.url.clone(),
            capacity: self.options.settings.capacity,
            running,
        };
        let assigned: RunnersSyncResponse =
            match api.send::<method::RunnersSync>(&self.options.token.get(), &request).await {
                Ok(response) => response,
                Err(CallError::Refused(e)) => {
                    tracing::error!(error = %e, "the daemon refused this runner's sync");
                    return;
                }
                Err(CallError::Unreachable(reason)) => {
                    tracing::debug!(%reason, "sync failed; sessions keep running");
                    return;
                }
            };
        if !self.registered {
            self.registered = true;
            tracing::info!(runner = %self.id, "registered with the daemon");
        }
        let wanted: HashMap<&str, Incarnation> = assigned
            .keep
            .iter()
            .map(|k| (k.agent.as_str(), k.incarnation))
            .chain(assigned.start.iter().map(|a| (a.agent.as_str(), a.incarnation)))
            .collect();
        let unwanted: Vec<String> = self
            .sessions
            .iter()
            .filter(|(agent, slot)| wanted.get(agent.as_str()) != Some(&slot.incarnation))
            .map(|(agent, _)| agent.clone())
            .collect();
        self.stopping.retain(|_, task| !task.is_finished());
        for agent in unwanted {
            if let Some(slot) = self.sessions.remove(&agent) {
                tracing::info!(%agent, incarnation = %slot.incarnation, "stopping a session the daemon no longer assigns");
                self.forget_token(&slot.token);
                self.stopping.insert(agent, tokio::spawn(slot.join()));
            }
        }
        let now = Instant::now();
        if assigned.more {
            // More sessions wait; the next tick comes at once.
            self.resync_now = true;
        }
        for assignment in assigned.start {
            if self.sessions.contains_key(&assignment.agent) {
                continue;
            }
            if self.not_before.get(&assignment.agent).is_some_and(|t| *t > now) {
                continue; // Backing off after a crash; a later sync starts it.
            }
            if let Ok(mut tokens) = self.tokens.write() {
                tokens.insert(assignment.token.clone(), assignment.agent.clone());
            }
            let previous = self.stopping.remove(&assignment.agent);
            let slot = session::spawn(session::SessionContext {
                previous,
                assignment,
                options: self.options.clone(),
                runner_id: self.id.clone(),
                mcp_url: self.endpoint.url.clone(),
                reports: self.reports.clone(),
                exits: exits.clone(),
            });
            self.sessions.insert(slot.agent.clone(), slot);
        }
    }

    async fn on_exit(&mut self, exit: SessionExit) {
        let current = self.sessions.get(&exit.agent).is_some_and(|s| s.incarnation == exit.incarnation);
        if current && let Some(slot) = self.sessions.remove(&exit.agent) {
            self.forget_token(&slot.token);
        }
        if exit.requested {
            return; // Stopped on purpose; the session already reported its end.
        }
        if exit.fatal {
            // Retrying cannot help (the session cannot be confined here): the agent stops at
            // once, and the operator is told why in its home channel.
            self.crashes.remove(&exit.agent);
            tracing::error!(agent = %exit.agent, incarnation = %exit.incarnation, reason = %exit.reason, "session cannot start");
            let report = SessionReport {
                agent: exit.agent.clone(),
                incarnation: exit.incarnation,
                presence: Some(canopy_core::Presence::Crashed),
                reason: Some(exit.reason.clone()),
                activity: Some(ReportedActivity {
                    kind: "session_failed".into(),
                    turn_id: None,
                    summary: exit.reason.clone(),
                    detail: serde_json::Value::Null,
                }),
                ended: true,
                crash_loop: true,
                fatal: true,
                usage: None,
            };
            let _ = self.reports.send(report).await;
            return;
        }
        let settings = &self.options.settings;
        let now = Instant::now();
        let history = self.crashes.entry(exit.agent.clone()).or_default();
        history.push_back(now);
        while history.front().is_some_and(|t| now.duration_since(*t) > settings.crash_loop_window) {
            history.pop_front();
        }
        let crashes = history.len() as u32;
        let crash_loop = crashes >= settings.crash_loop_count;
        let backoff = settings.restart_backoff_min.saturating_mul(1 << (crashes.saturating_sub(1)).min(16));
        let backoff = backoff.min(settings.restart_backoff_max);
        let reason = if crash_loop {
            format!("{crashes} crashes within {:?}; last: {}", settings.crash_loop_window, exit.reason)
        } else {
            format!("{}; restarting in {backoff:?}", exit.reason)
        };
        tracing::warn!(agent = %exit.agent, incarnation = %exit.incarnation, %reason, "session crashed");
        if crash_loop {
            self.crashes.remove(&exit.agent);
        } else {
            self.not_before.insert(exit.agent.clone(), now + backoff);
        }
        let report = SessionReport {
            agent: exit.agent.clone(),
            incarnation: exit.incarnation,
            presence: Some(if crash_loop { canopy_core::Presence::Crashed } else { canopy_core::Presence::Starting }),
            reason: Some(reason.clone()),
            activity: Some(ReportedActivity {
                kind: if crash_loop { "crash_loop" } else { "session_crashed" }.into(),
                turn_id: None,
                summary: reason,
                detail: serde_json::Value::Null,
            }),
            ended: true,
            crash_loop,
            fatal: false,
            usage: None,
        };
        let _ = self.reports.send(report).await;
    }

    /// Passes a delivery doorbell to the sessions it names.
    fn ring(&self, payload: &[u8]) {
        let Ok(doorbell) = serde_json::from_slice::<DeliverDoorbell>(payload) else {
            tracing::warn!("an unreadable delivery doorbell");
            return;
        };
        for agent in doorbell.agents {
            if let Some(slot) = self.sessions.get(&agent)
                && slot.commands.try_send(SessionCommand::Hint).is_err()
            {
                // The session's queue is full of hints already; its next delivery pulls anyway.
                tracing::debug!(%agent, "session command queue full; doorbell folded");
            }
        }
    }

    /// Routes a steer request to its session and answers it without blocking the actor.
    fn steer(&self, request: canopy_bus::Incoming) {
        let bus = self.options.api.bus.clone();
        let Some(reply_to) = request.reply.clone() else { return };
        let parsed = serde_json::from_slice::<SteerRequest>(&request.payload);
        let target = parsed.as_ref().ok().and_then(|r| {
            self.sessions.get(&r.agent).filter(|s| s.incarnation == r.incarnation).map(|s| s.commands.clone())
        });
        tokio::spawn(async move {
            let answer = match (parsed, target) {
                (Err(e), _) => SteerReply {
                    steered: false,
                    turn_id: None,
                    reason: Some(format!("bad steer request: {e}")),
                    written_at_us: None,
                },
                (Ok(_), None) => SteerReply {
                    steered: false,
                    turn_id: None,
                    reason: Some("the session is not live on this runner".into()),
                    written_at_us: None,
                },
                (Ok(request), Some(_)) if canopy_sys::unix_us() / 1000 > request.not_after_ms => SteerReply {
                    steered: false,
                    turn_id: None,
                    reason: Some("the request arrived after the poster stopped waiting".into()),
                    written_at_us: None,
                },
                (Ok(request), Some(commands)) => {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let sent = commands.send(SessionCommand::Steer { message: request.message, reply: tx }).await;
                    match (sent, rx.await) {
                        (Ok(()), Ok(answer)) => answer,
                        _ => SteerReply {
                            steered: false,
                            turn_id: None,
                            reason: Some("the session ended".into()),
                            written_at_us: None,
                        },
                    }
                }
            };
            let payload = serde_json::to_vec(&answer).unwrap_or_default();
            if let Err(e) = bus.publish(&reply_to, payload.into()).await {
                tracing::debug!(error = %e, "answering a steer request failed");
            }
        });
    }

    /// Routes an interrupt request to its session and answers it without blocking the actor.
    fn interrupt(&self, request: canopy_bus::Incoming) {
        let bus = self.options.api.bus.clone();
        let Some(reply_to) = request.reply.clone() else { return };
        let parsed = serde_json::from_slice::<InterruptRequest>(&request.payload);
        let target = parsed.as_ref().ok().and_then(|r| {
            self.sessions.get(&r.agent).filter(|s| s.incarnation == r.incarnation).map(|s| s.commands.clone())
        });
        let refused = |reason: String| InterruptReply { interrupted: false, turn_id: None, reason: Some(reason) };
        tokio::spawn(async move {
            let answer = match (parsed, target) {
                (Err(e), _) => refused(format!("bad interrupt request: {e}")),
                (Ok(_), None) => refused("the session is not live on this runner".into()),
                (Ok(_), Some(commands)) => {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    match (commands.send(SessionCommand::Interrupt { reply: tx }).await, rx.await) {
                        (Ok(()), Ok(answer)) => answer,
                        _ => refused("the session ended".into()),
                    }
                }
            };
            let payload = serde_json::to_vec(&answer).unwrap_or_default();
            if let Err(e) = bus.publish(&reply_to, payload.into()).await {
                tracing::debug!(error = %e, "answering an interrupt request failed");
            }
        });
    }

    fn forget_token(&self, token: &str) {
        if let Ok(mut tokens) = self.tokens.write() {
            tokens.remove(token);
        }
    }

    async fn stop_all(&mut self) {
        let mut slots: Vec<SessionSlot> = self.sessions.drain().map(|(_, slot)| slot).collect();
        for slot in &mut slots {
            slot.stop();
        }
        for slot in slots {
            slot.join().await;
        }
        for (_, task) in self.stopping.drain() {
            let _ = task.await;
        }
    }
}
