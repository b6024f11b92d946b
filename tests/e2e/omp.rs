//! oh-my-pi end to end: the real pinned `omp` (18.2.3 on Bun 1.4.4) as a Manager, confined,
//! against the fake Anthropic API: Canopy's rendered prompt in place of omp's default block-0
//! with omp's footer kept, Canopy's tools offered top-level and a call posting as the agent,
//! turn-start delivery, and the implementer definition on omp's own `task` subagents (the
//! delta spliced second to last, the lifecycle in `canopy watch`).

use serde_json::{Value, json};

use crate::env::TestEnv;
use crate::fake_anthropic::{FakeAnthropic, Reply, system_text, tool_names, user_texts};
use crate::harness_bins::omp_bin;

pub(crate) fn omp_env(fake: &FakeAnthropic) -> TestEnv {
    let harness = format!(
        "[harness.omp]\nbin = {bin:?}\nmodel = \"fake-claude\"\n\n[harness.omp.env]\nFAKE_KEY = \"sk-fake\"\n\n\
         [harness.omp.provider]\nbase_url = {url:?}\napi_key_env = \"FAKE_KEY\"\n",
        bin = omp_bin().display().to_string(),
        url = fake.base_url(),
    );
    TestEnv::started_with(&[
        ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
        ("restart_backoff_min = \"500ms\"", "restart_backoff_min = \"100ms\""),
        ("quiet_window = \"2s\"", "quiet_window = \"100ms\""),
        ("resync = \"5s\"", "resync = \"500ms\""),
        ("[harness.omp]\n", &harness),
    ])
}

/// The request whose system prompt contains `needle`.
fn request_with(fake: &FakeAnthropic, needle: &str) -> Option<Value> {
    fake.requests().into_iter().find(|r| system_text(r).contains(needle))
}

