//! The merges area: the merge gate from the operator's side (list merge requests, approve one
//! and wait while Canopy merges it, deny one).
//!
//! Does not touch git: the daemon checks, merges and lands.

use canopy_core::ErrorCode;
use canopy_proto::api::*;
use canopy_proto::method;

use super::call::call;
use crate::args::MergesCommand;
use crate::client::{CallError, Client};
use crate::exit::{EXIT_REFUSED, code, fail};
use crate::output;

/// `canopy merges [--state S] [approve|deny]`.
pub async fn merges(client: &Client, json: bool, state: Option<String>, command: Option<MergesCommand>) -> u8 {
    match command {
        None => list(client, json, state).await,
        Some(MergesCommand::Approve { id }) => approve(client, json, id).await,
        Some(MergesCommand::Deny { id, reason }) => {
            let request = MergesDecideRequest { id, approve: false, reason: Some(reason) };
            code(json, call::<method::MergesDecide>(client, json, &request, output::merge).await)
        }
    }
}

/// `canopy merges [--state S]`: a state it does not know is refused as the daemon would.
async fn list(client: &Client, json: bool, state: Option<String>) -> u8 {
    let state = match state.as_deref().map(|s| canopy_core::MergeState::parse(s).ok_or(s)) {
        None => None,
        Some(Ok(state)) => Some(state),
        Some(Err(bad)) => {
            let message = format!("unknown state {bad:?}; one of {}", canopy_core::MergeState::expected());
            let wire =
                canopy_proto::WireError { code: ErrorCode::InvalidArgument, message, field: Some("state".into()) };
            return fail(json, &CallError::Refused(wire));
        }
    };
    code(json, call::<method::MergesList>(client, json, &MergesListRequest { state }, output::merges).await)
}

/// `canopy merges approve`: approves, then waits while Canopy merges (and checks) it;
/// exits 1 when the merge was refused.
async fn approve(client: &Client, json: bool, id: String) -> u8 {
    let request = MergesDecideRequest { id: id.clone(), approve: true, reason: None };
    let mut request_state = match client.send::<method::MergesDecide>(&request).await {
        Ok(r) => r,
        Err(e) => return fail(json, &e),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3600);
    while request_state.state == canopy_core::MergeState::Merging && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        match client.send::<method::MergesList>(&MergesListRequest { state: None }).await {
            Ok(list) => {
                if let Some(found) = list.merges.into_iter().find(|m| m.id == id) {
                    request_state = found;
                }
            }
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
        _ => EXIT_REFUSED,
    }
}
