//! Confinement end to end: a Manager with a pending spawn request attacks from inside its
//! session, through the scripted harness's `shell` action, the real Claude Code CLI's Bash
//! tool, the real Codex CLI's shell tool and omp's and pi's `bash` (the model faked). Each attempt (read every
//! secret file of the data directory by relative and absolute path, read another agent's
//! directory, the daemon's `/proc` entry, write a sysctl, connect to the NATS port, kill the
//! daemon, run `canopy approve` on its own request) fails; the request stays pending, no account is
//! created, nothing in the audit approves it and no secret reaches the model; a file written
//! in its own working directory exists; its own MCP tools still work.
//!
//! Also: `[sandbox] mode = "off"` is loud (daemon log, doctor, roster), and `required` on a
//! machine where the sandbox cannot be built (a missing `bwrap`) starts nothing and tells the
//! operator why.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::env::{CANOPY, TestEnv};

const QUICK: &[(&str, &str)] = &[
    ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
    ("quiet_window = \"2s\"", "quiet_window = \"100ms\""),
    ("resync = \"5s\"", "resync = \"500ms\""),
];

/// The secret files at the data directory's root, as the issue lists them.
const SECRETS: &[&str] = &[
    "operator.token",
    "credentials/runners/embedded.json",
    "credentials/nats-operator.json",
    "credentials/nats-daemon.json",
    "session.secret",
    "daemon.json",
    "canopy.db",
    "canopy.toml",
];

/// The attacks, each a shell command meant to fail, run from the attacker's working
/// directory `<data>/sessions/<attacker>/work`.
fn attacks(env: &TestEnv, victim: &str) -> Vec<String> {
    let data = env.data_dir();
    let data = data.display();
    let daemon = env.daemon.as_ref().map(std::process::Child::id).unwrap_or(1);
    let nats_port = env.nats_url().rsplit(':').next().unwrap_or_default().to_owned();
    let mut attacks = Vec::new();
    for secret in SECRETS {
        attacks.push(format!("cat ../../../{secret}"));
        attacks.push(format!("cat {data}/{secret}"));
    }
    attacks.extend([
        format!("ls {data}/nats"),
        "ls ../../../nats".to_owned(),
        format!("ls {data}/sessions/{victim}"),
        format!("cat {data}/sessions/{victim}/1/transcript.jsonl"),
        format!("cat /proc/{daemon}/environ"),
        format!("cat /proc/{daemon}/cmdline"),
        format!("ls -l /proc/{daemon}/cwd"),
        format!("bash -c 'exec 3<>/dev/tcp/127.0.0.1/{nats_port}'"),
        format!("kill -9 {daemon}"),
        // Rewrites a sysctl with its own value: harmless if it ever got through.
        "v=$(cat /proc/sys/kernel/printk_ratelimit) && echo $v > /proc/sys/kernel/printk_ratelimit".to_owned(),
        format!("{CANOPY} --dir ../../.. approve req-1"),
        format!("{CANOPY} --dir {data} approve req-1"),
    ]);
    attacks
}

/// What must hold after the attacks: still pending, no account, no approval in the audit,
/// the proof file in its own working directory, the daemon alive.
fn assert_gate_held(env: &TestEnv, attacker: &str) {
    let requests = env.json(&["requests", "--state", "pending"]);
    let pending = requests["requests"].as_array().cloned().unwrap_or_default();
    assert!(pending.iter().any(|r| r["handle"] == "flaky" && r["state"] == "pending"), "{requests}");
    let agents = env.json(&["agents", "list"]);
    let handles: Vec<&str> = agents["agents"].as_array().unwrap().iter().filter_map(|a| a["handle"].as_str()).collect();
    assert!(!handles.contains(&"flaky"), "the child exists: {handles:?}");
    let audit = env.ok(&["--json", "audit"]);
    assert!(!audit.contains("\"spawn.approve\""), "{audit}");
    let proof = env.data_dir().join("sessions").join(attacker).join("work/proof.txt");
    crate::assert_eventually!(proof.exists(), "the attacker could not write its own working directory");
    assert_eq!(std::fs::read_to_string(&proof).unwrap().trim(), "mine");
    assert!(!env.ok(&["whoami"]).is_empty(), "the daemon died");
}

/// Every secret's text, to look for in what the model was sent.
fn secret_texts(data: &Path) -> Vec<String> {
    let mut texts: Vec<String> = ["operator.token", "session.secret"]
        .iter()
        .map(|name| std::fs::read_to_string(data.join(name)).unwrap().trim().to_owned())
        .collect();
    let runner: Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("credentials/runners/embedded.json")).unwrap())
            .unwrap();
    texts.push(runner["token"].as_str().unwrap().to_owned());
    texts.push(runner["nats"]["password"].as_str().unwrap().to_owned());
    texts
}

