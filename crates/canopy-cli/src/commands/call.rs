//! What every area's commands share: one API call printed as JSON or as text, and the banner
//! of what waits for the operator that opens a human listing.
//!
//! Kept apart from `mod.rs` so the areas import this file and `mod.rs` imports the areas,
//! with no circle between them. Knows no command of its own.

use canopy_proto::ApiMethod;
use canopy_proto::api::{MergesListRequest, SpawnListRequest};
use canopy_proto::method;

use crate::client::{CallError, Client};
use crate::output;

/// Calls a method and prints the response as JSON or through `human`.
pub async fn call<M: ApiMethod>(
    client: &Client,
    json: bool,
    request: &M::Request,
    human: impl FnOnce(&M::Response),
) -> Result<(), CallError> {
    let response = client.send::<M>(request).await?;
    if json {
        output::json(&response);
    } else {
        human(&response);
    }
    Ok(())
}

/// Opens a human listing with what waits for the operator: pending spawn and merge requests.
pub async fn waiting_banner(client: &Client, json: bool) {
    if json {
        return;
    }
    let pending = SpawnListRequest { state: Some(canopy_core::SpawnState::Pending) };
    let spawns = client.send::<method::SpawnList>(&pending).await.map(|r| r.requests).unwrap_or_default();
    let merges = MergesListRequest { state: Some(canopy_core::MergeState::Pending) };
    let merges = client.send::<method::MergesList>(&merges).await.map(|r| r.merges).unwrap_or_default();
    if let Some(line) = output::waiting(&spawns, &merges) {
        println!("{line}");
    }
}
