//! The session loop's decisions, step by step, as tables of values: what `on_event`,
//! `on_command`, the delivery schedule and the end of the harness come to for a given
//! state. No harness, no NATS, the clock passed in.

#![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

use std::time::{Duration, Instant};

use canopy_core::Seq;
use canopy_core::schedule::Delivery;
use canopy_harness::{HarnessEvent, TurnStatus};
use tokio::sync::oneshot;

use super::{CommandStep, EventStep, LoopState};
use crate::session::deliver::Delivered;
use crate::session::interface::{EndReport, Ending, SessionCommand};
use crate::session::seen::{SharedSeen, with_seen};
use crate::session::testing::message;

const QUIET: Duration = Duration::from_millis(100);
const CAP: Duration = Duration::from_millis(500);

fn state(run: bool) -> (LoopState, SharedSeen) {
    let seen = SharedSeen::default();
    (LoopState::new(QUIET, CAP, seen.clone(), run), seen)
}

fn started(turn: &str) -> HarnessEvent {
    HarnessEvent::TurnStarted { turn_id: turn.into() }
}

fn ended(turn: &str, status: TurnStatus) -> HarnessEvent {
    HarnessEvent::TurnEnded { turn_id: turn.into(), status }
}

fn exited() -> HarnessEvent {
    HarnessEvent::Exited { code: Some(0), signal: None }
}

fn steer_command() -> (SessionCommand, oneshot::Receiver<canopy_proto::api::SteerReply>) {
    let (reply, answer) = oneshot::channel();
    (SessionCommand::Steer { message: message(9, "@a look"), reply }, answer)
}

fn interrupt_command() -> (SessionCommand, oneshot::Receiver<canopy_proto::api::InterruptReply>) {
    let (reply, answer) = oneshot::channel();
    (SessionCommand::Interrupt { reply }, answer)
}

// on_event

#[test]
fn the_end_of_a_turn_makes_what_waited_during_it_due_at_once() {
    let (mut state, _) = state(false);
    let t0 = Instant::now();
    assert_eq!(state.on_event(&started("t1"), t0), EventStep::Report);
    assert!(state.on_command(Some(SessionCommand::Hint), t0).is_nothing());
    assert_eq!(state.due(), None, "nothing is due while a turn runs");
    assert_eq!(state.on_event(&ended("t1", TurnStatus::Completed), t0 + QUIET), EventStep::Report);
    assert_eq!(state.due(), Some(t0), "due at once, from the first doorbell");
}

#[test]
fn a_fatal_model_error_stops_the_session_once_and_its_exit_is_fatal() {
    let (mut state, _) = state(false);
    let now = Instant::now();
    let fatal = |text: &str| HarnessEvent::ModelError { text: text.into(), fatal: true };
    assert_eq!(state.on_event(&fatal("credential refused"), now), EventStep::Stop);
    assert!(state.begin_stop(), "the loop starts the stop ladder");
    assert_eq!(state.on_event(&fatal("again"), now), EventStep::Report, "only the first one stops it");
    let ending =
        Ending { requested: false, fatal: true, reason: "credential refused".into(), report: EndReport::Nothing };
    assert_eq!(state.on_event(&exited(), now), EventStep::Exit(ending));
}

#[test]
fn an_exit_after_a_stop_is_requested_and_reported_as_stopped() {
    let (mut state, _) = state(false);
    assert!(state.begin_stop());
    assert!(!state.begin_stop(), "the stop ladder starts once");
    let EventStep::Exit(ending) = state.on_event(&exited(), Instant::now()) else { panic!("an exit ends the loop") };
    assert!(ending.requested && !ending.fatal);
    assert_eq!(ending.report, EndReport::Stopped);
    assert_eq!(ending.reason, exited().summary());
}

#[test]
fn an_exit_on_its_own_is_a_crash_for_the_runner_to_judge() {
    let (mut state, _) = state(false);
    let EventStep::Exit(ending) = state.on_event(&exited(), Instant::now()) else { panic!("an exit ends the loop") };
    assert_eq!((ending.requested, ending.fatal, ending.report), (false, false, EndReport::Nothing));
}

#[test]
fn a_session_its_sandbox_ended_at_a_limit_crashes_with_the_limit_as_its_reason() {
    let (mut state, _) = state(false);
    let limit = HarnessEvent::LimitReached { reason: "memory limit 2 GiB reached".into() };
    assert_eq!(state.on_event(&limit, Instant::now()), EventStep::Report, "the limit is reported as activity");
    let killed = HarnessEvent::Exited { code: None, signal: Some(9) };
    let EventStep::Exit(ending) = state.on_event(&killed, Instant::now()) else { panic!("an exit ends the loop") };
    assert_eq!((ending.requested, ending.fatal), (false, false), "a crash, restarted like any");
    assert_eq!(ending.reason, "memory limit 2 GiB reached");
}

