//! Delivery end to end, asserted on the scripted harnesses' transcripts: turn-start
//! delivery that wakes an idle agent, @mention steers inside a running turn, fallback,
//! crash and NATS-restart safety, broadcast to many agents exactly once, the loop guard.

use std::time::Duration;

use serde_json::Value;

use crate::env::{TestEnv, signal};

/// Quick coalescing and syncing, so tests do not wait on production defaults.
pub(crate) const QUICK: &[(&str, &str)] = &[
    ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
    ("restart_backoff_min = \"500ms\"", "restart_backoff_min = \"100ms\""),
    ("quiet_window = \"2s\"", "quiet_window = \"100ms\""),
    ("resync = \"5s\"", "resync = \"500ms\""),
];

/// Every transcript line of every session of `agent`, in order.
pub(crate) fn transcript(env: &TestEnv, agent: &str) -> Vec<Value> {
    crate::remote::transcript_in(&env.data_dir(), agent)
}

/// The inputs (prompts and steers) an agent's harness received.
pub(crate) fn inputs(env: &TestEnv, agent: &str) -> Vec<Value> {
    transcript(env, agent).into_iter().filter(|l| l["kind"] == "input").collect()
}

pub(crate) fn inputs_containing(env: &TestEnv, agent: &str, needle: &str) -> Vec<Value> {
    inputs(env, agent).into_iter().filter(|i| i["text"].as_str().unwrap_or("").contains(needle)).collect()
}

/// The output of the first successful call of `tool` in an agent's transcript.
fn tool_result(env: &TestEnv, agent: &str, tool: &str) -> Option<Value> {
    transcript(env, agent)
        .into_iter()
        .find(|l| l["kind"] == "tool_result" && l["name"] == tool)
        .map(|l| l["output"].clone())
}

/// Creates agent `alpha`, whose first turn opens its direct channel with `beta` and posts there.
fn alpha_tells_beta(env: &TestEnv, topic: &str, body: &str) {
    let script = format!(
        "[[rule]]\nmatch = {{ kind = \"start\" }}\nactions = [\n  {{ call = \"comms_open_direct\", args = {{ peer = \"beta\" }} }},\n  \
         {{ call = \"comms_post_message\", args = {{ channel = \"dm-alpha-beta\", topic = \"{topic}\", body = \"{body}\", create_topic = true }} }},\n]\n"
    );
    env.create_scripted("alpha", &script);
}

const QUIET: &str = "[[rule]]\nmatch = { kind = \"message\" }\nactions = [{ say = \"read it\" }]\n";

#[test]
fn a_post_wakes_an_idle_agent_with_the_message_fenced_at_its_turn_start() {
    let env = TestEnv::started_with(QUICK);
    env.create_scripted("beta", QUIET);
    crate::assert_eventually!(env.roster_entry("beta")["presence"] == "idle", "beta never went idle");
    alpha_tells_beta(&env, "plans", "beta, the release is on Friday");
    crate::assert_eventually!(
        !inputs_containing(&env, "beta", "release is on Friday").is_empty(),
        "beta never received the message: {:?}",
        inputs(&env, "beta")
    );
    let input = inputs_containing(&env, "beta", "release is on Friday").remove(0);
    assert_eq!(input["position"], 0, "the message must open a turn: {input}");
    assert_eq!(input["steer"], false);
    assert_eq!(input["meta"]["kind"], "message");
    let text = input["text"].as_str().unwrap();
    assert!(text.contains("## #dm-alpha-beta > plans"), "{text}");
    let fence = text
        .lines()
        .find(|l| l.contains(" message ") && l.contains("from @alpha (manager)"))
        .unwrap_or_else(|| panic!("{text}"));
    let nonce = fence.trim_start_matches('[').split(' ').next().unwrap();
    assert!(nonce.starts_with("canopy-") && text.contains(&format!("[{nonce} end of message")), "{text}");
    let posted = tool_result(&env, "alpha", "comms_post_message").unwrap();
    assert_eq!(posted["outcomes"][0]["recipient"], "beta");
    assert_eq!(posted["outcomes"][0]["outcome"], "woke", "{posted}");
    assert_eq!(inputs_containing(&env, "beta", "release is on Friday").len(), 1, "delivered twice");
}

