//! Request and response bodies for every API method, and the message event.
//!
//! Requests carry names as plain strings: the daemon parses them at the edge so a bad name
//! comes back as `invalid_argument` naming its field. Every request rejects unknown fields.
//! Responses reuse the model types from `canopy-core`.

use canopy_core::continuity::HistoryItem;
use canopy_core::{
    Account, ActivityItem, AuditEntry, Channel, ChannelKind, Incarnation, Message, PostPolicy, Presence, RosterEntry,
    RunnerId, Seq, SpawnRequest, SpawnState, Subscription, Topic, TopicName, TreeNode, UsageRow, UsageTotals,
    Workspace,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default page size of `messages.read` and `messages.sync`.
pub const DEFAULT_READ_LIMIT: u32 = 100;
/// Largest page size of `messages.read` and `messages.sync`.
pub const MAX_READ_LIMIT: u32 = 1000;

fn default_role() -> String {
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

/// `channels.list`: every channel, ordered by name.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChannelsListRequest {}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChannelsListResponse {
    pub channels: Vec<Channel>,
}

/// `channels.create`: an operator-made channel. Only `general` and `broadcast` kinds can
/// be created this way; the daemon makes home, coordination and direct channels itself.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChannelsCreateRequest {
    pub name: String,
    #[serde(default)]
    pub kind: Option<ChannelKind>,
    /// Defaults to `open` for general channels and `restricted` for broadcast ones.
    #[serde(default)]
    pub post_policy: Option<PostPolicy>,
    /// Poster list for `restricted` channels (handles).
    #[serde(default)]
    pub posters: Vec<String>,
    /// Whether posts wake idle recipients; default `mentions` for broadcast channels (but
    /// `#incidents`), `always` for general ones.
    #[serde(default)]
    pub wake: Option<canopy_core::WakePolicy>,
}

/// `topics.list`: the topics of a channel, most recent activity first.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopicsListRequest {
    pub channel: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopicsListResponse {
    pub topics: Vec<Topic>,
}

/// `messages.post`: commit one message to a channel and topic.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostRequest {
    pub channel: String,
    pub topic: String,
    pub body: String,
    /// Start the topic if it does not exist yet.
    #[serde(default)]
    pub create_topic: bool,
    /// A retry with the same key (from the same sender) returns the first result.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// An acknowledgement only: recipients see it at their next turn, but it wakes no one.
    #[serde(default)]
    pub ack_only: bool,
    /// Wake every idle recipient, whatever the channel's wake policy (operators only).
    #[serde(default)]
    pub wake: bool,
}

pub use canopy_core::delivery::{Outcome, OutcomeCounts, RecipientOutcome};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostResponse {
    pub message: Message,
    /// True when this was a retry and the stored message was returned (no new deliveries).
    pub duplicate: bool,
    /// Per recipient; for posts reaching more than 100 agents, only the mentioned ones and
    /// those refused (the counts cover everyone).
    pub outcomes: Vec<RecipientOutcome>,
    pub counts: OutcomeCounts,
    /// `@handles` in the body that name no account.
    pub unknown_mentions: Vec<String>,
}

/// `messages.read`: a page of a channel's messages after a sequence, grouped by topic.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadRequest {
    pub channel: String,
    #[serde(default)]
    pub topic: Option<String>,
    /// Return messages with a sequence above this one.
    #[serde(default)]
    pub after: Seq,
    #[serde(default)]
    pub limit: Option<u32>,
    /// Only what has not reached you yet: messages past your own cursor in this channel
    /// (agents; an operator has no cursor to read from).
    #[serde(default)]
    pub unread: bool,
    /// The newest page (the last `limit` messages after `after`) instead of the oldest;
    /// `more` then says older ones exist. Still oldest first within the page.
    #[serde(default)]
    pub newest: bool,
}

/// The messages of one topic inside a page, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopicGroup {
    pub topic: TopicName,
    pub messages: Vec<Message>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadResponse {
    pub channel: String,
    /// Groups in order of each topic's first message in the page.
    pub groups: Vec<TopicGroup>,
    /// Pass as `after` to get the next page.
    pub next_after: Seq,
    /// Whether more messages follow this page.
    pub more: bool,
}

/// `messages.sync`: a flat page of messages after a sequence, for followers catching up.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SyncRequest {
    #[serde(default)]
    pub after: Seq,
    #[serde(default)]
    pub channel: Option<String>,
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SyncResponse {
    pub messages: Vec<Message>,
    pub next_after: Seq,
    pub more: bool,
}

