//! Canopy's tools called by MCP clients no one here wrote: the pinned Claude Code and Codex
//! CLIs, each driven by a fake model API to make a run of tool calls in one turn. Every call
//! must be answered and its result must reach the model; each test then prints the time
//! from the CLI reporting a call to it reporting the result (`real client figure:` lines),
//! which `docs/benchmarks.md` records: a kept-alive connection held by Nagle's algorithm
//! would put every call at 40 ms or more.
//!
//! `CANOPY_REAL_CLIENT_CALLS` sets the number of calls (default 12). Owns these scenarios
//! only; the fake APIs and the harness environments are their modules'.

use std::time::Duration;

use serde_json::{Value, json};

use crate::env::TestEnv;

const PATIENCE: Duration = Duration::from_secs(60);

fn calls() -> usize {
    std::env::var("CANOPY_REAL_CLIENT_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(12)
}

/// Milliseconds since the epoch of an activity item's `at`.
fn at_ms(item: &Value) -> i64 {
    let at = item["at"].as_str().unwrap_or_default();
    // `2026-12-02T15:08:48.888Z`
    let (date, time) = at.trim_end_matches('Z').split_once('T').unwrap_or_default();
    let days = {
        let mut parts = date.split('-').map(|p| p.parse::<i64>().unwrap_or(0));
        let (y, m, d) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        // Days from the civil date (Howard Hinnant's algorithm).
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
        era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468
    };
    let mut hms = time.split(':');
    let (h, m) =
        (hms.next().unwrap_or("0").parse::<i64>().unwrap_or(0), hms.next().unwrap_or("0").parse::<i64>().unwrap_or(0));
    let seconds: f64 = hms.next().unwrap_or("0").parse().unwrap_or(0.0);
    ((days * 86_400 + h * 3_600 + m * 60) as f64 * 1000.0 + seconds * 1000.0).round() as i64
}

/// From each `tool_running` of `tool` to the next `tool_result` or `tool_failed`, in ms, as
/// the runner saw the CLI report them; with how many failed.
fn tool_times(env: &TestEnv, agent: &str, tool: &str) -> (Vec<i64>, usize) {
    let activity: Vec<Value> = env
        .ok(&["--json", "watch", agent, "--no-follow", "--tail", "1000"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (mut times, mut failed, mut started) = (Vec::new(), 0, None);
    for item in &activity {
        let about_tool = item.to_string().contains(tool);
        match item["kind"].as_str() {
            Some("tool_running") if about_tool => started = Some(at_ms(item)),
            Some(kind @ ("tool_result" | "tool_failed")) => {
                if let Some(start) = started.take() {
                    times.push(at_ms(item) - start);
                    failed += usize::from(kind == "tool_failed");
                }
            }
            _ => {}
        }
    }
    (times, failed)
}

fn report(client: &str, mut times: Vec<i64>) {
    times.sort();
    let p50 = times.get(times.len() / 2).copied().unwrap_or(0);
    let max = times.last().copied().unwrap_or(0);
    eprintln!(
        "real client figure: {client}: {} comms_list_topics calls in one turn, the CLI's call to its result p50 {p50} ms, max {max} ms ({times:?})",
        times.len()
    );
}

#[test]
fn claude_code_calls_canopy_tools_on_a_kept_alive_connection_and_every_result_reaches_the_model() {
    use crate::fake_anthropic::{FakeAnthropic, Reply};
    let n = calls();
    let mut script: Vec<Reply> =
        (0..n).map(|_| Reply::canopy_tool("comms_list_topics", json!({ "channel": "home-cc" }))).collect();
    script.push(Reply::text("listed them all"));
    let fake = FakeAnthropic::start(script);
    let env = crate::claude::claude_env_with(&fake, &[]);
    env.json(&["agents", "create", "--handle", "cc", "--name", "cc", "--harness", "claude"]);
    let requests = fake.wait_requests(n + 1, PATIENCE);
    for (i, request) in requests.iter().enumerate().skip(1).take(n) {
        let id = format!("toolu_{i}_0");
        let answered = request["messages"].as_array().into_iter().flatten().any(|m| {
            m["content"].as_array().is_some_and(|blocks| {
                blocks.iter().any(|b| b["type"] == "tool_result" && b["tool_use_id"] == id && b["is_error"] != true)
            })
        });
        assert!(answered, "call {i}'s result did not reach the model: {request}");
    }
    crate::assert_eventually!(
        tool_times(&env, "cc", "comms_list_topics").0.len() == n,
        "the calls were not all reported"
    );
    let (times, failed) = tool_times(&env, "cc", "comms_list_topics");
    assert_eq!(failed, 0, "a call failed");
    report("Claude Code", times);
}

#[test]
fn codex_calls_canopy_tools_on_a_kept_alive_connection_and_every_result_reaches_the_model() {
    use crate::fake_openai::{FakeOpenAi, Reply};
    let n = calls();
    let mut script: Vec<Reply> =
        (0..n).map(|_| Reply::canopy_tool("comms_list_topics", json!({ "channel": "home-cx" }))).collect();
    script.push(Reply::text("listed them all"));
    let fake = FakeOpenAi::start(script);
    let env = crate::codex::started(&fake, &[]);
    env.json(&["agents", "create", "--handle", "cx", "--name", "cx", "--harness", "codex"]);
    let requests = fake.wait_requests(n + 1, PATIENCE);
    // Each request after the first carries the previous call's output.
    for (i, request) in requests.iter().enumerate().skip(1).take(n) {
        let outputs = request.to_string().matches("function_call_output").count();
        assert!(outputs >= i, "request {i} carries {outputs} call outputs: {request}");
    }
    crate::assert_eventually!(
        tool_times(&env, "cx", "comms_list_topics").0.len() == n,
        "the calls were not all reported"
    );
    let (times, failed) = tool_times(&env, "cx", "comms_list_topics");
    assert_eq!(failed, 0, "a call failed");
    report("Codex", times);
}
