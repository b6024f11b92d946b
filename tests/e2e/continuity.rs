//! Continuity end to end with the scripted harness: the continuity block at the head of the
//! first input after a start, a compaction and a `kill -9` restart; `history_search` by query
//! and by cursor over MCP with the session's own token; planted secrets in tool output coming
//! back redacted from `history_search` and `canopy watch`; `canopy usage` summing what the
//! harness reported.
//!
//! Owns these scenarios only; the transcript helpers are `delivery`'s, the agent helpers
//! `sessions`'.

use serde_json::{Value, json};

use crate::delivery::{QUICK, inputs, inputs_containing};
use crate::env::TestEnv;
use crate::sessions::process_env;

/// `QUICK`, plus a short runner lifetime so a `kill -9`ed daemon's sessions move at once.
fn config() -> Vec<(&'static str, &'static str)> {
    [QUICK, &[("runner_ttl = \"10s\"", "runner_ttl = \"1s\"")]].concat()
}

/// Calls a native tool over MCP with `agent`'s live session token, as its harness would.
pub(crate) fn call_tool(
    env: &TestEnv,
    agent: &str,
    incarnation: u64,
    tool: &str,
    args: Value,
) -> canopy_scripted::mcp::ToolOutcome {
    let harness = process_env(env.wait_harness_pid(agent, incarnation));
    let (url, token) = (harness["CANOPY_MCP_URL"].clone(), harness["CANOPY_MCP_TOKEN"].clone());
    env.rt.block_on(async {
        let mut client = canopy_scripted::mcp::McpClient::new(&url, &token).unwrap();
        client.call_tool(tool, args).await.unwrap()
    })
}

const BLOCK: &str = "[canopy continuity]";

#[test]
fn the_continuity_block_heads_the_first_input_after_a_start_a_compaction_and_a_kill_9_restart() {
    let mut env = TestEnv::started_with(&config());
    env.create_scripted(
        "mgr",
        r#"
[[rule]]
match = { kind = "message", text_contains = "compact now" }
actions = [{ say = "compacting" }, { compact = true }]
[[rule]]
actions = [{ say = "noted" }]
"#,
    );
    crate::assert_eventually!(env.roster_entry("mgr")["presence"] == "idle", "mgr never went idle");
    let first = inputs(&env, "mgr").remove(0);
    let text = first["text"].as_str().unwrap();
    assert!(text.starts_with(BLOCK), "the first input must open with the block: {text}");
    assert!(text.contains("session 1 (first start)") && text.contains("history_search"), "{text}");
    let block_len = text.find("Session 1 started").unwrap();
    assert!(text[..block_len].chars().count() <= 1500 + 2, "{text}");
    // Never the system prompt: block-0 stays what the role prompt says.
    let prompt = std::fs::read_to_string(env.data_dir().join("sessions/mgr/1/system-prompt.md")).unwrap();
    assert!(!prompt.contains(BLOCK));

    // A compaction: the next turn's first input carries the block, once.
    env.ok(&["post", "--channel", "home-mgr", "--topic", "ops", "--create-topic", "compact now please"]);
    crate::assert_eventually!(
        env.activity("mgr").iter().any(|i| i["kind"] == "compaction_ended"),
        "the compaction was not reported"
    );
    crate::assert_eventually!(env.roster_entry("mgr")["presence"] == "idle", "mgr never went idle after compacting");
    env.ok(&["post", "--channel", "home-mgr", "--topic", "ops", "after the compaction"]);
    crate::assert_eventually!(
        !inputs_containing(&env, "mgr", "after the compaction").is_empty(),
        "the next message never arrived"
    );
    let after = inputs_containing(&env, "mgr", "after the compaction").remove(0);
    let text = after["text"].as_str().unwrap();
    assert!(text.starts_with(BLOCK), "{text}");
    assert!(text.contains("your context was just compacted") && text.contains("Compaction checkpoints"), "{text}");
    assert_eq!(after["position"], 0, "the block rides the turn's first input");
    env.ok(&["post", "--channel", "home-mgr", "--topic", "ops", "one more"]);
    crate::assert_eventually!(!inputs_containing(&env, "mgr", "one more").is_empty(), "no later turn");
    let later = inputs_containing(&env, "mgr", "one more").remove(0);
    assert!(!later["text"].as_str().unwrap().contains(BLOCK), "the block is owed once per compaction");

    // kill -9 of the daemon (its harness goes with it); the restarted session opens with the block.
    env.kill_daemon();
    env.start_daemon();
    crate::assert_eventually!(
        inputs(&env, "mgr").iter().any(|i| i["text"].as_str().unwrap_or("").contains("Session 2 started")),
        "no second session after the restart: {:?}",
        inputs(&env, "mgr")
    );
    let restarted = inputs(&env, "mgr")
        .into_iter()
        .find(|i| i["text"].as_str().unwrap_or("").contains("Session 2 started"))
        .unwrap();
    let text = restarted["text"].as_str().unwrap();
    assert!(text.starts_with(BLOCK) && text.contains("session 2 (restarted; the previous session ended"), "{text}");
    assert!(text.contains("Compaction checkpoints"), "checkpoints survive the restart: {text}");
}

