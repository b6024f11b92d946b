//! Repositories and checkouts: `repos.*` (add, list, gc) and `workspace.status`, and the
//! daemon's requests to a runner about a checkout it hosts (`runner.<id>.git`). The merge
//! gate's requests are `merges`.
//!
//! Merging a subagent run's branch into its Manager's is `runs`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    /// The check named `check` (the single check of old).
    #[serde(default)]
    pub check: Option<String>,
    /// Named checks, each run with `sh -c`, confined, on each run's tree, each new commit of
    /// a Manager's branch, each merged tree and in the queue.
    #[serde(default)]
    pub checks: std::collections::BTreeMap<String, String>,
    /// Whose word makes a merge request reviewed (default `operator`).
    #[serde(default)]
    pub review: Option<canopy_core::review::ReviewPolicy>,
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
    /// Every conflict known between live branches and the base.
    #[serde(default)]
    pub conflicts: Vec<super::checks::ConflictInfo>,
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
    /// Its directory, while it has one (none once merged, discarded or removed).
    #[serde(default)]
    pub path: Option<String>,
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
    /// Your branch's checks on its newest checked commit.
    #[serde(default)]
    pub checks: Vec<canopy_core::checks::CheckRun>,
    /// Where your branch does not merge cleanly with the base or another live branch.
    #[serde(default)]
    pub conflicts: Vec<super::checks::ConflictInfo>,
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

/// A session's checkout, for a runner that keeps its own (a runner other than the embedded
/// one): it fetches the repository from the daemon's git endpoint and makes the checkout on
/// its own disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RepoAssignment {
    /// The repository's name (`<git_url>/<name>.git`).
    pub name: String,
    /// The checkout's branch (`canopy/<handle>`, `canopy/<manager>/run-<id>`).
    pub branch: String,
    /// The commit a new checkout starts from when `published` names none yet.
    pub start: String,
    /// The daemon's ref this checkout's branch is pushed to (`refs/canopy/agents/<handle>`,
    /// `refs/canopy/runs/<id>`); a checkout made where it already names a commit starts there,
    /// so an agent moved from another runner keeps what it pushed.
    pub published: String,
    /// The session may only read the checkout (a reviewer run's).
    #[serde(default)]
    pub read_only: bool,
}

/// Request on `canopy.<ws>.runner.<id>.git`: the daemon asks the runner hosting `agent`'s
/// checkout to act on it there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunnerGitRequest {
    /// The checkout's account (an agent's handle, or `run-<id>`).
    pub agent: String,
    /// Its repository.
    pub repo: String,
    pub op: RunnerGitOp,
}

/// What the daemon asks of a checkout on a runner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum RunnerGitOp {
    /// Push `what` (a ref of the checkout) to the daemon's mirror as `to`.
    Publish { what: String, to: String },
    /// The checkout's branch, ahead/behind `base` and dirty files.
    Status { base: String },
    /// What was done since `base`: commits, diffstat, dirty files.
    Summary { base: String },
    /// Merge `commit` (fetched from the daemon's ref `from`) into the checked-out `branch`.
    Merge { branch: String, commit: String, from: String, message: String },
    /// Delete the checkout (its branch was published first).
    Remove,
}

/// Reply to a `runner.<id>.git` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "result", rename_all = "snake_case", deny_unknown_fields)]
pub enum RunnerGitReply {
    /// `publish`: the commit pushed, or none when the checkout has no such ref.
    Published { head: Option<String> },
    /// `status` and `summary` (a status has no commits or diffstat).
    Tree {
        branch: String,
        head: String,
        ahead: u32,
        behind: u32,
        dirty: Vec<String>,
        #[serde(default)]
        commits: Vec<String>,
        #[serde(default)]
        diffstat: String,
    },
    /// `merge`: the branch now has `commit`.
    Merged { commit: String, fast_forward: bool },
    /// `merge`: the branch already had it.
    UpToDate { commit: String },
    /// `merge`: conflicts in these files; nothing changed.
    Conflict { files: Vec<String> },
    /// `remove`.
    Removed,
    /// Refused before anything changed (the checkout is on another branch, has changes in the
    /// way, is not on this runner).
    Refused { reason: String },
    /// Git failed.
    Failed { reason: String },
}
