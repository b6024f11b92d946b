//! Claude Code end to end: the real `claude` CLI (the pinned version that
//! `scripts/install-harnesses.sh` installs, found through `CANOPY_TEST_CLAUDE_BIN`) run by the
//! real daemon and runner for an agent created with `--harness claude`, against the fake
//! Anthropic API; only the model is faked.
//!
//! Owns the scenarios the Claude adapter promises: the prompt and tools the model sees, a tool
//! call that posts as the agent, turn-start delivery, a steer at a tool boundary, a steer that
//! falls back to the next turn, `canopy agents interrupt` during a model call (the turn ends
//! interrupted, the same session takes the next message), a `kill -9` of the CLI (incarnation
//! 2 resumes the conversation, or starts fresh when the recorded one is missing), an
//! implementer run whose delta rides Claude Code's append mechanism, and a Manager working an
//! issue through the issue tools (a sub-issue for its report, its own issue closed once that
//! one is done). The codec's side of
//! interrupt (cancelled queued steers) is tested at the harness level
//! (`crates/canopy-harness/tests/claude.rs`).

use std::time::Duration;

use serde_json::{Value, json};

use crate::env::{TestEnv, signal};
use crate::fake_anthropic::{FakeAnthropic, Reply, assistant_texts, system_text, tool_names, user_texts};
use crate::harness_bins::claude_bin;

/// A workspace whose sessions run Claude Code against `fake`, with quick delivery timers and
/// a steer timeout long enough to cover one model call (the adapter answers a steer written
/// during a model call once that call's outcome is known).
fn claude_env(fake: &FakeAnthropic) -> TestEnv {
    claude_env_with(fake, &[])
}

/// `claude_env` with more `canopy.toml` edits.
pub(crate) fn claude_env_with(fake: &FakeAnthropic, more: &[(&str, &str)]) -> TestEnv {
    let harness = format!(
        "[harness.claude]\nbin = {bin:?}\nmodel = \"claude-fake\"\n\n[harness.claude.env]\n\
         ANTHROPIC_BASE_URL = {url:?}\nANTHROPIC_API_KEY = \"sk-ant-test\"\n",
        bin = claude_bin().display().to_string(),
        url = fake.base_url(),
    );
    let mut edits: Vec<(&str, &str)> = vec![
        ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
        ("restart_backoff_min = \"500ms\"", "restart_backoff_min = \"100ms\""),
        ("quiet_window = \"2s\"", "quiet_window = \"100ms\""),
        ("resync = \"5s\"", "resync = \"500ms\""),
        ("steer_timeout = \"2s\"", "steer_timeout = \"15s\""),
        ("[harness.claude]\n", &harness),
    ];
    edits.extend_from_slice(more);
    TestEnv::started_with(&edits)
}

fn create_claude_agent(env: &TestEnv, handle: &str) {
    env.json(&["agents", "create", "--handle", handle, "--name", handle, "--harness", "claude"]);
}

/// Waits until the agent shows `presence`.
fn wait_presence(env: &TestEnv, handle: &str, presence: &str) {
    crate::assert_eventually!(
        env.roster_entry(handle)["presence"] == presence,
        "{handle} never became {presence}: {}",
        env.roster_entry(handle)
    );
}

/// How many times `needle` occurs among the user-side texts of `request`.
pub(crate) fn occurrences(request: &Value, needle: &str) -> usize {
    user_texts(request).iter().map(|t| t.matches(needle).count()).sum()
}

/// The request that continues a turn after tool call `call_id` (its tool result is the
/// newest user content).
fn has_tool_result(request: &Value, call_id: &str) -> bool {
    request["messages"].as_array().into_iter().flatten().any(|m| {
        m["content"]
            .as_array()
            .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result" && b["tool_use_id"] == call_id))
    })
}

const PATIENCE: Duration = Duration::from_secs(30);

