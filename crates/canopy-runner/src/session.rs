//! One session: a task that owns a harness process for one (agent, incarnation).
//!
//! It launches the harness, gives it its first input (who it is and its charter), turns
//! every harness event into a report (presence and activity), and on exit tells the
//! runner whether the exit was asked for. Every report carries the incarnation, so the
//! daemon ignores what a stale session says.

use canopy_core::Presence;
use canopy_harness::{HarnessEvent, HarnessKind, InputContext, LaunchSpec, PromptMode, SendMode, Session};
use canopy_proto::api::{ReportedActivity, SessionAssignment, SessionReport};
use tokio::sync::{mpsc, oneshot};

use crate::runner::RunnerOptions;

/// What the runner keeps for a running session.
pub(crate) struct SessionSlot {
    pub agent: String,
    pub incarnation: u64,
    pub token: String,
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
    pub mcp_url: String,
    pub reports: mpsc::Sender<SessionReport>,
    pub exits: mpsc::Sender<SessionExit>,
}

pub(crate) fn spawn(context: SessionContext) -> SessionSlot {
    let (stop_tx, stop_rx) = oneshot::channel();
    let agent = context.assignment.agent.clone();
    let incarnation = context.assignment.incarnation;
    let token = context.assignment.token.clone();
    let span = tracing::info_span!("session", %agent, incarnation);
    let task = tokio::spawn(tracing::Instrument::instrument(run(context, stop_rx), span));
    SessionSlot { agent, incarnation, token, stop: Some(stop_tx), task }
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

async fn run(context: SessionContext, mut stop: oneshot::Receiver<()>) {
    let SessionContext { assignment, options, mcp_url, reports, exits } = context;
    let reporter = Reporter { agent: assignment.agent.clone(), incarnation: assignment.incarnation, tx: reports };
    let settings = &options.settings;
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
    let spec = LaunchSpec {
        kind,
        program: options.scripted_program.clone(),
        program_args: options.scripted_args.clone(),
        session_dir: agent_dir.join(assignment.incarnation.to_string()),
        cwd: agent_dir.join("work"),
        prompt: PromptMode::Replace(assignment.system_prompt.clone()),
        mcp_url,
        mcp_token: assignment.token.clone(),
        env: vec![
            ("CANOPY_AGENT".into(), assignment.agent.clone()),
            ("CANOPY_HOME_CHANNEL".into(), assignment.home_channel.clone()),
            ("CANOPY_INCARNATION".into(), assignment.incarnation.to_string()),
        ],
        script: assignment.script.as_ref().map(|s| (s.name.clone(), s.text.clone())),
        max_line_bytes: settings.max_line_bytes,
        ready_timeout: settings.ready_timeout,
    };
    let (session, mut events) = match Session::launch(spec, 256).await {
        Ok(started) => started,
        Err(e) => {
            let reason = format!("the harness did not start: {e}");
            reporter.activity("session_failed", reason.clone(), serde_json::Value::Null).await;
            let _ = exits.send(exit(false, reason)).await;
            return;
        }
    };
    reporter
        .activity(
            "session_ready",
            format!("harness ready (pid {})", session.pid()),
            serde_json::json!({ "pid": session.pid() }),
        )
        .await;

    let first = start_input(&assignment);
    let context = InputContext { kind: "start".into(), ..InputContext::default() };
    match session.send(&format!("start-{}", assignment.incarnation), &first, &context, SendMode::NextTurn).await {
        Ok(outcome) => tracing::debug!(?outcome, "first input delivered"),
        Err(e) => tracing::warn!(error = %e, "the first input was not delivered"),
    }

    let mut stopping = false;
    let mut malformed = 0u64;
    let mut session = Some(session);
    loop {
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
                if let HarnessEvent::Exited { .. } = event {
                    let reason = event.summary();
                    reporter.event(&event).await;
                    if stopping {
                        reporter.ended(format!("stopped ({reason})"), Presence::Offline).await;
                    }
                    let _ = exits.send(exit(stopping, reason)).await;
                    return;
                }
                if let HarnessEvent::Malformed { .. } = event {
                    malformed += 1;
                    tracing::warn!(malformed, "malformed harness output");
                }
                reporter.event(&event).await;
            }
        }
    }
    let _ = exits.send(exit(stopping, "the harness's event stream ended".into())).await;
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
