//! Bad input through the CLI: each gets its typed error and writes nothing.

use crate::env::TestEnv;

/// The number of messages and agents, to prove a refusal wrote nothing.
fn footprint(env: &TestEnv) -> (usize, usize, usize) {
    let agents = env.json(&["agents", "list"])["agents"].as_array().unwrap().len();
    let channels = env.json(&["channels"])["channels"].as_array().unwrap().len();
    let sync: usize = env.json(&["channels"])["channels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["last_seq"].as_u64().unwrap() as usize)
        .max()
        .unwrap_or(0);
    (agents, channels, sync)
}

#[test]
fn bad_input_gets_typed_errors_and_changes_nothing() {
    let env = TestEnv::started();
    env.json(&["post", "--channel", "announcements", "--topic", "existing", "--create-topic", "x"]);
    let before = footprint(&env);

    let cases: &[(&[&str], &str, Option<&str>)] = &[
        (&["post", "--channel", "nowhere", "--topic", "t", "--create-topic", "x"], "not_found", Some("channel")),
        (&["post", "--channel", "announcements", "--topic", "new-topic", "x"], "not_found", Some("topic")),
        (&["post", "--channel", "Bad.Name", "--topic", "t", "x"], "invalid_argument", Some("channel")),
        (
            &["post", "--channel", "announcements", "--topic", " padded", "--create-topic", "x"],
            "invalid_argument",
            Some("topic"),
        ),
        (
            &["post", "--channel", "announcements", "--topic", "t", "--create-topic", "   "],
            "invalid_argument",
            Some("body"),
        ),
        (
            &[
                "post",
                "--channel",
                "announcements",
                "--topic",
                "t",
                "--create-topic",
                "--idempotency-key",
                "has space",
                "x",
            ],
            "invalid_argument",
            Some("idempotency_key"),
        ),
        (&["agents", "create", "--handle", "Bad_Handle", "--name", "X"], "invalid_argument", Some("handle")),
        (&["agents", "create", "--handle", "all", "--name", "X"], "invalid_argument", Some("handle")),
        (&["agents", "create", "--handle", "x", "--name", "X", "--parent", "ghost"], "not_found", Some("parent")),
        (&["agents", "create", "--handle", "x", "--name", "X", "--role", "supervisor"], "forbidden", None),
        (&["agents", "create", "--handle", "supervisor", "--name", "X"], "conflict", Some("handle")),
        (&["agents", "create", "--handle", "x", "--name", " "], "invalid_argument", Some("name")),
        (&["agents", "show", "ghost"], "not_found", Some("handle")),
        (&["agents", "reparent", "ghost", "--parent", "supervisor"], "not_found", Some("handle")),
        (&["channels", "create", "home-mine"], "invalid_argument", Some("name")),
        (&["channels", "create", "announcements"], "conflict", Some("name")),
        (&["channels", "create", "x", "--poster", "supervisor"], "invalid_argument", Some("posters")),
        (
            &["channels", "create", "x", "--post-policy", "restricted", "--poster", "ghost"],
            "not_found",
            Some("posters"),
        ),
        (&["topics", "--channel", "nowhere"], "not_found", Some("channel")),
        (&["read", "--channel", "announcements", "--topic", "missing"], "not_found", Some("topic")),
        (&["read", "--channel", "announcements", "--limit", "0"], "invalid_argument", Some("limit")),
        (&["read", "--channel", "announcements", "--limit", "5000"], "invalid_argument", Some("limit")),
    ];
    for (args, code, field) in cases {
        let err = env.refused(args);
        assert_eq!(err["code"], *code, "canopy {args:?}: {err}");
        if let Some(field) = field {
            assert_eq!(err["field"], *field, "canopy {args:?}: {err}");
        }
        assert!(!err["message"].as_str().unwrap_or("").is_empty(), "canopy {args:?} gave no message");
    }
    assert_eq!(footprint(&env), before, "a refused request changed the workspace");
}

#[test]
fn a_missing_topic_error_lists_the_existing_topics() {
    let env = TestEnv::started();
    env.json(&["post", "--channel", "announcements", "--topic", "deploys", "--create-topic", "x"]);
    env.json(&["post", "--channel", "announcements", "--topic", "outages", "--create-topic", "y"]);
    let err = env.refused(&["post", "--channel", "announcements", "--topic", "deploy", "z"]);
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("\"deploys\"") && message.contains("\"outages\""), "{message}");
}

#[test]
fn oversized_bodies_are_refused_at_the_configured_limit() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    let config = env.data_dir().join("canopy.toml");
    let text = std::fs::read_to_string(&config).unwrap().replace("max_body_bytes = 65536", "max_body_bytes = 100");
    std::fs::write(&config, text).unwrap();
    env.start_daemon();

    let at_limit = "x".repeat(100);
    env.json(&["post", "--channel", "announcements", "--topic", "t", "--create-topic", &at_limit]);
    let over = "x".repeat(101);
    let err = env.refused(&["post", "--channel", "announcements", "--topic", "t", &over]);
    assert_eq!(err["code"], "limit_exceeded");
    assert_eq!(err["field"], "body");
}

#[test]
fn the_default_body_limit_is_64_kib() {
    let env = TestEnv::started();
    let body = "y".repeat(64 * 1024 + 1);
    let out =
        env.run_with_stdin(&["--json", "post", "--channel", "announcements", "--topic", "t", "--create-topic"], &body);
    assert_eq!(out.status.code(), Some(1));
    let err: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(err["error"]["code"], "limit_exceeded");
}

#[test]
fn a_bad_config_key_stops_the_daemon_with_exit_64_naming_it() {
    let env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    let config = env.data_dir().join("canopy.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[delivery]\nquiet_window = \"2s\"\n");
    std::fs::write(&config, &text).unwrap();
    let out = env.command(&["daemon", "--nats-url", &env.nats_url()]).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(crate::env::text(&out.stderr).contains("delivery"), "{}", crate::env::text(&out.stderr));

    std::fs::write(&config, "[limits]\nmax_body_bytes = \"lots\"\n").unwrap();
    let out = env.command(&["daemon", "--nats-url", &env.nats_url()]).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(crate::env::text(&out.stderr).contains("limits.max_body_bytes"), "{}", crate::env::text(&out.stderr));
    // A standalone runner refuses the same way, before it connects to anything.
    let out = env.command(&["runner", "--nats-url", &env.nats_url()]).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", crate::env::text(&out.stderr));
    assert!(crate::env::text(&out.stderr).contains("limits.max_body_bytes"), "{}", crate::env::text(&out.stderr));
}

#[test]
fn the_daemon_needs_a_workspace_and_commands_need_a_daemon() {
    let env = TestEnv::new();
    let out = env.command(&["daemon", "--nats-url", &env.nats_url()]).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(crate::env::text(&out.stderr).contains("canopy init"), "{}", crate::env::text(&out.stderr));
    env.ok(&["init", "--operator", "ops"]);
    let out = env.run(&["--json", "tree"]);
    assert_eq!(out.status.code(), Some(69));
    let err: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(err["error"]["code"], "unavailable");
}
