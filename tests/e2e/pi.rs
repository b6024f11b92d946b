//! pi end to end: the real pinned `pi` (0.73.1 on Node) as a Manager, confined, against the
//! fake Anthropic API. pi has no MCP, so Canopy's tools arrive through the extension Canopy
//! ships for it: offered under their own names, a call posts as the agent, the role's
//! built-in tools only; Canopy's prompt in place of pi's own, and turn-start delivery.

use serde_json::json;

use crate::env::TestEnv;
use crate::fake_anthropic::{FakeAnthropic, Reply, system_text, tool_names, user_texts};
use crate::harness_bins::pi_bin;

/// A workspace whose sessions may run pi against `fake`.
pub(crate) fn pi_env(fake: &FakeAnthropic) -> TestEnv {
    let harness = format!(
        "[harness.pi]\nbin = {bin:?}\nmodel = \"fake-claude\"\n\n[harness.pi.env]\nFAKE_KEY = \"sk-fake\"\n\n\
         [harness.pi.provider]\nbase_url = {url:?}\napi_key_env = \"FAKE_KEY\"\n",
        bin = pi_bin().display().to_string(),
        url = fake.base_url(),
    );
    TestEnv::started_with(&[
        ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
        ("quiet_window = \"2s\"", "quiet_window = \"100ms\""),
        ("resync = \"5s\"", "resync = \"500ms\""),
        ("[harness.pi]\n", &harness),
    ])
}

#[test]
fn a_pi_manager_gets_canopys_prompt_and_its_tools_through_the_extension() {
    let fake = FakeAnthropic::start(vec![
        Reply::default().and_call(
            "comms_post_message",
            json!({ "channel": "home-lead", "topic": "status", "body": "posted from pi", "create_topic": true }),
        ),
        Reply::text("reported in"),
    ]);
    let env = pi_env(&fake);
    env.json(&["agents", "create", "--handle", "lead", "--name", "Lead", "--harness", "pi"]);
    crate::assert_eventually!(
        env.messages("home-lead").iter().any(|m| m["body"] == "posted from pi"),
        "the pi session's tool call did not post: {:#?}",
        fake.requests().iter().map(tool_names).collect::<Vec<_>>()
    );
    let posted = env.messages("home-lead").into_iter().find(|m| m["body"] == "posted from pi").unwrap();
    assert_eq!(posted["sender"]["handle"], "lead");
    let first = &fake.requests()[0];
    assert!(system_text(first).starts_with("# You are a Manager"), "{}", system_text(first));
    let tools = tool_names(first);
    for tool in ["comms_post_message", "agents_run_subagent", "bash", "read"] {
        assert!(tools.iter().any(|t| t == tool), "{tool} is not offered: {tools:?}");
    }
    assert!(!tools.iter().any(|t| t == "edit" || t == "write"), "a Manager edits nothing: {tools:?}");
    env.settled("lead");
    fake.push(Reply::text("read it"));
    env.ok(&["post", "--channel", "home-lead", "--topic", "ops", "--create-topic", "OPS_MARKER status please"]);
    crate::assert_eventually!(
        fake.requests().iter().any(|r| user_texts(r).iter().any(|t| t.contains("OPS_MARKER"))),
        "the post did not reach pi's next turn"
    );
}

#[test]
fn doctor_starts_a_confined_pi_session_through_its_extension_without_a_model_call() {
    let fake = FakeAnthropic::start(Vec::new());
    let env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    std::fs::write(
        env.data_dir().join("canopy.toml"),
        format!(
            "[harness.pi]\nbin = {bin:?}\nmodel = \"fake-claude\"\n\n[harness.pi.provider]\nbase_url = {url:?}\n\n\
             [roles.manager]\nharness = \"pi\"\n",
            bin = pi_bin().display().to_string(),
            url = fake.base_url(),
        ),
    )
    .unwrap();
    let report = env.json(&["doctor"]);
    let pi = report["checks"].as_array().unwrap().iter().find(|c| c["name"] == "pi").cloned().unwrap();
    assert_eq!((pi["required"].clone(), pi["ok"].clone()), (json!(true), json!(true)), "{report}");
    assert_eq!(pi["session_starts"], true, "{pi}");
    assert!(pi["version"].as_str().unwrap().contains("0.73.1"), "{pi}");
    assert!(fake.requests().is_empty(), "doctor made a model call");
}
