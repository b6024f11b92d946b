//! The merge gate: `merges.request` (an agent asks to merge its branch), `merges.list` and
//! `merges.decide` (operators).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `merges.request` (agents, as `merge_request`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergesRequestRequest {
    /// One line; the request is discussed under topic `merge: <title>`.
    pub title: String,
    pub summary: String,
    /// Your earlier requests this one stacks on (`merge-<n>`); they merge first.
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// Issues this request works on: when it lands, each one's owner is told (the owner
    /// closes it).
    #[serde(default)]
    pub issues: Vec<u64>,
}

/// `merges.list` (operators).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergesListRequest {
    #[serde(default)]
    pub state: Option<canopy_core::MergeState>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergesListResponse {
    pub merges: Vec<canopy_core::MergeRequest>,
}

/// `merges.decide` (operators; an agent's attempt is refused and audited).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergesDecideRequest {
    /// `merge-<n>`.
    pub id: String,
    pub approve: bool,
    #[serde(default)]
    pub reason: Option<String>,
}
