//! The tool catalog: names, descriptions, and the API method each tool is, all derived from
//! the method table (`canopy_proto::api_methods!`).
//!
//! A tool's arguments are exactly its API method's request (strict: unknown fields are
//! refused), so the tool schema is the request's JSON Schema and names stay strings that
//! the daemon validates, naming the bad field in its error as for any other client.

use std::sync::LazyLock;

use canopy_proto::Method;
use canopy_proto::api::*;
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Every tool this crate serves, in catalog order (the method table's tools, in its order).
pub static TOOL_NAMES: LazyLock<Vec<&'static str>> = LazyLock::new(|| TOOLS.iter().map(|t| t.name).collect());

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

/// The tools of the method table: each tool's arguments are its method's request type.
macro_rules! tool_defs {
    ($(($variant:ident, $area:ident . $handler:ident, $name:literal, $req:ty => $resp:ty, $access:ident, $who:literal, $what:literal, $tool:expr)),* $(,)?) => {
        fn tool_defs() -> Vec<ToolDef> {
            let mut out = Vec::new();
            $(
                let tool: Option<(&'static str, &'static str)> = $tool;
                if let Some((name, description)) = tool {
                    out.push(ToolDef {
                        name,
                        description,
                        method: Method::$variant,
                        schema: schema_of::<$req>,
                        check: check_as::<$req>,
                    });
                }
            )*
            out
        }
    };
}
canopy_proto::api_methods!(tool_defs);

pub(crate) static TOOLS: LazyLock<Vec<ToolDef>> = LazyLock::new(tool_defs);

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
    fn the_table_s_tools_are_the_catalog_sessions_know() {
        // The order and names sessions were given before the table existed: a table edit
        // that renames, drops or reorders a tool shows here.
        let expected = [
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
            "board_unpin",
            "agents_spawn_peer",
            "agents_cancel_spawn",
            "agents_despawn_peer",
            "agents_run_subagent",
            "workspace_status",
            "runs_merge",
            "runs_discard",
            "merge_request",
            "checks_status",
            "review_request",
            "review_submit",
            "issues_list",
            "issues_show",
            "issues_create",
            "issues_assign",
            "issues_update",
            "issues_comment",
            "skill_read",
            "rule_read",
            "history_search",
        ];
        assert_eq!(TOOL_NAMES.as_slice(), expected.as_slice());
        for tool in TOOLS.iter() {
            assert_eq!(tool.method.tool().map(|t| t.name), Some(tool.name), "one tool per method");
            assert!(!tool.description.is_empty(), "{} has no description", tool.name);
        }
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
