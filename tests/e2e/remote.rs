//! Runners on other machines, end to end: a runner that cannot see the daemon's data
//! directory (started under bwrap with the daemon's directory and the canonical repository
//! hidden, on a second data directory) hosts a repository agent over the daemon's git
//! endpoint: its run commits, `runs_merge` and `merge_request` work, the operator's approval
//! lands the change on the base, and a push to another agent's branch with that runner's
//! credential is refused and audited. Placement by labels: an agent that needs `gpu` waits
//! `unplaced` until a runner with the label starts. Drain: a session in a long turn moves
//! only once the turn ends, with its continuity block, every message delivered once. A
//! runner killed mid-run: the run ends `failed (runner lost)` with what it pushed, and its
//! Manager runs on the other runner within `runner_ttl` plus 2 s. Everything is on loopback.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::env::{Guarded, TestEnv};
use crate::repos::{answer, canonical, git};
use crate::sessions::FAST;

/// The Manager: a run at its first turn; the operator's words drive its tools.
const LEAD_SCRIPT: &str = r#"
[[rule]]
match = { kind = "start", text_contains = "Session 1 started" }
actions = [
  { call = "agents_run_subagent", args = { definition = "implementer", brief = "alpha: write your name into shared.txt" } },
]

[[rule]]
match = { kind = "message", text_contains = "merge run 1" }
actions = [{ call = "runs_merge", args = { run_id = 1 } }, { call = "workspace_status" }]

[[rule]]
match = { kind = "message", text_contains = "op: greet" }
actions = [
  { shell = "echo hello > greeting.txt && git add greeting.txt && git commit -qm 'Add a greeting'", expect = "ok" },
  { call = "merge_request", args = { title = "Greeting", summary = "Adds greeting.txt." } },
]

[[rule]]
match = { kind = "message" }
actions = []
"#;

/// A run: writes its own name into `shared.txt` and commits.
const RUN_SCRIPT: &str = r#"
[[rule]]
match = { kind = "start" }
actions = [
  { shell = "echo {self} > shared.txt && git commit -qam 'Write {self} into shared.txt'", expect = "ok" },
  { say = "Report: wrote my name into shared.txt and committed it." },
]
"#;

/// A runner on "another machine": its own data directory and configuration, its credential
/// carried in a file, and (when `hide` is given) a view of the file system without those paths.
pub(crate) struct Far {
    pub dir: PathBuf,
    pub _runner: Guarded,
}

impl TestEnv {
    /// Starts runner `id` in a data directory of its own with `labels`, its credential made by
    /// `canopy runners add --out`, confined by bwrap so that every path in `hide` is an empty
    /// directory for it.
    pub(crate) fn spawn_far_runner(&self, id: &str, labels: &[&str], hide: &[&Path]) -> Far {
        let file = self.dir.path().join(format!("{id}.json"));
        self.json(&["runners", "add", id, "--out", file.to_str().unwrap()]);
        let dir = self.dir.path().join(format!("{id}-data"));
        std::fs::create_dir_all(&dir).unwrap();
        // The same settings as the daemon's (a runner needs its own canopy.toml), plus labels.
        let config = std::fs::read_to_string(self.data_dir().join("canopy.toml")).unwrap();
        let labels = labels.iter().map(|l| format!("{l:?}")).collect::<Vec<_>>().join(", ");
        std::fs::write(dir.join("canopy.toml"), config.replacen("labels = []", &format!("labels = [{labels}]"), 1))
            .unwrap();
        let mut command = Command::new("bwrap");
        // Killing bwrap kills the runner (a host that dies takes its runner along).
        command.args(["--dev-bind", "/", "/", "--die-with-parent"]);
        for path in hide {
            command.arg("--tmpfs").arg(path);
        }
        command.arg("--").arg(crate::env::CANOPY).arg("--dir").arg(&dir);
        command.args(["runner", "--credentials", file.to_str().unwrap(), "--nats-url", &self.nats_url_of_daemon()]);
        command.env_remove("CANOPY_DIR");
        let runner = self.spawn_registered_runner(command, id);
        Far { dir, _runner: runner }
    }

