//! Budgets end to end with the scripted harness's `usage` action: one notice at 80% and one
//! at 100% in the home channel; then posts are `held (budget)` and no turn starts; raising
//! the budget delivers them exactly once; a spent subtree budget holds a child below it
//! (even one created after); a spawn proposal that does not fit is refused naming what is
//! left, one that fits is carved out at approval; a subagent run is refused over budget; a
//! turn whose usage never arrives counts at the configured estimate, and a scripted turn that says
//! nothing of usage costs nothing.
//!
//! Owns these scenarios only; transcript helpers are `delivery`'s, tool calls `continuity`'s.

use serde_json::{Value, json};

use crate::continuity::call_tool;
use crate::delivery::{QUICK, inputs, inputs_containing};
use crate::env::TestEnv;

/// `QUICK`, with turns that report nothing estimated at one cent and no tokens, so the
/// dollar figures below are the scripts' own plus those cents.
fn config() -> Vec<(&'static str, &'static str)> {
    [
        QUICK,
        &[
            ("unreported_turn_usd = 0.05", "unreported_turn_usd = 0.01"),
            ("unreported_turn_tokens = 10000", "unreported_turn_tokens = 0"),
        ],
    ]
    .concat()
}

/// Spends what each message asks for: `spend 85` reports 85 cents, and so on.
const SPENDER: &str = r#"
[[rule]]
match = { kind = "message", text_contains = "spend 85" }
actions = [{ usage = { input_tokens = 1000, output_tokens = 100, cost_usd = 0.85 } }, { say = "spent 85" }]

[[rule]]
match = { kind = "message", text_contains = "spend 20" }
actions = [{ usage = { input_tokens = 1000, output_tokens = 100, cost_usd = 0.20 } }, { say = "spent 20" }]

[[rule]]
match = { kind = "message", text_contains = "spend 120" }
actions = [{ usage = { input_tokens = 1000, output_tokens = 100, cost_usd = 1.20 } }, { say = "spent 120" }]

[[rule]]
match = { kind = "message" }
actions = [{ say = "read it" }]
"#;

fn post(env: &TestEnv, channel: &str, body: &str) -> Value {
    env.json(&["post", "--channel", channel, "--topic", "work", "--create-topic", body])
}

/// The bodies of Canopy's posts in a home channel that contain `needle`.
fn notices(env: &TestEnv, channel: &str, needle: &str) -> Vec<String> {
    let page = env.json(&["read", "--channel", channel, "--limit", "200"]);
    page["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["messages"].as_array().unwrap().iter())
        .filter(|m| m["sender"]["handle"] == "canopy")
        .filter_map(|m| m["body"].as_str())
        .filter(|b| b.contains(needle))
        .map(str::to_owned)
        .collect()
}

fn budget_of<'a>(usage: &'a Value, owner: &str) -> &'a Value {
    usage["budgets"].as_array().unwrap().iter().find(|b| b["owner"] == owner).unwrap_or(&Value::Null)
}

#[test]
fn an_agent_is_told_at_80_and_100_percent_then_held_and_a_raise_delivers_what_waited_once() {
    let env = TestEnv::started_with(&config());
    env.create_scripted("spender", SPENDER);
    env.settled("spender");
    let set = env.json(&["agents", "budget", "spender", "--usd", "1", "--period", "1day"]);
    assert_eq!(set["budget"]["limit"]["usd"], 1.0, "{set}");
    assert_eq!(set["budget"]["period"], "1day", "{set}");

    post(&env, "home-spender", "please spend 85");
    crate::assert_eventually!(notices(&env, "home-spender", "at 80%").len() == 1, "no 80% notice");
    env.settled("spender");
    post(&env, "home-spender", "please spend 20");
    crate::assert_eventually!(notices(&env, "home-spender", "is spent").len() == 1, "no 100% notice");
    assert_eq!(notices(&env, "home-spender", "at 80%").len(), 1, "80% is told once");

    // Over budget: a post is held and says why; the agent takes no turn.
    let held = post(&env, "home-spender", "HELD_MARKER do this later");
    let outcome = &held["outcomes"][0];
    assert_eq!(outcome["outcome"], "held", "{held}");
    assert!(outcome["reason"].as_str().unwrap().starts_with("budget: @spender's budget is spent"), "{held}");
    let mention = post(&env, "home-spender", "@spender MENTION_MARKER now");
    assert_eq!(mention["outcomes"][0]["outcome"], "held", "a mention does not steer or wake either: {mention}");
    let text = env.ok(&["post", "--channel", "home-spender", "--topic", "work", "TEXT_MARKER"]);
    assert!(text.contains("held") && text.contains("(budget: "), "{text}");
    let entry = env.roster_entry("spender");
    assert_eq!(entry["presence"], "paused_budget", "{entry}");
    assert_eq!(entry["budget"]["level"], "over", "{entry}");
    assert!(env.ok(&["roster"]).contains("over budget"));
    let usage = env.json(&["usage"]);
    let budget = budget_of(&usage, "spender");
    assert_eq!((budget["level"].as_str(), budget["scope"].as_str()), (Some("over"), Some("agent")), "{usage}");
    assert!(env.ok(&["usage"]).contains("SPENT"));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(inputs_containing(&env, "spender", "HELD_MARKER").is_empty(), "a turn started over budget");
    let before = inputs(&env, "spender").len();

    // Raised: what waited is delivered, each message exactly once.
    let raised = env.json(&["agents", "budget", "spender", "--usd", "5", "--period", "1day"]);
    assert_eq!(raised["released"], json!(["spender"]), "{raised}");
    crate::assert_eventually!(
        !inputs_containing(&env, "spender", "HELD_MARKER").is_empty(),
        "the held message never arrived after the raise"
    );
    env.settled("spender");
    for marker in ["HELD_MARKER", "MENTION_MARKER", "TEXT_MARKER"] {
        assert_eq!(inputs_containing(&env, "spender", marker).len(), 1, "{marker} delivered once");
    }
    assert!(inputs(&env, "spender").len() > before);
    assert_eq!(env.roster_entry("spender")["presence"], "idle");
    // Bad input is refused naming the field, and changes nothing.
    assert_eq!(env.refused(&["agents", "budget", "spender", "--usd=-3"])["field"], "usd");
    assert_eq!(env.refused(&["agents", "budget", "spender", "--usd", "1", "--period", "5s"])["field"], "period");
    assert_eq!(env.refused(&["agents", "budget", "spender", "--usd", "1", "--clear"])["field"], "clear");
    assert_eq!(env.json(&["agents", "budget", "spender"])["covering"][0]["limit"]["usd"], 5.0);
}

