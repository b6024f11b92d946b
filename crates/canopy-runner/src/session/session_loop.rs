//! The life of one session, as its steps: `launch` the harness, give it its `first_input`,
//! then loop over harness events (`on_event`), runner commands (`on_command`), due
//! turn-start deliveries (`deliver`) and the stop signal, and `finish` by telling the runner
//! how it ended.
//!
//! Each step asks `LoopState` (pure) what to do and performs it: reports, daemon calls,
//! harness writes, tasks for anything slow. Owns the harness session and the stop ladder.
//! Does not decide restarts or placement: the runner does, from the `SessionExit`.

use std::sync::Arc;

use canopy_core::RunnerId;
use canopy_harness::{HarnessEvent, SendMode, SendOutcome, Session};
use canopy_proto::api::{ContinuityWhen, SessionAssignment, SessionReport};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::options::{LIVE_CALL, RunnerOptions};
use crate::session::deliver::{Delivered, DeliveryTask};
use crate::session::input::FirstInput;
use crate::session::interface::{EndReport, Ending, SessionCommand, SessionContext, SessionExit, answer};
use crate::session::launch::{launch_failed, model_of, prepare};
use crate::session::mailbox::Mailbox;
use crate::session::reports::Reports;
use crate::session::seen::{SharedSeen, with_seen};
use crate::session::state::{CommandStep, EventStep, LoopState};
use crate::session::steer::{interrupt, not_interrupted, refused, steer};

/// Most harness events queued for the loop before the harness's reader waits.
const EVENT_QUEUE: usize = 1024;

/// The session task: one session's life, step by step.
pub(crate) async fn run(
    context: SessionContext,
    stop: oneshot::Receiver<()>,
    commands: mpsc::Receiver<SessionCommand>,
) {
    let SessionContext { previous, assignment, options, runner_id, mcp_url, reports, exits } = context;
    if let Some(previous) = previous
        // Its stop ladder (grace, SIGTERM, grace, SIGKILL) bounds the wait.
        && let Err(e) = previous.await
    {
        tracing::warn!(error = %e, "the agent's previous session task failed; launching anyway");
    }
    let mut session_loop = SessionLoop::new(assignment, options, runner_id, mcp_url, reports, exits);
    let events = match session_loop.launch().await {
        Ok(events) => events,
        Err(ending) => return session_loop.finish(ending).await,
    };
    session_loop.first_input().await;
    let ending = session_loop.turns(events, stop, commands).await;
    session_loop.finish(ending).await;
}

/// One session's loop: what it holds from launch to exit.
pub(crate) struct SessionLoop {
    assignment: SessionAssignment,
    options: RunnerOptions,
    mcp_url: String,
    reports: Reports,
    mailbox: Mailbox,
    exits: mpsc::Sender<SessionExit>,
    /// The harness once launched; handed to its stop ladder when the session stops, so a
    /// session that is stopping has none.
    session: Option<Arc<Session>>,
    seen: SharedSeen,
    state: LoopState,
}

impl SessionLoop {
    fn new(
        assignment: SessionAssignment,
        options: RunnerOptions,
        runner_id: RunnerId,
        mcp_url: String,
        reports: mpsc::Sender<SessionReport>,
        exits: mpsc::Sender<SessionExit>,
    ) -> SessionLoop {
        let model = model_of(&assignment, &options.harnesses);
        let reports = Reports::new(assignment.agent.clone(), assignment.incarnation, model, reports);
        let settings = &options.settings;
        let mailbox = Mailbox {
            api: options.api.with_timeout(LIVE_CALL),
            token: options.token.clone(),
            runner_id,
            agent: assignment.agent.clone(),
            incarnation: assignment.incarnation,
            batch: settings.delivery_batch,
        };
        let seen = SharedSeen::default();
        let state =
            LoopState::new(settings.quiet_window, settings.coalesce_cap, seen.clone(), assignment.run.is_some());
        SessionLoop { assignment, options, mcp_url, reports, mailbox, exits, session: None, seen, state }
    }

