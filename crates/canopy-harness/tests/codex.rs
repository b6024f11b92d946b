//! The Codex adapter against the real `codex app-server` (pinned 0.171.0) and the fake
//! OpenAI Responses API: the handshake and the wait for Canopy's MCP server, the replace
//! and append prompts as they reach the model, turn start, a steer during a slow tool and
//! during the final model call, a steer after the turn (fallback), interrupt, a clean stop,
//! and the next incarnation resuming the thread (or starting a fresh one when it cannot).
//!
//! Only the model API is fake. Canopy's MCP endpoint lives above this crate, so a minimal
//! MCP responder (`McpStub`, one tool) stands in for it here; the end-to-end tests
//! (`tests/e2e/codex.rs`) use the real one. A missing binary fails every test with the
//! install command; nothing is skipped.

#![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

#[path = "../../../tests/e2e/fake_http.rs"]
mod fake_http;
#[path = "../../../tests/e2e/fake_openai.rs"]
mod fake_openai;
#[path = "../../../tests/e2e/harness_bins.rs"]
mod harness_bins;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use canopy_harness::{
    HarnessEvent, HarnessKind, InputContext, LaunchSpec, Prompt, ProviderSettings, SendMode, SendOutcome, Session,
    TurnStatus,
};
use fake_openai::{FakeOpenAi, Reply, messages_of, offers_tool};
use harness_bins::codex_bin;
use serde_json::{Value, json};
use tokio::sync::mpsc;

const PATIENCE: Duration = Duration::from_secs(30);

/// A minimal MCP server over streamable HTTP (JSON answers, no sessions): `initialize`,
/// `tools/list` with one tool, `tools/call` echoing its arguments. It checks the bearer
/// token, so a test also proves Codex presents it.
struct McpStub {
    port: u16,
}

const STUB_TOKEN: &str = "cns_stub_token";

impl McpStub {
    fn start() -> McpStub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || mcp_connection(stream));
            }
        });
        McpStub { port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

fn mcp_connection(stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let (mut length, mut authorised) = (0usize, false);
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                let value = value.trim();
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.parse().unwrap_or(0);
                } else if name.eq_ignore_ascii_case("authorization") {
                    authorised = value == format!("Bearer {STUB_TOKEN}");
                }
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let respond = |writer: &mut TcpStream, status: &str, body: &str| {
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            writer.write_all(head.as_bytes()).and_then(|()| writer.write_all(body.as_bytes()))
        };
        let done = if !authorised {
            respond(&mut writer, "401 Unauthorized", "")
        } else if !request_line.starts_with("POST") {
            respond(&mut writer, "405 Method Not Allowed", "")
        } else {
            let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let result = match message["method"].as_str().unwrap_or_default() {
                "initialize" => json!({
                    "protocolVersion": message["params"]["protocolVersion"].as_str().unwrap_or("2025-03-26"),
                    "capabilities": { "tools": {} },
                    "serverInfo": { "name": "stub", "version": "0" },
                }),
                "tools/list" => json!({ "tools": [{
                    "name": "note", "description": "Records a note.",
                    "inputSchema": { "type": "object", "properties": { "text": { "type": "string" } } },
                }] }),
                "tools/call" => json!({
                    "content": [{ "type": "text", "text": message["params"]["arguments"].to_string() }],
                    "isError": false,
                }),
                _ => Value::Null,
            };
            match message.get("id") {
                Some(id) => {
                    respond(&mut writer, "200 OK", &json!({ "jsonrpc": "2.0", "id": id, "result": result }).to_string())
                }
                None => respond(&mut writer, "202 Accepted", ""),
            }
        };
        if done.is_err() {
            return;
        }
    }
}

struct Codex {
    _dir: tempfile::TempDir,
    session_dir: PathBuf,
    fake: FakeOpenAi,
    _mcp: McpStub,
    session: Session,
    events: mpsc::Receiver<HarnessEvent>,
    /// Everything received so far, for assertion messages.
    seen: Vec<HarnessEvent>,
}

