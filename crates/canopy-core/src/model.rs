//! The model: accounts, channels, topics and messages as every layer sees them.
//!
//! These are the values the store reads back and the wire carries, so they derive serde and
//! JSON Schema. Owns the closed sets (kinds, policies, states) and their string forms. Does
//! not decide anything; the rules live in `acl` and `tree`.

use crate::ids::{Incarnation, RunnerId, Seq};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::macros::string_enum;
use crate::names::{ChannelName, Handle, RoleName, TopicName};

/// Whether an account is a human or an agent in the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AccountKind {
    Operator,
    Agent,
    /// Canopy itself: the author of notices (crash loops, stalls). Never a caller.
    System,
}
string_enum!(AccountKind { Operator => "operator", Agent => "agent", System => "system" });

/// The durable state of an account. Presence (working, idle, ...) is runtime and lives elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AccountState {
    Active,
    Crashed,
    Despawned,
    /// An operator whose token was revoked (`canopy operators revoke`).
    Revoked,
}
string_enum!(AccountState { Active => "active", Crashed => "crashed", Despawned => "despawned", Revoked => "revoked" });

/// What a channel is for (DESIGN section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChannelKind {
    Home,
    Coordination,
    Broadcast,
    General,
    Direct,
}
string_enum!(ChannelKind {
    Home => "home",
    Coordination => "coordination",
    Broadcast => "broadcast",
    General => "general",
    Direct => "direct",
});

/// Who may post in a channel. Operators may always post.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PostPolicy {
    /// Every subscriber.
    Open,
    /// Only the channel's owner.
    OwnerOnly,
    /// Only the accounts on the channel's poster list.
    Restricted,
}
string_enum!(PostPolicy { Open => "open", OwnerOnly => "owner_only", Restricted => "restricted" });

/// Whether subscribers may leave a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SubscriptionPolicy {
    Mandatory,
    Optional,
}
string_enum!(SubscriptionPolicy { Mandatory => "mandatory", Optional => "optional" });

/// The workspace: one per data directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Workspace {
    /// Random id chosen at `init`; prefixes every NATS subject.
    pub id: String,
    pub name: String,
    pub mission: String,
    pub created_at: String,
}

/// An account as the API shows it. Tokens never leave the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Account {
    pub handle: Handle,
    pub display_name: String,
    pub kind: AccountKind,
    /// `None` for operators.
    pub role: Option<RoleName>,
    /// The parent in the tree; `None` for the Supervisor and operators.
    pub parent: Option<Handle>,
    pub home_channel: Option<ChannelName>,
    pub charter: String,
    pub state: AccountState,
    pub created_at: String,
}

/// One node of the agent tree, children ordered by handle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TreeNode {
    pub handle: Handle,
    pub display_name: String,
    pub role: RoleName,
    pub state: AccountState,
    pub children: Vec<TreeNode>,
    /// Children left out of `children` (a view around an agent shows only so much).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub omitted: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// A channel as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Channel {
    pub name: ChannelName,
    pub kind: ChannelKind,
    pub post_policy: PostPolicy,
    pub subscription_policy: SubscriptionPolicy,
    pub owner: Option<Handle>,
    /// The poster list of a `restricted` channel (operators may always post).
    pub posters: Vec<Handle>,
    pub subscribers: u64,
    /// Sequence of the newest message, 0 when empty.
    pub last_seq: Seq,
    pub created_at: String,
    /// Whether a post wakes idle recipients.
    #[serde(default)]
    pub wake: WakePolicy,
}

/// A topic inside a channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Topic {
    pub channel: ChannelName,
    pub name: TopicName,
    pub created_by: Handle,
    pub messages: u64,
    pub last_seq: Seq,
    pub last_activity_at: String,
    pub resolved: bool,
}

/// Who sent a message: enough to attribute it without another lookup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sender {
    pub handle: Handle,
    pub kind: AccountKind,
    pub role: Option<RoleName>,
}

/// A committed message. `seq` is global, dense per commit order, and never reused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub seq: Seq,
    pub channel: ChannelName,
    pub topic: TopicName,
    pub sender: Sender,
    pub body: String,
    /// Well-formed `@handles` found in the body, in order, without duplicates.
    pub mentions: Vec<Handle>,
    pub created_at: String,
}

