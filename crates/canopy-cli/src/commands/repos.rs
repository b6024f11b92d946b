//! The repos area: repositories agents work on (add, list with every checkout, collect
//! leftovers). The merge gate's commands are `merges`.
//!
//! Does not touch git: the daemon mirrors, checks out and merges.

use canopy_proto::api::*;
use canopy_proto::method;

use super::call::call;
use crate::args::ReposCommand;
use crate::client::Client;
use crate::exit::code;
use crate::output;

/// `canopy repos add|list|gc`.
pub async fn repos(client: &Client, json: bool, command: ReposCommand) -> u8 {
    let result = match command {
        ReposCommand::Add { name, source, base, check } => {
            // A relative path is the caller's, not the daemon's.
            let source = match std::path::Path::new(&source).exists() {
                true => std::path::absolute(&source).map(|p| p.display().to_string()).unwrap_or(source),
                false => source,
            };
            let request = ReposAddRequest { name, source, base: Some(base), check };
            call::<method::ReposAdd>(client, json, &request, output::repo).await
        }
        ReposCommand::List => call::<method::ReposList>(client, json, &ReposListRequest {}, output::repos).await,
        ReposCommand::Gc { dry_run } => {
            call::<method::ReposGc>(client, json, &ReposGcRequest { dry_run }, output::gc).await
        }
    };
    code(json, result)
}
