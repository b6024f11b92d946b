//! The tools endpoint's direct path for `tools/call` (`canopy_tools::http::serve`) against
//! the same tools served by rmcp alone (`serve_handler` without it), both calling a real
//! daemon on a real `nats-server` and SQLite file: every request, plain or not, is answered
//! the same by both (status, content type and JSON body), so the direct path neither
//! answers differently nor refuses what rmcp would take. Does not measure anything.

use std::collections::HashSet;
use std::sync::Arc;

use canopy_bench::Bench;
use canopy_tools::http::{HttpEndpoint, TokenCheck, serve, serve_handler};
use canopy_tools::{CanopyTools, TokenSource};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 request on a fresh connection; the status, content type and body.
async fn send(endpoint: &HttpEndpoint, head: &[(&str, String)], body: &str) -> (u16, String, String) {
    let mut stream = tokio::net::TcpStream::connect(endpoint.addr).await.unwrap_or_else(|e| panic!("connecting: {e}"));
    let mut request = "POST /mcp HTTP/1.1\r\nconnection: close\r\n".to_owned();
    for (name, value) in head {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).await.unwrap_or_else(|e| panic!("writing: {e}"));
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap_or_else(|e| panic!("reading: {e}"));
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head in {answer:?}"));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("status in {head:?}"));
    let content_type = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type:").map(|v| v.trim().to_owned()))
        .unwrap_or_default();
    (status, content_type, body.to_owned())
}

/// A request to send to both endpoints: its name, the headers it changes, its body.
type Case = (&'static str, Vec<(&'static str, String)>, String);

/// The headers a harness sends with a tool call.
fn plain_head(token: &str, port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("host", format!("127.0.0.1:{port}")),
        ("authorization", format!("Bearer {token}")),
        ("content-type", "application/json".into()),
        ("accept", "application/json, text/event-stream".into()),
        ("mcp-protocol-version", "2025-06-18".into()),
    ]
}

fn with(mut head: Vec<(&'static str, String)>, name: &'static str, value: Option<&str>) -> Vec<(&'static str, String)> {
    head.retain(|(n, _)| *n != name);
    if let Some(value) = value {
        head.push((name, value.to_owned()));
    }
    head
}

/// The body as JSON when it is JSON, else as text.
fn parsed(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_direct_path_answers_every_request_as_rmcp_does() {
    let bench = Bench::start().await.unwrap_or_else(|e| panic!("starting the sandbox: {e}"));
    let homes = bench.create_agents("direct", 1, false).await.unwrap_or_else(|e| panic!("{e}"));
    let (sessions, heartbeat) = bench.fake_sessions_kept(10).await.unwrap_or_else(|e| panic!("{e}"));
    let session = sessions.iter().find(|s| format!("home-{}", s.agent) == homes[0]).expect("the agent's session");
    let token = session.token.clone();
    let known: Arc<HashSet<String>> = Arc::new([token.clone()].into());
    let check: TokenCheck = Arc::new(move |t| known.contains(t));
    let tools = CanopyTools::new(bench.in_process.clone(), TokenSource::Header);
    let direct = serve(tools.clone(), check.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let rmcp_only = serve_handler(tools.clone(), None, check).await.unwrap_or_else(|e| panic!("{e}"));

    let call =
        |params: Value| json!({ "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params }).to_string();
    let topics = json!({ "name": "comms_list_topics", "arguments": { "channel": homes[0] } });
    let cases: Vec<Case> = vec![
        ("a plain call", vec![], call(topics.clone())),
        (
            "a string id",
            vec![],
            json!({ "jsonrpc": "2.0", "id": "x-1", "method": "tools/call", "params": topics }).to_string(),
        ),
        (
            "a progress token",
            vec![],
            call(
                json!({ "name": "comms_list_topics", "arguments": { "channel": homes[0] }, "_meta": { "progressToken": 3 } }),
            ),
        ),
        ("an unknown tool", vec![], call(json!({ "name": "no_such_tool", "arguments": {} }))),
        ("bad arguments", vec![], call(json!({ "name": "comms_list_topics", "arguments": { "channel": 5 } }))),
        ("no arguments", vec![], call(json!({ "name": "comms_list_topics" }))),
        (
            "a channel it may not read",
            vec![],
            call(json!({ "name": "comms_list_topics", "arguments": { "channel": "no-such-channel" } })),
        ),
        ("another method", vec![], json!({ "jsonrpc": "2.0", "id": 8, "method": "ping" }).to_string()),
        ("a notification", vec![], json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }).to_string()),
        ("an extra field", vec![], call(json!({ "name": "comms_list_topics", "arguments": {}, "extra": 1 }))),
        ("not JSON", vec![], "{not json".into()),
        (
            "a protocol version in _meta",
            vec![],
            call(
                json!({ "name": "comms_list_topics", "arguments": { "channel": homes[0] }, "_meta": { "io.modelcontextprotocol/protocolVersion": "2025-06-18" } }),
            ),
        ),
        ("no event streams accepted", vec![("accept", "application/json".into())], call(topics.clone())),
        (
            "event streams refused by weight",
            vec![("accept", "application/json, text/event-stream;q=0".into())],
            call(topics.clone()),
        ),
        (
            "a weight in capitals and spaces",
            vec![("accept", "application/json, text/event-stream;Q = 0".into())],
            call(topics.clone()),
        ),
        (
            "a quoted parameter",
            vec![("accept", r#"application/json;p="x,text/event-stream;y""#.into())],
            call(topics.clone()),
        ),
        (
            "a positive weight",
            vec![("accept", "application/json;q=0.9, text/event-stream;q=0.5".into())],
            call(topics.clone()),
        ),
        ("a foreign host", vec![("host", "example.com".into())], call(topics.clone())),
        ("an origin", vec![("origin", "http://example.com".into())], call(topics.clone())),
        ("a form body", vec![("content-type", "text/plain".into())], call(topics.clone())),
        ("an unknown protocol version", vec![("mcp-protocol-version", "1999-01-01".into())], call(topics.clone())),
        ("the newest protocol version", vec![("mcp-protocol-version", "2026-07-28".into())], call(topics.clone())),
        ("a session id", vec![("mcp-session-id", "abc".into())], call(topics.clone())),
    ];
    let mut direct_plain = 0;
    for (name, changes, body) in cases {
        let mut answers = Vec::new();
        for endpoint in [&direct, &rmcp_only] {
            let mut head = plain_head(&token, endpoint.addr.port());
            for (header, value) in &changes {
                head = with(head, header, Some(value));
            }
            let (status, content_type, text) = send(endpoint, &head, &body).await;
            answers.push((status, content_type, parsed(&text)));
        }
        assert_eq!(answers[0], answers[1], "{name}: the direct path and rmcp answered differently");
        if name == "a plain call" {
            assert_eq!(answers[0].0, 200);
            assert_eq!(answers[0].2["result"]["isError"], json!(false), "{name}: {:?}", answers[0].2);
            direct_plain += 1;
        }
    }
    assert_eq!(direct_plain, 1);
    heartbeat.abort();
    bench.stop().await;
}
