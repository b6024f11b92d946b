//! The merges area: the merge gate from the operator's side (list merge requests with their
//! conflicts, show one with its checks and reviews, approve one and wait while the queue lands
//! it, deny one, see the queue).
//!
//! Does not touch git: the daemon checks, merges and lands.

use canopy_proto::api::*;
use canopy_proto::method;

use super::call::call;
use crate::args::MergesCommand;
use crate::client::Client;
use crate::exit::{EXIT_REFUSED, code, fail, refuse_locally};
use crate::output;
use crate::writer::{out, outln};

/// `canopy merges [--state S] [show|approve|deny|queue]`.
pub async fn merges(client: &Client, json: bool, state: Option<String>, command: Option<MergesCommand>) -> u8 {
    match command {
        None => list(client, json, state).await,
        Some(MergesCommand::Approve { id, override_reason, no_wait }) => {
            approve(client, json, id, override_reason, no_wait).await
        }
        Some(MergesCommand::Deny { id, reason }) => {
            let request = MergesDecideRequest { id, approve: false, reason: Some(reason), override_reason: None };
            code(json, call::<method::MergesDecide>(client, json, &request, output::merge).await)
        }
        Some(MergesCommand::Show { id }) => {
            code(json, call::<method::MergesShow>(client, json, &MergesShowRequest { id }, show).await)
        }
        Some(MergesCommand::Queue { repo }) => {
            code(json, call::<method::MergesQueue>(client, json, &MergesQueueRequest { repo }, queue).await)
        }
    }
}

/// `canopy merges show`: the request, then its checks, reviews with their comments, and
/// conflicts, before the operator decides.
fn show(d: &MergeDetail) {
    let m = &d.request;
    output::merge(m);
    if let Some(position) = d.queue_position {
        outln!("queue: position {position}");
    }
    if let Some(reason) = &m.override_reason {
        outln!("approved over its review: {reason}");
    }
    outln!("summary: {}", m.summary);
    for c in &m.commits {
        outln!("  {c}");
    }
    outln!();
    match d.checks.is_empty() {
        true => outln!("checks: {}", m.check.lines().next().unwrap_or("none")),
        false => {
            outln!("checks on {}:", &d.checks[0].commit[..d.checks[0].commit.len().min(10)]);
            for c in &d.checks {
                outln!("  {}  {}", c.id, c.line());
            }
        }
    }
    outln!();
    if d.reviews.is_empty() {
        outln!("reviews: none");
    }
    for r in &d.reviews {
        let verdict = r.verdict.map(|v| v.as_str()).unwrap_or(r.state.as_str());
        let stale = if r.head == m.head { "" } else { " (of an older head)" };
        outln!("review {} by {}: {verdict}{stale}", r.id, r.reviewer);
        if !r.summary.is_empty() {
            outln!("  {}", r.summary.replace('\n', "\n  "));
        }
        for c in &r.comments {
            outln!("  {}:{}: {}", c.file, c.line, c.body.trim());
        }
    }
    if !d.conflicts.is_empty() {
        outln!();
        output::conflicts(&d.conflicts);
    }
}

/// `canopy merges queue`.
fn queue(r: &MergesQueueResponse) {
    if r.queue.is_empty() {
        outln!("the merge queue is empty");
    }
    for (i, m) in r.queue.iter().enumerate() {
        out!("{:>3}. ", i + 1);
        output::merge(m);
    }
}

/// `canopy merges [--state S]`: a state it does not know is refused as the daemon would.
async fn list(client: &Client, json: bool, state: Option<String>) -> u8 {
    let state = match state.as_deref().map(|s| canopy_core::MergeState::parse(s).ok_or(s)) {
        None => None,
        Some(Ok(state)) => Some(state),
        Some(Err(bad)) => {
            let message = format!("unknown state {bad:?}; one of {}", canopy_core::MergeState::expected());
            return refuse_locally(json, "state", message);
        }
    };
    code(json, call::<method::MergesList>(client, json, &MergesListRequest { state }, output::merges).await)
}

/// `canopy merges approve`: approves (the request joins its repository's queue), then waits
/// while the queue merges and checks it; exits 1 when the queue refused it.
async fn approve(client: &Client, json: bool, id: String, override_reason: Option<String>, no_wait: bool) -> u8 {
    let request = MergesDecideRequest { id: id.clone(), approve: true, reason: None, override_reason };
    let mut request_state = match client.send::<method::MergesDecide>(&request).await {
        Ok(r) => r,
        Err(e) => return fail(json, &e),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3600);
    let waiting =
        |s: canopy_core::MergeState| matches!(s, canopy_core::MergeState::Queued | canopy_core::MergeState::Merging);
    while !no_wait && waiting(request_state.state) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        match client.send::<method::MergesShow>(&MergesShowRequest { id: id.clone() }).await {
            Ok(detail) => request_state = detail.request,
            Err(e) => return fail(json, &e),
        }
    }
    if json {
        output::json(&request_state);
    } else {
        output::merge(&request_state);
    }
    match request_state.state {
        canopy_core::MergeState::Merged => 0,
        canopy_core::MergeState::Queued | canopy_core::MergeState::Merging if no_wait => 0,
        _ => EXIT_REFUSED,
    }
}