    /// The daemon's connection file.
    fn daemon_info(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.data_dir().join("daemon.json")).unwrap()).unwrap()
    }

    /// The managed NATS server's URL.
    pub(crate) fn nats_url_of_daemon(&self) -> String {
        self.daemon_info()["nats_url"].as_str().unwrap().to_owned()
    }

    /// Where the daemon serves repositories to runners.
    pub(crate) fn git_url(&self) -> String {
        self.daemon_info()["git_url"].as_str().unwrap().to_owned()
    }
}

/// A scripted agent's transcript on a runner whose data directory is `dir`.
pub(crate) fn transcript_in(dir: &Path, agent: &str) -> Vec<Value> {
    let sessions = dir.join("sessions").join(agent);
    let mut incarnations: Vec<u64> = std::fs::read_dir(&sessions)
        .map(|rd| rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    incarnations.sort();
    incarnations
        .into_iter()
        .flat_map(|i| {
            let text =
                std::fs::read_to_string(sessions.join(i.to_string()).join("transcript.jsonl")).unwrap_or_default();
            text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).collect::<Vec<_>>()
        })
        .collect()
}

/// The result of the `n`th call of `tool` in a far agent's transcript.
fn far_tool_result(dir: &Path, agent: &str, tool: &str, n: usize) -> Value {
    let results = || -> Vec<Value> {
        transcript_in(dir, agent).into_iter().filter(|l| l["kind"] == "tool_result" && l["name"] == tool).collect()
    };
    crate::assert_eventually!(results().len() > n, "{agent} never called {tool}: {:#?}", transcript_in(dir, agent));
    results()[n].clone()
}

