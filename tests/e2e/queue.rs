//! Checks, review and the merge queue end to end, on real git repositories: two requests that
//! pass alone but fail together (the queue lands one, refuses the other with its log, and the
//! base never holds the failing tree); a base move that makes a live branch conflict, told
//! before it asks to merge; `changes_requested`, a fix, the checks again, `approve`, the queue;
//! a stacked child of a denied parent refused with the reason; a hanging check that times out
//! and says so; and a `kill -9` of the daemon mid-queue after which the queue resumes and
//! nothing merges twice. The scripted harness stands in for the models.

use std::path::Path;

use serde_json::Value;

use crate::env::TestEnv;
use crate::repos::{canonical, git};
use crate::sessions::FAST;

/// The test's config: fast syncs, a branch watcher that looks often, and short check timeouts.
fn fast(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut edits: Vec<(&str, &str)> = FAST.to_vec();
    edits.push(("watch_interval = \"15s\"", "watch_interval = \"300ms\""));
    edits.extend_from_slice(extra);
    edits
}

/// A Manager that commits a file named by the operator's message and asks to merge it.
const ADDER: &str = r#"
[[rule]]
match = { kind = "message", text_contains = "op: add a" }
actions = [
  { shell = "echo a > a.txt && git add a.txt && git commit -qm 'Add a'", expect = "ok" },
  { call = "merge_request", args = { title = "Add a", summary = "Adds a.txt." } },
]

[[rule]]
match = { kind = "message", text_contains = "op: add b" }
actions = [
  { shell = "echo b > b.txt && git add b.txt && git commit -qm 'Add b'", expect = "ok" },
  { call = "merge_request", args = { title = "Add b", summary = "Adds b.txt." } },
]

[[rule]]
match = { kind = "message", text_contains = "op: edit shared" }
actions = [
  { shell = "echo mine > shared.txt && git commit -qam 'Edit shared.txt'", expect = "ok" },
  { call = "workspace_status" },
]

[[rule]]
match = { kind = "message", text_contains = "op: status" }
actions = [{ call = "workspace_status" }, { call = "checks_status" }]

[[rule]]
match = { kind = "message" }
actions = []
"#;

fn create(env: &TestEnv, handle: &str, script: &str) {
    let path = env.script(&format!("{handle}.toml"), script);
    env.json(&["agents", "create", "--handle", handle, "--name", handle, "--script", &path, "--repo", "app"]);
    env.settled(handle);
}

fn tell(env: &TestEnv, agent: &str, text: &str) {
    env.settled(agent);
    env.ok(&["post", "--channel", &format!("home-{agent}"), "--topic", "ops", "--create-topic", text]);
}

fn state(env: &TestEnv, id: &str) -> Value {
    env.json(&["merges", "show", id])["request"]["state"].clone()
}

/// Every commit main has held, each checked out and tested with `check`: the base only ever
/// held trees that pass.
fn every_base_tree_passes(repo: &Path, check: &str) {
    let commits = git(repo, &["rev-list", "main"]);
    let scratch = tempfile::tempdir().unwrap();
    for commit in commits.lines() {
        git(repo, &["worktree", "add", "-q", "--detach", scratch.path().join(commit).to_str().unwrap(), commit]);
        let out =
            std::process::Command::new("sh").arg("-c").arg(check).current_dir(scratch.path().join(commit)).output();
        assert!(out.unwrap().status.success(), "main held {commit}, on which the check fails");
    }
}

