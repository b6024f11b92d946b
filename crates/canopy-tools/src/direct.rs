//! The direct path for `tools/call`: the one request a harness sends again and again,
//! answered without rmcp's per-request service around it.
//!
//! In stateless mode rmcp serves each request by starting a service for it (three tasks,
//! a one-shot transport and its channels, a cancellation token); for a tool call that
//! costs about as much as the rest of the call together. This path answers only a request
//! it recognises whole, with rmcp's own types for the id and the result: a `POST` whose
//! head rmcp would pass without a second look (an allowed `Host`, no `Origin`, `Accept`
//! naming JSON and event streams, a JSON body of a known small length, a known protocol
//! version older than the one that requires per-request headers, none of those headers, no
//! session) carrying exactly `{"jsonrpc", "id", "method": "tools/call", "params": {"name",
//! "arguments"?, "_meta"?}}` with nothing in `_meta` but a progress token (the tools send
//! no progress). The call itself is `CanopyTools::call`, the function rmcp's `call_tool`
//! runs. Anything else, including every malformed request, goes to rmcp, which answers or
//! refuses it; this path never refuses. `tests/direct.rs` holds the two answers equal.

use std::borrow::Cow;

use rmcp::model::{
    CallToolResult, JsonObject, JsonRpcResponse, JsonRpcVersion2_0, ProtocolVersion, RequestId, ServerJsonRpcMessage,
    ServerResult,
};
use serde::Deserialize;

/// Largest body the direct path reads; a larger request goes to rmcp as it came.
pub(crate) const MAX_BODY: u64 = 64 * 1024;

/// The hosts a runner's endpoint answers to (rmcp's `allowed_hosts`, without ports).
pub(crate) const ALLOWED_HOSTS: [&str; 2] = ["127.0.0.1", "localhost"];

/// Whether the head of `request` is one the direct path may answer.
pub(crate) fn eligible(parts: &http::request::Parts) -> bool {
    let headers = &parts.headers;
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let host_allowed = text("host").is_some_and(|host| {
        let name = host.rsplit_once(':').filter(|(_, port)| port.parse::<u16>().is_ok()).map_or(host, |(name, _)| name);
        ALLOWED_HOSTS.iter().any(|allowed| allowed.eq_ignore_ascii_case(name))
    });
    let media = |value: &str| value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    let accept: Vec<&str> = headers.get_all(http::header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect();
    // Weights and quoted parameters are rmcp's to read (`accepted_media_types`): a head with
    // either is not plain.
    let weighted = accept
        .iter()
        .flat_map(|v| v.split(','))
        .flat_map(|entry| entry.split(';').skip(1))
        .any(|param| param.split_once('=').map_or(param, |(name, _)| name).trim().eq_ignore_ascii_case("q"));
    let plain_accept = !weighted && !accept.iter().any(|v| v.contains('"'));
    let accepts = accept.iter().flat_map(|v| v.split(',')).map(media).collect::<Vec<_>>();
    let version_known = text("mcp-protocol-version").is_some_and(|version| {
        version < ProtocolVersion::STANDARD_HEADERS.as_str()
            && ProtocolVersion::KNOWN_VERSIONS.iter().any(|known| known.as_str() == version)
    });
    let small = text("content-length").and_then(|len| len.parse::<u64>().ok()).is_some_and(|len| len <= MAX_BODY);
    let mcp_headers = headers.keys().any(|name| {
        let name = name.as_str();
        name == "mcp-method" || name == "mcp-name" || name.starts_with("mcp-param-") || name == "mcp-session-id"
    });
    parts.method == http::Method::POST
        && host_allowed
        && !headers.contains_key(http::header::ORIGIN)
        && plain_accept
        && accepts.iter().any(|m| m == "application/json")
        && accepts.iter().any(|m| m == "text/event-stream")
        && text("content-type").is_some_and(|v| media(v) == "application/json")
        && version_known
        && small
        && !mcp_headers
}

/// A `tools/call` request in the only shape the direct path answers.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Call {
    #[expect(dead_code, reason = "checked by its type: the JSON-RPC version is \"2.0\"")]
    jsonrpc: JsonRpcVersion2_0,
    pub(crate) id: RequestId,
    method: Cow<'static, str>,
    pub(crate) params: Params,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Params {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) arguments: Option<JsonObject>,
    #[serde(rename = "_meta", default)]
    meta: Option<JsonObject>,
}

