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
//! Used by `crates/canopy-harness/tests/claude.rs` and the end-to-end tests, so it needs only
//! `std` and `serde_json`.

#![allow(dead_code, reason = "each test binary uses a different part of it")]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// One scripted model reply: optional text, then tool calls (`tool_use` blocks), streamed
/// after `delay`.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    pub delay: Duration,
    pub text: Option<String>,
    /// (tool name as the model sees it, arguments)
    pub calls: Vec<(String, Value)>,
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

    /// Waits this long before answering (the model is "thinking").
    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

#[derive(Default)]
struct State {
    script: VecDeque<Reply>,
    requests: Vec<Value>,
    served: u64,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// The running fake; dropping it stops accepting connections.
pub struct FakeAnthropic {
    port: u16,
    state: Shared,
    stop: Arc<AtomicBool>,
}

impl FakeAnthropic {
    /// Starts the server with `script`; requests past its end get a short text reply.
    pub fn start(script: Vec<Reply>) -> FakeAnthropic {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port for the fake Anthropic API");
        let port = listener.local_addr().expect("the fake's address").port();
        let state: Shared = Arc::new((Mutex::new(State { script: script.into(), ..State::default() }), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (state_for_thread, stop_for_thread) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop_for_thread.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let state = state_for_thread.clone();
                std::thread::spawn(move || serve(stream, &state));
            }
        });
        FakeAnthropic { port, state, stop }
    }

    /// The `ANTHROPIC_BASE_URL` Claude Code is given.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Adds replies to the end of the script.
    pub fn push(&self, reply: Reply) {
        self.lock().script.push_back(reply);
    }

    /// Every request body so far, in arrival order.
    pub fn requests(&self) -> Vec<Value> {
        self.lock().requests.clone()
    }

    /// Waits until at least `count` requests arrived; panics with what arrived otherwise.
    pub fn wait_requests(&self, count: usize, patience: Duration) -> Vec<Value> {
        let deadline = Instant::now() + patience;
        let (lock, ready) = &*self.state;
        let mut state = lock.lock().unwrap_or_else(|e| e.into_inner());
        while state.requests.len() < count {
            let now = Instant::now();
            assert!(
                now < deadline,
                "the fake Anthropic API got {} requests, not {count}: {:#?}",
                state.requests.len(),
                state.requests.iter().map(last_user_text).collect::<Vec<_>>()
            );
            state = ready.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        state.requests.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for FakeAnthropic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
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

fn serve(mut stream: TcpStream, state: &Shared) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(reader_stream) = stream.try_clone() else { return };
    let mut reader = BufReader::new(reader_stream);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).is_err() || header == "\r\n" || header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.trim().eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let mut body = vec![0u8; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    if method == "HEAD" || (method == "GET" && path == "/") {
        let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        return;
    }
    if method != "POST" || path != "/v1/messages" {
        let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        return;
    }
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    // Side requests (titles, summaries) are not streamed; the scripted turns always are.
    let streamed = request["stream"].as_bool().unwrap_or(false);
    let (reply, number) = {
        let (lock, ready) = &**state;
        let mut state = lock.lock().unwrap_or_else(|e| e.into_inner());
        state.requests.push(request);
        state.served += 1;
        ready.notify_all();
        let reply = if streamed { state.script.pop_front() } else { None };
        (reply.unwrap_or_else(|| Reply::text("ok")), state.served)
    };
    std::thread::sleep(reply.delay);
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
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
    if stream.write_all(head.as_bytes()).is_err() {
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
