//! What runners and the daemon say about sessions: `runners.sync` (the sessions a runner
//! hosts and how to launch them), `sessions.report`, `agents.start`/`stop`/`interrupt`, and
//! the daemon's steer and interrupt requests to a runner.
//!
//! Does not carry messages for a session (`delivery`) or its continuity block (`history`).

use canopy_core::{Incarnation, Message, Presence, RunnerId};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::api::agents::{ScriptSource, SubagentFile};
use crate::api::runs::RunAssignment;

/// `agents.start` / `agents.stop`: whether an agent's session should run. Starting a
/// `crashed` agent clears the crash.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsStartStopRequest {
    pub handle: String,
    /// `agents.start` only: move the lane to this harness of its role's chain (a live session
    /// on another ends at its next turn boundary), clearing a failover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness: Option<String>,
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
    /// Its labels (`[runner] labels`): an agent that needs a label is placed only on a runner
    /// that has it.
    #[serde(default)]
    pub labels: Vec<String>,
    /// The Canopy version it runs, for `canopy runners`.
    #[serde(default)]
    pub version: String,
}

/// `runners.list` (operators): every runner the daemon has seen.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunnersListRequest {}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunnersListResponse {
    pub runners: Vec<RunnerInfo>,
}

/// One runner as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunnerInfo {
    pub id: RunnerId,
    /// Its host and process (`build-box-4242`).
    pub name: String,
    pub labels: Vec<String>,
    /// Its live sessions.
    pub sessions: u32,
    pub capacity: u32,
    /// When it last synced (RFC 3339), and how many seconds ago.
    pub last_sync: String,
    pub last_sync_secs: u64,
    /// Synced within `[runner] runner_ttl`.
    pub live: bool,
    pub version: String,
    /// Drained: takes no new session, and its sessions move at their next turn boundary.
    pub draining: bool,
}

/// `runners.drain` (operators).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunnersDrainRequest {
    pub id: String,
    /// `false` takes a drained runner back.
    #[serde(default = "yes")]
    pub drain: bool,
}

fn yes() -> bool {
    true
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
    /// The session's repository and branch. A runner that keeps its own checkouts (every one
    /// but the embedded runner, whose `cwd` and `repo_mirror` name the daemon's) makes and
    /// pushes the checkout from it; the embedded runner publishes the branch at the session's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<crate::api::repos::RepoAssignment>,
    /// `cwd` is read-only to the session (a reviewer run's checkout of a merged tree).
    #[serde(default)]
    pub cwd_read_only: bool,
    /// Hosts its role may reach through the egress proxy beyond the runner's
    /// `[sandbox] allow_hosts` (`[roles.<role>] allow_hosts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_hosts: Vec<String>,
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
    /// Where the daemon serves its mirrors over git's smart HTTP (`[daemon] git_url`), for
    /// the checkouts a runner keeps itself; empty when it serves none.
    #[serde(default)]
    pub git_url: String,
    /// The operator drained this runner (`canopy runners drain`): each of its standing
    /// sessions ends at its next turn boundary, and starts on another runner.
    #[serde(default)]
    pub draining: bool,
    /// Sessions of this runner that end at their next turn boundary (never mid-turn) and
    /// start again, elsewhere or on another harness: every standing one while it drains, and
    /// any whose agent moved to another harness.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub move_at_boundary: Vec<RunningSession>,
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
