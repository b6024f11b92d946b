//! What an agent did before: `history.search`, `sessions.continuity` (the block at the head
//! of a session's first input) and `usage` (tokens and cost).
//!
//! Budgets over that usage are `budgets`.

use canopy_core::continuity::HistoryItem;
use canopy_core::{Incarnation, RunnerId, UsageRow, UsageTotals};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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

/// How wide each point of a spend series is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SeriesBucket {
    /// 24 points, one per UTC hour, the last the hour now running.
    #[default]
    Hour,
    /// 30 points, one per UTC day, the last today.
    Day,
}

/// `usage.series` (operators): spend over time, one point per hour (24) or day (30), for the
/// workspace, one agent, an agent's subtree (its runs too) or one issue, with the budgets that
/// cover it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageSeriesRequest {
    #[serde(default)]
    pub agent: Option<String>,
    /// With `agent`: everything below it too.
    #[serde(default)]
    pub subtree: bool,
    /// Only usage charged to this issue.
    #[serde(default)]
    pub issue: Option<u64>,
    #[serde(default)]
    pub bucket: SeriesBucket,
}

/// One point of a spend series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SeriesPoint {
    /// When the bucket starts (RFC 3339, UTC).
    pub start: String,
    /// US dollars charged in it (reported, computed from prices, or estimated: what budgets count).
    pub usd: f64,
    /// Tokens charged in it (input, cache writes and output, as budgets count them).
    pub tokens: u64,
    /// Usage reports in it.
    pub reports: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageSeriesResponse {
    pub bucket: SeriesBucket,
    /// Oldest first; every bucket present, empty ones at zero.
    pub points: Vec<SeriesPoint>,
    /// The budgets covering the agent (every budget for the workspace; none for an issue).
    pub budgets: Vec<canopy_core::BudgetStatus>,
}