#[test]
fn a_run_reports_its_last_words_once_when_its_first_turn_ends() {
    let (mut state, _) = state(true);
    let now = Instant::now();
    state.on_event(&started("t1"), now);
    state.on_event(&HarnessEvent::Text { turn_id: None, text: "draft".into() }, now);
    state.on_event(&HarnessEvent::Text { turn_id: None, text: "final".into() }, now);
    let finish = state.on_event(&ended("t1", TurnStatus::Completed), now);
    assert_eq!(finish, EventStep::FinishRun { done: true, report: "final".into() });
    assert_eq!(state.due(), None, "nothing more is delivered to a finished run");
    assert_eq!(state.on_event(&ended("t2", TurnStatus::Completed), now), EventStep::Report, "it reports once");
}

#[test]
fn a_run_whose_turn_did_not_complete_failed() {
    let (mut state, _) = state(true);
    let finish = state.on_event(&ended("t1", TurnStatus::Interrupted), Instant::now());
    assert_eq!(finish, EventStep::FinishRun { done: false, report: String::new() });
}

#[test]
fn an_injected_steer_is_seen_at_once_and_acknowledged() {
    let (mut state, seen) = state(false);
    let injected =
        |input_id: &str| HarnessEvent::SteerInjected { input_id: input_id.into(), turn_id: "t1".into(), position: 0 };
    assert_eq!(state.on_event(&injected("steer-9"), Instant::now()), EventStep::AckSteered(Seq(9)));
    assert!(with_seen(&seen, |s| s.contains(Seq(9))), "a turn-start pull never repeats it");
    assert_eq!(state.on_event(&injected("start-1"), Instant::now()), EventStep::Report);
}

#[test]
fn a_dropped_steer_goes_at_the_next_turn_start() {
    let (mut state, _) = state(false);
    let t0 = Instant::now();
    let dropped = HarnessEvent::SteerDropped { input_id: "steer-9".into(), reason: "interrupted".into() };
    assert_eq!(state.on_event(&dropped, t0), EventStep::Report);
    assert_eq!(state.due(), Some(t0 + QUIET));
}

#[test]
fn after_a_compaction_the_next_delivery_carries_the_continuity_block() {
    let (mut state, _) = state(false);
    let t0 = Instant::now();
    state.on_event(&HarnessEvent::CompactionEnded, t0);
    state.on_command(Some(SessionCommand::Hint), t0);
    assert_eq!(state.start_delivery(t0 + QUIET), Some(Delivery { continuity: true }));
    state.delivered(Delivered { started: true, continuity: true, turn: None }, t0 + QUIET);
    state.on_command(Some(SessionCommand::Hint), t0 + QUIET);
    assert_eq!(state.start_delivery(t0 + QUIET * 2), Some(Delivery { continuity: false }), "the debt is paid");
}

#[test]
fn malformed_output_is_counted_and_reported() {
    let (mut state, _) = state(false);
    let malformed = HarnessEvent::Malformed { reason: "not json".into() };
    assert_eq!(state.on_event(&malformed, Instant::now()), EventStep::Report);
    assert_eq!(state.on_event(&malformed, Instant::now()), EventStep::Report);
    assert_eq!(state.malformed, 2);
}

// on_command

impl CommandStep {
    fn is_nothing(&self) -> bool {
        matches!(self, CommandStep::Nothing)
    }
}

#[test]
fn a_doorbell_opens_the_delivery_window() {
    let (mut state, _) = state(false);
    let t0 = Instant::now();
    assert!(state.on_command(Some(SessionCommand::Hint), t0).is_nothing());
    assert_eq!(state.due(), Some(t0 + QUIET));
}

#[test]
fn a_steer_goes_to_the_running_turn_and_is_refused_without_one() {
    let (mut state, _) = state(false);
    let now = Instant::now();
    let (command, _answer) = steer_command();
    let CommandStep::RefuseSteer { answer, .. } = state.on_command(Some(command), now) else { panic!("no turn runs") };
    assert_eq!((answer.steered, answer.reason.as_deref()), (false, Some("no turn is running")));
    state.on_event(&started("t1"), now);
    let (command, _answer) = steer_command();
    let CommandStep::Steer { message, turn_id, .. } = state.on_command(Some(command), now) else { panic!("t1 runs") };
    assert_eq!((message.seq, turn_id.as_str()), (Seq(9), "t1"));
}

#[test]
fn a_stopping_session_steers_nothing() {
    let (mut state, _) = state(false);
    state.on_event(&started("t1"), Instant::now());
    state.begin_stop();
    let (command, _answer) = steer_command();
    let CommandStep::RefuseSteer { answer, .. } = state.on_command(Some(command), Instant::now()) else {
        panic!("a stopping session has no harness to steer")
    };
    assert_eq!(answer.reason.as_deref(), Some("no turn is running"));
}

#[test]
fn an_interrupt_stops_the_running_turn_or_says_why_not() {
    let (mut state, _) = state(false);
    let now = Instant::now();
    let refusal = |step: CommandStep| match step {
        CommandStep::RefuseInterrupt { answer, .. } => answer.reason,
        _ => panic!("expected a refusal"),
    };
    assert_eq!(refusal(state.on_command(Some(interrupt_command().0), now)).as_deref(), Some("no turn is running"));
    state.on_event(&started("t1"), now);
    let CommandStep::Interrupt { turn_id, .. } = state.on_command(Some(interrupt_command().0), now) else {
        panic!("t1 runs")
    };
    assert_eq!(turn_id, "t1");
    state.begin_stop();
    assert_eq!(refusal(state.on_command(Some(interrupt_command().0), now)).as_deref(), Some("the session is stopping"));
}

