//! The sessions area: an agent's session started, stopped or its turn interrupted, and
//! `canopy status`, everything an operator checks first in one screen.
//!
//! Start and stop change what the daemon wants; the runner acts at its next sync, which is
//! what these commands say. Does not run sessions: runners do.

use canopy_config::DataDir;
use canopy_core::Seq;
use canopy_proto::api::*;
use canopy_proto::method;

use super::call::call;
use crate::client::{CallError, Client};
use crate::exit::code;
use crate::output;
use crate::writer::outln;

/// `canopy agents start`, on another harness with `--harness`.
pub async fn start(client: &Client, json: bool, handle: String, harness: Option<String>) -> u8 {
    let what = match harness {
        Some(_) => "run on it: a session on another harness ends at its next turn boundary",
        None => "run: a session starts",
    };
    let request = AgentsStartStopRequest { handle, harness };
    code(json, call::<method::AgentsStart>(client, json, &request, desired(what)).await)
}

/// `canopy agents stop`.
pub async fn stop(client: &Client, json: bool, handle: String) -> u8 {
    let request = AgentsStartStopRequest { handle, harness: None };
    code(json, call::<method::AgentsStop>(client, json, &request, desired("stop: its session ends")).await)
}

/// What `agents start` and `stop` say: the change takes effect at the runner's next sync.
fn desired(what: &'static str) -> impl FnOnce(&canopy_core::RosterEntry) {
    move |e| outln!("{} will {what} at its runner's next sync (it was {})", e.handle, e.presence)
}

/// `canopy agents interrupt`: the running turn ends; the session stays up.
pub async fn interrupt(client: &Client, json: bool, handle: String) -> u8 {
    let result = call::<method::AgentsInterrupt>(
        client,
        json,
        &AgentsInterruptRequest { handle },
        |r: &AgentsInterruptResponse| match (&r.turn_id, &r.reason) {
            (Some(turn), _) if r.interrupted => {
                outln!("interrupted {} turn {turn} (session #{} stays up)", r.agent, r.incarnation)
            }
            (_, reason) => {
                outln!("{}: nothing to interrupt ({})", r.agent, reason.as_deref().unwrap_or("no turn is running"))
            }
        },
    )
    .await;
    code(json, result)
}

/// `canopy status`: everything an operator checks first, read in one go.
pub async fn status(dir: &DataDir, client: &Client, json: bool) -> u8 {
    code(json, read_status(dir, client, json).await)
}

async fn read_status(dir: &DataDir, client: &Client, json: bool) -> Result<(), CallError> {
    let daemon = crate::client::connection_info(dir)?;
    let whoami: WhoamiResponse = client.send::<method::Whoami>(&WhoamiRequest {}).await?;
    let roster = client.roster().await?;
    let pending = SpawnListRequest { state: Some(canopy_core::SpawnState::Pending) };
    let spawns = client.send::<method::SpawnList>(&pending).await?.requests;
    let merges = MergesListRequest { state: Some(canopy_core::MergeState::Pending) };
    let merges = client.send::<method::MergesList>(&merges).await?.merges;
    let incidents = ReadRequest {
        channel: "incidents".into(),
        topic: None,
        after: Seq(0),
        limit: Some(3),
        unread: false,
        newest: true,
    };
    let incidents: Vec<canopy_core::Message> =
        client.send::<method::MessagesRead>(&incidents).await?.groups.into_iter().flat_map(|g| g.messages).collect();
    let status = output::Status {
        workspace: whoami.workspace.name.clone(),
        daemon_pid: daemon.pid,
        daemon_version: whoami.version.clone(),
        nats_url: daemon.nats_url.clone(),
        agents: roster.agents,
        spawns,
        merges,
        incidents,
        waiting_issues: whoami.waiting_issues,
    };
    match json {
        true => output::json(&status),
        false => output::status(&status),
    }
    Ok(())
}
