//! The history area: what sessions used (tokens, and cost where the harness reports it), per
//! agent, and for one agent per session and per recent turn.
//!
//! Searching the message history is a tool of the agents; the CLI reads usage only.

use canopy_proto::api::*;
use canopy_proto::method;

use super::call::call;
use crate::client::Client;
use crate::exit::code;
use crate::output;

/// `canopy usage [--agent A] [--since D]`.
pub async fn usage(client: &Client, json: bool, agent: Option<String>, since: Option<std::time::Duration>) -> u8 {
    let request = UsageRequest { agent, since_secs: since.map(|d| d.as_secs()) };
    code(json, call::<method::Usage>(client, json, &request, output::usage).await)
}

/// `canopy usage --series`: spend per hour (or day) for the workspace, an agent, its subtree
/// or an issue.
pub async fn usage_series(
    client: &Client,
    json: bool,
    agent: Option<String>,
    subtree: bool,
    issue: Option<u64>,
    daily: bool,
) -> u8 {
    let bucket = if daily { SeriesBucket::Day } else { SeriesBucket::Hour };
    let request = UsageSeriesRequest { agent, subtree, issue, bucket };
    code(json, call::<method::UsageSeries>(client, json, &request, crate::charts::usage_series).await)
}