#[test]
fn a_runner_without_the_daemons_disk_hosts_a_repository_agent_that_lands_work() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    let run_script = env.dir.path().join("run.toml");
    std::fs::write(&run_script, RUN_SCRIPT).unwrap();
    let run_script = format!("script = {:?}", run_script.display().to_string());
    let mut edits: Vec<(&str, &str)> = FAST.to_vec();
    edits.push(("script = \"implementer.toml\"", &run_script));
    // No runner in the daemon: every session runs on the far runner.
    edits.push(("embedded = true", "embedded = false"));
    env.edit_config(&edits);
    env.start_daemon();
    let repo = canonical(env.dir.path());
    env.json(&["repos", "add", "app", repo.to_str().unwrap(), "--check", "test -s shared.txt"]);
    let data = env.data_dir();
    let far = env.spawn_far_runner("far", &[], &[&data, &repo]);

    let script = env.script("lead.toml", LEAD_SCRIPT);
    env.json(&["agents", "create", "--handle", "lead", "--name", "Lead", "--script", &script, "--repo", "app"]);
    crate::assert_eventually!(env.roster_entry("lead")["runner"] == "far", "{}", env.roster_entry("lead"));
    // Its checkout is on the far runner's disk, made from the daemon's git endpoint.
    let lead = far.dir.join("sessions/lead/work");
    let branch = || {
        let out = Command::new("git").current_dir(&lead).args(["rev-parse", "--abbrev-ref", "HEAD"]).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default()
    };
    crate::assert_eventually!(branch() == "canopy/lead", "no checkout on the far runner: {:?}", branch());

    // The run commits on the far runner; its report has the commit, pushed to the daemon.
    let report = env.wait_message("home-lead", "run: 1", "branch:");
    let body = report["body"].as_str().unwrap();
    assert!(body.contains("branch: canopy/lead/run-1"), "{body}");
    assert!(body.contains("Write run-1 into shared.txt"), "{body}");
    assert!(body.contains("shared.txt | 2 +-"), "{body}");
    assert!(body.contains("checks: passed: check"), "{body}");
    let mirror = data.join("repos/app.git");
    assert!(!git(&mirror, &["rev-parse", "refs/canopy/runs/1"]).is_empty());

    // runs_merge merges into the Manager's checkout where it is: on the far runner.
    env.settled("lead");
    env.say("lead", "merge run 1");
    let merged = answer(&far_tool_result(&far.dir, "lead", "runs_merge", 0));
    assert_eq!(merged["merged"], true, "{merged}");
    assert_eq!(std::fs::read_to_string(lead.join("shared.txt")).unwrap(), "run-1\n");
    assert!(!far.dir.join("sessions/run-1/work").exists(), "a merged run's checkout stays");
    let status = answer(&far_tool_result(&far.dir, "lead", "workspace_status", 0));
    assert_eq!((status["branch"].as_str(), status["ahead"].as_u64()), (Some("canopy/lead"), Some(1)), "{status}");

    // merge_request pushes the branch; the operator approves; the base has the change.
    env.settled("lead");
    env.say("lead", "op: greet");
    env.wait_message("home-lead", "merge: Greeting", "asks to merge canopy/lead");
    assert_eq!(env.json(&["merges", "approve", "merge-1"])["state"], "merged");
    assert_eq!(std::fs::read_to_string(repo.join("greeting.txt")).unwrap(), "hello\n");
    assert_eq!(std::fs::read_to_string(repo.join("shared.txt")).unwrap(), "run-1\n");

    // With the far runner's credential, only its own agents' refs: another's is refused.
    let token = serde_json::from_str::<Value>(&std::fs::read_to_string(env.dir.path().join("far.json")).unwrap())
        .unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let url = env.git_url();
    let authed = format!("http://far:{token}@{}/app.git", url.trim_start_matches("http://"));
    let before = git(&mirror, &["rev-parse", "refs/heads/main"]);
    for target in ["HEAD:refs/canopy/agents/supervisor", "+HEAD~1:refs/heads/main", "HEAD:refs/canopy/runs/9"] {
        let out = Command::new("git").current_dir(&lead).args(["push", "-q", &authed, target]).output().unwrap();
        assert!(!out.status.success(), "a push to {target} went through");
        assert!(String::from_utf8_lossy(&out.stderr).contains("403"), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let wrong = format!("http://far:nope@{}/app.git", url.trim_start_matches("http://"));
    let mut fetch = Command::new("git");
    fetch.current_dir(&lead).args(["fetch", "-q", &wrong]).env("GIT_TERMINAL_PROMPT", "0");
    assert!(!fetch.output().unwrap().status.success(), "a fetch with a wrong token went through");
    assert_eq!(git(&mirror, &["rev-parse", "refs/heads/main"]), before);
    // Tool calls go over the same endpoint: only tool methods, only with a runner's login.
    let authority = url.trim_start_matches("http://");
    let login = format!("Authorization: Basic {}\r\n", base64_login("far", &token));
    assert!(raw_post(authority, "/api/runners.sync", &login, "").starts_with("HTTP/1.1 404"));
    assert!(raw_post(authority, "/api/whoami", "", "").starts_with("HTTP/1.1 401"));
    let anonymous = raw_post(authority, "/api/whoami", &login, "");
    assert!(anonymous.starts_with("HTTP/1.1 200") && anonymous.contains("\"forbidden\""), "{anonymous}");
    let log = std::fs::read_to_string(env.dir.path().join("far.log")).unwrap();
    assert!(!log.contains("over HTTP could not be sent"), "a tool call fell back to NATS: {log}");
    let audit = env.json(&["audit"]);
    let refused: Vec<&Value> =
        audit["entries"].as_array().unwrap().iter().filter(|e| e["action"] == "git_refused").collect();
    assert_eq!(refused.len(), 3, "{audit}");
    for target in ["refs/canopy/agents/supervisor", "refs/heads/main", "refs/canopy/runs/9"] {
        assert!(refused.iter().any(|e| e["detail"].as_str().unwrap().ends_with(target)), "{target}: {refused:?}");
    }
}

#[test]
fn an_agent_needing_a_label_waits_unplaced_until_a_runner_with_it_starts() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(FAST);
    env.start_daemon();
    let script = env.script("idle.toml", "");
    env.json(&["agents", "create", "--handle", "trainer", "--name", "Trainer", "--script", &script, "--needs", "gpu"]);
    crate::assert_eventually!(
        env.roster_entry("trainer")["reason"] == "unplaced (needs gpu)",
        "{}",
        env.roster_entry("trainer")
    );
    let told = env.wait_message("home-trainer", "canopy: sessions", "waits for a runner");
    assert!(told["body"].as_str().unwrap().contains("gpu"), "{told}");
    let data = env.data_dir();
    let _far = env.spawn_far_runner("gpu-box", &["gpu", "linux"], &[&data]);
    crate::assert_eventually!(env.roster_entry("trainer")["runner"] == "gpu-box", "{}", env.roster_entry("trainer"));
    env.settled("trainer");
    let told = env
        .messages("home-trainer")
        .iter()
        .filter(|m| m["body"].as_str().unwrap_or_default().contains("waits for a runner"))
        .count();
    assert_eq!(told, 1, "the operator is told once");
    let runners = env.json(&["runners"]);
    let gpu = runners["runners"].as_array().unwrap().iter().find(|r| r["id"] == "gpu-box").unwrap().clone();
    assert_eq!(gpu["labels"], serde_json::json!(["gpu", "linux"]), "{runners}");
    assert_eq!(
        (gpu["sessions"].as_u64(), gpu["live"].as_bool(), gpu["draining"].as_bool()),
        (Some(1), Some(true), Some(false))
    );
    assert!(gpu["version"].as_str().is_some_and(|v| !v.is_empty()), "{gpu}");
    let text = env.ok(&["runners"]);
    assert!(text.contains("gpu-box") && text.contains("gpu,linux") && text.contains("live"), "{text}");
    let bad = env.refused(&["agents", "create", "--handle", "bad", "--name", "Bad", "--needs", "GPU!"]);
    assert_eq!((bad["code"].as_str(), bad["field"].as_str()), (Some("invalid_argument"), Some("needs")), "{bad}");
}