#[test]
fn a_spent_subtree_budget_holds_every_agent_below_it_and_refuses_their_runs() {
    let env = TestEnv::started_with(&config());
    env.create_scripted("lead", SPENDER);
    let worker = env.script("worker.toml", SPENDER);
    env.json(&["agents", "create", "--handle", "worker", "--name", "Worker", "--parent", "lead", "--script", &worker]);
    env.create_scripted("outsider", SPENDER);
    for agent in ["lead", "worker", "outsider"] {
        env.settled(agent);
    }
    env.json(&["agents", "budget", "lead", "--usd", "1", "--subtree"]);
    post(&env, "home-worker", "please spend 120");
    crate::assert_eventually!(notices(&env, "home-lead", "is spent").len() == 1, "the subtree's owner was not told");
    let note = &notices(&env, "home-lead", "is spent")[0];
    assert!(note.contains("the budget of @lead's subtree"), "{note}");

    // Its parent's subtree spent, the worker is held; the outsider is not.
    let to_worker = post(&env, "home-worker", "WORKER_MARKER more");
    assert_eq!(to_worker["outcomes"][0]["outcome"], "held", "{to_worker}");
    assert!(to_worker["outcomes"][0]["reason"].as_str().unwrap().contains("@lead's subtree"), "{to_worker}");
    assert_eq!(post(&env, "home-lead", "LEAD_MARKER")["outcomes"][0]["outcome"], "held");
    assert_eq!(post(&env, "home-outsider", "OUTSIDE_MARKER")["outcomes"][0]["outcome"], "woke");

    // A child created under the spent subtree does not even start its session.
    let late = env.script("late.toml", SPENDER);
    env.json(&["agents", "create", "--handle", "late", "--name", "Late", "--parent", "lead", "--script", &late]);
    crate::assert_eventually!(env.roster_entry("late")["presence"] == "paused_budget", "late is not held");

    // A subagent run is refused while the Manager's subtree is spent.
    let run = call_tool(&env, "lead", 1, "agents_run_subagent", json!({ "definition": "implementer", "brief": "go" }));
    assert!(run.is_error, "{:?}", run.output);
    assert_eq!(run.output["error"]["code"], "limit_exceeded", "{:?}", run.output);
    assert!(run.output["error"]["message"].as_str().unwrap().contains("no subagent run starts"), "{:?}", run.output);

    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(inputs_containing(&env, "worker", "WORKER_MARKER").is_empty(), "the worker took a turn");
    assert!(inputs(&env, "late").is_empty(), "a held child's session started");
    assert!(!inputs_containing(&env, "outsider", "OUTSIDE_MARKER").is_empty());

    env.json(&["agents", "budget", "lead", "--usd", "10", "--subtree"]);
    crate::assert_eventually!(
        !inputs_containing(&env, "worker", "WORKER_MARKER").is_empty() && !inputs(&env, "late").is_empty(),
        "raising the subtree's budget did not release the worker and the late child"
    );
    env.settled("worker");
    assert_eq!(inputs_containing(&env, "worker", "WORKER_MARKER").len(), 1);
}

