//! Every operator command, happy paths: init, agents, tree, channels, topics, post, read.

use std::os::unix::fs::PermissionsExt;

use crate::env::TestEnv;

#[test]
fn init_lays_down_the_workspace_and_refuses_a_second_time() {
    let env = TestEnv::new();
    let report = env.json(&["init", "--operator", "ops", "--mission", "Keep the build green"]);
    assert_eq!(report["operator"], "ops");
    assert!(report["workspace"]["id"].as_str().unwrap().starts_with("ws-"));

    let dir = env.data_dir();
    let mode = std::fs::metadata(dir.join("operator.token")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the token file must be private");
    let config = std::fs::read_to_string(dir.join("canopy.toml")).unwrap();
    assert!(config.contains("max_body_bytes = 65536"), "{config}");
    let token = std::fs::read_to_string(dir.join("operator.token")).unwrap();

    let err = env.refused(&["init", "--operator", "other"]);
    assert_eq!(err["code"], "conflict");
    assert_eq!(std::fs::read_to_string(dir.join("operator.token")).unwrap(), token, "a second init changed the token");
}

#[test]
fn init_validates_the_operator_handle() {
    let env = TestEnv::new();
    let err = env.refused(&["init", "--operator", "Bad Name"]);
    assert_eq!(err["code"], "invalid_argument");
    assert_eq!(err["field"], "operator");
    assert!(!env.data_dir().join("canopy.db").exists(), "a refused init left a database behind");
}

#[test]
fn init_makes_the_supervisor_and_the_broadcast_channels() {
    let env = TestEnv::started();
    let me = env.json(&["whoami"]);
    assert_eq!(me["account"]["handle"], "ops");
    assert_eq!(me["account"]["kind"], "operator");
    assert_eq!(me["workspace"]["mission"], "Keep the build green");

    let channels = env.json(&["channels"]);
    let channels = channels["channels"].as_array().unwrap();
    for name in ["announcements", "incidents"] {
        let c = channels.iter().find(|c| c["name"] == name).unwrap();
        assert_eq!(c["kind"], "broadcast");
        assert_eq!(c["post_policy"], "restricted");
        assert_eq!(c["subscription_policy"], "mandatory");
        assert_eq!(c["posters"], serde_json::json!(["supervisor"]));
    }
    let supervisor = env.json(&["agents", "show", "supervisor"]);
    assert_eq!(supervisor["account"]["role"], "supervisor");
    assert_eq!(supervisor["account"]["home_channel"], "home-supervisor");
}

#[test]
fn agents_create_list_show_and_the_tree() {
    let env = TestEnv::started();
    let created = env.json(&[
        "agents",
        "create",
        "--handle",
        "ci-manager",
        "--name",
        "CI Manager",
        "--role",
        "manager",
        "--charter",
        "Keep CI green",
    ]);
    assert_eq!(created["parent"], "supervisor");
    assert_eq!(created["home_channel"], "home-ci-manager");
    env.json(&[
        "agents",
        "create",
        "--handle",
        "flaky-tests",
        "--name",
        "Flaky Tests Manager",
        "--parent",
        "ci-manager",
    ]);

    let list = env.json(&["agents", "list"]);
    let handles: Vec<&str> = list["agents"].as_array().unwrap().iter().map(|a| a["handle"].as_str().unwrap()).collect();
    assert_eq!(handles, ["ci-manager", "flaky-tests", "supervisor"]);

    let show = env.json(&["agents", "show", "ci-manager"]);
    assert_eq!(show["account"]["charter"], "Keep CI green");
    assert_eq!(show["children"], serde_json::json!(["flaky-tests"]));
    let subs: Vec<(String, bool)> = show["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["channel"].as_str().unwrap().to_owned(), s["mandatory"].as_bool().unwrap()))
        .collect();
    for channel in ["announcements", "incidents", "home-ci-manager"] {
        assert!(subs.contains(&(channel.to_owned(), true)), "ci-manager is not subscribed to #{channel}: {subs:?}");
    }

    let tree = env.json(&["tree"]);
    assert_eq!(tree["root"]["handle"], "supervisor");
    assert_eq!(tree["root"]["children"][0]["handle"], "ci-manager");
    assert_eq!(tree["root"]["children"][0]["children"][0]["handle"], "flaky-tests");
    let text = env.ok(&["tree"]);
    assert!(text.contains("└── ci-manager"), "{text}");
}

#[test]
fn reparent_moves_agents_and_refuses_cycles_and_the_supervisor() {
    let env = TestEnv::started();
    env.json(&["agents", "create", "--handle", "a", "--name", "A"]);
    env.json(&["agents", "create", "--handle", "b", "--name", "B", "--parent", "a"]);
    env.json(&["agents", "create", "--handle", "c", "--name", "C"]);

    let moved = env.json(&["agents", "reparent", "b", "--parent", "c"]);
    assert_eq!(moved["parent"], "c");

    env.json(&["agents", "reparent", "a", "--parent", "b"]);
    let err = env.refused(&["agents", "reparent", "c", "--parent", "a"]);
    assert_eq!(err["code"], "conflict", "c > b > a: moving c under a is a cycle");
    let err = env.refused(&["agents", "reparent", "a", "--parent", "a"]);
    assert_eq!(err["code"], "conflict");
    let err = env.refused(&["agents", "reparent", "supervisor", "--parent", "a"]);
    assert_eq!(err["code"], "forbidden");
    let err = env.refused(&["agents", "reparent", "a", "--parent", "ops"]);
    assert_eq!(err["code"], "invalid_argument", "an operator cannot be a parent");
    assert_eq!(
        env.json(&["agents", "show", "c"])["account"]["parent"],
        "supervisor",
        "a refused reparent changed the tree"
    );
}

#[test]
fn channels_create_and_topics() {
    let env = TestEnv::started();
    let general = env.json(&["channels", "create", "release-train"]);
    assert_eq!(general["kind"], "general");
    assert_eq!(general["post_policy"], "open");
    assert_eq!(general["subscription_policy"], "optional");

    env.json(&["agents", "create", "--handle", "ci-manager", "--name", "CI Manager"]);
    let restricted =
        env.json(&["channels", "create", "ci-alerts", "--post-policy", "restricted", "--poster", "ci-manager"]);
    assert_eq!(restricted["posters"], serde_json::json!(["ci-manager"]));
    let broadcast = env.json(&["channels", "create", "all-hands", "--kind", "broadcast"]);
    assert_eq!(broadcast["subscribers"], 3, "supervisor, ci-manager and the operator");

    env.json(&["post", "--channel", "release-train", "--topic", "first", "--create-topic", "one"]);
    env.json(&["post", "--channel", "release-train", "--topic", "second", "--create-topic", "two"]);
    env.json(&["post", "--channel", "release-train", "--topic", "first", "three"]);
    let topics = env.json(&["topics", "--channel", "release-train"]);
    let names: Vec<&str> = topics["topics"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["first", "second"], "most recent activity first");
    assert_eq!(topics["topics"][0]["messages"], 2);
}

#[test]
fn post_and_read_grouped_by_topic_with_paging() {
    let env = TestEnv::started();
    env.json(&["post", "--channel", "announcements", "--topic", "hello", "--create-topic", "hi"]);
    env.json(&["post", "--channel", "#announcements", "--topic", "deploys", "--create-topic", "v1 is out"]);
    let from_stdin = env.run_with_stdin(
        &["--json", "post", "--channel", "announcements", "--topic", "hello"],
        "from stdin\nwith two lines",
    );
    assert!(from_stdin.status.success(), "{}", crate::env::text(&from_stdin.stderr));

    let page = env.json(&["read", "--channel", "announcements"]);
    let groups = page["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0]["topic"], "hello");
    assert_eq!(groups[0]["messages"].as_array().unwrap().len(), 2);
    assert_eq!(groups[0]["messages"][1]["body"], "from stdin\nwith two lines");
    assert_eq!(groups[0]["messages"][0]["sender"]["handle"], "ops");
    assert_eq!(groups[1]["topic"], "deploys");

    let only = env.json(&["read", "--channel", "announcements", "--topic", "deploys"]);
    assert_eq!(only["groups"].as_array().unwrap().len(), 1);

    let first = env.json(&["read", "--channel", "announcements", "--limit", "2", "--from-start"]);
    assert_eq!(first["more"], true);
    let after = first["next_after"].as_u64().unwrap().to_string();
    let rest = env.json(&["read", "--channel", "announcements", "--after", &after]);
    assert_eq!(rest["more"], false);
    assert_eq!(rest["groups"][0]["messages"][0]["body"], "from stdin\nwith two lines");

    let text = env.ok(&["read", "--channel", "announcements"]);
    assert!(text.contains("ops (operator): hi"), "{text}");
}

#[test]
fn mentions_are_parsed_and_stored() {
    let env = TestEnv::started();
    env.json(&["agents", "create", "--handle", "ci-manager", "--name", "CI Manager"]);
    let posted = env.json(&[
        "post",
        "--channel",
        "home-ci-manager",
        "--topic",
        "ask",
        "--create-topic",
        "@ci-manager and @supervisor, see ops@example.com",
    ]);
    assert_eq!(posted["message"]["mentions"], serde_json::json!(["ci-manager", "supervisor"]));
}

#[test]
fn a_retried_post_with_its_idempotency_key_stores_one_message() {
    let env = TestEnv::started();
    let args =
        ["post", "--channel", "announcements", "--topic", "t", "--create-topic", "--idempotency-key", "key-1", "once"];
    let first = env.json(&args);
    let second = env.json(&args);
    assert_eq!(first["duplicate"], false);
    assert_eq!(second["duplicate"], true);
    assert_eq!(first["message"]["seq"], second["message"]["seq"]);
    let page = env.json(&["read", "--channel", "announcements"]);
    assert_eq!(page["groups"][0]["messages"].as_array().unwrap().len(), 1);

    let err =
        env.refused(&["post", "--channel", "announcements", "--topic", "t", "--idempotency-key", "key-1", "different"]);
    assert_eq!(err["code"], "conflict");
    assert_eq!(err["field"], "idempotency_key");
}