#[test]
fn an_omp_manager_gets_canopys_prompt_posts_with_its_tools_and_runs_the_implementer_on_task() {
    let fake = FakeAnthropic::start(vec![
        Reply::default().and_call(
            "mcp__canopy_comms_post_message",
            json!({ "channel": "home-lead", "topic": "status", "body": "posted from omp", "create_topic": true, "i": "report" }),
        ),
        Reply::text("reported in"),
    ]);
    let env = omp_env(&fake);
    env.json(&["agents", "create", "--handle", "lead", "--name", "Lead", "--harness", "omp"]);
    crate::assert_eventually!(
        env.messages("home-lead").iter().any(|m| m["body"] == "posted from omp"),
        "the omp session's tool call did not post: {:#?}",
        fake.requests().iter().map(tool_names).collect::<Vec<_>>()
    );
    let posted = env.messages("home-lead").into_iter().find(|m| m["body"] == "posted from omp").unwrap();
    assert_eq!(posted["sender"]["handle"], "lead");

    // Canopy's Manager block-0 replaced omp's; omp's footer, Canopy's skills and rules stay.
    let first = &fake.requests()[0];
    let system = system_text(first);
    assert!(system.starts_with("# You are a Manager"), "{}", &system[..system.len().min(400)]);
    assert!(system.contains("<workstation>"), "omp's footer survives the replace");
    assert!(system.contains("comms-playbook") && system.contains("never-merge"), "skills and rules survive");
    assert!(!system.contains("# Tool Inventory"), "omp's default block-0 is gone");
    assert!(system.contains("your own subagent tool"), "the native delegation line is kept on omp");
    let tools = tool_names(first);
    for tool in ["mcp__canopy_comms_post_message", "mcp__canopy_agents_run_subagent", "task", "bash", "read"] {
        assert!(tools.iter().any(|t| t == tool), "{tool} is not offered: {tools:?}");
    }
    assert!(!tools.iter().any(|t| t == "edit" || t == "web_search"), "a Manager edits nothing: {tools:?}");
    env.settled("lead");

    // A post reaches it at its next turn start; it briefs the implementer on its own `task`.
    fake.push(Reply::default().and_call(
        "task",
        json!({ "context": "CTX_MARKER the release", "tasks": [{ "agent": "implementer", "task": "TASK_MARKER add a changelog entry" }], "i": "delegate" }),
    ));
    fake.push(Reply::default().and_call("yield", json!({ "data": "SUBAGENT_RESULT_MARKER done", "i": "finish" })));
    fake.push(Reply::text("the implementer finished"));
    env.ok(&["post", "--channel", "home-lead", "--topic", "ops", "--create-topic", "OPS_MARKER please delegate"]);
    crate::assert_eventually!(
        request_with(&fake, "# You are an implementer").is_some(),
        "the subagent never ran: {:#?}",
        fake.requests().iter().map(|r| system_text(r).chars().take(200).collect::<String>()).collect::<Vec<_>>()
    );
    let delivered = fake.requests().into_iter().find(|r| user_texts(r).iter().any(|t| t.contains("OPS_MARKER")));
    assert!(delivered.is_some(), "the post did not reach the Manager's turn");

    // The subagent: omp's default block-0, then the delta as its own block, then the footer.
    let sub = request_with(&fake, "# You are an implementer").unwrap();
    let blocks: Vec<String> =
        sub["system"].as_array().unwrap().iter().map(|b| b["text"].as_str().unwrap_or("").to_owned()).collect();
    assert!(blocks.len() >= 3, "{blocks:#?}");
    let delta = blocks.iter().position(|b| b.contains("# You are an implementer")).unwrap();
    assert_eq!(delta, blocks.len() - 2, "the delta is second to last: {blocks:#?}");
    assert!(blocks[0].contains("Tool Inventory"), "the default block-0 co-renders around the delta");
    assert!(blocks[blocks.len() - 1].contains("<workstation>"), "the footer is last");
    assert!(!blocks[0].contains("# You are a Manager"), "the Manager's prompt is not inherited");
    assert!(user_texts(&sub).iter().any(|t| t.contains("TASK_MARKER")));

    // The subagent's lifecycle shows in the Manager's watch.
    crate::assert_eventually!(
        {
            let kinds: Vec<Value> = env.activity("lead").iter().map(|a| a["kind"].clone()).collect();
            kinds.contains(&json!("subagent_started")) && kinds.contains(&json!("subagent_ended"))
        },
        "no subagent lifecycle in watch: {:#?}",
        env.activity("lead").iter().map(|a| a["kind"].clone()).collect::<Vec<_>>()
    );
    let done = env.activity("lead").into_iter().find(|a| a["kind"] == "subagent_ended").unwrap();
    assert!(done.to_string().contains("implementer"), "{done}");
    // And in `canopy runs`, like a Canopy run.
    let runs = env.json(&["runs", "--agent", "lead"]);
    let native = runs["runs"].as_array().unwrap().iter().find(|r| r["native"].is_string()).cloned();
    let native = native.unwrap_or_else(|| panic!("no native run listed: {runs}"));
    assert_eq!(
        (native["definition"].clone(), native["status"].clone()),
        (json!("implementer"), json!("done")),
        "{native}"
    );
}

#[test]
fn doctor_finds_omp_and_starts_a_confined_session_without_a_model_call() {
    let fake = FakeAnthropic::start(Vec::new());
    let env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    let config = env.data_dir().join("canopy.toml");
    std::fs::write(
        &config,
        format!(
            "[harness.omp]\nbin = {bin:?}\nmodel = \"fake-claude\"\n\n[harness.omp.provider]\nbase_url = {url:?}\n\n\
             [roles.manager]\nharness = \"omp\"\n",
            bin = omp_bin().display().to_string(),
            url = fake.base_url(),
        ),
    )
    .unwrap();
    let report = env.json(&["doctor"]);
    let omp = report["checks"].as_array().unwrap().iter().find(|c| c["name"] == "omp").cloned().unwrap();
    assert_eq!((omp["required"].clone(), omp["ok"].clone()), (json!(true), json!(true)), "{report}");
    assert_eq!(omp["session_starts"], true, "{omp}");
    assert!(omp["version"].as_str().unwrap().contains("18.2.3"), "{omp}");
    assert!(fake.requests().is_empty(), "doctor made a model call");

    // Without its provider, doctor says what is missing.
    std::fs::write(
        &config,
        format!("[harness.omp]\nbin = {:?}\n\n[roles.manager]\nharness = \"omp\"\n", omp_bin().display().to_string()),
    )
    .unwrap();
    let out = env.run(&["--json", "doctor"]);
    assert_eq!(out.status.code(), Some(69));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let omp = report["checks"].as_array().unwrap().iter().find(|c| c["name"] == "omp").cloned().unwrap();
    assert!(omp["problem"].as_str().unwrap().contains("[harness.omp.provider]"), "{omp}");
}