/// Published on `canopy.<ws>.evt.message.<channel>` after a message commits. A doorbell:
/// followers that missed one catch up with `messages.sync`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageEvent {
    pub message: Message,
}

/// `agents.start` / `agents.stop`: whether an agent's session should run. Starting a
/// `crashed` agent clears the crash.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsStartStopRequest {
    pub handle: String,
}

/// `agents.interrupt` (operators): stop the agent's running turn. The session stays up.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsInterruptRequest {
    pub handle: String,
}

/// Reply to `agents.interrupt`. An idle agent is not an error: `interrupted` is false and
/// `reason` says why.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsInterruptResponse {
    pub agent: String,
    /// The live session's incarnation, which the interrupt leaves running.
    pub incarnation: Incarnation,
    /// Whether a turn was running and the harness was asked to stop it.
    pub interrupted: bool,
    /// The turn that was running.
    #[serde(default)]
    pub turn_id: Option<String>,
    /// Why nothing was interrupted.
    #[serde(default)]
    pub reason: Option<String>,
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

/// A session the runner hosts, as it reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunningSession {
    pub agent: String,
    pub incarnation: Incarnation,
}

/// `runners.sync`: a runner's heartbeat; the reply is the set of sessions it should host.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunnersSyncRequest {
    /// The runner's id: its credential's, so it must match the token the request carries.
    pub runner_id: RunnerId,
    /// Random per start of the runner's process: a new one ends the sessions an earlier
    /// process of the same runner left recorded as live.
    #[serde(default)]
    pub boot: String,
    pub name: String,
    /// The runner's MCP endpoint, for the record.
    pub mcp_url: String,
    /// Most sessions this runner will host.
    pub capacity: u32,
    pub running: Vec<RunningSession>,
}

/// Everything a runner needs to start one session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionAssignment {
    pub agent: String,
    pub display_name: String,
    pub role: String,
    pub incarnation: Incarnation,
    /// The session's bearer token: binds every tool call to this agent.
    pub token: String,
    pub harness: String,
    pub script: Option<ScriptSource>,
    /// The system prompt the session starts with.
    pub system_prompt: String,
    /// Whether `system_prompt` replaces the harness's default or is appended to it.
    pub prompt_mode: PromptMode,
    /// The rendered prompt's content hash (`canopy prompt render` prints the same).
    pub prompt_hash: String,
    /// The harness's working directory (empty: the runner's default for the agent).
    pub cwd: String,
    /// When `cwd` is a checkout: its repository's mirror, which the session may read.
    #[serde(default)]
    pub repo_mirror: Option<String>,
    /// Subagent definitions for the harness's own subagents (omp's `task` tool), when the
    /// role delegates natively: each file's name and text.
    #[serde(default)]
    pub subagents: Vec<SubagentFile>,
    /// The model the bundle asks for (a role's `model`, or a run definition's); empty: the
    /// harness's configured default.
    pub model: String,
    /// The harness's built-in tools the role allows (Claude Code's `Bash`, `Read`, ...).
    pub harness_tools: Vec<String>,
    /// Set when the session is a subagent run: its brief is the first input, and its final
    /// report goes back with `runs.finish`.
    pub run: Option<RunAssignment>,
    pub home_channel: String,
    pub charter: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunnersSyncResponse {
    /// Sessions the runner reported running that it should keep. Anything else it runs
    /// that is neither here nor in `start` must stop.
    pub keep: Vec<RunningSession>,
    /// Sessions to start, with everything needed (at most `SYNC_START_BATCH` per sync).
    pub start: Vec<SessionAssignment>,
    /// More sessions wait to be started: sync again at once.
    pub more: bool,
}

pub use canopy_core::harness::PromptMode;

/// Most sessions handed to a runner to start in one sync (keeps replies small).
pub const SYNC_START_BATCH: usize = 100;

/// One thing that happened in a session, as a runner reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionReport {
    pub agent: String,
    pub incarnation: Incarnation,
    /// The presence this event implies, when it implies one.
    #[serde(default)]
    pub presence: Option<Presence>,
    /// Why, for idle, crashed or offline.
    #[serde(default)]
    pub reason: Option<String>,
    /// Activity to store: `kind`, optional `turn_id`, `summary`, `detail`.
    #[serde(default)]
    pub activity: Option<ReportedActivity>,
    /// The session ended (`reason` says how); its token stops working.
    #[serde(default)]
    pub ended: bool,
    /// The session crashed too often: mark the agent `crashed` and tell the operator.
    #[serde(default)]
    pub crash_loop: bool,
    /// With `crash_loop`: the session could not start at all and retrying cannot help (it
    /// cannot be confined); `reason` says why, and the notice says so instead of "crashed
    /// repeatedly".
    #[serde(default)]
    pub fatal: bool,
    /// Tokens (and cost) one model turn used, from the harness's usage event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ReportedUsage>,
}

