//! One session: a task that owns a harness process for one (agent, incarnation).
//!
//! It launches the harness, gives it its first input (who it is, its charter, and every
//! message that waited while it was offline), turns every harness event into a report
//! (presence and activity), and delivers messages: at the start of a turn when the agent
//! is idle (after a quiet window or a cap, so a burst costs one turn), and mid-turn when
//! the daemon asks for a steer. A delivery is acknowledged to the daemon only after the
//! harness accepted it; the session drops messages it already injected, by message id.
//! On exit it tells the runner whether the exit was asked for.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use canopy_bus::ApiClient;
use canopy_core::{Message, Presence};
use canopy_harness::{HarnessEvent, HarnessKind, InputContext, LaunchSpec, PromptMode, SendMode, SendOutcome, Session};
use canopy_proto::Method;
use canopy_proto::api::{
    DeliveriesAckRequest, DeliveriesAckResponse, DeliveriesPullRequest, DeliveriesPullResponse, PromptModeWire,
    ReportedActivity, SessionAssignment, SessionReport, SteerReply,
};
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
}

/// What the runner keeps for a running session.
pub(crate) struct SessionSlot {
    pub agent: String,
    pub incarnation: u64,
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
    pub incarnation: u64,
    /// Whether the runner asked for it (stop) or the harness went away on its own.
    pub requested: bool,
    pub reason: String,
}

pub(crate) struct SessionContext {
    pub assignment: SessionAssignment,
    pub options: RunnerOptions,
    pub runner_id: String,
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
    let span = tracing::info_span!("session", %agent, incarnation);
    let task = tokio::spawn(tracing::Instrument::instrument(run(context, stop_rx, commands_rx), span));
    SessionSlot { agent, incarnation, token, commands, stop: Some(stop_tx), task }
}

struct Reporter {
    agent: String,
    incarnation: u64,
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
        self.send(presence, reason, Some(activity)).await;
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
        };
        let _ = self.tx.send(report).await;
    }
}

/// Talks to the daemon about this session's deliveries.
#[derive(Clone)]
struct Mailbox {
    api: ApiClient,
    token: String,
    runner_id: String,
    agent: String,
    incarnation: u64,
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
        match self.api.call(Method::DeliveriesPull, &self.token, &request).await {
            Ok(pending) => Some(pending),
            Err(e) => {
                tracing::debug!(error = %e, "pulling pending messages failed; retrying later");
                None
            }
        }
    }

    /// Acknowledges injected messages, retrying briefly: an acknowledgement that never
    /// arrives only means the messages come again and are dropped as duplicates.
    async fn ack(&self, seqs: Vec<u64>) {
        self.acknowledge(seqs, false).await;
    }

    /// Acknowledges messages steered into a running turn.
    async fn ack_steered(&self, seq: u64) {
        self.acknowledge(vec![seq], true).await;
    }

    async fn acknowledge(&self, seqs: Vec<u64>, steered: bool) {
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
        for attempt in 0..5u32 {
            match self.api.call::<_, DeliveriesAckResponse>(Method::DeliveriesAck, &self.token, &request).await {
                Ok(_) => return,
                Err(e) => {
                    tracing::debug!(error = %e, attempt, "acknowledging a delivery failed");
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                }
            }
        }
    }
}

/// Message ids this session already injected, bounded.
#[derive(Default)]
struct Seen {
    ids: HashSet<u64>,
    order: VecDeque<u64>,
}

impl Seen {
    fn insert(&mut self, seq: u64) {
        if self.ids.insert(seq) {
            self.order.push_back(seq);
            if self.order.len() > REMEMBERED
                && let Some(old) = self.order.pop_front()
            {
                self.ids.remove(&old);
            }
        }
    }

    fn contains(&self, seq: u64) -> bool {
        self.ids.contains(&seq)
    }
}

/// Renders messages fenced with a fresh random nonce no body contains.
fn render(messages: &[Message], heading: &str) -> String {
    canopy_core::render::render_fenced(messages, heading, || {
        canopy_sys::random_hex(8).unwrap_or_else(|_| format!("{:x}", std::process::id()))
    })
}

/// Where the input came from, for the harness (the scripted one matches rules on it).
fn context_of(kind: &str, messages: &[Message]) -> InputContext {
    let last = messages.last();
    InputContext {
        kind: kind.to_owned(),
        sender: last.map(|m| m.sender.handle.to_string()),
        channel: last.map(|m| m.channel.to_string()),
        topic: last.map(|m| m.topic.to_string()),
    }
}

