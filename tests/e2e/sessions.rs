//! Sessions end to end: the scripted harness calling tools over MCP as its agent, token
//! binding, restarts and crash loops, graceful stop, watch and roster, two runners.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::env::{TestEnv, alive, signal};

/// Faster restarts and crash loops than the defaults, so tests finish quickly.
pub const FAST: &[(&str, &str)] = &[
    ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
    ("restart_backoff_min = \"500ms\"", "restart_backoff_min = \"100ms\""),
    ("crash_loop_count = 5", "crash_loop_count = 3"),
];

impl TestEnv {
    pub fn roster_entry(&self, handle: &str) -> Value {
        let roster = self.json(&["roster"]);
        roster["agents"].as_array().unwrap().iter().find(|a| a["handle"] == handle).cloned().unwrap_or(Value::Null)
    }

    pub fn activity(&self, handle: &str) -> Vec<Value> {
        let out = self.ok(&["--json", "watch", handle, "--no-follow", "--tail", "1000"]);
        out.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// The pid of the agent's current harness, once its session is ready.
    fn harness_pid(&self, handle: &str, incarnation: u64) -> Option<u32> {
        self.activity(handle)
            .iter()
            .rev()
            // Its own sessions only: the watch of a Manager also shows its runs.
            .find(|i| i["kind"] == "session_ready" && i["incarnation"] == incarnation && i["agent"] == handle)
            .and_then(|i| i["detail"]["pid"].as_u64())
            .map(|p| p as u32)
    }

    pub fn wait_harness_pid(&self, handle: &str, incarnation: u64) -> u32 {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(pid) = self.harness_pid(handle, incarnation) {
                return pid;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{handle} session {incarnation} never became ready: {:?}",
                self.activity(handle)
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    pub fn script(&self, name: &str, text: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    pub fn create_scripted(&self, handle: &str, script: &str) {
        let path = self.script(&format!("{handle}.toml"), script);
        self.json(&["agents", "create", "--handle", handle, "--name", handle, "--script", &path]);
    }

    /// Waits until `handle` is idle with nothing pending: every message it was owed is in its
    /// context (cursor or injection recorded), so none can be delivered again. What a test
    /// checks after this is final, without waiting on a timer.
    pub fn settled(&self, handle: &str) {
        crate::assert_eventually!(
            {
                let entry = self.roster_entry(handle);
                (entry["presence"] == "idle" || entry["presence"] == "waiting_approval") && entry["pending"] == 0
            },
            "{handle} never settled: {}",
            self.roster_entry(handle)
        );
    }

    pub fn messages(&self, channel: &str) -> Vec<Value> {
        let page = self.json(&["read", "--channel", channel, "--limit", "1000"]);
        page["groups"].as_array().unwrap().iter().flat_map(|g| g["messages"].as_array().unwrap().clone()).collect()
    }
}

/// The environment of a process: what its harness was given.
pub fn process_env(pid: u32) -> HashMap<String, String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    raw.split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok()?.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}

const POSTS_HELLO: &str = r#"
[[rule]]
match = { kind = "start" }
actions = [{ call = "comms_post_message", args = { channel = "{home}", topic = "hello", body = "hi from {self}", create_topic = true } }]
"#;

#[test]
fn a_script_that_posts_on_its_first_turn_produces_that_message_as_its_agent() {
    let env = TestEnv::started_with(FAST);
    env.create_scripted("poster", POSTS_HELLO);
    crate::assert_eventually!(
        env.messages("home-poster").iter().any(|m| m["body"] == "hi from poster"),
        "the scripted session did not post"
    );
    let message = env.messages("home-poster").into_iter().find(|m| m["body"] == "hi from poster").unwrap();
    assert_eq!(message["sender"]["handle"], "poster");
    assert_eq!(message["sender"]["kind"], "agent");
    assert_eq!(message["topic"], "hello");

    // The transcript shows the system prompt and the first input the harness received.
    let transcript = std::fs::read_to_string(env.data_dir().join("sessions/poster/1/transcript.jsonl")).unwrap();
    let first: Value = serde_json::from_str(transcript.lines().next().unwrap()).unwrap();
    assert_eq!(first["kind"], "system_prompt");
    assert!(first["text"].as_str().unwrap().contains("You are a Manager"), "{first}");
    assert!(transcript.contains("\"position\":0"), "{transcript}");
}

#[test]
fn a_session_token_acts_only_as_its_own_agent() {
    let env = TestEnv::started_with(FAST);
    env.create_scripted("beta", "");
    env.create_scripted(
        "alpha",
        r#"
[[rule]]
match = { kind = "start" }
actions = [
  { call = "comms_post_message", args = { channel = "home-beta", topic = "t", body = "alpha writing in beta's home", create_topic = true } },
  { call = "comms_post_message", args = { channel = "home-alpha", topic = "t", body = "alpha at home", create_topic = true } },
]
"#,
    );
    crate::assert_eventually!(env.messages("home-alpha").len() == 1, "alpha did not post at home");
    assert!(env.messages("home-beta").is_empty(), "alpha's token posted in beta's home channel");
    let refused = env
        .activity("alpha")
        .into_iter()
        .find(|i| i["kind"] == "tool_failed")
        .unwrap_or_else(|| panic!("no failed tool call in alpha's activity"));
    assert_eq!(refused["detail"]["output"]["error"]["code"], "forbidden", "{refused}");

    // Straight at the MCP endpoint: alpha's token is alpha; a forged or missing token is refused.
    let pid = env.wait_harness_pid("alpha", 1);
    let harness = process_env(pid);
    let url = harness["CANOPY_MCP_URL"].clone();
    let token = harness["CANOPY_MCP_TOKEN"].clone();
    env.rt.block_on(async {
        let mut client = canopy_scripted::mcp::McpClient::new(&url, &token).unwrap();
        let posted = client
            .call_tool(
                "comms_post_message",
                serde_json::json!({ "channel": "home-alpha", "topic": "t", "body": "direct" }),
            )
            .await
            .unwrap();
        assert!(!posted.is_error, "{:?}", posted.output);
        assert_eq!(posted.output["message"]["sender"]["handle"], "alpha");
        let spoof = client
            .call_tool(
                "comms_post_message",
                serde_json::json!({ "channel": "home-alpha", "topic": "t", "body": "x", "sender": "beta" }),
            )
            .await
            .unwrap();
        assert!(spoof.is_error, "an argument named the caller and was accepted");
        assert_eq!(spoof.output["error"]["code"], "invalid_argument");

        let mut forged = canopy_scripted::mcp::McpClient::new(&url, "cns_forged").unwrap();
        let err = forged.list_tools().await.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("401"), "a forged token was not refused: {err}");
        let operator = env.token();
        let mut operator_client = canopy_scripted::mcp::McpClient::new(&url, &operator).unwrap();
        assert!(operator_client.list_tools().await.is_err(), "the MCP endpoint serves sessions only");
    });
}

#[test]
fn an_official_mcp_client_lists_and_calls_the_tools() {
    let env = TestEnv::started_with(FAST);
    env.create_scripted("ci-manager", "");
    let pid = env.wait_harness_pid("ci-manager", 1);
    let harness = process_env(pid);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/mcp_client.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(&harness["CANOPY_MCP_URL"])
        .arg(&harness["CANOPY_MCP_TOKEN"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Python MCP client failed (scripts/test.sh installs it with pip): {}{}",
        crate::env::text(&out.stdout),
        crate::env::text(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tools: Vec<&str> = result["tools"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    for tool in canopy_tools::TOOL_NAMES.iter() {
        assert!(tools.contains(tool), "{tool} missing from {tools:?}");
    }
    assert_eq!(result["post"]["message"]["sender"]["handle"], "ci-manager");
    assert_eq!(result["post_is_error"], false);
    assert_eq!(result["bad"]["error"]["code"], "not_found", "{}", result["bad"]);
    assert_eq!(result["bad_is_error"], true, "a refusal must be an MCP tool error");
    assert!(env.messages("home-ci-manager").iter().any(|m| m["body"] == "posted by the python mcp client"));
}

#[test]
fn a_killed_harness_restarts_with_the_next_incarnation() {
    let env = TestEnv::started_with(FAST);
    // This rule runs at every session start (a start rule otherwise runs once per agent).
    let every_start = POSTS_HELLO.replace("actions = [", "every_start = true\nactions = [");
    env.create_scripted("worker", &every_start);
    let first = env.wait_harness_pid("worker", 1);
    crate::assert_eventually!(
        env.messages("home-worker").iter().any(|m| m["body"] == "hi from worker"),
        "the first session did not run its first turn"
    );
    signal(first, canopy_sys::SIGKILL);
    let second = env.wait_harness_pid("worker", 2);
    assert_ne!(first, second);
    crate::assert_eventually!(env.roster_entry("worker")["incarnation"] == 2, "the roster did not move to session 2");
    crate::assert_eventually!(
        env.messages("home-worker").iter().filter(|m| m["body"] == "hi from worker").count() == 2,
        "the restarted session did not run its first turn"
    );
}

#[test]
fn a_script_that_always_crashes_ends_crashed_with_a_notice() {
    let env = TestEnv::started_with(FAST);
    env.create_scripted("doomed", "[[rule]]\nactions = [{ crash = true }]\n");
    crate::assert_eventually!(
        env.roster_entry("doomed")["presence"] == "crashed",
        "the crash loop was not detected: {}",
        env.roster_entry("doomed")
    );
    let notices = env.messages("home-doomed");
    let notice = notices.iter().find(|m| m["sender"]["handle"] == "canopy").unwrap_or_else(|| panic!("{notices:?}"));
    assert_eq!(notice["sender"]["kind"], "system");
    assert!(notice["body"].as_str().unwrap().contains("canopy agents start doomed"), "{notice}");
    assert_eq!(env.json(&["agents", "show", "doomed"])["account"]["state"], "crashed");
    // It stays down: no new session is started while the agent is crashed. A new agent makes
    // the runner sync and place it; once that session runs, placement has passed doomed over.
    let incarnation = env.roster_entry("doomed")["incarnation"].clone();
    env.create_scripted("witness", "");
    env.wait_harness_pid("witness", 1);
    assert_eq!(env.roster_entry("doomed")["incarnation"], incarnation);
}

#[test]
fn stop_and_start_an_agent() {
    let env = TestEnv::started_with(FAST);
    env.create_scripted("sleeper", "");
    let pid = env.wait_harness_pid("sleeper", 1);
    let stopped = env.json(&["agents", "stop", "sleeper"]);
    assert_eq!(stopped["desired"], "stopped");
    crate::assert_eventually!(!alive(pid), "the harness survived `agents stop`");
    assert_eq!(env.roster_entry("sleeper")["presence"], "offline");
    env.json(&["agents", "start", "sleeper"]);
    env.wait_harness_pid("sleeper", 2);
}

#[test]
fn sigterm_stops_every_harness_within_the_grace_period() {
    let mut env = TestEnv::started_with(FAST);
    env.create_scripted("one", "");
    env.create_scripted("two", "[[rule]]\nactions = [{ sleep = \"60s\" }]\n");
    let pids = [env.wait_harness_pid("supervisor", 1), env.wait_harness_pid("one", 1), env.wait_harness_pid("two", 1)];
    let started = std::time::Instant::now();
    assert_eq!(env.stop_daemon(), Some(0), "{}", env.daemon_log());
    // stop_grace is 3s: shutdown line, grace, SIGTERM, grace, SIGKILL.
    assert!(started.elapsed() < Duration::from_secs(3 * 3 + 5), "stopping took {:?}", started.elapsed());
    for pid in pids {
        assert!(!alive(pid), "harness {pid} outlived the daemon");
    }
}

#[test]
fn kill_9_of_the_daemon_takes_its_harnesses_along() {
    let mut env = TestEnv::started_with(FAST);
    let pid = env.wait_harness_pid("supervisor", 1);
    env.kill_daemon();
    crate::assert_eventually!(!alive(pid), "harness {pid} outlived a kill -9 of the daemon");
}

#[test]
fn watch_shows_tool_calls_as_they_happen_and_roster_shows_presence() {
    let env = TestEnv::started_with(FAST);
    env.create_scripted(
        "slow",
        r#"
[[rule]]
match = { kind = "start" }
actions = [
  { sleep = "1500ms" },
  { call = "comms_list_channels" },
  { say = "done looking" },
]
"#,
    );
    let mut watch = env
        .command(&["--json", "watch", "slow", "--tail", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(value) = serde_json::from_str(&line) {
                let _ = tx.send(value);
            }
        }
    });
    crate::assert_eventually!(env.roster_entry("slow")["presence"] == "working", "never saw slow working");
    let mut kinds = Vec::new();
    while let Ok(item) = rx.recv_timeout(Duration::from_secs(10)) {
        let kind = item["kind"].as_str().unwrap().to_owned();
        let summary = item["summary"].as_str().unwrap().to_owned();
        kinds.push(format!("{kind}: {summary}"));
        if kind == "turn_ended" {
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(kinds.iter().any(|k| k.starts_with("tool_running: ▶ comms_list_channels")), "{kinds:?}");
    assert!(kinds.iter().any(|k| k.starts_with("tool_result: ✓ comms_list_channels")), "{kinds:?}");
    assert!(kinds.iter().any(|k| k == "text: done looking"), "{kinds:?}");
    crate::assert_eventually!(env.roster_entry("slow")["presence"] == "idle", "slow never went idle");
    assert_eq!(env.roster_entry("slow")["reason"], "waiting for its next input");
}

#[test]
fn a_silent_working_session_is_marked_stalled_and_the_operator_told() {
    let env = TestEnv::started_with(&[FAST, &[("stall_after = \"10m\"", "stall_after = \"1s\"")]].concat());
    env.create_scripted("stuck", "[[rule]]\nactions = [{ sleep = \"30s\" }]\n");
    crate::assert_eventually!(env.roster_entry("stuck")["presence"] == "stalled", "{}", env.roster_entry("stuck"));
    let notice = env.messages("home-stuck").into_iter().find(|m| m["sender"]["handle"] == "canopy");
    assert!(notice.is_some_and(|n| n["body"].as_str().unwrap().contains("stalled")));
}

#[test]
fn a_bad_script_fails_agents_create_with_its_file_and_line() {
    let env = TestEnv::started();
    let path = env.script("bad.toml", "[[rule]]\nactions = [\n  { say = \"a\", sleep = \"1s\" },\n]\n");
    let err = env.refused(&["agents", "create", "--handle", "x", "--name", "X", "--script", &path]);
    assert_eq!(err["code"], "invalid_argument");
    assert_eq!(err["field"], "script");
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("bad.toml:3"), "{message}");
    let err = env.refused(&["agents", "create", "--handle", "x", "--name", "X", "--harness", "gpt-in-a-box"]);
    assert_eq!(err["field"], "harness");
    assert_eq!(env.json(&["agents", "list"])["agents"].as_array().unwrap().len(), 1, "a refused create wrote an agent");
}

#[test]
fn two_runners_share_one_daemon_and_tools_work_through_each() {
    let env = TestEnv::started_with(FAST);
    env.runner_credential("second");
    // Let the second runner register before agents appear, so placement can use it.
    let mut second = env
        .spawn_registered_runner(env.command(&["runner", "--id", "second", "--nats-url", &env.nats_url()]), "runner2");
    for handle in ["a1", "a2", "a3", "a4"] {
        env.create_scripted(handle, POSTS_HELLO);
    }
    for handle in ["a1", "a2", "a3", "a4"] {
        let home = format!("home-{handle}");
        crate::assert_eventually!(
            env.messages(&home).iter().any(|m| m["body"] == format!("hi from {handle}")),
            "{handle}'s session did not post"
        );
    }
    let runners: std::collections::BTreeSet<String> = env.json(&["roster"])["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["runner"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(runners.len(), 2, "sessions were not spread over both runners: {runners:?}");
    signal(second.0.id(), canopy_sys::SIGTERM);
    let _ = crate::env::wait_timeout(&mut second.0, Duration::from_secs(15));
}

#[test]
fn mcp_over_stdio_serves_the_same_tools_bound_to_its_token() {
    use std::io::Write;
    let env = TestEnv::started_with(FAST);
    env.create_scripted("stdio-user", "");
    let pid = env.wait_harness_pid("stdio-user", 1);
    let harness_env = process_env(pid);
    // The bridge needs nothing but the session's own URL and token: no data directory, no
    // daemon.json, no NATS credential (it runs inside a session's sandbox).
    let empty = tempfile::tempdir().unwrap();
    let mut proxy = std::process::Command::new(crate::env::CANOPY)
        .args(["--dir", &empty.path().display().to_string(), "mcp", "--stdio"])
        .env("CANOPY_MCP_URL", &harness_env["CANOPY_MCP_URL"])
        .env("CANOPY_MCP_TOKEN", &harness_env["CANOPY_MCP_TOKEN"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = proxy.stdin.take().unwrap();
    let mut lines = BufReader::new(proxy.stdout.take().unwrap()).lines();
    let mut request = |message: Value| {
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    };
    request(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "0"}}}));
    let init: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert!(init["result"]["capabilities"]["tools"].is_object(), "{init}");
    request(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    request(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    let list: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(list["result"]["tools"].as_array().unwrap().len(), canopy_tools::TOOL_NAMES.len(), "{list}");
    request(serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "comms_post_message",
        "arguments": {"channel": "home-stdio-user", "topic": "stdio", "body": "over stdio", "create_topic": true}}}));
    let call: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(call["result"]["structuredContent"]["message"]["sender"]["handle"], "stdio-user", "{call}");
    request(serde_json::json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
        "name": "tree_show", "arguments": {"unexpected": true}}}));
    let bad: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(bad["result"]["isError"], true, "{bad}");
    assert_eq!(bad["result"]["structuredContent"]["error"]["code"], "invalid_argument", "{bad}");
    // Messages in a tool result are shown attributed and fenced, like deliveries.
    request(serde_json::json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "comms_list_messages", "arguments": {"channel": "home-stdio-user"}}}));
    let listed: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let text = listed["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("from @stdio-user (manager) in #home-stdio-user > stdio"), "{listed}");
    assert!(text.contains("end of message"), "{listed}");
    assert_eq!(listed["result"]["structuredContent"]["groups"][0]["topic"], "stdio", "{listed}");
    drop(stdin);
    let _ = crate::env::wait_timeout(&mut proxy, Duration::from_secs(10));
}
