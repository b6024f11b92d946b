//! Tests of the MCP client, and of the binary's `call` action, against a tiny in-test server.
//!
//! Owns the server double (hyper http1 with `service_fn`) that answers `initialize`,
//! `notifications/initialized`, `tools/list` and `tools/call` as JSON or as SSE, checks the
//! bearer token and records the headers it saw. It is not a full MCP server.

#![allow(clippy::unwrap_used, reason = "tests fail loudly on purpose")]

mod common;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use canopy_scripted::mcp::{McpClient, McpError};
use canopy_scripted::protocol::Output;
use common::{Harness, ended, free, started};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

const TOKEN: &str = "secret-token";
const SESSION: &str = "session-42";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Json,
    /// SSE, with a notification before the answer and the stream left open after it.
    Sse,
}

/// What the server saw for one request: method, session header, protocol version header.
type Seen = (String, Option<String>, Option<String>);

struct Server {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    async fn start(mode: Mode) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let record = record.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| handle(request, mode, record.clone()));
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Server { url, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// A body that sends one chunk and then never ends, like an SSE stream a server keeps open.
struct OpenEnded(Option<Bytes>);

impl hyper::body::Body for OpenEnded {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut().0.take() {
            Some(chunk) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
            None => Poll::Pending,
        }
    }
}

fn full(status: StatusCode, content_type: &str, body: String) -> Response<BoxBody<Bytes, Infallible>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("mcp-session-id", SESSION)
        .body(Full::new(Bytes::from(body)).boxed())
        .unwrap()
}

async fn handle(
    request: Request<Incoming>,
    mode: Mode,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> Result<Response<BoxBody<Bytes, Infallible>>, Infallible> {
    let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let authorized = header("authorization") == Some(format!("Bearer {TOKEN}"));
    let accept_ok = header("accept").is_some_and(|a| a.contains("application/json") && a.contains("text/event-stream"));
    let session = header("mcp-session-id");
    let version = header("mcp-protocol-version");
    let host_ok = header("host").is_some();
    let body = request.into_body().collect().await.unwrap().to_bytes();
    if !authorized {
        return Ok(full(StatusCode::UNAUTHORIZED, "text/plain", "bad token".to_owned()));
    }
    assert!(accept_ok && host_ok, "the client must send accept and host");
    let message: Value = serde_json::from_slice(&body).unwrap();
    let method = message["method"].as_str().unwrap_or_default().to_owned();
    seen.lock().unwrap().push((method.clone(), session, version));
    let id = message["id"].clone();
    let result = match method.as_str() {
        "initialize" => json!({
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "test", "version": "0"},
        }),
        "notifications/initialized" => {
            return Ok(full(StatusCode::ACCEPTED, "text/plain", String::new()));
        }
        "tools/list" => json!({"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}),
        "tools/call" => {
            let arguments = &message["params"]["arguments"];
            match message["params"]["name"].as_str() {
                Some("echo") => json!({"content": [{"type": "text", "text": arguments.to_string()}]}),
                Some("structured") => json!({
                    "content": [{"type": "text", "text": "see structured"}],
                    "structuredContent": {"seq": 7},
                }),
                Some("fails") => json!({"content": [{"type": "text", "text": "no such channel"}], "isError": true}),
                _ => {
                    let error =
                        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32602, "message": "unknown tool"}});
                    return Ok(reply(mode, error));
                }
            }
        }
        _ => return Ok(full(StatusCode::BAD_REQUEST, "text/plain", format!("unexpected {method}"))),
    };
    Ok(reply(mode, json!({"jsonrpc": "2.0", "id": id, "result": result})))
}

fn reply(mode: Mode, message: Value) -> Response<BoxBody<Bytes, Infallible>> {
    match mode {
        Mode::Json => full(StatusCode::OK, "application/json", message.to_string()),
        Mode::Sse => {
            let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}});
            let events = format!(": keep-alive\n\nevent: message\ndata: {progress}\n\nid: 1\ndata: {message}\n\n");
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "text/event-stream")
                .header("mcp-session-id", SESSION)
                .body(OpenEnded(Some(Bytes::from(events))).boxed())
                .unwrap()
        }
    }
}

async fn exercise_client(mode: Mode) {
    let server = Server::start(mode).await;
    let mut client = McpClient::new(&server.url, TOKEN).unwrap().with_timeout(common::STEP_TIMEOUT);

    let tools = client.list_tools().await.unwrap();
    assert_eq!(tools[0]["name"], "echo");

    let echo = client.call_tool("echo", json!({"a": [1, "two"]})).await.unwrap();
    assert!(!echo.is_error);
    assert_eq!(echo.output, json!({"a": [1, "two"]}));

    let structured = client.call_tool("structured", json!({})).await.unwrap();
    assert_eq!(structured.output, json!({"seq": 7}));

    let failed = client.call_tool("fails", json!({})).await.unwrap();
    assert!(failed.is_error);
    assert_eq!(failed.output, json!("no such channel"));

    match client.call_tool("nope", json!({})).await {
        Err(McpError::Rpc { code: -32602, message }) => assert_eq!(message, "unknown tool"),
        other => panic!("expected a json-rpc error, got {other:?}"),
    }

    let version = Some("2025-06-18".to_owned());
    let session = Some(SESSION.to_owned());
    let seen = server.seen();
    assert_eq!(seen[0], ("initialize".to_owned(), None, None));
    assert_eq!(seen[1], ("notifications/initialized".to_owned(), session.clone(), version.clone()));
    assert_eq!(seen[2], ("tools/list".to_owned(), session.clone(), version.clone()));
    // One handshake per client, however many calls follow.
    assert_eq!(seen.len(), 7);
    assert!(seen[3..].iter().all(|s| *s == ("tools/call".to_owned(), session.clone(), version.clone())));
}

