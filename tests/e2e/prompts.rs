//! Prompts end to end: what a session receives is exactly `canopy prompt render`'s text,
//! the bundle check, per-role tool enforcement, and subagent runs (the delta prompt around
//! the default, the report at the Manager's next turn, the cap and the timeout).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::copy_dir::copy_dir;
use crate::env::TestEnv;
use crate::sessions::FAST;

/// The system prompt a scripted session recorded (first transcript line).
fn received_prompt(env: &TestEnv, handle: &str, incarnation: u64) -> String {
    let path = env.data_dir().join(format!("sessions/{handle}/{incarnation}/transcript.jsonl"));
    // The harness creates the file before it writes the first line: wait for a whole line.
    crate::assert_eventually!(
        std::fs::read_to_string(&path).is_ok_and(|t| t.contains('\n')),
        "{handle} has no transcript line at {}",
        path.display()
    );
    let transcript = std::fs::read_to_string(&path).unwrap();
    let first: Value = serde_json::from_str(transcript.lines().next().unwrap()).unwrap();
    assert_eq!(first["kind"], "system_prompt");
    first["text"].as_str().unwrap().to_owned()
}

#[test]
fn a_session_receives_exactly_what_prompt_render_prints() {
    let env = TestEnv::started_with(FAST);
    env.json(&[
        "agents",
        "create",
        "--handle",
        "ci-manager",
        "--name",
        "CI Manager",
        "--charter",
        "Keep CI under ten minutes.",
        "--persona",
        "Terse.",
    ]);
    let received = received_prompt(&env, "ci-manager", 1);
    let rendered = env.json(&["prompt", "render", "--agent", "ci-manager"]);
    assert_eq!(rendered["text"].as_str().unwrap(), received, "the session got something else");
    assert_eq!(rendered["session"]["hash"], rendered["hash"], "the session record holds the rendered hash");
    assert_eq!(rendered["session"]["incarnation"], 1);
    assert_eq!(rendered["mode"], "replace");
    assert_eq!(rendered["sections"], serde_json::json!(["role", "why_here", "skills", "rules", "footer", "persona"]));
    // Ancestry: the workspace's mission and the agent's charter; identity in the footer.
    assert!(received.contains("- Mission: Keep the build green"), "{received}");
    assert!(received.contains("- Goal: Keep CI under ten minutes."), "{received}");
    assert!(received.contains("- Agent: @ci-manager (CI Manager), role manager"), "{received}");
    assert!(received.contains("- Home channel: #home-ci-manager"), "{received}");
    assert!(received.trim_end().ends_with("# Persona\n\nTerse."), "{received}");
}

#[test]
fn prompt_render_for_a_role_prints_the_sections_in_order() {
    let env = TestEnv::started();
    let out = env.command(&["prompt", "render", "--role", "manager"]).output().unwrap();
    assert!(out.status.success(), "{}", crate::env::text(&out.stderr));
    let text = crate::env::text(&out.stdout);
    let order = ["# You are a Manager", "# Why You're Here", "# Skills", "# Rules", "# This Session"];
    let positions: Vec<usize> =
        order.iter().map(|h| text.find(h).unwrap_or_else(|| panic!("no {h:?} in:\n{text}"))).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "sections out of order: {positions:?}");
    assert!(crate::env::text(&out.stderr).contains("sha256"), "the hash is printed");
    // No prompt names a tool the session lacks: the manager lists skills, not bodies.
    assert!(text.contains("`comms-playbook`"));
    let refused = env.refused(&["prompt", "render", "--role", "nobody-here"]);
    assert_eq!(refused["field"], "role", "{refused}");
}

/// The repository's shipped bundle, copied so a test can plant errors in it.
fn bundle_copy() -> (tempfile::TempDir, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = tempfile::tempdir().unwrap();
    for sub in ["config/prompts", "config/roles", "agents", "skills", "rules"] {
        copy_dir(&root.join(sub), &dir.path().join(sub));
    }
    let path = dir.path().to_owned();
    (dir, path)
}