#[test]
fn a_scripted_manager_with_a_shell_cannot_reach_secrets_the_daemon_nats_or_approve_itself() {
    let env = TestEnv::started_with(QUICK);
    start_victim(&env);
    let mut script = String::from(
        "[[rule]]\nmatch = { kind = \"start\" }\nactions = [\n  { call = \"agents_spawn_peer\", args = { handle = \
         \"flaky\", name = \"Flaky Tests Manager\", charter = \"Hunt down flaky tests\", reason = \"CI is red\" } },\n",
    );
    for attack in attacks(&env, "victim") {
        script.push_str(&format!("  {{ shell = {}, expect = \"fail\" }},\n", json!(attack)));
    }
    script.push_str("  { shell = \"echo mine > proof.txt\", expect = \"ok\" },\n");
    script.push_str(
        "  { call = \"comms_post_message\", args = { channel = \"{home}\", topic = \"attack\", body = \"done \
         attacking\", create_topic = true } },\n]\n",
    );
    env.create_scripted("attacker", &script);
    crate::assert_eventually!(
        env.messages("home-attacker").iter().any(|m| m["body"] == "done attacking"),
        "the attacker's own MCP tools did not work after the attacks"
    );
    let transcript = crate::delivery::transcript(&env, "attacker");
    let shells: Vec<&Value> = transcript.iter().filter(|t| t["kind"] == "shell").collect();
    assert_eq!(shells.len(), attacks(&env, "victim").len() + 1, "{transcript:#?}");
    for shell in &shells {
        assert_eq!(shell["met"], true, "an attack went otherwise than meant: {shell:#}");
    }
    let secrets = secret_texts(&env.data_dir());
    for shell in &shells {
        for secret in &secrets {
            assert!(!shell["output"].as_str().unwrap_or_default().contains(secret.as_str()), "{shell:#}");
        }
    }
    assert_gate_held(&env, "attacker");
}

