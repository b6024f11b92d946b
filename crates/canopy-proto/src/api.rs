//! Request and response bodies for every API method, and the message event.
//!
//! Requests carry names as plain strings: the daemon parses them at the edge so a bad name
//! comes back as `invalid_argument` naming its field. Every request rejects unknown fields.
//! Responses reuse the model types from `canopy-core`.

use canopy_core::{
    Account, Channel, ChannelKind, Message, PostPolicy, Subscription, Topic, TopicName, TreeNode, Workspace,
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
}

/// `agents.list`: every agent (not operators), ordered by handle.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsListRequest {}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentsListResponse {
    pub agents: Vec<Account>,
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
pub struct TreeRequest {}

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
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostResponse {
    pub message: Message,
    /// True when this was a retry and the stored message was returned.
    pub duplicate: bool,
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
    pub after: u64,
    #[serde(default)]
    pub limit: Option<u32>,
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
    pub next_after: u64,
    /// Whether more messages follow this page.
    pub more: bool,
}

/// `messages.sync`: a flat page of messages after a sequence, for followers catching up.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SyncRequest {
    #[serde(default)]
    pub after: u64,
    #[serde(default)]
    pub channel: Option<String>,
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SyncResponse {
    pub messages: Vec<Message>,
    pub next_after: u64,
    pub more: bool,
}

/// Published on `canopy.<ws>.evt.message.<channel>` after a message commits. A doorbell:
/// followers that missed one catch up with `messages.sync`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageEvent {
    pub message: Message,
}
