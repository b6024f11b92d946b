//! Every subcommand's output onto a full device and into a closed pipe: never a panic (exit
//! 101), a full device reported as an error with exit 74, a closed pipe ending quietly with
//! 141. The table below must name every command the grammar has, so a new command without a
//! row fails here.
//!
//! Owns these checks only; each command's own output is tested in its area's file.

use std::collections::BTreeSet;
use std::fs::File;
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::env::{TestEnv, text, wait_timeout};

/// Where a run's stdout goes.
#[derive(Debug, Clone, Copy)]
enum Sink {
    /// `/dev/full`: every write fails with ENOSPC.
    Full,
    /// A pipe whose reading end is closed before the command starts: every write fails with EPIPE.
    Closed,
}

/// Runs `canopy ARGS` (after `global`) with its stdout on `sink`, with 20 s of patience.
fn run(env: &TestEnv, global: &[&str], args: &[&str], sink: Sink) -> Output {
    let stdout = match sink {
        Sink::Full => Stdio::from(File::options().write(true).open("/dev/full").unwrap()),
        Sink::Closed => {
            let (reader, writer) = std::io::pipe().unwrap();
            drop(reader);
            Stdio::from(writer)
        }
    };
    let all: Vec<&str> = global.iter().chain(args).copied().collect();
    let mut child = env.command(&all).stdin(Stdio::null()).stdout(stdout).stderr(Stdio::piped()).spawn().unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(20));
    if status.is_none() {
        let _ = child.kill();
    }
    let output = child.wait_with_output().unwrap();
    assert!(status.is_some(), "canopy {all:?} did not end with its stdout on {sink:?}: {}", text(&output.stderr));
    output
}

/// The command path of a row: the words that extend a known path, skipping flags and values
/// between them (`topics --channel c rename` is `topics rename`).
fn path_of(args: &[&str], paths: &BTreeSet<String>) -> String {
    let mut path = String::new();
    for word in args {
        let candidate = if path.is_empty() { word.to_string() } else { format!("{path} {word}") };
        if paths.contains(&candidate) {
            path = candidate;
        }
    }
    path
}

/// Each command with arguments that reach its output (an answer, or a refusal that `--json`
/// prints on stdout). Commands that change what later rows see come last.
fn rows(scratch: &str) -> Vec<Vec<String>> {
    let rows: &[&[&str]] = &[
        &["whoami"],
        &["agents", "list"],
        &["agents", "--help"],
        &["agents", "show", "supervisor"],
        &["agents", "create", "--handle", "supervisor", "--name", "Again"],
        &["agents", "start", "nobody"],
        &["agents", "stop", "nobody"],
        &["agents", "interrupt", "nobody"],
        &["agents", "budget", "nobody", "--usd", "1"],
        &["agents", "despawn", "nobody", "--yes"],
        &["agents", "reparent", "nobody", "--parent", "supervisor"],
        &["tree"],
        &["channels"],
        &["channels", "list"],
        &["channels", "create", "announcements"],
        &["topics", "--channel", "announcements"],
        &["topics", "--channel", "announcements", "rename", "no-such-topic", "other"],
        &["topics", "--channel", "announcements", "resolve", "no-such-topic"],
        &["board", "--channel", "announcements"],
        &["board", "--channel", "announcements", "pin", "999999"],
        &["board", "--channel", "announcements", "unpin", "999999"],
        &["post", "--channel", "no-such-channel", "--topic", "t", "hello"],
        &["read", "--channel", "announcements"],
        &["tail", "--last", "5"],
        &["roster"],
        &["status"],
        &["watch", "talker", "--no-follow"],
        &["watch", "talker", "--timeline"],
        &["top"],
        &["web", "--no-open"],
        &["operators", "--help"],
        &["operators", "list"],
        &["operators", "add", "bad handle"],
        &["operators", "revoke", "nobody"],
        &["runners"],
        &["runners", "list"],
        &["runners", "add", "bad id"],
        &["runners", "remove", "nobody"],
        &["runners", "drain", "nobody"],
        &["runners", "undrain", "nobody"],
        &["nats-config"],
        &["mcp", "--stdio", "--url", "http://127.0.0.1:9/mcp", "--token", "x"],
        &["doctor"],
        &["demo", "--yes"],
        &["approve", "req-999"],
        &["deny", "req-999", "--reason", "no"],
        &["repos", "--help"],
        &["repos", "list"],
        &["repos", "add", "bad name", "/nonexistent"],
        &["repos", "gc"],
        &["checks"],
        &["checks", "log", "999999"],
        &["merges"],
        &["merges", "show", "999999"],
        &["merges", "approve", "999999"],
        &["merges", "deny", "999999", "--reason", "no"],
        &["merges", "queue"],
        &["issues"],
        &["issues", "new", "--title", ""],
        &["issues", "show", "999999"],
        &["issues", "assign", "999999", "supervisor"],
        &["issues", "move", "999999", "doing", "--note", "n"],
        &["issues", "comment", "999999", "hi"],
        &["issues", "close", "999999", "--resolution", "done"],
        &["issues", "edit", "999999", "--title", "t"],
        &["issues", "budget", "999999", "--usd", "1"],
        &["issues", "import", "/nonexistent/issues.json"],
        &["issues", "export"],
        &["requests"],
        &["audit"],
        &["prompt", "--help"],
        &["prompt", "render", "--role", "manager"],
        &["bundle", "--help"],
        &["bundle", "check"],
        &["runs", "--agent", "supervisor"],
        &["usage"],
        &["usage", "--series"],
        &["completions", "bash"],
        &["complete", "handles"],
        &["man"],
        &["help"],
        &["init", "--operator", "ops"],
        &["daemon"],
        &["up"],
        &["runner"],
        &["credentials", "--help"],
        &["credentials", "rotate"],
    ];
    let mut rows: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(|s| s.to_string()).collect()).collect();
    rows.push(vec!["bundle".into(), "import".into(), "--from".into(), scratch.into()]);
    rows
}

