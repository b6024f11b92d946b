//! The runner actor: sync with the daemon, start and stop session tasks, restart policy.
//!
//! Owns the set of sessions this runner hosts (and those still stopping), the MCP
//! endpoint's admitted tokens, and each agent's crash history. The restart rules are
//! `restarts`'s, the answers to the daemon's steer and interrupt requests `requests`'s; a
//! session's life is `session`'s. Does not decide placement: the daemon does.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, RwLock};

use canopy_bus::CallError;
use canopy_core::{Incarnation, RunnerId};
use canopy_proto::api::{
    DeliverDoorbell, InterruptRequest, RunnerGitRequest, RunnersSyncRequest, RunnersSyncResponse, RunningSession,
    SessionAssignment, SessionReport, SteerRequest,
};
use canopy_proto::method;
use canopy_tools::http::{HttpEndpoint, TokenCheck};
use canopy_tools::{CanopyTools, TokenSource};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::options::{LIVE_CALL, RunnerOptions};
use crate::requests::{answer_interrupt, answer_steer, publish_reply};
use crate::restarts::{crash_report, fatal_report, judge_crash};
use crate::session::{self, SessionCommand, SessionExit, SessionSlot};

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
        if let Err(e) = self.task.await {
            tracing::error!(runner = %self.id, error = %e, "the runner task failed; its sessions may not have stopped");
        }
    }
}

/// token -> agent, for the MCP endpoint's admission check.
type Tokens = Arc<RwLock<HashMap<String, String>>>;

/// Starts a runner: its MCP endpoint, its reporter, and its sync loop.
pub async fn spawn(options: RunnerOptions) -> Result<RunnerHandle, RunnerError> {
    let id = options.id.clone();
    // Which process of this runner this is: a new one ends what an earlier one left live.
    let boot = format!("{}-{:x}", std::process::id(), random_suffix());
    let tokens: Tokens = Arc::new(RwLock::new(HashMap::new()));
    let check_tokens = tokens.clone();
    // A poisoned lock admits nobody: the endpoint fails closed (`admit` logs the poisoning).
    let check: TokenCheck = Arc::new(move |token| check_tokens.read().is_ok_and(|t| t.contains_key(token)));
    // A runner elsewhere sends tool calls over HTTP once its sync names the daemon's endpoint.
    let http_tools = crate::tool_path::HttpTools::new(options.api.bus.clone(), options.api.timeout);
    let tools_api = match options.api.is_in_process() {
        true => options.api.clone(),
        false => options.api.clone().in_process(Arc::new(http_tools.clone())),
    };
    let tools = CanopyTools::new(tools_api, TokenSource::Header);
    let endpoint = canopy_tools::http::serve(tools, check).await.map_err(RunnerError::Endpoint)?;
    let inbound = Inbound::subscribe(&options).await?;
    let (reports, reporter) = crate::reporter::spawn(
        options.api.with_timeout(LIVE_CALL),
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
        http_tools,
        reports,
        sessions: HashMap::new(),
        stopping: HashMap::new(),
        crashes: HashMap::new(),
        not_before: HashMap::new(),
        stop: stop.clone(),
        resync_now: false,
        registered: false,
        draining: false,
        moving: HashSet::new(),
        ended: HashSet::new(),
        boot,
    };
    let task = tokio::spawn(async move {
        actor.run(inbound).await;
        // The actor dropped its report sender: the reporter sends what is queued and ends.
        if let Err(e) = reporter.await {
            tracing::error!(error = %e, "the session reporter failed; queued reports are lost");
        }
    });
    tracing::info!(runner = %id, mcp = %mcp_url, "runner started");
    Ok(RunnerHandle { id, mcp_url, stop, task })
}

fn random_suffix() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    (nanos as u64) ^ (u64::from(std::process::id()) << 32)
}

