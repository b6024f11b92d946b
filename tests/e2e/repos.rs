//! Repositories end to end, on real git repositories in temporary directories: a checkout per
//! agent, isolated run checkouts whose reports carry branch, commits and diffstat,
//! `runs_merge` with and without a conflict, `runs_discard`, and the merge gate (approved by
//! command and by reply, denied, refused for a failing check, an agent's own attempt, a push
//! from inside a session, a stack merged bottom-up, a restart in the middle). The scripted
//! harness stands in for the model; its `shell` action runs git in the session's sandbox.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::delivery::transcript;
use crate::env::TestEnv;
use crate::sessions::FAST;

/// Runs git in `dir` as the operator would, and returns its stdout (panics on failure).
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "Operator")
        .env("GIT_AUTHOR_EMAIL", "ops@example.com")
        .env("GIT_COMMITTER_NAME", "Operator")
        .env("GIT_COMMITTER_EMAIL", "ops@example.com")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?} in {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A canonical repository with `main` checked out and one commit (`shared.txt` = `base`).
pub fn canonical(root: &Path) -> PathBuf {
    let repo = root.join("app");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("shared.txt"), "base\n").unwrap();
    std::fs::write(repo.join("README.md"), "# app\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "Start"]);
    repo
}

/// A run: it writes its own name into `shared.txt`, waits long enough for a concurrent run
/// to have written too, checks it still sees only its own change, and commits.
const RUN_SCRIPT: &str = r#"
[[rule]]
match = { kind = "start" }
actions = [
  { shell = "echo {self} > shared.txt", expect = "ok" },
  { shell = "sleep 1; test \"$(cat shared.txt)\" = {self}", expect = "ok" },
  { shell = "git commit -qam 'Write {self} into shared.txt'", expect = "ok" },
  { say = "Report: wrote my name into shared.txt and committed it." },
]
"#;

/// The Manager: two runs at its first turn; the operator's words then drive its tools.
const LEAD_SCRIPT: &str = r#"
[[rule]]
match = { kind = "start", text_contains = "Session 1 started" }
actions = [
  { call = "agents_run_subagent", args = { definition = "implementer", brief = "alpha: write your name into shared.txt" } },
  { call = "agents_run_subagent", args = { definition = "implementer", brief = "beta: write your name into shared.txt" } },
]

[[rule]]
match = { kind = "message", text_contains = "merge run 1" }
actions = [{ call = "runs_merge", args = { run_id = 1 } }]

[[rule]]
match = { kind = "message", text_contains = "merge run 2" }
actions = [{ call = "runs_merge", args = { run_id = 2 } }]

[[rule]]
match = { kind = "message", text_contains = "op: run from main" }
actions = [{ call = "agents_run_subagent", args = { definition = "implementer", brief = "gamma: from main", base = "main" } }]

[[rule]]
match = { kind = "message", text_contains = "op: spawn" }
actions = [{ call = "agents_spawn_peer", args = { handle = "docs-manager", name = "Docs Manager", charter = "Keep the docs true", reason = "Docs lag the code" } }]

[[rule]]
match = { kind = "message", text_contains = "discard run 2" }
actions = [{ call = "runs_discard", args = { run_id = 2 } }, { call = "workspace_status" }]

[[rule]]
match = { kind = "message" }
actions = []
"#;

impl TestEnv {
    /// Waits for a message in `channel` under `topic` whose body contains `needle`.
    pub fn wait_message(&self, channel: &str, topic: &str, needle: &str) -> Value {
        crate::assert_eventually!(
            self.messages(channel)
                .iter()
                .any(|m| m["topic"] == topic && m["body"].as_str().unwrap_or("").contains(needle)),
            "no {needle:?} in {channel} / {topic}: {:#?}",
            self.messages(channel).iter().map(|m| (&m["topic"], &m["body"])).collect::<Vec<_>>()
        );
        self.messages(channel)
            .into_iter()
            .rev()
            .find(|m| m["topic"] == topic && m["body"].as_str().unwrap_or("").contains(needle))
            .unwrap()
    }

    /// The result of the newest call of `tool` in `agent`'s transcript, once there is one
    /// past `after` results of it.
    pub fn tool_result(&self, agent: &str, tool: &str, after: usize) -> Value {
        let results = || -> Vec<Value> {
            transcript(self, agent).into_iter().filter(|l| l["kind"] == "tool_result" && l["name"] == tool).collect()
        };
        crate::assert_eventually!(
            results().len() > after,
            "{agent} never called {tool}: {:#?}",
            transcript(self, agent)
        );
        results()[after].clone()
    }

    pub(crate) fn say(&self, agent: &str, text: &str) {
        self.ok(&["post", "--channel", &format!("home-{agent}"), "--topic", "ops", "--create-topic", text]);
    }
}

/// A tool result's output: the API's answer (its structured content).
pub(crate) fn answer(result: &Value) -> Value {
    result["output"].clone()
}

fn run_edits(env_dir: &Path) -> Vec<(String, String)> {
    let script = env_dir.join("run.toml");
    std::fs::write(&script, RUN_SCRIPT).unwrap();
    let mut edits: Vec<(String, String)> = FAST.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    edits.push(("script = \"implementer.toml\"".into(), format!("script = {:?}", script.display().to_string())));
    edits
}

#[test]
fn runs_work_in_isolated_checkouts_and_their_manager_merges_or_discards_them() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    let edits = run_edits(env.dir.path());
    env.edit_config(&edits.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect::<Vec<_>>());
    env.start_daemon();
    let repo = canonical(env.dir.path());
    let added = env.json(&["repos", "add", "app", repo.to_str().unwrap(), "--check", "test -s shared.txt"]);
    assert_eq!(added["base"], "main", "{added}");
    assert!(env.data_dir().join("repos/app.git").is_dir());

    let script = env.script("lead.toml", LEAD_SCRIPT);
    env.json(&["agents", "create", "--handle", "lead", "--name", "Lead", "--script", &script, "--repo", "app"]);
    let lead = env.data_dir().join("sessions/lead/work");
    assert_eq!(git(&lead, &["rev-parse", "--abbrev-ref", "HEAD"]), "canopy/lead");
    assert_eq!(std::fs::read_to_string(lead.join("shared.txt")).unwrap(), "base\n");

    // Both runs report, each on its own branch with its own commit.
    for run in [1, 2] {
        let report = env.wait_message("home-lead", &format!("run: {run}"), "branch:");
        let body = report["body"].as_str().unwrap();
        assert!(body.contains(&format!("branch: canopy/lead/run-{run}")), "{body}");
        assert!(body.contains(&format!("Write run-{run} into shared.txt")), "{body}");
        assert!(body.contains("shared.txt | 2 +-"), "{body}");
        assert!(body.contains("tree: clean"), "{body}");
        assert!(body.contains("checks: passed: check"), "{body}");
        // The first line says whether it is green.
        let first = body.lines().next().unwrap_or_default();
        assert!(first.contains("finished: done; checks passed: check."), "{first}");
        // Neither saw the other's write, though both wrote the same file at once.
        let shells: Vec<Value> =
            transcript(&env, &format!("run-{run}")).into_iter().filter(|l| l["kind"] == "shell").collect();
        assert_eq!(shells.len(), 3, "{shells:#?}");
        assert!(shells.iter().all(|s| s["met"] == true), "{shells:#?}");
    }
    // The Manager's own checkout is untouched by its runs.
    assert_eq!(std::fs::read_to_string(lead.join("shared.txt")).unwrap(), "base\n");

    env.say("lead", "merge run 1");
    let merged = answer(&env.tool_result("lead", "runs_merge", 0));
    assert_eq!(merged["merged"], true, "{merged}");
    assert_eq!(merged["fast_forward"], true, "{merged}");
    assert_eq!(std::fs::read_to_string(lead.join("shared.txt")).unwrap(), "run-1\n");
    assert!(!env.data_dir().join("sessions/run-1/work").exists(), "a merged run's checkout stays");

    // The second run changed the same line: a conflict, reported with the file, nothing applied.
    env.say("lead", "merge run 2");
    let conflict = answer(&env.tool_result("lead", "runs_merge", 1));
    assert_eq!(conflict["merged"], false, "{conflict}");
    assert_eq!(conflict["conflicts"], serde_json::json!(["shared.txt"]), "{conflict}");
    assert_eq!(std::fs::read_to_string(lead.join("shared.txt")).unwrap(), "run-1\n");
    assert_eq!(git(&lead, &["status", "--porcelain"]), "", "a refused merge left changes behind");
    assert!(!lead.join(".git/MERGE_HEAD").exists());

    env.say("lead", "discard run 2");
    let discarded = answer(&env.tool_result("lead", "runs_discard", 0));
    assert_eq!(discarded["discarded"], true, "{discarded}");
    assert!(!env.data_dir().join("sessions/run-2/work").exists());
    let status = answer(&env.tool_result("lead", "workspace_status", 0));
    assert_eq!(status["branch"], "canopy/lead", "{status}");
    assert_eq!(status["ahead"], 1, "{status}");
    assert_eq!(status["dirty"], serde_json::json!([]), "{status}");
    assert_eq!(status["unmerged_runs"], serde_json::json!([]), "{status}");

    // The operator's repository never moved; the listing shows every checkout's state.
    assert_eq!(std::fs::read_to_string(repo.join("shared.txt")).unwrap(), "base\n");
    let listed = env.json(&["repos", "list"]);
    let state = |agent: &str| {
        listed["checkouts"].as_array().unwrap().iter().find(|c| c["agent"] == agent).map(|c| c["state"].clone())
    };
    assert_eq!(state("lead"), Some("ready".into()));
    assert_eq!(state("run-1"), Some("merged".into()));
    assert_eq!(state("run-2"), Some("discarded".into()));
    // A merged or discarded run's checkout is gone: it is listed with no path.
    let path = |agent: &str| {
        listed["checkouts"].as_array().unwrap().iter().find(|c| c["agent"] == agent).unwrap()["path"].clone()
    };
    assert!(path("lead").is_string() && path("run-1").is_null() && path("run-2").is_null(), "{listed}");
    assert!(!env.data_dir().join("sessions/run-1/work").exists());
    assert_eq!(env.json(&["repos", "gc", "--dry-run"])["leftovers"], serde_json::json!([]));

    // A run can start from another revision of the Manager's checkout than its HEAD.
    env.settled("lead");
    env.say("lead", "op: run from main");
    let start = git(&repo, &["rev-parse", "main"]);
    let report = env.wait_message("home-lead", "run: 3", "branch:");
    assert!(report["body"].as_str().unwrap().contains(&format!("(from {})", &start[..10])), "{report}");

    // A child Manager gets its requester's repository: the request says so, and the child
    // starts in its own checkout of the base once approved.
    env.settled("lead");
    env.say("lead", "op: spawn");
    let asked = env.wait_message("home-lead", "spawn: docs-manager", "asks to spawn");
    assert!(asked["body"].as_str().unwrap().contains("Repository: app"), "{asked}");
    env.ok(&["approve", "req-1"]);
    let child = env.data_dir().join("sessions/docs-manager/work");
    crate::assert_eventually!(child.join(".git").exists(), "the child has no checkout");
    assert_eq!(git(&child, &["rev-parse", "--abbrev-ref", "HEAD"]), "canopy/docs-manager");
    assert_eq!(std::fs::read_to_string(child.join("shared.txt")).unwrap(), "base\n");
    env.settled("docs-manager");

    // Leftovers: a stray checkout nothing owns is reported, then removed.
    let stray = env.data_dir().join("sessions/stray/work");
    std::fs::create_dir_all(stray.join(".git")).unwrap();
    let found = env.json(&["repos", "gc", "--dry-run"]);
    assert_eq!(found["leftovers"][0]["path"], stray.display().to_string(), "{found}");
    env.json(&["repos", "gc"]);
    assert!(!stray.exists());
}