/// Through the daemon and the runner: an operator's `@mention` while omp runs a slow tool is
/// steered into the running turn, lands after the tool (whose result is intact), and
/// `canopy agents interrupt` stops a running turn.
#[test]
fn a_mention_steers_an_omp_manager_after_its_running_tool_and_an_interrupt_stops_a_turn() {
    let fake = FakeAnthropic::start(vec![
        Reply::text("ready"),
        Reply::default().and_call("bash", json!({ "command": "sleep 3; echo SLEPT_OK", "i": "wait" })),
        Reply::text("steered and done"),
        Reply::default().and_call("bash", json!({ "command": "sleep 60", "i": "wait" })),
    ]);
    let env = omp_env(&fake);
    env.json(&["agents", "create", "--handle", "lead", "--name", "Lead", "--harness", "omp"]);
    env.settled("lead");
    env.ok(&["post", "--channel", "home-lead", "--topic", "ops", "--create-topic", "run the slow check"]);
    crate::assert_eventually!(
        env.activity("lead").iter().any(|a| a["kind"] == "tool_running"),
        "the slow tool never started"
    );
    let posted = env.json(&["post", "--channel", "home-lead", "--topic", "ops", "@lead STEER_MARKER change of plan"]);
    let outcome = posted["outcomes"].as_array().unwrap().iter().find(|o| o["recipient"] == "lead").cloned().unwrap();
    assert_eq!(outcome["outcome"], "steered", "{posted}");
    crate::assert_eventually!(
        fake.requests().iter().any(|r| user_texts(r).iter().any(|t| t.contains("STEER_MARKER"))),
        "the steer never reached the model"
    );
    let steered =
        fake.requests().into_iter().find(|r| user_texts(r).iter().any(|t| t.contains("STEER_MARKER"))).unwrap();
    assert!(steered.to_string().contains("SLEPT_OK"), "the tool's result is intact before the steer: {steered}");
    env.settled("lead");

    env.ok(&["post", "--channel", "home-lead", "--topic", "ops", "run the long job"]);
    crate::assert_eventually!(
        env.activity("lead").iter().filter(|a| a["kind"] == "tool_running").count() >= 2,
        "the long job never started"
    );
    let interrupted = env.json(&["agents", "interrupt", "lead"]);
    assert_eq!(interrupted["interrupted"], true, "{interrupted}");
    crate::assert_eventually!(
        env.activity("lead").iter().any(|a| a["kind"] == "turn_ended" && a.to_string().contains("interrupted")),
        "the turn did not end interrupted: {:#?}",
        env.activity("lead").iter().map(|a| a["kind"].clone()).collect::<Vec<_>>()
    );
}

/// The same Manager on an OpenAI-compatible provider (`api = "openai-responses"`): Canopy's
/// prompt goes as the Responses API's `instructions`, and a tool call posts as the agent.
#[test]
fn an_omp_manager_on_an_openai_provider_posts_with_canopys_tools() {
    use crate::fake_openai::{FakeOpenAi, Reply as OpenAiReply};
    let fake = FakeOpenAi::start(vec![
        OpenAiReply::default().and_call(
            None,
            "mcp__canopy_comms_post_message",
            json!({ "channel": "home-lead", "topic": "status", "body": "posted over openai", "create_topic": true }),
        ),
        OpenAiReply::text("reported in"),
    ]);
    let harness = format!(
        "[harness.omp]\nbin = {bin:?}\nmodel = \"fake-gpt\"\n\n[harness.omp.env]\nFAKE_KEY = \"sk-fake\"\n\n\
         [harness.omp.provider]\nbase_url = {url:?}\napi_key_env = \"FAKE_KEY\"\napi = \"openai-responses\"\n",
        bin = omp_bin().display().to_string(),
        url = fake.base_url(),
    );
    let env = TestEnv::started_with(&[
        ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
        ("quiet_window = \"2s\"", "quiet_window = \"100ms\""),
        ("[harness.omp]\n", &harness),
    ]);
    env.json(&["agents", "create", "--handle", "lead", "--name", "Lead", "--harness", "omp"]);
    crate::assert_eventually!(
        env.messages("home-lead").iter().any(|m| m["body"] == "posted over openai"),
        "the omp session on an OpenAI provider did not post: {:#?}",
        fake.requests()
    );
    let first = &fake.requests()[0];
    assert!(first["instructions"].as_str().unwrap_or("").starts_with("# You are a Manager"), "{first}");
}
