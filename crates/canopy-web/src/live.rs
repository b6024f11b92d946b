//! `GET /events`: the page's live feed, server-sent events from the same event subjects the
//! CLI's `tail` and `watch` follow (`evt.message.>`, `evt.activity.>`), and issue changes
//! (`evt.issue.>`).
//!
//! Events are doorbells, so the feed never carries what the page must not miss: each says what
//! changed (`message` with channel, topic and sequence, `activity` with the agent, `issue` with
//! its number and state) and the page reads the news through its own routes. Every `message` event has the id `m<seq>`; a browser
//! that reconnects (after a network blip or a daemon restart) sends it back as
//! `Last-Event-ID`, and the feed first replays what was committed since through the API
//! (`messages.sync` with the session's token), then says `resync`. It also says `resync` when
//! the console's own NATS connection comes back, `logout` when the session ends or the API
//! refuses its token (checked at the start and every 5 s), and sends a comment every 15 s so a
//! dead connection is noticed.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use canopy_core::Seq;
use canopy_proto::api::{ActivityEvent, IssueChanged, MessageEvent, SyncRequest, WhoamiRequest};
use canopy_proto::method;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::auth::Session;
use crate::console::{Console, LoggedIn, Shared, call};

/// How soon a browser retries a dropped feed.
const RETRY: Duration = Duration::from_secs(1);
/// How often the session is checked while a feed is open.
const RECHECK: Duration = Duration::from_secs(5);

pub async fn events(State(console): State<Shared>, LoggedIn(id, session): LoggedIn, headers: HeaderMap) -> Response {
    let cursor = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix('m'))
        .and_then(|v| v.parse::<u64>().ok())
        .map(Seq);
    let (tx, mut rx) = mpsc::channel::<Event>(256);
    tokio::spawn(feed(console, id, session, cursor, tx));
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|e| e.map(Ok::<_, Infallible>)));
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

fn message_event(channel: &str, topic: &str, seq: Seq) -> Event {
    let data = serde_json::json!({ "channel": channel, "topic": topic, "seq": seq });
    Event::default().event("message").id(format!("m{}", seq.get())).data(data.to_string())
}

/// The `issue` event for a change published on `subject` (`…evt.issue.<number>`): its number
/// and state. The subject alone still rings the bell when the body cannot be read (the state
/// is then null): the page reads the issue itself.
fn issue_event(subject: &str, payload: &[u8]) -> Option<Event> {
    Some(Event::default().event("issue").data(issue_data(subject, payload)?.to_string()))
}

fn issue_data(subject: &str, payload: &[u8]) -> Option<serde_json::Value> {
    let changed = serde_json::from_slice::<IssueChanged>(payload).ok();
    let number = match &changed {
        Some(c) => c.issue.number,
        None => subject.rsplit('.').next()?.parse::<u64>().ok()?,
    };
    Some(serde_json::json!({ "number": number, "state": changed.map(|c| c.issue.state) }))
}

/// Replays every message after `after` (through the API, with the session's token) and
/// returns the newest sequence seen; `None` when the API could not be read.
async fn replay(console: &Console, session: &Session, mut after: Seq, tx: &mpsc::Sender<Event>) -> Option<Seq> {
    loop {
        let request = SyncRequest { after, channel: None, limit: None };
        let page = call::<method::MessagesSync>(console, session, &request).await.ok()?;
        for m in &page.messages {
            tx.send(message_event(m.channel.as_str(), m.topic.as_str(), m.seq)).await.ok()?;
        }
        // A page that does not move the cursor ends the replay (nothing more can come of it).
        let moved = page.next_after > after;
        after = page.next_after.max(after);
        if !page.more || !moved {
            return Some(after);
        }
    }
}

