//! The Claude Code adapter against the real `claude` binary (the pinned version that
//! `scripts/install-harnesses.sh` installs, found through `CANOPY_TEST_CLAUDE_BIN`), with only
//! the model API faked: prompt modes, turn start, a steer that falls back, interrupt, and
//! resuming the agent's conversation in the next incarnation (or starting fresh when the
//! recorded conversation cannot be resumed).
//!
//! Canopy's tools are not served here (the end-to-end tests do that through a real runner),
//! so the session's MCP server is unreachable and the model sees no Canopy tools.

#![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

#[path = "../../../tests/e2e/fake_anthropic.rs"]
mod fake_anthropic;
#[path = "../../../tests/e2e/fake_http.rs"]
mod fake_http;
#[path = "../../../tests/e2e/harness_bins.rs"]
mod harness_bins;

use std::time::Duration;

use canopy_harness::{
    HarnessEvent, HarnessKind, InputContext, LaunchSpec, Prompt, SandboxSettings, SendMode, SendOutcome, Session,
    TurnStatus,
};
use fake_anthropic::{FakeAnthropic, Reply, assistant_texts, system_text, user_texts};
use harness_bins::claude_bin;
use tokio::sync::mpsc;

fn spec(dir: &std::path::Path, fake: &FakeAnthropic, prompt: Prompt) -> LaunchSpec {
    incarnation(dir, "session", fake, prompt)
}

/// The spec for one incarnation of the agent whose directory is `dir`.
fn incarnation(dir: &std::path::Path, name: &str, fake: &FakeAnthropic, prompt: Prompt) -> LaunchSpec {
    LaunchSpec {
        kind: HarnessKind::Claude,
        program: claude_bin(),
        program_args: vec![],
        session_dir: dir.join(name),
        agent_dir: Some(dir.to_owned()),
        cwd: dir.join("work"),
        builtin_tools: Vec::new(),
        prompt,
        mcp_url: "http://127.0.0.1:9/mcp".into(),
        mcp_token: "cns_test".into(),
        env: vec![("ANTHROPIC_BASE_URL".into(), fake.base_url()), ("ANTHROPIC_API_KEY".into(), "sk-test".into())],
        model: Some("claude-fake".into()),
        provider: None,
        script: None,
        max_line_bytes: 1 << 20,
        ready_timeout: Duration::from_secs(30),
        sandbox: SandboxSettings::required(dir.join("data")),
        repo_mirror: None,
        cwd_read_only: false,
        subagents: Vec::new(),
    }
}

/// Collects events until one matches, failing after a patience bound.
async fn until(
    events: &mut mpsc::Receiver<HarnessEvent>,
    seen: &mut Vec<HarnessEvent>,
    what: impl Fn(&HarnessEvent) -> bool,
) -> HarnessEvent {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| panic!("no matching event within 30s; saw {seen:#?}"))
            .unwrap_or_else(|| panic!("the event stream ended; saw {seen:#?}"));
        seen.push(event.clone());
        if what(&event) {
            return event;
        }
    }
}

fn turn_ended(event: &HarnessEvent) -> bool {
    matches!(event, HarnessEvent::TurnEnded { .. })
}