#[test]
fn history_search_finds_an_earlier_message_by_query_and_pages_back_and_redacts_tool_output() {
    let env = TestEnv::started_with(&config());
    let image = format!("data:image/png;base64,iVBORw0KGgo{}", "AAAASUhEUgAAAAEAAAABCAYAAAAfFcSJ".repeat(8));
    let key = "sk-ant-api03-Q7zPlantedKey0123456789abcdefXYZ";
    let link = "https://app.example.com/magic-login?token=Q7zMagicToken998877&next=home";
    let mut actions: Vec<String> = (0..12)
        .map(|i| {
            let body = if i == 2 { "the migration codeword is heliotrope".to_owned() } else { format!("routine note {i}") };
            format!(
                "{{ call = \"comms_post_message\", args = {{ channel = \"{{home}}\", topic = \"notes\", body = \"{body}\", create_topic = true }} }}"
            )
        })
        .collect();
    actions.push(format!(
        "{{ fake_tool = \"bash\", output = \"deploy log: key {key} screenshot {image} login {link} done\" }}"
    ));
    let script = format!("[[rule]]\nmatch = {{ kind = \"start\" }}\nactions = [\n  {}\n]\n", actions.join(",\n  "));
    env.create_scripted("mgr", &script);
    crate::assert_eventually!(
        env.activity("mgr").iter().any(|i| i["kind"] == "tool_result" && i["detail"]["name"] == "bash"),
        "the fake tool never ran"
    );
    let secrets = ["Q7zPlantedKey0123456789", "iVBORw0KGgo", "AAAASUhEUgAAAAEAAAAB", "Q7zMagicToken998877"];

    // By query: the one message, as an attributed, fenced excerpt.
    let found = call_tool(&env, "mgr", 1, "history_search", json!({ "query": "HELIOTROPE" }));
    assert!(!found.is_error, "{:?}", found.output);
    let items = found.output["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{}", found.output);
    assert_eq!(items[0]["kind"], "message");
    assert_eq!(items[0]["sent"], true);
    assert_eq!(items[0]["message"]["channel"], "home-mgr");
    assert_eq!(items[0]["message"]["topic"], "notes");
    assert_eq!(items[0]["message"]["sender"]["handle"], "mgr");
    assert!(items[0]["message"]["created_at"].is_string());
    let rendered = found.raw["content"][0]["text"].as_str().unwrap_or("");
    assert!(
        rendered.contains("from @mgr (manager) in #home-mgr > notes") && rendered.contains("heliotrope"),
        "{rendered}"
    );

    // Paging back with the cursor: every message once, newest first, then the end.
    let mut seqs = Vec::new();
    let mut before: Option<String> = None;
    for _ in 0..10 {
        let mut args = json!({ "limit": 5 });
        if let Some(cursor) = &before {
            args["before"] = json!(cursor);
        }
        let page = call_tool(&env, "mgr", 1, "history_search", args);
        assert!(!page.is_error, "{:?}", page.output);
        seqs.extend(page.output["items"].as_array().unwrap().iter().map(|i| i["message"]["seq"].as_u64().unwrap()));
        match page.output["next_before"].as_str() {
            Some(cursor) => before = Some(cursor.to_owned()),
            None => break,
        }
    }
    assert!(seqs.len() >= 12, "{seqs:?}");
    assert!(seqs.windows(2).all(|w| w[0] > w[1]), "newest first, no repeats: {seqs:?}");

    // Bad arguments are typed and name their field.
    let bad = call_tool(&env, "mgr", 1, "history_search", json!({ "limit": 51 }));
    assert!(bad.is_error);
    assert_eq!(bad.output["error"]["field"], "limit");
    let bad = call_tool(&env, "mgr", 1, "history_search", json!({ "before": "yesterday" }));
    assert_eq!(bad.output["error"]["field"], "before");

    // Tool events only when asked, as name, status and a redacted preview.
    let tools =
        call_tool(&env, "mgr", 1, "history_search", json!({ "query": "deploy log", "include_tool_events": true }));
    let shown = tools.raw.to_string();
    let event = tools.output["items"].as_array().unwrap().iter().find(|i| i["kind"] == "tool_event").cloned();
    let event = event.unwrap_or_else(|| panic!("no tool event: {shown}"));
    assert_eq!(event["name"], "bash");
    assert_eq!(event["status"], "ok");
    let preview = event["preview"].as_str().unwrap();
    assert!(
        preview.contains("[redacted]")
            && preview.contains("[data uri image/png")
            && preview.contains("[login link removed]"),
        "{preview}"
    );
    for secret in secrets {
        assert!(!shown.contains(secret), "history_search leaked {secret}: {shown}");
    }

    // canopy watch, text and JSON, shows the same call redacted.
    for json in [false, true] {
        let mut args = vec!["watch", "mgr", "--no-follow", "--tail", "1000"];
        if json {
            args.insert(0, "--json");
        }
        let watched = env.ok(&args);
        assert!(watched.contains("bash"), "{watched}");
        for secret in secrets {
            assert!(!watched.contains(secret), "canopy watch leaked {secret}: {watched}");
        }
    }

    // Another agent cannot read mgr's history through the tool.
    env.create_scripted("peer", "");
    let other =
        call_tool(&env, "peer", 1, "history_search", json!({ "query": "heliotrope", "include_tool_events": true }));
    assert_eq!(other.output["items"].as_array().map(Vec::len), Some(0), "{}", other.output);
}