/// The call in `body`, when it is one the direct path answers.
pub(crate) fn parse(body: &[u8]) -> Option<Call> {
    let call: Call = serde_json::from_slice(body).ok()?;
    let plain_meta = call.params.meta.as_ref().is_none_or(|meta| meta.keys().all(|key| key == "progressToken"));
    (call.method == "tools/call" && plain_meta).then_some(call)
}

/// The JSON-RPC response carrying `result`, as rmcp encodes it for a peer on a version
/// before 2026-07-28 (the only ones `eligible` admits): in the legacy shape.
pub(crate) fn encode(id: RequestId, result: CallToolResult) -> Result<Vec<u8>, serde_json::Error> {
    let mut result = ServerResult::CallToolResult(result);
    result.strip_result_type_for_legacy_peer();
    result.strip_non_object_output_for_legacy_peer();
    let message = ServerJsonRpcMessage::Response(JsonRpcResponse { jsonrpc: JsonRpcVersion2_0, id, result });
    serde_json::to_vec(&message)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

    use super::*;

    fn head(changes: &[(&'static str, Option<&str>)]) -> http::request::Parts {
        let mut headers: Vec<(&str, &str)> = vec![
            ("host", "127.0.0.1:4100"),
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2025-06-18"),
            ("content-length", "120"),
        ];
        for (name, value) in changes {
            headers.retain(|(n, _)| n != name);
            if let Some(value) = value {
                headers.push((name, value));
            }
        }
        let mut request = http::Request::post("/mcp");
        for (name, value) in headers {
            request = request.header(name, value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn only_a_plain_head_is_eligible() {
        assert!(eligible(&head(&[])));
        assert!(eligible(&head(&[("host", Some("localhost"))])));
        assert!(eligible(&head(&[("accept", Some("Text/Event-Stream, application/json; charset=utf-8"))])));
        for change in [
            ("host", Some("example.com:4100")),
            ("host", None),
            ("origin", Some("http://127.0.0.1")),
            ("accept", Some("application/json")),
            ("accept", Some("application/json, text/event-stream; q=0")),
            ("accept", Some("application/json, text/event-stream;Q = 0")),
            ("accept", Some("application/json, text/event-stream;q=0.5")),
            ("accept", Some(r#"application/json;p="x,text/event-stream;y""#)),
            ("content-type", Some("text/plain")),
            ("mcp-protocol-version", None),
            ("mcp-protocol-version", Some("2026-07-28")),
            ("mcp-protocol-version", Some("1999-01-01")),
            ("content-length", None),
            ("content-length", Some("70000")),
            ("mcp-method", Some("tools/call")),
            ("mcp-name", Some("comms_list_topics")),
            ("mcp-session-id", Some("s")),
        ] {
            assert!(!eligible(&head(&[change])), "{change:?}");
        }
        let mut get = head(&[]);
        get.method = http::Method::GET;
        assert!(!eligible(&get));
    }

    #[test]
    fn only_a_plain_call_parses() {
        let call = |params: serde_json::Value| {
            serde_json::json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params }).to_string()
        };
        let plain = parse(call(serde_json::json!({ "name": "t", "arguments": { "a": 1 } })).as_bytes()).unwrap();
        assert_eq!((plain.params.name.as_str(), plain.params.arguments.unwrap().len()), ("t", 1));
        assert!(parse(call(serde_json::json!({ "name": "t" })).as_bytes()).is_some());
        assert!(
            parse(call(serde_json::json!({ "name": "t", "_meta": { "progressToken": "p" } })).as_bytes()).is_some()
        );
        for refused in [
            call(serde_json::json!({ "name": "t", "task": {} })),
            call(
                serde_json::json!({ "name": "t", "_meta": { "io.modelcontextprotocol/protocolVersion": "2025-06-18" } }),
            ),
            call(serde_json::json!({ "arguments": {} })),
            serde_json::json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": { "name": "t" } })
                .to_string(),
            serde_json::json!({ "jsonrpc": "1.0", "id": 1, "method": "tools/call", "params": { "name": "t" } })
                .to_string(),
            serde_json::json!({ "jsonrpc": "2.0", "method": "tools/call", "params": { "name": "t" } }).to_string(),
            serde_json::json!({ "jsonrpc": "2.0", "id": null, "method": "tools/call", "params": { "name": "t" } })
                .to_string(),
            serde_json::json!([{ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "name": "t" } }])
                .to_string(),
            "{".to_owned(),
        ] {
            assert!(parse(refused.as_bytes()).is_none(), "{refused}");
        }
    }
}