#[test]
fn bundle_check_passes_the_shipped_bundle_and_names_a_planted_error() {
    let env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    let ok = env.json(&["bundle", "check"]);
    assert_eq!(ok["ok"], true, "{ok}");
    assert_eq!(ok["bundle"], "embedded");

    let (_keep, bundle) = bundle_copy();
    let bundle_arg = bundle.display().to_string();
    assert_eq!(env.json(&["bundle", "check", "--bundle", &bundle_arg])["ok"], true);

    let skill = bundle.join("skills/review/SKILL.md");
    let text = std::fs::read_to_string(&skill).unwrap();
    std::fs::write(&skill, format!("{text}\nFinish with `comms_approve_everything`.\n")).unwrap();
    let out = env.run(&["bundle", "check", "--bundle", &bundle_arg]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = crate::env::text(&out.stderr);
    let line = text.lines().count() + 2;
    assert!(stderr.contains(&format!("skills/review/SKILL.md:{line}:")), "{stderr}");
    assert!(stderr.contains("comms_approve_everything"), "{stderr}");

    std::fs::write(&skill, "---\nname: review\ndescription: x\nalwaysApply: yes\n---\n").unwrap();
    let out = env.run(&["--json", "bundle", "check", "--bundle", &bundle_arg]);
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["problems"][0],
        "skills/review/SKILL.md:4: unknown key `alwaysApply` (expected one of: name, description)"
    );

    // The daemon refuses to start on it, naming the key.
    env.edit_config(&[("bundle = \"\"", &format!("bundle = {bundle_arg:?}"))]);
    let out = env.run(&["daemon"]);
    assert_eq!(out.status.code(), Some(64), "{}", crate::env::text(&out.stderr));
    assert!(crate::env::text(&out.stderr).contains("prompts.bundle"));
}

#[test]
fn the_daemon_refuses_a_tool_the_role_does_not_register() {
    // An implementer run: its prompt names no comms tool, and the daemon refuses the call
    // even though its harness tries it.
    let dir = tempfile::tempdir().unwrap();
    let eager = dir.path().join("eager.toml");
    std::fs::write(
        &eager,
        r#"
[[rule]]
match = { kind = "start" }
actions = [{ call = "comms_post_message", args = { channel = "home-lead", topic = "t", body = "not mine to post", create_topic = true } }]
"#,
    )
    .unwrap();
    let run_script = format!("script = {:?}", eager.display().to_string());
    let mut edits: Vec<(&str, &str)> = FAST.to_vec();
    edits.push(("script = \"implementer.toml\"", &run_script));
    let env = TestEnv::started_with(&edits);
    // A standing implementer is no such thing: implementers are briefed per slice.
    let refused = env.refused(&["agents", "create", "--handle", "eager", "--name", "Eager", "--role", "implementer"]);
    assert_eq!(refused["field"], "role", "{refused}");
    assert!(refused["message"].as_str().unwrap().contains("agents_run_subagent"), "{refused}");
    env.create_scripted(
        "lead",
        r#"
[[rule]]
match = { kind = "start" }
actions = [{ call = "agents_run_subagent", args = { definition = "implementer", brief = "try to post" } }]
"#,
    );
    // The run's own record of the call (its activity may end with the run): `forbidden`.
    let transcript = env.data_dir().join("sessions/run-1/1/transcript.jsonl");
    let refused_call = || {
        std::fs::read_to_string(&transcript).unwrap_or_default().lines().find_map(|l| {
            let line: Value = serde_json::from_str(l).ok()?;
            (line.to_string().contains("comms_post_message") && line.to_string().contains("forbidden")).then_some(line)
        })
    };
    crate::assert_eventually!(refused_call().is_some(), "the run's call was not refused: {}", transcript.display());
    assert!(!env.messages("home-lead").iter().any(|m| m["body"] == "not mine to post"));
    let prompt = received_prompt(&env, "run-1", 1);
    assert!(!prompt.contains("comms_post_message"), "the prompt names a tool the session lacks");
}