async fn feed(console: Shared, id: String, session: Session, cursor: Option<Seq>, tx: mpsc::Sender<Event>) {
    let bus = &console.api.bus;
    let subjects = &console.api.subjects;
    let mut connection = bus.connection_events();
    let (messages, activity, issues) = match (
        bus.subscribe(&subjects.message_events_all()).await,
        bus.subscribe(&subjects.activity_events_all()).await,
        bus.subscribe(&subjects.issue_events_all()).await,
    ) {
        (Ok(m), Ok(a), Ok(i)) => (m, a, i),
        _ => {
            // Ending the feed either way; a send that fails means the browser already left.
            let _ = tx.send(Event::default().event("unavailable").data("the daemon's events cannot be followed")).await;
            return;
        }
    };
    let mut messages = messages;
    let mut activity = activity;
    let mut issues = issues;
    if tx.send(Event::default().retry(RETRY).comment("connected")).await.is_err() {
        return; // The browser left already.
    }
    if let Err(canopy_bus::CallError::Refused(_)) = call::<method::Whoami>(&console, &session, &WhoamiRequest {}).await
    {
        // Ending the feed either way; a send that fails means the browser already left.
        let _ = tx.send(Event::default().event("logout").data("{}")).await;
        return;
    }
    let mut last = cursor.unwrap_or_default();
    if let Some(after) = cursor {
        match replay(&console, &session, after, &tx).await {
            Some(seq) => last = seq,
            None => return,
        }
    }
    if tx.send(Event::default().event("resync").data("{}")).await.is_err() {
        return;
    }
    let mut recheck = tokio::time::interval(RECHECK);
    loop {
        let event = tokio::select! {
            () = console.stop.cancelled() => return,
            () = tx.closed() => return,
            m = messages.next() => {
                // A subscription that ends ends the feed; the browser reconnects and resumes.
                let Some(m) = m else { return };
                match serde_json::from_slice::<MessageEvent>(&m.payload) {
                    Ok(e) => {
                        last = last.max(e.message.seq);
                        message_event(e.message.channel.as_str(), e.message.topic.as_str(), e.message.seq)
                    }
                    Err(_) => continue,
                }
            }
            a = activity.next() => {
                let Some(a) = a else { return };
                match serde_json::from_slice::<ActivityEvent>(&a.payload) {
                    Ok(e) => {
                        let data = serde_json::json!({ "agent": e.item.agent, "id": e.item.id, "kind": e.item.kind });
                        Event::default().event("activity").data(data.to_string())
                    }
                    Err(_) => continue,
                }
            }
            i = issues.next() => {
                let Some(i) = i else { return };
                match issue_event(&i.subject, &i.payload) {
                    Some(event) => event,
                    None => continue,
                }
            }
            change = connection.recv() => match change {
                // Doorbells rung while the connection was down are lost: read what they rang for.
                Ok(canopy_bus::ConnectionEvent::Connected) => {
                    if (cursor.is_some() || last > Seq(0))
                        && let Some(seq) = replay(&console, &session, last, &tx).await
                    {
                        last = seq;
                    }
                    // Even when the replay failed: the page reads what it shows itself.
                    Event::default().event("resync").data("{}")
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Event::default().event("resync").data("{}"),
                _ => continue,
            },
            _ = recheck.tick() => {
                // The session ended here, or the API no longer accepts its token (a revoked
                // operator): the feed stops telling it anything.
                let refused = matches!(
                    call::<method::Whoami>(&console, &session, &WhoamiRequest {}).await,
                    Err(canopy_bus::CallError::Refused(_))
                );
                if refused || console.auth.session(&id).is_none() {
                    // Ending the feed either way; a failed send means the browser already left.
                    let _ = tx.send(Event::default().event("logout").data("{}")).await;
                    return;
                }
                continue;
            }
        };
        if tx.send(event).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use canopy_core::Handle;
    use canopy_core::issues::{IssueEvent, IssueState, IssueSummary};

    use super::*;

    #[test]
    fn an_issue_change_rings_with_its_number_and_state_and_the_subject_alone_still_rings() {
        let changed = IssueChanged {
            issue: IssueSummary {
                number: 7,
                title: "t".into(),
                state: IssueState::InProgress,
                owner: None,
                parent: None,
                labels: Vec::new(),
                blocker: None,
                spend_usd: 0.0,
                created_at: "2026-01-01T00:00:00Z".into(),
                updated_at: "2026-01-01T00:00:00Z".into(),
            },
            event: IssueEvent {
                at: "2026-01-01T00:00:00Z".into(),
                actor: Handle::from_trusted("ops".into()),
                kind: "moved".into(),
                text: "go".into(),
            },
        };
        let payload = serde_json::to_vec(&changed).unwrap_or_default();
        let data = issue_data("canopy.w.evt.issue.7", &payload);
        assert_eq!(data, Some(serde_json::json!({ "number": 7, "state": "in_progress" })));
        let unread = issue_data("canopy.w.evt.issue.12", b"{}");
        assert_eq!(unread, Some(serde_json::json!({ "number": 12, "state": null })));
        assert_eq!(issue_data("canopy.w.evt.issue.x", b"{}"), None);
    }
}
