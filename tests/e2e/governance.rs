//! Channel governance through the CLI: coordination and direct channels that follow the
//! tree, topic rename and resolve, the pinned board, mention reporting, bounded mailboxes.

use crate::env::TestEnv;

fn channel(env: &TestEnv, name: &str) -> serde_json::Value {
    env.json(&["channels"])["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
        .unwrap_or_default()
}

fn subscribed(env: &TestEnv, agent: &str, channel: &str) -> bool {
    env.json(&["agents", "show", agent])["subscriptions"].as_array().unwrap().iter().any(|s| s["channel"] == channel)
}

#[test]
fn coordination_and_direct_channels_follow_the_tree() {
    let env = TestEnv::started();
    env.json(&["agents", "create", "--handle", "ci-manager", "--name", "CI Manager"]);
    env.json(&["agents", "create", "--handle", "flaky", "--name", "Flaky Tests", "--parent", "ci-manager"]);
    let coord = channel(&env, "coord-ci-manager");
    assert_eq!(coord["kind"], "coordination");
    assert_eq!(coord["post_policy"], "owner_only");
    assert_eq!(coord["subscription_policy"], "mandatory");
    assert_eq!(coord["owner"], "ci-manager");
    assert!(subscribed(&env, "flaky", "coord-ci-manager"));
    let direct = channel(&env, "dm-ci-manager-flaky");
    assert_eq!(direct["kind"], "direct");
    assert_eq!(direct["posters"], serde_json::json!(["ci-manager", "flaky"]), "a two-way path with the parent");

    env.json(&["agents", "reparent", "flaky", "--parent", "supervisor"]);
    assert!(!subscribed(&env, "flaky", "coord-ci-manager"), "reparent must leave the old coordination channel");
    assert!(subscribed(&env, "flaky", "coord-supervisor"));
    assert!(subscribed(&env, "flaky", "dm-flaky-supervisor"));
}

#[test]
fn operators_rename_and_resolve_topics() {
    let env = TestEnv::started();
    env.json(&["post", "--channel", "announcements", "--topic", "deploy", "--create-topic", "x"]);
    env.json(&["post", "--channel", "announcements", "--topic", "other", "--create-topic", "y"]);
    env.json(&["topics", "--channel", "announcements", "rename", "deploy", "deploys"]);
    let err = env.refused(&["topics", "--channel", "announcements", "rename", "deploys", "other"]);
    assert_eq!(err["code"], "conflict");
    env.json(&["topics", "--channel", "announcements", "resolve", "deploys"]);
    let topics = env.json(&["topics", "--channel", "announcements"]);
    let deploys = topics["topics"].as_array().unwrap().iter().find(|t| t["name"] == "deploys").cloned().unwrap();
    assert_eq!(deploys["resolved"], true);
    assert_eq!(deploys["messages"], 1, "a rename keeps the topic's messages");
    let err = env.refused(&["topics", "--channel", "announcements", "resolve", "missing"]);
    assert_eq!(err["code"], "not_found");
}

#[test]
fn the_board_pins_pointers_into_its_own_channel() {
    let env = TestEnv::started();
    let kept = env.json(&["post", "--channel", "announcements", "--topic", "t", "--create-topic", "keep this"]);
    let elsewhere = env.json(&["post", "--channel", "incidents", "--topic", "t", "--create-topic", "not here"]);
    let seq = kept["message"]["seq"].to_string();
    let board = env.json(&["board", "--channel", "announcements", "pin", &seq]);
    assert_eq!(board["pins"][0]["body"], "keep this");
    let other = elsewhere["message"]["seq"].to_string();
    let err = env.refused(&["board", "--channel", "announcements", "pin", &other]);
    assert_eq!(err["code"], "invalid_argument");
    assert_eq!(env.json(&["board", "--channel", "announcements"])["pins"].as_array().unwrap().len(), 1);
    // Unpinned, it is off the board and in the audit; unpinning again names what is missing.
    let board = env.json(&["board", "--channel", "announcements", "unpin", &seq]);
    assert_eq!(board["pins"].as_array().unwrap().len(), 0, "{board}");
    assert!(env.ok(&["--json", "audit"]).contains("board.unpin"));
    let err = env.refused(&["board", "--channel", "announcements", "unpin", &seq]);
    assert_eq!((err["code"].as_str(), err["field"].as_str()), (Some("not_found"), Some("seq")), "{err}");
}

#[test]
fn mentions_that_reach_no_one_are_reported_to_the_sender() {
    let env = TestEnv::started();
    env.json(&["agents", "create", "--handle", "ci-manager", "--name", "CI Manager"]);
    env.json(&["agents", "create", "--handle", "docs", "--name", "Docs"]);
    let posted = env.json(&[
        "post",
        "--channel",
        "home-ci-manager",
        "--topic",
        "t",
        "--create-topic",
        "@ghost and @docs, see this",
    ]);
    assert_eq!(posted["unknown_mentions"], serde_json::json!(["ghost"]));
    let refused = posted["outcomes"].as_array().unwrap().iter().find(|o| o["recipient"] == "docs").cloned().unwrap();
    assert_eq!(refused["outcome"], "refused", "docs is not subscribed to ci-manager's home: {posted}");
    let held = posted["outcomes"].as_array().unwrap().iter().find(|o| o["recipient"] == "ci-manager").cloned().unwrap();
    assert_eq!(held["outcome"], "held", "ci-manager has no session here: {posted}");
}

#[test]
fn a_full_mailbox_is_shown_and_told_never_dropped() {
    let env = TestEnv::started_with(&[
        ("max_pending = 1000", "max_pending = 3"),
        ("stall_after = \"10m\"", "stall_after = \"1s\""),
    ]);
    env.json(&["agents", "create", "--handle", "away", "--name", "Away", "--script", &write_quiet(&env)]);
    env.json(&["agents", "stop", "away"]);
    for i in 0..5 {
        env.json(&["post", "--channel", "home-away", "--topic", "t", "--create-topic", &format!("message {i}")]);
    }
    crate::assert_eventually!(
        env.roster_entry("away")["overflow"] == true,
        "the roster never showed the overflow: {}",
        env.roster_entry("away")
    );
    assert!(env.roster_entry("away")["pending"].as_u64().unwrap() >= 5, "nothing is dropped");
    crate::assert_eventually!(
        env.messages("home-away")
            .iter()
            .any(|m| m["sender"]["handle"] == "canopy" && m["body"].as_str().unwrap().contains("waiting")),
        "the operator was not told"
    );
}

fn write_quiet(env: &TestEnv) -> String {
    let path = env.dir.path().join("quiet.toml");
    std::fs::write(&path, "").unwrap();
    path.display().to_string()
}