/// (a) Two requests that each pass alone but fail together: the queue lands the first, runs
/// the check on the second merged onto the new base, refuses it with the log, and main never
/// holds a failing tree.
#[test]
fn the_queue_lands_what_passes_on_the_base_as_it_is_and_refuses_what_fails_together() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(&fast(&[]));
    env.start_daemon();
    let repo = canonical(env.dir.path());
    let check = "if test -e a.txt && test -e b.txt; then echo 'a.txt and b.txt together'; exit 1; fi";
    env.json(&["repos", "add", "app", repo.to_str().unwrap(), "--check", &format!("pair={check}")]);
    create(&env, "alpha", ADDER);
    create(&env, "beta", ADDER);
    tell(&env, "alpha", "op: add a");
    tell(&env, "beta", "op: add b");
    for (agent, title) in [("alpha", "Add a"), ("beta", "Add b")] {
        let posted = env.wait_message(&format!("home-{agent}"), &format!("merge: {title}"), "asks to merge");
        let body = posted["body"].as_str().unwrap();
        assert!(body.contains("Checks on the merged tree: passed: pair"), "{body}");
    }
    // Both approved: both queued, in order.
    assert_eq!(env.json(&["merges", "approve", "merge-1", "--no-wait"])["state"], "queued");
    assert_eq!(env.json(&["merges", "approve", "merge-2", "--no-wait"])["state"], "queued");
    crate::assert_eventually!(
        state(&env, "merge-2") == "refused",
        "merge-2: {}",
        env.json(&["merges", "show", "merge-2"])
    );
    assert_eq!(state(&env, "merge-1"), "merged");
    let refused = env.json(&["merges", "show", "merge-2"]);
    let note = refused["request"]["note"].as_str().unwrap();
    assert!(note.contains("the checks failed") && note.contains("a.txt and b.txt together"), "{note}");
    // Its Manager is told with the failing log; the queue's checks are on record, with logs.
    let told = env.wait_message("home-beta", "merge: Add b", "could not merge");
    assert!(told["body"].as_str().unwrap().contains("a.txt and b.txt together"), "{told}");
    let checks = env.json(&["checks", "--branch", "merge-2"])["checks"].as_array().unwrap().clone();
    let queue_run = checks.iter().find(|c| c["trigger"] == "queue").expect("the queue ran the check");
    assert_eq!(queue_run["state"], "failed");
    let log = env.ok(&["checks", "log", queue_run["id"].as_str().unwrap()]);
    assert!(log.contains("a.txt and b.txt together"), "{log}");
    // main has a.txt and not b.txt, and never held a tree that fails.
    assert!(repo.join("a.txt").exists() && !repo.join("b.txt").exists());
    every_base_tree_passes(&repo, check);
    assert!(env.json(&["merges", "queue"])["queue"].as_array().unwrap().is_empty());
}

/// (b) The base moves under a live branch: its owner is told which files conflict before it
/// asks to merge; `workspace_status` and `canopy repos list` show it.
#[test]
fn a_base_move_that_makes_a_live_branch_conflict_is_told_to_its_owner_at_once() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(&fast(&[]));
    env.start_daemon();
    let repo = canonical(env.dir.path());
    env.json(&["repos", "add", "app", repo.to_str().unwrap(), "--check", "files=test -s shared.txt"]);
    create(&env, "gamma", ADDER);
    tell(&env, "gamma", "op: edit shared");
    env.tool_result("gamma", "workspace_status", 0);
    // The branch's new head is checked on its own (its owner is told only of a failure).
    crate::assert_eventually!(
        env.json(&["checks", "--branch", "canopy/gamma"])["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["trigger"] == "branch" && c["state"] == "passed"),
        "the branch's commit was never checked: {}",
        env.json(&["checks"])
    );
    // The operator moves main, touching the same file.
    std::fs::write(repo.join("shared.txt"), "theirs\n").unwrap();
    git(&repo, &["commit", "-qam", "Change shared.txt on main"]);
    let told = env.wait_message("home-gamma", "conflicts: canopy/gamma", "no longer merges cleanly with main");
    assert!(told["body"].as_str().unwrap().contains("shared.txt"), "{told}");
    assert!(env.json(&["merges"])["merges"].as_array().unwrap().is_empty(), "told before any merge request");
    let listed = env.json(&["repos", "list"]);
    assert_eq!(listed["conflicts"][0]["branch"], "canopy/gamma", "{listed}");
    assert_eq!(listed["conflicts"][0]["files"][0], "shared.txt", "{listed}");
    assert!(env.ok(&["repos", "list"]).contains("1 conflict"));
    tell(&env, "gamma", "op: status");
    let status = crate::repos::answer(&env.tool_result("gamma", "workspace_status", 1));
    assert_eq!(status["conflicts"][0]["other"], "main", "{status}");
    let checks = crate::repos::answer(&env.tool_result("gamma", "checks_status", 0));
    assert_eq!(
        (checks["subject"].as_str(), checks["passed"].as_bool()),
        (Some("canopy/gamma"), Some(true)),
        "{checks}"
    );
}

