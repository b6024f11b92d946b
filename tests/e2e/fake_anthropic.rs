//! A fake Anthropic Messages API for driving the real `claude` binary offline: an HTTP/1.1
//! server on a free loopback port that answers every `POST /v1/messages` (any query string)
//! with a streamed (SSE) reply taken from a script, answers `HEAD /` with 200, and records
//! every request body.
//!
//! Owns the wire shapes Claude Code reads: `message_start`, `content_block_start` /
//! `content_block_delta` (`text_delta`, `input_json_delta` for `tool_use` blocks) /
//! `content_block_stop`, `message_delta` with `stop_reason` and usage, `message_stop`. It is
//! the only faked part of the Claude Code tests; it does not interpret requests beyond
//! recording them, and it is not a general HTTP server (one request per connection,
//! `Content-Length` bodies, `connection: close`).
//!
//! The listener, the script queue and the request log are `fake_http`'s (shared with
//! `fake_openai`). Used by `crates/canopy-harness/tests/claude.rs` and the end-to-end tests,
//! so it needs only `std` and `serde_json`.

#![allow(dead_code, reason = "each test binary uses a different part of it")]

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use crate::fake_http::{Exchange, FakeServer, HttpRequest, SSE_HEAD, not_found};
use serde_json::{Value, json};

/// One scripted model reply: optional text, then tool calls (`tool_use` blocks), streamed
/// after `delay`.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    pub delay: Duration,
    pub text: Option<String>,
    /// (tool name as the model sees it, arguments)
    pub calls: Vec<(String, Value)>,
    /// Answer with this HTTP error status (and an Anthropic error body) instead.
    pub error: Option<u16>,
}

impl Reply {
    pub fn text(text: &str) -> Reply {
        Reply { text: Some(text.to_owned()), ..Reply::default() }
    }

    /// A call of one of Canopy's tools (`mcp__canopy__<name>`).
    pub fn canopy_tool(name: &str, arguments: Value) -> Reply {
        Reply::default().and_call(&format!("mcp__canopy__{name}"), arguments)
    }

    pub fn and_call(mut self, name: &str, arguments: Value) -> Reply {
        self.calls.push((name.to_owned(), arguments));
        self
    }

    /// An HTTP error answer: 401 (`authentication_error`), 529 (`overloaded_error`), ...
    pub fn error(status: u16) -> Reply {
        Reply { error: Some(status), ..Reply::default() }
    }

    /// Waits this long before answering (the model is "thinking").
    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

/// The running fake; dropping it stops accepting connections.
pub struct FakeAnthropic {
    server: FakeServer<Reply>,
}

impl FakeAnthropic {
    /// Starts the server with `script`; requests past its end get a short text reply.
    pub fn start(script: Vec<Reply>) -> FakeAnthropic {
        FakeAnthropic { server: FakeServer::start("the fake Anthropic API", script, serve) }
    }

    /// The `ANTHROPIC_BASE_URL` Claude Code is given.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.server.port())
    }

    /// Adds replies to the end of the script.
    pub fn push(&self, reply: Reply) {
        self.server.push(reply);
    }

    /// Every request body so far, in arrival order.
    pub fn requests(&self) -> Vec<Value> {
        self.server.requests()
    }

    /// Waits until at least `count` requests arrived; panics with what arrived otherwise.
    pub fn wait_requests(&self, count: usize, patience: Duration) -> Vec<Value> {
        self.server.wait_requests(count, patience).unwrap_or_else(|arrived| {
            panic!(
                "the fake Anthropic API got {} requests, not {count}: {:#?}",
                arrived.len(),
                arrived.iter().map(last_user_text).collect::<Vec<_>>()
            )
        })
    }
}

/// The `system` prompt of a request as one string (its text blocks joined by newlines).
pub fn system_text(request: &Value) -> String {
    match &request["system"] {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join("\n"),
        _ => String::new(),
    }
}

/// The names in a request's tool list.
pub fn tool_names(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map_or_else(Vec::new, |tools| tools.iter().filter_map(|t| t["name"].as_str().map(str::to_owned)).collect())
}

