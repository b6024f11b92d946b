//! The spawn gate: approving or denying a spawn request, listing them (or waiting for a new
//! one), and the audit log of every decision and refusal.
//!
//! Merge requests, the other gate, are `repos.rs`'s.

use canopy_proto::api::*;
use canopy_proto::method;

use super::call::call;
use crate::client::{CallError, Client};
use crate::exit::{code, fail_usage};
use crate::output;
use crate::writer::{errln, outln};

/// `canopy approve ID` and `canopy deny ID --reason R`.
pub async fn decide(client: &Client, json: bool, id: String, denied: Option<String>) -> u8 {
    let request = SpawnDecideRequest { id, approve: denied.is_none(), reason: denied };
    code(json, call::<method::SpawnDecide>(client, json, &request, output::spawn_request).await)
}

/// `canopy requests [--state S | --wait]`.
pub async fn requests(client: &Client, json: bool, state: Option<String>, wait: bool) -> u8 {
    let state = match state.as_deref().map(|s| canopy_core::SpawnState::parse(s).ok_or(s)) {
        None => None,
        Some(Ok(state)) => Some(state),
        Some(Err(bad)) => {
            let message = format!("unknown state {bad:?}; one of {}", canopy_core::SpawnState::expected());
            return fail_usage(json, "state", &message);
        }
    };
    let result = match wait {
        true => wait_for_request(client, json).await,
        false => {
            call::<method::SpawnList>(client, json, &SpawnListRequest { state }, |r: &SpawnListResponse| {
                r.requests.iter().for_each(output::spawn_request)
            })
            .await
        }
    };
    code(json, result)
}

/// `canopy requests --wait`: blocks until a spawn request that was not pending at the start
/// is, and prints it (for scripts and notifications).
async fn wait_for_request(client: &Client, json: bool) -> Result<(), CallError> {
    let pending = SpawnListRequest { state: Some(canopy_core::SpawnState::Pending) };
    let seen: std::collections::HashSet<String> =
        client.send::<method::SpawnList>(&pending).await?.requests.into_iter().map(|r| r.id).collect();
    // On stderr in both modes: `--json` output stays the request alone; scripts can wait for it.
    errln!("waiting for a new spawn request ({} pending already; Ctrl-C to stop)", seen.len());
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    loop {
        tick.tick().await;
        let now = client.send::<method::SpawnList>(&pending).await?.requests;
        let fresh: Vec<_> = now.into_iter().filter(|r| !seen.contains(&r.id)).collect();
        if !fresh.is_empty() {
            for request in &fresh {
                match json {
                    true => output::json_line(request),
                    false => output::spawn_request(request),
                }
            }
            return Ok(());
        }
    }
}

/// `canopy audit [--since D]`.
pub async fn audit(client: &Client, json: bool, since: Option<std::time::Duration>) -> u8 {
    let request = AuditListRequest { since_secs: since.map(|d| d.as_secs()) };
    let result = call::<method::AuditList>(client, json, &request, |r: &AuditListResponse| {
        for e in &r.entries {
            let actor = e.actor.as_ref().map_or("canopy".to_owned(), ToString::to_string);
            outln!("{} {actor:12} {:24} {} {}", output::time(&e.at), e.action, e.target, e.detail);
        }
    })
    .await;
    code(json, result)
}