/// A worker whose turn on "long" takes 4 s; anything else is read and left.
const WORKER_SCRIPT: &str = r#"
[[rule]]
match = { kind = "message", text_contains = "long job" }
actions = [
  { sleep = "4s" },
  { call = "comms_post_message", args = { channel = "{home}", topic = "ops", body = "long job done" } },
]

[[rule]]
match = { kind = "message" }
actions = []
"#;

/// Every input line of `agent` on the runners whose data directories are `dirs`.
fn inputs_on(dirs: &[&Path], agent: &str) -> Vec<String> {
    dirs.iter()
        .flat_map(|dir| transcript_in(dir, agent))
        .filter(|l| l["kind"] == "input")
        .map(|l| l["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The daemon with no runner of its own, fast syncs and a short runner TTL; with `run_script`,
/// the implementer runs that script.
fn remote_only_env(run_script: Option<&str>) -> TestEnv {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    let mut edits: Vec<(&str, &str)> = FAST.to_vec();
    edits.extend([
        ("embedded = true", "embedded = false"),
        ("runner_ttl = \"10s\"", "runner_ttl = \"2s\""),
        ("watch_interval = \"15s\"", "watch_interval = \"300ms\""),
    ]);
    let run_line = run_script.map(|text| {
        let path = env.dir.path().join("run.toml");
        std::fs::write(&path, text).unwrap();
        format!("script = {:?}", path.display().to_string())
    });
    if let Some(line) = &run_line {
        edits.push(("script = \"implementer.toml\"", line));
    }
    env.edit_config(&edits);
    env.start_daemon();
    env
}

#[test]
fn a_drained_runner_moves_each_session_only_at_its_turn_boundary_delivering_everything_once() {
    let env = remote_only_env(None);
    let data = env.data_dir();
    let a = env.spawn_far_runner("a", &[], &[&data]);
    let script = env.script("worker.toml", WORKER_SCRIPT);
    env.json(&["agents", "create", "--handle", "worker", "--name", "Worker", "--script", &script]);
    crate::assert_eventually!(env.roster_entry("worker")["runner"] == "a", "{}", env.roster_entry("worker"));
    env.settled("worker");
    let b = env.spawn_far_runner("b", &[], &[&data]);

    // A long turn, then the drain, then posts while the turn runs.
    env.say("worker", "long job");
    crate::assert_eventually!(env.roster_entry("worker")["presence"] == "working", "{}", env.roster_entry("worker"));
    let drained = env.json(&["runners", "drain", "a"]);
    assert_eq!(drained["draining"], true, "{drained}");
    for n in 0..5 {
        env.say("worker", &format!("note-{n}"));
    }
    // It leaves `a` only once its turn is over: by then the turn's last post is there (a turn
    // cut short never posts it, and the next session is not given the job again).
    crate::assert_eventually!(env.roster_entry("worker")["runner"] != "a", "{}", env.roster_entry("worker"));
    let done = |env: &TestEnv| env.messages("home-worker").iter().any(|m| m["body"] == "long job done");
    assert!(done(&env), "moved mid-turn: {}", env.roster_entry("worker"));

    // It starts on b, with its continuity block and every note.
    crate::assert_eventually!(env.roster_entry("worker")["runner"] == "b", "{}", env.roster_entry("worker"));
    env.settled("worker");
    let said: Vec<String> =
        env.messages("home-worker").iter().map(|m| m["body"].as_str().unwrap_or("").to_owned()).collect();
    assert!(said.iter().any(|m| m == "long job done"), "the long turn was cut: {said:?}");
    let on_b = inputs_on(&[&b.dir], "worker");
    assert!(on_b[0].contains("[canopy continuity]") && on_b[0].contains("draining"), "{on_b:#?}");
    let every = inputs_on(&[&a.dir, &b.dir], "worker");
    for n in 0..5 {
        let note = format!("note-{n}");
        assert_eq!(every.iter().filter(|i| i.contains(&note)).count(), 1, "{note} not delivered once: {every:#?}");
    }
    assert_eq!(every.iter().filter(|i| i.contains("long job")).count(), 1, "{every:#?}");
    let runners = env.json(&["runners"]);
    let a_row = runners["runners"].as_array().unwrap().iter().find(|r| r["id"] == "a").unwrap().clone();
    assert_eq!((a_row["sessions"].as_u64(), a_row["draining"].as_bool()), (Some(0), Some(true)), "{runners}");
    assert_eq!(env.json(&["runners", "undrain", "a"])["draining"], false);
    let audit = env.json(&["audit"]);
    assert!(audit["entries"].as_array().unwrap().iter().any(|e| e["action"] == "runner_drained"), "{audit}");
    assert_eq!(env.refused(&["runners", "drain", "nowhere"])["code"], "not_found");
}

/// The Manager starts a run that commits, then works on for a minute.
const LOST_LEAD: &str = r#"
[[rule]]
match = { kind = "start", text_contains = "Session 1 started" }
actions = [
  { call = "agents_run_subagent", args = { definition = "implementer", brief = "commit, then keep working" } },
]

[[rule]]
match = { kind = "message" }
actions = []
"#;

const LONG_RUN: &str = r#"
[[rule]]
match = { kind = "start" }
actions = [
  { shell = "echo {self} > shared.txt && git commit -qam 'Write {self} into shared.txt'", expect = "ok" },
  { sleep = "120s" },
]
"#;

#[test]
fn a_runner_killed_mid_run_fails_the_run_with_what_it_pushed_and_its_manager_moves() {
    let env = remote_only_env(Some(LONG_RUN));
    let repo = canonical(env.dir.path());
    env.json(&["repos", "add", "app", repo.to_str().unwrap()]);
    let data = env.data_dir();
    let a = env.spawn_far_runner("a", &[], &[&data, &repo]);
    let script = env.script("lead.toml", LOST_LEAD);
    env.json(&["agents", "create", "--handle", "lead", "--name", "Lead", "--script", &script, "--repo", "app"]);
    // The run (on a, the only runner) commits; its commit reaches the daemon while it works on.
    let mirror = data.join("repos/app.git");
    let pushed = || {
        let mut out = Command::new("git");
        out.current_dir(&mirror).args(["rev-parse", "-q", "--verify", "refs/canopy/runs/1"]);
        out.output().is_ok_and(|o| o.status.success())
    };
    crate::assert_eventually!(pushed(), "the run's commit was never pushed");
    let _b = env.spawn_far_runner("b", &[], &[&data, &repo]);

    let Far { _runner: mut runner_a, dir: _ } = a;
    let killed = std::time::Instant::now();
    runner_a.0.kill().unwrap();
    runner_a.0.wait().unwrap();
    let report = env.wait_message("home-lead", "run: 1", "runner lost");
    let body = report["body"].as_str().unwrap();
    assert!(body.contains("failed") && body.contains("Write run-1 into shared.txt"), "{body}");
    crate::assert_eventually!(env.roster_entry("lead")["runner"] == "b", "{}", env.roster_entry("lead"));
    crate::assert_eventually!(env.roster_entry("lead")["presence"] == "idle", "{}", env.roster_entry("lead"));
    let took = killed.elapsed();
    // runner_ttl (2 s) plus 2 s.
    assert!(took <= std::time::Duration::from_secs(2 + 2), "the Manager took {took:?} to run again");
    assert_eq!(env.json(&["runs", "--agent", "lead"])["runs"][0]["status"], "failed");
}

/// `user:password` in base64, as HTTP Basic sends it.
fn base64_login(user: &str, password: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

/// One HTTP/1.1 POST on a fresh loopback connection; the whole answer as text.
fn raw_post(authority: &str, path: &str, headers: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(authority).unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// Commits when told to; reads anything else.
const COMMITTER: &str = r#"
[[rule]]
match = { kind = "message", text_contains = "COMMIT" }
actions = [{ shell = "echo {self} >> work.txt && git add work.txt && git commit -qm 'Work of {self}'", expect = "ok" }]

[[rule]]
match = { kind = "message" }
actions = []
"#;

/// An agent that committed on a runner elsewhere and is drained back onto the daemon's own
/// runner continues in the daemon's checkout from what it pushed, and back again: each
/// session's end takes its branch along.
#[test]
fn an_agent_moved_back_to_the_daemons_runner_continues_from_what_it_pushed() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    // The branch watchers look every 15 s: what moves the commits here is each session's end.
    env.edit_config(FAST);
    env.start_daemon();
    let repo = canonical(env.dir.path());
    env.json(&["repos", "add", "app", repo.to_str().unwrap()]);
    let data = env.data_dir();
    let far = env.spawn_far_runner("far", &[], &[&data, &repo]);
    // The far runner hosts nothing yet, so it is the least loaded: the agent goes there.
    let script = env.script("committer.toml", COMMITTER);
    env.json(&["agents", "create", "--handle", "dev", "--name", "Dev", "--script", &script, "--repo", "app"]);
    crate::assert_eventually!(env.roster_entry("dev")["runner"] == "far", "{}", env.roster_entry("dev"));
    env.settled("dev");
    env.say("dev", "COMMIT");
    let there = far.dir.join("sessions/dev/work");
    crate::assert_eventually!(git_log(&there, "HEAD") == "Work of dev", "no commit on the far runner");

    env.json(&["runners", "drain", "far"]);
    crate::assert_eventually!(env.roster_entry("dev")["runner"] == "embedded", "{}", env.roster_entry("dev"));
    env.settled("dev");
    let here = data.join("sessions/dev/work");
    assert_eq!(git_log(&here, "HEAD"), "Work of dev", "the daemon's checkout did not catch up");

    // And the other way: a commit made on the daemon's runner goes with the agent when that
    // runner is drained, though the branch watcher had not looked yet.
    env.say("dev", "COMMIT");
    let count = |dir: &Path| git(dir, &["rev-list", "--count", "HEAD"]);
    crate::assert_eventually!(count(&here) == "3", "the second commit never happened: {}", count(&here));
    env.json(&["runners", "undrain", "far"]);
    env.json(&["runners", "drain", "embedded"]);
    crate::assert_eventually!(env.roster_entry("dev")["runner"] == "far", "{}", env.roster_entry("dev"));
    env.settled("dev");
    assert_eq!(git(&there, &["rev-parse", "HEAD"]), git(&here, &["rev-parse", "HEAD"]), "the far checkout is behind");
}

/// The subject of `rev`'s newest commit in `dir` (empty when there is none).
fn git_log(dir: &Path, rev: &str) -> String {
    let out = Command::new("git").current_dir(dir).args(["log", "-1", "--format=%s", rev]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