/// One subscription of an account: the channel, whether it may leave, and its cursor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Subscription {
    pub channel: ChannelName,
    pub mandatory: bool,
    /// Highest message sequence acknowledged in this channel.
    pub cursor: Seq,
}

/// Where an agent's session is, as the roster shows it (DESIGN section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Presence {
    Starting,
    Working,
    Idle,
    Compacting,
    WaitingApproval,
    /// Its budget (or its subtree's) is spent: nothing new starts until it is raised or renews.
    PausedBudget,
    /// Its turn keeps failing to reach the model (API errors, retries); `reason` says how.
    Failing,
    Stalled,
    Crashed,
    Offline,
    Despawned,
}
string_enum!(Presence {
    Starting => "starting",
    Working => "working",
    Idle => "idle",
    Compacting => "compacting",
    WaitingApproval => "waiting_approval",
    PausedBudget => "paused_budget",
    Failing => "failing",
    Stalled => "stalled",
    Crashed => "crashed",
    Offline => "offline",
    Despawned => "despawned",
});

/// Whether the operator wants an agent's session running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Desired {
    Running,
    Stopped,
}
string_enum!(Desired { Running => "running", Stopped => "stopped" });

/// One roster line: an agent and its live state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RosterEntry {
    pub handle: Handle,
    pub display_name: String,
    pub role: RoleName,
    pub parent: Option<Handle>,
    pub presence: Presence,
    /// Why the agent is idle (or stalled, crashed, offline), when known.
    pub reason: Option<String>,
    /// A line the agent sets about what it is doing (`comms_set_activity`).
    pub activity: Option<String>,
    pub desired: Desired,
    /// The current session's incarnation, 0 before the first session.
    pub incarnation: Incarnation,
    /// The runner hosting the session, when one is.
    pub runner: Option<RunnerId>,
    pub harness: String,
    pub last_seen: Option<String>,
    /// Messages waiting for its next turn start.
    pub pending: u64,
    /// Whether `pending` is past the configured cap (the operator has been told).
    pub overflow: bool,
    /// Whether its sessions run without confinement (`[sandbox] mode = "off"`).
    #[serde(default)]
    pub unconfined: bool,
    /// Whether its sessions share the machine's network (`[sandbox] network = "host"`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_network: bool,
    /// Connections its current session's egress proxy refused.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub egress_refused: u64,
    /// The budget nearest its limit among those covering it, once at 80% or more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetMark>,
    /// Why its lane left its first harness (`claude failing: rate limited`), while it is on
    /// another of its role's chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<String>,
    /// Since when the agent has been in this presence (RFC 3339): how long a failing agent has
    /// waited for the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

/// One budget as `canopy usage` shows it: whose, what it covers, and its current window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetStatus {
    pub owner: Handle,
    pub scope: crate::budget::Scope,
    pub limit: crate::budget::Amount,
    /// Spent in the current window (for a subtree: everyone it covers).
    pub spent: crate::budget::Spent,
    /// What is left to give a child from it: the limit less the spend and less the unspent
    /// part of the subtree budgets below it.
    pub left: crate::budget::Amount,
    /// The period (`1day`), absent for a lifetime budget.
    #[serde(default)]
    pub period: Option<String>,
    pub window_start: String,
    /// When the window renews, absent for a lifetime budget.
    #[serde(default)]
    pub renews_at: Option<String>,
    pub level: crate::budget::Level,
    pub percent: u32,
    /// Who set it: `operator`, `role` (a `[budgets.roles]` default) or `spawn` (the approved
    /// request's proposal).
    pub source: String,
}

/// How close an agent is to a budget that covers it (the roster's mark).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetMark {
    pub level: crate::budget::Level,
    /// Spent, in percent of the budget (the larger of dollars and tokens).
    pub percent: u32,
    /// Whose budget it is, and what it covers.
    pub owner: Handle,
    pub scope: crate::budget::Scope,
}

/// One stored activity item of a session: a normalised harness event, redacted and bounded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActivityItem {
    /// Global, increasing; followers page with it.
    pub id: u64,
    pub agent: Handle,
    pub incarnation: Incarnation,
    pub at: String,
    /// `turn_started`, `turn_ended`, `text`, `tool_started`, `tool_finished`, `compaction`,
    /// `status`, `session_started`, `session_exited`, `presence`, ...
    pub kind: String,
    pub turn_id: Option<String>,
    /// A short, redacted, one-line summary for display.
    pub summary: String,
    /// The redacted event details, bounded in size.
    pub detail: serde_json::Value,
}