/// A Claude Code run edits the checkout with its own Read, Edit and Bash tools; the Manager
/// merges the run, asks to merge, and the operator's approval lands the change.
#[test]
fn a_claude_code_run_changes_a_file_that_lands_on_the_base_branch() {
    use crate::fake_anthropic::{FakeAnthropic, Reply};
    let fake = FakeAnthropic::start(Vec::new());
    let env = crate::claude::claude_env_with(
        &fake,
        // The Manager is scripted; its runs are pinned to Claude Code.
        &[("[roles.implementer]\nharness = \"manager\"", "[roles.implementer]\nharness = \"claude\"")],
    );
    let repo = canonical(env.dir.path());
    env.json(&["repos", "add", "app", repo.to_str().unwrap(), "--check", "grep -q claude shared.txt"]);
    let file = env.data_dir().join("sessions/run-1/work/shared.txt").display().to_string();
    fake.push(Reply::default().and_call("Read", serde_json::json!({ "file_path": file })));
    fake.push(
        Reply::default()
            .and_call("Edit", serde_json::json!({ "file_path": file, "old_string": "base", "new_string": "claude" })),
    );
    fake.push(
        Reply::default().and_call(
            "Bash",
            serde_json::json!({ "command": "git commit -qam 'Say claude'", "description": "commit" }),
        ),
    );
    fake.push(Reply::text("Report: shared.txt now says claude; committed as 'Say claude'."));
    let script = env.script(
        "lead.toml",
        r#"
[[rule]]
match = { kind = "start", text_contains = "Session 1 started" }
actions = [{ call = "agents_run_subagent", args = { definition = "implementer", brief = "Make shared.txt say claude." } }]

[[rule]]
match = { kind = "message", text_contains = "op: merge" }
actions = [{ call = "runs_merge", args = { run_id = 1 } }, { call = "merge_request", args = { title = "Claude", summary = "shared.txt says claude." } }]

[[rule]]
match = { kind = "message" }
actions = []
"#,
    );
    env.json(&[
        "agents",
        "create",
        "--handle",
        "lead",
        "--name",
        "Lead",
        "--harness",
        "scripted",
        "--script",
        &script,
        "--repo",
        "app",
    ]);
    let report = env.wait_message("home-lead", "run: 1", "branch:");
    let body = report["body"].as_str().unwrap();
    assert!(body.contains("Say claude") && body.contains("shared.txt | 2 +-"), "{body}");
    assert!(body.contains("checks: passed"), "{body}");
    env.settled("lead");
    env.say("lead", "op: merge");
    env.wait_message("home-lead", "merge: Claude", "asks to merge");
    assert_eq!(env.json(&["merges", "approve", "merge-1"])["state"], "merged");
    assert_eq!(std::fs::read_to_string(repo.join("shared.txt")).unwrap(), "claude\n");
    assert_eq!(git(&repo, &["log", "-1", "--format=%s"]), "Say claude");
}

