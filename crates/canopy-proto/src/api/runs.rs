//! Subagent runs: `runs.start`, `runs.list`, `runs.finish`, `runs.merge` and `runs.discard`,
//! with a run as the wire shows it and as a runner is told to host it.
//!
//! A run's checkout as part of its Manager's status is `repos` (`workspace.status`).

use canopy_core::Incarnation;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a runner needs to drive a subagent run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunAssignment {
    pub id: i64,
    pub definition: String,
    pub manager: String,
    pub brief: String,
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
    /// The issue it works on.
    #[serde(default)]
    pub issue: Option<u64>,
    /// It runs on the scripted stand-in while its Manager runs a real harness: no model ran.
    #[serde(default)]
    pub scripted: bool,
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
    /// The issue the run works on (one you own): its usage counts toward the issue, and its
    /// report names it.
    #[serde(default)]
    pub issue: Option<u64>,
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