#[test]
fn a_mention_mid_turn_is_steered_into_that_turn() {
    let env = TestEnv::started_with(QUICK);
    env.create_scripted(
        "beta",
        "[[rule]]\nmatch = { kind = \"start\" }\nactions = [{ sleep = \"4s\" }, { say = \"done sleeping\" }]\n\
         [[rule]]\nmatch = { steer = true }\nactions = [{ say = \"heard you mid-turn\" }]\n",
    );
    crate::assert_eventually!(env.roster_entry("beta")["presence"] == "working", "beta never started working");
    alpha_tells_beta(&env, "now", "@beta stop what you are doing");
    crate::assert_eventually!(
        !inputs_containing(&env, "beta", "stop what you are doing").is_empty(),
        "beta never received the steer"
    );
    let steer = inputs_containing(&env, "beta", "stop what you are doing").remove(0);
    assert_eq!(steer["steer"], true, "{steer}");
    assert_eq!(steer["position"], 1, "{steer}");
    let start = inputs(&env, "beta").into_iter().find(|i| i["meta"]["kind"] == "start").unwrap();
    assert_eq!(steer["turn_id"], start["turn_id"], "the steer must land in the running turn");
    // It landed after the tool call (the sleep) and before the turn's end.
    let lines = transcript(&env, "beta");
    let sleep_done = lines.iter().position(|l| l["kind"] == "tool_result" && l["name"] == "sleep").unwrap();
    let steered_at = lines.iter().position(|l| l["kind"] == "input" && l["steer"] == true).unwrap();
    let ended = lines.iter().position(|l| l["kind"] == "turn_ended").unwrap_or(usize::MAX);
    assert!(sleep_done < steered_at && steered_at < ended, "{lines:?}");
    let posted = tool_result(&env, "alpha", "comms_post_message").unwrap();
    assert_eq!(posted["outcomes"][0]["outcome"], "steered", "{posted}");
    env.settled("beta");
    assert_eq!(inputs_containing(&env, "beta", "stop what you are doing").len(), 1, "steered and delivered again");
}

#[test]
fn a_steer_that_cannot_land_falls_back_to_the_next_turn_start() {
    // Sessions run on a separate runner process, so the test can freeze it.
    let env = TestEnv::started_with(
        &[QUICK, &[("embedded = true", "embedded = false"), ("steer_timeout = \"2s\"", "steer_timeout = \"300ms\"")]]
            .concat(),
    );
    let mut runner = env.spawn_runner();
    env.create_scripted("beta", "[[rule]]\nmatch = { kind = \"start\" }\nactions = [{ sleep = \"2s\" }]\n");
    crate::assert_eventually!(env.roster_entry("beta")["presence"] == "working", "beta never started working");
    signal(runner.0.id(), canopy_sys::SIGSTOP);
    let posted =
        env.json(&["post", "--channel", "home-beta", "--topic", "t", "--create-topic", "@beta are you there?"]);
    // The runner wakes while beta's turn still runs: the late steer must not land in it.
    signal(runner.0.id(), canopy_sys::SIGCONT);
    let outcome = &posted["outcomes"][0];
    assert_eq!(outcome["recipient"], "beta");
    assert_eq!(outcome["outcome"], "queued", "{posted}");
    assert!(outcome["reason"].as_str().unwrap().contains("fell back"), "{posted}");
    crate::assert_eventually!(
        !inputs_containing(&env, "beta", "are you there?").is_empty(),
        "the fallen-back message never arrived"
    );
    let input = inputs_containing(&env, "beta", "are you there?").remove(0);
    assert_eq!(input["steer"], false);
    assert_eq!(input["position"], 0, "delivered at a turn start: {input}");
    env.settled("beta");
    assert_eq!(inputs_containing(&env, "beta", "are you there?").len(), 1);
    signal(runner.0.id(), canopy_sys::SIGTERM);
    let _ = crate::env::wait_timeout(&mut runner.0, Duration::from_secs(15));
}