/// A Manager that commits, asks to merge, tries to approve itself and to push to the base.
const GATE_SCRIPT: &str = r#"
[[rule]]
match = { kind = "message", text_contains = "op: greet" }
actions = [
  { shell = "echo hello > greeting.txt && git add greeting.txt && git commit -qm 'Add a greeting'", expect = "ok" },
  { call = "merge_request", args = { title = "Greeting", summary = "Adds greeting.txt." } },
]

[[rule]]
match = { kind = "message", text_contains = "op: self-approve" }
actions = [
  { call = "comms_post_message", args = { channel = "{home}", topic = "merge: Greeting", body = "approve" } },
  { shell = "git push origin HEAD:main", expect = "fail" },
  { shell = "git push origin HEAD:refs/heads/canopy/lead", expect = "fail" },
]

[[rule]]
match = { kind = "message", text_contains = "op: farewell" }
actions = [
  { shell = "echo bye > farewell.txt && git add farewell.txt && git commit -qm 'Add a farewell'", expect = "ok" },
  { call = "merge_request", args = { title = "Farewell", summary = "Adds farewell.txt." } },
]

[[rule]]
match = { kind = "message", text_contains = "op: break" }
actions = [
  { shell = "echo broken > greeting.txt && git commit -qam 'Break the greeting'", expect = "ok" },
  { call = "merge_request", args = { title = "Broken", summary = "Breaks the check." } },
]

