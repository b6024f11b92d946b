//! The tool catalog: names, descriptions, argument schemas, and how each maps to the API.
//!
//! Arguments are strict (unknown fields refused) and carry names as plain strings: the
//! daemon validates them and names the bad field in its error, as for any other client.

use canopy_proto::Method;
use canopy_proto::api::*;
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Every tool this crate serves, in catalog order.
pub const TOOL_NAMES: &[&str] = &[
    "comms_post_message",
    "comms_list_messages",
    "comms_list_channels",
    "comms_list_topics",
    "comms_set_activity",
    "tree_show",
    "roster_list",
];

/// The tool names, owned (for prompt linting later).
pub fn tool_names() -> Vec<String> {
    TOOL_NAMES.iter().map(|n| (*n).to_owned()).collect()
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PostArgs {
    /// The channel to post in, e.g. `home-ci-manager`. Required: there is no default channel.
    pub channel: String,
    /// The topic inside the channel. Required.
    pub topic: String,
    /// The message text (at most 64 KiB unless configured otherwise).
    pub body: String,
    /// Start the topic if it does not exist yet; otherwise an unknown topic is an error
    /// that lists the existing ones.
    #[serde(default)]
    pub create_topic: bool,
    /// Reuse the same key when retrying, so the message is stored once.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListMessagesArgs {
    pub channel: String,
    #[serde(default)]
    pub topic: Option<String>,
    /// Only messages with a sequence number above this.
    #[serde(default)]
    pub after: u64,
    /// At most this many messages (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoArgs {}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListTopicsArgs {
    pub channel: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SetActivityArgs {
    /// One line about what you are doing now; empty clears it.
    pub text: String,
}

/// One tool: its description, its argument schema, and its API call.
pub(crate) struct ToolDef {
    pub name: &'static str,
    pub description: &'static str,
    pub schema: fn() -> Map<String, Value>,
}

fn schema_of<T: JsonSchema>() -> Map<String, Value> {
    match schemars::schema_for!(T).to_value() {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

pub(crate) const TOOLS: &[ToolDef] = &[
    ToolDef {
        name: "comms_post_message",
        description: "Post a message to a channel and topic. Returns the stored message and its sequence number.",
        schema: schema_of::<PostArgs>,
    },
    ToolDef {
        name: "comms_list_messages",
        description: "Read a channel's messages after a sequence number, grouped by topic.",
        schema: schema_of::<ListMessagesArgs>,
    },
    ToolDef {
        name: "comms_list_channels",
        description: "List the channels with their kind, post policy and subscription policy.",
        schema: schema_of::<NoArgs>,
    },
    ToolDef {
        name: "comms_list_topics",
        description: "List a channel's topics, most recent activity first.",
        schema: schema_of::<ListTopicsArgs>,
    },
    ToolDef {
        name: "comms_set_activity",
        description: "Set the one-line activity the roster shows for you.",
        schema: schema_of::<SetActivityArgs>,
    },
    ToolDef {
        name: "tree_show",
        description: "Show the agent tree, read fresh: who is above, beside and below you.",
        schema: schema_of::<NoArgs>,
    },
    ToolDef {
        name: "roster_list",
        description: "List every agent with its presence, activity line and last-seen time.",
        schema: schema_of::<NoArgs>,
    },
];

/// An API call a tool resolves to: the method and the request body.
pub(crate) struct Call {
    pub method: Method,
    pub request: Value,
}

fn args<T: DeserializeOwned>(arguments: Option<Map<String, Value>>) -> Result<T, String> {
    serde_json::from_value(Value::Object(arguments.unwrap_or_default())).map_err(|e| e.to_string())
}

fn to_value<T: serde::Serialize>(request: T) -> Result<Value, String> {
    serde_json::to_value(request).map_err(|e| e.to_string())
}

/// Maps a tool call to an API call, or says what is wrong with its arguments.
pub(crate) fn resolve(name: &str, arguments: Option<Map<String, Value>>) -> Result<Call, ResolveError> {
    let bad = ResolveError::Arguments;
    let (method, request) = match name {
        "comms_post_message" => {
            let a: PostArgs = args(arguments).map_err(bad)?;
            let request = PostRequest {
                channel: a.channel,
                topic: a.topic,
                body: a.body,
                create_topic: a.create_topic,
                idempotency_key: a.idempotency_key,
            };
            (Method::MessagesPost, to_value(request).map_err(bad)?)
        }
        "comms_list_messages" => {
            let a: ListMessagesArgs = args(arguments).map_err(bad)?;
            let request = ReadRequest { channel: a.channel, topic: a.topic, after: a.after, limit: a.limit };
            (Method::MessagesRead, to_value(request).map_err(bad)?)
        }
        "comms_list_channels" => {
            let _: NoArgs = args(arguments).map_err(bad)?;
            (Method::ChannelsList, to_value(ChannelsListRequest {}).map_err(bad)?)
        }
        "comms_list_topics" => {
            let a: ListTopicsArgs = args(arguments).map_err(bad)?;
            (Method::TopicsList, to_value(TopicsListRequest { channel: a.channel }).map_err(bad)?)
        }
        "comms_set_activity" => {
            let a: SetActivityArgs = args(arguments).map_err(bad)?;
            (Method::AgentsSetActivity, to_value(SetActivityRequest { text: a.text }).map_err(bad)?)
        }
        "tree_show" => {
            let _: NoArgs = args(arguments).map_err(bad)?;
            (Method::Tree, to_value(TreeRequest {}).map_err(bad)?)
        }
        "roster_list" => {
            let _: NoArgs = args(arguments).map_err(bad)?;
            (Method::Roster, to_value(RosterRequest {}).map_err(bad)?)
        }
        other => return Err(ResolveError::UnknownTool(other.to_owned())),
    };
    Ok(Call { method, request })
}

pub(crate) enum ResolveError {
    UnknownTool(String),
    Arguments(String),
}