const BRIEFS: &str = r#"
[[rule]]
match = { kind = "start" }
actions = [
  { call = "agents_run_subagent", args = { definition = "implementer", brief = "Add a --verbose flag to the build script; report what changed." } },
]

[[rule]]
match = { kind = "message", topic = "run: 1" }
actions = [
  { call = "comms_post_message", args = { channel = "{home}", topic = "status", body = "{self} read the report: {input.text}", create_topic = true } },
]
"#;

#[test]
fn a_managers_subagent_run_reports_back_at_its_next_turn() {
    let env = TestEnv::started_with(FAST);
    env.create_scripted("lead", BRIEFS);
    crate::assert_eventually!(
        env.messages("home-lead").iter().any(|m| m["topic"] == "status"),
        "the Manager never read its run's report: {:?}",
        env.messages("home-lead")
    );
    let messages = env.messages("home-lead");
    let report = messages.iter().find(|m| m["topic"] == "run: 1").unwrap();
    assert_eq!(report["sender"]["handle"], "canopy");
    let body = report["body"].as_str().unwrap();
    assert!(body.starts_with("Subagent run 1 (implementer) finished: done."), "{body}");
    assert!(body.contains("Report: the slice in the brief is done."), "{body}");
    let reply = messages.iter().find(|m| m["topic"] == "status").unwrap();
    assert!(reply["body"].as_str().unwrap().contains("finished: done"), "{reply}");

    // The run's prompt: Canopy's default block-0, then the delta, then the footer; the
    // brief was its first input.
    let prompt = received_prompt(&env, "run-1", 1);
    let default = prompt.find("# You are a careful").or_else(|| prompt.find("\n")).unwrap();
    let delta = prompt.find("# You are an implementer").expect("the delta is in the prompt");
    let footer = prompt.find("# This Session").expect("the footer is in the prompt");
    assert!(default < delta && delta < footer, "{prompt}");
    assert!(prompt.contains("- Parent: @lead"), "{prompt}");
    let rules = prompt.find("# Rules").expect("the always-apply rules are in a run's prompt");
    assert!(delta < rules && rules < footer, "{prompt}");
    assert!(prompt.contains("Never wait inside a turn for someone else"), "{prompt}");
    let rendered_default =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/prompts/default/SYSTEM.md"))
            .unwrap();
    // The file's first line is the authors' note on gated lines, which no session reads.
    let first = rendered_default.lines().find(|l| !l.starts_with("<!-- flip:")).unwrap();
    assert!(prompt.starts_with(first), "the default block-0 comes first");
    assert!(!prompt.contains("<!-- flip:"), "the authors' note reached a session");
    let transcript = std::fs::read_to_string(env.data_dir().join("sessions/run-1/1/transcript.jsonl")).unwrap();
    assert!(transcript.contains("Add a --verbose flag"), "the brief was not the first input");

    // Runs are not tree nodes; watch shows the run under its Manager; the run is done.
    let tree = env.ok(&["tree"]);
    assert!(!tree.contains("run-1"), "{tree}");
    crate::assert_eventually!(
        env.activity("lead").iter().any(|i| i["agent"] == "run-1"),
        "watch lead does not show the run"
    );
    let watch = env.ok(&["watch", "lead", "--no-follow", "--tail", "200"]);
    assert!(watch.contains("[run-1]"), "{watch}");
    let runs = env.json(&["runs", "--agent", "lead"]);
    assert_eq!(runs["runs"][0]["status"], "done", "{runs}");
}

