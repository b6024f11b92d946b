//! The omp adapter against the real pinned `omp` (oh-my-pi 18.2.3 on Bun 1.4.4, found
//! through `CANOPY_TEST_OMP_BIN`), with only the model API faked and the session confined:
//! a replaced prompt (omp's footer and context survive it), Canopy's own turn numbers, a steer
//! that lands after a running tool at the next step boundary with the tool's result intact,
//! interrupt, and resume after `kill -9` in the next incarnation. The `task` subagents are the
//! end-to-end test's (`tests/e2e/omp.rs`).
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
use harness_bins::omp_bin;
use serde_json::json;

fn spec(dir: &std::path::Path, name: &str, fake: &FakeAnthropic, prompt: Prompt) -> LaunchSpec {
    LaunchSpec {
        kind: HarnessKind::Omp,
        program: omp_bin(),
        program_args: vec![],
        session_dir: dir.join(name),
        agent_dir: Some(dir.to_owned()),
        cwd: dir.join("work"),
        builtin_tools: vec!["Bash".into(), "Read".into()],
        prompt,
        mcp_url: "http://127.0.0.1:9/mcp".into(),
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
async fn a_replaced_prompt_keeps_omps_footer_and_a_steer_lands_after_the_running_tool() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("work")).unwrap();
    std::fs::write(dir.path().join("work/AGENTS.md"), "AGENTS_MD_MARKER keep the build green\n").unwrap();
    // Another tool's project configuration stays out (omp would load `.claude/skills` itself).
    let leak = dir.path().join("work/.claude/skills/leak");
    std::fs::create_dir_all(&leak).unwrap();
    std::fs::write(leak.join("SKILL.md"), "---\nname: leak\ndescription: CLAUDE_SKILL_MARKER\n---\nbody\n").unwrap();
    let fake = FakeAnthropic::start(vec![
        Reply::text("hello operator"),
        Reply::default().and_call("bash", json!({ "command": "sleep 2; echo SLEPT_OK", "i": "wait" })),
        Reply::text("done after the steer"),
    ]);
    let prompt = "You are the build Manager (REPLACED_MARKER).\n";
    let (session, mut events) =
        Session::launch(spec(dir.path(), "1", &fake, Prompt::replace(prompt.into())), 256).await.unwrap();
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
    assert!(system.contains("<workstation>"), "the footer survives a replace: {system}");
    assert!(!system.contains("# Tool Inventory"), "the default block-0 is replaced: {system}");
    assert!(!system.contains("CLAUDE_SKILL_MARKER"), "a project's .claude skill leaked in: {system}");

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
async fn an_interrupt_stops_the_running_tool_and_a_killed_omp_resumes_its_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeAnthropic::start(vec![
        Reply::default().and_call("bash", json!({ "command": "sleep 30", "i": "wait" })),
        Reply::text("REMEMBERED_MARKER"),
    ]);
    let (session, mut events) =
        Session::launch(spec(dir.path(), "1", &fake, Prompt::replace("You are a Manager.".into())), 256).await.unwrap();
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
    let record = dir.path().join(canopy_harness::omp::CONVERSATION_FILE);
    assert!(record.exists(), "the session file was not recorded from the state answered at start");
    let pid = session.pid();
    drop(session);
    drop(events);
    let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();

    let (session, mut events) =
        Session::launch(spec(dir.path(), "2", &fake, Prompt::replace("You are a Manager.".into())), 256).await.unwrap();
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
