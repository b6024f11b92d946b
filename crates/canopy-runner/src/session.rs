//! One session: a task that owns a harness process for one (agent, incarnation).
//!
//! It launches the harness, gives it its first input (the daemon's continuity block, who it
//! is, its charter, and every message that waited while it was offline), turns every harness
//! event into a report (presence, activity and usage), and delivers messages: at the start of
//! a turn when the agent is idle (after a quiet window or a cap, so a burst costs one turn),
//! and mid-turn when the daemon asks for a steer. After the harness reports a compaction, the
//! next turn-start delivery opens with the continuity block (asked of the daemon, which has
//! the facts). A delivery is acknowledged to the daemon only after the harness accepted it;
//! the session drops messages it already injected, by message id. On exit it tells the
//! runner whether the exit was asked for.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use canopy_bus::ApiClient;
use canopy_core::schedule::TurnSchedule;
use canopy_core::{Incarnation, Message, Presence, RunnerId, Seq};
use canopy_harness::{
    HarnessEvent, HarnessKind, InputContext, LaunchError, LaunchSpec, Prompt, PromptMode, SendMode, SendOutcome,
    Session,
};
use canopy_proto::api::{
    ContinuityWhen, DeliveriesAckRequest, DeliveriesPullRequest, DeliveriesPullResponse, InterruptReply,
    ReportedActivity, ReportedUsage, RunsFinishRequest, SessionAssignment, SessionReport, SessionsContinuityRequest,
    SteerReply,
};
use canopy_proto::method;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::runner::RunnerOptions;

/// Most message ids a session remembers for dropping duplicates.
const REMEMBERED: usize = 10_000;

/// What the runner can ask of a session.
pub(crate) enum SessionCommand {
    /// New messages may be pending (a doorbell).
    Hint,
    /// Inject this message into the running turn, and say whether it worked.
    Steer { message: Message, reply: oneshot::Sender<SteerReply> },
    /// Stop the running turn (an operator's `agents.interrupt`); the session stays up.
    Interrupt { reply: oneshot::Sender<InterruptReply> },
}

/// What the runner keeps for a running session.
pub(crate) struct SessionSlot {
    pub agent: String,
    pub incarnation: Incarnation,
    pub token: String,
    pub commands: mpsc::Sender<SessionCommand>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl SessionSlot {
    /// Asks the session to stop: dropping the sender is the signal. The session reports
    /// its own end; dropping the slot stops the session the same way.
    pub fn stop(&mut self) {
        self.stop.take();
    }

    /// Stops the session and waits for its task to finish.
    pub async fn join(mut self) {
        self.stop.take();
        let _ = (&mut self.task).await;
    }
}

/// A session's end, as the runner needs it.
pub(crate) struct SessionExit {
    pub agent: String,
    pub incarnation: Incarnation,
    /// Whether the runner asked for it (stop) or the harness went away on its own.
    pub requested: bool,
    /// Whether restarting cannot help (the session cannot be confined): the agent is
    /// marked `crashed` at once instead of after a crash loop.
    pub fatal: bool,
    pub reason: String,
}

pub(crate) struct SessionContext {
    /// The agent's previous session on this runner, still stopping: the harness is launched
    /// once it is gone (it may be finishing a turn in the conversation this one resumes).
    pub previous: Option<tokio::task::JoinHandle<()>>,
    pub assignment: SessionAssignment,
    pub options: RunnerOptions,
    pub runner_id: RunnerId,
    pub mcp_url: String,
    pub reports: mpsc::Sender<SessionReport>,
    pub exits: mpsc::Sender<SessionExit>,
}

pub(crate) fn spawn(context: SessionContext) -> SessionSlot {
    let (stop_tx, stop_rx) = oneshot::channel();
    let (commands, commands_rx) = mpsc::channel(256);
    let agent = context.assignment.agent.clone();
    let incarnation = context.assignment.incarnation;
    let token = context.assignment.token.clone();
    let span = tracing::info_span!("session", %agent, incarnation = %incarnation);
    let task = tokio::spawn(tracing::Instrument::instrument(run(context, stop_rx, commands_rx), span));
    SessionSlot { agent, incarnation, token, commands, stop: Some(stop_tx), task }
}

#[derive(Clone)]
struct Reporter {
    agent: String,
    incarnation: Incarnation,
    /// The session's model (or its harness's name): what `[pricing]` prices its usage by.
    model: String,
    tx: mpsc::Sender<SessionReport>,
}

impl Reporter {
    async fn send(&self, presence: Option<Presence>, reason: Option<String>, activity: Option<ReportedActivity>) {
        let report = SessionReport {
            agent: self.agent.clone(),
            incarnation: self.incarnation,
            presence,
            reason,
            activity,
            ended: false,
            crash_loop: false,
            fatal: false,
            usage: None,
        };
        let _ = self.tx.send(report).await;
    }