/// Every text the user side of the conversation carries (prompts, steers, tool results).
pub fn user_texts(request: &Value) -> Vec<String> {
    let mut texts = Vec::new();
    for message in request["messages"].as_array().into_iter().flatten().filter(|m| m["role"] == "user") {
        match &message["content"] {
            Value::String(text) => texts.push(text.clone()),
            Value::Array(blocks) => {
                for block in blocks {
                    if let Some(text) = block["text"].as_str() {
                        texts.push(text.to_owned());
                    }
                }
            }
            _ => {}
        }
    }
    texts
}

/// Every text block the assistant side of the conversation carries (earlier replies).
pub fn assistant_texts(request: &Value) -> Vec<String> {
    let messages = request["messages"].as_array().into_iter().flatten().filter(|m| m["role"] == "assistant");
    let mut texts = Vec::new();
    for message in messages {
        match &message["content"] {
            Value::String(text) => texts.push(text.clone()),
            Value::Array(blocks) => texts.extend(blocks.iter().filter_map(|b| b["text"].as_str().map(str::to_owned))),
            _ => {}
        }
    }
    texts
}

/// The newest user text of a request (for failure messages).
pub fn last_user_text(request: &Value) -> String {
    user_texts(request).pop().unwrap_or_default()
}

fn serve(mut stream: TcpStream, request: HttpRequest, exchange: &Exchange<Reply>) {
    let (method, path) = (request.method.as_str(), request.path());
    if method == "HEAD" || (method == "GET" && path == "/") {
        let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        return;
    }
    if method != "POST" || path != "/v1/messages" {
        not_found(&mut stream);
        return;
    }
    let request: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    // Side requests (titles, summaries) are not streamed; the scripted turns always are.
    let streamed = request["stream"].as_bool().unwrap_or(false);
    let (reply, number) = exchange.record(request, streamed);
    let reply = reply.unwrap_or_else(|| Reply::text("ok"));
    std::thread::sleep(reply.delay);
    if let Some(status) = reply.error {
        let kind = match status {
            401 => "authentication_error",
            403 => "permission_error",
            429 => "rate_limit_error",
            529 => "overloaded_error",
            _ => "api_error",
        };
        let body = json!({"type": "error", "error": {"type": kind, "message": format!("fake {kind}")}}).to_string();
        let head = format!(
            "HTTP/1.1 {status} Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes()));
        return;
    }
    let events = events(&reply, number);
    if !streamed {
        let message = json!({
            "id": format!("msg_{number}"), "type": "message", "role": "assistant", "model": "claude-fake",
            "content": [{"type": "text", "text": reply.text.clone().unwrap_or_default()}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        });
        let body = message.to_string();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes()));
        return;
    }
    if stream.write_all(SSE_HEAD).is_err() {
        return;
    }
    for (name, data) in events {
        let chunk = format!("event: {name}\ndata: {data}\n\n");
        if stream.write_all(chunk.as_bytes()).and_then(|()| stream.flush()).is_err() {
            return;
        }
    }
}

/// The SSE events of one reply.
fn events(reply: &Reply, number: u64) -> Vec<(&'static str, Value)> {
    let mut events = vec![(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": format!("msg_{number}"), "type": "message", "role": "assistant", "model": "claude-fake",
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
        }}),
    )];
    let mut index = 0;
    if let Some(text) = &reply.text {
        events.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
        ));
        events.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}),
        ));
        events.push(("content_block_stop", json!({"type": "content_block_stop", "index": index})));
        index += 1;
    }
    for (call, (name, arguments)) in reply.calls.iter().enumerate() {
        events.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {
                "type": "tool_use", "id": format!("toolu_{number}_{call}"), "name": name, "input": {}}}),
        ));
        events.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index,
                   "delta": {"type": "input_json_delta", "partial_json": arguments.to_string()}}),
        ));
        events.push(("content_block_stop", json!({"type": "content_block_stop", "index": index})));
        index += 1;
    }
    let stop_reason = if reply.calls.is_empty() { "end_turn" } else { "tool_use" };
    events.push((
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": 5}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    events
}
