//! The runs area: a Manager's subagent runs, newest first.
//!
//! Runs are started and merged by agents through their tools; the operator only lists them.

use canopy_proto::api::*;
use canopy_proto::method;

use super::call::call;
use crate::client::Client;
use crate::exit::code;
use crate::writer::outln;

/// `canopy runs --agent A [--open]`.
pub async fn list(client: &Client, json: bool, agent: String, open: bool) -> u8 {
    let request = RunsListRequest { agent: Some(agent), open };
    let result = call::<method::RunsList>(client, json, &request, |r: &RunsListResponse| {
        for run in &r.runs {
            let ended = run.ended_at.as_deref().unwrap_or("-");
            let scripted = if run.scripted { "  (scripted: no model ran)" } else { "" };
            outln!(
                "{:8} {:10} {:14} started {} ended {ended}{scripted}",
                run.handle,
                run.status,
                run.definition,
                run.started_at
            );
        }
    })
    .await;
    code(json, result)
}
