//! What the omp and pi harness tests share: waiting for an event, starting a turn.

#![allow(dead_code, reason = "each test binary that includes this module uses part of it")]

use std::time::Duration;

use canopy_harness::{HarnessEvent, InputContext, SendMode, SendOutcome, Session};
use tokio::sync::mpsc;

/// Collects events until one matches, failing after 60 s.
pub async fn until(
    events: &mut mpsc::Receiver<HarnessEvent>,
    seen: &mut Vec<HarnessEvent>,
    what: impl Fn(&HarnessEvent) -> bool,
) -> HarnessEvent {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| panic!("no matching event within 60s; saw {seen:#?}"))
            .unwrap_or_else(|| panic!("the event stream ended; saw {seen:#?}"));
        seen.push(event.clone());
        if what(&event) {
            return event;
        }
    }
}

pub fn turn_ended(event: &HarnessEvent) -> bool {
    matches!(event, HarnessEvent::TurnEnded { .. })
}

/// Sends a next-turn input and returns the turn it started.
pub async fn start(session: &Session, id: &str, text: &str) -> String {
    match session.send(id, text, &InputContext::default(), SendMode::NextTurn).await.unwrap() {
        SendOutcome::Started { turn_id } => turn_id,
        other => panic!("the turn did not start: {other:?}"),
    }
}
