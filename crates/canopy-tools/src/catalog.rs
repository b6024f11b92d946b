//! The tool catalog: names, descriptions, and the API method each tool is.
//!
//! A tool's arguments are exactly its API method's request (strict: unknown fields are
//! refused), so the tool schema is the request's JSON Schema and names stay strings that
//! the daemon validates, naming the bad field in its error as for any other client.

use canopy_proto::Method;
use canopy_proto::api::*;
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Every tool this crate serves, in catalog order.
pub const TOOL_NAMES: &[&str] = &[
    "comms_post_message",
    "comms_list_messages",
    "comms_list_channels",
    "comms_list_topics",
    "comms_set_activity",
    "comms_subscribe",
    "comms_unsubscribe",
    "comms_open_direct",
    "tree_show",
    "roster_list",
    "board_pin",
    "board_list",
    "agents_spawn_peer",
    "agents_cancel_spawn",
    "agents_despawn_peer",
    "agents_run_subagent",
    "skill_read",
    "rule_read",
    "history_search",
];

/// The tool names, owned (for prompt linting).
pub fn tool_names() -> Vec<String> {
    TOOL_NAMES.iter().map(|n| (*n).to_owned()).collect()
}

/// One tool: its description, its argument schema, its method and argument check.
pub(crate) struct ToolDef {
    pub name: &'static str,
    pub description: &'static str,
    pub method: Method,
    pub schema: fn() -> Map<String, Value>,
    /// Parses the arguments strictly into the method's request and back to JSON.
    pub check: fn(Value) -> Result<Value, String>,
}

fn schema_of<T: JsonSchema>() -> Map<String, Value> {
    match schemars::schema_for!(T).to_value() {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

fn check_as<T: DeserializeOwned + Serialize>(arguments: Value) -> Result<Value, String> {
    let request: T = serde_json::from_value(arguments).map_err(|e| e.to_string())?;
    serde_json::to_value(request).map_err(|e| e.to_string())
}

macro_rules! tool {
    ($name:literal, $description:literal, $method:expr, $request:ty) => {
        ToolDef {
            name: $name,
            description: $description,
            method: $method,
            schema: schema_of::<$request>,
            check: check_as::<$request>,
        }
    };
}

pub(crate) const TOOLS: &[ToolDef] = &[
    tool!(
        "comms_post_message",
        "Post a message to a channel and topic (both required; there is no default channel). Returns the stored message and its sequence number.",
        Method::MessagesPost,
        PostRequest
    ),
    tool!(
        "comms_list_messages",
        "Read a channel's messages after a sequence number, grouped by topic.",
        Method::MessagesRead,
        ReadRequest
    ),
    tool!(
        "comms_list_channels",
        "List the channels with their kind, post policy and subscription policy.",
        Method::ChannelsList,
        ChannelsListRequest
    ),
    tool!(
        "comms_list_topics",
        "List a channel's topics, most recent activity first.",
        Method::TopicsList,
        TopicsListRequest
    ),
    tool!(
        "comms_set_activity",
        "Set the one-line activity the roster shows for you (empty clears it).",
        Method::AgentsSetActivity,
        SetActivityRequest
    ),
    tool!(
        "comms_subscribe",
        "Join an optional channel; its messages then reach you at your turn starts.",
        Method::ChannelsSubscribe,
        ChannelRequest
    ),
    tool!(
        "comms_unsubscribe",
        "Leave an optional channel (home, broadcast, coordination and direct channels cannot be left).",
        Method::ChannelsUnsubscribe,
        ChannelRequest
    ),
    tool!(
        "comms_open_direct",
        "Open (or find) the two-party channel between you and a peer, your parent or one of your reports.",
        Method::ChannelsOpenDirect,
        OpenDirectRequest
    ),
    tool!(
        "tree_show",
        "Show the agent tree, read fresh: who is above, beside and below you.",
        Method::Tree,
        TreeRequest
    ),
    tool!(
        "roster_list",
        "List every agent with its presence, activity line and last-seen time.",
        Method::Roster,
        RosterRequest
    ),
    tool!(
        "board_pin",
        "Pin a message to its channel's board (a pointer to the message, by sequence number).",
        Method::BoardPin,
        BoardPinRequest
    ),
    tool!("board_list", "List a channel's pinned messages.", Method::BoardList, BoardListRequest),
    tool!(
        "agents_spawn_peer",
        "Ask the operator for a new child Manager. Returns at once with the request id and state pending; the operator's answer arrives as a message at a later turn.",
        Method::SpawnRequest,
        SpawnRequestRequest
    ),
    tool!(
        "agents_cancel_spawn",
        "Withdraw one of your own pending spawn requests (by its id, req-N).",
        Method::SpawnCancel,
        SpawnCancelRequest
    ),
    tool!(
        "agents_despawn_peer",
        "Despawn one of your descendants (and its subtree); its session stops and its history stays.",
        Method::AgentsDespawn,
        AgentsDespawnRequest
    ),
    tool!(
        "agents_run_subagent",
        "Brief an ephemeral implementer subagent (definition, e.g. implementer; brief: goal, context, constraints, done-means, report wanted). Returns at once; its report arrives as a message in your home channel at a later turn start. Needs no approval; runs per Manager are capped.",
        Method::RunsStart,
        RunsStartRequest
    ),
    tool!(
        "skill_read",
        "Read the body of a skill your prompt lists by name.",
        Method::PromptsSkill,
        PromptsReadRequest
    ),
    tool!("rule_read", "Read the body of a rule your prompt lists by name.", Method::PromptsRule, PromptsReadRequest),
    tool!(
        "history_search",
        "Search your own earlier sessions (every restart and compaction): messages you sent or received, and with include_tool_events your tool calls (name, status, short preview). Optional query text; newest first; limit defaults to 10, at most 50; pass next_before as before for older results. Call it before asking anyone to repeat context.",
        Method::HistorySearch,
        HistorySearchRequest
    ),
];

/// The tool that is `method`, when a tool is.
pub fn tool_for(method: Method) -> Option<&'static str> {
    TOOLS.iter().find(|t| t.method == method).map(|t| t.name)
}

/// An API call a tool resolves to: the method and the request body.
pub(crate) struct Call {
    pub method: Method,
    pub request: Value,
}

pub(crate) enum ResolveError {
    UnknownTool(String),
    Arguments(String),
}

/// Maps a tool call to an API call, or says what is wrong with its arguments.
pub(crate) fn resolve(name: &str, arguments: Option<Map<String, Value>>) -> Result<Call, ResolveError> {
    let tool = TOOLS.iter().find(|t| t.name == name).ok_or_else(|| ResolveError::UnknownTool(name.to_owned()))?;
    let request = (tool.check)(Value::Object(arguments.unwrap_or_default())).map_err(ResolveError::Arguments)?;
    Ok(Call { method: tool.method, request })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_and_the_names_agree() {
        let names: Vec<&str> = TOOLS.iter().map(|t| t.name).collect();
        assert_eq!(names, TOOL_NAMES);
    }

    #[test]
    fn arguments_are_strict() {
        let ok = resolve("comms_list_topics", serde_json::json!({"channel": "x"}).as_object().cloned());
        assert!(ok.is_ok());
        let extra = resolve("comms_list_topics", serde_json::json!({"channel": "x", "as": "y"}).as_object().cloned());
        assert!(matches!(extra, Err(ResolveError::Arguments(_))));
        assert!(matches!(resolve("nope", None), Err(ResolveError::UnknownTool(_))));
    }
}
