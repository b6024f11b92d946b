//! Named checks and conflicts: `checks.status` (agents, as `checks_status`; operators too),
//! `checks.list` and `checks.log` (a check's output), and the conflicts found between live
//! branches, which `workspace.status`, `repos.list` and `merges.*` carry.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `checks.status`: the checks of a branch, run or merge request, newest commit first.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChecksStatusRequest {
    /// Your branch when omitted; else a branch (`canopy/m1`, a run's), a run (`run-5`) or a
    /// merge request (`merge-3`). Operators name one, with `repo` when a branch is in several.
    #[serde(default, rename = "ref")]
    pub reference: Option<String>,
    #[serde(default)]
    pub repo: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChecksStatusResponse {
    pub repo: String,
    /// The branch or `merge-<n>` the checks ran for.
    pub subject: String,
    /// The newest commit checked (empty: none yet).
    pub commit: String,
    /// The newest run of each check on that commit.
    pub checks: Vec<canopy_core::checks::CheckRun>,
    /// `none configured`, `passed: ...`, or `failed: ...` naming each failing check.
    pub summary: String,
    /// Every check ran and passed on that commit (none configured counts as passing).
    pub passed: bool,
}

/// `checks.list` (operators): check runs, newest first.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChecksListRequest {
    #[serde(default)]
    pub repo: Option<String>,
    /// A branch, or `merge-<n>`.
    #[serde(default)]
    pub branch: Option<String>,
    /// At most this many (default 50, at most 500).
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChecksListResponse {
    pub checks: Vec<canopy_core::checks::CheckRun>,
}

/// `checks.log`: a check's output (its last MiB), a page at a time.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChecksLogRequest {
    /// `check-<n>`.
    pub id: String,
    /// Byte offset to read from (default 0).
    #[serde(default)]
    pub offset: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChecksLogResponse {
    pub check: canopy_core::checks::CheckRun,
    /// The output from `offset`, at most 256 KiB.
    pub log: String,
    pub offset: u64,
    /// Where the next page starts; none at the end.
    pub next_offset: Option<u64>,
}

/// Two live branches (or a branch and the base) that do not merge cleanly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConflictInfo {
    pub repo: String,
    pub branch: String,
    /// The base branch's name, or the other branch.
    pub other: String,
    pub files: Vec<String>,
    pub found_at: String,
}
