//! The spawn gate and the audit log: `spawn.*` (request, decide, cancel, list),
//! `agents.despawn` and `audit.list`.
//!
//! The request's state machine lives in `canopy_core::spawn`; these are only its wire shapes.

use canopy_core::{AuditEntry, SpawnRequest, SpawnState};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::api::agents::default_role;

/// `spawn.request` (agents): ask the operator for a child Manager. Returns at once.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnRequestRequest {
    pub handle: String,
    /// Display name, e.g. `Flaky Tests Manager` (name Managers by function).
    pub name: String,
    #[serde(default = "default_role")]
    pub role: String,
    /// What the child's lane is for.
    pub charter: String,
    /// Why a new Manager is needed now.
    pub reason: String,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// The repository the child works on (its own checkout); default: yours, if you have one.
    #[serde(default)]
    pub repo: Option<String>,
    /// A budget for the child's subtree in US dollars, carved from the budget above you.
    #[serde(default)]
    pub budget_usd: Option<f64>,
    /// A budget for the child's subtree in tokens, carved from the budget above you.
    #[serde(default)]
    pub budget_tokens: Option<u64>,
}

/// `spawn.decide` (operators): approve or deny a pending request.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnDecideRequest {
    /// `req-<n>`.
    pub id: String,
    pub approve: bool,
    /// Why, for a denial.
    #[serde(default)]
    pub reason: Option<String>,
}

/// `spawn.cancel` (the requester): withdraw a pending request.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnCancelRequest {
    pub id: String,
}

/// `spawn.list`: requests, newest first.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnListRequest {
    #[serde(default)]
    pub state: Option<SpawnState>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnListResponse {
    pub requests: Vec<SpawnRequest>,
}

/// `agents.despawn`: despawn an agent and its subtree (agents: only their descendants).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsDespawnRequest {
    pub handle: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsDespawnResponse {
    pub despawned: Vec<String>,
}

/// `audit.list` (operators): the audit log since a time.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditListRequest {
    /// Only entries newer than this many seconds ago (all when absent).
    #[serde(default)]
    pub since_secs: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditListResponse {
    pub entries: Vec<AuditEntry>,
}