    async fn activity(&self, kind: &str, summary: String, detail: serde_json::Value) {
        let activity = ReportedActivity { kind: kind.into(), turn_id: None, summary, detail };
        self.send(None, None, Some(activity)).await;
    }

    async fn event(&self, event: &HarnessEvent) {
        let presence = match event {
            HarnessEvent::TurnStarted { .. } | HarnessEvent::CompactionEnded => Some((Presence::Working, None)),
            HarnessEvent::TurnEnded { .. } => Some((Presence::Idle, Some("waiting for its next input".to_owned()))),
            HarnessEvent::CompactionStarted => Some((Presence::Compacting, None)),
            HarnessEvent::ModelError { text, fatal: false } => Some((Presence::Failing, Some(text.clone()))),
            _ => None,
        };
        let detail = serde_json::to_value(event).unwrap_or(serde_json::Value::Null);
        let activity = ReportedActivity {
            kind: event.kind().into(),
            turn_id: event.turn_id().map(str::to_owned),
            summary: event.summary(),
            detail,
        };
        let (presence, reason) = presence.map_or((None, None), |(p, r)| (Some(p), r));
        // Usage rides the same report as its activity line; the daemon stores it per turn.
        let usage = match event {
            HarnessEvent::Usage { turn_id, usage } => Some(ReportedUsage {
                turn_id: turn_id.clone(),
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                cache_read_tokens: usage.cache_read_tokens,
                cache_write_tokens: usage.cache_write_tokens,
                model: Some(self.model.clone()),
                cost_usd: usage.cost_usd,
            }),
            _ => None,
        };
        let report = SessionReport {
            agent: self.agent.clone(),
            incarnation: self.incarnation,
            presence,
            reason,
            activity: Some(activity),
            ended: false,
            crash_loop: false,
            fatal: false,
            usage,
        };
        let _ = self.tx.send(report).await;
    }

    async fn ended(&self, reason: String, presence: Presence) {
        let report = SessionReport {
            agent: self.agent.clone(),
            incarnation: self.incarnation,
            presence: Some(presence),
            reason: Some(reason.clone()),
            activity: Some(ReportedActivity {
                kind: "session_ended".into(),
                turn_id: None,
                summary: reason,
                detail: serde_json::Value::Null,
            }),
            ended: true,
            crash_loop: false,
            fatal: false,
            usage: None,
        };
        let _ = self.tx.send(report).await;
    }
}

/// Talks to the daemon about this session's deliveries.
#[derive(Clone)]
struct Mailbox {
    api: ApiClient,
    token: crate::RunnerToken,
    runner_id: RunnerId,
    agent: String,
    incarnation: Incarnation,
    batch: u32,
}

impl Mailbox {
    async fn pull(&self) -> Option<DeliveriesPullResponse> {
        let request = DeliveriesPullRequest {
            runner_id: self.runner_id.clone(),
            agent: self.agent.clone(),
            incarnation: self.incarnation,
            limit: Some(self.batch),
        };
        match self.api.send::<method::DeliveriesPull>(&self.token.get(), &request).await {
            Ok(pending) => Some(pending),
            Err(e) => {
                tracing::debug!(error = %e, "pulling pending messages failed; retrying later");
                None
            }
        }
    }

    /// Hands a run's final report (or failure) to the daemon, retrying briefly.
    async fn finish_run(self, done: bool, report: String) {
        let report = match report.trim().is_empty() {
            true => "The run ended without a final message.".to_owned(),
            false => report,
        };
        let request = RunsFinishRequest {
            agent: self.agent.clone(),
            incarnation: self.incarnation,
            status: if done { "done" } else { "failed" }.to_owned(),
            report,
        };
        let token = self.token.get();
        retrying("reporting a run's end failed", || self.api.send::<method::RunsFinish>(&token, &request)).await;
    }

