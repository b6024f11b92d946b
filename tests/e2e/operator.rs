//! The operator's CLI as a new user meets it: `tail` and `watch` that follow the daemon
//! across a restart on a new port, a stale `daemon.json` reported with its fix, no Rust
//! `Debug` text in any human output, what waits for the operator shown first (`whoami`,
//! `roster`, `tree`, `requests`, `requests --wait`, `[notify]`), `canopy status`, and
//! `doctor` checking what the daemon checks. Output onto a closed pipe is `output`'s.
//!
//! Owns these scenarios only; the environment is `env`'s.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use serde_json::Value;

use crate::delivery::QUICK;
use crate::env::{TestEnv, text};

const QUIET: &str = "[[rule]]\nmatch = { kind = \"message\" }\nactions = [{ say = \"read it\" }]\n";

/// A follower (`canopy --json ARGS`): its JSON lines on a channel, its stderr collected.
struct Follower {
    child: std::process::Child,
    lines: mpsc::Receiver<Value>,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn follow(env: &TestEnv, args: &[&str], ready: &str) -> Follower {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    let mut child =
        env.command(&full).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = Arc::new(Mutex::new(String::new()));
    let collected = stderr.clone();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if let Ok(mut all) = collected.lock() {
                all.push_str(&line);
                all.push('\n');
            }
        }
    });
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Ok(value) = serde_json::from_str(&line) {
                let _ = tx.send(value);
            }
        }
    });
    let follower = Follower { child, lines, stderr };
    if !ready.is_empty() {
        crate::assert_eventually!(
            follower.said().contains(ready),
            "the follower never said {ready:?}: {}",
            follower.said()
        );
    }
    follower
}

impl Follower {
    fn said(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The next line matching `want`, skipping others, within 30 s.
    fn until(&self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if want(&line) => return line,
                Ok(_) => {}
                Err(_) => panic!("the follower never printed {what}; it said: {}", self.said()),
            }
        }
    }
}

fn managed(env: &mut TestEnv) -> String {
    env.spawn_daemon(&["daemon"]);
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(env.data_dir().join("daemon.json")).unwrap()).unwrap();
    info["nats_url"].as_str().unwrap().to_owned()
}

#[test]
fn tail_and_watch_follow_the_daemon_across_a_restart_on_a_new_port() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(QUICK);
    let first = managed(&mut env);
    env.create_scripted("beta", QUIET);
    env.settled("beta");
    let tail = follow(&env, &["tail", "--channel", "home-beta", "--resync", "200ms"], "following messages after");
    let watch = follow(&env, &["watch", "beta", "--tail", "1", "--resync", "200ms"], "");
    env.json(&["post", "--channel", "home-beta", "--topic", "t", "--create-topic", "before the restart"]);
    tail.until("the message before the restart", |m| m["body"] == "before the restart");

    assert_eq!(env.stop_daemon(), Some(0), "log: {}", env.daemon_log());
    // A restarted daemon keeps its server's port while it is free; taken, the port moves.
    let port: u16 = first.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap();
    let taken = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let second = managed(&mut env);
    drop(taken);
    assert_ne!(first, second, "the test needs the restarted daemon on a new port");
    env.json(&["post", "--channel", "home-beta", "--topic", "t", "after the restart"]);
    tail.until("the message after the restart", |m| m["body"] == "after the restart");
    assert!(tail.said().contains("the daemon is back"), "tail did not say it reconnected: {}", tail.said());
    // The agent's next session (the daemon's restart stopped the first) shows in watch.
    watch.until("activity of session 2", |item| item["incarnation"] == 2);
    assert!(watch.said().contains("the daemon is back"), "{}", watch.said());

    // Killed, a daemon leaves its daemon.json: commands say so, with the fix.
    env.kill_daemon();
    let out = env.run(&["roster"]);
    assert_eq!(out.status.code(), Some(69));
    let err = text(&out.stderr);
    assert!(err.contains("is not running") && err.contains("canopy daemon --dir"), "{err}");
}

