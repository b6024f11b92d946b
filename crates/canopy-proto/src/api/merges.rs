//! The merge gate: `merges.request` (an agent asks to merge its branch), `merges.show`,
//! `merges.list`, `merges.queue` and `merges.decide` (operators), and reviews:
//! `reviews.request` (a Manager starts a reviewer run) and `reviews.submit` (its verdict).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    /// Issues this request works on: when it lands, each one's owner is told (the owner
    /// closes it).
    #[serde(default)]
    pub issues: Vec<u64>,
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
    /// Every conflict known between live branches and the base.
    #[serde(default)]
    pub conflicts: Vec<super::checks::ConflictInfo>,
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
    /// Approve over a missing or negative review verdict, saying why (recorded and audited).
    #[serde(default, rename = "override")]
    pub override_reason: Option<String>,
}

/// `merges.show`: one request with its checks, reviews, conflicts and place in the queue.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergesShowRequest {
    /// `merge-<n>`.
    pub id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeDetail {
    pub request: canopy_core::MergeRequest,
    /// The newest run of each check on its merged tree (and in the queue, once there).
    pub checks: Vec<canopy_core::checks::CheckRun>,
    pub reviews: Vec<canopy_core::review::Review>,
    pub conflicts: Vec<super::checks::ConflictInfo>,
    /// Its place in its repository's queue (1: next, or merging), while queued.
    pub queue_position: Option<u32>,
}

/// `merges.queue` (operators): each repository's queue in order.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergesQueueRequest {
    #[serde(default)]
    pub repo: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergesQueueResponse {
    /// Merging first, then queued, by repository.
    pub queue: Vec<canopy_core::MergeRequest>,
}

/// `reviews.request` (agents, as `review_request`): a reviewer run on one of your requests.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReviewsRequestRequest {
    /// `merge-<n>`: one of your own undecided requests.
    pub merge_request: String,
    /// What the reviewer should look at hardest.
    #[serde(default)]
    pub focus: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReviewsRequestResponse {
    pub review: canopy_core::review::Review,
    /// The reviewer run; its verdict arrives in the request's topic.
    pub run_id: i64,
}

/// `reviews.submit` (a reviewer run, as `review_submit`): its verdict, once.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReviewsSubmitRequest {
    pub verdict: canopy_core::review::Verdict,
    pub summary: String,
    #[serde(default)]
    pub comments: Vec<canopy_core::review::ReviewComment>,
}
