//! A minimal MCP client over streamable HTTP, as a real harness uses to reach Canopy's tools.
//!
//! Owns the HTTP exchange (hyper's http1 client, one connection per request), the lazy
//! `initialize` / `notifications/initialized` handshake, `tools/call` and `tools/list`, and
//! reading either a JSON or a server-sent-events response, and `forward`, which relays any
//! JSON-RPC message a client wrote (the `canopy mcp --stdio` bridge, so a stdio-only harness
//! reaches the runner's endpoint with its own token and no NATS credential). It does not do TLS, server-initiated
//! requests, resumption of SSE streams or anything else a scripted stand-in does not need.

use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// The MCP revision the client asks for in `initialize`.
pub const PROTOCOL_VERSION: &str = "2025-06-18";

/// How long one HTTP exchange (connect, request, whole response) may take.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// Responses larger than this are refused: tool outputs are messages, not files.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// How much of an error body is kept in a `Status` error.
const MAX_ERROR_BODY_CHARS: usize = 2000;

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";

/// Why an MCP exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The endpoint is not a usable `http://` URL.
    #[error("mcp url `{url}` is invalid: {reason}")]
    BadUrl { url: String, reason: String },
    /// The token cannot be sent in an HTTP header.
    #[error("mcp token cannot be sent in an authorization header")]
    BadToken,
    /// The TCP connection could not be opened.
    #[error("mcp connection to {authority} failed: {source}")]
    Connect { authority: String, source: std::io::Error },
    /// The HTTP exchange broke off.
    #[error("mcp http exchange failed: {0}")]
    Http(#[from] hyper::Error),
    /// The server answered with a non-2xx status.
    #[error("mcp server answered http {status}: {body}")]
    Status { status: u16, body: String },
    /// The exchange took longer than the timeout.
    #[error("mcp exchange timed out after {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    /// The server answered with a JSON-RPC error.
    #[error("mcp json-rpc error {code}: {message}")]
    Rpc { code: i64, message: String },
    /// The response was not the JSON-RPC message expected.
    #[error("mcp response is malformed: {0}")]
    Malformed(String),
}

/// What a `tools/call` produced, shaped for `Output::ToolFinished`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    /// The server flagged the result with `isError: true`.
    pub is_error: bool,
    /// `structuredContent` if present, else the first text content (as JSON when it parses).
    pub output: Value,
    /// The JSON-RPC `result` as received.
    pub raw: Value,
}

/// Where requests go, split once at construction.
#[derive(Debug, Clone)]
struct Endpoint {
    /// Host for connecting (IPv6 without brackets).
    host: String,
    port: u16,
    /// `host:port` as written, for the `Host` header and messages.
    authority: String,
    /// Path and query.
    path: String,
}

/// What the handshake negotiated.
#[derive(Debug, Clone)]
struct Session {
    protocol_version: String,
    session_id: Option<String>,
}

/// The parts of a response the client acts on.
#[derive(Debug)]
struct Reply {
    session_id: Option<String>,
    message: Option<Value>,
}

/// An MCP client bound to one endpoint and bearer token. Not shared: methods take `&mut self`.
#[derive(Debug)]
pub struct McpClient {
    endpoint: Endpoint,
    authorization: HeaderValue,
    session: Option<Session>,
    next_id: u64,
    timeout: Duration,
}