[[rule]]
match = { kind = "message", text_contains = "op: stack" }
actions = [
  { shell = "git reset -q --hard HEAD~1 && echo one > one.txt && git add one.txt && git commit -qm 'One'", expect = "ok" },
  { call = "merge_request", args = { title = "Stack one", summary = "The bottom." } },
  { shell = "echo two > two.txt && git add two.txt && git commit -qm 'Two'", expect = "ok" },
  { call = "merge_request", args = { title = "Stack two", summary = "The top.", depends_on = ["merge-4"] } },
]

[[rule]]
match = { kind = "message", text_contains = "op: unwanted" }
actions = [
  { shell = "echo x > unwanted.txt && git add unwanted.txt && git commit -qm 'Add an unwanted file'", expect = "ok" },
  { call = "merge_request", args = { title = "Unwanted", summary = "Nobody asked." } },
]

[[rule]]
match = { kind = "message" }
actions = []
"#;

#[test]
fn only_an_operator_merges_into_the_base_and_only_what_passes_its_check() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(FAST);
    env.start_daemon();
    let repo = canonical(env.dir.path());
    env.json(&["repos", "add", "app", repo.to_str().unwrap(), "--check", "! grep -qs broken greeting.txt"]);
    let script = env.script("lead.toml", GATE_SCRIPT);
    env.json(&["agents", "create", "--handle", "lead", "--name", "Lead", "--script", &script, "--repo", "app"]);
    env.settled("lead");

    // A request is checked on the merged tree, then posted for the operator.
    env.say("lead", "op: greet");
    let posted = env.wait_message("home-lead", "merge: Greeting", "asks to merge canopy/lead");
    let body = posted["body"].as_str().unwrap();
    assert!(body.contains("@ops") && body.contains("Add a greeting"), "{body}");
    assert!(body.contains("greeting.txt | 1 +"), "{body}");
    assert!(body.contains("Checks on the merged tree: passed: check"), "{body}");
    assert_eq!(env.json(&["merges", "--state", "pending"])["merges"][0]["id"], "merge-1");
    // The tool's answer waited for the check: it carries the result, not `checking`.
    let asked = answer(&env.tool_result("lead", "merge_request", 0));
    assert_eq!(asked["state"], "pending", "{asked}");
    assert!(asked["check"].as_str().unwrap_or_default().starts_with("passed: check"), "{asked}");
    assert!(asked["diffstat"].as_str().unwrap_or_default().contains("greeting.txt"), "{asked}");

    // The agent's own approval and pushes are refused; nothing moved.
    env.settled("lead");
    env.say("lead", "op: self-approve");
    env.wait_message("home-lead", "merge: Greeting", "@lead tried to approve merge-1");
    let shells = || -> Vec<Value> { transcript(&env, "lead").into_iter().filter(|l| l["kind"] == "shell").collect() };
    crate::assert_eventually!(shells().len() >= 3, "the pushes never ran: {:#?}", shells());
    let shells = shells();
    assert!(shells.iter().all(|s| s["met"] == true), "a push from the session went through: {shells:#?}");
    assert_eq!(env.json(&["merges", "--state", "pending"])["merges"][0]["id"], "merge-1");
    let audit = env.json(&["audit"]);
    assert!(audit["entries"].as_array().unwrap().iter().any(|e| e["action"] == "merges.approve.refused"), "{audit}");
    assert!(!repo.join("greeting.txt").exists());

    // Approved by the operator's command: merged into the canonical repository's main.
    let approved = env.json(&["merges", "approve", "merge-1"]);
    assert_eq!(approved["state"], "merged", "{approved}");
    assert_eq!(std::fs::read_to_string(repo.join("greeting.txt")).unwrap(), "hello\n");
    assert_eq!(git(&repo, &["log", "-1", "--format=%s"]), "Add a greeting");
    env.wait_message("home-lead", "merge: Greeting", "Approved by ops");

    // Approved by a reply in its topic.
    env.settled("lead");
    env.say("lead", "op: farewell");
    env.wait_message("home-lead", "merge: Farewell", "asks to merge");
    env.ok(&["post", "--channel", "home-lead", "--topic", "merge: Farewell", "approve"]);
    env.wait_message("home-lead", "merge: Farewell", "is merged into app's main");
    assert!(repo.join("farewell.txt").exists());

    // A failing check: the request says so, and an approval is refused with the reason.
    env.settled("lead");
    env.say("lead", "op: break");
    let broken = env.wait_message("home-lead", "merge: Broken", "asks to merge");
    assert!(broken["body"].as_str().unwrap().contains("Checks on the merged tree: failed: check failed"), "{broken}");
    let refused = env.run(&["--json", "merges", "approve", "merge-3"]);
    assert_eq!(refused.status.code(), Some(1));
    let refused: Value = serde_json::from_slice(&refused.stdout).unwrap();
    assert_eq!(refused["state"], "refused", "{refused}");
    assert!(refused["note"].as_str().unwrap().contains("the checks failed"), "{refused}");
    assert_eq!(std::fs::read_to_string(repo.join("greeting.txt")).unwrap(), "hello\n");

    // A stack merges bottom-up only; a restart in the middle keeps requests and checkouts.
    env.settled("lead");
    env.say("lead", "op: stack");
    env.wait_message("home-lead", "merge: Stack two", "asks to merge");
    // Approved first, the top waits in the queue for the bottom, across a restart.
    assert_eq!(env.json(&["merges", "approve", "merge-5", "--no-wait"])["state"], "queued");
    env.kill_daemon();
    env.start_daemon();
    assert!(env.data_dir().join("sessions/lead/work/.git").exists());
    assert_eq!(env.json(&["merges", "--state", "pending"])["merges"][0]["id"], "merge-4");
    assert_eq!(env.json(&["merges", "queue"])["queue"][0]["id"], "merge-5");
    assert!(!repo.join("two.txt").exists(), "the top merged before its bottom");
    assert_eq!(env.json(&["merges", "approve", "merge-4"])["state"], "merged");
    crate::assert_eventually!(
        env.json(&["merges", "show", "merge-5"])["request"]["state"] == "merged",
        "the queue never took the top: {}",
        env.json(&["merges", "show", "merge-5"])
    );
    assert!(repo.join("one.txt").exists() && repo.join("two.txt").exists());

    // A decided request is not decided again; a denied one changes nothing and says why.
    let again = env.refused(&["merges", "deny", "merge-3", "--reason", "late"]);
    assert_eq!(again["code"], "conflict", "{again}");
    env.settled("lead");
    env.say("lead", "op: unwanted");
    env.wait_message("home-lead", "merge: Unwanted", "asks to merge");
    assert_eq!(env.json(&["merges", "deny", "merge-6", "--reason", "not now"])["state"], "denied");
    env.wait_message("home-lead", "merge: Unwanted", "Reason: not now");
    assert!(!repo.join("unwanted.txt").exists());
    assert_eq!(git(&repo, &["status", "--porcelain"]), "", "the operator's work tree was touched");
}