#[test]
fn a_closed_command_channel_stops_the_session() {
    let (mut state, _) = state(false);
    assert!(!state.commands_closed());
    assert!(matches!(state.on_command(None, Instant::now()), CommandStep::Stop));
    assert!(state.commands_closed(), "the loop stops listening for commands");
}

// deliver

#[test]
fn a_delivery_starts_when_due_one_at_a_time_and_one_not_taken_is_retried() {
    let (mut state, _) = state(false);
    let t0 = Instant::now();
    assert_eq!(state.start_delivery(t0), None, "nothing pending, nothing due");
    state.on_command(Some(SessionCommand::Hint), t0);
    assert_eq!(state.start_delivery(t0), None, "not before the quiet window");
    assert_eq!(state.start_delivery(t0 + QUIET), Some(Delivery { continuity: false }));
    state.on_command(Some(SessionCommand::Hint), t0 + QUIET);
    assert_eq!(state.due(), None, "a doorbell during a delivery waits for it");
    state.delivered(Delivered { started: false, continuity: false, turn: None }, t0 + QUIET * 2);
    assert!(state.due().is_some(), "a delivery the harness did not take is retried");
}

#[test]
fn nothing_is_delivered_once_the_session_is_stopping() {
    let (mut state, _) = state(false);
    let t0 = Instant::now();
    state.on_command(Some(SessionCommand::Hint), t0);
    state.begin_stop();
    assert_eq!(state.due(), None);
    assert_eq!(state.start_delivery(t0 + CAP), None);
    assert!(!state.resync_wanted());
}

#[test]
fn the_idle_resync_looks_for_pending_messages_at_once() {
    let (mut state, _) = state(false);
    let t0 = Instant::now();
    assert!(state.resync_wanted());
    state.resync(t0);
    assert_eq!(state.due(), Some(t0));
    assert!(!state.resync_wanted(), "a window is open already");
}

// exit

#[test]
fn an_event_stream_that_ends_without_an_exit_ends_the_session() {
    let (mut state, _) = state(false);
    let ending = state.stream_ended();
    assert_eq!((ending.requested, ending.fatal, ending.report), (false, false, EndReport::Nothing));
    assert_eq!(ending.reason, "the harness's event stream ended");
    state.begin_stop();
    assert!(state.stream_ended().requested, "after a stop it was asked for");
}

#[test]
fn an_ending_tells_the_runner_who_ended_and_how() {
    let exit = Ending::failed("unknown harness".into(), true).exit("a", canopy_core::Incarnation(4));
    assert_eq!(
        (exit.agent.as_str(), exit.incarnation, exit.requested, exit.fatal),
        ("a", canopy_core::Incarnation(4), false, true)
    );
    assert_eq!(exit.reason, "unknown harness");
}

// draining

#[test]
fn a_draining_session_ends_only_at_a_turn_boundary() {
    let (mut state, _) = state(false);
    let t0 = Instant::now();
    // The first input started t1; its events have not arrived yet: not a boundary.
    state.started_turn("t1");
    assert!(state.on_command(Some(SessionCommand::Drain(true)), t0).is_nothing());
    assert!(!state.drain_due(), "a turn a send started is still to end");
    state.on_event(&started("t1"), t0);
    assert!(!state.drain_due(), "mid-turn");
    state.on_event(&ended("t1", TurnStatus::Completed), t0);
    assert!(state.drain_due(), "the turn ended");
    // Taken back: the session stays.
    state.on_command(Some(SessionCommand::Drain(false)), t0);
    assert!(!state.drain_due());
    // A delivery in flight is not a boundary; the turn it started must end first, even when
    // its end is seen before the delivery's answer.
    state.on_command(Some(SessionCommand::Drain(true)), t0);
    state.on_command(Some(SessionCommand::Hint), t0);
    let delivery = state.start_delivery(t0 + QUIET);
    assert!(delivery.is_some() && !state.drain_due(), "a delivery is in flight");
    state.on_event(&started("t2"), t0 + QUIET);
    state.on_event(&ended("t2", TurnStatus::Completed), t0 + QUIET);
    state.delivered(Delivered { started: true, continuity: false, turn: Some("t2".into()) }, t0 + QUIET);
    assert!(state.drain_due(), "t2 already ended");
    assert!(state.begin_stop());
    assert!(!state.drain_due(), "once");
    let ending = match state.on_event(&exited(), t0 + QUIET) {
        EventStep::Exit(ending) => ending,
        other => panic!("{other:?}"),
    };
    assert!(ending.requested && ending.reason.contains("draining"), "{ending:?}");
}

#[test]
fn a_run_is_not_drained() {
    let (mut state, _) = state(true);
    state.on_command(Some(SessionCommand::Drain(true)), Instant::now());
    assert!(!state.drain_due(), "a run's one turn is its whole life");
}