#[test]
fn canopy_usage_sums_the_usage_the_scripted_harness_reported() {
    // No estimates: the sums are the reports' own (`budgets` tests the estimate).
    let no_estimate = [
        ("unreported_turn_usd = 0.05", "unreported_turn_usd = 0.0"),
        ("unreported_turn_tokens = 10000", "unreported_turn_tokens = 0"),
    ];
    let env = TestEnv::started_with(&[config(), no_estimate.to_vec()].concat());
    env.create_scripted(
        "mgr",
        r#"
[[rule]]
match = { kind = "start" }
actions = [
  { usage = { input_tokens = 1200, output_tokens = 300, cache_read_tokens = 50, cost_usd = 0.25 } },
  { say = "thinking" },
  { usage = { input_tokens = 800, output_tokens = 200 } },
]
"#,
    );
    env.create_scripted("quiet", "");
    crate::assert_eventually!(
        env.json(&["usage", "--agent", "mgr"])["total"]["reports"] == 2,
        "the usage never arrived: {}",
        env.json(&["usage"])
    );
    // `quiet` (and the Supervisor) report zero for their turns: nothing added but reports.
    let all = env.json(&["usage", "--since", "1h"]);
    assert_eq!(all["total"]["input_tokens"], 2000);
    assert_eq!(all["total"]["output_tokens"], 500);
    assert_eq!(all["total"]["cache_read_tokens"], 50);
    assert_eq!(all["total"]["cost_usd"], 0.25);
    assert_eq!(all["total"]["reports_without_cost"], 1);
    let first = &all["agents"][0];
    assert_eq!(
        (first["agent"].as_str(), &first["totals"]["input_tokens"]),
        (Some("mgr"), &serde_json::json!(2000)),
        "{all}"
    );
    let one = env.json(&["usage", "--agent", "mgr"]);
    assert_eq!(one["sessions"][0]["incarnation"], 1);
    assert_eq!(one["turns"].as_array().unwrap().len(), 1, "both reports belong to one turn: {one}");
    let text = env.ok(&["usage", "--agent", "mgr"]);
    let first = text.lines().next().unwrap_or("");
    assert!(first.find("input") < first.find("cost"), "tokens come first: {text}");
    assert!(text.contains("2000") && text.contains("500") && text.contains("$0.2500+"), "{text}");
    // A bad agent or duration is refused, naming what is wrong.
    assert_eq!(env.refused(&["usage", "--agent", "Not A Handle"])["field"], "agent");
    assert!(!env.run(&["usage", "--since", "soon"]).status.success());
}

