//! Codex end to end: the real daemon and runner, a real `nats-server`, real SQLite, the real
//! `codex app-server` (pinned 0.171.0) and Canopy's real MCP endpoint; only the model API is
//! the fake in `fake_openai`. An agent created with `--harness codex` runs under
//! `[harness.codex]` pointing at the binary and the fake provider.
//!
//! Owns the Codex scenarios: the system prompt reaching the model verbatim, Canopy's tools
//! offered and a scripted call posting as the agent, a post waking an idle session, an
//! @mention steered into a running turn, a late mention falling back to the next turn,
//! `canopy agents interrupt` during a slow tool (the turn ends interrupted, the same session
//! takes the next message), `kill -9` of Codex (restart, the thread resumed, redelivery; a
//! thread that cannot be resumed starts fresh), a graceful stop, and an
//! implementer run whose delta arrives as `developerInstructions`, and `canopy doctor`
//! starting a real Codex session (no model call). A missing binary fails with the install
//! command.

use std::time::Duration;

use serde_json::{Value, json};

use crate::env::{TestEnv, signal};
use crate::fake_openai::{FakeOpenAi, Reply, input_items, item_text, messages_of, offers_tool, summary};
use crate::harness_bins::codex_bin;

const PATIENCE: Duration = Duration::from_secs(30);

/// Quick syncing, restarts and coalescing, so tests do not wait on production defaults.
const QUICK: &[(&str, &str)] = &[
    ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
    ("restart_backoff_min = \"500ms\"", "restart_backoff_min = \"100ms\""),
    ("quiet_window = \"2s\"", "quiet_window = \"100ms\""),
    ("resync = \"5s\"", "resync = \"500ms\""),
];

/// A workspace whose `[harness.codex]` runs the pinned binary against `fake`.
pub(crate) fn started(fake: &FakeOpenAi, extra: &[(&str, &str)]) -> TestEnv {
    let table = format!(
        "[harness.codex]\nbin = {bin:?}\nmodel = \"fake-model\"\n\n[harness.codex.env]\nFAKE_OPENAI_KEY = \"sk-fake\"\n\n\
         [harness.codex.provider]\nbase_url = {url:?}\napi_key_env = \"FAKE_OPENAI_KEY\"\n",
        bin = codex_bin().display().to_string(),
        url = fake.base_url(),
    );
    let mut edits: Vec<(&str, &str)> = QUICK.to_vec();
    edits.extend_from_slice(extra);
    edits.push(("[harness.codex]\n", &table));
    TestEnv::started_with(&edits)
}

impl TestEnv {
    fn create_codex(&self, handle: &str) {
        self.json(&["agents", "create", "--handle", handle, "--name", handle, "--harness", "codex"]);
    }