/// Where a spawn request is (DESIGN section 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SpawnState {
    Pending,
    Approved,
    Spawned,
    Failed,
    Denied,
    Expired,
    Cancelled,
}
string_enum!(SpawnState {
    Pending => "pending",
    Approved => "approved",
    Spawned => "spawned",
    Failed => "failed",
    Denied => "denied",
    Expired => "expired",
    Cancelled => "cancelled",
});

/// Whether a post to a channel starts a turn for an idle recipient: `always`, `mentions` (only
/// the agents it @mentions; the rest get it at their next turn start) or `never`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WakePolicy {
    #[default]
    Always,
    Mentions,
    Never,
}
string_enum!(WakePolicy {
    Always => "always",
    Mentions => "mentions",
    Never => "never",
});

impl WakePolicy {
    /// A channel's policy when none was set: broadcasts wake only those they mention, except
    /// `#incidents`, which wakes everyone; every other channel wakes.
    pub fn default_for(kind: ChannelKind, name: &str) -> WakePolicy {
        match kind {
            ChannelKind::Broadcast if name != "incidents" => WakePolicy::Mentions,
            _ => WakePolicy::Always,
        }
    }

    /// Why an idle recipient is not woken by a post under this policy (`None`: it is woken),
    /// unless the post forces a wake or mentions it.
    pub fn quiet_reason(self, channel: &str) -> Option<String> {
        match self {
            WakePolicy::Always => None,
            WakePolicy::Mentions => {
                Some(format!("no wake: #{channel} wakes only the agents it mentions; delivered at its next turn start"))
            }
            WakePolicy::Never => Some(format!("no wake: #{channel} wakes no one; delivered at its next turn start")),
        }
    }
}

/// A request for a child Manager, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnRequest {
    /// `req-<n>`.
    pub id: String,
    pub requester: Handle,
    pub handle: Handle,
    pub display_name: String,
    pub role: RoleName,
    pub charter: String,
    pub reason: String,
    /// The repository the child gets a checkout of (the request's, else the requester's).
    #[serde(default)]
    pub repo: Option<String>,
    /// The child's subtree budget the requester proposed, carved from the one above it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::budget::Amount>,
    pub state: SpawnState,
    pub decided_by: Option<Handle>,
    /// The denial reason, or why a spawn failed.
    pub note: Option<String>,
    pub created_at: String,
    pub decided_at: Option<String>,
    pub expires_at: String,
}

/// A repository in the workspace: the operator's canonical copy and how to check it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Repo {
    pub name: String,
    /// The canonical repository: a path or a URL. Agents never write it.
    pub source: String,
    /// The branch merges land on.
    pub base: String,
    /// The command of the check named `check` (the single check of old; empty: none).
    pub check: String,
    /// Every named check, run on each run's tree, each new commit of a standing agent's
    /// branch, each merge request's merged tree and in the merge queue.
    #[serde(default)]
    pub checks: Vec<NamedCheck>,
    /// Whose word makes a merge request reviewed.
    #[serde(default)]
    pub review: ReviewPolicy,
    /// Canopy's mirror, which every checkout shares objects with.
    pub mirror: String,
    pub created_at: String,
}

/// One check of a repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NamedCheck {
    pub name: String,
    /// Run with `sh -c`, confined, in a checkout of the commit.
    pub command: String,
}

/// Whose word makes a merge request reviewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReviewPolicy {
    /// The operator's approval is the review; a reviewer run is started only when a Manager
    /// asks (`review_request`), and its `changes_requested` still needs `--override`.
    #[default]
    Operator,
    /// Canopy starts a reviewer run on every merge request; approving needs its `approve`.
    Required,
}
string_enum!(ReviewPolicy {
    Operator => "operator",
    Required => "required",
});

/// A reviewer's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Approve,
    ChangesRequested,
}
string_enum!(Verdict {
    Approve => "approve",
    ChangesRequested => "changes_requested",
});

