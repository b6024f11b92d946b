//! Mid-turn commands carried out on the harness: a steer (inject one message into the
//! running turn) and an interrupt (stop the running turn), each answered for the runner.
//!
//! Owns what the answers say (`steer_answer`, `interrupt_answer`: pure). Does not decide
//! whether a command may go to the harness at all (no turn running, the session stopping):
//! the session loop's state does, before one of these runs.

use std::sync::Arc;

use canopy_core::{Message, Seq};
use canopy_harness::{SendMode, SendOutcome, Session, SessionError};
use canopy_proto::api::{InterruptReply, SteerReply};

use crate::session::input::steer_input;
use crate::session::seen::{SharedSeen, SteerCheck, with_seen};

/// Injects one message into the running turn `turn_id`.
pub(crate) async fn steer(session: Arc<Session>, turn_id: String, message: Message, seen: &SharedSeen) -> SteerReply {
    let seq = message.seq;
    if let Some(answer) = steer_checked(with_seen(seen, |s| s.check_steer(seq)), &turn_id) {
        return answer;
    }
    let (text, context) = steer_input(&message);
    let written_at_us = canopy_sys::unix_us();
    let outcome = session.send(&steer_id(seq), &text, &context, SendMode::Steer { turn_id }).await;
    steer_answer(outcome, written_at_us)
}

/// The input id of a steer of message `seq`; `SteerInjected` names it again.
pub(crate) fn steer_id(seq: Seq) -> String {
    format!("steer-{seq}")
}

/// The message a `SteerInjected` event's input id names, when it names a steer.
pub(crate) fn steered_seq(input_id: &str) -> Option<Seq> {
    input_id.strip_prefix("steer-").and_then(|s| s.parse().ok())
}

/// The answer a steer gets before it reaches the harness, if it gets one: a message already
/// injected is done, one being delivered at a turn start arrives with that turn.
fn steer_checked(check: SteerCheck, turn_id: &str) -> Option<SteerReply> {
    match check {
        SteerCheck::Injected => Some(SteerReply {
            steered: true,
            turn_id: Some(turn_id.to_owned()),
            reason: Some("already injected".into()),
            written_at_us: None,
        }),
        SteerCheck::Delivering => Some(refused("it is being delivered at the start of the agent's next turn".into())),
        SteerCheck::Steer => None,
    }
}

/// What the harness did with a steer, as the runner answers it.
fn steer_answer(outcome: Result<SendOutcome, SessionError>, written_at_us: u64) -> SteerReply {
    match outcome {
        // Taken for the turn; `SteerInjected` follows at its next step boundary.
        Ok(SendOutcome::Steered { turn_id }) => {
            SteerReply { steered: true, turn_id: Some(turn_id), reason: None, written_at_us: Some(written_at_us) }
        }
        Ok(SendOutcome::FellBack { reason }) | Ok(SendOutcome::Refused { reason }) => refused(reason),
        Ok(SendOutcome::Started { .. }) => refused("the harness started a new turn".into()),
        Err(e) => refused(e.to_string()),
    }
}

/// A steer that did not happen, and why.
pub(crate) fn refused(reason: String) -> SteerReply {
    SteerReply { steered: false, turn_id: None, reason: Some(reason), written_at_us: None }
}

/// Stops the running turn `turn_id`. The harness ends the turn as interrupted; `TurnEnded`
/// clears it and messages still pending go at the next turn start, as after any turn.
pub(crate) async fn interrupt(session: Arc<Session>, turn_id: String) -> InterruptReply {
    interrupt_answer(session.interrupt().await, turn_id)
}

fn interrupt_answer(result: Result<(), SessionError>, turn_id: String) -> InterruptReply {
    match result {
        Ok(()) => InterruptReply { interrupted: true, turn_id: Some(turn_id), reason: None },
        Err(e) => InterruptReply {
            interrupted: false,
            turn_id: Some(turn_id),
            reason: Some(format!("the harness could not be told: {e}")),
        },
    }
}

/// An interrupt that did not happen, and why.
pub(crate) fn not_interrupted(reason: &str) -> InterruptReply {
    InterruptReply { interrupted: false, turn_id: None, reason: Some(reason.to_owned()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steer_id_names_its_message_and_reads_back() {
        assert_eq!(steer_id(Seq(42)), "steer-42");
        assert_eq!(steered_seq(&steer_id(Seq(42))), Some(Seq(42)));
        assert_eq!(steered_seq("deliver-42"), None);
        assert_eq!(steered_seq("steer-x"), None);
    }

    #[test]
    fn a_message_injected_or_being_delivered_is_not_steered_again() {
        let injected = steer_checked(SteerCheck::Injected, "t1");
        assert_eq!(injected.as_ref().map(|a| (a.steered, a.turn_id.as_deref())), Some((true, Some("t1"))));
        let delivering = steer_checked(SteerCheck::Delivering, "t1");
        assert_eq!(delivering.map(|a| a.steered), Some(false));
        assert!(steer_checked(SteerCheck::Steer, "t1").is_none());
    }

    #[test]
    fn a_steer_is_answered_by_what_the_harness_did() {
        let steered = steer_answer(Ok(SendOutcome::Steered { turn_id: "t2".into() }), 77);
        assert_eq!((steered.steered, steered.turn_id.as_deref(), steered.written_at_us), (true, Some("t2"), Some(77)));
        let fell_back = steer_answer(Ok(SendOutcome::FellBack { reason: "turn ended".into() }), 77);
        assert_eq!((fell_back.steered, fell_back.reason.as_deref()), (false, Some("turn ended")));
        let started = steer_answer(Ok(SendOutcome::Started { turn_id: "t3".into() }), 77);
        assert_eq!(started.reason.as_deref(), Some("the harness started a new turn"));
        let exited = steer_answer(Err(SessionError::Exited), 77);
        assert_eq!((exited.steered, exited.written_at_us), (false, None));
    }

    #[test]
    fn an_interrupt_is_answered_by_whether_the_harness_was_told() {
        let told = interrupt_answer(Ok(()), "t1".into());
        assert_eq!((told.interrupted, told.turn_id.as_deref(), told.reason), (true, Some("t1"), None));
        let failed = interrupt_answer(Err(SessionError::Exited), "t1".into());
        assert!(!failed.interrupted);
        assert_eq!(failed.reason.as_deref(), Some("the harness could not be told: the harness has exited"));
    }
}
