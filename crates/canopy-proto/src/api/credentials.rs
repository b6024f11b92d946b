//! Who may log in: `operators.*` (add, list, revoke), `runners.add`/`remove` and
//! `credentials.rotate`.
//!
//! Responses that carry a secret print it redacted in `Debug`. Does not write credential
//! files (the daemon does).

use canopy_core::{Account, RunnerId};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `operators.add`: another operator, with a token of its own (shown once).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorsAddRequest {
    pub handle: String,
    /// Display name; the handle when absent.
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorsAddResponse {
    pub account: Account,
    /// The new operator's bearer token: shown once, stored only as a hash.
    pub token: String,
}

impl std::fmt::Debug for OperatorsAddResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorsAddResponse").field("account", &self.account).finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorsListRequest {}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorsListResponse {
    pub operators: Vec<Account>,
}

/// `operators.revoke`: an operator's token stops working at once.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorsRevokeRequest {
    pub handle: String,
}

/// `runners.add`: a credential for a new runner (operators).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunnersAddRequest {
    /// The runner's id: lowercase letters, digits and hyphens, at most 64 bytes.
    pub id: String,
}

/// A runner's credential, as it goes into the file the runner reads.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunnerCredentialWire {
    pub workspace_id: String,
    pub runner_id: RunnerId,
    pub nats_user: String,
    pub nats_password: String,
    pub token: String,
}

impl std::fmt::Debug for RunnerCredentialWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerCredentialWire").field("runner_id", &self.runner_id).finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunnersAddResponse {
    pub credential: RunnerCredentialWire,
    /// Where the daemon wrote it (mode 0600), for a runner on this machine.
    pub path: String,
    /// Whether the NATS server already accepts it: true for the managed server; for an
    /// external one, install `canopy nats-config` again.
    pub applied: bool,
}

/// `runners.remove`: revoke a runner's credential (operators).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunnersRemoveRequest {
    pub id: String,
}

/// `credentials.rotate`: new passwords and tokens for every NATS login and runner (operators).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialsRotateRequest {}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialsChangedResponse {
    /// The NATS users now accepted.
    pub users: Vec<String>,
    /// Whether the NATS server already applied the change (see `RunnersAddResponse`).
    pub applied: bool,
}
