//! The session loop's decisions: what it does on a harness event, a runner command, a due
//! delivery or the end of the harness, given its state. Plain values in, a step out, the
//! clock passed in: the loop (`session_loop`) performs the step.
//!
//! Owns the per-session flags (the fatal reason, a run's one report and its last words, the
//! malformed-line count, whether commands can still arrive) and drives the turn scheduler.
//! Does not talk to the harness, the daemon or the runner.

use std::time::{Duration, Instant};

use canopy_core::schedule::{Delivery, TurnSchedule};
use canopy_core::{Message, Seq};
use canopy_harness::{HarnessEvent, TurnStatus};
use canopy_proto::api::{InterruptReply, SteerReply};
use tokio::sync::oneshot;

use crate::session::deliver::Delivered;
use crate::session::interface::{EndReport, Ending, SessionCommand};
use crate::session::seen::{SharedSeen, with_seen};
use crate::session::steer::{not_interrupted, refused, steered_seq};

/// What the loop does with a harness event (after which it reports the event, unless the
/// session ends).
#[derive(Debug, PartialEq)]
pub(crate) enum EventStep {
    /// Nothing but the report.
    Report,
    /// Start the stop ladder: the session cannot succeed without the operator.
    Stop,
    /// Hand the run's end to the daemon: its last words, and whether its turn completed.
    FinishRun { done: bool, report: String },
    /// Acknowledge the steered message (already marked injected).
    AckSteered(Seq),
    /// The harness exited: the session ends this way.
    Exit(Ending),
}

/// What the loop does with a runner command.
pub(crate) enum CommandStep {
    /// Nothing more (a doorbell opened the delivery window).
    Nothing,
    /// Inject `message` into the running turn `turn_id`, then answer.
    Steer { message: Message, turn_id: String, reply: oneshot::Sender<SteerReply> },
    /// Stop the running turn `turn_id`, then answer.
    Interrupt { turn_id: String, reply: oneshot::Sender<InterruptReply> },
    /// Answer a steer at once: it cannot go to the harness.
    RefuseSteer { reply: oneshot::Sender<SteerReply>, answer: SteerReply },
    /// Answer an interrupt at once: there is nothing to interrupt.
    RefuseInterrupt { reply: oneshot::Sender<InterruptReply>, answer: InterruptReply },
    /// The runner dropped the session's slot: nothing can reach it any more, so it stops.
    Stop,
}

/// The session loop's state.
pub(crate) struct LoopState {
    /// When the next turn-start delivery is due: the pure rules, driven with the clock here.
    schedule: TurnSchedule,
    /// What was injected or is being delivered; shared with the delivery and steer tasks.
    seen: SharedSeen,
    /// Whether the session is a subagent run: it reports once, when its first turn ends.
    run: bool,
    run_reported: bool,
    /// The harness's last text: a run's report.
    last_text: String,
    /// Why the session is being stopped for the operator to fix, once it must be.
    fatal: Option<String>,
    /// The limit its sandbox ended it for, the reason its exit is told with.
    limit: Option<String>,
    malformed: u64,
    /// The runner dropped the session's slot: no command can arrive any more.
    commands_closed: bool,
    /// The runner is draining: the session ends at its next turn boundary.
    draining: bool,
    /// A turn a send started whose end has not been seen yet (its events may still be on
    /// their way): the session is not at a turn boundary until it ends.
    awaiting: Option<String>,
    /// The last turns that ended, for a send whose answer comes after its turn's end.
    ended: std::collections::VecDeque<String>,
}

impl LoopState {
    pub fn new(quiet: Duration, cap: Duration, seen: SharedSeen, run: bool) -> LoopState {
        LoopState {
            schedule: TurnSchedule::new(quiet, cap),
            seen,
            run,
            run_reported: false,
            last_text: String::new(),
            fatal: None,
            limit: None,
            malformed: 0,
            commands_closed: false,
            draining: false,
            awaiting: None,
            ended: std::collections::VecDeque::new(),
        }
    }

    /// A send started turn `turn_id` (the first input, or a turn-start delivery).
    pub fn started_turn(&mut self, turn_id: &str) {
        if !self.ended.iter().any(|t| t == turn_id) {
            self.awaiting = Some(turn_id.to_owned());
        }
    }

    /// Whether a draining session is at a turn boundary now, so it may end: no turn runs, no
    /// delivery is in flight and no turn a send started is still to end.
    pub fn drain_due(&self) -> bool {
        self.draining
            && !self.run
            && !self.schedule.stopping()
            && self.schedule.turn().is_none()
            && !self.schedule.delivering()
            && self.awaiting.is_none()
    }

    fn turn_over(&mut self, turn_id: &str) {
        if self.awaiting.as_deref() == Some(turn_id) {
            self.awaiting = None;
        }
        self.ended.push_back(turn_id.to_owned());
        if self.ended.len() > 8 {
            self.ended.pop_front();
        }
    }