    /// The continuity block the daemon builds for this session, or `None` if it cannot be
    /// had now (the input goes without it rather than waiting).
    async fn continuity(&self, when: ContinuityWhen) -> Option<String> {
        let request = SessionsContinuityRequest {
            runner_id: self.runner_id.clone(),
            agent: self.agent.clone(),
            incarnation: self.incarnation,
            when,
        };
        match self.api.send::<method::SessionsContinuity>(&self.token.get(), &request).await {
            Ok(response) if !response.block.is_empty() => Some(response.block),
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(error = %e, "fetching the continuity block failed; the input goes without it");
                None
            }
        }
    }

    /// Acknowledges injected messages, retrying briefly: an acknowledgement that never
    /// arrives only means the messages come again and are dropped as duplicates.
    async fn ack(&self, seqs: Vec<Seq>) {
        self.acknowledge(seqs, false).await;
    }

    /// Acknowledges messages steered into a running turn.
    async fn ack_steered(&self, seq: Seq) {
        self.acknowledge(vec![seq], true).await;
    }

    async fn acknowledge(&self, seqs: Vec<Seq>, steered: bool) {
        if seqs.is_empty() {
            return;
        }
        let request = DeliveriesAckRequest {
            runner_id: self.runner_id.clone(),
            agent: self.agent.clone(),
            incarnation: self.incarnation,
            seqs,
            steered,
        };
        let token = self.token.get();
        retrying("acknowledging a delivery failed", || self.api.send::<method::DeliveriesAck>(&token, &request)).await;
    }
}

/// Makes a daemon call up to five times, waiting 200 ms, doubling, after each failure and
/// logging it at debug as `failure`, then gives up quietly: it serves only calls whose loss
/// the caller accepts (`Mailbox::acknowledge`, `Mailbox::finish_run`).
async fn retrying<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
    failure: &str,
    mut call: impl FnMut() -> F,
) {
    for attempt in 0..5u32 {
        match call().await {
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(error = %e, attempt, "{failure}");
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
        }
    }
}

/// Message ids this session already injected (bounded), and those a turn-start delivery is
/// handing to the harness right now. Shared through a `std` mutex that is only ever held for
/// a lookup or an insert, never across an await: a slow acknowledgement or harness write
/// cannot hold up a steer or the session loop (the guard is not `Send`, so the compiler
/// refuses one held across an await in a spawned task).
#[derive(Default)]
struct Seen {
    ids: HashSet<Seq>,
    order: VecDeque<Seq>,
    delivering: HashSet<Seq>,
}

/// What a steer finds out about its message.
#[derive(Debug, PartialEq, Eq)]
enum SteerCheck {
    /// Not injected, not being delivered: steer it.
    Steer,
    /// Already in the agent's context.
    Injected,
    /// In a turn-start delivery being written now: it arrives with that turn.
    Delivering,
}

type SharedSeen = Arc<std::sync::Mutex<Seen>>;

/// Runs `f` on the shared set; the lock is held only for `f`.
fn with_seen<T>(seen: &SharedSeen, f: impl FnOnce(&mut Seen) -> T) -> T {
    let mut guard = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    f(&mut guard)
}

impl Seen {
    /// Takes the messages of a turn-start delivery: those injected before (to acknowledge
    /// again) and the fresh ones, which are marked as being delivered.
    fn reserve(&mut self, messages: Vec<Message>) -> (Vec<Message>, Vec<Message>) {
        let (again, fresh): (Vec<Message>, Vec<Message>) =
            messages.into_iter().partition(|m| self.contains(m.seq) || self.delivering.contains(&m.seq));
        self.delivering.extend(fresh.iter().map(|m| m.seq));
        (again, fresh)
    }

    /// Ends a delivery: its messages are injected (`started`) or pending again.
    fn settle(&mut self, seqs: &[Seq], started: bool) {
        for seq in seqs {
            self.delivering.remove(seq);
            if started {
                self.insert(*seq);
            }
        }
    }

    fn check_steer(&self, seq: Seq) -> SteerCheck {
        if self.contains(seq) {
            SteerCheck::Injected
        } else if self.delivering.contains(&seq) {
            SteerCheck::Delivering
        } else {
            SteerCheck::Steer
        }
    }

    fn insert(&mut self, seq: Seq) {
        if self.ids.insert(seq) {
            self.order.push_back(seq);
            if self.order.len() > REMEMBERED
                && let Some(old) = self.order.pop_front()
            {
                self.ids.remove(&old);
            }
        }
    }

    fn contains(&self, seq: Seq) -> bool {
        self.ids.contains(&seq)
    }
}

