//! The daemon's requests to a runner's sessions (steer a message into a running turn,
//! interrupt a turn): what each is answered, and how an answer goes on the wire.
//!
//! Owns the answers a request gets before it reaches its session (unreadable, no such
//! session here, too late) and the encoding of every answer: one that cannot be encoded is
//! answered with an `internal` refusal, never an empty payload. Does not find the session
//! (the runner actor does) and does not touch the harness (the session does).

use canopy_core::ErrorCode;
use canopy_proto::api::{InterruptReply, InterruptRequest, SteerReply, SteerRequest};
use canopy_proto::{Reply, WireError};
use tokio::sync::{mpsc, oneshot};

use crate::session::{SessionCommand, not_interrupted, refused};

/// The answer to a steer request: refused at once when it cannot be read, names no session
/// live here, or arrived after the poster's deadline (`now_ms`, Unix milliseconds, is
/// later than `not_after_ms`); otherwise the session's own answer.
pub(crate) async fn answer_steer(
    parsed: Result<SteerRequest, serde_json::Error>,
    session: Option<mpsc::Sender<SessionCommand>>,
    now_ms: u64,
) -> SteerReply {
    match (parsed, session) {
        (Err(e), _) => refused(format!("bad steer request: {e}")),
        (Ok(_), None) => refused("the session is not live on this runner".into()),
        (Ok(request), Some(_)) if now_ms > request.not_after_ms => {
            refused("the request arrived after the poster stopped waiting".into())
        }
        (Ok(request), Some(commands)) => {
            let (reply, answer) = oneshot::channel();
            let steer = SessionCommand::Steer { message: request.message, reply };
            ask(&commands, steer, answer).await.unwrap_or_else(|| refused("the session ended".into()))
        }
    }
}

/// The answer to an interrupt request: refused at once when it cannot be read or names no
/// session live here; otherwise the session's own answer.
pub(crate) async fn answer_interrupt(
    parsed: Result<InterruptRequest, serde_json::Error>,
    session: Option<mpsc::Sender<SessionCommand>>,
) -> InterruptReply {
    match (parsed, session) {
        (Err(e), _) => not_interrupted(&format!("bad interrupt request: {e}")),
        (Ok(_), None) => not_interrupted("the session is not live on this runner"),
        (Ok(_), Some(commands)) => {
            let (reply, answer) = oneshot::channel();
            let interrupt = SessionCommand::Interrupt { reply };
            ask(&commands, interrupt, answer).await.unwrap_or_else(|| not_interrupted("the session ended"))
        }
    }
}

/// Sends `command` to a session and waits for its `answer`; `None` when the session ended
/// first. A command the session's queue refuses is answered at once: the refused command
/// still holds the reply sender, so waiting for the answer would wait forever.
async fn ask<T>(
    commands: &mpsc::Sender<SessionCommand>,
    command: SessionCommand,
    answer: oneshot::Receiver<T>,
) -> Option<T> {
    commands.send(command).await.ok()?;
    answer.await.ok()
}

/// The payload of an answer, from its encoding (`serde_json::to_vec`); an answer that did
/// not encode is the refusal `{"error":{"code":"internal","message":...}}` (logged), never
/// an empty payload.
pub(crate) fn reply_payload(encoded: serde_json::Result<Vec<u8>>) -> Vec<u8> {
    match encoded {
        Ok(payload) => payload,
        Err(e) => {
            tracing::error!(error = %e, "an answer to the daemon did not encode; answering an internal error");
            let refusal: Reply<()> = Reply::Error(WireError {
                code: ErrorCode::Internal,
                message: format!("the runner could not encode its answer: {e}"),
                field: None,
            });
            // A refusal is a struct of strings: its encoding cannot fail, and if it did the
            // written-out form says the same.
            serde_json::to_vec(&refusal).unwrap_or_else(|_| INTERNAL.to_vec())
        }
    }
}

/// The refusal `reply_payload` falls back to.
const INTERNAL: &[u8] = br#"{"error":{"code":"internal","message":"the runner could not encode its answer"}}"#;