/// A Manager whose first change leaves a TODO (its reviewer asks for changes), then, told to,
/// fixes it and asks again under the same title.
const REVIEWED: &str = r#"
[[rule]]
match = { kind = "message", text_contains = "op: change" }
actions = [
  { shell = "echo 'TODO: say what changed' > CHANGELOG.md && git add CHANGELOG.md && git commit -qm 'Start a change log'", expect = "ok" },
  { call = "merge_request", args = { title = "Change log", summary = "Starts CHANGELOG.md." } },
]

[[rule]]
match = { kind = "message", text_contains = "op: fix" }
actions = [
  { shell = "echo 'Added a change log.' > CHANGELOG.md && git commit -qam 'Say what changed'", expect = "ok" },
  { call = "merge_request", args = { title = "Change log", summary = "Starts CHANGELOG.md, saying what changed." } },
]

[[rule]]
match = { kind = "message" }
actions = []
"#;

/// (c) `review = "required"`: every request gets a reviewer run; `changes_requested` reaches the
/// Manager with its comment, a new commit reruns the checks, asking again gets a new review,
/// `approve`, and the queue merges it. Approving without a verdict needs `--override`.
#[test]
fn changes_requested_then_a_fix_then_approve_then_the_queue_merges_it() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(&fast(&[]));
    env.start_daemon();
    let repo = canonical(env.dir.path());
    let add = [
        "repos",
        "add",
        "app",
        repo.to_str().unwrap(),
        "--check",
        "log=test -s CHANGELOG.md || test ! -e CHANGELOG.md",
    ];
    env.json(&[&add[..], &["--review", "required"]].concat());
    create(&env, "delta", REVIEWED);
    tell(&env, "delta", "op: change");
    // The reviewer run reads the merged tree and asks for changes, with a comment on a line.
    let verdict = env.wait_message("home-delta", "merge: Change log", "changes requested");
    let body = verdict["body"].as_str().unwrap();
    assert!(body.contains("CHANGELOG.md:1: A TODO is not a change log entry"), "{body}");
    // The operator cannot approve over it without saying why.
    let early = env.refused(&["merges", "approve", "merge-1"]);
    assert_eq!((early["code"].as_str(), early["field"].as_str()), (Some("conflict"), Some("override")), "{early}");
    // The fix: a new commit (its checks run on the branch), the request takes it, a new review.
    tell(&env, "delta", "op: fix");
    env.wait_message("home-delta", "merge: Change log", "Review of merge-1 by run-2: approve");
    crate::assert_eventually!(state(&env, "merge-1") == "pending", "{}", env.json(&["merges", "show", "merge-1"]));
    let detail = env.json(&["merges", "show", "merge-1"]);
    let reviews = detail["reviews"].as_array().unwrap();
    assert_eq!(reviews.len(), 2, "{detail}");
    assert_eq!(
        (reviews[0]["verdict"].as_str(), reviews[1]["verdict"].as_str()),
        (Some("changes_requested"), Some("approve"))
    );
    assert_eq!(reviews[0]["comments"][0]["file"], "CHANGELOG.md");
    assert_eq!(detail["request"]["verdict"], "approve");
    assert!(env.ok(&["merges", "show", "merge-1"]).contains("CHANGELOG.md:1: A TODO"));
    crate::assert_eventually!(
        env.json(&["checks", "--branch", "canopy/delta"])["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["trigger"] == "branch"),
        "the new commit's checks never ran: {}",
        env.json(&["checks"])
    );
    // The reviewer's checkout was read-only: it is the merged tree, untouched.
    assert_eq!(env.json(&["merges", "approve", "merge-1"])["state"], "merged");
    assert_eq!(std::fs::read_to_string(repo.join("CHANGELOG.md")).unwrap(), "Added a change log.\n");
    let audit = env.json(&["audit"]);
    assert!(audit["entries"].as_array().unwrap().iter().any(|e| e["action"] == "reviews.submit"), "{audit}");
}