async fn launch(prompt: Prompt, script: Vec<Reply>) -> Codex {
    // Under the build directory, not the system temporary directory (see ARCHITECTURE.md).
    let dir = tempfile::Builder::new().prefix("codex-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let fake = FakeOpenAi::start(script);
    let mcp = McpStub::start();
    launch_in(dir, "session", fake, mcp, prompt).await
}

/// The next incarnation of the same agent (same agent directory, model and MCP endpoint),
/// once `previous` is gone.
async fn relaunch(previous: Codex, name: &str, prompt: Prompt) -> Codex {
    let Codex { _dir: dir, fake, _mcp: mcp, session, .. } = previous;
    drop(session);
    launch_in(dir, name, fake, mcp, prompt).await
}

/// Launches one incarnation whose agent directory is `dir` and session directory `dir/name`.
async fn launch_in(dir: tempfile::TempDir, name: &str, fake: FakeOpenAi, mcp: McpStub, prompt: Prompt) -> Codex {
    let session_dir = dir.path().join(name);
    let spec = LaunchSpec {
        kind: HarnessKind::Codex,
        program: codex_bin(),
        program_args: vec![],
        session_dir: session_dir.clone(),
        agent_dir: Some(dir.path().to_owned()),
        cwd: dir.path().join("work"),
        builtin_tools: Vec::new(),
        prompt,
        mcp_url: mcp.url(),
        mcp_token: STUB_TOKEN.into(),
        env: vec![("FAKE_OPENAI_KEY".into(), "sk-fake".into())],
        model: Some("fake-model".into()),
        provider: Some(ProviderSettings {
            base_url: fake.base_url(),
            api_key_env: Some("FAKE_OPENAI_KEY".into()),
            api: None,
        }),
        script: None,
        max_line_bytes: 4 * 1024 * 1024,
        ready_timeout: PATIENCE,
        sandbox: canopy_harness::SandboxSettings::required(dir.path().join("data")),
        repo_mirror: None,
        cwd_read_only: false,
        subagents: Vec::new(),
    };
    let (session, events) = Session::launch(spec, 256)
        .await
        .unwrap_or_else(|e| panic!("codex did not start: {e}; stderr: {}", stderr(&session_dir)));
    Codex { _dir: dir, session_dir, fake, _mcp: mcp, session, events, seen: Vec::new() }
}

fn stderr(session_dir: &std::path::Path) -> String {
    std::fs::read_to_string(session_dir.join("stderr.log")).unwrap_or_default()
}

impl Codex {
    /// Waits for the first event (after those already consumed) that `want` accepts.
    async fn until(&mut self, what: &str, want: impl Fn(&HarnessEvent) -> bool) -> HarnessEvent {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let event = tokio::time::timeout_at(deadline, self.events.recv()).await;
            match event {
                Ok(Some(event)) => {
                    self.seen.push(event.clone());
                    if want(&event) {
                        return event;
                    }
                }
                Ok(None) => panic!("the event stream ended waiting for {what}: {:#?}", self.seen),
                Err(_) => {
                    panic!("no {what} within {PATIENCE:?}: {:#?}\nstderr: {}", self.seen, stderr(&self.session_dir))
                }
            }
        }
    }

    async fn send(&self, input_id: &str, text: &str, mode: SendMode) -> SendOutcome {
        let context = InputContext { kind: "message".into(), ..InputContext::default() };
        self.session.send(input_id, text, &context, mode).await.unwrap()
    }

    async fn start_turn(&mut self, input_id: &str, text: &str) -> String {
        match self.send(input_id, text, SendMode::NextTurn).await {
            SendOutcome::Started { turn_id } => turn_id,
            other => panic!("the turn did not start: {other:?}"),
        }
    }

    async fn turn_ended(&mut self) -> (String, TurnStatus) {
        match self.until("the turn's end", |e| matches!(e, HarnessEvent::TurnEnded { .. })).await {
            HarnessEvent::TurnEnded { turn_id, status } => (turn_id, status),
            _ => unreachable!(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replace_prompt_reaches_the_model_verbatim_as_the_first_input_item() {
    let prompt = "You are the test Manager.\n\nLine two has \"quotes\", a tab\there and ✓ unicode.\n";
    let mut codex = launch(Prompt::replace(prompt.into()), vec![Reply::text("hello from the fake")]).await;
    let turn_id = codex.start_turn("start-1", "who am I?").await;
    codex.until("the turn start", |e| *e == HarnessEvent::TurnStarted { turn_id: turn_id.clone() }).await;
    codex
        .until("the model's text", |e| matches!(e, HarnessEvent::Text { text, .. } if text == "hello from the fake"))
        .await;
    codex.until("token usage", |e| matches!(e, HarnessEvent::Usage { usage, .. } if usage.input_tokens > 1000)).await;
    assert_eq!(codex.turn_ended().await, (turn_id, TurnStatus::Completed));

    let request = &codex.fake.wait_requests(1, PATIENCE)[0];
    let first = &request["input"][0];
    assert_eq!(first["role"], "developer", "{first}");
    assert_eq!(first["content"][0]["text"], prompt, "the replace prompt was not sent verbatim first");
    assert_eq!(request["model"], "fake-model");
    assert!(messages_of(request, "user").iter().any(|m| m == "who am I?"), "{:?}", fake_openai::summary(request));
    // Ready waited for the MCP server: its tool is in the very first request.
    assert!(offers_tool(request, Some("mcp__canopy"), "note"), "the MCP tools were missing from the first request");
    let config = std::fs::read_to_string(codex._dir.path().join("codex-home/config.toml")).unwrap();
    assert!(config.contains("approval_policy = \"never\"") && config.contains("plugins = false"), "{config}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_append_prompt_is_a_developer_message_after_codex_s_own_prompt() {
    let delta = "You are an implementer for Canopy. Report back instead of guessing.";
    let mut codex = launch(Prompt::append(delta.into()), vec![Reply::text("ok")]).await;
    codex.start_turn("start-1", "go").await;
    codex.turn_ended().await;
    let request = &codex.fake.wait_requests(1, PATIENCE)[0];
    let developer = messages_of(request, "developer");
    assert!(developer.len() >= 2, "{:?}", fake_openai::summary(request));
    assert!(developer[0].len() > 1000 && !developer[0].contains(delta), "Codex's own prompt was not kept first");
    assert!(developer[1].starts_with(delta), "the delta was not the second developer message: {:?}", developer[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_during_a_slow_tool_lands_in_the_same_turn() {
    let script = vec![Reply::shell("sleep 2; echo slept"), Reply::text("done")];
    let mut codex = launch(Prompt::replace("prompt".into()), script).await;
    let turn_id = codex.start_turn("start-1", "run the slow thing").await;
    codex.until("the slow tool", |e| matches!(e, HarnessEvent::ToolRunning { name, .. } if name == "command")).await;
    let outcome = codex.send("steer-7", "STEERED: stop after this", SendMode::Steer { turn_id: turn_id.clone() }).await;
    assert_eq!(outcome, SendOutcome::Steered { turn_id: turn_id.clone() });
    let injected = codex.until("the steer's injection", |e| matches!(e, HarnessEvent::SteerInjected { .. })).await;
    assert!(
        matches!(&injected, HarnessEvent::SteerInjected { input_id, turn_id: t, position } if input_id == "steer-7" && *t == turn_id && *position >= 1),
        "{injected:?}"
    );
    assert_eq!(codex.turn_ended().await, (turn_id, TurnStatus::Completed));
    let turns = codex.seen.iter().filter(|e| matches!(e, HarnessEvent::TurnStarted { .. })).count();
    assert_eq!(turns, 1, "the steer started a turn of its own: {:#?}", codex.seen);

    // The next model request of the same turn carries the tool's result, then the steer.
    let requests = codex.fake.wait_requests(2, PATIENCE);
    let items = fake_openai::input_items(&requests[1]);
    let output = items.iter().position(|i| i["type"] == "function_call_output").unwrap();
    let steer = items.iter().position(|i| fake_openai::item_text(i) == "STEERED: stop after this").unwrap();
    assert!(output < steer, "{:?}", fake_openai::summary(&requests[1]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_during_the_final_model_call_cuts_it_and_lands_in_the_same_turn() {
    // Unlike Claude Code, Codex takes a steer while the model streams its last answer: the
    // stream is dropped and the model is asked again with the steer.
    let script = vec![Reply::text("first answer").after(Duration::from_millis(1500)), Reply::text("second answer")];
    let mut codex = launch(Prompt::replace("prompt".into()), script).await;
    let turn_id = codex.start_turn("start-1", "answer me").await;
    codex.fake.wait_requests(1, PATIENCE);
    let outcome = codex.send("steer-9", "also this", SendMode::Steer { turn_id: turn_id.clone() }).await;
    assert_eq!(outcome, SendOutcome::Steered { turn_id: turn_id.clone() });
    codex.until("the steer's injection", |e| matches!(e, HarnessEvent::SteerInjected { .. })).await;
    assert_eq!(codex.turn_ended().await, (turn_id, TurnStatus::Completed));
    let requests = codex.fake.wait_requests(2, PATIENCE);
    assert_eq!(messages_of(&requests[1], "user").last().map(String::as_str), Some("also this"));
    let texts: Vec<&HarnessEvent> = codex.seen.iter().filter(|e| matches!(e, HarnessEvent::Text { .. })).collect();
    assert!(matches!(texts.last(), Some(HarnessEvent::Text { text, .. }) if text == "second answer"), "{texts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_after_the_turn_falls_back() {
    let mut codex = launch(Prompt::replace("prompt".into()), vec![Reply::text("quick")]).await;
    let turn_id = codex.start_turn("start-1", "hi").await;
    codex.turn_ended().await;
    let outcome = codex.send("steer-8", "too late", SendMode::Steer { turn_id }).await;
    assert!(matches!(&outcome, SendOutcome::FellBack { reason } if reason.contains("no active turn")), "{outcome:?}");
    // Delivered at the next turn instead, which still works.
    codex.start_turn("deliver-8", "too late").await;
    assert_eq!(codex.turn_ended().await.1, TurnStatus::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_ends_the_turn_as_interrupted_and_the_session_stays_usable() {
    let script = vec![Reply::shell("sleep 30"), Reply::text("after the interrupt")];
    let mut codex = launch(Prompt::replace("prompt".into()), script).await;
    let turn_id = codex.start_turn("start-1", "run forever").await;
    codex.until("the slow tool", |e| matches!(e, HarnessEvent::ToolRunning { .. })).await;
    codex.session.interrupt().await.unwrap();
    assert_eq!(codex.turn_ended().await, (turn_id.clone(), TurnStatus::Interrupted));
    assert!(
        codex.seen.iter().any(|e| matches!(e, HarnessEvent::ToolAborted { name, .. } if name == "command")),
        "the cut-off tool was not reported aborted: {:#?}",
        codex.seen
    );

    let next = codex.start_turn("deliver-1", "are you there?").await;
    assert_ne!(next, turn_id);
    codex.until("the text", |e| matches!(e, HarnessEvent::Text { text, .. } if text == "after the interrupt")).await;
    assert_eq!(codex.turn_ended().await, (next, TurnStatus::Completed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_stdin_and_codex_exits_cleanly() {
    let mut codex = launch(Prompt::replace("prompt".into()), vec![]).await;
    let pid = codex.session.pid();
    codex.session.shutdown(Duration::from_secs(5)).await;
    let exited = codex.until("the exit", |e| matches!(e, HarnessEvent::Exited { .. })).await;
    assert_eq!(exited, HarnessEvent::Exited { code: Some(0), signal: None });
    assert!(!canopy_sys::alive(pid));
}

/// The thread id the agent's directory records, if any.
fn recorded(codex: &Codex) -> Option<String> {
    let path = codex._dir.path().join(canopy_harness::codex::THREAD_FILE);
    std::fs::read_to_string(path).ok().map(|t| t.trim().to_owned())
}

/// Incarnation 1 runs one turn ("remember the number 42", answered "noted: 42") and is killed
/// as `kill -9` would; returns it with the recorded thread id.
async fn first_incarnation(script: Vec<Reply>) -> (Codex, String) {
    let mut codex = launch(Prompt::replace("prompt one".into()), script).await;
    codex.start_turn("start-1", "remember the number 42").await;
    assert_eq!(codex.turn_ended().await.1, TurnStatus::Completed);
    let thread = recorded(&codex).unwrap_or_else(|| panic!("no thread recorded"));
    codex.session.kill();
    codex.until("the exit", |e| matches!(e, HarnessEvent::Exited { .. })).await;
    (codex, thread)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_incarnation_resumes_the_thread_and_its_tools_still_work() {
    let script = vec![
        Reply::text("noted: 42"),
        Reply::text("calling the tool").and_call(Some("mcp__canopy"), "note", json!({ "text": "after resume" })),
        Reply::text("it was 42"),
    ];
    let (codex, thread) = first_incarnation(script).await;
    let mut codex = relaunch(codex, "2", Prompt::replace("prompt two".into())).await;
    codex.start_turn("start-2", "what was the number?").await;
    assert_eq!(codex.turn_ended().await.1, TurnStatus::Completed);

    let requests = codex.fake.wait_requests(3, PATIENCE);
    let resumed = &requests[1];
    // The earlier turn is history in the new process's first request, then the new input.
    let users = messages_of(resumed, "user");
    let first = users.iter().position(|t| t == "remember the number 42");
    let next = users.iter().position(|t| t == "what was the number?");
    assert!(first.is_some() && first < next, "{:?}", fake_openai::summary(resumed));
    assert!(messages_of(resumed, "assistant").iter().any(|t| t == "noted: 42"), "{:?}", fake_openai::summary(resumed));
    // This incarnation's prompt is the first item; the first one's is gone.
    assert_eq!(messages_of(resumed, "developer").first().map(String::as_str), Some("prompt two"));
    assert!(!resumed.to_string().contains("prompt one"), "{:?}", fake_openai::summary(resumed));
    // Canopy's MCP server was defined again for the resumed thread, with this process's token.
    assert!(offers_tool(resumed, Some("mcp__canopy"), "note"), "no MCP tools after resume");
    let output = fake_openai::input_items(&requests[2]).into_iter().find(|i| i["type"] == "function_call_output");
    let output = output.unwrap_or_else(|| panic!("{:?}", fake_openai::summary(&requests[2])));
    assert!(output["output"].to_string().contains("after resume"), "{output}");
    assert_eq!(recorded(&codex), Some(thread), "the same thread goes on");
    assert!(
        !codex.seen.iter().any(|e| matches!(e, HarnessEvent::Status { text } if text.contains("resume"))),
        "{:#?}",
        codex.seen
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_that_cannot_be_resumed_falls_back_to_a_fresh_thread_and_says_so() {
    let (codex, thread) = first_incarnation(vec![Reply::text("noted: 42"), Reply::text("fresh")]).await;
    let missing = "019a0000-0000-7000-8000-000000000000";
    std::fs::write(codex._dir.path().join(canopy_harness::codex::THREAD_FILE), missing).unwrap();
    let mut codex = relaunch(codex, "2", Prompt::replace("prompt".into())).await;
    let note = codex
        .until("the fallback note", |e| matches!(e, HarnessEvent::Status { text } if text.contains("resume")))
        .await;
    assert!(
        matches!(&note, HarnessEvent::Status { text } if text.contains("could not resume") && text.contains(missing)),
        "{note:?}"
    );
    codex.start_turn("start-2", "hello again").await;
    assert_eq!(codex.turn_ended().await.1, TurnStatus::Completed);
    let requests = codex.fake.wait_requests(2, PATIENCE);
    assert_eq!(messages_of(&requests[1], "user").last().map(String::as_str), Some("hello again"));
    assert!(
        // The old turn's words, not a bare "42": Codex's environment context carries the
        // current time, which holds "42" in some minutes.
        !messages_of(&requests[1], "user").iter().any(|t| t.contains("the number 42")),
        "{:?}",
        fake_openai::summary(&requests[1])
    );
    let fresh = recorded(&codex).unwrap();
    assert!(fresh != thread && fresh != missing, "{fresh}");
}