#[test]
fn a_run_report_rings_the_managers_runner_like_any_post() {
    // With the idle resync an hour away, only a doorbell can bring the report in time.
    let mut edits = FAST.to_vec();
    edits.push(("resync = \"5s\"", "resync = \"1h\""));
    let env = TestEnv::started_with(&edits);
    env.create_scripted("lead", BRIEFS);
    crate::assert_eventually!(
        env.messages("home-lead").iter().any(|m| m["topic"] == "status"),
        "the run's report did not reach its idle Manager without a resync: {:?}",
        env.messages("home-lead")
    );
}

#[test]
fn runs_are_capped_per_manager_and_time_out() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    std::fs::write(
        env.data_dir().join("slow.toml"),
        "[[rule]]\nmatch = { kind = \"start\" }\nactions = [{ sleep = \"1h\" }]\n",
    )
    .unwrap();
    let mut edits = FAST.to_vec();
    edits.extend([
        ("max_per_manager = 4", "max_per_manager = 1"),
        ("timeout = \"30m\"", "timeout = \"1s\""),
        ("script = \"implementer.toml\"", "script = \"slow.toml\""),
    ]);
    env.edit_config(&edits);
    env.start_daemon();
    env.create_scripted(
        "busy",
        r#"
[[rule]]
match = { kind = "start" }
actions = [
  { call = "agents_run_subagent", args = { definition = "implementer", brief = "first" } },
  { call = "agents_run_subagent", args = { definition = "implementer", brief = "second" } },
  { call = "agents_run_subagent", args = { definition = "no-such-definition", brief = "third" } },
]
"#,
    );
    crate::assert_eventually!(
        env.activity("busy").iter().filter(|i| i["kind"] == "tool_failed").count() == 2,
        "the second and third runs were not refused: {:?}",
        env.activity("busy")
    );
    let failed: Vec<Value> = env.activity("busy").into_iter().filter(|i| i["kind"] == "tool_failed").collect();
    assert_eq!(failed[0]["detail"]["output"]["error"]["code"], "limit_exceeded", "{:?}", failed[0]);
    assert_eq!(failed[1]["detail"]["output"]["error"]["field"], "definition", "{:?}", failed[1]);
    crate::assert_eventually!(
        env.messages("home-busy").iter().any(|m| m["topic"] == "run: 1"),
        "the timed-out run was never reported"
    );
    let report = env.messages("home-busy").into_iter().find(|m| m["topic"] == "run: 1").unwrap();
    assert!(report["body"].as_str().unwrap().contains("timed out"), "{report}");
    assert_eq!(env.json(&["runs", "--agent", "busy"])["runs"][0]["status"], "timed_out");
}

#[test]
fn a_managers_runs_show_in_its_continuity_block_and_history() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    std::fs::write(
        env.data_dir().join("busy-implementer.toml"),
        "[[rule]]\nmatch = { kind = \"start\" }\n\
         actions = [{ fake_tool = \"bash\", output = \"built the verbose flag\" }, { sleep = \"1h\" }]\n",
    )
    .unwrap();
    let mut edits = FAST.to_vec();
    edits.push(("script = \"implementer.toml\"", "script = \"busy-implementer.toml\""));
    env.edit_config(&edits);
    env.start_daemon();
    env.create_scripted(
        "lead",
        r#"
[[rule]]
match = { kind = "start", text_contains = "Session 1 started" }
actions = [{ call = "agents_run_subagent", args = { definition = "implementer", brief = "Add a --verbose flag." } }]

[[rule]]
match = { kind = "message", text_contains = "search now" }
actions = [{ call = "history_search", args = { query = "verbose flag", include_tool_events = true } }]
"#,
    );
    // The run is out and has done a tool call.
    crate::assert_eventually!(
        env.activity("lead").iter().any(|i| i["agent"] == "run-1" && i["kind"] == "tool_result"),
        "the run never made its tool call: {:?}",
        env.activity("lead")
    );
    // The Manager's harness dies; its next session opens with the run still out.
    let pid = env.wait_harness_pid("lead", 1);
    crate::env::signal(pid, canopy_sys::SIGKILL);
    crate::assert_eventually!(
        !crate::delivery::inputs_containing(&env, "lead", "Session 2 started").is_empty(),
        "the Manager was not restarted"
    );
    let first = crate::delivery::inputs_containing(&env, "lead", "Session 2 started").remove(0);
    let text = first["text"].as_str().unwrap();
    assert!(text.contains("run 1 (implementer"), "the continuity block does not list the run out: {text}");

    // history_search of the Manager spans its run's tool events.
    env.json(&["post", "--channel", "home-lead", "--topic", "t", "--create-topic", "search now"]);
    let found = || {
        crate::delivery::transcript(&env, "lead")
            .into_iter()
            .find(|l| l["kind"] == "tool_result" && l["name"] == "history_search")
    };
    crate::assert_eventually!(found().is_some(), "history_search never answered");
    let output = found().unwrap()["output"].to_string();
    assert!(output.contains("built the verbose flag"), "{output}");
}