/// A Manager with a stack (bottom, then a top on it), and a change whose check hangs.
const STACKER: &str = r#"
[[rule]]
match = { kind = "message", text_contains = "op: stack" }
actions = [
  { shell = "echo one > one.txt && git add one.txt && git commit -qm 'One'", expect = "ok" },
  { call = "merge_request", args = { title = "Bottom", summary = "The bottom." } },
  { shell = "echo two > two.txt && git add two.txt && git commit -qm 'Two'", expect = "ok" },
  { call = "merge_request", args = { title = "Top", summary = "The top.", depends_on = ["merge-1"] } },
]

[[rule]]
match = { kind = "message", text_contains = "op: hang" }
actions = [
  { shell = "touch hang && git add hang && git commit -qm 'Hang the check'", expect = "ok" },
  { call = "merge_request", args = { title = "Hang", summary = "Its check never ends." } },
]

[[rule]]
match = { kind = "message" }
actions = []
"#;

/// (d) A stacked child of a denied parent is refused with the reason; (e) a hanging check
/// times out and says so.
#[test]
fn a_child_of_a_denied_parent_is_refused_and_a_hanging_check_times_out() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(&fast(&[("check_timeout = \"10m\"", "check_timeout = \"2s\"")]));
    env.start_daemon();
    let repo = canonical(env.dir.path());
    env.json(&[
        "repos",
        "add",
        "app",
        repo.to_str().unwrap(),
        "--check",
        "slow=if test -e hang; then echo hanging; sleep 60; fi",
    ]);
    create(&env, "eps", STACKER);
    tell(&env, "eps", "op: stack");
    env.wait_message("home-eps", "merge: Top", "asks to merge");
    assert_eq!(env.json(&["merges", "approve", "merge-2", "--no-wait"])["state"], "queued");
    assert_eq!(env.json(&["merges", "deny", "merge-1", "--reason", "not this way"])["state"], "denied");
    crate::assert_eventually!(state(&env, "merge-2") == "refused", "{}", env.json(&["merges", "show", "merge-2"]));
    let note = env.json(&["merges", "show", "merge-2"])["request"]["note"].as_str().unwrap().to_owned();
    assert!(note.contains("depends on merge-1, which is denied"), "{note}");
    env.wait_message("home-eps", "merge: Top", "which is denied");
    assert!(!repo.join("two.txt").exists());

    tell(&env, "eps", "op: hang");
    let posted = env.wait_message("home-eps", "merge: Hang", "asks to merge");
    let body = posted["body"].as_str().unwrap();
    assert!(body.contains("slow timed out (timed out after 2s"), "{body}");
    let checks = env.json(&["checks", "--branch", "merge-3"]);
    assert_eq!(checks["checks"][0]["state"], "timed_out", "{checks}");
    let log = env.ok(&["checks", "log", checks["checks"][0]["id"].as_str().unwrap()]);
    assert!(log.contains("hanging"), "a timed-out check keeps what it printed: {log}");
}

