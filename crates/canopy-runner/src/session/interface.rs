//! What passes between the runner and a session task: the commands the runner sends it, what
//! it is started with, and how it tells the runner it ended (`SessionExit`, from the
//! `Ending` a step of the session loop decides).
//!
//! Owns these values and the answering of a command's reply. Does not run anything.

use canopy_core::{Incarnation, Message, RunnerId};
use canopy_proto::api::{InterruptReply, SessionAssignment, SessionReport, SteerReply};
use tokio::sync::{mpsc, oneshot};

use crate::options::RunnerOptions;

/// What the runner can ask of a session.
pub(crate) enum SessionCommand {
    /// New messages may be pending (a doorbell).
    Hint,
    /// Inject this message into the running turn, and say whether it worked.
    Steer { message: Message, reply: oneshot::Sender<SteerReply> },
    /// Stop the running turn (an operator's `agents.interrupt`); the session stays up.
    Interrupt { reply: oneshot::Sender<InterruptReply> },
    /// The runner is draining (`true`): end the session at its next turn boundary, never
    /// mid-turn, so it starts on another runner; `false` takes that back. A run ignores it
    /// (its one turn is its whole life).
    Drain(bool),
}

/// A session's end, as the runner needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// What a session task is started with.
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

/// How a session ends, as a step of the session loop decides it: what the runner is told,
/// and what is reported to the daemon first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ending {
    /// Whether the runner asked for it (a stop) rather than the harness going away.
    pub requested: bool,
    /// Whether restarting cannot help without the operator.
    pub fatal: bool,
    pub reason: String,
    pub report: EndReport,
}

/// The report a session sends before it tells the runner it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndReport {
    /// None: the harness's own `exited` event was reported, or the runner reports it.
    Nothing,
    /// A `session_failed` activity naming the reason: it never started.
    Failed,
    /// A `session_ended` report, offline, `stopped (<reason>)`: it was asked to stop.
    Stopped,
}

impl Ending {
    /// The session did not start (or cannot go on): reported as `session_failed`.
    pub fn failed(reason: String, fatal: bool) -> Ending {
        Ending { requested: false, fatal, reason, report: EndReport::Failed }
    }

    /// What the runner is told.
    pub fn exit(self, agent: &str, incarnation: Incarnation) -> SessionExit {
        SessionExit {
            agent: agent.to_owned(),
            incarnation,
            requested: self.requested,
            fatal: self.fatal,
            reason: self.reason,
        }
    }
}

/// Answers a runner command. A refused answer means the runner stopped waiting for it (its
/// request task gave up at the poster's deadline, or the runner is stopping): nobody is left
/// to tell, so the answer is dropped, noted at debug.
pub(crate) fn answer<T>(reply: oneshot::Sender<T>, value: T) {
    if reply.send(value).is_err() {
        tracing::debug!("a command's answer found nobody waiting for it");
    }
}
