//! `canopy agents interrupt` end to end with the scripted harness: a turn stuck in a long
//! pretend tool call is interrupted (it ends `interrupted`, the tool `tool_aborted`), the
//! session stays the same incarnation and takes the next message as a new turn; an idle agent
//! answers `interrupted: false`; an agent's own session token is refused; unknown agents and
//! agents without a live session are typed refusals naming `handle`; the audit log keeps it.
//!
//! Owns these scenarios only. The same command against the real Claude Code and Codex CLIs is
//! in `claude.rs` and `codex.rs`.

use std::time::Duration;

use canopy_proto::Method;
use serde_json::{Value, json};

use crate::delivery::{QUICK, inputs_containing};
use crate::env::TestEnv;
use crate::sessions::process_env;

const BUSY: &str = r#"
[[rule]]
match = { kind = "message", text_contains = "long job" }
actions = [{ say = "starting the long job" }, { sleep = "1h" }, { say = "never said" }]

[[rule]]
match = { kind = "message" }
actions = [{ say = "noted" }]
"#;

/// The activity item that ended `turn`, if it has ended.
fn turn_ended(env: &TestEnv, agent: &str, turn: &str) -> Option<Value> {
    env.activity(agent).into_iter().find(|i| i["kind"] == "turn_ended" && i["turn_id"] == turn)
}

/// Calls an API method with `token`, straight over NATS, and returns the raw reply.
fn call_as(env: &TestEnv, token: &str, method: Method, body: Value) -> Value {
    let bus = env.bus();
    let subject = env.subjects().api(method);
    let reply = env
        .rt
        .block_on(bus.request(
            &subject,
            Some(token),
            serde_json::to_vec(&body).unwrap().into(),
            Duration::from_secs(10),
        ))
        .unwrap();
    serde_json::from_slice(&reply).unwrap()
}

#[test]
fn interrupt_ends_a_turn_stuck_in_a_long_tool_and_the_session_takes_the_next_message() {
    let env = TestEnv::started_with(QUICK);
    env.create_scripted("busy", BUSY);
    let pid = env.wait_harness_pid("busy", 1);
    crate::assert_eventually!(env.roster_entry("busy")["presence"] == "idle", "busy never went idle");

    // Idle: nothing to interrupt, and that is an answer, not an error.
    let idle = env.json(&["agents", "interrupt", "busy"]);
    assert_eq!(idle["interrupted"], false, "{idle}");
    assert_eq!(idle["reason"], "no turn is running", "{idle}");
    assert_eq!(idle["incarnation"], 1, "{idle}");

    env.json(&["post", "--channel", "home-busy", "--topic", "work", "--create-topic", "please do the long job"]);
    crate::assert_eventually!(
        env.activity("busy").iter().any(|i| i["kind"] == "tool_running" && i["detail"]["name"] == "sleep"),
        "busy never started its long tool: {:?}",
        env.activity("busy")
    );
    let turn = env
        .activity("busy")
        .into_iter()
        .find(|i| i["kind"] == "tool_running")
        .and_then(|i| i["turn_id"].as_str().map(str::to_owned))
        .unwrap();
    assert_eq!(env.roster_entry("busy")["presence"], "working");

    let interrupted = env.json(&["agents", "interrupt", "busy"]);
    assert_eq!(interrupted["interrupted"], true, "{interrupted}");
    assert_eq!(interrupted["turn_id"], turn.as_str(), "{interrupted}");
    assert_eq!(interrupted["incarnation"], 1, "{interrupted}");
    crate::assert_eventually!(turn_ended(&env, "busy", &turn).is_some(), "the interrupted turn never ended");
    let ended = turn_ended(&env, "busy", &turn).unwrap();
    assert_eq!(ended["detail"]["status"], "interrupted", "{ended}");
    let activity = env.activity("busy");
    assert!(activity.iter().any(|i| i["kind"] == "tool_aborted" && i["turn_id"] == turn.as_str()), "{activity:?}");
    assert!(!activity.iter().any(|i| i["kind"] == "text" && i["summary"] == "never said"), "{activity:?}");
    crate::assert_eventually!(env.roster_entry("busy")["presence"] == "idle", "busy did not go idle after it");

    // Same process, same incarnation, and still usable: the next message starts a new turn.
    env.json(&["post", "--channel", "home-busy", "--topic", "work", "are you still there"]);
    crate::assert_eventually!(
        env.activity("busy").iter().any(|i| i["kind"] == "text" && i["summary"] == "noted"),
        "the session did not take a message after the interrupt: {:?}",
        env.activity("busy")
    );
    let after = inputs_containing(&env, "busy", "are you still there");
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(after[0]["turn_id"], turn.as_str(), "the message must start a new turn");
    assert_eq!(after[0]["position"], 0, "{after:?}");
    assert_eq!(env.roster_entry("busy")["incarnation"], 1);
    assert_eq!(env.wait_harness_pid("busy", 1), pid);
    assert!(crate::env::alive(pid), "the harness exited");

    // The audit log keeps both interrupts, with what each did.
    let audit = env.json(&["audit"]);
    let entries: Vec<&Value> =
        audit["entries"].as_array().unwrap().iter().filter(|e| e["action"] == "agents.interrupt").collect();
    assert_eq!(entries.len(), 2, "{audit}");
    assert!(entries.iter().all(|e| e["target"] == "busy"), "{entries:?}");
    assert!(entries.iter().any(|e| e["detail"].as_str().unwrap().contains(&format!("turn {turn}"))), "{entries:?}");
    assert!(entries.iter().any(|e| e["detail"].as_str().unwrap().contains("nothing interrupted")), "{entries:?}");
}

#[test]
fn interrupt_is_for_operators_and_names_the_agent_it_cannot_reach() {
    let env = TestEnv::started_with(QUICK);
    env.create_scripted("busy", BUSY);
    env.create_scripted("other", "");
    let pid = env.wait_harness_pid("busy", 1);
    env.wait_harness_pid("other", 1);

    // An agent's session token may not interrupt anyone, itself included.
    let token = process_env(pid)["CANOPY_MCP_TOKEN"].clone();
    for target in ["other", "busy"] {
        let reply = call_as(&env, &token, Method::AgentsInterrupt, json!({ "handle": target }));
        assert_eq!(reply["error"]["code"], "forbidden", "{reply}");
    }
    let audit = env.json(&["audit"]);
    assert!(!audit["entries"].as_array().unwrap().iter().any(|e| e["action"] == "agents.interrupt"), "{audit}");

    let unknown = env.refused(&["agents", "interrupt", "nobody-here"]);
    assert_eq!(unknown["code"], "not_found", "{unknown}");
    assert_eq!(unknown["field"], "handle", "{unknown}");
    let bad = env.refused(&["agents", "interrupt", "Not A Handle"]);
    assert_eq!(bad["code"], "invalid_argument", "{bad}");
    assert_eq!(bad["field"], "handle", "{bad}");

    env.json(&["agents", "stop", "other"]);
    crate::assert_eventually!(env.roster_entry("other")["runner"].is_null(), "other's session never ended");
    let offline = env.refused(&["agents", "interrupt", "other"]);
    assert_eq!(offline["code"], "conflict", "{offline}");
    assert_eq!(offline["field"], "handle", "{offline}");
    assert!(offline["message"].as_str().unwrap().contains("no live session"), "{offline}");
    assert!(offline["message"].as_str().unwrap().contains("offline"), "{offline}");
}
