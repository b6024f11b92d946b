//! The pi adapter against the real pinned `pi` (0.73.1 on Node, found through
//! `CANOPY_TEST_PI_BIN`), with only the model API faked and the session confined: readiness
//! from `get_state` (pi prints no ready frame), a replaced prompt, Canopy's own turn numbers, a
//! steer taken after the running tool (pi flags nothing: the codec counts user messages), the
//! tool's result intact, interrupt, and resume after `kill -9`. Canopy's tools through the
//! extension are the end-to-end test's (`tests/e2e/pi.rs`).
//!
//! Canopy's tools are not served here (the end-to-end tests do that through a real runner).

#![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

mod common;
#[path = "../../../tests/e2e/fake_anthropic.rs"]
mod fake_anthropic;
#[path = "../../../tests/e2e/fake_http.rs"]
mod fake_http;
#[path = "../../../tests/e2e/harness_bins.rs"]
mod harness_bins;

use std::time::Duration;

use canopy_harness::{
    HarnessEvent, HarnessKind, InputContext, LaunchSpec, Prompt, ProviderSettings, SandboxSettings, SendMode,
    SendOutcome, Session, TurnStatus,
};
use common::{start, turn_ended, until};
use fake_anthropic::{FakeAnthropic, Reply, system_text, user_texts};
use harness_bins::pi_bin;
use serde_json::json;

/// An MCP endpoint with no tools for the session's token: pi's extension lists Canopy's
/// tools before pi is ready, so it needs one to answer.
async fn endpoint() -> canopy_tools::http::HttpEndpoint {
    canopy_tools::probe::serve_probe("cns_test".into()).await.unwrap()
}

