//! A turn-start delivery, carried out: pull what is pending, drop what was injected before,
//! start a turn with the rest (opening with the continuity block when one is owed), then
//! acknowledge what the harness took and tell the session loop how it went.
//!
//! Runs as its own task so a slow pull, write or acknowledgement never holds up the loop or
//! a steer. Does not decide when a delivery is due: the loop's `TurnSchedule` does.

use std::sync::Arc;

use canopy_core::Seq;
use canopy_harness::{SendMode, SendOutcome, Session};
use canopy_proto::api::ContinuityWhen;
use tokio::sync::mpsc;

use crate::session::input::{TurnInput, input_summary};
use crate::session::mailbox::Mailbox;
use crate::session::reports::Reports;
use crate::session::seen::{SharedSeen, with_seen};

/// A finished turn-start delivery, reported back to the session loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Delivered {
    /// Whether a turn started with it (otherwise the messages are still pending).
    pub started: bool,
    /// Whether it opened with the continuity block.
    pub continuity: bool,
    /// The turn it started, if it started one.
    pub turn: Option<String>,
}

/// What a delivery task needs besides the harness.
pub(crate) struct DeliveryTask {
    pub mailbox: Mailbox,
    pub seen: SharedSeen,
    pub reports: Reports,
    /// Whether the delivery should open with the continuity block (a compaction happened).
    pub continuity_owed: bool,
    pub done: mpsc::Sender<Delivered>,
}

impl DeliveryTask {
    /// Pulls pending messages and, if any may wake the agent, starts a turn with them.
    pub async fn run(self, session: Arc<Session>) {
        let delivered = match self.mailbox.pull().await {
            Some(pending) => self.start_turn(&session, pending).await,
            None => Delivered { started: true, continuity: false, turn: None },
        };
        if self.done.send(delivered).await.is_err() {
            // The loop ended while this ran (the harness exited): nothing waits to schedule more.
            tracing::debug!("a turn-start delivery finished after its session loop");
        }
    }

    async fn start_turn(&self, session: &Session, pending: canopy_proto::api::DeliveriesPullResponse) -> Delivered {
        let mut delivered = Delivered { started: true, continuity: false, turn: None };
        let (again, fresh) = with_seen(&self.seen, |s| s.reserve(pending.messages));
        // Injected before (a steer whose acknowledgement has not committed yet, or one that
        // was lost): do not repeat them, and record them as injected rather than moving the
        // cursor. A cursor moves only with a turn start that wrote every message up to it; a
        // steered mention acknowledged as a cursor move would carry it past the unread
        // messages below, and a kill before they are written would lose them.
        self.mailbox.acknowledge(again.iter().map(|m| m.seq).collect(), true).await;
        let seqs: Vec<Seq> = fresh.iter().map(|m| m.seq).collect();
        if !fresh.is_empty() && pending.wake {
            let block = match self.continuity_owed {
                true => self.mailbox.continuity(ContinuityWhen::Compaction).await,
                false => None,
            };
            delivered.continuity = block.is_some();
            let input = TurnInput::of(&fresh, &pending.redelivered, block.as_deref());
            match session.send(&input.input_id, &input.text, &input.context, SendMode::NextTurn).await {
                Ok(SendOutcome::Started { turn_id }) => {
                    delivered.turn = Some(turn_id);
                    with_seen(&self.seen, |s| s.settle(&seqs, true));
                    self.mailbox.ack(seqs.clone()).await;
                    let detail = serde_json::json!({ "seqs": seqs });
                    self.reports.activity("input", input_summary(&fresh), detail).await;
                }
                Ok(outcome) => {
                    tracing::debug!(?outcome, "a turn-start delivery was not taken; retrying");
                    delivered.started = false;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "a turn-start delivery failed; retrying");
                    delivered.started = false;
                }
            }
        }
        // Whatever was not taken is pending again (a no-op for what was injected).
        with_seen(&self.seen, |s| s.settle(&seqs, false));
        delivered
    }
}
