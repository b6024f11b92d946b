//! The repos area: repositories agents work on (add, list with every checkout, collect
//! leftovers). The merge gate's commands are `merges`.
//!
//! Does not touch git: the daemon mirrors, checks out and merges.

use canopy_proto::api::*;
use canopy_proto::method;

use super::call::call;
use crate::args::ReposCommand;
use crate::client::Client;
use crate::exit::{code, refuse_locally};
use crate::output;

/// `canopy repos add|list|gc`.
pub async fn repos(client: &Client, json: bool, command: ReposCommand) -> u8 {
    let result = match command {
        ReposCommand::Add { name, source, base, checks, review } => {
            // A relative path is the caller's, not the daemon's.
            let source = match std::path::Path::new(&source).exists() {
                true => std::path::absolute(&source).map(|p| p.display().to_string()).unwrap_or(source),
                false => source,
            };
            let review = match review.as_deref().map(|r| canopy_core::review::ReviewPolicy::parse(r).ok_or(r)) {
                None => None,
                Some(Ok(policy)) => Some(policy),
                Some(Err(bad)) => {
                    let message = format!("unknown review policy {bad:?}; one of operator, required");
                    return refuse_locally(json, "review", message);
                }
            };
            let mut named = std::collections::BTreeMap::new();
            for value in &checks {
                let (check, command) = canopy_core::checks::parse_assignment(value);
                if named.insert(check.clone(), command).is_some() {
                    return refuse_locally(json, "checks", format!("check {check} is given twice"));
                }
            }
            let request = ReposAddRequest { name, source, base: Some(base), check: None, checks: named, review };
            call::<method::ReposAdd>(client, json, &request, output::repo).await
        }
        ReposCommand::List => call::<method::ReposList>(client, json, &ReposListRequest {}, output::repos).await,
        ReposCommand::Gc { dry_run } => {
            call::<method::ReposGc>(client, json, &ReposGcRequest { dry_run }, output::gc).await
        }
    };
    code(json, result)
}