impl McpClient {
    /// A client for `url` (`http://host[:port]/path`) sending `Authorization: Bearer <token>`.
    /// Nothing is sent until the first call.
    pub fn new(url: &str, token: &str) -> Result<Self, McpError> {
        let endpoint = parse_url(url)?;
        let authorization = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| McpError::BadToken)?;
        Ok(McpClient { endpoint, authorization, session: None, next_id: 1, timeout: EXCHANGE_TIMEOUT })
    }

    /// Replaces the per-exchange timeout (30 s by default).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Calls tool `name` with `arguments` (a JSON object). A result flagged `isError` is an
    /// `Ok` with `is_error` set; transport, HTTP and JSON-RPC failures are `Err`.
    pub async fn call_tool(&mut self, name: &str, arguments: Value) -> Result<ToolOutcome, McpError> {
        let result = self.request("tools/call", json!({ "name": name, "arguments": arguments })).await?;
        Ok(tool_outcome(result))
    }

    /// Lists the server's tools (the `tools` array of `tools/list`, first page only).
    pub async fn list_tools(&mut self) -> Result<Vec<Value>, McpError> {
        let result = self.request("tools/list", json!({})).await?;
        match result.get("tools") {
            Some(Value::Array(tools)) => Ok(tools.clone()),
            _ => Err(McpError::Malformed("tools/list result has no `tools` array".to_owned())),
        }
    }

    /// Relays one JSON-RPC message a client wrote, as a stdio-to-HTTP bridge does: a
    /// request's answer comes back as `Some`; a notification or a response gets `None`. The
    /// session id and protocol version the server hands out at `initialize` are kept and sent
    /// with every later message. A failure to reach the server is answered to a request as a
    /// JSON-RPC error, so the client is never left waiting.
    pub async fn forward(&mut self, message: Value) -> Option<Value> {
        let id = message.get("id").filter(|_| message.get("method").is_some()).cloned();
        let initialize = message.get("method").and_then(Value::as_str) == Some("initialize");
        let session = if initialize { None } else { self.session.clone() };
        let posted = self.post_value(&message, id.as_ref(), session.as_ref()).await;
        let reply = match (posted, &id) {
            (Ok(reply), _) => reply,
            (Err(e), Some(id)) => {
                return Some(
                    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": -32000, "message": e.to_string() } }),
                );
            }
            (Err(e), None) => {
                eprintln!("canopy mcp: relaying a notification to the MCP endpoint failed: {e}");
                return None;
            }
        };
        if initialize
            && let Some(version) = reply.message.as_ref().and_then(|m| m["result"]["protocolVersion"].as_str())
        {
            self.session = Some(Session { protocol_version: version.to_owned(), session_id: reply.session_id.clone() });
        }
        match (reply.message, id) {
            (Some(answer), _) => Some(answer),
            (None, Some(id)) => Some(json!({
                "jsonrpc": "2.0", "id": id,
                "error": { "code": -32000, "message": "the MCP endpoint sent no answer" },
            })),
            (None, None) => None,
        }
    }

    /// Sends a request after making sure the session is initialized. A 404 on a session the
    /// server handed out means the server forgot it; the spec says to start a new one, once.
    async fn request(&mut self, method: &str, params: Value) -> Result<Value, McpError> {
        for attempt in 0..2 {
            let session = self.ensure_session().await?;
            let id = self.take_id();
            let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
            match self.post(&body, Some(id), Some(&session)).await {
                Err(McpError::Status { status: 404, .. }) if attempt == 0 && session.session_id.is_some() => {
                    self.session = None;
                }
                other => return rpc_result(other?.message, id),
            }
        }
        Err(McpError::Malformed("the server lost the session twice".to_owned()))
    }

    async fn ensure_session(&mut self) -> Result<Session, McpError> {
        if let Some(session) = &self.session {
            return Ok(session.clone());
        }
        let id = self.take_id();
        let body = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": { "name": "canopy-scripted", "version": env!("CARGO_PKG_VERSION") },
            },
        });
        let reply = self.post(&body, Some(id), None).await?;
        let session_id = reply.session_id;
        let result = rpc_result(reply.message, id)?;
        let protocol_version = match result.get("protocolVersion") {
            Some(Value::String(version)) => version.clone(),
            _ => return Err(McpError::Malformed("initialize result has no `protocolVersion`".to_owned())),
        };
        let session = Session { protocol_version, session_id };
        let note = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        self.post(&note, None, Some(&session)).await?;
        self.session = Some(session.clone());
        Ok(session)
    }

    fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// One POST under the timeout. With `expect_id`, reads the response message with that id;
    /// without (a notification), only the status matters.
    async fn post(&self, body: &Value, expect_id: Option<u64>, session: Option<&Session>) -> Result<Reply, McpError> {
        self.post_value(body, expect_id.map(Value::from).as_ref(), session).await
    }

    /// `post` with any JSON-RPC id (a client's ids may be strings).
    async fn post_value(
        &self,
        body: &Value,
        expect_id: Option<&Value>,
        session: Option<&Session>,
    ) -> Result<Reply, McpError> {
        let exchange = self.exchange(body, expect_id, session);
        tokio::time::timeout(self.timeout, exchange).await.map_err(|_| McpError::Timeout(self.timeout))?
    }

    async fn exchange(
        &self,
        body: &Value,
        expect_id: Option<&Value>,
        session: Option<&Session>,
    ) -> Result<Reply, McpError> {
        let endpoint = &self.endpoint;
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(endpoint.path.as_str())
            .header(HOST, endpoint.authority.as_str())
            .header(AUTHORIZATION, self.authorization.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json, text/event-stream");
        if let Some(session) = session {
            request = request.header(VERSION_HEADER, session.protocol_version.as_str());
            if let Some(id) = &session.session_id {
                request = request.header(SESSION_HEADER, id.as_str());
            }
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| McpError::Malformed(format!("cannot build the request: {e}")))?;

        let stream = TcpStream::connect((endpoint.host.as_str(), endpoint.port))
            .await
            .map_err(|source| McpError::Connect { authority: endpoint.authority.clone(), source })?;
        // The request body follows its head as a second small write: no Nagle delay for it.
        if let Err(e) = stream.set_nodelay(true) {
            // Only latency: the request still goes through.
            eprintln!("canopy mcp: TCP_NODELAY on the connection to the MCP endpoint: {e}");
        }
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        // The connection task must not outlive this exchange, also when the timeout drops it.
        let _connection = AbortOnDrop(tokio::spawn(async move {
            // A connection that fails fails the exchange on it too: `send_request` below
            // reports it, with the request it was for.
            let _ = connection.await;
        }));
        let response = sender.send_request(request).await?;
        let status = response.status();
        let session_id =
            response.headers().get(SESSION_HEADER).and_then(|value| value.to_str().ok()).map(str::to_owned);
        let is_sse = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.trim_start().to_ascii_lowercase().starts_with("text/event-stream"));
        let mut body = response.into_body();

        if !status.is_success() {
            let text = read_all(&mut body).await.unwrap_or_default();
            return Err(status_error(status, &text));
        }
        let Some(id) = expect_id else {
            return Ok(Reply { session_id, message: None });
        };
        let message =
            if is_sse { read_sse_reply(&mut body, id).await? } else { read_json_reply(&mut body, id).await? };
        Ok(Reply { session_id, message })
    }
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn status_error(status: StatusCode, body: &[u8]) -> McpError {
    let text = String::from_utf8_lossy(body);
    let mut text: String = text.trim().chars().take(MAX_ERROR_BODY_CHARS).collect();
    if text.is_empty() {
        text = status.canonical_reason().unwrap_or("no body").to_owned();
    }
    McpError::Status { status: status.as_u16(), body: text }
}