#[tokio::test]
async fn the_client_works_against_a_json_server() {
    exercise_client(Mode::Json).await;
}

#[tokio::test]
async fn the_client_works_against_an_sse_server_that_keeps_streams_open() {
    exercise_client(Mode::Sse).await;
}

#[tokio::test]
async fn a_wrong_token_is_an_http_401_error() {
    let server = Server::start(Mode::Json).await;
    let mut client = McpClient::new(&server.url, "wrong").unwrap();
    match client.call_tool("echo", json!({})).await {
        Err(McpError::Status { status: 401, body }) => assert_eq!(body, "bad token"),
        other => panic!("expected a 401, got {other:?}"),
    }
    assert!(server.seen().is_empty());
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    // Accept and hold connections without ever answering.
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let mut client = McpClient::new(&url, TOKEN).unwrap().with_timeout(Duration::from_millis(200));
    assert!(matches!(client.call_tool("echo", json!({})).await, Err(McpError::Timeout(_))));
    holder.abort();
}

#[tokio::test]
async fn a_closed_port_is_a_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    drop(listener);
    let mut client = McpClient::new(&url, TOKEN).unwrap();
    assert!(matches!(client.list_tools().await, Err(McpError::Connect { .. })));
}

#[tokio::test]
async fn the_binary_calls_tools_with_placeholders_and_reports_errors() {
    let server = Server::start(Mode::Sse).await;
    let script = r#"
[[rule]]
actions = [
  { call = "echo", args = { who = "{self}", home = "{home}", said = "{input.text}", from = "{input.sender}", n = 3 } },
  { call = "fails" },
]
"#;
    let mut h = Harness::start(script, &[("CANOPY_MCP_URL", &server.url), ("CANOPY_MCP_TOKEN", TOKEN)]).await;
    h.send(json!({"type": "prompt", "id": "p1", "text": "hi there", "meta": {"sender": "bob"}})).await;
    assert_eq!(h.next().await, started("t1", "p1"));
    let args = json!({"who": "ada", "home": "ada-home", "said": "hi there", "from": "bob", "n": 3});
    assert_eq!(
        h.next().await,
        Output::ToolStarted { turn_id: "t1".into(), call_id: "c1".into(), name: "echo".into(), args: args.clone() }
    );
    assert_eq!(
        h.next().await,
        Output::ToolFinished {
            turn_id: "t1".into(),
            call_id: "c1".into(),
            name: "echo".into(),
            is_error: false,
            output: args
        }
    );
    assert!(matches!(h.next().await, Output::ToolStarted { call_id, .. } if call_id == "c2"));
    assert_eq!(
        h.next().await,
        Output::ToolFinished {
            turn_id: "t1".into(),
            call_id: "c2".into(),
            name: "fails".into(),
            is_error: true,
            output: json!("no such channel"),
        }
    );
    assert_eq!(h.next().await, free("t1"));
    assert_eq!(h.next().await, ended("t1", "completed"));
    let results: Vec<Value> = h.transcript().into_iter().filter(|line| line["kind"] == "tool_result").collect();
    assert_eq!(results[1]["is_error"], json!(true));
    assert_eq!(results[1]["output"], json!("no such channel"));
}

#[tokio::test]
async fn the_binary_reports_a_wrong_token_as_a_tool_error() {
    let server = Server::start(Mode::Json).await;
    let script = "[[rule]]\nactions = [{ call = \"echo\" }]\n";
    let mut h = Harness::start(script, &[("CANOPY_MCP_URL", &server.url), ("CANOPY_MCP_TOKEN", "wrong")]).await;
    h.send(json!({"type": "prompt", "id": "p1", "text": "x"})).await;
    assert_eq!(h.next().await, started("t1", "p1"));
    assert!(matches!(h.next().await, Output::ToolStarted { .. }));
    match h.next().await {
        Output::ToolFinished { is_error: true, output, .. } => {
            let message = output["error"].as_str().unwrap();
            assert!(message.contains("401") && message.contains("bad token"), "{message}");
        }
        other => panic!("expected a failed tool call, got {other:?}"),
    }
    assert_eq!(h.next().await, free("t1"));
    assert_eq!(h.next().await, ended("t1", "completed"));
}