async fn start(session: &Session, id: &str, text: &str) -> String {
    match session.send(id, text, &InputContext::default(), SendMode::NextTurn).await.unwrap() {
        SendOutcome::Started { turn_id } => turn_id,
        other => panic!("the turn did not start: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_mode_sends_the_prompt_file_verbatim_and_reports_usage() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeAnthropic::start(vec![Reply::text("hello operator")]);
    let prompt = "You are the build Manager.\n\nKeep the build green; report to @ops.\n";
    let (session, mut events) =
        Session::launch(spec(dir.path(), &fake, Prompt::replace(prompt.into())), 64).await.unwrap();
    let mut seen = Vec::new();
    let turn = start(&session, "first", "hello there").await;
    let ended = until(&mut events, &mut seen, turn_ended).await;
    assert_eq!(ended, HarnessEvent::TurnEnded { turn_id: turn.clone(), status: TurnStatus::Completed });
    assert!(seen.contains(&HarnessEvent::Text { turn_id: Some(turn.clone()), text: "hello operator".into() }));
    let usage = seen.iter().find_map(|e| match e {
        HarnessEvent::Usage { usage, .. } => Some(usage.clone()),
        _ => None,
    });
    let usage = usage.unwrap_or_else(|| panic!("no usage event: {seen:#?}"));
    assert!(usage.input_tokens > 0 && usage.output_tokens > 0, "{usage:?}");
    assert!(usage.cost_usd.is_some(), "{usage:?}");

    let request = &fake.requests()[0];
    // A fixed identity line of the CLI, then the prompt file verbatim, and nothing else.
    let blocks = request["system"].as_array().unwrap();
    assert_eq!(blocks.len(), 2, "{}", request["system"]);
    assert_eq!(blocks[1]["text"].as_str().unwrap(), prompt);
    assert_eq!(std::fs::read_to_string(dir.path().join("session/system-prompt.md")).unwrap(), prompt);
    assert!(user_texts(request).iter().any(|t| t == "hello there"), "{request}");
    session.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_mode_keeps_the_default_prompt_with_the_delta_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeAnthropic::start(vec![Reply::text("ok")]);
    let delta = "You are an implementer under a Manager; report back over comms.";
    let (session, mut events) =
        Session::launch(spec(dir.path(), &fake, Prompt::append(delta.into())), 64).await.unwrap();
    let mut seen = Vec::new();
    start(&session, "first", "go").await;
    until(&mut events, &mut seen, turn_ended).await;
    let system = system_text(&fake.requests()[0]);
    assert!(system.trim_end().ends_with(delta), "the delta is not at the end: …{}", tail(&system));
    // The CLI's own default prompt comes first, and it is much longer than the delta.
    assert!(system.len() > delta.len() + 2000, "no default prompt in front of the delta: {system}");
    session.shutdown(Duration::from_secs(5)).await;
}

fn tail(text: &str) -> String {
    text.chars().rev().take(200).collect::<Vec<_>>().into_iter().rev().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_during_the_final_model_call_falls_back_and_runs_as_the_next_turn() {
    let dir = tempfile::tempdir().unwrap();
    let fake =
        FakeAnthropic::start(vec![Reply::text("first answer").after(Duration::from_secs(4)), Reply::text("second")]);
    let (session, mut events) =
        Session::launch(spec(dir.path(), &fake, Prompt::replace("prompt".into())), 64).await.unwrap();
    let mut seen = Vec::new();
    let turn = start(&session, "first", "question one").await;
    fake.wait_requests(1, Duration::from_secs(20));
    let mode = SendMode::Steer { turn_id: turn.clone() };
    let outcome = session.send("steer-5", "one more thing", &InputContext::default(), mode).await.unwrap();
    assert!(matches!(outcome, SendOutcome::FellBack { .. }), "{outcome:?}");
    let injected = until(&mut events, &mut seen, |e| matches!(e, HarnessEvent::SteerInjected { .. })).await;
    let HarnessEvent::SteerInjected { turn_id, position, .. } = injected else { unreachable!() };
    assert_ne!(turn_id, turn, "a fallen-back line runs as a turn of its own");
    assert_eq!(position, 0);
    until(&mut events, &mut seen, |e| matches!(e, HarnessEvent::TurnEnded { turn_id: t, .. } if *t == turn_id)).await;
    let requests = fake.wait_requests(2, Duration::from_secs(20));
    assert!(user_texts(&requests[1]).iter().any(|t| t.contains("one more thing")), "{}", requests[1]);
    session.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_ends_the_turn_and_the_session_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeAnthropic::start(vec![Reply::text("too late").after(Duration::from_secs(8)), Reply::text("fresh")]);
    let (session, mut events) =
        Session::launch(spec(dir.path(), &fake, Prompt::replace("prompt".into())), 64).await.unwrap();
    let mut seen = Vec::new();
    let turn = start(&session, "first", "a long question").await;
    fake.wait_requests(1, Duration::from_secs(20));
    session.interrupt().await.unwrap();
    let ended = until(&mut events, &mut seen, turn_ended).await;
    assert_eq!(ended, HarnessEvent::TurnEnded { turn_id: turn, status: TurnStatus::Interrupted });
    let next = start(&session, "second", "are you there?").await;
    let ended = until(&mut events, &mut seen, turn_ended).await;
    assert_eq!(ended, HarnessEvent::TurnEnded { turn_id: next.clone(), status: TurnStatus::Completed });
    assert!(seen.contains(&HarnessEvent::Text { turn_id: Some(next), text: "fresh".into() }), "{seen:#?}");
    session.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_gets_a_clean_environment_and_private_config_directories() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeAnthropic::start(vec![]);
    let (session, _events) =
        Session::launch(spec(dir.path(), &fake, Prompt::replace("prompt".into())), 64).await.unwrap();
    let environ = std::fs::read(format!("/proc/{}/environ", session.pid())).unwrap();
    let environ: Vec<String> =
        environ.split(|b| *b == 0).filter(|kv| !kv.is_empty()).map(|kv| String::from_utf8_lossy(kv).into()).collect();
    let get = |key: &str| environ.iter().find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(str::to_owned));
    let session_dir = dir.path().join("session");
    assert_eq!(get("HOME"), Some(session_dir.join("home").display().to_string()));
    // Per agent, not per incarnation: it holds the transcript the next incarnation resumes.
    assert_eq!(get("CLAUDE_CONFIG_DIR"), Some(dir.path().join("claude-config").display().to_string()));
    assert_eq!(get("DISABLE_TELEMETRY").as_deref(), Some("1"));
    assert_eq!(get("ANTHROPIC_BASE_URL"), Some(fake.base_url()));
    let allowed = [
        "PATH",
        "HOME",
        "LANG",
        "CLAUDE_CONFIG_DIR",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "DISABLE_TELEMETRY",
        "DISABLE_AUTOUPDATER",
        "DISABLE_ERROR_REPORTING",
        "CLAUDE_CODE_ATTRIBUTION_HEADER",
        "CLAUDE_AGENT_SDK_DISABLE_BUILTIN_AGENTS",
        "ENABLE_TOOL_SEARCH",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
        // Credentials are the one thing inherited from the test's own environment.
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CODE_OAUTH_TOKEN",
        // The sandbox's own egress proxy, checked below: never the operator's.
        "HTTPS_PROXY",
        "HTTP_PROXY",
        "NO_PROXY",
        "https_proxy",
        "http_proxy",
        "no_proxy",
    ];
    for key in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
        assert_eq!(get(key).as_deref(), Some("http://127.0.0.1:3128"), "{key} is not the sandbox's proxy");
    }
    for kv in &environ {
        let key = kv.split('=').next().unwrap_or_default();
        // The CLI may set a few variables of its own after start (CLAUDECODE, its entrypoint).
        assert!(allowed.contains(&key) || key.starts_with("CLAUDE"), "{key} leaked into the session: {environ:?}");
    }
    let mcp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(session_dir.join("mcp.json")).unwrap()).unwrap();
    assert_eq!(mcp["mcpServers"]["canopy"]["headers"]["Authorization"], "Bearer cns_test");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(session_dir.join("mcp.json")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the MCP config holds the session token");
    session.shutdown(Duration::from_secs(5)).await;
}

/// The conversation id the agent's directory records, if any.
fn recorded(dir: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(dir.join(canopy_harness::claude::CONVERSATION_FILE)).ok().map(|t| t.trim().to_owned())
}

/// Runs incarnation 1 of an agent in `dir` for one turn ("remember ...", answered "noted: 42"),
/// then kills it as `kill -9` would; returns the recorded conversation id.
async fn first_incarnation(dir: &std::path::Path, fake: &FakeAnthropic) -> String {
    let (session, mut events) =
        Session::launch(incarnation(dir, "1", fake, Prompt::replace("prompt one".into())), 64).await.unwrap();
    let mut seen = Vec::new();
    start(&session, "start-1", "remember the number 42").await;
    until(&mut events, &mut seen, turn_ended).await;
    let id = recorded(dir).unwrap_or_else(|| panic!("no conversation recorded in {}", dir.display()));
    session.kill();
    until(&mut events, &mut seen, |e| matches!(e, HarnessEvent::Exited { .. })).await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_incarnation_resumes_the_conversation_with_its_own_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeAnthropic::start(vec![Reply::text("noted: 42"), Reply::text("it was 42")]);
    let id = first_incarnation(dir.path(), &fake).await;

    let (session, mut events) =
        Session::launch(incarnation(dir.path(), "2", &fake, Prompt::replace("prompt two".into())), 64).await.unwrap();
    let mut seen = Vec::new();
    start(&session, "start-2", "what was the number?").await;
    until(&mut events, &mut seen, turn_ended).await;
    let requests = fake.wait_requests(2, Duration::from_secs(20));
    let resumed = &requests[1];
    // The earlier turn is history in the first request of the new process, then the new input.
    let users = user_texts(resumed);
    let first = users.iter().position(|t| t == "remember the number 42");
    let next = users.iter().position(|t| t == "what was the number?");
    assert!(first.is_some() && first < next, "{users:?}");
    assert!(assistant_texts(resumed).iter().any(|t| t == "noted: 42"), "{resumed}");
    // This incarnation's prompt, not the one the conversation started with.
    assert_eq!(resumed["system"].as_array().unwrap().last().unwrap()["text"], "prompt two");
    // Continued under the same id, with no word of a fallback.
    assert_eq!(recorded(dir.path()), Some(id));
    assert!(!seen.iter().any(|e| matches!(e, HarnessEvent::Status { text } if text.contains("resume"))), "{seen:#?}");
    session.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_that_cannot_be_resumed_falls_back_to_a_fresh_one_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeAnthropic::start(vec![Reply::text("noted: 42"), Reply::text("fresh start"), Reply::text("again")]);
    let id = first_incarnation(dir.path(), &fake).await;
    // A session id Claude Code has no transcript for: it exits at start ("No conversation
    // found with session ID"), and the launch is tried again with a fresh conversation.
    let missing = "0badc0de-0000-4000-8000-000000000000";
    std::fs::write(dir.path().join(canopy_harness::claude::CONVERSATION_FILE), missing).unwrap();
    let (session, mut events) =
        Session::launch(incarnation(dir.path(), "2", &fake, Prompt::replace("prompt".into())), 64).await.unwrap();
    let mut seen = Vec::new();
    let note = until(&mut events, &mut seen, |e| matches!(e, HarnessEvent::Status { .. })).await;
    assert!(
        matches!(&note, HarnessEvent::Status { text } if text.contains("could not resume") && text.contains(missing)),
        "{note:?}"
    );
    start(&session, "start-2", "hello again").await;
    until(&mut events, &mut seen, turn_ended).await;
    let requests = fake.wait_requests(2, Duration::from_secs(20));
    assert_eq!(user_texts(&requests[1]), vec!["hello again".to_owned()], "{}", requests[1]);
    let fresh = recorded(dir.path()).unwrap();
    assert!(fresh != id && fresh != missing, "{fresh}");
    session.shutdown(Duration::from_secs(5)).await;

    // A record that is not a session id at all: fresh at once, with a note.
    std::fs::write(dir.path().join(canopy_harness::claude::CONVERSATION_FILE), "garbage\n").unwrap();
    let (session, mut events) =
        Session::launch(incarnation(dir.path(), "3", &fake, Prompt::replace("prompt".into())), 64).await.unwrap();
    let note = until(&mut events, &mut seen, |e| matches!(e, HarnessEvent::Status { .. })).await;
    assert!(matches!(&note, HarnessEvent::Status { text } if text.contains("garbage")), "{note:?}");
    start(&session, "start-3", "third").await;
    until(&mut events, &mut seen, turn_ended).await;
    assert_eq!(user_texts(&fake.wait_requests(3, Duration::from_secs(20))[2]), vec!["third".to_owned()]);
    session.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_mode_resumes_with_this_incarnation_s_delta_and_no_project_memory() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeAnthropic::start(vec![Reply::text("noted: 42"), Reply::text("it was 42")]);
    // Project memory in the working directory must stay out, resumed or not.
    std::fs::create_dir_all(dir.path().join("work")).unwrap();
    std::fs::write(dir.path().join("work/CLAUDE.md"), "LEAKED-PROJECT-MEMORY\n").unwrap();
    let (session, mut events) =
        Session::launch(incarnation(dir.path(), "1", &fake, Prompt::append("delta one".into())), 64).await.unwrap();
    let mut seen = Vec::new();
    start(&session, "start-1", "remember the number 42").await;
    until(&mut events, &mut seen, turn_ended).await;
    session.kill();
    until(&mut events, &mut seen, |e| matches!(e, HarnessEvent::Exited { .. })).await;

    let (session, mut events) =
        Session::launch(incarnation(dir.path(), "2", &fake, Prompt::append("delta two".into())), 64).await.unwrap();
    start(&session, "start-2", "what was the number?").await;
    until(&mut events, &mut seen, turn_ended).await;
    let resumed = &fake.wait_requests(2, Duration::from_secs(20))[1];
    assert!(user_texts(resumed).iter().any(|t| t == "remember the number 42"), "{resumed}");
    assert!(assistant_texts(resumed).iter().any(|t| t == "noted: 42"), "{resumed}");
    let system = system_text(resumed);
    assert!(system.trim_end().ends_with("delta two"), "…{}", tail(&system));
    assert!(!system.contains("delta one"), "the first incarnation's prompt was replayed");
    assert!(!resumed.to_string().contains("LEAKED-PROJECT-MEMORY"), "CLAUDE.md reached the model");
    session.shutdown(Duration::from_secs(5)).await;
}
