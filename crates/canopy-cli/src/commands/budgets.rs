//! The budgets area: an agent's budget (its own, or its subtree's) set, cleared or shown.
//!
//! The daemon holds the spending and decides the holds; this prints what it answers.

use canopy_proto::api::AgentsBudgetRequest;
use canopy_proto::method;

use super::call::call;
use crate::client::Client;
use crate::exit::code;
use crate::output;

/// `canopy agents budget HANDLE [--usd N] [--tokens N] [--period P] [--subtree] [--clear]`.
pub async fn budget(client: &Client, json: bool, request: AgentsBudgetRequest) -> u8 {
    code(json, call::<method::AgentsBudget>(client, json, &request, output::budget_change).await)
}
