//! End-to-end tests of the harness binary's stdio protocol and transcript, without MCP.
//!
//! Owns turn behaviour as the host sees it: turns, steers, aborts, shutdown, bad input, crash
//! and refusing bad scripts. MCP calls are covered in `tests/mcp.rs`.

#![allow(clippy::unwrap_used, reason = "tests fail loudly on purpose")]

mod common;

use std::process::Stdio;

use canopy_scripted::protocol::Output;
use common::{Harness, ended, free, started, text};
use serde_json::json;

/// Sleep long enough that inputs sent during it are certainly read before it ends, even on a
/// loaded machine; every wait in these tests is bounded by this or by `STEP_TIMEOUT`.
const SCRIPT: &str = r#"
[[rule]]
match = { kind = "start" }
actions = [
  { say = "hello, I am {self} in {home}" },
  { compact = true },
  { end_turn = true },
  { say = "never said" },
]

[[rule]]
match = { steer = true, text_contains = "stop" }
actions = [{ say = "stopping because {input.sender} said: {input.text}" }]

[[rule]]
match = { steer = true }
actions = []

[[rule]]
match = { text_contains = "long" }
actions = [{ say = "working" }, { sleep = "1500ms" }, { say = "after the sleep" }]

[[rule]]
match = { text_contains = "last" }
actions = [{ sleep = "1500ms" }]

[[rule]]
match = { text_contains = "crash" }
actions = [{ say = "going down" }, { crash = true }, { say = "never said" }]

[[rule]]
match = { text_contains = "tool" }
actions = [{ call = "comms_whoami", args = { who = "{self}" } }]
"#;

fn prompt(id: &str, text: &str) -> serde_json::Value {
    json!({"type": "prompt", "id": id, "text": text, "meta": {"kind": "message", "sender": "bob"}})
}

fn steer(id: &str, turn_id: &str, text: &str) -> serde_json::Value {
    json!({"type": "steer", "id": id, "turn_id": turn_id, "text": text, "meta": {"sender": "carol"}})
}

