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
//!
//! This file holds the runner's handle on a session (`SessionSlot`, `spawn`); the steps live
//! in `session_loop` (`SessionLoop`), their decisions in `state`, and the parts they use in
//! the other files of `session/`. No production file in `session/` imports this file or the
//! runner.

mod deliver;
mod input;
mod interface;
mod launch;
mod mailbox;
mod reports;
mod seen;
mod session_loop;
mod state;
mod steer;

use canopy_core::Incarnation;
use tokio::sync::{mpsc, oneshot};

pub(crate) use interface::{SessionCommand, SessionContext, SessionExit};
pub(crate) use reports::ended_report;
pub(crate) use steer::{not_interrupted, refused};

/// How many commands (doorbells, steers, interrupts) wait for a session before the runner's
/// doorbells fold and its steers wait.
const COMMAND_QUEUE: usize = 256;

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
        if let Err(e) = (&mut self.task).await {
            tracing::error!(agent = %self.agent, incarnation = %self.incarnation, error = %e, "a session task failed");
        }
    }
}

/// Starts the task of one session.
pub(crate) fn spawn(context: SessionContext) -> SessionSlot {
    let (stop_tx, stop_rx) = oneshot::channel();
    let (commands, commands_rx) = mpsc::channel(COMMAND_QUEUE);
    let agent = context.assignment.agent.clone();
    let incarnation = context.assignment.incarnation;
    let token = context.assignment.token.clone();
    let span = tracing::info_span!("session", %agent, incarnation = %incarnation);
    let task = tokio::spawn(tracing::Instrument::instrument(session_loop::run(context, stop_rx, commands_rx), span));
    SessionSlot { agent, incarnation, token, commands, stop: Some(stop_tx), task }
}

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