/// What a new user runs in an afternoon, in human form: none of it shows Rust's `Debug`.
#[test]
fn no_human_output_shows_rust_debug_formatting() {
    let env = TestEnv::started_with(QUICK);
    env.create_scripted("lead", QUIET);
    let child = env.script("child.toml", QUIET);
    env.json(&["agents", "create", "--handle", "worker", "--name", "Worker", "--parent", "lead", "--script", &child]);
    env.ok(&[
        "post",
        "--channel",
        "home-lead",
        "--topic",
        "builds",
        "--create-topic",
        "--idempotency-key",
        "k1",
        "one",
    ]);
    let conflict = env.run(&["post", "--channel", "home-lead", "--topic", "builds", "--idempotency-key", "k1", "two"]);
    env.ok(&["agents", "budget", "lead", "--usd", "5", "--subtree"]);
    let mut seen = text(&conflict.stderr);
    for args in [
        &["whoami"][..],
        &["roster"],
        &["tree"],
        &["agents", "list"],
        &["agents", "show", "worker"],
        &["channels"],
        &["topics", "--channel", "home-lead"],
        &["read", "--channel", "home-lead"],
        &["requests"],
        &["audit"],
        &["usage"],
        &["agents", "budget", "lead"],
        &["status"],
        &["post", "--channel", "home-lead", "--topic", "builds", "three"],
    ] {
        let out = env.run(args);
        seen.push_str(&text(&out.stdout));
        seen.push_str(&text(&out.stderr));
    }
    for debug in ["Some(", "None", "(\"", "Handle(", "TopicName(", "ChannelName(", "RoleName(", "Seq(", "Incarnation("]
    {
        let line = seen.lines().find(|l| l.contains(debug));
        assert!(line.is_none(), "human output shows {debug:?}: {}", line.unwrap_or_default());
    }
    assert!(text(&conflict.stderr).contains("#home-lead > builds"), "{}", text(&conflict.stderr));
}

const REQUESTER: &str = r#"
[[rule]]
match = { kind = "start" }
actions = [{ call = "agents_spawn_peer", args = { handle = "flaky", name = "Flaky Tests Manager", charter = "Hunt down flaky tests", reason = "CI is red twice a day" } }]
"#;