#[test]
fn a_kill_9_between_commit_and_acknowledgement_delivers_exactly_once() {
    // A long quiet window keeps the message pending when the daemon dies.
    let mut env = TestEnv::started_with(
        &[
            QUICK,
            &[
                ("quiet_window = \"100ms\"", "quiet_window = \"30s\""),
                ("coalesce_cap = \"30s\"", "coalesce_cap = \"60s\""),
            ],
        ]
        .concat(),
    );
    env.create_scripted("beta", QUIET);
    crate::assert_eventually!(env.roster_entry("beta")["presence"] == "idle", "beta never went idle");
    let posted = env.json(&["post", "--channel", "home-beta", "--topic", "t", "--create-topic", "survive the crash"]);
    assert_eq!(posted["outcomes"][0]["outcome"], "woke");
    env.kill_daemon();
    env.start_daemon();
    crate::assert_eventually!(
        !inputs_containing(&env, "beta", "survive the crash").is_empty(),
        "the message was lost across kill -9"
    );
    env.settled("beta");
    assert_eq!(inputs_containing(&env, "beta", "survive the crash").len(), 1, "delivered twice");
}

#[test]
fn a_nats_restart_mid_run_loses_no_delivery() {
    let env = TestEnv::started_with(QUICK);
    env.create_scripted("beta", QUIET);
    crate::assert_eventually!(env.roster_entry("beta")["presence"] == "idle", "beta never went idle");
    for i in 0..3 {
        env.json(&["post", "--channel", "home-beta", "--topic", "t", "--create-topic", &format!("before restart {i}")]);
    }
    signal(env.nats.as_ref().unwrap().pid().unwrap(), canopy_sys::SIGKILL);
    for i in 0..3 {
        let body = format!("after restart {i}");
        let key = format!("after-{i}");
        crate::assert_eventually!(
            env.run(&["post", "--channel", "home-beta", "--topic", "t", "--idempotency-key", &key, &body])
                .status
                .success(),
            "posting after the NATS restart failed"
        );
    }
    for body in ["before restart 0", "before restart 2", "after restart 0", "after restart 2"] {
        crate::assert_eventually!(!inputs_containing(&env, "beta", body).is_empty(), "{body} was never delivered");
    }
    env.settled("beta");
    for i in 0..3 {
        for when in ["before", "after"] {
            let body = format!("{when} restart {i}");
            assert_eq!(inputs_containing(&env, "beta", &body).len(), 1, "{body} delivered other than once");
        }
    }
}