/// The rows not run once more to see whether they answer in text: the demo takes a minute
/// (`read_onto_a_full_device_and_the_demo_into_head_end_as_a_unix_tool_does` covers it), the
/// daemon's commands and `tail` would stay up, and `doctor` starts harness sessions.
const SLOW: [&str; 6] = ["demo", "daemon", "up", "runner", "doctor", "tail"];

/// The rows that may write nothing at all: a stdio server with nothing on stdin, the
/// completion helper, which is silent rather than print into a command line, and `top`,
/// which needs a terminal and says so on stderr.
const SILENT: [&str; 3] = ["mcp", "complete", "top"];

#[test]
fn every_command_reports_a_full_device_with_74_and_ends_quietly_on_a_closed_pipe() {
    let env = TestEnv::started_with(crate::delivery::QUICK);
    // Something for `tail`, `read`, `watch` and `issues export` to show.
    env.ok(&["post", "--channel", "announcements", "--topic", "hello", "--create-topic", "hi"]);
    env.ok(&["issues", "new", "--title", "Something to export"]);
    env.create_scripted("talker", "[[rule]]\nmatch = { kind = \"start\" }\nactions = [{ say = \"hello\" }]\n");
    crate::assert_eventually!(!env.ok(&["watch", "talker", "--no-follow"]).is_empty(), "the session did nothing");
    let paths: BTreeSet<String> =
        canopy_cli::cli_commands().into_iter().map(|p| p.trim_start_matches("canopy ").to_owned()).collect();
    let scratch = tempfile::tempdir().unwrap();
    let rows = rows(scratch.path().to_str().unwrap());
    let covered: BTreeSet<String> =
        rows.iter().map(|r| path_of(&r.iter().map(String::as_str).collect::<Vec<_>>(), &paths)).collect();
    let missing: Vec<&String> = paths.iter().filter(|p| !covered.contains(*p)).collect();
    assert!(missing.is_empty(), "commands without a row: {missing:?}");

    let mut wrong = Vec::new();
    for row in &rows {
        let args: Vec<&str> = row.iter().map(String::as_str).collect();
        let path = path_of(&args, &paths);
        // In text, a command that answered on stdout (read whole first) must fail the same way.
        let writes_text = !SLOW.contains(&path.as_str()) && {
            let out = env.command(&args).stdin(Stdio::null()).output().unwrap();
            out.status.success() && !out.stdout.is_empty()
        };
        for (global, sink) in [
            (&["--json"][..], Sink::Full),
            (&["--json"][..], Sink::Closed),
            (&[][..], Sink::Full),
            (&[][..], Sink::Closed),
        ] {
            let out = run(&env, global, &args, sink);
            let code = out.status.code();
            let stderr = text(&out.stderr);
            let what =
                format!("canopy {} {} on {sink:?}: exit {code:?}, stderr {stderr}", global.join(" "), row.join(" "));
            if code == Some(101) || stderr.contains("panicked") {
                wrong.push(format!("a panic: {what}"));
            }
            if code == Some(74) && !stderr.contains("cannot write the output to stdout: No space left on device") {
                wrong.push(format!("74 without saying why: {what}"));
            }
            if (global.is_empty() && !writes_text) || SILENT.contains(&path.as_str()) {
                continue;
            }
            // With `--json` every command answers on stdout, a refusal too.
            let expected = match sink {
                Sink::Full => 74,
                Sink::Closed => 141,
            };
            if code != Some(expected) || (matches!(sink, Sink::Closed) && stderr.contains("error")) {
                wrong.push(format!("expected exit {expected} quietly: {what}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn read_onto_a_full_device_and_the_demo_into_head_end_as_a_unix_tool_does() {
    let env = TestEnv::started();
    let out = run(&env, &[], &["read", "--channel", "announcements"], Sink::Full);
    assert_eq!(out.status.code(), Some(74), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("error: cannot write the output to stdout"), "{}", text(&out.stderr));

    // `canopy demo --yes | head -1`: the first line arrives, then the demo ends at once.
    let line = format!("set -o pipefail; '{}' demo --yes | head -1", crate::env::CANOPY);
    let started = std::time::Instant::now();
    let out = std::process::Command::new("bash").arg("-c").arg(&line).env_remove("CANOPY_DIR").output().unwrap();
    assert_eq!(out.status.code(), Some(141), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("Canopy demo"), "{}", text(&out.stdout));
    assert_eq!(text(&out.stdout).lines().count(), 1);
    assert!(!text(&out.stderr).contains("panicked"), "{}", text(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(60), "the demo went on after its reader left");
}
