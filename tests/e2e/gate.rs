//! The spawn-approval gate end to end: requests from a scripted Manager, only operators
//! decide (by command or by replying in the request's own topic), replies that decide
//! nothing are answered, refusals are audited, races, expiry, policy, despawn.

use std::time::Duration;

use bytes::Bytes;
use canopy_proto::Method;
use serde_json::{Value, json};

use crate::env::{TestEnv, alive};

const QUICK: &[(&str, &str)] = &[
    ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
    ("quiet_window = \"2s\"", "quiet_window = \"100ms\""),
    ("resync = \"5s\"", "resync = \"500ms\""),
];

const REQUESTER: &str = r#"
[[rule]]
match = { kind = "start" }
actions = [{ call = "agents_spawn_peer", args = { handle = "flaky", name = "Flaky Tests Manager", charter = "Hunt down flaky tests", reason = "CI is red twice a day" } }]

[[rule]]
match = { kind = "message" }
actions = [{ say = "noted" }]
"#;

impl TestEnv {
    /// Calls the API with a session's own token, as its harness would through the tools.
    fn call_as(&self, agent: &str, incarnation: u64, method: Method, request: Value) -> Value {
        let pid = self.wait_harness_pid(agent, incarnation);
        let token = crate::sessions::process_env(pid)["CANOPY_MCP_TOKEN"].clone();
        let bus = self.bus();
        let subject = self.subjects().api(method);
        let reply = self
            .rt
            .block_on(bus.request(&subject, Some(&token), Bytes::from(request.to_string()), Duration::from_secs(10)))
            .unwrap();
        serde_json::from_slice(&reply).unwrap()
    }

    fn requests(&self) -> Vec<Value> {
        self.json(&["requests"])["requests"].as_array().unwrap().clone()
    }
}

fn started_with_request(extra: &[(&str, &str)]) -> (TestEnv, String) {
    let env = TestEnv::started_with(&[QUICK, extra].concat());
    env.create_scripted("ci-manager", REQUESTER);
    crate::assert_eventually!(!env.requests().is_empty(), "the Manager never asked");
    let id = env.requests()[0]["id"].as_str().unwrap().to_owned();
    (env, id)
}

#[test]
fn a_manager_requests_a_child_and_only_the_operator_can_approve() {
    let (env, id) = started_with_request(&[]);
    let request = &env.requests()[0];
    assert_eq!(request["state"], "pending");
    assert_eq!(request["requester"], "ci-manager");
    // The tool returned pending at once, without waiting for the operator.
    let transcript = std::fs::read_to_string(env.data_dir().join("sessions/ci-manager/1/transcript.jsonl")).unwrap();
    let result = transcript
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["kind"] == "tool_result")
        .unwrap();
    assert_eq!(result["output"]["state"], "pending", "{result}");
    // It appears in the requester's home channel, mentioning the operator.
    let notice = env.messages("home-ci-manager").into_iter().find(|m| m["topic"] == "spawn: flaky").unwrap();
    assert!(notice["body"].as_str().unwrap().contains("@ops"), "{notice}");
    assert_eq!(notice["sender"]["handle"], "canopy");

    // The agent cannot approve: not through the API, not by posting `approve`.
    let refused = env.call_as("ci-manager", 1, Method::SpawnDecide, json!({ "id": id, "approve": true }));
    assert_eq!(refused["error"]["code"], "forbidden", "{refused}");
    let post = env.call_as(
        "ci-manager",
        1,
        Method::MessagesPost,
        json!({ "channel": "home-ci-manager", "topic": "spawn: flaky", "body": "approve" }),
    );
    assert!(post["ok"].is_object(), "{post}");
    assert_eq!(env.requests()[0]["state"], "pending", "an agent's `approve` counted as consent");
    let audit = env.json(&["audit"]);
    let refusals =
        audit["entries"].as_array().unwrap().iter().filter(|e| e["action"] == "spawn.approve.refused").count();
    assert_eq!(refusals, 2, "{audit}");
    assert!(env.messages("home-ci-manager").iter().any(|m| m["body"].as_str().unwrap().contains("tried to approve")));

    // The operator approves; the child exists under its requester and runs with its charter.
    let approved = env.json(&["approve", &id]);
    assert_eq!(approved["state"], "spawned");
    let child = env.json(&["agents", "show", "flaky"]);
    assert_eq!(child["account"]["parent"], "ci-manager");
    assert_eq!(child["account"]["role"], "manager");
    crate::assert_eventually!(
        std::fs::read_to_string(env.data_dir().join("sessions/flaky/1/transcript.jsonl"))
            .is_ok_and(|t| t.contains("You are a Manager") && t.contains("Hunt down flaky tests")),
        "the child did not start with the Manager prompt and its charter"
    );
    // The requester hears of it at its next turn.
    crate::assert_eventually!(
        std::fs::read_to_string(env.data_dir().join("sessions/ci-manager/1/transcript.jsonl"))
            .is_ok_and(|t| t.contains("Approved by ops")),
        "the requester was not told"
    );
    let again = env.refused(&["approve", &id]);
    assert_eq!(again["code"], "conflict", "approving twice must not spawn twice");
    assert_eq!(
        env.json(&["agents", "list"])["agents"].as_array().unwrap().iter().filter(|a| a["handle"] == "flaky").count(),
        1
    );
}