#[test]
fn a_broadcast_wakes_none_of_fifty_idle_agents_an_incident_wakes_all_and_a_mention_wakes_its_agent() {
    let env = TestEnv::started_with(QUICK);
    let handles: Vec<String> = (0..50).map(|i| format!("agent-{i:02}")).collect();
    for handle in &handles {
        env.create_scripted(handle, QUIET);
    }
    env.create_scripted(
        "rogue",
        "[[rule]]\nmatch = { kind = \"start\" }\nactions = [{ call = \"comms_post_message\", args = { channel = \"announcements\", topic = \"t\", body = \"I am not the supervisor\", create_topic = true } }]\n",
    );
    crate::assert_eventually!(
        tool_result(&env, "rogue", "comms_post_message").is_some()
            || transcript(&env, "rogue").iter().any(|l| l["kind"] == "tool_result"),
        "rogue never tried"
    );
    let refused = transcript(&env, "rogue").into_iter().find(|l| l["kind"] == "tool_result").unwrap();
    assert_eq!(refused["is_error"], true);
    assert_eq!(refused["output"]["error"]["code"], "forbidden", "{refused}");
    for handle in &handles {
        env.settled(handle);
    }

    // #announcements wakes no one: every idle agent is queued (no wake), and takes no turn.
    let posted = env.json(&[
        "post",
        "--channel",
        "announcements",
        "--topic",
        "news",
        "--create-topic",
        "BROADCAST_MARKER release at noon",
    ]);
    for handle in &handles {
        let outcome =
            posted["outcomes"].as_array().unwrap().iter().find(|o| o["recipient"] == handle.as_str()).cloned();
        let outcome = outcome.unwrap_or_else(|| panic!("no outcome for {handle}: {posted}"));
        assert_eq!(outcome["outcome"], "queued", "{outcome}");
        assert!(outcome["reason"].as_str().unwrap().starts_with("no wake"), "{outcome}");
    }
    assert_eq!(posted["counts"]["woke"], 0, "{posted}");
    crate::assert_eventually!(
        handles.iter().all(|h| env.roster_entry(h)["pending"] == 1),
        "the broadcast is not pending everywhere"
    );
    for handle in &handles {
        assert_eq!(env.roster_entry(handle)["presence"], "idle", "{handle} was woken");
        assert!(inputs_containing(&env, handle, "BROADCAST_MARKER").is_empty(), "{handle} took a turn for it");
    }

    // A mention in a broadcast wakes the mentioned agent only.
    let mentioned =
        env.json(&["post", "--channel", "announcements", "--topic", "news", "@agent-07 MENTION_MARKER you first"]);
    assert_eq!(mentioned["counts"]["woke"], 1, "{mentioned}");
    crate::assert_eventually!(
        !inputs_containing(&env, "agent-07", "MENTION_MARKER").is_empty(),
        "agent-07 was not woken"
    );
    assert!(inputs_containing(&env, "agent-08", "MENTION_MARKER").is_empty());

    // #incidents wakes everyone; each turn carries what waited, exactly once.
    let incident = env.json(&[
        "post",
        "--channel",
        "incidents",
        "--topic",
        "outage",
        "--create-topic",
        "INCIDENT_MARKER staging is down",
    ]);
    assert_eq!(incident["counts"]["woke"], 52, "every agent, the rogue and the Supervisor: {incident}");
    for handle in &handles {
        crate::assert_eventually!(
            !inputs_containing(&env, handle, "INCIDENT_MARKER").is_empty(),
            "{handle} never got the incident"
        );
    }
    for handle in &handles {
        env.settled(handle);
        assert_eq!(
            inputs_containing(&env, handle, "BROADCAST_MARKER").len(),
            1,
            "{handle} got the broadcast other than once"
        );
    }
}

#[test]
fn two_agents_waking_each_other_forever_are_stopped_by_the_loop_guard() {
    let env = TestEnv::started_with(&[QUICK, &[("loop_wakes = 10", "loop_wakes = 3")]].concat());
    let reply = "[[rule]]\nmatch = { kind = \"message\" }\nactions = [{ call = \"comms_post_message\", args = { channel = \"{input.channel}\", topic = \"{input.topic}\", body = \"pong from {self}\" } }]\n";
    env.create_scripted("beta", reply);
    crate::assert_eventually!(env.roster_entry("beta")["presence"] == "idle", "beta never went idle");
    env.create_scripted(
        "alpha",
        &format!(
            "[[rule]]\nmatch = {{ kind = \"start\" }}\nactions = [{{ call = \"comms_open_direct\", args = {{ peer = \"beta\" }} }}, {{ call = \"comms_post_message\", args = {{ channel = \"dm-alpha-beta\", topic = \"ping\", body = \"ping\", create_topic = true }} }}]\n{reply}"
        ),
    );
    for home in ["home-alpha", "home-beta"] {
        crate::assert_eventually!(
            env.messages(home)
                .iter()
                .any(|m| m["sender"]["handle"] == "canopy" && m["body"].as_str().unwrap().contains("Loop guard")),
            "the operator was not told in {home}"
        );
    }
    // At rest once the guard has tripped: both idle with nothing pending, so nothing can wake
    // either of them again; what the channel holds now is final.
    env.settled("alpha");
    env.settled("beta");
    let count = env.messages("dm-alpha-beta").len();
    assert!(count <= 6, "the loop ran {count} rounds");
}
