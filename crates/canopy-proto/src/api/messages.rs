//! Channels, topics, the board and messages: `channels.*`, `topics.*`, `board.*`,
//! `messages.*` (post, read, sync), with the message event and the read limits.
//!
//! What becomes of a post for each recipient (the outcome types) is decided in
//! `canopy_core::delivery`; how a runner pulls and acknowledges it is `delivery`.

use canopy_core::{Channel, ChannelKind, Message, PostPolicy, Seq, Topic, TopicName};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default page size of `messages.read` and `messages.sync`.
pub const DEFAULT_READ_LIMIT: u32 = 100;

/// Largest page size of `messages.read` and `messages.sync`.
pub const MAX_READ_LIMIT: u32 = 1000;

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