/// What reaches the runner over NATS: sync pokes, delivery doorbells, steer, interrupt and
/// git requests.
struct Inbound {
    pokes: BoxStream<'static, canopy_bus::Received>,
    doorbells: BoxStream<'static, canopy_bus::Received>,
    steers: BoxStream<'static, canopy_bus::Incoming>,
    interrupts: BoxStream<'static, canopy_bus::Incoming>,
    gits: BoxStream<'static, canopy_bus::Incoming>,
}

impl Inbound {
    async fn subscribe(options: &RunnerOptions) -> Result<Inbound, RunnerError> {
        let (bus, subjects, id) = (&options.api.bus, &options.api.subjects, &options.id);
        let failed = |e: canopy_bus::BusError| RunnerError::Subscribe(e.to_string());
        Ok(Inbound {
            pokes: bus.subscribe(&subjects.runner_poke()).await.map_err(failed)?.boxed(),
            doorbells: bus.subscribe(&subjects.runner_deliver(id)).await.map_err(failed)?.boxed(),
            steers: bus.serve(&subjects.runner_steer(id), id.as_str()).await.map_err(failed)?.boxed(),
            interrupts: bus.serve(&subjects.runner_interrupt(id), id.as_str()).await.map_err(failed)?.boxed(),
            gits: bus.serve(&subjects.runner_git(id), id.as_str()).await.map_err(failed)?.boxed(),
        })
    }
}

struct RunnerActor {
    id: RunnerId,
    options: RunnerOptions,
    endpoint: HttpEndpoint,
    /// token -> agent, for the MCP endpoint's admission check.
    tokens: Tokens,
    /// Where the sessions' tool calls go when this runner is not the daemon's own.
    http_tools: crate::tool_path::HttpTools,
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
    /// Whether the operator drained this runner, as the last sync said.
    draining: bool,
    /// The sessions told to end at their next turn boundary, as the last sync said.
    moving: HashSet<(String, Incarnation)>,
    /// Sessions that ended here whose end the daemon may not have applied yet: never started
    /// again (a new start is a new incarnation), so a sync that overtakes the end report
    /// cannot restart one.
    ended: HashSet<(String, Incarnation)>,
}