/// `[[repos]]` registers at start; bad input is refused naming the field and changes nothing;
/// a despawned agent's checkout goes at retention, its branch kept in the mirror.
#[test]
fn repositories_come_from_config_bad_input_changes_nothing_and_retention_keeps_branches() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    let repo = canonical(env.dir.path());
    let mut edits: Vec<(&str, &str)> = FAST.to_vec();
    edits.push(("interval = \"10m\"", "interval = \"1s\""));
    edits.push(("checkouts = \"30days\"", "checkouts = \"1s\""));
    env.edit_config(&edits);
    let config = env.data_dir().join("canopy.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[[repos]]\nname = \"app\"\nsource = \"app\"\ncheck = \"true\"\n");
    std::fs::write(&config, &text).unwrap();
    env.start_daemon();
    let listed = env.json(&["repos", "list"]);
    assert_eq!(listed["repos"][0]["name"], "app", "{listed}");
    assert_eq!(listed["repos"][0]["source"], repo.display().to_string(), "a relative source is the project's");

    // Refused, naming the field; nothing is recorded or left behind.
    for (args, field) in [
        (vec!["repos", "add", "Bad Name", "/tmp"], "name"),
        (vec!["repos", "add", "app", repo.to_str().unwrap()], "name"),
        (vec!["repos", "add", "other", "/nonexistent/repo"], "source"),
        (vec!["repos", "add", "other", repo.to_str().unwrap(), "--base", "trunk"], "base"),
        (vec!["repos", "add", "other", repo.to_str().unwrap(), "--base=-x"], "base"),
        (vec!["agents", "create", "--handle", "x", "--name", "X", "--repo", "nope"], "repo"),
    ] {
        let refused = env.refused(&args);
        assert_eq!(refused["field"], field, "{args:?}: {refused}");
    }
    assert_eq!(env.json(&["repos", "list"])["repos"].as_array().unwrap().len(), 1);
    assert!(!env.data_dir().join("repos/other.git").exists(), "a refused add left a mirror");
    assert!(env.json(&["agents", "list"])["agents"].as_array().unwrap().iter().all(|a| a["handle"] != "x"));

    // A despawned agent's committed work survives its checkout.
    let idle = env.script("idle.toml", "");
    env.json(&["agents", "create", "--handle", "gone", "--name", "Gone", "--script", &idle, "--repo", "app"]);
    let work = env.data_dir().join("sessions/gone/work");
    std::fs::write(work.join("note.txt"), "kept\n").unwrap();
    git(&work, &["add", "note.txt"]);
    git(&work, &["commit", "-qm", "Keep a note"]);
    let head = git(&work, &["rev-parse", "HEAD"]);
    env.json(&["agents", "despawn", "gone"]);
    crate::assert_eventually!(!work.exists(), "retention never removed the despawned agent's checkout");
    let mirror = env.data_dir().join("repos/app.git");
    assert_eq!(git(&mirror, &["rev-parse", "refs/canopy/agents/gone"]), head);
    let state = env.json(&["repos", "list"])["checkouts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["agent"] == "gone")
        .map(|c| c["state"].clone());
    assert_eq!(state, Some("removed".into()));
}