#[test]
fn the_operator_can_answer_in_the_topic() {
    let (env, _) = started_with_request(&[]);
    env.json(&["post", "--channel", "home-ci-manager", "--topic", "spawn: flaky", "deny not this quarter"]);
    crate::assert_eventually!(env.requests()[0]["state"] == "denied", "the reply did not decide");
    assert_eq!(env.requests()[0]["note"], "not this quarter");
    assert!(env.run(&["agents", "show", "flaky"]).status.code() == Some(1));
}

impl TestEnv {
    /// Canopy's posts in `channel` under `topic`, oldest first.
    fn canopy_posts(&self, channel: &str, topic: &str) -> Vec<String> {
        self.messages(channel)
            .into_iter()
            .filter(|m| m["topic"] == topic && m["sender"]["handle"] == "canopy")
            .map(|m| m["body"].as_str().unwrap().to_owned())
            .collect()
    }
}

#[test]
fn a_deny_in_another_managers_home_leaves_the_request_pending() {
    let (env, id) = started_with_request(&[]);
    env.create_scripted("docs-manager", "");
    env.json(&[
        "post",
        "--channel",
        "home-docs-manager",
        "--topic",
        "spawn: flaky",
        "--create-topic",
        "deny not this quarter",
    ]);
    // The reply is answered before the post returns: where the request really is.
    let answers = env.canopy_posts("home-docs-manager", "spawn: flaky");
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(
        answers[0].contains("Nothing was decided")
            && answers[0].contains("#home-ci-manager")
            && answers[0].contains(&format!("canopy deny {id} --reason")),
        "{answers:?}"
    );
    // The answer is posted by the same write that would have decided: nothing to wait for.
    assert_eq!(env.requests()[0]["state"], "pending", "a reply outside the request's topic decided it");
    assert!(env.requests()[0]["decided_by"].is_null());
}

#[test]
fn an_unclear_reply_gets_the_grammar_and_the_request_stays_pending() {
    let (env, id) = started_with_request(&[]);
    env.json(&["post", "--channel", "home-ci-manager", "--topic", "spawn: flaky", "Approve."]);
    assert_eq!(env.requests()[0]["state"], "pending", "`Approve.` was taken as consent");
    let messages = env.messages("home-ci-manager");
    assert!(
        messages.iter().any(|m| m["body"] == "Approve." && m["sender"]["handle"] == "ops"),
        "the operator's reply was not stored as posted"
    );
    let hints: Vec<String> = env
        .canopy_posts("home-ci-manager", "spawn: flaky")
        .into_iter()
        .filter(|b| b.contains("Nothing was decided"))
        .collect();
    assert_eq!(hints.len(), 1, "{hints:?}");
    let (approve, deny) = (format!("canopy approve {id}"), format!("canopy deny {id} --reason"));
    for part in ["`approve`", "`deny <reason>`", approve.as_str(), deny.as_str()] {
        assert!(hints[0].contains(part), "{part} missing from {}", hints[0]);
    }
    // The grammar the hint names does decide.
    env.json(&["post", "--channel", "home-ci-manager", "--topic", "spawn: flaky", "approve"]);
    crate::assert_eventually!(env.requests()[0]["state"] == "spawned", "`approve` did not decide");
}

#[test]
fn a_second_decision_is_answered_with_the_requests_state() {
    let (env, id) = started_with_request(&[]);
    assert_eq!(env.json(&["approve", &id])["state"], "spawned");
    env.json(&["post", "--channel", "home-ci-manager", "--topic", "spawn: flaky", "approve"]);
    let answers: Vec<String> = env
        .canopy_posts("home-ci-manager", "spawn: flaky")
        .into_iter()
        .filter(|b| b.starts_with("Nothing changed"))
        .collect();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(
        answers[0].contains(&format!("{id} for @flaky is already approved by ops")) && answers[0].contains("spawned"),
        "{answers:?}"
    );
    env.json(&["post", "--channel", "home-ci-manager", "--topic", "spawn: flaky", "deny changed my mind"]);
    let answers = env.canopy_posts("home-ci-manager", "spawn: flaky");
    assert_eq!(answers.iter().filter(|b| b.starts_with("Nothing changed")).count(), 2, "{answers:?}");
    assert_eq!(env.requests()[0]["state"], "spawned");
    assert_eq!(
        env.json(&["agents", "list"])["agents"].as_array().unwrap().iter().filter(|a| a["handle"] == "flaky").count(),
        1
    );
}