/// Token counts of one model turn, whichever harness reported them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportedUsage {
    #[serde(default)]
    pub turn_id: Option<String>,
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_read_tokens: u64,
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// The model the session runs (or, without one, its harness's name), for `[pricing]`.
    #[serde(default)]
    pub model: Option<String>,
    /// In US dollars, when the harness knows it.
    #[serde(default)]
    pub cost_usd: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportedActivity {
    pub kind: String,
    #[serde(default)]
    pub turn_id: Option<String>,
    pub summary: String,
    #[serde(default)]
    pub detail: serde_json::Value,
}

/// `sessions.report`: a batch of session events from one runner.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionsReportRequest {
    pub runner_id: RunnerId,
    pub reports: Vec<SessionReport>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionsReportResponse {
    /// Reports applied; the rest were for stale incarnations and were ignored.
    pub applied: u32,
    pub ignored: u32,
}

/// `deliveries.pull` (runners): an agent's pending messages, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesPullRequest {
    pub runner_id: RunnerId,
    pub agent: String,
    pub incarnation: Incarnation,
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesPullResponse {
    pub messages: Vec<Message>,
    /// Whether any of them may start a turn (not held by the loop guard, not acks only).
    pub wake: bool,
    /// All pending messages (the page may hold fewer).
    pub total: u64,
    /// Of `messages`, those an earlier session of the agent was handed and never confirmed:
    /// it may have seen them before it ended (the at-least-once window).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redelivered: Vec<Seq>,
}

/// `deliveries.ack` (runners): the harness accepted these messages at a turn start.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesAckRequest {
    pub runner_id: RunnerId,
    pub agent: String,
    pub incarnation: Incarnation,
    pub seqs: Vec<Seq>,
    /// These were steered into a running turn (ahead of the cursor), not delivered at a
    /// turn start: they are recorded one by one and the cursors stay.
    #[serde(default)]
    pub steered: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesAckResponse {
    /// Cursors that moved (0 for a repeated acknowledgement).
    pub moved: u32,
}

/// `channels.subscribe` / `channels.unsubscribe`: the caller joins or leaves a channel.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChannelRequest {
    pub channel: String,
}

/// `channels.open_direct`: a two-party channel with a peer, the parent or a report.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenDirectRequest {
    pub peer: String,
}

/// `topics.rename` (operators).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopicsRenameRequest {
    pub channel: String,
    pub topic: String,
    pub to: String,
}

/// `topics.resolve` (operators): mark a topic resolved, or open it again.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopicsResolveRequest {
    pub channel: String,
    pub topic: String,
    #[serde(default = "yes")]
    pub resolved: bool,
}

fn yes() -> bool {
    true
}

/// `board.pin`: pin a message of a channel to its board (a pointer, not a copy).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BoardPinRequest {
    pub channel: String,
    pub seq: Seq,
}

/// `board.list`: a channel's pinned messages.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BoardListRequest {
    pub channel: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BoardResponse {
    pub channel: String,
    pub pins: Vec<Message>,
}

/// Empty success.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Done {}

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

/// On `canopy.<ws>.runner.<id>.deliver`: these agents have new messages.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliverDoorbell {
    pub agents: Vec<String>,
}

/// Request on `canopy.<ws>.runner.<id>.steer`: inject this message into the agent's turn.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SteerRequest {
    pub agent: String,
    pub incarnation: Incarnation,
    pub message: Message,
    /// Unix milliseconds after which the poster has stopped waiting (it reported a
    /// fallback): a runner that sees the request later must not steer it.
    pub not_after_ms: u64,
}

/// Reply to a steer request.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SteerReply {
    pub steered: bool,
    #[serde(default)]
    pub turn_id: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    /// Unix microseconds when the steer's line was written to the harness.
    #[serde(default)]
    pub written_at_us: Option<u64>,
}

/// Request on `canopy.<ws>.runner.<id>.interrupt`: stop this session's running turn.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InterruptRequest {
    pub agent: String,
    pub incarnation: Incarnation,
}