/// Publishes an answer (`encoded`, see `reply_payload`) to `reply_to`, the inbox of the
/// daemon's request `what`.
pub(crate) async fn publish_reply(
    bus: &canopy_bus::Bus,
    reply_to: &str,
    encoded: serde_json::Result<Vec<u8>>,
    what: &str,
) {
    if let Err(e) = bus.publish(reply_to, reply_payload(encoded).into()).await {
        // The daemon times its request out and treats the steer or interrupt as not done.
        tracing::debug!(error = %e, "answering {what} failed");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use std::collections::HashMap;

    use serde_json::json;

    use super::*;

    fn steer_request(not_after_ms: u64) -> Result<SteerRequest, serde_json::Error> {
        serde_json::from_value(json!({
            "agent": "a", "incarnation": 1, "not_after_ms": not_after_ms,
            "message": {
                "seq": 9, "channel": "home-a", "topic": "t", "body": "@a look", "mentions": [],
                "sender": { "handle": "ops", "kind": "operator", "role": null },
                "created_at": "2026-12-01T00:00:00Z",
            },
        }))
    }

    /// A session that answers every steer as steered into `t1`, and every interrupt as done.
    fn session() -> mpsc::Sender<SessionCommand> {
        let (tx, mut rx) = mpsc::channel(4);
        tokio::spawn(async move {
            while let Some(command) = rx.recv().await {
                match command {
                    SessionCommand::Steer { reply, .. } => {
                        let answer =
                            SteerReply { steered: true, turn_id: Some("t1".into()), reason: None, written_at_us: None };
                        reply.send(answer).unwrap();
                    }
                    SessionCommand::Interrupt { reply } => {
                        reply
                            .send(InterruptReply { interrupted: true, turn_id: Some("t1".into()), reason: None })
                            .unwrap();
                    }
                    SessionCommand::Hint | SessionCommand::Drain(_) => {}
                }
            }
        });
        tx
    }

    #[tokio::test]
    async fn a_steer_reaches_its_live_session_before_the_deadline() {
        let answer = answer_steer(steer_request(1_000), Some(session()), 999).await;
        assert!(answer.steered, "{answer:?}");
        let late = answer_steer(steer_request(1_000), Some(session()), 1_001).await;
        assert_eq!(late.reason.as_deref(), Some("the request arrived after the poster stopped waiting"));
        let elsewhere = answer_steer(steer_request(1_000), None, 0).await;
        assert_eq!(elsewhere.reason.as_deref(), Some("the session is not live on this runner"));
        let unreadable = answer_steer(serde_json::from_str("{}"), Some(session()), 0).await;
        assert!(unreadable.reason.unwrap().starts_with("bad steer request: "));
    }

    /// Regression: the refused command kept the reply sender alive, and the answer was
    /// awaited forever (a leaked task per request; the daemon saw a timeout).
    #[tokio::test]
    async fn a_request_to_a_session_that_ended_is_answered_at_once() {
        let (gone, rx) = mpsc::channel(1);
        drop(rx);
        let answer = answer_steer(steer_request(u64::MAX), Some(gone.clone()), 0).await;
        assert_eq!(answer.reason.as_deref(), Some("the session ended"));
        let answer = answer_interrupt(
            Ok(InterruptRequest { agent: "a".into(), incarnation: canopy_core::Incarnation(1) }),
            Some(gone),
        )
        .await;
        assert_eq!(answer.reason.as_deref(), Some("the session ended"));
    }

    #[tokio::test]
    async fn an_interrupt_reaches_its_live_session() {
        let request = || Ok(InterruptRequest { agent: "a".into(), incarnation: canopy_core::Incarnation(1) });
        let answer = answer_interrupt(request(), Some(session())).await;
        assert_eq!((answer.interrupted, answer.turn_id.as_deref()), (true, Some("t1")));
        let elsewhere = answer_interrupt(request(), None).await;
        assert_eq!(elsewhere.reason.as_deref(), Some("the session is not live on this runner"));
    }

    #[test]
    fn an_answer_goes_as_json() {
        let answer = SteerReply { steered: false, turn_id: None, reason: Some("no".into()), written_at_us: None };
        let payload = reply_payload(serde_json::to_vec(&answer));
        let decoded = serde_json::from_slice::<SteerReply>(&payload).unwrap();
        assert_eq!((decoded.steered, decoded.reason), (answer.steered, answer.reason));
    }

    #[test]
    fn an_answer_that_cannot_be_encoded_is_an_internal_error_not_an_empty_reply() {
        // JSON object keys must be strings: a map keyed by pairs does not encode.
        let unencodable: HashMap<(u8, u8), u8> = HashMap::from([((1, 2), 3)]);
        let payload = reply_payload(serde_json::to_vec(&unencodable));
        assert!(!payload.is_empty());
        let reply: Reply<serde_json::Value> = serde_json::from_slice(&payload).unwrap();
        let Reply::Error(error) = reply else { panic!("an error reply") };
        assert_eq!(error.code, ErrorCode::Internal);
        assert!(error.message.starts_with("the runner could not encode its answer"), "{}", error.message);
        let fallback: Reply<serde_json::Value> = serde_json::from_slice(INTERNAL).unwrap();
        assert!(matches!(fallback, Reply::Error(WireError { code: ErrorCode::Internal, .. })));
    }
}