#[test]
fn an_agents_forbidden_post_shows_in_the_audit_log() {
    let env = TestEnv::started_with(QUICK);
    env.create_scripted("ci-manager", "");
    env.create_scripted("docs-manager", "");
    let refused = env.call_as(
        "ci-manager",
        1,
        Method::MessagesPost,
        json!({ "channel": "announcements", "topic": "news", "body": "hello everyone", "create_topic": true }),
    );
    assert_eq!(refused["error"]["code"], "forbidden", "{refused}");
    let refused = env.call_as(
        "ci-manager",
        1,
        Method::MessagesPost,
        json!({ "channel": "home-docs-manager", "topic": "hi", "body": "psst", "create_topic": true }),
    );
    assert_eq!(refused["error"]["code"], "forbidden", "{refused}");
    let audit = env.json(&["audit"]);
    let entries: Vec<&Value> =
        audit["entries"].as_array().unwrap().iter().filter(|e| e["action"] == "messages.post.refused").collect();
    assert_eq!(entries.len(), 2, "{audit}");
    assert!(entries.iter().all(|e| e["actor"] == "ci-manager"), "{audit}");
    let targets: Vec<&str> = entries.iter().map(|e| e["target"].as_str().unwrap()).collect();
    assert!(targets.contains(&"#announcements") && targets.contains(&"#home-docs-manager"), "{targets:?}");
    // Nothing of the refused posts was stored.
    assert!(env.messages("announcements").iter().all(|m| m["body"] != "hello everyone"));
}

#[test]
fn a_concurrent_approve_and_deny_have_one_winner() {
    let (env, id) = started_with_request(&[]);
    let approve = env.command(&["--json", "approve", &id]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let deny =
        env.command(&["--json", "deny", &id, "--reason", "race"]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let (a, d) = (approve.wait_with_output().unwrap(), deny.wait_with_output().unwrap());
    assert_eq!(
        [a.status.success(), d.status.success()].iter().filter(|ok| **ok).count(),
        1,
        "exactly one decision wins"
    );
    let state = env.requests()[0]["state"].as_str().unwrap().to_owned();
    assert!(state == "spawned" || state == "denied", "{state}");
}

#[test]
fn an_expired_request_cannot_be_approved() {
    // A request is marked expired when it is touched (or by the daemon's periodic check),
    // so it still lists as pending after its 1 ms; the approval comes later than that.
    let (env, id) = started_with_request(&[("request_ttl = \"1day\"", "request_ttl = \"1ms\"")]);
    let err = env.refused(&["approve", &id]);
    assert_eq!(err["code"], "conflict");
    assert!(err["message"].as_str().unwrap().contains("expired"), "{err}");
}

#[test]
fn policy_limits_refuse_with_their_name() {
    let (env, _) = started_with_request(&[("max_children = 8", "max_children = 1")]);
    let second = env.call_as(
        "ci-manager",
        1,
        Method::SpawnRequest,
        json!({ "handle": "second", "name": "Second", "charter": "x", "reason": "y" }),
    );
    assert_eq!(second["error"]["code"], "limit_exceeded", "{second}");
    assert!(second["error"]["message"].as_str().unwrap().contains("policy.max_children"), "{second}");
    let taken = env.call_as(
        "ci-manager",
        1,
        Method::SpawnRequest,
        json!({ "handle": "supervisor", "name": "S", "charter": "x", "reason": "y" }),
    );
    assert_eq!(taken["error"]["code"], "conflict", "{taken}");
    let reserved = env.call_as(
        "ci-manager",
        1,
        Method::SpawnRequest,
        json!({ "handle": "all", "name": "A", "charter": "x", "reason": "y" }),
    );
    assert_eq!(reserved["error"]["code"], "invalid_argument", "{reserved}");
}

#[test]
fn despawn_stops_a_subtree_and_refuses_non_descendants() {
    let env = TestEnv::started_with(QUICK);
    env.create_scripted("lead", "");
    let child_script = env.dir.path().join("child.toml");
    std::fs::write(&child_script, "").unwrap();
    let script = child_script.display().to_string();
    env.json(&["agents", "create", "--handle", "child", "--name", "Child", "--parent", "lead", "--script", &script]);
    env.json(&[
        "agents",
        "create",
        "--handle",
        "grandchild",
        "--name",
        "Grandchild",
        "--parent",
        "child",
        "--script",
        &script,
    ]);
    env.create_scripted("peer", "");
    let pids: Vec<u32> = ["child", "grandchild"].iter().map(|h| env.wait_harness_pid(h, 1)).collect();

    let refused = env.call_as("peer", 1, Method::AgentsDespawn, json!({ "handle": "child" }));
    assert_eq!(refused["error"]["code"], "forbidden", "{refused}");
    let refused = env.call_as("child", 1, Method::AgentsDespawn, json!({ "handle": "lead" }));
    assert_eq!(refused["error"]["code"], "forbidden", "an agent may not despawn its parent: {refused}");

    let done = env.call_as("lead", 1, Method::AgentsDespawn, json!({ "handle": "child" }));
    assert_eq!(done["ok"]["despawned"], json!(["child", "grandchild"]), "{done}");
    for pid in pids {
        crate::assert_eventually!(!alive(pid), "a despawned session kept running");
    }
    assert_eq!(env.roster_entry("grandchild")["presence"], "despawned");
    assert!(env.messages("home-lead").iter().any(|m| m["body"].as_str().unwrap().contains("despawned @child")));
    let err = env.refused(&["agents", "despawn", "supervisor"]);
    assert_eq!(err["code"], "forbidden");
}