#[tokio::test]
async fn a_start_turn_says_compacts_and_ends_early() {
    let mut h = Harness::start(SCRIPT, &[]).await;
    h.send(json!({"type": "prompt", "id": "in-1", "text": "begin", "meta": {"kind": "start"}})).await;
    assert_eq!(h.next().await, started("t1", "in-1"));
    assert_eq!(h.next().await, text("t1", "hello, I am ada in ada-home"));
    assert_eq!(h.next().await, Output::Compaction { phase: "start".into() });
    assert_eq!(h.next().await, Output::Compaction { phase: "end".into() });
    assert_eq!(h.next().await, free("t1"));
    assert_eq!(h.next().await, ended("t1", "completed"));

    // No rule matches: the turn just ends.
    h.send(json!({"type": "prompt", "id": "in-2", "text": "nothing to see"})).await;
    assert_eq!(h.next().await, started("t2", "in-2"));
    assert_eq!(h.next().await, free("t2"));
    assert_eq!(h.next().await, ended("t2", "completed"));

    assert_eq!(
        h.transcript(),
        vec![
            json!({"kind": "system_prompt", "text": "You are a scripted agent."}),
            json!({"kind": "input", "id": "in-1", "turn_id": "t1", "position": 0, "steer": false, "text": "begin",
                   "meta": {"kind": "start"}}),
            json!({"kind": "text", "turn_id": "t1", "text": "hello, I am ada in ada-home"}),
            json!({"kind": "compaction", "turn_id": "t1"}),
            json!({"kind": "usage", "turn_id": "t1", "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0}),
            json!({"kind": "turn_ended", "turn_id": "t1", "status": "completed"}),
            json!({"kind": "input", "id": "in-2", "turn_id": "t2", "position": 0, "steer": false,
                   "text": "nothing to see", "meta": {}}),
            json!({"kind": "usage", "turn_id": "t2", "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0}),
            json!({"kind": "turn_ended", "turn_id": "t2", "status": "completed"}),
        ]
    );

    h.send(json!({"type": "shutdown"})).await;
    assert_eq!(h.next_or_end().await, None);
    assert_eq!(h.wait().await.code(), Some(0));
}

#[tokio::test]
async fn a_steer_during_a_sleep_is_injected_after_it_and_runs_first() {
    let mut h = Harness::start(SCRIPT, &[]).await;
    h.send(prompt("p1", "a long job")).await;
    assert_eq!(h.next().await, started("t1", "p1"));
    assert_eq!(h.next().await, text("t1", "working"));
    assert_eq!(
        h.next().await,
        Output::ToolStarted {
            turn_id: "t1".into(),
            call_id: "c1".into(),
            name: "sleep".into(),
            args: json!({"duration": "1500ms"})
        }
    );

    // During the sleep: a good steer waits, everything else is answered at once.
    h.send(steer("s1", "t1", "please stop")).await;
    h.send(steer("s2", "t9", "wrong turn")).await;
    assert_eq!(h.next().await, Output::SteerQueued { id: "s1".into(), turn_id: "t1".into() });
    match h.next().await {
        Output::SteerRejected { id, reason } => {
            assert_eq!(id, "s2");
            assert!(reason.contains("t9"), "{reason}");
        }
        other => panic!("expected steer_rejected, got {other:?}"),
    }
    h.send(prompt("p2", "another")).await;
    assert_eq!(h.next().await, Output::PromptRejected { id: "p2".into(), reason: "a turn is running".into() });
    h.send_raw("{not json").await;
    assert!(matches!(h.next().await, Output::Error { message } if message.contains("invalid input line")));
    h.send_raw(r#"{"type": "dance"}"#).await;
    assert!(matches!(h.next().await, Output::Error { .. }));

    assert_eq!(
        h.next().await,
        Output::ToolFinished {
            turn_id: "t1".into(),
            call_id: "c1".into(),
            name: "sleep".into(),
            is_error: false,
            output: json!({"slept_ms": 1500}),
        }
    );
    assert_eq!(h.next().await, Output::SteerAccepted { id: "s1".into(), turn_id: "t1".into(), position: 1 });
    assert_eq!(h.next().await, text("t1", "stopping because carol said: please stop"));
    assert_eq!(h.next().await, text("t1", "after the sleep"));
    assert_eq!(h.next().await, free("t1"));
    assert_eq!(h.next().await, ended("t1", "completed"));

    let transcript = h.transcript();
    let kinds: Vec<&str> = transcript.iter().map(|line| line["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["system_prompt", "input", "text", "tool_call", "tool_result", "input", "text", "text", "usage", "turn_ended"]
    );
    assert_eq!(
        transcript[5],
        json!({"kind": "input", "id": "s1", "turn_id": "t1", "position": 1, "steer": true, "text": "please stop",
               "meta": {"sender": "carol"}})
    );
    assert_eq!(
        transcript[3],
        json!({"kind": "tool_call", "turn_id": "t1", "call_id": "c1", "name": "sleep", "args": {"duration": "1500ms"}})
    );
    assert_eq!(
        transcript[4],
        json!({"kind": "tool_result", "turn_id": "t1", "call_id": "c1", "name": "sleep", "is_error": false,
               "output": {"slept_ms": 1500}})
    );

    // The process kept working after the bad lines: a second turn, and a steer while idle.
    h.send(steer("s3", "t1", "late")).await;
    assert!(matches!(h.next().await, Output::SteerRejected { id, .. } if id == "s3"));
    h.send(prompt("p3", "hi")).await;
    assert_eq!(h.next().await, started("t2", "p3"));
    assert_eq!(h.next().await, free("t2"));
    assert_eq!(h.next().await, ended("t2", "completed"));
}

#[tokio::test]
async fn a_steer_during_the_last_action_is_injected_before_the_turn_ends() {
    let mut h = Harness::start(SCRIPT, &[]).await;
    h.send(prompt("p1", "the last one")).await;
    assert_eq!(h.next().await, started("t1", "p1"));
    assert!(matches!(h.next().await, Output::ToolStarted { name, .. } if name == "sleep"));
    h.send(steer("s1", "t1", "stop it")).await;
    h.send(steer("s2", "t1", "and this")).await;
    assert_eq!(h.next().await, Output::SteerQueued { id: "s1".into(), turn_id: "t1".into() });
    assert_eq!(h.next().await, Output::SteerQueued { id: "s2".into(), turn_id: "t1".into() });
    assert!(matches!(h.next().await, Output::ToolFinished { name, .. } if name == "sleep"));
    assert_eq!(h.next().await, Output::SteerAccepted { id: "s1".into(), turn_id: "t1".into(), position: 1 });
    assert_eq!(h.next().await, Output::SteerAccepted { id: "s2".into(), turn_id: "t1".into(), position: 2 });
    assert_eq!(h.next().await, text("t1", "stopping because carol said: stop it"));
    assert_eq!(h.next().await, free("t1"));
    assert_eq!(h.next().await, ended("t1", "completed"));
    let positions: Vec<_> =
        h.transcript().iter().filter(|l| l["kind"] == "input").map(|l| l["position"].clone()).collect();
    assert_eq!(positions, [json!(0), json!(1), json!(2)]);
}

#[tokio::test]
async fn an_abort_cuts_a_sleep_short_and_ends_the_turn_interrupted() {
    let mut h = Harness::start(SCRIPT, &[]).await;
    // Abort while idle does nothing.
    h.send(json!({"type": "abort"})).await;
    h.send(prompt("p1", "long")).await;
    assert_eq!(h.next().await, started("t1", "p1"));
    assert_eq!(h.next().await, text("t1", "working"));
    assert!(matches!(h.next().await, Output::ToolStarted { .. }));
    h.send(steer("s1", "t1", "stop")).await;
    h.send(json!({"type": "abort"})).await;
    assert_eq!(h.next().await, Output::SteerQueued { id: "s1".into(), turn_id: "t1".into() });
    // The pretend tool is cut off at once; the waiting steer was never seen, so it is handed back.
    assert!(matches!(h.next().await, Output::ToolAborted { call_id, name, .. } if call_id == "c1" && name == "sleep"));
    assert!(matches!(h.next().await, Output::SteerRejected { id, .. } if id == "s1"));
    assert_eq!(h.next().await, free("t1"));
    assert_eq!(h.next().await, ended("t1", "interrupted"));
    assert_eq!(
        h.transcript().last().unwrap(),
        &json!({"kind": "turn_ended", "turn_id": "t1", "status": "interrupted"})
    );

    h.send(prompt("p2", "next")).await;
    assert_eq!(h.next().await, started("t2", "p2"));
    assert_eq!(h.next().await, free("t2"));
    assert_eq!(h.next().await, ended("t2", "completed"));
}

#[tokio::test]
async fn shutdown_during_a_turn_interrupts_it_and_exits() {
    let mut h = Harness::start(SCRIPT, &[]).await;
    h.send(prompt("p1", "long")).await;
    assert_eq!(h.next().await, started("t1", "p1"));
    assert_eq!(h.next().await, text("t1", "working"));
    assert!(matches!(h.next().await, Output::ToolStarted { .. }));
    h.send(json!({"type": "shutdown"})).await;
    assert!(matches!(h.next().await, Output::ToolFinished { .. }));
    assert_eq!(h.next().await, free("t1"));
    assert_eq!(h.next().await, ended("t1", "interrupted"));
    assert_eq!(h.next_or_end().await, None);
    assert_eq!(h.wait().await.code(), Some(0));
}

#[tokio::test]
async fn end_of_input_finishes_the_turn_then_exits() {
    let mut h = Harness::start(SCRIPT, &[]).await;
    h.send(prompt("p1", "long")).await;
    assert_eq!(h.next().await, started("t1", "p1"));
    h.close_stdin();
    assert_eq!(h.next().await, text("t1", "working"));
    assert!(matches!(h.next().await, Output::ToolStarted { .. }));
    assert!(matches!(h.next().await, Output::ToolFinished { .. }));
    assert_eq!(h.next().await, text("t1", "after the sleep"));
    assert_eq!(h.next().await, free("t1"));
    assert_eq!(h.next().await, ended("t1", "completed"));
    assert_eq!(h.next_or_end().await, None);
    assert_eq!(h.wait().await.code(), Some(0));
}

#[tokio::test]
async fn a_crash_exits_101_without_ending_the_turn() {
    let mut h = Harness::start(SCRIPT, &[]).await;
    h.send(prompt("p1", "crash now")).await;
    assert_eq!(h.next().await, started("t1", "p1"));
    assert_eq!(h.next().await, text("t1", "going down"));
    assert_eq!(h.next_or_end().await, None);
    assert_eq!(h.wait().await.code(), Some(101));
    let transcript = h.transcript();
    assert_eq!(transcript.last().unwrap(), &json!({"kind": "text", "turn_id": "t1", "text": "going down"}));
}

#[tokio::test]
async fn a_call_without_mcp_environment_is_a_tool_error_not_a_failure() {
    let mut h = Harness::start(SCRIPT, &[]).await;
    h.send(prompt("p1", "use a tool")).await;
    assert_eq!(h.next().await, started("t1", "p1"));
    assert_eq!(
        h.next().await,
        Output::ToolStarted {
            turn_id: "t1".into(),
            call_id: "c1".into(),
            name: "comms_whoami".into(),
            args: json!({"who": "ada"})
        }
    );
    assert_eq!(
        h.next().await,
        Output::ToolFinished {
            turn_id: "t1".into(),
            call_id: "c1".into(),
            name: "comms_whoami".into(),
            is_error: true,
            output: json!({"error": "CANOPY_MCP_URL is not set"}),
        }
    );
    assert_eq!(h.next().await, free("t1"));
    assert_eq!(h.next().await, ended("t1", "completed"));
}

#[tokio::test]
async fn bad_scripts_and_arguments_exit_2_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("bad.toml");
    std::fs::write(&script, "[[rule]]\nactions = [\n  { say = \"hi\", sleep = \"2s\" },\n]\n").unwrap();
    let binary = env!("CARGO_BIN_EXE_canopy-scripted");

    let run = |args: Vec<std::ffi::OsString>| async move {
        let child = tokio::process::Command::new(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        tokio::time::timeout(common::STEP_TIMEOUT, child.wait_with_output()).await.unwrap().unwrap()
    };

    let out = run(vec!["--script".into(), script.clone().into()]).await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("{}:3: action has both `say` and `sleep`", script.display())), "{stderr}");
    assert!(out.stdout.is_empty());

    let out = run(vec!["--script".into(), script.clone().into(), "--verbose".into()]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown argument `--verbose`"));

    let out = run(vec![]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`--script` is required"));

    std::fs::write(&script, "").unwrap();
    let missing = dir.path().join("no-such-prompt.md");
    let out = run(vec!["--script".into(), script.clone().into(), "--system-prompt-file".into(), missing.into()]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-prompt.md"));
}

#[tokio::test]
async fn the_system_prompt_is_optional_and_the_transcript_too() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("s.toml");
    std::fs::write(&script, "[[rule]]\nactions = [{ say = \"hi\" }]\n").unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_canopy-scripted"))
        .arg("--script")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"{\"type\":\"prompt\",\"id\":\"a\",\"text\":\"x\"}\n")
        .await
        .unwrap();
    drop(stdin);
    let out = tokio::time::timeout(common::STEP_TIMEOUT, child.wait_with_output()).await.unwrap().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<Output> =
        String::from_utf8_lossy(&out.stdout).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert!(matches!(lines[0], Output::Ready { .. }));
    assert_eq!(lines[1..], [started("t1", "a"), text("t1", "hi"), free("t1"), ended("t1", "completed")]);
}

#[tokio::test]
async fn a_turn_reports_what_its_script_says_of_usage_and_zero_when_it_says_nothing() {
    let script = r#"
[[rule]]
match = { text_contains = "spend" }
actions = [{ usage = { input_tokens = 10, output_tokens = 2, cost_usd = 0.5 } }]

[[rule]]
match = { text_contains = "silent" }
actions = [{ usage = "none" }]
"#;
    let mut h = Harness::start(script, &[]).await;
    h.send(json!({"type": "prompt", "id": "p1", "text": "spend"})).await;
    assert_eq!(h.next().await, started("t1", "p1"));
    let said = Output::Usage {
        turn_id: "t1".into(),
        input_tokens: 10,
        output_tokens: 2,
        cache_read_tokens: 0,
        cache_write_tokens: 0,
        cost_usd: Some(0.5),
    };
    assert_eq!(h.next().await, said, "the script's usage, and no zero after it");
    assert_eq!(h.next().await, ended("t1", "completed"));
    h.send(json!({"type": "prompt", "id": "p2", "text": "silent"})).await;
    assert_eq!(h.next().await, started("t2", "p2"));
    assert_eq!(h.next().await, ended("t2", "completed"), "`usage = \"none\"` reports nothing");
    h.send(json!({"type": "prompt", "id": "p3", "text": "other"})).await;
    assert_eq!(h.next().await, started("t3", "p3"));
    assert_eq!(h.next().await, free("t3"));
    assert_eq!(h.next().await, ended("t3", "completed"));
}