/// One step of a fake model's attack: a call of Canopy's tool, a shell command, or text.
enum Step {
    Tool(&'static str, Value),
    Shell(String),
    Text(&'static str),
}

/// What the faked model does: ask for a child, attack, prove it can write its own working
/// directory, post through its own MCP tools, stop.
fn model_steps(env: &TestEnv) -> Vec<Step> {
    let mut steps = vec![Step::Tool(
        "agents_spawn_peer",
        json!({"handle": "flaky", "name": "Flaky Tests Manager", "charter": "Hunt down flaky tests", "reason": "CI is red"}),
    )];
    steps.extend(attacks(env, "victim").into_iter().map(Step::Shell));
    steps.push(Step::Shell("echo mine > proof.txt".into()));
    steps.push(Step::Tool(
        "comms_post_message",
        json!({"channel": "home-attacker", "topic": "attack", "body": "done attacking", "create_topic": true}),
    ));
    steps.push(Step::Text("done"));
    steps
}

/// Starts the victim, queues the model's attack (`queue` turns each step into the fake
/// model's reply), creates the attacker on `harness`, then checks that its tools worked, no
/// secret reached the model (`requests` waits for that many) and the gate held.
fn model_attack(env: &TestEnv, harness: &str, queue: impl Fn(Step), requests: impl Fn(usize) -> Vec<Value>) {
    start_victim(env);
    let steps = model_steps(env);
    let count = steps.len();
    steps.into_iter().for_each(queue);
    env.json(&["agents", "create", "--handle", "attacker", "--name", "attacker", "--harness", harness]);
    crate::assert_eventually!(
        env.messages("home-attacker").iter().any(|m| m["body"] == "done attacking"),
        "the attacker's MCP tools did not work: {:?}",
        env.activity("attacker")
    );
    let sent = serde_json::to_string(&requests(count)).unwrap();
    for secret in secret_texts(&env.data_dir()) {
        assert!(!sent.contains(&secret), "a secret reached the model");
    }
    assert_gate_held(env, "attacker");
}

/// A victim whose session directory exists (it runs the scripted harness).
fn start_victim(env: &TestEnv) {
    env.create_scripted("victim", "");
    env.wait_harness_pid("victim", 1);
}

#[test]
fn a_claude_code_manager_s_bash_tool_cannot_reach_secrets_or_approve_itself() {
    use crate::fake_anthropic::{FakeAnthropic, Reply};
    let fake = FakeAnthropic::start(Vec::new());
    let env = crate::claude::claude_env_with(&fake, &[]);
    let queue = |step| {
        fake.push(match step {
            Step::Tool(name, args) => Reply::canopy_tool(name, args),
            Step::Shell(command) => {
                Reply::default().and_call("Bash", json!({ "command": command, "description": "x" }))
            }
            Step::Text(text) => Reply::text(text),
        })
    };
    model_attack(&env, "claude", queue, |n| fake.wait_requests(n, Duration::from_secs(60)));
}

#[test]
fn a_codex_manager_s_shell_tool_cannot_reach_secrets_or_approve_itself() {
    use crate::fake_openai::{FakeOpenAi, Reply};
    let fake = FakeOpenAi::start(Vec::new());
    let env = crate::codex::started(&fake, &[]);
    let queue = |step| {
        fake.push(match step {
            Step::Tool(name, args) => Reply::canopy_tool(name, args),
            Step::Shell(command) => Reply::shell(&command),
            Step::Text(text) => Reply::text(text),
        })
    };
    model_attack(&env, "codex", queue, |n| fake.wait_requests(n, Duration::from_secs(60)));
}

#[test]
fn an_omp_manager_s_bash_tool_cannot_reach_secrets_or_approve_itself() {
    use crate::fake_anthropic::{FakeAnthropic, Reply};
    let fake = FakeAnthropic::start(Vec::new());
    let env = crate::omp::omp_env(&fake);
    let queue = |step| {
        fake.push(match step {
            Step::Tool(name, args) => Reply::default().and_call(&format!("mcp__canopy_{name}"), args),
            Step::Shell(command) => Reply::default().and_call("bash", json!({ "command": command, "i": "x" })),
            Step::Text(text) => Reply::text(text),
        })
    };
    model_attack(&env, "omp", queue, |n| fake.wait_requests(n, Duration::from_secs(60)));
}

#[test]
fn a_pi_manager_s_bash_tool_cannot_reach_secrets_or_approve_itself() {
    use crate::fake_anthropic::{FakeAnthropic, Reply};
    let fake = FakeAnthropic::start(Vec::new());
    let env = crate::pi::pi_env(&fake);
    let queue = |step| {
        fake.push(match step {
            // pi's tools through Canopy's extension keep their own names.
            Step::Tool(name, args) => Reply::default().and_call(name, args),
            Step::Shell(command) => Reply::default().and_call("bash", json!({ "command": command })),
            Step::Text(text) => Reply::text(text),
        })
    };
    model_attack(&env, "pi", queue, |n| fake.wait_requests(n, Duration::from_secs(60)));
}

#[test]
fn mode_off_is_loud_in_the_daemon_log_doctor_and_the_roster() {
    let mut edits = QUICK.to_vec();
    edits.push(("mode = \"required\"", "mode = \"off\""));
    let env = TestEnv::started_with(&edits);
    env.create_scripted("loose", "");
    env.wait_harness_pid("loose", 1);
    assert!(env.daemon_log().contains("sessions run unconfined"), "{}", env.daemon_log());
    let roster = env.roster_entry("loose");
    assert_eq!(roster["unconfined"], true, "{roster}");
    assert!(env.ok(&["roster"]).contains("unconfined"), "{}", env.ok(&["roster"]));
    let doctor = env.run(&["doctor"]);
    let text = crate::env::text(&doctor.stdout);
    assert!(text.lines().any(|l| l.starts_with("WARNING sandbox") && l.contains("unconfined")), "{text}");
}

#[test]
fn a_required_sandbox_that_cannot_be_built_starts_nothing_and_says_why() {
    let mut edits = QUICK.to_vec();
    edits.push(("bwrap = \"bwrap\"", "bwrap = \"/nonexistent/bwrap\""));
    let env = TestEnv::started_with(&edits);
    env.create_scripted("boxed", "");
    crate::assert_eventually!(
        env.roster_entry("boxed")["presence"] == "failing",
        "the session was not stopped: {}",
        env.roster_entry("boxed")
    );
    let roster = env.roster_entry("boxed");
    let reason = roster["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("cannot be confined") && reason.contains("/nonexistent/bwrap"), "{roster}");
    let notice = env.messages("home-boxed");
    assert!(
        notice.iter().any(|m| m["body"].as_str().unwrap_or_default().contains("was stopped")
            && m["body"].as_str().unwrap_or_default().contains("cannot be confined")),
        "{notice:#?}"
    );
    // Nothing ran: no harness was ever ready.
    assert!(!env.activity("boxed").iter().any(|a| a["kind"] == "session_ready"), "{:?}", env.activity("boxed"));
    let doctor = env.run(&["doctor"]);
    assert_eq!(doctor.status.code(), Some(69), "{}", crate::env::text(&doctor.stdout));
    assert!(crate::env::text(&doctor.stdout).contains("MISSING sandbox"), "{}", crate::env::text(&doctor.stdout));
}

#[test]
fn a_grant_that_would_expose_the_data_directory_stops_the_daemon_with_exit_64() {
    let env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    let parent = env.data_dir().parent().unwrap().display().to_string();
    env.edit_config(&[("read_only = []", &format!("read_only = [{parent:?}]"))]);
    let out = env.run(&["daemon", "--nats-url", &env.nats_url()]);
    assert_eq!(out.status.code(), Some(64), "{}", crate::env::text(&out.stderr));
    let stderr = crate::env::text(&out.stderr);
    assert!(stderr.contains("sandbox.read_only[0]") && stderr.contains("contains the data directory"), "{stderr}");
}