#[test]
fn the_model_sees_the_session_prompt_and_canopy_tools_and_a_tool_call_posts_as_the_agent() {
    let fake = FakeAnthropic::start(vec![
        Reply::canopy_tool(
            "comms_post_message",
            json!({"channel": "home-cc", "topic": "hello", "body": "hi from claude code", "create_topic": true}),
        ),
        Reply::text("posted my hello"),
    ]);
    let env = claude_env(&fake);
    create_claude_agent(&env, "cc");
    let requests = fake.wait_requests(2, PATIENCE);

    // The system prompt is the session's prompt verbatim, after the CLI's identity line.
    let prompt = std::fs::read_to_string(env.data_dir().join("sessions/cc/1/system-prompt.md")).unwrap();
    assert!(!prompt.trim().is_empty());
    let blocks = requests[0]["system"].as_array().unwrap();
    assert_eq!(blocks.last().unwrap()["text"].as_str().unwrap(), prompt, "{}", system_text(&requests[0]));
    // What the CLI insists on adding, named: one identity block of its own, before ours.
    let added: Vec<&str> = blocks[..blocks.len() - 1].iter().map(|b| b["text"].as_str().unwrap_or_default()).collect();
    assert_eq!(
        added,
        ["You are a Claude agent, built on Anthropic's Claude Agent SDK."],
        "{}",
        system_text(&requests[0])
    );
    // ... and that is Canopy's rendered Manager block-0, exactly what `prompt render` prints.
    let rendered = env.json(&["prompt", "render", "--agent", "cc"]);
    assert_eq!(rendered["text"].as_str().unwrap(), prompt);
    assert_eq!(rendered["session"]["hash"], rendered["hash"]);
    assert!(prompt.starts_with("# You are a Manager"), "{prompt}");
    // Exactly the role's tools are offered: its harness tools, its own subagent tool (the
    // Manager role delegates natively too), and Canopy's under the MCP server's name.
    // Nothing else of the CLI's own.
    let mut tools = tool_names(&requests[0]);
    tools.sort();
    let mut expected: Vec<String> = canopy_tools::TOOL_NAMES.iter().map(|t| format!("mcp__canopy__{t}")).collect();
    expected.extend(["Agent", "Bash", "Read"].map(str::to_owned));
    expected.sort();
    assert_eq!(tools, expected, "the model was offered other tools than the role's");
    // The first input says who the agent is.
    assert!(occurrences(&requests[0], "Session 1 started for cc") == 1, "{}", requests[0]);

    crate::assert_eventually!(
        env.messages("home-cc").iter().any(|m| m["body"] == "hi from claude code"),
        "the tool call did not post: {:?}",
        env.messages("home-cc")
    );
    let message = env.messages("home-cc").into_iter().find(|m| m["body"] == "hi from claude code").unwrap();
    assert_eq!(message["sender"]["handle"], "cc");
    assert_eq!(message["sender"]["kind"], "agent");
    assert_eq!(message["topic"], "hello");
    // The tool result (the post's outcome) went back to the model in the same turn.
    assert!(has_tool_result(&requests[1], "toolu_1_0"), "{}", requests[1]);
    wait_presence(&env, "cc", "idle");

    // The operator's watch shows the turn as normalised events.
    let activity: Vec<Value> = env
        .ok(&["--json", "watch", "cc", "--no-follow", "--tail", "1000"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = activity.iter().filter_map(|a| a["kind"].as_str()).collect();
    for kind in ["session_ready", "turn_started", "tool_running", "tool_result", "text", "usage", "turn_ended"] {
        assert!(kinds.contains(&kind), "no {kind} in {kinds:?}");
    }
    let running = activity.iter().find(|a| a["kind"] == "tool_running").unwrap();
    assert!(running["summary"].as_str().unwrap().contains("mcp__canopy__comms_post_message"), "{running}");
}

#[test]
fn a_message_to_an_idle_claude_agent_starts_a_turn_with_the_fenced_message() {
    let fake = FakeAnthropic::start(vec![Reply::text("ready when you are"), Reply::text("on it")]);
    let env = claude_env(&fake);
    create_claude_agent(&env, "cc");
    fake.wait_requests(1, PATIENCE);
    wait_presence(&env, "cc", "idle");
    let posted =
        env.json(&["post", "--channel", "home-cc", "--topic", "build", "--create-topic", "please check the build"]);
    assert_eq!(posted["outcomes"][0]["outcome"], "woke", "{posted}");
    let requests = fake.wait_requests(2, PATIENCE);
    let text = user_texts(&requests[1]).into_iter().find(|t| t.contains("please check the build"));
    let text = text.unwrap_or_else(|| panic!("the message did not reach the model: {}", requests[1]));
    assert!(text.contains("## #home-cc > build"), "{text}");
    let fence =
        text.lines().find(|l| l.contains(" message ") && l.contains("from @ops")).unwrap_or_else(|| panic!("{text}"));
    let nonce = fence.trim_start_matches('[').split(' ').next().unwrap();
    assert!(nonce.starts_with("canopy-") && text.contains(&format!("[{nonce} end of message")), "{text}");
    wait_presence(&env, "cc", "idle");
    assert_eq!(occurrences(fake.requests().last().unwrap(), "please check the build"), 1, "delivered twice");
}

#[test]
fn a_mention_during_a_tool_call_lands_in_the_same_turn_and_is_reported_steered() {
    // The start turn calls a tool; the model takes its time choosing it, so the post lands
    // while a tool-producing call runs and is taken at that tool's boundary.
    let fake = FakeAnthropic::start(vec![
        Reply::canopy_tool("comms_list_channels", json!({})).after(Duration::from_secs(6)),
        Reply::text("noted the urgent message"),
    ]);
    let env = claude_env(&fake);
    create_claude_agent(&env, "cc");
    fake.wait_requests(1, PATIENCE);
    wait_presence(&env, "cc", "working");
    let posted =
        env.json(&["post", "--channel", "home-cc", "--topic", "now", "--create-topic", "@cc urgent: the build is red"]);
    let outcome = &posted["outcomes"][0];
    assert_eq!(outcome["recipient"], "cc");
    assert_eq!(outcome["outcome"], "steered", "{posted}");

    let requests = fake.wait_requests(2, PATIENCE);
    // The next model request of the same turn: after the tool's result, with the message.
    assert!(has_tool_result(&requests[1], "toolu_1_0"), "{}", requests[1]);
    assert_eq!(occurrences(&requests[1], "urgent: the build is red"), 1, "{}", requests[1]);
    // Delivered once: nothing is pending, so no later turn brings it again.
    env.settled("cc");
    assert_eq!(occurrences(fake.requests().last().unwrap(), "urgent: the build is red"), 1, "delivered twice");
}

#[test]
fn a_mention_during_the_final_model_call_falls_back_and_arrives_at_the_next_turn() {
    let fake = FakeAnthropic::start(vec![
        Reply::text("a long answer").after(Duration::from_secs(6)),
        Reply::text("now about your message"),
    ]);
    let env = claude_env(&fake);
    create_claude_agent(&env, "cc");
    fake.wait_requests(1, PATIENCE);
    wait_presence(&env, "cc", "working");
    let posted = env.json(&["post", "--channel", "home-cc", "--topic", "late", "--create-topic", "@cc one more thing"]);
    let outcome = &posted["outcomes"][0];
    assert_eq!(outcome["recipient"], "cc");
    assert_eq!(outcome["outcome"], "queued", "{posted}");
    assert!(outcome["reason"].as_str().unwrap_or_default().contains("fell back"), "{posted}");

    let requests = fake.wait_requests(2, PATIENCE);
    // A turn of its own: the first turn's answer is history, the message is the new input.
    assert_eq!(occurrences(&requests[0], "one more thing"), 0);
    assert_eq!(occurrences(&requests[1], "one more thing"), 1, "{}", requests[1]);
    env.settled("cc");
    assert_eq!(occurrences(fake.requests().last().unwrap(), "one more thing"), 1, "delivered twice");
}

#[test]
fn canopy_agents_interrupt_ends_a_claude_turn_mid_model_call_and_the_session_takes_the_next_message() {
    // The start turn's model call takes a minute; the operator interrupts it.
    let fake = FakeAnthropic::start(vec![
        Reply::text("a very long answer").after(Duration::from_secs(60)),
        Reply::text("back at your service"),
    ]);
    let env = claude_env(&fake);
    create_claude_agent(&env, "cc");
    let pid = env.wait_harness_pid("cc", 1);
    fake.wait_requests(1, PATIENCE);
    wait_presence(&env, "cc", "working");

    let interrupted = env.json(&["agents", "interrupt", "cc"]);
    assert_eq!(interrupted["interrupted"], true, "{interrupted}");
    assert_eq!(interrupted["incarnation"], 1, "{interrupted}");
    let turn = interrupted["turn_id"].as_str().unwrap().to_owned();
    let ended = |env: &TestEnv| {
        env.activity("cc").into_iter().find(|i| i["kind"] == "turn_ended" && i["turn_id"] == turn.as_str())
    };
    crate::assert_eventually!(ended(&env).is_some(), "the interrupted turn never ended: {:?}", env.activity("cc"));
    assert_eq!(ended(&env).unwrap()["detail"]["status"], "interrupted", "{:?}", ended(&env));
    wait_presence(&env, "cc", "idle");
    assert_eq!(env.json(&["agents", "interrupt", "cc"])["interrupted"], false, "an idle agent was interrupted");

    // Still usable, and still the same session: the next message is a new turn whose request
    // reaches the model.
    env.json(&["post", "--channel", "home-cc", "--topic", "after", "--create-topic", "are you still there"]);
    let requests = fake.wait_requests(2, PATIENCE);
    assert_eq!(occurrences(&requests[1], "are you still there"), 1, "{}", requests[1]);
    crate::assert_eventually!(
        env.activity("cc").iter().any(|i| i["kind"] == "text" && i["summary"] == "back at your service"),
        "the new turn's answer never arrived: {:?}",
        env.activity("cc")
    );
    let started: Vec<Value> = env.activity("cc").into_iter().filter(|i| i["kind"] == "turn_started").collect();
    assert_eq!(started.len(), 2, "{started:?}");
    assert_ne!(started[1]["turn_id"], turn.as_str());
    assert_eq!(env.roster_entry("cc")["incarnation"], 1);
    assert_eq!(env.wait_harness_pid("cc", 1), pid);
    assert!(crate::env::alive(pid), "claude exited");
}

/// The reply to incarnation 1's start turn, which incarnation 2 should remember.
const NOTED: &str = "noted: the code word is heron";

/// Incarnation 1 of `cc` answers its start turn with `NOTED`, then works on a woken turn
/// (whose model call never answers in time) while a plain post waits for the next turn start;
/// then the CLI is killed with SIGKILL. Returns once incarnation 2 runs.
fn kill_claude_mid_turn(env: &TestEnv, fake: &FakeAnthropic) {
    create_claude_agent(env, "cc");
    let first = env.wait_harness_pid("cc", 1);
    fake.wait_requests(1, PATIENCE);
    wait_presence(env, "cc", "idle");
    env.json(&["post", "--channel", "home-cc", "--topic", "job", "--create-topic", "start the long job"]);
    fake.wait_requests(2, PATIENCE);
    wait_presence(env, "cc", "working");
    // Not a mention: it waits for the next turn start, which this session never reaches.
    let posted = env.json(&[
        "post",
        "--channel",
        "home-cc",
        "--topic",
        "queue",
        "--create-topic",
        "the release moved to Monday",
    ]);
    assert_eq!(posted["outcomes"][0]["outcome"], "queued", "{posted}");
    signal(first, canopy_sys::SIGKILL);
    let second = env.wait_harness_pid("cc", 2);
    assert_ne!(first, second);
    crate::assert_eventually!(env.roster_entry("cc")["incarnation"] == 2, "the roster did not move to session 2");
}

/// The replies for `kill_claude_mid_turn`, then `after` for incarnation 2.
fn killed_mid_turn_script(after: Vec<Reply>) -> Vec<Reply> {
    let mut script = vec![Reply::text(NOTED), Reply::text("thinking hard").after(Duration::from_secs(20))];
    script.extend(after);
    script
}

#[test]
fn a_killed_claude_cli_restarts_as_incarnation_2_resumes_its_conversation_and_gets_the_undelivered_message() {
    let fake = FakeAnthropic::start(killed_mid_turn_script(vec![
        Reply::canopy_tool(
            "comms_post_message",
            json!({"channel": "home-cc", "topic": "back", "body": "back after the restart", "create_topic": true}),
        ),
        Reply::text("posted after the restart"),
    ]));
    let env = claude_env(&fake);
    kill_claude_mid_turn(&env, &fake);

    let requests = fake.wait_requests(3, PATIENCE);
    let restarted = &requests[2];
    // The earlier conversation is history (same session id), then the restart's input.
    assert!(assistant_texts(restarted).iter().any(|t| t == NOTED), "{restarted}");
    assert_eq!(occurrences(restarted, "Session 1 started for cc"), 1, "{restarted}");
    assert_eq!(occurrences(restarted, "Session 2 started for cc"), 1, "{restarted}");
    assert_eq!(occurrences(restarted, "the release moved to Monday"), 1, "{restarted}");
    let record = std::fs::read_to_string(env.data_dir().join("sessions/cc/claude-session")).unwrap();
    let transcripts = env.data_dir().join("sessions/cc/claude-config/projects");
    assert!(
        walk(&transcripts).iter().any(|p| p.ends_with(format!("{}.jsonl", record.trim()))),
        "no transcript for {record} under {}",
        transcripts.display()
    );
    // Canopy's tools work in the resumed conversation: the post is the agent's.
    crate::assert_eventually!(
        env.messages("home-cc").iter().any(|m| m["body"] == "back after the restart"),
        "the tool call after the restart did not post: {:?}",
        env.messages("home-cc")
    );
    let message = env.messages("home-cc").into_iter().find(|m| m["body"] == "back after the restart").unwrap();
    assert_eq!(message["sender"]["handle"], "cc");
    assert!(
        !env.activity("cc")
            .iter()
            .any(|a| a["kind"] == "status" && a["summary"].as_str().unwrap_or_default().contains("could not resume"))
    );
}

#[test]
fn a_claude_conversation_that_cannot_be_resumed_starts_fresh_and_the_session_still_works() {
    let fake = FakeAnthropic::start(vec![
        Reply::text(NOTED),
        Reply::canopy_tool(
            "comms_post_message",
            json!({"channel": "home-cc", "topic": "fresh", "body": "fresh but working", "create_topic": true}),
        ),
        Reply::text("posted"),
    ]);
    let env = claude_env(&fake);
    // Point the record at a conversation Claude Code does not have before incarnation 2 starts.
    let record = env.data_dir().join("sessions/cc/claude-session");
    let missing = "0badc0de-0000-4000-8000-000000000000";
    let corrupt = || std::fs::write(&record, missing).unwrap();
    create_claude_agent(&env, "cc");
    fake.wait_requests(1, PATIENCE);
    wait_presence(&env, "cc", "idle");
    corrupt();
    let first = env.wait_harness_pid("cc", 1);
    signal(first, canopy_sys::SIGKILL);
    env.wait_harness_pid("cc", 2);

    let requests = fake.wait_requests(2, PATIENCE);
    let fresh = &requests[1];
    assert!(assistant_texts(fresh).is_empty(), "{fresh}");
    assert_eq!(occurrences(fresh, "Session 1 started for cc"), 0, "{fresh}");
    assert_eq!(occurrences(fresh, "Session 2 started for cc"), 1, "{fresh}");
    crate::assert_eventually!(
        env.messages("home-cc").iter().any(|m| m["body"] == "fresh but working"),
        "the fresh session's tool call did not post"
    );
    let note = env
        .activity("cc")
        .into_iter()
        .find(|a| a["kind"] == "status" && a["summary"].as_str().unwrap_or_default().contains("could not resume"));
    let note = note.unwrap_or_else(|| panic!("no status about the failed resume: {:?}", env.activity("cc")));
    assert!(note["summary"].as_str().unwrap().contains(missing), "{note}");
    assert!(env.data_dir().join("sessions/cc/2/stderr.resume-failed.log").is_file());
    let recorded = std::fs::read_to_string(&record).unwrap();
    assert_ne!(recorded.trim(), missing, "the fresh conversation was recorded");
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn doctor_finds_the_claude_cli_starts_a_session_and_fails_when_a_role_needs_a_missing_harness() {
    let env = TestEnv::new();
    std::fs::create_dir_all(env.data_dir()).unwrap();
    let config = env.data_dir().join("canopy.toml");
    std::fs::write(
        &config,
        format!(
            "[harness.claude]\nbin = {:?}\n\n[harness.claude.env]\nANTHROPIC_API_KEY = \"sk-ant-test\"\n\n\
             [roles.manager]\nharness = \"claude\"\n",
            claude_bin().display().to_string()
        ),
    )
    .unwrap();
    let report = env.json(&["doctor"]);
    assert_eq!(report["ok"], true, "{report}");
    let check = |report: &Value, name: &str| {
        report["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned().unwrap()
    };
    let claude = check(&report, "claude");
    assert_eq!(claude["required"], true);
    assert_eq!(claude["session_starts"], true, "{claude}");
    assert!(claude["version"].as_str().unwrap().contains("2.1.332"), "{claude}");
    assert_eq!(check(&report, "nats-server")["ok"], true);

    // A role that runs a harness this machine lacks makes doctor fail, naming it.
    std::fs::write(&config, "[harness.codex]\nbin = \"/nonexistent/codex\"\n\n[roles.manager]\nharness = \"codex\"\n")
        .unwrap();
    let out = env.run(&["--json", "doctor"]);
    assert_eq!(out.status.code(), Some(69), "{}", crate::env::text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let codex = check(&report, "codex");
    assert_eq!((codex["required"].clone(), codex["ok"].clone()), (json!(true), json!(false)), "{codex}");
    assert!(codex["problem"].as_str().unwrap().contains("harness.codex"), "{codex}");

    // Claude Code without a credential (configured or inherited) cannot reach the model.
    std::fs::write(
        &config,
        format!(
            "[harness.claude]\nbin = {:?}\n\n[roles.manager]\nharness = \"claude\"\n",
            claude_bin().display().to_string()
        ),
    )
    .unwrap();
    let mut command = env.command(&["--json", "doctor"]);
    for key in ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"] {
        command.env_remove(key);
    }
    let out = command.output().unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", crate::env::text(&out.stdout));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let claude = check(&report, "claude");
    assert!(claude["problem"].as_str().unwrap().contains("found, no credential"), "{claude}");
}

#[test]
fn an_implementer_run_on_claude_keeps_the_cli_default_with_the_delta_appended() {
    let fake = FakeAnthropic::start(vec![
        Reply::canopy_tool(
            "agents_run_subagent",
            json!({"definition": "implementer", "brief": "Add a --verbose flag to the build script."}),
        ),
        Reply::text("briefed; waiting for the report"),
        // The run uses Claude Code's own Bash tool, which its role allows.
        Reply::default()
            .and_call("Bash", json!({"command": "echo built > made-by-run.txt", "description": "make a file"})),
        Reply::text("Report: added --verbose; verified with the build script's own test."),
    ]);
    let env = claude_env_with(
        &fake,
        // No [roles.implementer] edit: a run follows its Manager's harness.
        &[],
    );
    create_claude_agent(&env, "lead");
    crate::assert_eventually!(
        fake.requests().iter().any(|r| system_text(r).contains("# You are an implementer")),
        "no request carried the implementer delta: {:#?}",
        fake.requests().iter().map(system_text).collect::<Vec<_>>()
    );
    let requests = fake.requests();

    // The run's request: Claude Code's own default prompt, then Canopy's delta at the very end.
    let run = requests
        .iter()
        .find(|r| system_text(r).contains("# You are an implementer"))
        .unwrap_or_else(|| panic!("no request carried the implementer delta: {requests:#?}"));
    let system = system_text(run);
    let delta = system.find("# You are an implementer").unwrap();
    assert!(delta > 3000, "the CLI's default prompt should come first ({delta} bytes before the delta)");
    assert!(!system.contains("# You are a Manager"), "a run never gets the Manager block-0");
    let appended = std::fs::read_to_string(env.data_dir().join("sessions/run-1/1/system-prompt.md")).unwrap();
    assert!(system.trim_end().ends_with(appended.trim_end()), "the delta is appended at the end");
    assert!(appended.contains("- Parent: @lead"), "{appended}");
    assert!(!appended.contains("Careful coding"), "the delta never copies Canopy's default block-0");
    assert!(occurrences(run, "Add a --verbose flag") == 1, "the brief is the run's first input");
    // The run's tools are the ones its role registers: no comms tools, and Claude Code's own
    // editing tools; the Manager gets the read-only ones and Bash, never Edit.
    let run_tools = tool_names(run);
    assert!(!run_tools.iter().any(|t| t.contains("comms_post_message")), "{run_tools:?}");
    for tool in ["Bash", "Read", "Edit", "Write"] {
        assert!(run_tools.iter().any(|t| t == tool), "{tool} missing from the run's tools {run_tools:?}");
    }
    let manager_tools = tool_names(&requests[0]);
    assert!(
        manager_tools.iter().any(|t| t == "Bash") && !manager_tools.iter().any(|t| t == "Edit"),
        "{manager_tools:?}"
    );
    let made = env.data_dir().join("sessions/run-1/work/made-by-run.txt");
    // The shell creates the file before it writes to it: wait for the content.
    crate::assert_eventually!(
        std::fs::read_to_string(&made).is_ok_and(|t| t.trim() == "built"),
        "the run's Bash call did not run in its working directory"
    );

    // The report reached the Manager at its next turn start.
    crate::assert_eventually!(
        fake.requests().iter().any(|r| occurrences(r, "Subagent run 1 (implementer) finished: done.") > 0),
        "the Manager's next turn did not carry the report"
    );
    assert_eq!(env.json(&["runs", "--agent", "lead"])["runs"][0]["status"], "done");
}

/// A run's role pinned to the scripted stand-in under a Manager on Claude Code: the run ends
/// without a model call, and its report's first line and `canopy runs` say it is scripted.
#[test]
fn a_run_pinned_to_the_scripted_harness_under_a_claude_manager_is_marked_scripted() {
    let fake = FakeAnthropic::start(vec![
        Reply::canopy_tool("agents_run_subagent", json!({"definition": "implementer", "brief": "Try the parser."})),
        Reply::text("briefed; waiting for the report"),
        Reply::text("noted"),
    ]);
    let env = claude_env_with(
        &fake,
        &[("[roles.implementer]\nharness = \"manager\"", "[roles.implementer]\nharness = \"scripted\"")],
    );
    create_claude_agent(&env, "lead");
    let report = env.wait_message("home-lead", "run: 1", "finished");
    let first = report["body"].as_str().unwrap().lines().next().unwrap_or_default().to_owned();
    assert!(first.starts_with("Subagent run 1 (implementer, scripted: no model ran) finished: done."), "{first}");
    assert_eq!(env.json(&["runs", "--agent", "lead"])["runs"][0]["scripted"], true);
    assert!(env.ok(&["runs", "--agent", "lead"]).contains("(scripted: no model ran)"));
    assert!(
        !fake.requests().iter().any(|r| system_text(r).contains("# You are an implementer")),
        "a model ran the run"
    );
}

#[test]
fn a_claude_manager_runs_the_implementer_on_claude_codes_own_agent_tool() {
    let fake = FakeAnthropic::start(vec![
        Reply::default().and_call(
            "Agent",
            json!({"subagent_type": "implementer", "description": "changelog", "prompt": "TASK_MARKER add a changelog entry"}),
        ),
        Reply::text("SUBAGENT_RESULT_MARKER done"),
        Reply::text("delegated"),
    ]);
    let env = claude_env(&fake);
    create_claude_agent(&env, "lead");
    crate::assert_eventually!(
        fake.requests().iter().any(|r| system_text(r).contains("# You are an implementer")),
        "the implementer never ran on Claude Code's Agent tool: {:#?}",
        fake.requests().iter().map(tool_names).collect::<Vec<_>>()
    );
    let requests = fake.requests();
    let manager = &requests[0];
    assert!(tool_names(manager).iter().any(|t| t == "Agent"), "{:?}", tool_names(manager));
    let system = system_text(manager);
    assert!(system.contains("your own subagent tool"), "the Manager is told it has one");
    assert!(!system.contains("Co-Authored-By") && !user_texts(manager).iter().any(|t| t.contains("Co-Authored-By")));
    // Claude Code's definition is the subagent's whole prompt (a replacement, not a splice).
    let sub = requests.iter().find(|r| system_text(r).contains("# You are an implementer")).unwrap();
    assert!(!system_text(sub).contains("# You are a Manager"), "the Manager's prompt is not inherited");
    assert!(occurrences(sub, "TASK_MARKER") > 0, "the brief is the subagent's input");
}

/// A key the model API refuses cannot start working by retrying (Claude Code would retry for
/// minutes): the agent is stopped at once, `failing` with the fix, told once, not restarted.
#[test]
fn a_refused_credential_stops_the_agent_at_once_with_the_fix() {
    let fake = FakeAnthropic::start((0..30).map(|_| Reply::error(401)).collect());
    let env = claude_env(&fake);
    create_claude_agent(&env, "keyless");
    wait_presence(&env, "keyless", "failing");
    let entry = env.roster_entry("keyless");
    let reason = entry["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("refused the credential") && reason.contains("ANTHROPIC_API_KEY"), "{entry}");
    assert!(reason.contains("canopy doctor"), "the fix names doctor: {entry}");
    std::thread::sleep(Duration::from_secs(2));
    let entry = env.roster_entry("keyless");
    assert_eq!(
        (entry["presence"].as_str(), entry["incarnation"].as_u64()),
        (Some("failing"), Some(1)),
        "no restart: {entry}"
    );
    let told: Vec<Value> = env
        .messages("home-keyless")
        .into_iter()
        .filter(|m| m["body"].as_str().unwrap_or_default().contains("refused the credential"))
        .collect();
    assert_eq!(told.len(), 1, "one notice: {told:#?}");
    assert!(fake.requests().len() < 10, "it stopped retrying: {} requests", fake.requests().len());
}

/// Retries that can succeed show: the roster says `failing` and the home channel is told
/// once; the turn then gets through.
#[test]
fn model_api_retries_show_as_failing_and_are_told_once() {
    let fake = FakeAnthropic::start(vec![Reply::error(529), Reply::error(529), Reply::text("through at last")]);
    let env = claude_env(&fake);
    create_claude_agent(&env, "retrier");
    crate::assert_eventually!(
        env.messages("home-retrier").iter().any(|m| m["body"].as_str().unwrap_or_default().contains("is failing")),
        "the operator was not told: {:?}",
        env.messages("home-retrier")
    );
    wait_presence(&env, "retrier", "idle");
    let told = env
        .messages("home-retrier")
        .into_iter()
        .filter(|m| m["body"].as_str().unwrap_or_default().contains("is failing"))
        .count();
    assert_eq!(told, 1, "told once per episode");
}

/// A harness program that is not there cannot appear by retrying: the agent is stopped at
/// once, `failing`, and the reason names the setting and `canopy doctor`.
#[test]
fn a_missing_harness_program_stops_the_agent_naming_its_setting() {
    let env = TestEnv::started_with(&[
        ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
        ("[harness.claude]\n", "[harness.claude]\nbin = \"/nonexistent/claude\"\n"),
    ]);
    create_claude_agent(&env, "nobin");
    wait_presence(&env, "nobin", "failing");
    let entry = env.roster_entry("nobin");
    let reason = entry["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("[harness.claude] bin") && reason.contains("canopy doctor"), "{entry}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(env.roster_entry("nobin")["incarnation"], 1, "no crash loop");
}

/// A report that takes an issue it is given and finishes it.
const FINISHES_ITS_ISSUE: &str = r#"
[[rule]]
match = { kind = "message", text_contains = "gave you #2" }
actions = [
  { call = "issues_update", args = { issue = 2, state = "in_progress", note = "building the form" } },
  { call = "issues_update", args = { issue = 2, state = "done", note = "built", resolution = "The form is on w1's branch." } },
]

[[rule]]
actions = [{ say = "noted" }]
"#;

#[test]
fn a_claude_manager_splits_its_issue_hands_a_sub_issue_to_its_report_and_closes_its_own() {
    let fake = FakeAnthropic::start(Vec::new());
    let env = claude_env(&fake);
    create_claude_agent(&env, "cc");
    let script = env.script("w1.toml", FINISHES_ITS_ISSUE);
    env.json(&["agents", "create", "--handle", "w1", "--name", "w1", "--parent", "cc", "--script", &script]);
    env.settled("cc");
    env.settled("w1");
    // Its next turn: the issue filed for it. Then the turn its sub-issue's close starts.
    for reply in [
        Reply::canopy_tool("issues_update", json!({"issue": 1, "state": "in_progress", "note": "splitting it"})),
        Reply::canopy_tool("issues_create", json!({"title": "Login form", "parent": 1, "body": "The form only."})),
        Reply::canopy_tool("issues_assign", json!({"issue": 2, "owner": "w1", "note": "yours"})),
        Reply::text("the form is w1's"),
        Reply::canopy_tool(
            "issues_update",
            json!({"issue": 1, "state": "done", "note": "the form was the last part", "resolution": "Login ships with w1's form."}),
        ),
        Reply::text("closed #1"),
    ] {
        fake.push(reply);
    }
    let filed = env.json(&["issues", "new", "--title", "Ship the login page", "--assign", "cc"]);
    assert_eq!(filed["number"], 1, "{filed}");
    crate::assert_eventually!(
        env.json(&["issues", "show", "1"])["issue"]["state"] == "done",
        "cc never closed #1: {}",
        env.json(&["issues", "show", "1"])
    );
    let one = env.json(&["issues", "show", "1"]);
    assert_eq!(one["issue"]["resolution"], "Login ships with w1's form.", "{one}");
    let moves: Vec<String> = one["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "moved" && e["actor"] == "cc")
        .map(|e| e["text"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(moves[0].starts_with("open -> in_progress") && moves[1].starts_with("in_progress -> done"), "{moves:?}");
    let two = env.json(&["issues", "show", "2"]);
    assert_eq!((two["issue"]["owner"].as_str(), two["issue"]["state"].as_str()), (Some("w1"), Some("done")));
    assert_eq!((two["issue"]["reporter"].as_str(), two["issue"]["parent"].as_u64()), (Some("cc"), Some(1)));
    // The model saw the issue arrive in its topic, and the sub-issue's close before closing.
    let requests = fake.requests();
    assert!(requests.iter().any(|r| occurrences(r, "issue #1: Ship the login page") > 0), "the topic never reached cc");
    assert!(requests.iter().any(|r| occurrences(r, "Sub-issue #2 of #1 is done") > 0), "the close never reached cc");
}