    /// What to do on `event`, at `now`.
    pub fn on_event(&mut self, event: &HarnessEvent, now: Instant) -> EventStep {
        match event {
            HarnessEvent::Exited { .. } => {
                let reason = self.limit.take().unwrap_or_else(|| event.summary());
                return EventStep::Exit(self.exited(reason));
            }
            HarnessEvent::LimitReached { reason } => self.limit = Some(reason.clone()),
            HarnessEvent::TurnStarted { turn_id } => self.schedule.turn_started(turn_id),
            HarnessEvent::ModelError { text, fatal: true } if self.fatal.is_none() => {
                self.fatal = Some(text.clone());
                return EventStep::Stop;
            }
            // A run's last words are its report; a standing session keeps none.
            HarnessEvent::Text { text, .. } if self.run => self.last_text.clone_from(text),
            HarnessEvent::TurnEnded { status, turn_id } if self.run && !self.run_reported => {
                self.turn_over(turn_id);
                self.schedule.run_ended();
                self.run_reported = true;
                let done = *status == TurnStatus::Completed;
                return EventStep::FinishRun { done, report: std::mem::take(&mut self.last_text) };
            }
            // Anything that arrived during the turn goes at the next one.
            HarnessEvent::TurnEnded { turn_id, .. } => {
                self.turn_over(turn_id);
                self.schedule.turn_ended(now);
            }
            HarnessEvent::SteerInjected { input_id, .. } => {
                if let Some(seq) = steered_seq(input_id) {
                    // Seen before the turn ends, so a turn-start pull never repeats it.
                    with_seen(&self.seen, |s| s.insert(seq));
                    return EventStep::AckSteered(seq);
                }
            }
            // It never reached the model: it goes at the next turn start.
            HarnessEvent::SteerDropped { .. } => self.schedule.hint(now),
            HarnessEvent::CompactionEnded => self.schedule.compacted(),
            HarnessEvent::Malformed { .. } => {
                self.malformed += 1;
                tracing::warn!(malformed = self.malformed, "malformed harness output");
            }
            _ => {}
        }
        EventStep::Report
    }

    /// How the session ends now that the harness exited (`reason`).
    fn exited(&mut self, reason: String) -> Ending {
        // Stopped because it cannot succeed without the operator: no restart.
        if let Some(fatal) = self.fatal.take() {
            return Ending { requested: false, fatal: true, reason: fatal, report: EndReport::Nothing };
        }
        let stopping = self.schedule.stopping();
        let report = if stopping { EndReport::Stopped } else { EndReport::Nothing };
        let reason = match self.draining && stopping {
            true => "moved: its runner is draining".to_owned(),
            false => reason,
        };
        Ending { requested: stopping, fatal: false, reason, report }
    }

    /// How the session ends when the harness's events stop without an exit.
    pub fn stream_ended(&self) -> Ending {
        Ending {
            requested: self.schedule.stopping(),
            fatal: false,
            reason: "the harness's event stream ended".into(),
            report: EndReport::Nothing,
        }
    }

    /// What to do with a runner command (`None`: the runner dropped the session), at `now`.
    pub fn on_command(&mut self, command: Option<SessionCommand>, now: Instant) -> CommandStep {
        let Some(command) = command else {
            self.commands_closed = true;
            return CommandStep::Stop;
        };
        match command {
            SessionCommand::Hint => {
                self.schedule.hint(now);
                CommandStep::Nothing
            }
            // Bound to the turn running now; the harness refuses it if that turn ends first,
            // and the daemon then rings for a turn-start delivery.
            SessionCommand::Steer { message, reply } => match self.running_turn() {
                Some(turn_id) => CommandStep::Steer { message, turn_id, reply },
                None => CommandStep::RefuseSteer { reply, answer: refused("no turn is running".into()) },
            },
            SessionCommand::Drain(draining) => {
                self.draining = draining;
                CommandStep::Nothing
            }
            SessionCommand::Interrupt { reply } => match self.running_turn() {
                Some(turn_id) => CommandStep::Interrupt { turn_id, reply },
                None if self.schedule.stopping() => {
                    CommandStep::RefuseInterrupt { reply, answer: not_interrupted("the session is stopping") }
                }
                None => CommandStep::RefuseInterrupt { reply, answer: not_interrupted("no turn is running") },
            },
        }
    }

    /// The turn running now, while the harness is still the session's (not stopping).
    fn running_turn(&self) -> Option<String> {
        (!self.schedule.stopping()).then(|| self.schedule.turn().map(str::to_owned)).flatten()
    }

    /// Starts the turn-start delivery due at `now`, if one may start (none while stopping:
    /// the schedule is never due then).
    pub fn start_delivery(&mut self, now: Instant) -> Option<Delivery> {
        self.schedule.start_delivery(now)
    }

    /// A delivery task finished.
    pub fn delivered(&mut self, done: Delivered, now: Instant) {
        if let Some(turn) = &done.turn {
            self.started_turn(turn);
        }
        self.schedule.delivered(done.started, done.continuity, now);
    }

    /// When the next turn-start delivery is due, if one is.
    pub fn due(&self) -> Option<Instant> {
        self.schedule.due()
    }

    /// Whether the idle resync may look for pending messages now.
    pub fn resync_wanted(&self) -> bool {
        self.schedule.resync_wanted()
    }

    /// The idle resync: doorbells are at most once, so look for pending messages now.
    pub fn resync(&mut self, now: Instant) {
        self.schedule.resync(now);
    }

    /// Marks the session stopping; `true` only the first time (the caller then starts the
    /// stop ladder; the loop goes on until the harness has exited).
    pub fn begin_stop(&mut self) -> bool {
        if self.schedule.stopping() {
            return false;
        }
        self.schedule.stop();
        true
    }

    pub fn stopping(&self) -> bool {
        self.schedule.stopping()
    }

    pub fn commands_closed(&self) -> bool {
        self.commands_closed
    }
}

#[cfg(test)]
mod tests;