    fn watch(&self, handle: &str) -> Vec<Value> {
        let out = self.ok(&["--json", "watch", handle, "--no-follow", "--tail", "1000"]);
        out.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    fn watched(&self, handle: &str, kind: &str) -> Vec<Value> {
        self.watch(handle).into_iter().filter(|i| i["kind"] == kind).collect()
    }

    fn post(&self, channel: &str, body: &str) -> Value {
        self.json(&["post", "--channel", channel, "--topic", "t", "--create-topic", body])
    }
}

/// The last user message of a request: the input that started or steered into it.
fn last_user_message(request: &Value) -> String {
    messages_of(request, "user").pop().unwrap_or_default()
}

fn assert_fenced(text: &str, body: &str) {
    assert!(text.contains(body), "{body:?} missing from {text}");
    assert!(text.contains("[canopy-") && text.contains("end of message"), "the message was not fenced: {text}");
}

#[test]
fn a_codex_manager_gets_its_prompt_verbatim_and_posts_through_canopy_s_tools() {
    let fake = FakeOpenAi::start(vec![
        Reply::canopy_tool(
            "comms_post_message",
            json!({ "channel": "home-cx", "topic": "hello", "body": "hi from codex", "create_topic": true }),
        ),
        Reply::text("posted my hello"),
    ]);
    let env = started(&fake, &[]);
    env.create_codex("cx");
    crate::assert_eventually!(
        env.messages("home-cx").iter().any(|m| m["body"] == "hi from codex"),
        "the codex session did not post: {:?} {:?}",
        fake.requests().iter().map(summary).collect::<Vec<_>>(),
        env.watch("cx")
    );
    let message = env.messages("home-cx").into_iter().find(|m| m["body"] == "hi from codex").unwrap();
    assert_eq!(message["sender"]["handle"], "cx");
    assert_eq!(message["sender"]["kind"], "agent");
    assert_eq!(message["topic"], "hello");

    let requests = fake.wait_requests(2, PATIENCE);
    let first = &requests[0];
    // The session's system prompt (a Manager replaces Codex's own) is the first input item.
    let prompt = std::fs::read_to_string(env.data_dir().join("sessions/cx/1/system-prompt.md")).unwrap();
    let rendered = env.json(&["prompt", "render", "--agent", "cx"]);
    assert_eq!(rendered["text"].as_str(), Some(prompt.as_str()), "the session got something else than `prompt render`");
    assert_eq!(rendered["session"]["hash"], rendered["hash"]);
    assert!(prompt.starts_with("# You are a Manager"), "{prompt}");
    assert_eq!(first["input"][0]["role"], "developer", "{:?}", summary(first));
    assert_eq!(first["input"][0]["content"][0]["text"].as_str(), Some(prompt.as_str()), "not verbatim");
    for tool in canopy_tools::TOOL_NAMES.iter() {
        assert!(offers_tool(first, Some("mcp__canopy"), tool), "{tool} is not offered to the model");
    }
    // Exactly the role's Canopy tools, no more, under Canopy's namespace.
    let offered: Vec<String> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["type"] == "namespace" && t["name"] == "mcp__canopy")
        .flat_map(|t| t["tools"].as_array().cloned().unwrap_or_default())
        .map(|t| t["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    let mut offered_sorted = offered.clone();
    offered_sorted.sort();
    let mut expected: Vec<String> = canopy_tools::TOOL_NAMES.iter().map(|t| (*t).to_owned()).collect();
    expected.sort();
    assert_eq!(offered_sorted, expected, "the model was offered other Canopy tools than the role's");
    assert!(last_user_message(first).contains("Session 1 started for cx"), "{:?}", summary(first));
    // The tool's result went back to the model in the same turn.
    let output = input_items(&requests[1]).into_iter().find(|i| i["type"] == "function_call_output").unwrap();
    assert!(item_text(&output).contains("hi from codex"), "{output}");

    let ran = env.watched("cx", "tool_result");
    assert!(ran.iter().any(|i| i["detail"]["name"] == "comms_post_message"), "{ran:?}");
    crate::assert_eventually!(env.roster_entry("cx")["presence"] == "idle", "cx never went idle");
    assert!(!env.watched("cx", "usage").is_empty(), "no token usage was reported");
}

#[test]
fn a_post_to_an_idle_codex_agent_starts_a_turn_carrying_the_fenced_message() {
    let fake = FakeOpenAi::start(vec![Reply::text("ready when you are")]);
    let env = started(&fake, &[]);
    env.create_codex("cx");
    fake.wait_requests(1, PATIENCE);
    crate::assert_eventually!(env.roster_entry("cx")["presence"] == "idle", "cx never went idle");
    fake.push(Reply::text("on it"));
    let posted = env.post("home-cx", "please look at the flaky build");
    assert_eq!(posted["outcomes"][0]["recipient"], "cx");
    assert_eq!(posted["outcomes"][0]["outcome"], "woke", "{posted}");
    let requests = fake.wait_requests(2, PATIENCE);
    assert_fenced(&last_user_message(&requests[1]), "please look at the flaky build");
    crate::assert_eventually!(env.watched("cx", "turn_started").len() == 2, "the message did not start a turn");
}

#[test]
fn a_mention_during_a_codex_tool_call_is_steered_into_the_same_turn() {
    let fake = FakeOpenAi::start(vec![Reply::shell("sleep 2; echo built"), Reply::text("done, and I saw you")]);
    let env = started(&fake, &[]);
    env.create_codex("cx");
    crate::assert_eventually!(
        env.watched("cx", "tool_running").iter().any(|i| i["detail"]["name"] == "command"),
        "the slow tool never ran"
    );
    let posted = env.post("home-cx", "@cx stop after this build");
    assert_eq!(posted["outcomes"][0]["outcome"], "steered", "{posted}");

    let requests = fake.wait_requests(2, PATIENCE);
    let items = input_items(&requests[1]);
    let output = items.iter().position(|i| i["type"] == "function_call_output").unwrap();
    let steer = items.iter().position(|i| item_text(i).contains("stop after this build")).unwrap();
    assert!(output < steer, "the steer did not follow the tool result: {:?}", summary(&requests[1]));
    assert_fenced(&item_text(&items[steer]), "stop after this build");

    crate::assert_eventually!(env.roster_entry("cx")["presence"] == "idle", "the turn never ended");
    let injected = env.watched("cx", "steer_injected");
    let started = env.watched("cx", "turn_started");
    assert_eq!(started.len(), 1, "the steer started a turn of its own: {started:?}");
    assert_eq!(injected.len(), 1, "{:?}", env.watch("cx"));
    assert_eq!(injected[0]["detail"]["turn_id"], started[0]["turn_id"], "{injected:?}");
    // Injected means acknowledged: nothing is pending, so it is not delivered a second time.
    env.settled("cx");
    let again =
        fake.requests().iter().skip(2).filter(|r| last_user_message(r).contains("stop after this build")).count();
    assert_eq!(again, 0, "the steered message was delivered again");
}

#[test]
fn a_mention_after_the_codex_turn_ended_falls_back_to_the_next_turn() {
    // The turn's last model call is held, the runner frozen while it ends, and the mention
    // posted then: the daemon still sees the agent working and asks for a steer, which can
    // only fall back (Codex answers "no active turn to steer", or the runner has seen the end).
    // The machine's network: in a namespace of its own, Codex reaches its model through the
    // runner, and a frozen runner would hold the turn open.
    let hold = Duration::from_millis(1000);
    let fake = FakeOpenAi::start(vec![Reply { hold, ..Reply::text("my last words") }, Reply::text("got it")]);
    let env = started(&fake, &[("embedded = true", "embedded = false"), ("network = \"proxy\"", "network = \"host\"")]);
    let mut runner = env.spawn_runner();
    env.create_codex("cx");
    fake.wait_requests(1, PATIENCE);
    crate::assert_eventually!(env.roster_entry("cx")["presence"] == "working", "cx never started working");
    signal(runner.0.id(), canopy_sys::SIGSTOP);
    std::thread::sleep(hold + Duration::from_millis(700));
    let poster = {
        let command = env.command(&[
            "--json",
            "post",
            "--channel",
            "home-cx",
            "--topic",
            "t",
            "--create-topic",
            "@cx are you there?",
        ]);
        std::thread::spawn(move || {
            let mut command = command;
            command.output().unwrap()
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    signal(runner.0.id(), canopy_sys::SIGCONT);
    let out = poster.join().unwrap();
    assert!(out.status.success(), "{}", crate::env::text(&out.stderr));
    let posted: Value = serde_json::from_slice(&out.stdout).unwrap();
    let outcome = &posted["outcomes"][0];
    assert_eq!(outcome["recipient"], "cx");
    assert_eq!(outcome["outcome"], "queued", "{posted}");
    assert!(outcome["reason"].as_str().unwrap_or_default().contains("fell back"), "{posted}");

    // Delivered at the next turn start: a new turn whose input is the fenced message.
    let requests = fake.wait_requests(2, PATIENCE);
    assert_fenced(&last_user_message(&requests[1]), "are you there?");
    assert!(
        input_items(&requests[1]).iter().any(|i| i["role"] == "assistant" && item_text(i) == "my last words"),
        "the next turn does not follow the finished one: {:?}",
        summary(&requests[1])
    );
    crate::assert_eventually!(env.watched("cx", "turn_started").len() == 2, "no second turn started");
    assert!(env.watched("cx", "steer_injected").is_empty(), "the late mention was steered");
    signal(runner.0.id(), canopy_sys::SIGTERM);
    let _ = crate::env::wait_timeout(&mut runner.0, Duration::from_secs(15));
}

#[test]
fn canopy_agents_interrupt_ends_a_codex_turn_during_a_slow_tool_and_the_session_takes_the_next_message() {
    let fake = FakeOpenAi::start(vec![Reply::shell("sleep 60"), Reply::text("back at your service")]);
    let env = started(&fake, &[]);
    env.create_codex("cx");
    let pid = env.wait_harness_pid("cx", 1);
    crate::assert_eventually!(
        env.watched("cx", "tool_running").iter().any(|i| i["detail"]["name"] == "command"),
        "the slow tool never ran: {:?}",
        env.watch("cx")
    );

    let interrupted = env.json(&["agents", "interrupt", "cx"]);
    assert_eq!(interrupted["interrupted"], true, "{interrupted}");
    assert_eq!(interrupted["incarnation"], 1, "{interrupted}");
    let turn = interrupted["turn_id"].as_str().unwrap().to_owned();
    let ended = |env: &TestEnv| env.watched("cx", "turn_ended").into_iter().find(|i| i["turn_id"] == turn.as_str());
    crate::assert_eventually!(ended(&env).is_some(), "the interrupted turn never ended: {:?}", env.watch("cx"));
    assert_eq!(ended(&env).unwrap()["detail"]["status"], "interrupted", "{:?}", ended(&env));
    assert!(
        env.watched("cx", "tool_aborted").iter().any(|i| i["detail"]["name"] == "command"),
        "the cut-off tool was not reported: {:?}",
        env.watch("cx")
    );
    crate::assert_eventually!(env.roster_entry("cx")["presence"] == "idle", "cx did not go idle");
    assert_eq!(env.json(&["agents", "interrupt", "cx"])["interrupted"], false, "an idle agent was interrupted");

    // Still usable, and still the same session: the next message is a new turn whose request
    // reaches the model.
    env.post("home-cx", "are you still there");
    let requests = fake.wait_requests(2, PATIENCE);
    assert_fenced(&last_user_message(&requests[1]), "are you still there");
    crate::assert_eventually!(env.watched("cx", "turn_started").len() == 2, "the message did not start a turn");
    let started = env.watched("cx", "turn_started");
    assert_ne!(started[1]["turn_id"], turn.as_str());
    assert_eq!(env.roster_entry("cx")["incarnation"], 1);
    assert_eq!(env.wait_harness_pid("cx", 1), pid);
    assert!(crate::env::alive(pid), "codex exited");
}

/// The reply to incarnation 1's start turn, which incarnation 2 should remember.
const NOTED: &str = "noted: the code word is heron";

#[test]
fn a_killed_codex_restarts_as_incarnation_2_resumes_its_thread_and_gets_the_undelivered_message() {
    let fake = FakeOpenAi::start(vec![
        Reply::text(NOTED),
        Reply::shell("sleep 10"),
        Reply::canopy_tool(
            "comms_post_message",
            json!({ "channel": "home-cx", "topic": "back", "body": "back after the restart", "create_topic": true }),
        ),
        Reply::text("back again"),
    ]);
    let env = started(&fake, &[]);
    env.create_codex("cx");
    let first = env.wait_harness_pid("cx", 1);
    crate::assert_eventually!(env.roster_entry("cx")["presence"] == "idle", "cx never went idle");
    let thread = std::fs::read_to_string(env.data_dir().join("sessions/cx/codex-thread")).unwrap();
    env.post("home-cx", "start the long job");
    crate::assert_eventually!(
        env.watched("cx", "tool_running").iter().any(|i| i["detail"]["name"] == "command"),
        "the long tool never ran"
    );
    let posted = env.post("home-cx", "keep this for when you are back");
    assert_eq!(posted["outcomes"][0]["outcome"], "queued", "{posted}");
    signal(first, canopy_sys::SIGKILL);

    let second = env.wait_harness_pid("cx", 2);
    assert_ne!(first, second);
    crate::assert_eventually!(env.roster_entry("cx")["incarnation"] == 2, "the roster did not move to session 2");
    let requests = fake.wait_requests(3, PATIENCE);
    let resumed = &requests[2];
    // The same thread goes on: the earlier turns are history, then the restart's input.
    assert!(messages_of(resumed, "assistant").iter().any(|t| t == NOTED), "{:?}", summary(resumed));
    assert!(
        messages_of(resumed, "user").iter().any(|t| t.contains("Session 1 started for cx")),
        "{:?}",
        summary(resumed)
    );
    let redelivered = last_user_message(resumed);
    assert!(redelivered.contains("Session 2 started for cx"), "{redelivered}");
    assert_fenced(&redelivered, "keep this for when you are back");
    assert_eq!(std::fs::read_to_string(env.data_dir().join("sessions/cx/codex-thread")).unwrap(), thread);
    // CODEX_HOME is the agent's, so the thread's rollout survived the incarnation.
    assert!(env.data_dir().join("sessions/cx/codex-home/config.toml").is_file());
    assert!(!env.data_dir().join("sessions/cx/2/codex-home").exists());
    // Canopy's tools work on the resumed thread, with incarnation 2's token: the post is cx's.
    crate::assert_eventually!(
        env.messages("home-cx").iter().any(|m| m["body"] == "back after the restart"),
        "the tool call after the restart did not post: {:?} {:?}",
        fake.requests().iter().map(summary).collect::<Vec<_>>(),
        env.watch("cx")
    );
    let message = env.messages("home-cx").into_iter().find(|m| m["body"] == "back after the restart").unwrap();
    assert_eq!(message["sender"]["handle"], "cx");
}

#[test]
fn a_codex_thread_that_cannot_be_resumed_starts_fresh_and_the_session_still_works() {
    let fake = FakeOpenAi::start(vec![
        Reply::text(NOTED),
        Reply::canopy_tool(
            "comms_post_message",
            json!({ "channel": "home-cx", "topic": "fresh", "body": "fresh but working", "create_topic": true }),
        ),
        Reply::text("posted"),
    ]);
    let env = started(&fake, &[]);
    env.create_codex("cx");
    let first = env.wait_harness_pid("cx", 1);
    crate::assert_eventually!(env.roster_entry("cx")["presence"] == "idle", "cx never went idle");
    let record = env.data_dir().join("sessions/cx/codex-thread");
    let missing = "019a0000-0000-7000-8000-000000000000";
    std::fs::write(&record, missing).unwrap();
    signal(first, canopy_sys::SIGKILL);
    env.wait_harness_pid("cx", 2);

    let requests = fake.wait_requests(2, PATIENCE);
    let fresh = &requests[1];
    assert!(messages_of(fresh, "assistant").is_empty(), "{:?}", summary(fresh));
    assert!(last_user_message(fresh).contains("Session 2 started for cx"), "{:?}", summary(fresh));
    crate::assert_eventually!(
        env.messages("home-cx").iter().any(|m| m["body"] == "fresh but working"),
        "the fresh session's tool call did not post: {:?}",
        env.watch("cx")
    );
    let note = env
        .watched("cx", "status")
        .into_iter()
        .find(|a| a["summary"].as_str().unwrap_or_default().contains("could not resume"));
    let note = note.unwrap_or_else(|| panic!("no status about the failed resume: {:?}", env.watch("cx")));
    assert!(note["summary"].as_str().unwrap().contains(missing), "{note}");
    assert_ne!(std::fs::read_to_string(&record).unwrap().trim(), missing, "the fresh thread was recorded");
}

#[test]
fn stopping_a_codex_agent_closes_its_input_and_codex_exits_within_the_grace() {
    // A long grace: a Codex that ignored its closed stdin would outlive the assertion below.
    let fake = FakeOpenAi::start(vec![Reply::text("idle now")]);
    let env = started(&fake, &[("stop_grace = \"3s\"", "stop_grace = \"30s\"")]);
    env.create_codex("cx");
    let pid = env.wait_harness_pid("cx", 1);
    crate::assert_eventually!(env.roster_entry("cx")["presence"] == "idle", "cx never went idle");
    let asked = std::time::Instant::now();
    env.json(&["agents", "stop", "cx"]);
    crate::assert_eventually!(!crate::env::alive(pid), "codex survived `agents stop`");
    assert!(asked.elapsed() < Duration::from_secs(10), "codex waited for a signal: {:?}", asked.elapsed());
    crate::assert_eventually!(env.roster_entry("cx")["presence"] == "offline", "cx is not offline");
}

#[test]
fn an_implementer_run_on_codex_keeps_codex_s_prompt_and_gets_the_delta_as_developer_instructions() {
    let fake = FakeOpenAi::start(vec![
        Reply::canopy_tool(
            "agents_run_subagent",
            json!({ "definition": "implementer", "brief": "Add a --verbose flag to the build script." }),
        ),
        Reply::text("briefed; waiting for the report"),
        Reply::text("Report: added --verbose; verified with the script's own test."),
    ]);
    let env = started(
        &fake,
        // No [roles.implementer] edit: a run follows its Manager's harness.
        &[],
    );
    env.create_codex("lead");
    let carries_delta = |r: &Value| {
        input_items(r).iter().any(|i| i["role"] == "developer" && item_text(i).contains("# You are an implementer"))
    };
    crate::assert_eventually!(
        fake.requests().iter().any(carries_delta),
        "no request carried the implementer delta: {:?}",
        fake.requests().iter().map(summary).collect::<Vec<_>>()
    );
    let requests = fake.requests();
    let run = requests.iter().find(|r| carries_delta(r)).unwrap();
    let items = input_items(run);
    // Codex's own prompt is the first developer message; the delta comes after it.
    assert_eq!(items[0]["role"], "developer");
    assert!(!item_text(&items[0]).contains("# You are an implementer"), "the delta replaced Codex's prompt");
    let appended = std::fs::read_to_string(env.data_dir().join("sessions/run-1/1/system-prompt.md")).unwrap();
    assert!(appended.contains("- Parent: @lead") && !appended.contains("Careful coding"), "{appended}");
    assert!(
        items.iter().any(|i| i["role"] == "developer" && item_text(i).contains(appended.trim())),
        "the delta did not arrive verbatim"
    );
    assert!(last_user_message(run).contains("Add a --verbose flag"), "the brief is the run's first input");
    crate::assert_eventually!(
        fake.requests().iter().any(|r| last_user_message(r).contains("Subagent run 1 (implementer) finished: done.")),
        "the Manager's next turn did not carry the report"
    );
    assert_eq!(env.json(&["runs", "--agent", "lead"])["runs"][0]["status"], "done");
}

#[test]
fn doctor_starts_a_codex_session_without_a_model_call_and_names_a_missing_api_key() {
    let fake = FakeOpenAi::start(Vec::new());
    let env = TestEnv::new();
    std::fs::create_dir_all(env.data_dir()).unwrap();
    let config = env.data_dir().join("canopy.toml");
    let write = |provider_env: &str| {
        let text = format!(
            "[harness.codex]\nbin = {bin:?}\nmodel = \"fake-model\"\n{provider_env}\n\
             [harness.codex.provider]\nbase_url = {url:?}\napi_key_env = \"FAKE_OPENAI_KEY\"\n\n\
             [roles.manager]\nharness = \"codex\"\n",
            bin = codex_bin().display().to_string(),
            url = fake.base_url(),
        );
        std::fs::write(&config, text).unwrap();
    };
    let check = |report: &Value, name: &str| {
        report["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned().unwrap()
    };
    write("\n[harness.codex.env]\nFAKE_OPENAI_KEY = \"sk-fake\"\n");
    let report = env.json(&["doctor"]);
    assert_eq!(report["ok"], true, "{report}");
    let codex = check(&report, "codex");
    assert_eq!(codex["required"], true, "{codex}");
    assert_eq!(codex["session_starts"], true, "{codex}");
    assert!(codex["version"].as_str().unwrap().contains("0.171.0"), "{codex}");
    // Ready without a model call, and nothing left behind but the configuration.
    assert!(
        fake.requests().is_empty(),
        "doctor called the model: {:?}",
        fake.requests().iter().map(summary).collect::<Vec<_>>()
    );
    let left: Vec<String> = std::fs::read_dir(env.data_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["canopy.toml"], "doctor left files behind");

    // Without the key the provider names, the adapter refuses to launch, and doctor says why.
    write("");
    let mut command = env.command(&["--json", "doctor"]);
    command.env_remove("FAKE_OPENAI_KEY");
    let out = command.output().unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", crate::env::text(&out.stdout));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let codex = check(&report, "codex");
    assert_eq!(codex["ok"], false, "{codex}");
    assert_eq!(codex["session_starts"], false, "{codex}");
    assert!(codex["problem"].as_str().unwrap().contains("needs the API key in FAKE_OPENAI_KEY"), "{codex}");
}
