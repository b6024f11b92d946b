//! Accounts and the tree: `whoami`, `agents.*` (create, list, show, reparent, set_activity),
//! `tree`, `roster` and `activity.read`, with the activity event.
//!
//! Starting, stopping and interrupting an agent's session are `sessions`; its budget is
//! `budgets`; despawning is `gate`.

use canopy_core::{Account, ActivityItem, Presence, RosterEntry, Subscription, TreeNode, Workspace};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub(crate) fn default_role() -> String {
    "manager".to_owned()
}

/// `whoami`: who the token belongs to, and which workspace this is.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WhoamiRequest {}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WhoamiResponse {
    pub account: Account,
    pub workspace: Workspace,
    /// The daemon's version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// For an agent: the native tools registered for its session (its MCP tool list).
    #[serde(default)]
    pub tools: Vec<String>,
    /// Issues blocked on the operator's answer: every one for an operator, an agent's own.
    #[serde(default)]
    pub waiting_issues: Vec<canopy_core::issues::IssueSummary>,
}

/// `agents.create`: provision a standing agent (operators only).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsCreateRequest {
    pub handle: String,
    /// Display name, e.g. `CI Manager`.
    pub name: String,
    #[serde(default = "default_role")]
    pub role: String,
    /// Parent handle; the Supervisor when absent.
    #[serde(default)]
    pub parent: Option<String>,
    #[serde(default)]
    pub charter: String,
    /// The harness that runs the agent's session; the role's default from `canopy.toml`
    /// when absent.
    #[serde(default)]
    pub harness: Option<String>,
    /// A script for the scripted harness, sent as text so remote runners need no files.
    #[serde(default)]
    pub script: Option<ScriptSource>,
    /// A persona overlay, rendered last in the agent's prompt.
    #[serde(default)]
    pub persona: Option<String>,
    /// A repository (`canopy repos add`): the agent works in its own checkout of it, on
    /// branch `canopy/<handle>` from the base branch.
    #[serde(default)]
    pub repo: Option<String>,
    /// Runner labels its sessions need (`gpu`), besides its role's `[roles.<role>] needs`:
    /// it is placed only on a runner that has every one.
    #[serde(default)]
    pub needs: Vec<String>,
}

/// One subagent definition file for a harness's own subagent mechanism.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubagentFile {
    /// The definition's name (`implementer`).
    pub name: String,
    pub description: String,
    /// Its body, with the `requires:` lines its parent keeps.
    pub body: String,
}

/// A scripted-harness script: the file name (for error messages) and its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScriptSource {
    pub name: String,
    pub text: String,
}

/// `agents.list`: every agent (not operators), ordered by handle.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsListRequest {
    /// Only agents whose handle comes after this one (the next page).
    #[serde(default)]
    pub after: Option<String>,
    /// At most this many (default and at most 5,000; `ApiClient::agents_all` pages through).
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsListResponse {
    pub agents: Vec<Account>,
    /// Agents beyond this page (pass the last handle as `after` for them).
    #[serde(default)]
    pub more: u32,
}

/// `agents.show`: one account with its subscriptions and children.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsShowRequest {
    pub handle: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsShowResponse {
    pub account: Account,
    pub children: Vec<String>,
    pub subscriptions: Vec<Subscription>,
}

/// `agents.reparent`: move an agent under another (refuses cycles and the Supervisor).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsReparentRequest {
    pub handle: String,
    pub parent: String,
}

/// `tree`: the whole agent tree from the Supervisor down, read fresh.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TreeRequest {
    /// For an agent: how many levels of its own subtree to show (default 2, at most 5).
    /// Operators always get the whole tree.
    #[serde(default)]
    pub depth: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TreeResponse {
    pub root: TreeNode,
}

/// `agents.set_activity`: the caller's roster activity line (agents only; empty clears it).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetActivityRequest {
    pub text: String,
}

/// Most roster entries one page holds for an agent (operators get every agent by default).
pub const MAX_ROSTER_PAGE: u32 = 200;

/// Most entries in an operator's page of the roster or the agent list: a page stays well
/// inside a NATS message (a few hundred bytes an entry against the 4 MB the private server
/// allows). Clients page with `after`.
pub const MAX_OPERATOR_PAGE: u32 = 5_000;

/// `roster`: agents' live state, ordered by handle, optionally filtered.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RosterRequest {
    /// Only agents in this presence (`idle`, `working`, `offline`, ...).
    #[serde(default)]
    pub presence: Option<Presence>,
    /// Only these agents.
    #[serde(default)]
    pub handles: Vec<String>,
    /// Only agents whose handle comes after this one (the next page).
    #[serde(default)]
    pub after: Option<String>,
    /// At most this many (agents: default and at most 200; operators: default and at most
    /// 5,000, `ApiClient::roster_all` pages through every one).
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RosterResponse {
    pub agents: Vec<RosterEntry>,
    /// Agents that matched beyond this page (pass the last handle as `after` for them).
    #[serde(default)]
    pub more: u32,
}

/// `activity.read`: an agent's stored activity after an id (operators only).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActivityReadRequest {
    pub agent: String,
    #[serde(default)]
    pub after: u64,
    #[serde(default)]
    pub limit: Option<u32>,
    /// Only the newest `tail` items (ignores `after`), for a first screen.
    #[serde(default)]
    pub tail: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActivityReadResponse {
    pub items: Vec<ActivityItem>,
    pub next_after: u64,
    pub more: bool,
}

/// Published on `canopy.<ws>.evt.activity.<agent>`: a doorbell with the item.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActivityEvent {
    pub item: ActivityItem,
}
