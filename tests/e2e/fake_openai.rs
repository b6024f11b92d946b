//! A fake OpenAI Responses API for driving the real `codex` binary offline: an HTTP/1.1
//! server on a free loopback port that answers every `POST /v1/responses` with a streamed
//! (SSE) reply taken from a script, and records every request body.
//!
//! Owns the wire shapes Codex reads (`response.created`, `response.output_item.added` /
//! `.done` for messages and `function_call`s, `response.output_text.delta`,
//! `response.completed` with usage). It is the only faked part of the Codex tests; it does
//! not interpret what Codex sends beyond recording it, and it is not a general HTTP server
//! (one request per connection, `Content-Length` bodies, `connection: close`).
//!
//! The listener, the script queue and the request log are `fake_http`'s (shared with
//! `fake_anthropic`). Used by `crates/canopy-harness/tests/codex.rs` and the end-to-end
//! tests, so it needs only `std` and `serde_json`.

#![allow(dead_code, reason = "each test binary uses a different part of it")]

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use crate::fake_http::{Exchange, FakeServer, HttpRequest, SSE_HEAD, not_found};
use serde_json::{Value, json};

/// One function call the fake model makes.
#[derive(Debug, Clone)]
pub struct ToolCall {
    /// The namespace Codex gave the tool (`mcp__canopy` for Canopy's tools), or none for
    /// Codex's own tools such as `exec_command`.
    pub namespace: Option<String>,
    pub name: String,
    pub arguments: Value,
}

/// One scripted model reply: optional text, then tool calls, streamed after `delay`;
/// `response.completed` follows after `hold`.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    pub delay: Duration,
    pub text: Option<String>,
    pub calls: Vec<ToolCall>,
    pub hold: Duration,
}

impl Reply {
    pub fn text(text: &str) -> Reply {
        Reply { text: Some(text.to_owned()), ..Reply::default() }
    }

    /// A call of one of Canopy's tools (served by Codex's MCP client as `mcp__canopy`).
    pub fn canopy_tool(name: &str, arguments: Value) -> Reply {
        Reply::default().and_call(Some("mcp__canopy"), name, arguments)
    }

    /// A shell command through Codex's own `exec_command` tool: a slow tool needs no server.
    pub fn shell(command: &str) -> Reply {
        Reply::default().and_call(None, "exec_command", json!({ "cmd": command }))
    }

    pub fn and_call(mut self, namespace: Option<&str>, name: &str, arguments: Value) -> Reply {
        self.calls.push(ToolCall { namespace: namespace.map(str::to_owned), name: name.to_owned(), arguments });
        self
    }

    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

/// The running fake; dropping it stops accepting connections.
pub struct FakeOpenAi {
    server: FakeServer<Reply>,
}

impl FakeOpenAi {
    /// Starts the server with `script`; requests past its end get a short text reply.
    pub fn start(script: Vec<Reply>) -> FakeOpenAi {
        FakeOpenAi { server: FakeServer::start("the fake OpenAI API", script, serve) }
    }

    /// The provider base URL Codex is configured with (Codex appends `/responses`).
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.server.port())
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
                "the fake OpenAI API got {} requests, expected {count}: {:#?}",
                arrived.len(),
                arrived.iter().map(summary).collect::<Vec<_>>()
            )
        })
    }
}

/// A request's input items as (role or type, text) pairs, for assertion messages.
pub fn summary(request: &Value) -> Vec<(String, String)> {
    input_items(request)
        .iter()
        .map(|item| {
            let kind = item["role"].as_str().or(item["type"].as_str()).unwrap_or("?").to_owned();
            let mut text = item_text(item);
            text.truncate(120);
            (kind, text)
        })
        .collect()
}

pub fn input_items(request: &Value) -> Vec<Value> {
    request["input"].as_array().cloned().unwrap_or_default()
}

/// The text of a message item (its parts joined), or of a function call's arguments/output.
pub fn item_text(item: &Value) -> String {
    if let Some(parts) = item["content"].as_array() {
        return parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n");
    }
    item["output"].as_str().or(item["arguments"].as_str()).unwrap_or_default().to_owned()
}

/// Messages of one role in a request, in order.
pub fn messages_of(request: &Value, role: &str) -> Vec<String> {
    input_items(request).iter().filter(|i| i["type"] == "message" && i["role"] == role).map(item_text).collect()
}

/// Whether the request's tool list offers `name` (top level or inside a namespace).
pub fn offers_tool(request: &Value, namespace: Option<&str>, name: &str) -> bool {
    let tools = request["tools"].as_array().cloned().unwrap_or_default();
    tools.iter().any(|tool| match namespace {
        None => tool["name"] == name,
        Some(ns) => {
            tool["type"] == "namespace"
                && tool["name"] == ns
                && tool["tools"].as_array().is_some_and(|inner| inner.iter().any(|t| t["name"] == name))
        }
    })
}

fn serve(mut stream: TcpStream, request: HttpRequest, exchange: &Exchange<Reply>) {
    if request.method != "POST" || !request.target.ends_with("/responses") {
        not_found(&mut stream);
        return;
    }
    let body = request.body;
    let request: Value =
        serde_json::from_slice(&body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let (reply, number) = exchange.record(request, true);
    let reply = reply.unwrap_or_else(|| Reply::text("(the fake's script has ended)"));
    let _ = stream_reply(&mut stream, &reply, number);
}

fn stream_reply(stream: &mut TcpStream, reply: &Reply, number: u64) -> std::io::Result<()> {
    stream.write_all(SSE_HEAD)?;
    let response_id = format!("resp_{number}");
    let mut send = |event: Value| -> std::io::Result<()> {
        let kind = event["type"].as_str().unwrap_or_default().to_owned();
        stream.write_all(format!("event: {kind}\ndata: {event}\n\n").as_bytes())?;
        stream.flush()
    };
    send(json!({ "type": "response.created", "response": { "id": response_id } }))?;
    std::thread::sleep(reply.delay);
    let mut index = 0;
    if let Some(text) = &reply.text {
        let id = format!("msg_{number}");
        let done = json!({ "type": "message", "role": "assistant", "id": id,
            "content": [{ "type": "output_text", "text": text, "annotations": [] }] });
        let mut added = done.clone();
        added["content"] = json!([]);
        send(json!({ "type": "response.output_item.added", "output_index": index, "item": added }))?;
        send(json!({ "type": "response.output_text.delta", "item_id": id, "output_index": index,
            "content_index": 0, "delta": text }))?;
        send(json!({ "type": "response.output_item.done", "output_index": index, "item": done }))?;
        index += 1;
    }
    for (n, call) in reply.calls.iter().enumerate() {
        let mut item = json!({ "type": "function_call", "id": format!("fc_{number}_{n}"),
            "call_id": format!("call_{number}_{n}"), "name": call.name, "arguments": call.arguments.to_string() });
        if let Some(namespace) = &call.namespace {
            item["namespace"] = Value::String(namespace.clone());
        }
        send(json!({ "type": "response.output_item.added", "output_index": index, "item": item }))?;
        send(json!({ "type": "response.output_item.done", "output_index": index, "item": item }))?;
        index += 1;
    }
    std::thread::sleep(reply.hold);
    send(json!({ "type": "response.completed", "response": { "id": response_id, "usage": {
        "input_tokens": 1000 + number, "input_tokens_details": { "cached_tokens": 100 },
        "output_tokens": 20, "output_tokens_details": { "reasoning_tokens": 0 }, "total_tokens": 1020 + number } } }))
}