/// Reads the whole body, refusing more than `MAX_RESPONSE_BYTES`.
async fn read_all(body: &mut Incoming) -> Result<Vec<u8>, McpError> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if out.len() + data.len() > MAX_RESPONSE_BYTES {
                return Err(McpError::Malformed(format!("response is larger than {MAX_RESPONSE_BYTES} bytes")));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

async fn read_json_reply(body: &mut Incoming, id: &Value) -> Result<Option<Value>, McpError> {
    let bytes = read_all(body).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: Value =
        serde_json::from_slice(&bytes).map_err(|e| McpError::Malformed(format!("response body is not json: {e}")))?;
    // A batch is legal JSON-RPC; pick our answer out of it.
    Ok(match value {
        Value::Array(items) => items.into_iter().find(|item| is_reply_to(item, id)),
        other if is_reply_to(&other, id) => Some(other),
        _ => None,
    })
}

/// Reads SSE events until the one answering `id` arrives, so a server that keeps the stream
/// open afterwards does not stall the call. Other messages (notifications, requests) are skipped.
async fn read_sse_reply(body: &mut Incoming, id: &Value) -> Result<Option<Value>, McpError> {
    let mut parser = SseParser::default();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else { continue };
        total += data.len();
        if total > MAX_RESPONSE_BYTES {
            return Err(McpError::Malformed(format!("response is larger than {MAX_RESPONSE_BYTES} bytes")));
        }
        for event in parser.push(&data) {
            if let Some(found) = reply_in_event(&event, id) {
                return Ok(Some(found));
            }
        }
    }
    Ok(parser.finish().and_then(|event| reply_in_event(&event, id)))
}