/// (f) `kill -9` of the daemon while the queue checks an entry: after the restart the queue
/// resumes, and the entry merges once.
#[test]
fn a_daemon_killed_mid_queue_resumes_it_and_merges_nothing_twice() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(&fast(&[]));
    env.start_daemon();
    let repo = canonical(env.dir.path());
    // Slow only in the queue: the merge request's own check is quick.
    let check = "if test -e queue-slow; then sleep 4; fi";
    env.json(&["repos", "add", "app", repo.to_str().unwrap(), "--check", &format!("gate={check}")]);
    create(&env, "zeta", ADDER);
    tell(&env, "zeta", "op: add a");
    env.wait_message("home-zeta", "merge: Add a", "asks to merge");
    let before = git(&repo, &["rev-list", "--count", "main"]);
    // The queue's check runs in a scratch checkout; make it slow there by the marker file the
    // operator adds to main first (a fast-forward the queue must merge onto).
    std::fs::write(repo.join("queue-slow"), "").unwrap();
    git(&repo, &["add", "queue-slow"]);
    git(&repo, &["commit", "-qm", "Slow the queue"]);
    assert_eq!(env.json(&["merges", "approve", "merge-1", "--no-wait"])["state"], "queued");
    crate::assert_eventually!(
        env.json(&["checks", "--branch", "merge-1"])["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["trigger"] == "queue" && c["state"] == "running"),
        "the queue never started checking: {}",
        env.json(&["checks"])
    );
    env.kill_daemon();
    env.start_daemon();
    crate::assert_eventually!(state(&env, "merge-1") == "merged", "{}", env.json(&["merges", "show", "merge-1"]));
    // One merge commit on top of the operator's: merged once.
    let after: u32 = git(&repo, &["rev-list", "--count", "main"]).parse().unwrap();
    assert_eq!(after, before.parse::<u32>().unwrap() + 3, "{}", git(&repo, &["log", "--oneline", "main"]));
    assert_eq!(git(&repo, &["log", "--format=%s", "main", "--", "a.txt"]).lines().count(), 1);
    let checks = env.json(&["checks", "--branch", "merge-1"])["checks"].as_array().unwrap().clone();
    assert!(
        checks.iter().any(|c| c["state"] == "error" && c["outcome"] == "the daemon stopped while it ran"),
        "the interrupted check is on record: {checks:#?}"
    );
    env.wait_message("home-zeta", "merge: Add a", "restarted while merge-1 was merging");
    // Restarting again with nothing queued changes nothing.
    env.kill_daemon();
    env.start_daemon();
    assert_eq!(git(&repo, &["rev-list", "--count", "main"]).parse::<u32>().unwrap(), after);
}