/// Renders messages fenced with a fresh random nonce no body contains, marking those an
/// earlier session was handed (`redelivered`).
fn render(messages: &[Message], heading: &str, redelivered: &[Seq]) -> String {
    canopy_core::render::render_fenced(messages, heading, redelivered, || {
        canopy_sys::random_hex(8).unwrap_or_else(|_| format!("{:x}", std::process::id()))
    })
}

/// Where the input came from, for the harness (the scripted one matches rules on it).
fn context_of(kind: &str, messages: &[Message], redelivered: &[Seq]) -> InputContext {
    let last = messages.last();
    InputContext {
        kind: kind.to_owned(),
        sender: last.map(|m| m.sender.handle.to_string()),
        channel: last.map(|m| m.channel.to_string()),
        topic: last.map(|m| m.topic.to_string()),
        seq: last.map(|m| m.seq.get()),
        redelivered: messages.iter().any(|m| redelivered.contains(&m.seq)),
    }
}

/// `input: 3 messages (from ops, lead in #home-x > plans)`: what started a turn, for `watch`.
fn input_summary(messages: &[Message]) -> String {
    let mut senders: Vec<&str> = messages.iter().map(|m| m.sender.handle.as_str()).collect();
    senders.dedup();
    senders.sort_unstable();
    senders.dedup();
    let places: std::collections::BTreeSet<String> =
        messages.iter().map(|m| format!("#{} > {}", m.channel, m.topic)).collect();
    let noun = if messages.len() == 1 { "message" } else { "messages" };
    let places: Vec<String> = places.into_iter().take(3).collect();
    format!("input: {} {noun} (from {} in {})", messages.len(), senders.join(", "), places.join(", "))
}

/// A finished turn-start delivery, reported back to the session loop.
struct Delivered {
    /// Whether a turn started with it (otherwise the messages are still pending).
    started: bool,
    /// Whether it opened with the continuity block.
    continuity: bool,
}