fn spec(dir: &std::path::Path, name: &str, fake: &FakeAnthropic, prompt: Prompt, mcp: &str) -> LaunchSpec {
    LaunchSpec {
        kind: HarnessKind::Pi,
        program: pi_bin(),
        program_args: vec![],
        session_dir: dir.join(name),
        agent_dir: Some(dir.to_owned()),
        cwd: dir.join("work"),
        builtin_tools: vec!["Bash".into(), "Read".into()],
        prompt,
        mcp_url: mcp.to_owned(),
        mcp_token: "cns_test".into(),
        env: vec![("FAKE_KEY".into(), "sk-fake".into())],
        model: Some("fake-claude".into()),
        provider: Some(ProviderSettings {
            base_url: fake.base_url(),
            api_key_env: Some("FAKE_KEY".into()),
            api: Some("anthropic-messages".into()),
        }),
        script: None,
        max_line_bytes: 1 << 20,
        ready_timeout: Duration::from_secs(60),
        sandbox: SandboxSettings::required(dir.join("data")),
        repo_mirror: None,
        cwd_read_only: false,
        subagents: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_prompt_is_pis_and_a_steer_lands_after_the_running_tool() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("work")).unwrap();
    std::fs::write(dir.path().join("work/AGENTS.md"), "AGENTS_MD_MARKER keep the build green\n").unwrap();
    let fake = FakeAnthropic::start(vec![
        Reply::text("hello operator"),
        Reply::default().and_call("bash", json!({ "command": "sleep 2; echo SLEPT_OK" })),
        Reply::text("done after the steer"),
    ]);
    let prompt = "You are the build Manager (REPLACED_MARKER).\n";
    let mcp = endpoint().await;
    let (session, mut events) =
        Session::launch(spec(dir.path(), "1", &fake, Prompt::replace(prompt.into()), &mcp.url), 256).await.unwrap();
    let mut seen = Vec::new();
    let turn = start(&session, "first", "hello there").await;
    assert_eq!(turn, "t1");
    let ended = until(&mut events, &mut seen, turn_ended).await;
    assert_eq!(ended, HarnessEvent::TurnEnded { turn_id: "t1".into(), status: TurnStatus::Completed });
    assert!(seen.contains(&HarnessEvent::Text { turn_id: Some("t1".into()), text: "hello operator".into() }));
    let request = &fake.requests()[0];
    let system = system_text(request);
    assert!(system.starts_with(prompt.trim_end()), "{system}");
    assert!(system.contains("AGENTS_MD_MARKER"), "the project context survives a replace: {system}");
    assert!(!system.contains("operating inside pi"), "pi's default prompt is replaced: {system}");

    // A steer during a running tool: the tool finishes, then the steer is the next input.
    let turn = start(&session, "second", "run the slow check").await;
    assert_eq!(turn, "t2");
    until(&mut events, &mut seen, |e| matches!(e, HarnessEvent::ToolRunning { .. })).await;
    let steered = session
        .send(
            "steer-1",
            "STEER_MARKER change of plan",
            &InputContext::default(),
            SendMode::Steer { turn_id: turn.clone() },
        )
        .await
        .unwrap();
    assert_eq!(steered, SendOutcome::Steered { turn_id: turn.clone() });
    until(&mut events, &mut seen, |e| matches!(e, HarnessEvent::SteerInjected { .. })).await;
    until(&mut events, &mut seen, turn_ended).await;
    let result = seen.iter().find_map(|e| match e {
        HarnessEvent::ToolResult { output, .. } => Some(output.to_string()),
        _ => None,
    });
    assert!(result.unwrap_or_default().contains("SLEPT_OK"), "the tool's result is intact: {seen:#?}");
    let requests = fake.requests();
    let after = requests.last().unwrap();
    assert!(user_texts(after).iter().any(|t| t.contains("STEER_MARKER")), "{after}");
    session.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_stops_the_running_tool_and_a_killed_pi_resumes_its_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeAnthropic::start(vec![
        Reply::default().and_call("bash", json!({ "command": "sleep 30" })),
        Reply::text("REMEMBERED_MARKER"),
    ]);
    let mcp = endpoint().await;
    let (session, mut events) =
        Session::launch(spec(dir.path(), "1", &fake, Prompt::replace("You are a Manager.".into()), &mcp.url), 256)
            .await
            .unwrap();
    let mut seen = Vec::new();
    let turn = start(&session, "first", "FIRST_MARKER run the long job").await;
    until(&mut events, &mut seen, |e| matches!(e, HarnessEvent::ToolRunning { .. })).await;
    let asked = std::time::Instant::now();
    session.interrupt().await.unwrap();
    let ended = until(&mut events, &mut seen, turn_ended).await;
    assert_eq!(ended, HarnessEvent::TurnEnded { turn_id: turn, status: TurnStatus::Interrupted });
    assert!(asked.elapsed() < Duration::from_secs(20), "the tool ran on: {:?}", asked.elapsed());
    assert!(
        seen.iter().any(|e| matches!(e, HarnessEvent::ToolAborted { .. } | HarnessEvent::ToolFailed { .. })),
        "the tool was not cut off: {seen:#?}"
    );
    // The session file was recorded from the state answered at start, before the first turn's
    // events (the harness answers in order); then the process dies hard.
    let record = dir.path().join(canopy_harness::pi::CONVERSATION_FILE);
    assert!(record.exists(), "the session file was not recorded from the state answered at start");
    let pid = session.pid();
    drop(session);
    drop(events);
    let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();

    let (session, mut events) =
        Session::launch(spec(dir.path(), "2", &fake, Prompt::replace("You are a Manager.".into()), &mcp.url), 256)
            .await
            .unwrap();
    let mut seen = Vec::new();
    start(&session, "second", "what did I ask first?").await;
    until(&mut events, &mut seen, turn_ended).await;
    let resumed = fake.requests().last().cloned().unwrap();
    assert!(
        user_texts(&resumed).iter().any(|t| t.contains("FIRST_MARKER")),
        "the conversation was not resumed: {resumed}"
    );
    session.shutdown(Duration::from_secs(5)).await;
}
