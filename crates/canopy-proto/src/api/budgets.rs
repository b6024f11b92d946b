//! Budgets: `agents.budget`, reading or setting an agent's or a subtree's budget.
//!
//! The rules (windows, levels, what a spawn may carve) are `canopy_core::budget`; the spend
//! summed into a status is the store's.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `agents.budget` (operators): set an agent's own budget (its turns and its subagent runs)
/// or, with `subtree`, its subtree's; no amount and no `clear` shows the budgets covering it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsBudgetRequest {
    pub handle: String,
    /// US dollars per period.
    #[serde(default)]
    pub usd: Option<f64>,
    /// Tokens per period (fresh input, cache writes and output).
    #[serde(default)]
    pub tokens: Option<u64>,
    /// A humantime period (`1day`, `30days`, at least `1m`) or `lifetime` (the default).
    #[serde(default)]
    pub period: Option<String>,
    /// The budget of the agent's whole subtree (its descendants and all their runs).
    #[serde(default)]
    pub subtree: bool,
    /// Remove the budget of this scope.
    #[serde(default)]
    pub clear: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsBudgetResponse {
    /// The budget set (absent when cleared or only shown).
    #[serde(default)]
    pub budget: Option<canopy_core::BudgetStatus>,
    /// Every budget that covers the agent, after the change.
    pub covering: Vec<canopy_core::BudgetStatus>,
    /// Agents the change released: what they held is delivered now.
    #[serde(default)]
    pub released: Vec<String>,
}