/// A real Claude Code reviewer run (against the fake model API): it reads the merged tree in a
/// read-only checkout (its write fails) and submits `changes_requested` with a comment on a
/// file and line, which reaches the Manager and `canopy merges show`.
#[test]
fn a_claude_code_reviewer_submits_a_verdict_with_a_comment_on_a_line() {
    use crate::fake_anthropic::{FakeAnthropic, Reply};
    let fake = FakeAnthropic::start(Vec::new());
    let env = crate::claude::claude_env_with(
        &fake,
        &[("[roles.reviewer]\nharness = \"manager\"", "[roles.reviewer]\nharness = \"claude\"")],
    );
    let repo = canonical(env.dir.path());
    env.json(&["repos", "add", "app", repo.to_str().unwrap(), "--check", "docs=test -s README.md"]);
    let written = env.data_dir().join("sessions/run-1/work/written-by-reviewer.txt");
    fake.push(Reply::default().and_call(
        "Bash",
        serde_json::json!({ "command": format!("echo x > {}", written.display()), "description": "try to write" }),
    ));
    fake.push(Reply::canopy_tool(
        "review_submit",
        serde_json::json!({
            "verdict": "changes_requested",
            "summary": "The greeting is shouted; the style guide says lower case.",
            "comments": [{ "file": "greeting.txt", "line": 1, "body": "Use lower case: hello." }],
        }),
    ));
    fake.push(Reply::text("Verdict: changes requested (greeting.txt:1)."));
    let script = env.script(
        "lead.toml",
        r#"
[[rule]]
match = { kind = "message", text_contains = "op: greet" }
actions = [
  { shell = "echo HELLO > greeting.txt && git add greeting.txt && git commit -qm 'Add a greeting'", expect = "ok" },
  { call = "merge_request", args = { title = "Greeting", summary = "Adds greeting.txt." } },
  { call = "review_request", args = { merge_request = "merge-1", focus = "the style guide" } },
]

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
    tell(&env, "lead", "op: greet");
    let verdict = env.wait_message("home-lead", "merge: Greeting", "changes requested");
    let body = verdict["body"].as_str().unwrap();
    assert!(body.contains("greeting.txt:1: Use lower case: hello."), "{body}");
    let detail = env.json(&["merges", "show", "merge-1"]);
    let review = &detail["reviews"][0];
    assert_eq!(
        (review["verdict"].as_str(), review["reviewer"].as_str()),
        (Some("changes_requested"), Some("run-1")),
        "{detail}"
    );
    assert_eq!(review["focus"], "the style guide");
    assert_eq!(review["comments"][0]["line"], 1);
    // The reviewer saw the merged tree, the brief carried the diff, and its write failed.
    let requests = fake.requests();
    assert!(requests.iter().any(|r| crate::claude::occurrences(r, "+HELLO") > 0), "the brief had no diff");
    assert!(!written.exists(), "the reviewer wrote into its checkout");
    assert!(env.data_dir().join("sessions/run-1/work/greeting.txt").exists(), "its checkout is not the merged tree");
}

/// The console shows a merge request's checks, verdict and comments before the operator
/// decides, and approves over a negative verdict only with an override reason, which is
/// recorded and audited.
#[test]
fn the_console_shows_checks_and_the_verdict_and_approves_over_it_only_with_a_reason() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(&fast(&[]));
    env.start_daemon();
    let repo = canonical(env.dir.path());
    let add =
        ["repos", "add", "app", repo.to_str().unwrap(), "--check", "log=test -e README.md", "--review", "required"];
    env.json(&add);
    create(&env, "eta", REVIEWED);
    tell(&env, "eta", "op: change");
    env.wait_message("home-eta", "merge: Change log", "changes requested");
    let base = crate::console::link(&env).split("/login/").next().unwrap().to_owned();
    let cookie = crate::console::session_for(&base, &env.token());
    let (status, _, page) = crate::webdriver::http("GET", &format!("{base}/"), &[("Cookie", &cookie)], "");
    assert_eq!(status, 200);
    for shown in ["merge-1", "in_review", "log passed", "changes_requested", "CHANGELOG.md:1", "Approve (override)"] {
        assert!(page.contains(shown), "the Waiting page lacks {shown:?}");
    }
    let csrf = crate::console::csrf_of(&page);
    let form = [
        ("Cookie", cookie.as_str()),
        ("x-canopy-csrf", csrf.as_str()),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ];
    let (status, _, body) = http_post(&base, &form, "decision=approve");
    assert_eq!(status, 409, "approved over changes_requested without a reason: {body}");
    assert_eq!(state(&env, "merge-1"), "in_review");
    let (status, _, body) = http_post(&base, &form, "decision=approve&override=the+TODO+is+tracked+in+%232");
    assert_eq!(status, 200, "{body}");
    crate::assert_eventually!(state(&env, "merge-1") == "merged", "{}", env.json(&["merges", "show", "merge-1"]));
    let shown = env.json(&["merges", "show", "merge-1"]);
    assert_eq!(shown["request"]["override_reason"], "the TODO is tracked in #2", "{shown}");
    let audit = env.json(&["audit"]);
    let approval = audit["entries"].as_array().unwrap().iter().find(|e| e["action"] == "merges.approve").cloned();
    assert_eq!(approval.unwrap()["detail"], "override: the TODO is tracked in #2");
}

fn http_post(base: &str, headers: &[(&str, &str)], body: &str) -> (u16, Vec<(String, String)>, String) {
    crate::webdriver::http("POST", &format!("{base}/merges/merge-1"), headers, body)
}