#[test]
fn what_waits_for_the_operator_opens_every_overview_and_can_be_waited_for() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(QUICK);
    let notified = env.data_dir().join("notified.json");
    let command = format!("command = \"cat > {}\"", notified.display());
    env.edit_config(&[("command = \"\"", command.as_str())]);
    env.start_daemon();
    let mut waiter =
        env.command(&["--json", "requests", "--wait"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // Ready once it has read what is pending already.
    let mut ready = String::new();
    BufReader::new(waiter.stderr.take().unwrap()).read_line(&mut ready).unwrap();
    assert!(ready.starts_with("waiting for a new spawn request"), "{ready}");
    env.create_scripted("ci-lead", REQUESTER);
    let out = waiter.wait_with_output().unwrap();
    assert!(out.status.success());
    let waited: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(waited["handle"], "flaky", "requests --wait prints the new request: {waited}");

    for args in [&["whoami"][..], &["roster"], &["tree"]] {
        let first = env.ok(args).lines().next().unwrap_or_default().to_owned();
        assert!(first.starts_with("1 request waits for you: req-1 from ci-lead"), "canopy {args:?}: {first}");
    }
    let listed = env.ok(&["requests"]);
    assert!(listed.contains("asked ") && listed.contains(" ago, expires in "), "{listed}");
    assert!(listed.contains("reason: CI is red twice a day"), "{listed}");
    let status = env.ok(&["status"]);
    assert!(status.contains("waiting   1 request waits"), "{status}");
    assert!(status.contains("agents    "), "{status}");

    crate::assert_eventually!(notified.exists(), "the [notify] command never ran");
    let notice: Value = serde_json::from_str(&std::fs::read_to_string(&notified).unwrap()).unwrap();
    assert_eq!((notice["kind"].as_str(), notice["request"]["handle"].as_str()), (Some("spawn_request"), Some("flaky")));

    let bad = env.run(&["requests", "--state", "bogus"]);
    assert_eq!(bad.status.code(), Some(64), "a bad --state is a usage error");
}

#[test]
fn read_shows_the_newest_page_keeps_indentation_and_a_piped_body_loses_its_final_newline() {
    let env = TestEnv::started();
    for i in 0..5 {
        env.json(&["post", "--channel", "announcements", "--topic", "t", "--create-topic", &format!("n{i}")]);
    }
    let page = env.json(&["read", "--channel", "announcements", "--limit", "2"]);
    let bodies: Vec<&str> =
        page["groups"][0]["messages"].as_array().unwrap().iter().map(|m| m["body"].as_str().unwrap()).collect();
    assert_eq!(bodies, ["n3", "n4"], "the newest page, oldest first");
    assert_eq!(page["more"], true, "older messages exist");
    let start = env.json(&["read", "--channel", "announcements", "--limit", "2", "--from-start"]);
    assert_eq!(start["groups"][0]["messages"][0]["body"], "n0");
    let typo = env.refused(&["read", "--channel", "anouncements"]);
    assert!(typo["message"].as_str().unwrap().contains("did you mean #announcements?"), "{typo}");
    let nobody = env.refused(&["watch", "supervisr"]);
    assert!(nobody["message"].as_str().unwrap().contains("did you mean supervisor?"), "{nobody}");

    let out =
        env.run_with_stdin(&["--json", "post", "--channel", "announcements", "--topic", "t"], "line one\n  indented\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let posted: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(posted["message"]["body"], "line one\n  indented", "the final newline is the pipe's, not the message's");
    let shown = env.ok(&["read", "--channel", "announcements", "--limit", "1"]);
    assert!(shown.contains("line one\n      indented"), "later lines keep their indentation: {shown}");
}

#[test]
fn doctor_checks_what_the_daemon_checks() {
    let env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    // A role switched to a real harness with its script line left in: one line, a warning.
    env.edit_config(&[(
        "harness = \"scripted\"\nscript = \"manager.toml\"",
        "harness = \"claude\"\nscript = \"manager.toml\"",
    )]);
    // A role's prompt renders from the local bundle with no daemon running.
    let rendered = env.run(&["prompt", "render", "--role", "manager"]);
    assert!(rendered.status.success(), "{}", text(&rendered.stderr));
    assert!(text(&rendered.stderr).contains("rendered without a daemon"), "{}", text(&rendered.stderr));
    let out = env.run(&["doctor"]);
    let report = text(&out.stdout);
    assert!(report.contains("roles.manager.script ignored: the claude harness takes no script"), "{report}");
    // A harness that does not exist is what the daemon refuses: exit 64 naming the key.
    env.edit_config(&[("harness = \"claude\"\nscript", "harness = \"nonsense\"\nscript")]);
    let out = env.run(&["doctor"]);
    assert_eq!(out.status.code(), Some(64), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("roles.manager.harness"), "{}", text(&out.stdout));
}

#[test]
fn bash_completes_handles_from_the_daemon_and_the_manual_page_renders() {
    let env = TestEnv::started();
    env.json(&["agents", "create", "--handle", "ci-lead", "--name", "CI Lead"]);
    let script = env.script("canopy.bash", &env.ok(&["completions", "bash"]));
    // The script calls `canopy` by name, as an installed binary.
    let bin = env.data_dir().parent().unwrap().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(crate::env::CANOPY, bin.join("canopy")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let complete = |words: &str, cword: usize, function: &str| {
        let code = format!(
            "source {script}; COMP_WORDS=({words}); COMP_CWORD={cword}; {function} canopy \"${{COMP_WORDS[$COMP_CWORD]}}\" \
             \"${{COMP_WORDS[$COMP_CWORD-1]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        );
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(code)
            .env("PATH", &path)
            .env("CANOPY_DIR", env.data_dir())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    assert!(complete("canopy watch ci", 2, "_canopy_dynamic").lines().any(|l| l == "ci-lead"), "a handle completes");
    let channels = complete("canopy read --channel ann", 3, "_canopy_dynamic");
    assert!(channels.lines().any(|l| l == "announcements"), "a channel completes: {channels}");
    assert!(complete("canopy rost", 1, "_canopy_dynamic").lines().any(|l| l == "roster"), "a command completes");

    let page = env.script("canopy.1", &env.ok(&["man"]));
    let out = std::process::Command::new("man")
        .args(["-l", &page])
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
        .unwrap();
    assert!(out.status.success(), "man -l failed: {}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("canopy") && shown.contains("roster"), "{shown}");
}

/// Each `[notify]` line in `file`, parsed.
fn notices_in(file: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(file).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

#[test]
fn notices_link_to_the_decision_and_what_still_waits_is_told_once_more() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(QUICK);
    env.edit_config(&[("crash_loop_count = 5", "crash_loop_count = 2")]);
    let file = env.data_dir().join("notices.jsonl");
    // Each notice on a line of its own, whole (one `cat` per notice, appended).
    let command = format!("command = \"cat >> {}\"", file.display());
    env.edit_config(&[("command = \"\"", command.as_str()), ("remind_after = \"1h\"", "remind_after = \"3s\"")]);
    env.start_daemon();
    let console = env.json(&["web", "--no-open"])["url"].as_str().unwrap().trim_end_matches('/').to_owned();

    env.create_scripted("ci-lead", REQUESTER);
    env.create_scripted("doomed", "[[rule]]\nactions = [{ crash = true }]\n");
    let of = |kind: &str, reminder: bool| -> Vec<Value> {
        notices_in(&file).into_iter().filter(|n| n["kind"] == kind && n["reminder"] == reminder).collect()
    };
    crate::assert_eventually!(of("spawn_request", false).len() == 1, "no spawn notice: {:?}", notices_in(&file));
    let spawn = &of("spawn_request", false)[0];
    assert_eq!(spawn["console_url"], format!("{console}/#spawn-req-1"), "{spawn}");
    assert_eq!(spawn["request"]["handle"], "flaky");
    crate::assert_eventually!(of("agent_failing", false).len() == 1, "no failing notice: {:?}", notices_in(&file));
    let failing = &of("agent_failing", false)[0];
    assert_eq!(failing["console_url"], format!("{console}/agents/doomed"), "{failing}");
    assert_eq!(failing["agent"]["presence"], "crashed", "{failing}");

    let status = env.ok(&["status"]);
    assert!(status.contains("doomed crashed for "), "status shows how long it has waited: {status}");
    assert!(status.contains("req-1 from ci-lead ("), "{status}");

    // After `remind_after`, each is told once more, and only once.
    crate::assert_eventually!(
        of("spawn_request", true).len() == 1 && of("agent_failing", true).len() == 1,
        "no reminders: {:?}",
        notices_in(&file)
    );
    assert_eq!(of("spawn_request", true)[0]["console_url"], spawn["console_url"]);
    // No time is waited out to see that nothing repeats: a later request's own reminder shows
    // the daemon has looked again since (its reminders go in order), and the first ones are
    // still told once.
    let asks = |env: &TestEnv, asker: &str, child: &str| {
        let script = REQUESTER.replace("\"flaky\"", &format!("\"{child}\""));
        env.create_scripted(asker, &script);
        let reminded =
            |n: &Value| n["kind"] == "spawn_request" && n["reminder"] == true && n["request"]["handle"] == child;
        crate::assert_eventually!(
            notices_in(&file).iter().any(reminded),
            "no reminder of {child}: {:?}",
            notices_in(&file)
        );
    };
    let once = |env_says: &str| {
        let told = (
            of("spawn_request", true).iter().filter(|n| n["request"]["handle"] == "flaky").count(),
            of("agent_failing", true).len(),
        );
        assert_eq!(told, (1, 1), "{env_says}: {:?}", notices_in(&file));
    };
    asks(&env, "docs-lead", "scribe");
    once("a reminder repeated");
    // A restarted daemon does not remind again either: the reminders are stored.
    env.stop_daemon();
    env.start_daemon();
    asks(&env, "ops-lead", "pager");
    once("a restart repeated a reminder");
}
