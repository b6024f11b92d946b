//! A lane that outlives its harness, end to end with the real Claude Code and Codex against the
//! fake model APIs: the Manager role names the chain `harness = ["claude", "codex"]`; the fake
//! Anthropic API answers 429 every time, so after `[sessions] failover_after` failures the lane
//! restarts on Codex in the same checkout, its first model input holding the continuity block,
//! the operator told once; `canopy agents start lead --harness claude` moves it back.

use std::time::Duration;

use serde_json::Value;

use crate::env::TestEnv;
use crate::fake_anthropic::{FakeAnthropic, Reply as AnthropicReply};
use crate::fake_openai::{FakeOpenAi, Reply as OpenAiReply};
use crate::harness_bins::{claude_bin, codex_bin};
use crate::repos::canonical;

fn told(env: &TestEnv, needle: &str) -> usize {
    env.messages("home-lead").iter().filter(|m| m["body"].as_str().unwrap_or_default().contains(needle)).count()
}

#[test]
fn a_lane_whose_harness_keeps_failing_carries_on_with_the_next_in_the_same_checkout() {
    let anthropic = FakeAnthropic::start(vec![AnthropicReply::error(429); 3]);
    let openai = FakeOpenAi::start(vec![OpenAiReply::text("carrying on with codex")]);
    let claude = format!(
        "[harness.claude]\nbin = {bin:?}\nmodel = \"claude-fake\"\n\n[harness.claude.env]\n\
         ANTHROPIC_BASE_URL = {url:?}\nANTHROPIC_API_KEY = \"sk-ant-test\"\n",
        bin = claude_bin().display().to_string(),
        url = anthropic.base_url(),
    );
    let codex = format!(
        "[harness.codex]\nbin = {bin:?}\nmodel = \"fake-model\"\n\n[harness.codex.env]\nFAKE_OPENAI_KEY = \"sk-fake\"\n\n\
         [harness.codex.provider]\nbase_url = {url:?}\napi_key_env = \"FAKE_OPENAI_KEY\"\n",
        bin = codex_bin().display().to_string(),
        url = openai.base_url(),
    );
    let edits: Vec<(&str, &str)> = vec![
        ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
        ("restart_backoff_min = \"500ms\"", "restart_backoff_min = \"100ms\""),
        ("quiet_window = \"2s\"", "quiet_window = \"100ms\""),
        ("resync = \"5s\"", "resync = \"500ms\""),
        ("[harness.claude]\n", &claude),
        ("[harness.codex]\n", &codex),
        (
            "[roles.manager]\nharness = \"scripted\"\nscript = \"manager.toml\"",
            "[roles.manager]\nharness = [\"claude\", \"codex\"]",
        ),
    ];
    let env = TestEnv::started_with(&edits);
    let repo = canonical(env.dir.path());
    env.json(&["repos", "add", "app", repo.to_str().unwrap()]);
    env.json(&["agents", "create", "--handle", "lead", "--name", "Lead", "--repo", "app"]);

    // Three 429s: the lane moves to Codex, told once, the roster saying why.
    crate::assert_eventually!(env.roster_entry("lead")["harness"] == "codex", "{}", env.roster_entry("lead"));
    let entry = env.roster_entry("lead");
    let failover = entry["failover"].as_str().unwrap_or_default();
    assert!(failover.starts_with("claude failing:") && failover.contains("429"), "{entry}");
    let requests = openai.wait_requests(1, Duration::from_secs(60));
    let first = serde_json::to_string(&requests[0]).unwrap();
    assert!(first.contains("[canopy continuity]"), "no continuity block on Codex: {first}");
    let checkout = env.data_dir().join("sessions/lead/work");
    assert!(first.contains(&checkout.display().to_string()), "Codex is not in the lane's checkout: {first}");
    crate::assert_eventually!(env.roster_entry("lead")["presence"] == "idle", "{}", env.roster_entry("lead"));
    let text = env.ok(&["roster"]);
    assert!(text.contains("on codex (claude failing:"), "{text}");
    assert_eq!(told(&env, "keeps failing"), 1, "the operator is told once");
    let audit = env.json(&["audit"]);
    assert!(audit["entries"].as_array().unwrap().iter().any(|e| e["action"] == "agents.failed_over"), "{audit}");

    // The operator moves it back: the idle Codex session ends, Claude Code (answering now) runs.
    let before = anthropic.requests().len();
    let moved: Value = env.json(&["agents", "start", "lead", "--harness", "claude"]);
    assert_eq!(moved["handle"], "lead", "{moved}");
    crate::assert_eventually!(
        env.roster_entry("lead")["harness"] == "claude" && env.roster_entry("lead")["presence"] == "idle",
        "{}",
        env.roster_entry("lead")
    );
    assert!(env.roster_entry("lead")["failover"].is_null());
    assert!(anthropic.requests().len() > before, "Claude Code never ran again");
    assert_eq!(told(&env, "keeps failing"), 1);
    let bad = env.refused(&["agents", "start", "lead", "--harness", "omp"]);
    assert_eq!((bad["code"].as_str(), bad["field"].as_str()), (Some("invalid_argument"), Some("harness")), "{bad}");
}