#[test]
fn a_yaml_role_renders_and_runs_an_agent() {
    let (_keep, bundle) = bundle_copy();
    std::fs::write(
        bundle.join("config/roles/critic.yaml"),
        "# Reads and comments; never edits.\nid: critic\nblock0: manager\nmode: replace\ntools:\n  - \"*\"\nskills: [review]\n",
    )
    .unwrap();
    let bundle_arg = bundle.display().to_string();
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(&[("bundle = \"\"", &format!("bundle = {bundle_arg:?}"))]);
    env.edit_config(FAST);
    env.start_daemon();
    let checked = env.json(&["bundle", "check"]);
    assert_eq!(checked["counts"]["roles"], 5, "{checked}");
    let script = env.script("critic.toml", "");
    env.json(&["agents", "create", "--handle", "critic", "--name", "Critic", "--role", "critic", "--script", &script]);
    let prompt = received_prompt(&env, "critic", 1);
    assert!(prompt.contains("# You are a Manager") && prompt.contains("`review`"), "{prompt}");
}

#[test]
fn a_restarted_manager_does_not_refile_its_spawn_request_and_the_supervisor_stays_quiet_on_a_broadcast() {
    let mut env = TestEnv::started_with(FAST);
    env.create_scripted(
        "lead",
        r#"
[[rule]]
match = { kind = "start" }
actions = [{ call = "agents_spawn_peer", args = { handle = "flaky", name = "Flaky", charter = "Hunt flaky tests", reason = "CI is red" } }]
"#,
    );
    crate::assert_eventually!(
        env.json(&["requests"])["requests"].as_array().unwrap().len() == 1,
        "the request was never filed"
    );
    env.ok(&["deny", "req-1", "--reason", "not now"]);
    assert_eq!(env.stop_daemon(), Some(0), "{}", env.daemon_log());
    env.start_daemon();
    env.wait_harness_pid("lead", 2);
    env.settled("lead");
    let requests = env.json(&["requests"]);
    let all = requests["requests"].as_array().unwrap();
    assert_eq!(all.len(), 1, "the restarted Manager filed again: {requests}");
    assert_eq!(all[0]["state"], "denied");

    // A broadcast is read, not answered (forced to wake it, so the Supervisor does read it).
    env.ok(&[
        "post",
        "--channel",
        "announcements",
        "--topic",
        "freeze",
        "--create-topic",
        "--wake",
        "Code freeze at noon.",
    ]);
    env.settled("supervisor");
    let spoke = |channel: &str| {
        env.messages(channel)
            .iter()
            .filter(|m| m["sender"]["handle"] == "supervisor" && m["body"] != "Supervisor online.")
            .count()
    };
    assert_eq!(spoke("announcements") + spoke("home-supervisor"), 0, "the Supervisor answered a broadcast");
}