    /// Launches the harness and waits until it is ready; the session's end when it cannot.
    async fn launch(&mut self) -> Result<mpsc::Receiver<HarnessEvent>, Ending> {
        self.reports.starting(&self.assignment.harness).await;
        if let Some(repo) = self.assignment.repo.clone().filter(|_| self.assignment.cwd.is_empty()) {
            // A checkout this runner keeps: made (or found) here before the harness starts in it.
            let made = self.options.checkouts.ensure(&self.assignment.agent, &repo).await;
            let (dir, mirror) = made.map_err(|e| {
                Ending::failed(format!("its checkout of {} could not be made on this runner: {e}", repo.name), false)
            })?;
            self.assignment.cwd = dir.display().to_string();
            self.assignment.repo_mirror = Some(mirror.display().to_string());
            self.assignment.cwd_read_only = repo.read_only;
        }
        let spec = prepare(&self.assignment, &self.options, &self.mcp_url)?;
        let kind = spec.kind;
        let (session, events) = Session::launch(spec, EVENT_QUEUE).await.map_err(|e| launch_failed(kind, e))?;
        let pid = session.pid();
        let detail = serde_json::json!({ "pid": pid });
        self.reports.activity("session_ready", format!("harness ready (pid {pid})"), detail).await;
        self.session = Some(Arc::new(session));
        Ok(events)
    }

    /// The first input: who the agent is, and everything that waited while it was offline;
    /// for a subagent run, its brief (a run starts fresh and needs no continuity block).
    async fn first_input(&mut self) {
        let Some(session) = self.session.clone() else { return };
        let (waiting, redelivered, continuity) = match self.assignment.run {
            Some(_) => Default::default(),
            None => {
                let pending = self.mailbox.pull().await.map(|p| (p.messages, p.redelivered)).unwrap_or_default();
                (pending.0, pending.1, self.mailbox.continuity(ContinuityWhen::Start).await)
            }
        };
        let input = FirstInput::compose(&self.assignment, continuity, &waiting, &redelivered);
        match session.send(&input.input_id, &input.text, &input.context, SendMode::NextTurn).await {
            Ok(SendOutcome::Started { turn_id }) => {
                self.state.started_turn(&turn_id);
                with_seen(&self.seen, |s| input.seqs.iter().for_each(|seq| s.insert(*seq)));
                self.mailbox.ack(input.seqs).await;
                self.reports.activity("input", input.summary, serde_json::Value::Null).await;
            }
            Ok(outcome) => tracing::warn!(?outcome, "the first input was not taken"),
            Err(e) => tracing::warn!(error = %e, "the first input was not delivered"),
        }
    }

