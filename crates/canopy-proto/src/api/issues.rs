//! The work ledger: `issues.list`, `issues.show`, `issues.create`, `issues.assign`,
//! `issues.update` and `issues.comment` (agents as tools, and operators), and the operators'
//! `issues.budget`, `issues.import` and `issues.export`.
//!
//! Issues are numbers on the wire (`3`, never `#3`): the CLI parses `#N`. The rules a request
//! must pass are `canopy_core::issues`'.

use canopy_core::issues::{Issue, IssueEvent, IssueSpend, IssueState, IssueSummary};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `issues.list` (tool `issues_list`): a bounded page, lowest number first.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssuesListRequest {
    /// Only issues in this state; without it, the open ones (not done or wontdo).
    #[serde(default)]
    pub state: Option<IssueState>,
    /// `me` (an agent's default), `reports` (your direct reports'), `subtree` (yours and every
    /// descendant's), `nobody` (unassigned), or a handle. An operator's default is everyone's.
    #[serde(default)]
    pub owner: Option<String>,
    /// Only issues owned by this agent or one of its descendants.
    #[serde(default)]
    pub subtree: Option<String>,
    #[serde(default)]
    pub label: Option<String>,
    /// Include closed issues when no state is given.
    #[serde(default)]
    pub include_closed: bool,
    /// Start after this issue number (the previous page's `next_after`).
    #[serde(default)]
    pub after: Option<u64>,
    /// Newest first (highest number first); the next page then starts `before` the last.
    #[serde(default)]
    pub newest: bool,
    /// Only issues numbered below this (with `newest`, the previous page's `next_after`).
    #[serde(default)]
    pub before: Option<u64>,
    /// At most this many (default 50, at most 200).
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssuesListResponse {
    pub issues: Vec<IssueSummary>,
    /// The last number of this page: pass it as `after` (with `newest`, as `before`) for the
    /// next page; none when this was the last.
    pub next_after: Option<u64>,
}

/// `issues.show` (tool `issues_show`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssuesShowRequest {
    pub issue: u64,
}

/// One issue with its history, sub-issues, links and spend.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueDetail {
    pub issue: Issue,
    /// Oldest first (the newest 200).
    pub events: Vec<IssueEvent>,
    pub subissues: Vec<IssueSummary>,
    /// Runs briefed for it (`run-<id>`).
    pub runs: Vec<String>,
    /// Merge requests that link it (`merge-<n>`).
    pub merges: Vec<String>,
    pub spend: IssueSpend,
    /// The topic it is discussed under in its owner's home channel (an agent owner only).
    pub topic: Option<String>,
}

/// `issues.create` (tool `issues_create`). An agent files for itself (no owner), for a
/// descendant (as a sub-issue of one it owns), or to its parent (a request up the tree).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssuesCreateRequest {
    /// One line.
    pub title: String,
    /// Markdown: what, why, what done means.
    #[serde(default)]
    pub body: String,
    /// Whose it is: a handle; an agent's default is itself; an operator's is nobody (the
    /// Supervisor triages it).
    #[serde(default)]
    pub owner: Option<String>,
    /// The issue this is a sub-issue of.
    #[serde(default)]
    pub parent: Option<u64>,
    #[serde(default)]
    pub labels: Vec<String>,
    #[serde(default)]
    pub depends_on: Vec<u64>,
    /// A retry with the same key (from the same reporter) returns the issue it filed first.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// `issues.assign` (tool `issues_assign`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssuesAssignRequest {
    pub issue: u64,
    /// The new owner's handle: an agent assigns to itself or a descendant.
    pub owner: String,
    #[serde(default)]
    pub note: Option<String>,
}

/// `issues.update` (tool `issues_update`): a move (with a note), and edits.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssuesUpdateRequest {
    pub issue: u64,
    /// The new state; a move always carries a note.
    #[serde(default)]
    pub state: Option<IssueState>,
    #[serde(default)]
    pub note: Option<String>,
    /// For `blocked`: the issues it waits for.
    #[serde(default)]
    pub blocked_by: Vec<u64>,
    /// For `blocked`: the question it waits on the operator for.
    #[serde(default)]
    pub question: Option<String>,
    /// For `done` and `wontdo`: one line saying how it ended.
    #[serde(default)]
    pub resolution: Option<String>,
    /// Replaces the labels.
    #[serde(default)]
    pub labels: Option<Vec<String>>,
    /// Replaces the dependencies; a cycle is refused.
    #[serde(default)]
    pub depends_on: Option<Vec<u64>>,
    /// Replaces the body.
    #[serde(default)]
    pub body: Option<String>,
    /// Replaces the title (the topic keeps its name).
    #[serde(default)]
    pub title: Option<String>,
}

/// `issues.comment` (tool `issues_comment`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssuesCommentRequest {
    pub issue: u64,
    /// Markdown; an `@mention` steers a busy agent as in any post.
    pub text: String,
}

/// `issues.budget` (operators): the issue's own dollar budget; none clears it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssuesBudgetRequest {
    pub issue: u64,
    #[serde(default)]
    pub usd: Option<f64>,
}

/// One issue from another tracker, as `gh issue list --json number,title,body,labels,state`
/// prints it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ImportedIssue {
    pub number: u64,
    pub title: String,
    #[serde(default)]
    pub body: String,
    #[serde(default)]
    pub labels: Vec<ImportedLabel>,
    /// `OPEN` or `CLOSED`.
    #[serde(default)]
    pub state: String,
}

impl ImportedIssue {
    /// Whether `gh` printed it closed: `OPEN` (or no state) is open and `CLOSED` closed, in any
    /// case; `None` for anything else.
    pub fn closed(&self) -> Option<bool> {
        match self.state.trim().to_ascii_uppercase().as_str() {
            "" | "OPEN" => Some(false),
            "CLOSED" => Some(true),
            _ => None,
        }
    }
}

/// A label as `gh` prints it (only the name is kept).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ImportedLabel {
    pub name: String,
}

/// `issues.import` (operators): idempotent by `source` + number.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssuesImportRequest {
    /// Where they come from, e.g. `github` or `github:owner/repo`; kept as `<source>#<number>`.
    pub source: String,
    pub issues: Vec<ImportedIssue>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssuesImportResponse {
    /// New issues, in the order given.
    pub created: Vec<u64>,
    /// Already imported before: how many were left as they are.
    pub skipped: u32,
}

/// `issues.export` (operators): whole issues, a page at a time, lowest number first.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssuesExportRequest {
    #[serde(default)]
    pub after: Option<u64>,
    /// Default 200, at most 1000.
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssuesExportResponse {
    pub issues: Vec<Issue>,
    pub next_after: Option<u64>,
}

/// Published on `canopy.<ws>.evt.issue.<number>` after each committed change: a doorbell
/// with the issue as it now is and the event that changed it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueChanged {
    pub issue: IssueSummary,
    pub event: IssueEvent,
}