/// Reply to an interrupt request.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InterruptReply {
    /// Whether a turn was running and the harness was told to stop it.
    pub interrupted: bool,
    #[serde(default)]
    pub turn_id: Option<String>,
    /// Why nothing was interrupted (no turn running, the session is not here).
    #[serde(default)]
    pub reason: Option<String>,
}

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

/// What a runner needs to drive a subagent run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunAssignment {
    pub id: i64,
    pub definition: String,
    pub manager: String,
    pub brief: String,
}

/// `prompts.render` (operators): exactly what a session of an agent (or a role) receives.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptsRenderRequest {
    /// An agent's handle; or
    #[serde(default)]
    pub agent: Option<String>,
    /// a role id (rendered with placeholder identity facts).
    #[serde(default)]
    pub role: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptsRenderResponse {
    pub text: String,
    /// SHA-256 of `text`, hex.
    pub hash: String,
    pub role: String,
    /// `replace` or `delta`.
    pub mode: String,
    /// How the text reaches the harness: `replace` (the whole system prompt) or `append`.
    pub delivery: String,
    pub definition: Option<String>,
    pub sections: Vec<String>,
    /// The native tools the session has.
    pub tools: Vec<String>,
    pub harness: String,
    /// Where the bundle came from (a directory, or `embedded`).
    pub bundle: String,
    /// For an agent: the hash recorded on its latest session, with the incarnation.
    pub session: Option<SessionPrompt>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionPrompt {
    pub incarnation: Incarnation,
    pub hash: String,
}

/// `prompts.skill` / `prompts.rule`: the body of a skill or rule the caller's prompt lists.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptsReadRequest {
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptsReadResponse {
    pub name: String,
    pub description: String,
    /// With lines naming tools the caller does not have left out.
    pub body: String,
}

/// A subagent run as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunInfo {
    pub id: i64,
    /// The run's own handle (`run-<id>`), as `canopy watch` shows it.
    pub handle: String,
    pub manager: String,
    pub definition: String,
    /// `running`, `done`, `failed` or `timed_out`.
    pub status: String,
    pub started_at: String,
    pub ended_at: Option<String>,
    /// The run's branch, when it has a checkout.
    #[serde(default)]
    pub branch: Option<String>,
    /// For a subagent the harness ran itself (omp's `task`): its id there; `id` is then 0.
    #[serde(default)]
    pub native: Option<String>,
}

/// `runs.start` (agents, as the `agents_run_subagent` tool): brief an ephemeral implementer.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunsStartRequest {
    /// A subagent definition (`agents/<definition>.md`), e.g. `implementer`.
    pub definition: String,
    /// The whole brief: goal, context, constraints, what done means, the report wanted.
    pub brief: String,
    /// The repository the run works on, in its own checkout; default: yours, if you have one.
    #[serde(default)]
    pub repo: Option<String>,
    /// What the run's branch starts from: a branch or commit of your checkout (default:
    /// your current HEAD), or of the repository's base when the repository is not yours.
    #[serde(default)]
    pub base: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunsStartResponse {
    pub run: RunInfo,
    /// Where the report will arrive.
    pub report_channel: String,
    pub report_topic: String,
}

/// `runs.list`: an agent's runs (operators: any agent's; agents: their own).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunsListRequest {
    #[serde(default)]
    pub agent: Option<String>,
    /// Only runs still out.
    #[serde(default)]
    pub open: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunsListResponse {
    pub runs: Vec<RunInfo>,
}

/// `runs.finish` (runners): a run's session ended its turn, or exited.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunsFinishRequest {
    pub agent: String,
    pub incarnation: Incarnation,
    /// `done` or `failed`.
    pub status: String,
    /// The run's final message (its report), or why it failed.
    pub report: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunsFinishResponse {
    /// False when the run had already ended (timed out, or reported before).
    pub recorded: bool,
}

/// `history.search` (agents; the `history_search` tool): earlier messages the caller sent or
/// received and, when asked, its tool events, newest first, as redacted, bounded excerpts.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HistorySearchRequest {
    /// Case-insensitive text to look for; everything when absent.
    #[serde(default)]
    pub query: Option<String>,
    /// A cursor from an earlier page's `next_before`: only older items.
    #[serde(default)]
    pub before: Option<String>,
    /// Items per page: default 10, at most 50.
    #[serde(default)]
    pub limit: Option<u32>,
    /// Include tool calls (name, status and a short preview only).
    #[serde(default)]
    pub include_tool_events: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HistorySearchResponse {
    pub items: Vec<HistoryItem>,
    /// Pass as `before` for the next (older) page; absent at the end.
    #[serde(default)]
    pub next_before: Option<String>,
}