    /// The loop over harness events, runner commands, due deliveries and the stop signal,
    /// until the harness has exited: how the session ends.
    async fn turns(
        &mut self,
        mut events: mpsc::Receiver<HarnessEvent>,
        mut stop: oneshot::Receiver<()>,
        mut commands: mpsc::Receiver<SessionCommand>,
    ) -> Ending {
        let (delivered_tx, mut delivered_rx) = mpsc::channel::<Delivered>(4);
        let mut resync = tokio::time::interval(self.options.settings.delivery_resync);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let due = self.state.due().map(Instant::from_std);
            let stopping = self.state.stopping();
            tokio::select! {
                // The slot's sender dropped (or sent): the runner asks the session to stop.
                _ = &mut stop, if !stopping => self.begin_stop(),
                event = events.recv() => match event {
                    Some(event) => if let Some(ending) = self.on_event(event).await {
                        return ending;
                    },
                    None => return self.state.stream_ended(),
                },
                command = commands.recv(), if !self.state.commands_closed() => self.on_command(command),
                Some(done) = delivered_rx.recv() => self.state.delivered(done, now()),
                // Doorbells are at most once: look for pending messages now and then.
                _ = resync.tick(), if self.state.resync_wanted() => self.state.resync(now()),
                () = sleep_until(due) => self.deliver(&delivered_tx),
            }
            // A draining runner's session ends at a turn boundary, and only there.
            if self.state.drain_due() {
                self.begin_stop();
            }
        }
    }

    /// Acts on a harness event and reports it; the session's end once the harness exited.
    async fn on_event(&mut self, event: HarnessEvent) -> Option<Ending> {
        match self.state.on_event(&event, now()) {
            EventStep::Report => {}
            EventStep::Stop => self.begin_stop(),
            EventStep::FinishRun { done, report } => {
                tokio::spawn(self.mailbox.clone().finish_run(done, report));
            }
            EventStep::AckSteered(seq) => {
                let mailbox = self.mailbox.clone();
                tokio::spawn(async move { mailbox.ack_steered(seq).await });
            }
            EventStep::Exit(ending) => {
                self.reports.event(&event).await;
                return Some(ending);
            }
        }
        self.reports.event(&event).await;
        None
    }

    /// Acts on a runner command; anything that waits on the harness runs as its own task,
    /// so a slow write never holds up the loop.
    fn on_command(&mut self, command: Option<SessionCommand>) {
        match self.state.on_command(command, now()) {
            CommandStep::Nothing => {}
            // The state steers and interrupts only while the session holds its harness, so
            // the `None` arms answer what cannot happen rather than leave the runner waiting.
            CommandStep::Steer { message, turn_id, reply } => match self.session.clone() {
                Some(session) => {
                    let seen = self.seen.clone();
                    tokio::spawn(async move { answer(reply, steer(session, turn_id, message, &seen).await) });
                }
                None => answer(reply, refused("the session is stopping".into())),
            },
            CommandStep::Interrupt { turn_id, reply } => match self.session.clone() {
                Some(session) => {
                    tokio::spawn(async move { answer(reply, interrupt(session, turn_id).await) });
                }
                None => answer(reply, not_interrupted("the session is stopping")),
            },
            CommandStep::RefuseSteer { reply, answer: refusal } => answer(reply, refusal),
            CommandStep::RefuseInterrupt { reply, answer: refusal } => answer(reply, refusal),
            CommandStep::Stop => self.begin_stop(),
        }
    }

    /// Starts the turn-start delivery that is due, if one may start now, as its own task;
    /// it reports back on `done`.
    fn deliver(&mut self, done: &mpsc::Sender<Delivered>) {
        let Some(session) = self.session.clone() else { return };
        let Some(delivery) = self.state.start_delivery(now()) else { return };
        let task = DeliveryTask {
            mailbox: self.mailbox.clone(),
            seen: self.seen.clone(),
            reports: self.reports.clone(),
            continuity_owed: delivery.continuity,
            done: done.clone(),
        };
        tokio::spawn(task.run(session));
    }

    /// Starts the stop ladder once; the loop goes on until the harness has exited.
    fn begin_stop(&mut self) {
        if self.state.begin_stop()
            && let Some(session) = self.session.take()
        {
            let grace = self.options.settings.stop_grace;
            tokio::spawn(async move { session.shutdown(grace).await });
        }
    }

    /// Reports the session's end, if the ending asks for a report, and tells the runner.
    async fn finish(self, ending: Ending) {
        // What the session left on its branch reaches the daemon before anything else hears
        // of the end (a drained or failed-over agent continues from it elsewhere).
        if let Some(repo) = &self.assignment.repo {
            match self.assignment.repo_mirror.as_deref() {
                Some(mirror) if !repo.read_only && !self.options.checkouts.keeps(&self.assignment.agent) => {
                    let (mirror, cwd) = (std::path::Path::new(mirror), std::path::Path::new(&self.assignment.cwd));
                    self.options.checkouts.publish_here(repo, mirror, cwd).await;
                }
                _ => self.options.checkouts.save(&self.assignment.agent).await,
            }
        }
        match ending.report {
            EndReport::Nothing => {}
            EndReport::Failed => {
                self.reports.activity("session_failed", ending.reason.clone(), serde_json::Value::Null).await;
            }
            EndReport::Stopped => self.reports.ended(format!("stopped ({})", ending.reason)).await,
        }
        let exit = ending.exit(&self.assignment.agent, self.assignment.incarnation);
        if self.exits.send(exit).await.is_err() {
            // The runner stopped listening (it is shutting down and joins this task): the
            // session's own reports already said how it ended.
            tracing::debug!("the runner no longer takes session ends; this one goes unrecorded there");
        }
    }
}

fn now() -> std::time::Instant {
    Instant::now().into_std()
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}