fn reply_in_event(data: &str, id: &Value) -> Option<Value> {
    let value: Value = serde_json::from_str(data).ok()?;
    is_reply_to(&value, id).then_some(value)
}

fn is_reply_to(message: &Value, id: &Value) -> bool {
    message.get("id") == Some(id) && (message.get("result").is_some() || message.get("error").is_some())
}

/// Splits an SSE byte stream into the `data` of each event.
#[derive(Debug, Default)]
struct SseParser {
    /// Bytes of a line not yet terminated.
    partial: Vec<u8>,
    /// `data` lines of the event being read, joined by newlines.
    data: String,
    has_data: bool,
}

impl SseParser {
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        for &byte in bytes {
            if byte == b'\n' {
                let mut line = std::mem::take(&mut self.partial);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                if let Some(event) = self.line(&String::from_utf8_lossy(&line)) {
                    events.push(event);
                }
            } else {
                self.partial.push(byte);
            }
        }
        events
    }

    fn line(&mut self, line: &str) -> Option<String> {
        if line.is_empty() {
            if !self.has_data {
                return None;
            }
            self.has_data = false;
            return Some(std::mem::take(&mut self.data));
        }
        if let Some(rest) = line.strip_prefix("data:") {
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(rest);
            self.has_data = true;
        }
        // Other fields (`event`, `id`, `retry`) and comments do not matter here.
        None
    }

    /// The last event, when the stream ended without the blank line that closes it.
    fn finish(mut self) -> Option<String> {
        if !self.partial.is_empty() {
            let line = String::from_utf8_lossy(&std::mem::take(&mut self.partial)).into_owned();
            let line = line.strip_suffix('\r').unwrap_or(&line).to_owned();
            if let Some(event) = self.line(&line) {
                return Some(event);
            }
        }
        self.has_data.then_some(self.data)
    }
}

/// The `result` of the reply, or the JSON-RPC error as an `Err`.
fn rpc_result(message: Option<Value>, id: u64) -> Result<Value, McpError> {
    let Some(mut message) = message else {
        return Err(McpError::Malformed(format!("no json-rpc response with id {id}")));
    };
    if let Some(error) = message.get("error") {
        let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
        let text = error.get("message").and_then(Value::as_str).unwrap_or("no message").to_owned();
        return Err(McpError::Rpc { code, message: text });
    }
    match message.get_mut("result") {
        Some(result) => Ok(result.take()),
        None => Err(McpError::Malformed(format!("json-rpc response {id} has neither result nor error"))),
    }
}

/// Shapes a `tools/call` result: `structuredContent` first, then the first text content
/// (as JSON when it parses), then the whole content.
fn tool_outcome(raw: Value) -> ToolOutcome {
    let is_error = raw.get("isError").and_then(Value::as_bool).unwrap_or(false);
    let output = match raw.get("structuredContent") {
        Some(structured) if !structured.is_null() => structured.clone(),
        _ => match raw.get("content") {
            Some(content) => match content.get(0).and_then(|first| first.get("text")).and_then(Value::as_str) {
                Some(text) => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned())),
                None => content.clone(),
            },
            None => Value::Null,
        },
    };
    ToolOutcome { is_error, output, raw }
}