/// A harness that reports tokens only gets a cost computed from `[pricing]` by its model (a
/// scripted session has none: its harness's name), marked computed; a reported cost is kept.
#[test]
fn usage_without_a_reported_cost_is_priced_from_pricing_and_marked_computed() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    let config = env.data_dir().join("canopy.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[pricing.scripted]\ninput = 2.0\ncached_input = 0.5\noutput = 10.0\n");
    std::fs::write(&config, text).unwrap();
    env.edit_config(&[("sync_interval = \"2s\"", "sync_interval = \"200ms\"")]);
    env.start_daemon();
    env.create_scripted(
        "tokens",
        "[[rule]]\nmatch = { kind = \"start\" }\nactions = [{ usage = { input_tokens = 1000000, output_tokens = 100000, cache_read_tokens = 200000 } }]\n",
    );
    env.create_scripted(
        "priced",
        "[[rule]]\nmatch = { kind = \"start\" }\nactions = [{ usage = { input_tokens = 1000000, output_tokens = 100000, cost_usd = 0.25 } }]\n",
    );
    let row = |agent: &str| -> Option<serde_json::Value> {
        env.json(&["usage"])["agents"].as_array()?.iter().find(|r| r["agent"] == agent).cloned()
    };
    crate::assert_eventually!(row("tokens").is_some() && row("priced").is_some(), "no usage reported");
    let tokens = row("tokens").unwrap();
    // 1M input at $2 + 0.2M cached at $0.5 + 0.1M output at $10 per million.
    let cost = tokens["totals"]["cost_usd"].as_f64().unwrap();
    assert!((cost - 3.1).abs() < 1e-9, "{tokens}");
    assert_eq!(tokens["totals"]["reports_with_computed_cost"], 1, "{tokens}");
    let priced = row("priced").unwrap();
    assert_eq!(priced["totals"]["cost_usd"], 0.25, "{priced}");
    assert_eq!(priced["totals"]["reports_with_computed_cost"], 0, "{priced}");
    assert!(env.ok(&["usage"]).contains("(computed)"));
}

#[test]
fn the_daemon_fills_the_text_index_behind_the_posts() {
    let env = TestEnv::started();
    let mut last = 0;
    for i in 0..30 {
        let posted = env.json(&[
            "post",
            "--channel",
            "announcements",
            "--topic",
            "news",
            "--create-topic",
            &format!("note {i}"),
        ]);
        last = posted["message"]["seq"].as_i64().unwrap();
    }
    // Read beside the running daemon, as any reader of the WAL database may.
    let db = canopy_config::DataDir::new(env.data_dir()).db();
    let indexed = || -> i64 {
        let conn = rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        conn.query_row("SELECT indexed_through FROM text_index", [], |r| r.get(0)).unwrap()
    };
    crate::assert_eventually!(indexed() >= last, "the text index never reached seq {last}");
}