#[test]
fn a_spawn_proposal_must_fit_what_the_subtree_has_left_and_is_carved_out_at_approval() {
    let env = TestEnv::started_with(&config());
    env.create_scripted("lead", SPENDER);
    env.settled("lead");
    env.json(&["agents", "budget", "lead", "--usd", "1", "--subtree", "--period", "30days"]);
    post(&env, "home-lead", "please spend 20");
    crate::assert_eventually!(
        budget_of(&env.json(&["usage"]), "lead")["spent"]["usd"].as_f64() >= Some(0.2),
        "the spend never arrived"
    );
    env.settled("lead");
    let ask = |handle: &str, usd: f64| {
        let args = json!({ "handle": handle, "name": "Child", "charter": "c", "reason": "r", "budget_usd": usd });
        call_tool(&env, "lead", 1, "agents_spawn_peer", args)
    };
    let refused = ask("greedy", 0.95);
    assert!(refused.is_error, "{:?}", refused.output);
    assert_eq!(refused.output["error"]["code"], "limit_exceeded");
    let message = refused.output["error"]["message"].as_str().unwrap();
    assert!(message.contains("$0.80 left"), "the refusal names what is left: {message}");
    assert!(env.json(&["requests"])["requests"].as_array().unwrap().is_empty(), "a refusal records nothing");

    let asked = ask("modest", 0.5);
    assert!(!asked.is_error, "{:?}", asked.output);
    assert_eq!(asked.output["budget"]["usd"], 0.5, "{:?}", asked.output);
    assert!(env.ok(&["requests"]).contains("budget $0.50"), "the operator sees the proposal");
    let asked_in_home = notices(&env, "home-lead", "Budget for its subtree: $0.50");
    assert_eq!(asked_in_home.len(), 1, "the request in the home channel names the budget");
    env.ok(&["approve", asked.output["id"].as_str().unwrap()]);
    let usage = env.json(&["usage"]);
    let child = budget_of(&usage, "modest");
    assert_eq!((child["scope"].as_str(), child["source"].as_str()), (Some("subtree"), Some("spawn")), "{usage}");
    assert_eq!(child["period"], "30days", "the child's window is its parent's period: {usage}");
    // Left: the limit, less what the subtree spent (the child's turns too), less what the
    // child has not spent of its $0.50.
    let lead = budget_of(&usage, "lead");
    let (left, spent) = (lead["left"]["usd"].as_f64().unwrap(), lead["spent"]["usd"].as_f64().unwrap());
    let unspent = 0.5 - child["spent"]["usd"].as_f64().unwrap();
    assert!((left - (1.0 - spent - unspent)).abs() < 1e-6, "the child's allotment is carved from the parent: {usage}");
}

#[test]
fn a_turn_whose_usage_never_arrives_counts_at_the_estimate() {
    let env = TestEnv::started_with(QUICK);
    // `usage = "none"`: a turn that reports nothing, as a harness whose usage never arrives.
    env.create_scripted(
        "silent",
        "[[rule]]\nmatch = { kind = \"start\" }\nactions = [{ say = \"hello\" }, { usage = \"none\" }]\n",
    );
    crate::assert_eventually!(
        env.json(&["usage", "--agent", "silent"])["total"]["reports_estimated"] == 1,
        "the start turn was not estimated: {}",
        env.json(&["usage", "--agent", "silent"])
    );
    let usage = env.json(&["usage", "--agent", "silent"]);
    assert_eq!(usage["total"]["cost_usd"], 0.05, "the default estimate: {usage}");
    assert_eq!(usage["total"]["input_tokens"], 10000, "{usage}");
    assert!(env.ok(&["usage", "--agent", "silent"]).contains("(1 estimated)"));
}

#[test]
fn a_scripted_turn_that_says_nothing_of_usage_costs_nothing() {
    let env = TestEnv::started_with(QUICK);
    for handle in ["idle-a", "idle-b"] {
        env.create_scripted(handle, "[[rule]]\nmatch = { kind = \"start\" }\nactions = [{ say = \"hello\" }]\n");
    }
    // Each start turn reports once at its end: zero, with a cost, replacing its estimate.
    let settled = |env: &TestEnv| {
        ["idle-a", "idle-b"].iter().all(|handle| {
            let total = &env.json(&["usage", "--agent", handle])["total"];
            total["reports"] == 1 && total["reports_estimated"] == 0
        })
    };
    crate::assert_eventually!(settled(&env), "the start turns did not report zero: {}", env.json(&["usage"]));
    let usage = env.json(&["usage"]);
    assert_eq!(usage["total"]["cost_usd"], 0.0, "{usage}");
    assert_eq!(usage["total"]["reports_estimated"], 0, "{usage}");
    let text = env.ok(&["usage"]);
    assert!(!text.contains("estimated"), "no invented spend: {text}");
}