/// A finished turn-start delivery, reported back to the session loop.
struct Delivered {
    /// Whether a turn started with it (otherwise the messages are still pending).
    started: bool,
}

async fn run(context: SessionContext, mut stop: oneshot::Receiver<()>, mut commands: mpsc::Receiver<SessionCommand>) {
    let SessionContext { assignment, options, runner_id, mcp_url, reports, exits } = context;
    let reporter = Reporter { agent: assignment.agent.clone(), incarnation: assignment.incarnation, tx: reports };
    let settings = &options.settings;
    let mailbox = Mailbox {
        api: options.api.clone(),
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
        cwd: agent_dir.join("work"),
        prompt: match assignment.prompt_mode {
            PromptModeWire::Replace => PromptMode::Replace(assignment.system_prompt.clone()),
            PromptModeWire::Append => PromptMode::Append(assignment.system_prompt.clone()),
        },
        mcp_url,
        mcp_token: assignment.token.clone(),
        env,
        model: harness.model.clone(),
        provider: harness.provider.clone(),
        script: assignment.script.as_ref().map(|s| (s.name.clone(), s.text.clone())),
        max_line_bytes: settings.max_line_bytes,
        ready_timeout: settings.ready_timeout,
    };
    let (session, mut events) = match Session::launch(spec, 1024).await {
        Ok(started) => started,
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

    // The first input: who the agent is, and everything that waited while it was offline.
    let mut seen = Seen::default();
    let waiting = mailbox.pull().await.map(|p| p.messages).unwrap_or_default();
    let mut first = start_input(&assignment);
    if !waiting.is_empty() {
        first.push_str("\n\n");
        first.push_str(&render(&waiting, "Messages that arrived while you were offline:"));
    }
    let context = context_of("start", &[]);
    match session.send(&format!("start-{}", assignment.incarnation), &first, &context, SendMode::NextTurn).await {
        Ok(SendOutcome::Started { .. }) => {
            for m in &waiting {
                seen.insert(m.seq);
            }
            mailbox.ack(waiting.iter().map(|m| m.seq).collect()).await;
        }
        Ok(outcome) => tracing::warn!(?outcome, "the first input was not taken"),
        Err(e) => tracing::warn!(error = %e, "the first input was not delivered"),
    }

    let mut stopping = false;
    let mut malformed = 0u64;
    let mut session = Some(session);
    let mut turn: Option<String> = None;
    // A doorbell window: (first hint, last hint) since the last delivery.
    let mut hint: Option<(Instant, Instant)> = None;
    let mut delivering = false;
    let (delivered_tx, mut delivered_rx) = mpsc::channel::<Delivered>(4);
    let mut resync = tokio::time::interval(settings.delivery_resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let seen = Arc::new(tokio::sync::Mutex::new(seen));
    loop {
        let due = match hint {
            Some((first, last)) if turn.is_none() && !delivering && !stopping => {
                Some((last + settings.quiet_window).min(first + settings.coalesce_cap))
            }
            _ => None,
        };
        tokio::select! {
            _ = &mut stop, if !stopping => {
                stopping = true;
                if let Some(session) = session.take() {
                    let grace = settings.stop_grace;
                    tokio::spawn(async move { session.shutdown(grace).await });
                }
            }
            event = events.recv() => {
                let Some(event) = event else { break };
                match &event {
                    HarnessEvent::Exited { .. } => {
                        let reason = event.summary();
                        reporter.event(&event).await;
                        if stopping {
                            reporter.ended(format!("stopped ({reason})"), Presence::Offline).await;
                        }
                        let _ = exits.send(exit(stopping, reason)).await;
                        return;
                    }
                    HarnessEvent::TurnStarted { turn_id } => turn = Some(turn_id.clone()),
                    HarnessEvent::TurnEnded { .. } => {
                        turn = None;
                        // Anything that arrived during the turn goes at the next one.
                        let now = Instant::now();
                        hint = Some(hint.map_or((now, now - settings.quiet_window), |h| h));
                    }
                    HarnessEvent::SteerInjected { input_id, .. } => {
                        if let Some(seq) = input_id.strip_prefix("steer-").and_then(|s| s.parse().ok()) {
                            // Seen before the turn ends, so a turn-start pull never repeats it.
                            seen.lock().await.insert(seq);
                            let mailbox = mailbox.clone();
                            tokio::spawn(async move { mailbox.ack_steered(seq).await });
                        }
                    }
                    HarnessEvent::SteerDropped { .. } => {
                        // It never reached the model: it goes at the next turn start.
                        let now = Instant::now();
                        hint = Some(hint.map_or((now, now), |(first, _)| (first, now)));
                    }
                    HarnessEvent::Malformed { .. } => {
                        malformed += 1;
                        tracing::warn!(malformed, "malformed harness output");
                    }
                    _ => {}
                }
                reporter.event(&event).await;
            }
            command = commands.recv() => match command {
                Some(SessionCommand::Hint) => {
                    let now = Instant::now();
                    hint = Some(hint.map_or((now, now), |(first, _)| (first, now)));
                }
                Some(SessionCommand::Steer { message, reply }) => match (&session, &turn) {
                    // Bound to the turn running now; the harness refuses it if that turn ends
                    // first, and the daemon then rings for a turn-start delivery.
                    (Some(session), Some(turn_id)) => {
                        let (session, turn_id, seen) = (session.clone(), turn_id.clone(), seen.clone());
                        tokio::spawn(async move {
                            let _ = reply.send(steer(session, turn_id, message, &seen).await);
                        });
                    }
                    _ => {
                        let reason = Some("no turn is running".to_owned());
                        let _ = reply.send(SteerReply { steered: false, turn_id: None, reason, written_at_us: None });
                    }
                },
                None => {}
            },
            Some(done) = delivered_rx.recv() => {
                delivering = false;
                if !done.started {
                    let now = Instant::now();
                    hint = Some(hint.map_or((now, now), |h| h));
                }
            }
            _ = resync.tick(), if turn.is_none() && !delivering && hint.is_none() => {
                // Doorbells are at most once: look for pending messages now and then.
                let now = Instant::now();
                hint = Some((now, now - settings.quiet_window));
            }
            () = sleep_until(due) => {
                hint = None;
                if let Some(session) = &session {
                    delivering = true;
                    tokio::spawn(deliver(session.clone(), mailbox.clone(), seen.clone(), delivered_tx.clone()));
                }
            }
        }
    }
    let _ = exits.send(exit(stopping, "the harness's event stream ended".into())).await;
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
    seen: Arc<tokio::sync::Mutex<Seen>>,
    done: mpsc::Sender<Delivered>,
) {
    let mut started = true;
    if let Some(pending) = mailbox.pull().await {
        let mut seen = seen.lock().await;
        let (again, fresh): (Vec<Message>, Vec<Message>) =
            pending.messages.into_iter().partition(|m| seen.contains(m.seq));
        // Injected before (an acknowledgement was lost): acknowledge again, do not repeat.
        mailbox.ack(again.iter().map(|m| m.seq).collect()).await;
        if !fresh.is_empty() && pending.wake {
            let text = render(&fresh, "New messages since your last turn:");
            let context = context_of("message", &fresh);
            let input_id = format!("deliver-{}", fresh.last().map_or(0, |m| m.seq));
            match session.send(&input_id, &text, &context, SendMode::NextTurn).await {
                Ok(SendOutcome::Started { .. }) => {
                    for m in &fresh {
                        seen.insert(m.seq);
                    }
                    mailbox.ack(fresh.iter().map(|m| m.seq).collect()).await;
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
    }
    let _ = done.send(Delivered { started }).await;
}

/// Injects one message into the running turn.
async fn steer(
    session: Arc<Session>,
    turn_id: String,
    message: Message,
    seen: &tokio::sync::Mutex<Seen>,
) -> SteerReply {
    let seq = message.seq;
    if seen.lock().await.contains(seq) {
        let reason = Some("already injected".into());
        return SteerReply { steered: true, turn_id: Some(turn_id), reason, written_at_us: None };
    }
    let text = render(std::slice::from_ref(&message), "A message for you arrived while you were working:");
    let context = context_of("message", std::slice::from_ref(&message));
    let written_at_us =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
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
    let mut text = format!(
        "Session {} started for {} (@{}, role {}). Your home channel is #{}.",
        assignment.incarnation, assignment.display_name, assignment.agent, assignment.role, assignment.home_channel
    );
    if !assignment.charter.trim().is_empty() {
        text.push_str(&format!("\n\nYour charter: {}", assignment.charter.trim()));
    }
    text
}