/// Why a runner asks for a continuity block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ContinuityWhen {
    /// The session just started (first start, restart after a crash, respawn).
    Start,
    /// The harness reported a compaction.
    Compaction,
}

/// `sessions.continuity` (runners): the continuity block for the head of a live session's
/// next first input.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionsContinuityRequest {
    pub runner_id: RunnerId,
    pub agent: String,
    pub incarnation: Incarnation,
    pub when: ContinuityWhen,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionsContinuityResponse {
    /// At most 1,500 characters.
    pub block: String,
}

/// `usage` (operators): tokens and cost reported by sessions, per agent; for one agent also
/// per session and per recent turn.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageRequest {
    #[serde(default)]
    pub agent: Option<String>,
    /// Only reports newer than this many seconds ago (all kept when absent).
    #[serde(default)]
    pub since_secs: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageResponse {
    pub total: UsageTotals,
    pub agents: Vec<UsageRow>,
    /// For one agent: per session, newest first.
    pub sessions: Vec<UsageRow>,
    /// For one agent: its most recent turns, newest first.
    pub turns: Vec<UsageRow>,
    /// Every budget (for one agent: those that cover it), with its spend in the current window.
    #[serde(default)]
    pub budgets: Vec<canopy_core::BudgetStatus>,
}

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

/// `repos.add` (operators): register a repository; Canopy makes its mirror.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReposAddRequest {
    /// 1-40 of `a-z`, `0-9`, `-`, `_`.
    pub name: String,
    /// The canonical repository: an absolute path, or a URL git can fetch.
    pub source: String,
    /// The branch merges land on (default `main`).
    #[serde(default)]
    pub base: Option<String>,
    /// Run with `sh -c`, confined, on each run's tree and each merged tree (default none).
    #[serde(default)]
    pub check: Option<String>,
}

/// `repos.list` (operators).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReposListRequest {}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReposListResponse {
    pub repos: Vec<canopy_core::Repo>,
    /// Every checkout Canopy keeps, by account.
    pub checkouts: Vec<CheckoutInfo>,
}

/// One account's checkout.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckoutInfo {
    pub agent: String,
    pub repo: String,
    pub branch: String,
    /// `preparing`, `ready`, `merged`, `discarded`, `removed` or `failed`.
    pub state: String,
    pub path: String,
    pub note: Option<String>,
}

/// `repos.gc` (operators): find (and unless `dry_run`, remove) leftover checkouts.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReposGcRequest {
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReposGcResponse {
    pub leftovers: Vec<Leftover>,
    /// Whether they were removed.
    pub removed: bool,
}

/// A directory no live checkout owns, or a checkout whose directory is missing.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Leftover {
    pub path: String,
    pub why: String,
}

/// `workspace.status` (agents, as `workspace_status`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceStatusRequest {}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceStatusResponse {
    pub repo: String,
    /// The checked-out branch (empty when detached) and the branch that is yours.
    pub branch: String,
    pub own_branch: String,
    pub head: String,
    /// The repository's base branch, and commits ahead of and behind it.
    pub base: String,
    pub ahead: u32,
    pub behind: u32,
    /// Uncommitted or untracked files.
    pub dirty: Vec<String>,
    /// Your ended runs whose branches are neither merged nor discarded.
    pub unmerged_runs: Vec<RunBranch>,
}

/// A run's branch waiting for its Manager.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunBranch {
    pub run_id: i64,
    pub branch: String,
    /// `done`, `failed` or `timed_out`.
    pub status: String,
}

/// `runs.merge` (a run's Manager, as `runs_merge`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunsMergeRequest {
    /// The run's id (the number in `run-<id>`).
    pub run_id: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunsMergeResponse {
    /// True when your branch now contains the run's.
    pub merged: bool,
    /// Your branch's commit afterwards.
    pub commit: String,
    pub fast_forward: bool,
    /// The files that conflict; nothing was changed.
    pub conflicts: Vec<String>,
    pub message: String,
}

/// `runs.discard` (a run's Manager, as `runs_discard`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunsDiscardRequest {
    pub run_id: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunsDiscardResponse {
    pub discarded: bool,
    pub message: String,
}

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