/// Where a merge request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MergeState {
    /// Its merged tree is being checked; the operator is asked once the check has run.
    Checking,
    /// Checked, and waiting for a review's verdict (the repository requires one, or the last
    /// verdict asked for changes).
    InReview,
    /// Waiting for the operator's decision.
    Pending,
    /// Approved, waiting in its repository's merge queue.
    Queued,
    /// At the head of the queue: merged onto the base in a scratch tree and checked there;
    /// the base moves only when every check passes.
    Merging,
    Merged,
    Denied,
    /// Approved, but refused: a conflict with the base, a failing check, a base that moved.
    Refused,
}
string_enum!(MergeState {
    Checking => "checking",
    InReview => "in_review",
    Pending => "pending",
    Queued => "queued",
    Merging => "merging",
    Merged => "merged",
    Denied => "denied",
    Refused => "refused",
});

/// A Manager's request to merge its branch into its repository's base branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeRequest {
    /// `merge-<n>`.
    pub id: String,
    pub requester: Handle,
    pub repo: String,
    /// The branch asked to merge (`canopy/<handle>`) and its commit when asked.
    pub branch: String,
    pub head: String,
    pub base: String,
    pub title: String,
    pub summary: String,
    /// Requests that must merge first (`merge-<n>`).
    pub depends_on: Vec<String>,
    pub state: MergeState,
    /// `<short sha> <subject>` of each commit not on the base.
    pub commits: Vec<String>,
    pub diffstat: String,
    /// The check on the merged tree: `passed (...)`, `failed (...)`, or `none configured`.
    pub check: String,
    pub decided_by: Option<Handle>,
    /// The denial reason, or why the merge was refused.
    pub note: Option<String>,
    /// The base branch's commit after the merge.
    pub merged_commit: Option<String>,
    pub created_at: String,
    pub decided_at: Option<String>,
    /// The newest review verdict on its current head (none: not reviewed, or reviewed at an
    /// older head).
    #[serde(default)]
    pub verdict: Option<Verdict>,
    /// Why the operator approved it over a missing or negative verdict (`--override`).
    #[serde(default)]
    pub override_reason: Option<String>,
    /// When it entered its repository's merge queue.
    #[serde(default)]
    pub queued_at: Option<String>,
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditEntry {
    pub id: u64,
    pub at: String,
    pub actor: Option<Handle>,
    pub action: String,
    pub target: String,
    pub detail: String,
}

/// Tokens (and cost, where the harness reports it) summed over some model turns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageTotals {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    /// The sum of the costs reported; absent when no counted report carried one.
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// Usage reports counted (one per model turn).
    pub reports: u64,
    /// Of those, how many carried no cost (so a cost shown is a lower bound).
    pub reports_without_cost: u64,
    /// Of those with a cost, how many had it computed from `[pricing]` (the harness reported
    /// tokens only).
    #[serde(default)]
    pub reports_with_computed_cost: u64,
    /// Of those, how many are estimates for turns whose usage never arrived (yet).
    #[serde(default)]
    pub reports_estimated: u64,
}

/// A model's prices (`[pricing.<model>]`), in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Price {
    pub input: f64,
    pub cached_input: f64,
    pub output: f64,
}

impl Price {
    /// The cost of a turn from its tokens: fresh input, cached input (read from the cache)
    /// and output. Cache writes are priced as input.
    pub fn cost(&self, input: u64, cache_read: u64, cache_write: u64, output: u64) -> f64 {
        let m = |n: u64, p: f64| n as f64 * p / 1_000_000.0;
        m(input + cache_write, self.input) + m(cache_read, self.cached_input) + m(output, self.output)
    }
}

#[cfg(test)]
mod price_tests {
    #[test]
    fn a_turn_is_priced_per_million_tokens_by_kind() {
        let price = super::Price { input: 2.0, cached_input: 0.5, output: 10.0 };
        let cost = price.cost(1_000_000, 200_000, 0, 100_000);
        assert!((cost - 3.1).abs() < 1e-9, "{cost}");
        assert!((price.cost(0, 0, 500_000, 0) - 1.0).abs() < 1e-9, "a cache write is priced as input");
    }
}

/// One row of `canopy usage`: an agent's, a session's or a turn's totals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageRow {
    pub agent: Handle,
    /// Set for a session's or a turn's row.
    #[serde(default)]
    pub incarnation: Option<Incarnation>,
    /// Set for a turn's row.
    #[serde(default)]
    pub turn_id: Option<String>,
    /// The newest report counted.
    pub last_at: String,
    pub totals: UsageTotals,
}