async fn run(context: SessionContext, mut stop: oneshot::Receiver<()>, mut commands: mpsc::Receiver<SessionCommand>) {
    let SessionContext { previous, assignment, options, runner_id, mcp_url, reports, exits } = context;
    if let Some(previous) = previous {
        // Its stop ladder (grace, SIGTERM, grace, SIGKILL) bounds the wait.
        let _ = previous.await;
    }
    let model = match assignment.model.is_empty() {
        false => assignment.model.clone(),
        true => HarnessKind::parse(&assignment.harness)
            .and_then(|k| options.harnesses.get(&k))
            .and_then(|h| h.model.clone())
            .unwrap_or_else(|| assignment.harness.clone()),
    };
    let reporter =
        Reporter { agent: assignment.agent.clone(), incarnation: assignment.incarnation, model, tx: reports };
    let settings = &options.settings;
    let mailbox = Mailbox {
        api: options.api.with_timeout(crate::LIVE_CALL),
        token: options.token.clone(),
        runner_id,
        agent: assignment.agent.clone(),
        incarnation: assignment.incarnation,
        batch: settings.delivery_batch,
    };
    let exit = |requested: bool, reason: String| SessionExit {
        agent: assignment.agent.clone(),
        incarnation: assignment.incarnation,
        requested,
        fatal: false,
        reason,
    };
    reporter
        .send(
            Some(Presence::Starting),
            None,
            Some(ReportedActivity {
                kind: "session_starting".into(),
                turn_id: None,
                summary: format!("starting session {} ({} harness)", assignment.incarnation, assignment.harness),
                detail: serde_json::Value::Null,
            }),
        )
        .await;

    let Some(kind) = HarnessKind::parse(&assignment.harness) else {
        let reason = format!("unknown harness {:?}", assignment.harness);
        reporter.activity("session_failed", reason.clone(), serde_json::Value::Null).await;
        let _ = exits.send(exit(false, reason)).await;
        return;
    };
    let agent_dir = options.sessions_dir.join(&assignment.agent);
    let harness = options.harnesses.get(&kind).cloned().unwrap_or_default();
    let (program, program_args) = match kind.default_program() {
        None => (options.scripted_program.clone(), options.scripted_args.clone()),
        Some(name) => (harness.program.clone().unwrap_or_else(|| name.into()), Vec::new()),
    };
    let mut env: Vec<(String, String)> = vec![
        ("CANOPY_AGENT".into(), assignment.agent.clone()),
        ("CANOPY_HOME_CHANNEL".into(), assignment.home_channel.clone()),
        ("CANOPY_INCARNATION".into(), assignment.incarnation.to_string()),
    ];
    env.extend(harness.env.iter().cloned());
    let spec = LaunchSpec {
        kind,
        program,
        program_args,
        session_dir: agent_dir.join(assignment.incarnation.to_string()),
        // Conversations a harness keeps live here across incarnations on this runner; a
        // session placed on another runner has none and starts fresh.
        agent_dir: Some(agent_dir.clone()),
        cwd: match assignment.cwd.is_empty() {
            true => agent_dir.join("work"),
            false => std::path::PathBuf::from(&assignment.cwd),
        },
        builtin_tools: assignment.harness_tools.clone(),
        prompt: match assignment.prompt_mode {
            PromptMode::Replace => Prompt::replace(assignment.system_prompt.clone()),
            PromptMode::Append => Prompt::append(assignment.system_prompt.clone()),
        },
        mcp_url,
        mcp_token: assignment.token.clone(),
        env,
        model: match assignment.model.is_empty() {
            true => harness.model.clone(),
            false => Some(assignment.model.clone()),
        },
        provider: harness.provider.clone(),
        script: assignment.script.as_ref().map(|s| (s.name.clone(), s.text.clone())),
        max_line_bytes: settings.max_line_bytes,
        ready_timeout: settings.ready_timeout,
        sandbox: options.sandbox.clone(),
        repo_mirror: assignment.repo_mirror.as_ref().map(std::path::PathBuf::from),
        subagents: assignment
            .subagents
            .iter()
            .map(|f| canopy_harness::Subagent {
                name: f.name.clone(),
                description: f.description.clone(),
                body: f.body.clone(),
            })
            .collect(),
    };
    if spec.repo_mirror.is_some() && !spec.cwd.join(".git").exists() {
        let reason = format!(
            "its checkout {} is not on this machine: an agent with a repository runs on a runner that shares the \
             daemon's data directory",
            spec.cwd.display()
        );
        reporter.activity("session_failed", reason.clone(), serde_json::Value::Null).await;
        let _ = exits.send(SessionExit { fatal: true, ..exit(false, reason) }).await;
        return;
    }
    let (session, mut events) = match Session::launch(spec, 1024).await {
        Ok(started) => started,
        Err(e @ LaunchError::Unconfinable(_)) => {
            let reason = format!("{e}; see `canopy doctor` and [sandbox] in canopy.toml");
            let _ = exits.send(SessionExit { fatal: true, ..exit(false, reason) }).await;
            return;
        }
        // Retrying cannot find a program that is not there or a setting that is not set:
        // the agent stops at once, with the fix.
        Err(LaunchError::Spawn { program, source }) if source.kind() == std::io::ErrorKind::NotFound => {
            let reason = format!(
                "the {kind} harness's program `{}` was not found (on PATH, or as a path): install it or set \
                 [harness.{kind}] bin in canopy.toml; `canopy doctor` checks it",
                program.display(),
                kind = kind.as_str()
            );
            reporter.activity("session_failed", reason.clone(), serde_json::Value::Null).await;
            let _ = exits.send(SessionExit { fatal: true, ..exit(false, reason) }).await;
            return;
        }
        Err(LaunchError::Invalid(why)) => {
            let reason =
                format!("{why}; fix it in canopy.toml or the environment that runs canopy (`canopy doctor` checks)");
            reporter.activity("session_failed", reason.clone(), serde_json::Value::Null).await;
            let _ = exits.send(SessionExit { fatal: true, ..exit(false, reason) }).await;
            return;
        }
        Err(e) => {
            let reason = format!("the harness did not start: {e}");
            reporter.activity("session_failed", reason.clone(), serde_json::Value::Null).await;
            let _ = exits.send(exit(false, reason)).await;
            return;
        }
    };
    let session = Arc::new(session);
    reporter
        .activity(
            "session_ready",
            format!("harness ready (pid {})", session.pid()),
            serde_json::json!({ "pid": session.pid() }),
        )
        .await;

    // The first input: who the agent is, and everything that waited while it was offline;
    // for a subagent run, its brief.
    let mut seen = Seen::default();
    let waiting = match assignment.run {
        Some(_) => (Vec::new(), Vec::new()),
        None => mailbox.pull().await.map(|p| (p.messages, p.redelivered)).unwrap_or_default(),
    };
    let (waiting, redelivered) = waiting;
    // The continuity block heads the first input, never the system prompt (block-0 stays
    // stable). A subagent run starts fresh from its brief and needs none.
    let mut first = match assignment.run {
        Some(_) => String::new(),
        None => mailbox.continuity(ContinuityWhen::Start).await.map(|b| b + "\n\n").unwrap_or_default(),
    };
    first.push_str(&start_input(&assignment));
    if !waiting.is_empty() {
        first.push_str("\n\n");
        first.push_str(&render(&waiting, "Messages that arrived while you were offline:", &redelivered));
    }
    let mut context = match &assignment.run {
        Some(run) => {
            InputContext { kind: "start".into(), sender: Some(run.manager.clone()), ..InputContext::default() }
        }
        None => context_of("start", &[], &[]),
    };
    context.redelivered = waiting.iter().any(|m| redelivered.contains(&m.seq));
    // A run reports once: its last words when its first turn ends.
    let mut last_text = String::new();
    let mut run_reported = false;
    match session.send(&format!("start-{}", assignment.incarnation), &first, &context, SendMode::NextTurn).await {
        Ok(SendOutcome::Started { .. }) => {
            for m in &waiting {
                seen.insert(m.seq);
            }
            mailbox.ack(waiting.iter().map(|m| m.seq).collect()).await;
            let summary = match (&assignment.run, waiting.is_empty()) {
                (Some(run), _) => format!("input: the brief from {}", run.manager),
                (None, true) => "input: who it is, at its session start".to_owned(),
                (None, false) => format!("{}, at its session start", input_summary(&waiting)),
            };
            reporter.activity("input", summary, serde_json::Value::Null).await;
        }
        Ok(outcome) => tracing::warn!(?outcome, "the first input was not taken"),
        Err(e) => tracing::warn!(error = %e, "the first input was not delivered"),
    }

    let mut commands_closed = false;
    let mut malformed = 0u64;
    let mut session = Some(session);
    // When the next turn-start delivery is due: the pure rules, driven with the clock here.
    let mut schedule = TurnSchedule::new(settings.quiet_window, settings.coalesce_cap);
    let now = || Instant::now().into_std();
    let (delivered_tx, mut delivered_rx) = mpsc::channel::<Delivered>(4);
    let mut resync = tokio::time::interval(settings.delivery_resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let seen: SharedSeen = Arc::new(std::sync::Mutex::new(seen));
    // Why the session is being stopped for the operator to fix, once it must be.
    let mut fatal: Option<String> = None;
    loop {
        let due = schedule.due().map(Instant::from_std);
        let stopping = schedule.stopping();
        tokio::select! {
            _ = &mut stop, if !stopping => begin_stop(&mut schedule, &mut session, settings.stop_grace),
            event = events.recv() => {
                let Some(event) = event else { break };
                match &event {
                    HarnessEvent::Exited { .. } => {
                        let reason = event.summary();
                        reporter.event(&event).await;
                        // Stopped because it cannot succeed without the operator: no restart.
                        if let Some(reason) = fatal.take() {
                            let _ = exits.send(SessionExit { fatal: true, ..exit(false, reason) }).await;
                            return;
                        }
                        if schedule.stopping() {
                            reporter.ended(format!("stopped ({reason})"), Presence::Offline).await;
                        }
                        let _ = exits.send(exit(schedule.stopping(), reason)).await;
                        return;
                    }
                    HarnessEvent::TurnStarted { turn_id } => schedule.turn_started(turn_id),
                    HarnessEvent::ModelError { text, fatal: true } if fatal.is_none() => {
                        fatal = Some(text.clone());
                        begin_stop(&mut schedule, &mut session, settings.stop_grace);
                    }
                    HarnessEvent::Text { text, .. } => last_text.clone_from(text),
                    HarnessEvent::TurnEnded { status, .. } if assignment.run.is_some() && !run_reported => {
                        schedule.run_ended();
                        run_reported = true;
                        let done = *status == canopy_harness::TurnStatus::Completed;
                        tokio::spawn(mailbox.clone().finish_run(done, std::mem::take(&mut last_text)));
                    }
                    // Anything that arrived during the turn goes at the next one.
                    HarnessEvent::TurnEnded { .. } => schedule.turn_ended(now()),
                    HarnessEvent::SteerInjected { input_id, .. } => {
                        if let Some(seq) = input_id.strip_prefix("steer-").and_then(|s| s.parse().ok()) {
                            // Seen before the turn ends, so a turn-start pull never repeats it.
                            with_seen(&seen, |s| s.insert(seq));
                            let mailbox = mailbox.clone();
                            tokio::spawn(async move { mailbox.ack_steered(seq).await });
                        }
                    }
                    // It never reached the model: it goes at the next turn start.
                    HarnessEvent::SteerDropped { .. } => schedule.hint(now()),
                    HarnessEvent::CompactionEnded => schedule.compacted(),
                    HarnessEvent::Malformed { .. } => {
                        malformed += 1;
                        tracing::warn!(malformed, "malformed harness output");
                    }
                    _ => {}
                }
                reporter.event(&event).await;
            }
            command = commands.recv(), if !commands_closed => match command {
                Some(SessionCommand::Hint) => schedule.hint(now()),
                Some(SessionCommand::Steer { message, reply }) => match (&session, schedule.turn()) {
                    // Bound to the turn running now; the harness refuses it if that turn ends
                    // first, and the daemon then rings for a turn-start delivery.
                    (Some(session), Some(turn_id)) => {
                        let (session, turn_id, seen) = (session.clone(), turn_id.to_owned(), seen.clone());
                        tokio::spawn(async move {
                            let _ = reply.send(steer(session, turn_id, message, &seen).await);
                        });
                    }
                    _ => {
                        let reason = Some("no turn is running".to_owned());
                        let _ = reply.send(SteerReply { steered: false, turn_id: None, reason, written_at_us: None });
                    }
                },
                Some(SessionCommand::Interrupt { reply }) => match (&session, schedule.turn()) {
                    // The harness ends the turn as interrupted; `TurnEnded` clears `turn` and
                    // messages still pending go at the next turn start, as after any turn.
                    (Some(session), Some(turn_id)) => {
                        let (session, turn_id) = (session.clone(), turn_id.to_owned());
                        tokio::spawn(async move {
                            let answer = match session.interrupt().await {
                                Ok(()) => InterruptReply { interrupted: true, turn_id: Some(turn_id), reason: None },
                                Err(e) => InterruptReply {
                                    interrupted: false,
                                    turn_id: Some(turn_id),
                                    reason: Some(format!("the harness could not be told: {e}")),
                                },
                            };
                            let _ = reply.send(answer);
                        });
                    }
                    (None, _) => {
                        let reason = Some("the session is stopping".to_owned());
                        let _ = reply.send(InterruptReply { interrupted: false, turn_id: None, reason });
                    }
                    (Some(_), None) => {
                        let reason = Some("no turn is running".to_owned());
                        let _ = reply.send(InterruptReply { interrupted: false, turn_id: None, reason });
                    }
                },
                None => {
                    // The runner dropped this session's slot: nothing can reach it any more,
                    // so it stops (and the task ends once the harness has exited).
                    commands_closed = true;
                    begin_stop(&mut schedule, &mut session, settings.stop_grace);
                }
            },
            Some(done) = delivered_rx.recv() => schedule.delivered(done.started, done.continuity, now()),
            // Doorbells are at most once: look for pending messages now and then.
            _ = resync.tick(), if schedule.resync_wanted() => schedule.resync(now()),
            () = sleep_until(due) => {
                if let Some(session) = &session
                    && let Some(delivery) = schedule.start_delivery(now())
                {
                    let (mailbox, seen, done) = (mailbox.clone(), seen.clone(), delivered_tx.clone());
                    let reporter = reporter.clone();
                    tokio::spawn(deliver(session.clone(), mailbox, seen, delivery.continuity, done, reporter));
                }
            }
        }
    }
    let _ = exits.send(exit(schedule.stopping(), "the harness's event stream ended".into())).await;
}

/// Starts the stop ladder once; the loop goes on until the harness has exited.
fn begin_stop(schedule: &mut TurnSchedule, session: &mut Option<Arc<Session>>, grace: Duration) {
    if schedule.stopping() {
        return;
    }
    schedule.stop();
    if let Some(session) = session.take() {
        tokio::spawn(async move { session.shutdown(grace).await });
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// Pulls pending messages and, if any may wake the agent, starts a turn with them.
async fn deliver(
    session: Arc<Session>,
    mailbox: Mailbox,
    seen: SharedSeen,
    continuity_owed: bool,
    done: mpsc::Sender<Delivered>,
    reporter: Reporter,
) {
    let mut started = true;
    let mut continuity = false;
    if let Some(pending) = mailbox.pull().await {
        let (again, fresh) = with_seen(&seen, |s| s.reserve(pending.messages));
        // Injected before (a steer whose acknowledgement has not committed yet, or one that
        // was lost): do not repeat them, and record them as injected rather than moving the
        // cursor. A cursor moves only with a turn start that wrote every message up to it; a
        // steered mention acknowledged as a cursor move would carry it past the unread
        // messages below, and a kill before they are written would lose them.
        mailbox.acknowledge(again.iter().map(|m| m.seq).collect(), true).await;
        let seqs: Vec<Seq> = fresh.iter().map(|m| m.seq).collect();
        if !fresh.is_empty() && pending.wake {
            let mut text = render(&fresh, "New messages since your last turn:", &pending.redelivered);
            if continuity_owed && let Some(block) = mailbox.continuity(ContinuityWhen::Compaction).await {
                text = format!("{block}\n\n{text}");
                continuity = true;
            }
            let context = context_of("message", &fresh, &pending.redelivered);
            let input_id = format!("deliver-{}", fresh.last().map_or(0, |m| m.seq.get()));
            match session.send(&input_id, &text, &context, SendMode::NextTurn).await {
                Ok(SendOutcome::Started { .. }) => {
                    with_seen(&seen, |s| s.settle(&seqs, true));
                    mailbox.ack(seqs.clone()).await;
                    reporter.activity("input", input_summary(&fresh), serde_json::json!({ "seqs": seqs })).await;
                }
                Ok(outcome) => {
                    tracing::debug!(?outcome, "a turn-start delivery was not taken; retrying");
                    started = false;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "a turn-start delivery failed; retrying");
                    started = false;
                }
            }
        }
        // Whatever was not taken is pending again (a no-op for what was injected).
        with_seen(&seen, |s| s.settle(&seqs, false));
    }
    let _ = done.send(Delivered { started, continuity }).await;
}

/// Injects one message into the running turn.
async fn steer(session: Arc<Session>, turn_id: String, message: Message, seen: &SharedSeen) -> SteerReply {
    let seq = message.seq;
    match with_seen(seen, |s| s.check_steer(seq)) {
        SteerCheck::Injected => {
            let reason = Some("already injected".into());
            return SteerReply { steered: true, turn_id: Some(turn_id), reason, written_at_us: None };
        }
        SteerCheck::Delivering => {
            let reason = Some("it is being delivered at the start of the agent's next turn".into());
            return SteerReply { steered: false, turn_id: None, reason, written_at_us: None };
        }
        SteerCheck::Steer => {}
    }
    let text = render(std::slice::from_ref(&message), "A message for you arrived while you were working:", &[]);
    let context = context_of("message", std::slice::from_ref(&message), &[]);
    let written_at_us = canopy_sys::unix_us();
    match session.send(&format!("steer-{seq}"), &text, &context, SendMode::Steer { turn_id }).await {
        // Taken for the turn; `SteerInjected` follows at its next step boundary.
        Ok(SendOutcome::Steered { turn_id }) => {
            SteerReply { steered: true, turn_id: Some(turn_id), reason: None, written_at_us: Some(written_at_us) }
        }
        Ok(SendOutcome::FellBack { reason }) | Ok(SendOutcome::Refused { reason }) => {
            SteerReply { steered: false, turn_id: None, reason: Some(reason), written_at_us: None }
        }
        Ok(SendOutcome::Started { .. }) => SteerReply {
            steered: false,
            turn_id: None,
            reason: Some("the harness started a new turn".into()),
            written_at_us: None,
        },
        Err(e) => SteerReply { steered: false, turn_id: None, reason: Some(e.to_string()), written_at_us: None },
    }
}

/// The first input of a session: who it is, and what its lane is for.
fn start_input(assignment: &SessionAssignment) -> String {
    if let Some(run) = &assignment.run {
        return format!(
            "Brief from @{} (subagent run {}, definition {}):\n\n{}",
            run.manager,
            run.id,
            run.definition,
            run.brief.trim()
        );
    }
    let mut text = format!(
        "Session {} started for {} (@{}, role {}). Your home channel is #{}.",
        assignment.incarnation, assignment.display_name, assignment.agent, assignment.role, assignment.home_channel
    );
    if !assignment.charter.trim().is_empty() {
        text.push_str(&format!("\n\nYour charter: {}", assignment.charter.trim()));
    }
    text
}

#[cfg(test)]
mod tests;
