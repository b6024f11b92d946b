//! The MCP server handler: lists the catalog and turns tool calls into API calls.

use std::sync::Arc;

use canopy_bus::{ApiClient, CallError};
use canopy_core::ErrorCode;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};

use canopy_core::continuity::HistoryItem;
use canopy_proto::Method;
use canopy_proto::api::{BoardResponse, HistorySearchResponse, ReadResponse, WhoamiRequest};
use canopy_proto::method;

use crate::catalog::{ResolveError, TOOLS, resolve};

/// Where a call's bearer token comes from.
#[derive(Clone)]
pub enum TokenSource {
    /// The HTTP request's `Authorization: Bearer` header (checked before MCP sees it).
    Header,
}

/// The tool server. Cheap to clone; one is made per MCP session.
#[derive(Clone)]
pub struct CanopyTools {
    api: Arc<ApiClient>,
    tokens: TokenSource,
}

impl CanopyTools {
    pub fn new(api: ApiClient, tokens: TokenSource) -> CanopyTools {
        CanopyTools { api: Arc::new(api), tokens }
    }

    fn token(&self, context: &RequestContext<RoleServer>) -> Option<String> {
        match &self.tokens {
            TokenSource::Header => context
                .extensions
                .get::<http::request::Parts>()
                .and_then(|parts| crate::bearer::bearer(&parts.headers))
                .map(str::to_owned),
        }
    }

    /// Runs one tool call to completion; every failure is a tool error with a typed code.
    pub async fn call(
        &self,
        token: Option<&str>,
        name: &str,
        arguments: Option<serde_json::Map<String, Value>>,
    ) -> CallToolResult {
        let Some(token) = token else {
            return tool_error(ErrorCode::Forbidden, "the call carries no bearer token", None);
        };
        let call = match resolve(name, arguments) {
            Ok(call) => call,
            Err(ResolveError::UnknownTool(tool)) => {
                return tool_error(ErrorCode::NotFound, &format!("unknown tool {tool:?}"), None);
            }
            Err(ResolveError::Arguments(reason)) => {
                return tool_error(ErrorCode::InvalidArgument, &format!("bad arguments for {name}: {reason}"), None);
            }
        };
        match self.api.call_json(call.method, token, &call.request).await {
            Ok(value) => {
                let rendered = fenced(call.method, &value);
                let mut result = CallToolResult::structured(value);
                if let Some(text) = rendered {
                    result.content = vec![rmcp::model::ContentBlock::text(text)];
                }
                result
            }
            Err(CallError::Refused(wire)) => tool_error(wire.code, &wire.message, wire.field.as_deref()),
            Err(CallError::Unreachable(reason)) => tool_error(ErrorCode::Unavailable, &reason, None),
        }
    }
}

/// Messages in a tool result are shown to the model attributed and fenced, like deliveries;
/// the structured result keeps the plain JSON.
fn fenced(method: Method, value: &Value) -> Option<String> {
    let (messages, heading): (Vec<canopy_core::Message>, &str) = match method {
        Method::MessagesRead => {
            let page: ReadResponse = serde_json::from_value(value.clone()).ok()?;
            let heading = if page.more { "Messages (more follow: pass next_after as after):" } else { "Messages:" };
            (page.groups.into_iter().flat_map(|g| g.messages).collect(), heading)
        }
        Method::BoardList | Method::BoardPin => {
            let board: BoardResponse = serde_json::from_value(value.clone()).ok()?;
            (board.pins, "Pinned messages:")
        }
        Method::HistorySearch => return history(value),
        _ => return None,
    };
    if messages.is_empty() {
        return None;
    }
    let mut text = canopy_core::render::render_fenced(&messages, heading, &[], || {
        canopy_sys::random_hex(8).unwrap_or_else(|_| format!("{:x}", std::process::id()))
    });
    text.push_str("\n\nThe same result as JSON is in the structured content.");
    Some(text)
}

/// A history page: the messages fenced like deliveries (oldest first), then tool events as
/// one line each (their previews are already redacted and short), then the cursor.
fn history(value: &Value) -> Option<String> {
    let page: HistorySearchResponse = serde_json::from_value(value.clone()).ok()?;
    let mut messages = Vec::new();
    let mut again = Vec::new();
    let mut tools = Vec::new();
    for item in page.items.into_iter().rev() {
        match item {
            HistoryItem::Message { message, redelivered, .. } => {
                if redelivered {
                    again.push(message.seq);
                }
                messages.push(message);
            }
            HistoryItem::ToolEvent { at, incarnation, name, status, preview, .. } => {
                tools.push(format!("- {at} session {incarnation}: {name} {status}: {}", preview.replace('\n', " ")));
            }
        }
    }
    let mut text = if messages.is_empty() {
        "No messages matched.".to_owned()
    } else {
        canopy_core::render::render_fenced(&messages, "Earlier messages (oldest first, excerpts):", &again, || {
            canopy_sys::random_hex(8).unwrap_or_else(|_| format!("{:x}", std::process::id()))
        })
    };
    if !tools.is_empty() {
        text.push_str("\n\nTool calls (name, status, preview; outputs are never returned whole):\n");
        text.push_str(&tools.join("\n"));
    }
    match page.next_before {
        Some(cursor) => text.push_str(&format!("\n\nOlder results exist: pass before = {cursor:?}.")),
        None => text.push_str("\n\nNothing older matches."),
    }
    text.push_str("\nThe same result as JSON is in the structured content.");
    Some(text)
}

fn tool_error(code: ErrorCode, message: &str, field: Option<&str>) -> CallToolResult {
    let mut error = json!({ "code": code, "message": message });
    if let Some(field) = field {
        error["field"] = json!(field);
    }
    CallToolResult::structured_error(json!({ "error": error }))
}

impl ServerHandler for CanopyTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_instructions(
            "Canopy's native tools: channels and topics, the tree and the roster. Every call acts as you.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // Only the tools registered for this session's role: the daemon says which (and
        // refuses the others anyway). Without an answer, nothing is listed.
        let token = self.token(&context);
        let registered: Vec<String> = match token.as_deref() {
            Some(token) => match self.api.send::<method::Whoami>(token, &WhoamiRequest {}).await {
                Ok(who) => who.tools,
                Err(e) => {
                    return Err(ErrorData::internal_error(
                        format!("asking the daemon for the session's tools: {e}"),
                        None,
                    ));
                }
            },
            None => Vec::new(),
        };
        let tools = TOOLS
            .iter()
            .filter(|t| registered.iter().any(|r| r == t.name))
            .map(|t| Tool::new(t.name, t.description, (t.schema)()))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let token = self.token(&context);
        Ok(self.call(token.as_deref(), &request.name, request.arguments).await.into())
    }
}