fn parse_url(url: &str) -> Result<Endpoint, McpError> {
    let bad = |reason: &str| McpError::BadUrl { url: url.to_owned(), reason: reason.to_owned() };
    let scheme_end = url.find("://").ok_or_else(|| bad("it has no scheme"))?;
    if !url[..scheme_end].eq_ignore_ascii_case("http") {
        return Err(bad("only http:// is supported"));
    }
    let rest = &url[scheme_end + 3..];
    let split = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    let path = path.split('#').next().unwrap_or_default();
    let path = if path.is_empty() {
        "/".to_owned()
    } else if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_owned()
    };
    if authority.contains('@') {
        return Err(bad("user info is not supported"));
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let close = bracketed.find(']').ok_or_else(|| bad("the ipv6 host has no closing bracket"))?;
        let after = &bracketed[close + 1..];
        let port = match after.strip_prefix(':') {
            Some(port) => Some(port),
            None if after.is_empty() => None,
            None => return Err(bad("junk after the ipv6 host")),
        };
        (&bracketed[..close], port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(bad("it has no host"));
    }
    let port = match port {
        None => 80,
        Some(port) => port.parse::<u16>().map_err(|_| bad("the port is not a number from 0 to 65535"))?,
    };
    // Checked here so building the request later cannot fail on a path the URI parser refuses.
    if path.parse::<http::Uri>().is_err() || HeaderValue::from_str(authority).is_err() {
        return Err(bad("it has characters not allowed in a url"));
    }
    Ok(Endpoint { host: host.to_owned(), port, authority: authority.to_owned(), path })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on purpose")]

    use super::*;

    #[test]
    fn urls_parse_into_host_port_and_path() {
        let e = parse_url("http://127.0.0.1:8080/mcp").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.authority.as_str(), e.path.as_str()),
            ("127.0.0.1", 8080, "127.0.0.1:8080", "/mcp")
        );
        let e = parse_url("http://localhost").unwrap();
        assert_eq!((e.host.as_str(), e.port, e.path.as_str()), ("localhost", 80, "/"));
        let e = parse_url("HTTP://[::1]:9/a/b?x=1").unwrap();
        assert_eq!((e.host.as_str(), e.port, e.authority.as_str(), e.path.as_str()), ("::1", 9, "[::1]:9", "/a/b?x=1"));
    }

    #[test]
    fn urls_that_are_not_plain_http_are_refused() {
        for url in [
            "https://127.0.0.1/mcp",
            "127.0.0.1:80/mcp",
            "http:///mcp",
            "http://127.0.0.1:99999/",
            "http://user@127.0.0.1/",
            "http://[::1/",
            "http://127.0.0.1:x/",
        ] {
            assert!(matches!(parse_url(url), Err(McpError::BadUrl { .. })), "{url}");
        }
    }

    #[test]
    fn sse_events_are_split_on_blank_lines() {
        let mut parser = SseParser::default();
        let mut events = parser.push(b"event: message\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n: comment\n\nda");
        events.extend(parser.push(b"ta: {\"b\":2}\n"));
        assert_eq!(events, vec!["{\"a\":\n1}".to_owned()]);
        assert_eq!(parser.finish(), Some("{\"b\":2}".to_owned()));
    }

    #[test]
    fn tool_outcomes_prefer_structured_content_then_json_text() {
        let structured =
            tool_outcome(json!({"content": [{"type": "text", "text": "x"}], "structuredContent": {"ok": 1}}));
        assert_eq!(structured.output, json!({"ok": 1}));
        assert!(!structured.is_error);
        let text_json = tool_outcome(json!({"content": [{"type": "text", "text": "{\"seq\": 4}"}]}));
        assert_eq!(text_json.output, json!({"seq": 4}));
        let plain = tool_outcome(json!({"content": [{"type": "text", "text": "no such channel"}], "isError": true}));
        assert_eq!(plain.output, json!("no such channel"));
        assert!(plain.is_error);
    }

    #[test]
    fn json_rpc_errors_carry_code_and_message() {
        let err = rpc_result(Some(json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -32602, "message": "bad"}})), 3)
            .unwrap_err();
        assert_eq!(err.to_string(), "mcp json-rpc error -32602: bad");
        assert!(matches!(rpc_result(None, 3), Err(McpError::Malformed(_))));
    }
}