impl RunnerActor {
    async fn run(mut self, inbound: Inbound) {
        let Inbound { mut pokes, mut doorbells, mut steers, mut interrupts, mut gits } = inbound;
        let (exits_tx, mut exits) = mpsc::channel::<SessionExit>(64);
        let mut tick = tokio::time::interval(self.options.settings.sync_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let watch = self.watch_checkouts();
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
                Some(request) = gits.next() => self.git(request),
                Some(exit) = exits.recv() => {
                    self.on_exit(exit).await;
                    self.sync(&exits_tx).await;
                }
            }
        }
        // Nobody reads session ends while every session stops: without a reader the ends
        // of more sessions than the queue holds would wait on it, and the stop with them.
        drop(exits);
        self.stop_all().await;
        watch.abort();
        self.endpoint.stop();
        tracing::info!(runner = %self.id, "runner stopped");
    }

    async fn sync(&mut self, exits: &mpsc::Sender<SessionExit>) {
        self.options.token.refresh();
        let token = match self.options.token.get() {
            Ok(token) => token,
            Err(e) => {
                tracing::error!(error = %e, "this runner cannot sync; its sessions keep running");
                return;
            }
        };
        let running = self
            .sessions
            .iter()
            .map(|(agent, slot)| RunningSession { agent: agent.clone(), incarnation: slot.incarnation })
            .collect();
        let api = self.options.api.with_timeout(LIVE_CALL);
        let request = RunnersSyncRequest {
            runner_id: self.id.clone(),
            boot: self.boot.clone(),
            name: self.options.name.clone(),
            mcp_url: self.endpoint.url.clone(),
            capacity: self.options.settings.capacity,
            running,
            labels: self.options.settings.labels.clone(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        };
        let assigned: RunnersSyncResponse = match api.send::<method::RunnersSync>(&token, &request).await {
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
        self.options.checkouts.set_url(&assigned.git_url);
        self.http_tools.set(&assigned.git_url, canopy_git::http::basic_header(self.id.as_str(), &token));
        self.move_at_boundary(&assigned);
        self.stop_unassigned(&assigned);
        if assigned.more {
            // More sessions wait; the next tick comes at once.
            self.resync_now = true;
        }
        // An ended session the daemon still lists has an end report on its way; one it no
        // longer lists is forgotten.
        self.ended.retain(|(agent, incarnation)| {
            assigned.start.iter().any(|a| a.agent == *agent && a.incarnation == *incarnation)
        });
        let now = Instant::now();
        for assignment in assigned.start {
            if self.sessions.contains_key(&assignment.agent)
                || self.ended.contains(&(assignment.agent.clone(), assignment.incarnation))
            {
                continue;
            }
            if self.not_before.get(&assignment.agent).is_some_and(|t| *t > now) {
                continue; // Backing off after a crash; a later sync starts it.
            }
            self.start(assignment, exits);
        }
    }

    /// Stops every session the daemon no longer assigns here (or assigns in another
    /// incarnation); each is kept in `stopping` until it is gone.
    fn stop_unassigned(&mut self, assigned: &RunnersSyncResponse) {
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
    }

    /// Starts the session `assignment`, once the agent's previous one here is gone.
    fn start(&mut self, assignment: SessionAssignment, exits: &mpsc::Sender<SessionExit>) {
        self.admit(&assignment.token, &assignment.agent);
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

    async fn on_exit(&mut self, exit: SessionExit) {
        self.ended.insert((exit.agent.clone(), exit.incarnation));
        let current = self.sessions.get(&exit.agent).is_some_and(|s| s.incarnation == exit.incarnation);
        if current && let Some(slot) = self.sessions.remove(&exit.agent) {
            self.forget_token(&slot.token);
        }
        if exit.requested {
            return; // Stopped on purpose; the session already reported its end.
        }
        let report = if exit.fatal {
            // Retrying cannot help (the session cannot be confined here): the agent stops
            // at once, and the operator is told why in its home channel.
            self.crashes.remove(&exit.agent);
            tracing::error!(agent = %exit.agent, incarnation = %exit.incarnation, reason = %exit.reason, "session cannot start");
            fatal_report(&exit)
        } else {
            let now = Instant::now();
            let history = self.crashes.entry(exit.agent.clone()).or_default();
            let verdict = judge_crash(history, now, &self.options.settings, &exit.reason);
            tracing::warn!(agent = %exit.agent, incarnation = %exit.incarnation, reason = %verdict.reason, "session crashed");
            if verdict.crash_loop {
                self.crashes.remove(&exit.agent);
            } else {
                self.not_before.insert(exit.agent.clone(), now + verdict.backoff);
            }
            crash_report(&exit, &verdict)
        };
        if self.reports.send(report).await.is_err() {
            // The reporter ends only after this actor, so it can only have failed.
            tracing::error!(agent = %exit.agent, "the session reporter is gone; this crash goes unreported");
        }
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

    /// Tells each session the daemon moves whether it ends at its next turn boundary (this
    /// runner drains, or its agent moved to another harness), at every sync while it does,
    /// and once when that is taken back.
    fn move_at_boundary(&mut self, assigned: &RunnersSyncResponse) {
        if assigned.draining != self.draining {
            tracing::info!(runner = %self.id, draining = assigned.draining, "the operator changed whether this runner drains");
            self.draining = assigned.draining;
        }
        let moving: HashSet<(String, Incarnation)> =
            assigned.move_at_boundary.iter().map(|s| (s.agent.clone(), s.incarnation)).collect();
        let taken_back: Vec<(String, Incarnation)> = self.moving.difference(&moving).cloned().collect();
        for (agent, incarnation, drain) in
            moving.iter().map(|(a, i)| (a, *i, true)).chain(taken_back.iter().map(|(a, i)| (a, *i, false)))
        {
            if let Some(commands) = self.commands_of(agent, incarnation)
                && commands.try_send(SessionCommand::Drain(drain)).is_err()
            {
                tracing::debug!(%agent, "session command queue full; the move is told at the next sync");
            }
        }
        self.moving = moving;
    }

    /// The command queue of the session `agent` runs as `incarnation` here, if it does.
    fn commands_of(&self, agent: &str, incarnation: Incarnation) -> Option<mpsc::Sender<SessionCommand>> {
        self.sessions.get(agent).filter(|s| s.incarnation == incarnation).map(|s| s.commands.clone())
    }

    /// Routes a steer request to its session and answers it without blocking the actor.
    fn steer(&self, request: canopy_bus::Incoming) {
        let bus = self.options.api.bus.clone();
        let Some(reply_to) = request.reply.clone() else { return };
        let parsed = serde_json::from_slice::<SteerRequest>(&request.payload);
        let session = parsed.as_ref().ok().and_then(|r| self.commands_of(&r.agent, r.incarnation));
        tokio::spawn(async move {
            let answer = answer_steer(parsed, session, canopy_sys::unix_us() / 1000).await;
            publish_reply(&bus, &reply_to, serde_json::to_vec(&answer), "a steer request").await;
        });
    }

    /// Routes an interrupt request to its session and answers it without blocking the actor.
    fn interrupt(&self, request: canopy_bus::Incoming) {
        let bus = self.options.api.bus.clone();
        let Some(reply_to) = request.reply.clone() else { return };
        let parsed = serde_json::from_slice::<InterruptRequest>(&request.payload);
        let session = parsed.as_ref().ok().and_then(|r| self.commands_of(&r.agent, r.incarnation));
        tokio::spawn(async move {
            let answer = answer_interrupt(parsed, session).await;
            publish_reply(&bus, &reply_to, serde_json::to_vec(&answer), "an interrupt request").await;
        });
    }

    /// Answers the daemon's request about a checkout kept here, without blocking the actor.
    fn git(&self, request: canopy_bus::Incoming) {
        let bus = self.options.api.bus.clone();
        let Some(reply_to) = request.reply.clone() else { return };
        let parsed = serde_json::from_slice::<RunnerGitRequest>(&request.payload).map_err(|e| e.to_string());
        let checkouts = self.options.checkouts.clone();
        tokio::spawn(async move {
            let answer = checkouts.answer(parsed).await;
            publish_reply(&bus, &reply_to, serde_json::to_vec(&answer), "a git request").await;
        });
    }

    /// The watch over the checkouts kept here: each branch that moved is pushed to the daemon.
    fn watch_checkouts(&self) -> tokio::task::JoinHandle<()> {
        let checkouts = self.options.checkouts.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(checkouts.watch_interval());
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                checkouts.save_all().await;
            }
        })
    }

    /// Lets the session of `agent` call the MCP endpoint with `token`.
    fn admit(&self, token: &str, agent: &str) {
        match self.tokens.write() {
            Ok(mut tokens) => {
                tokens.insert(token.to_owned(), agent.to_owned());
            }
            Err(_) => tracing::error!(%agent, "the MCP token table is poisoned; this session's tool calls are refused"),
        }
    }

    fn forget_token(&self, token: &str) {
        match self.tokens.write() {
            Ok(mut tokens) => {
                tokens.remove(token);
            }
            // A poisoned table admits nobody (see `spawn`), so the token is refused anyway.
            Err(_) => tracing::error!("the MCP token table is poisoned; a stopped session's token stays listed"),
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
        for (agent, task) in self.stopping.drain() {
            if let Err(e) = task.await {
                tracing::error!(%agent, error = %e, "a stopping session's task failed");
            }
        }
    }
}
