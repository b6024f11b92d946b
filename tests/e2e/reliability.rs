//! Runners that follow the daemon: a standalone runner keeps delivering after the daemon is
//! restarted with SIGTERM and after `kill -9` (the managed server keeps its port, so the
//! runner's connection finds the new server where the old one was), and it ends promptly on
//! SIGTERM while NATS is gone.
//!
//! Owns these scenarios only; transcripts are `delivery`'s, the environment `env`'s.

use std::time::Duration;

use crate::delivery::{QUICK, inputs_containing};
use crate::env::{TestEnv, wait_timeout};

const QUIET: &str = "[[rule]]\nmatch = { kind = \"message\" }\nactions = [{ say = \"read it\" }]\n";

fn managed_url(env: &mut TestEnv) -> String {
    env.spawn_daemon(&["daemon"]);
    let text = std::fs::read_to_string(env.data_dir().join("daemon.json")).unwrap();
    serde_json::from_str::<serde_json::Value>(&text).unwrap()["nats_url"].as_str().unwrap().to_owned()
}

#[test]
fn a_standalone_runner_keeps_delivering_across_daemon_restarts_and_stops_on_sigterm_without_nats() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(
        &[QUICK, &[("embedded = true", "embedded = false"), ("runner_ttl = \"10s\"", "runner_ttl = \"2s\"")]].concat(),
    );
    let first = managed_url(&mut env);
    env.ok(&["runners", "add", "second"]);
    // The server takes the new login at its reload, just after `runners add` answers.
    let login =
        canopy_config::credentials::read_login(&env.data_dir().join("credentials/runners/second.json")).unwrap();
    crate::assert_eventually!(
        env.rt
            .block_on(canopy_bus::Bus::connect(
                &first,
                &canopy_bus::Login::fixed(&login.0, &login.1, None),
                "wait",
                false
            ))
            .is_ok(),
        "the server never took the runner's login"
    );
    let mut runner = env.spawn_registered_runner(env.command(&["runner", "--id", "second"]), "second");
    env.create_scripted("beta", QUIET);
    env.settled("beta");
    assert_eq!(env.roster_entry("beta")["runner"], "second");

    let post = |env: &TestEnv, body: &str| {
        env.json(&["post", "--channel", "home-beta", "--topic", "t", "--create-topic", body]);
        crate::assert_eventually!(!inputs_containing(env, "beta", body).is_empty(), "{body} never reached beta");
    };
    post(&env, "MARKER before");

    assert_eq!(env.stop_daemon(), Some(0), "log: {}", env.daemon_log());
    assert_eq!(managed_url(&mut env), first, "the managed server keeps its port across a restart");
    post(&env, "MARKER after sigterm");

    env.kill_daemon();
    assert_eq!(managed_url(&mut env), first);
    post(&env, "MARKER after kill");
    assert_eq!(env.roster_entry("beta")["runner"], "second", "its session stayed on the live runner");

    // NATS gone with a killed daemon, SIGTERM still ends the runner within its grace.
    env.kill_daemon();
    crate::env::signal(runner.0.id(), canopy_sys::SIGTERM);
    let status = wait_timeout(&mut runner.0, Duration::from_secs(15));
    assert!(status.is_some(), "the runner did not exit on SIGTERM with NATS down");
}

/// A body's limit is `limit_exceeded` wherever the bytes come from; bytes that are not text
/// are a usage error; neither posts anything.
#[test]
fn a_body_on_stdin_past_the_limit_or_not_text_is_refused_with_its_own_class() {
    use std::io::Write;
    let env = TestEnv::started();
    let post = |bytes: Vec<u8>| {
        let mut child = env
            .command(&["--json", "post", "--channel", "announcements", "--topic", "t", "--create-topic"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        // The command stops reading past the limit: the rest meets a closed pipe.
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&bytes);
        });
        let out = child.wait_with_output().unwrap();
        let _ = writer.join();
        out
    };
    let out = post(vec![b'x'; 6 << 20]);
    assert_eq!(out.status.code(), Some(1), "{}", crate::env::text(&out.stderr));
    let error: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (error["error"]["code"].as_str(), error["error"]["field"].as_str()),
        (Some("limit_exceeded"), Some("body"))
    );

    let out = post(b"caf\xe9 au lait".to_vec());
    assert_eq!(out.status.code(), Some(64), "bytes that are not text are a usage error");
    let error: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(error["error"]["code"], "invalid_argument");
    let page = env.json(&["read", "--channel", "announcements"]);
    assert!(page["groups"].as_array().unwrap().is_empty(), "nothing was posted: {page}");
}

/// The embedded runner died with a `kill -9`ed daemon: from the first answer of the next
/// daemon, nothing shows or routes to it, and a post reaches the agent's next session.
#[test]
fn after_a_kill_9_the_dead_embedded_runner_owns_nothing() {
    let mut env = TestEnv::started_with(QUICK);
    env.create_scripted("beta", QUIET);
    env.settled("beta");
    assert_eq!(env.roster_entry("beta")["incarnation"], 1);
    env.kill_daemon();
    env.start_daemon();
    let entry = env.roster_entry("beta");
    assert!(
        !(entry["incarnation"] == 1 && entry["presence"] == "idle"),
        "the dead runner's session is shown as live: {entry}"
    );
    let posted =
        env.json(&["post", "--channel", "home-beta", "--topic", "t", "--create-topic", "MARKER after the kill"]);
    let outcome = posted["outcomes"][0]["outcome"].as_str().unwrap_or_default().to_owned();
    assert!(["held", "woke", "queued"].contains(&outcome.as_str()), "{posted}");
    crate::assert_eventually!(
        !inputs_containing(&env, "beta", "MARKER after the kill").is_empty(),
        "the post never reached beta's next session"
    );
}

/// A runner that dies with sessions owns none of them once its heartbeat expires, though no
/// other runner syncs to notice: the daemon's own timer ends them.
#[test]
fn a_lost_runner_owns_nothing_after_its_ttl_even_when_no_runner_syncs() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(
        &[QUICK, &[("embedded = true", "embedded = false"), ("runner_ttl = \"10s\"", "runner_ttl = \"2s\"")]].concat(),
    );
    env.start_daemon();
    env.ok(&["runners", "add", "second"]);
    let mut runner = env.spawn_registered_runner(env.command(&["runner", "--id", "second"]), "second");
    env.create_scripted("beta", QUIET);
    env.settled("beta");
    let _ = runner.0.kill();
    let _ = runner.0.wait();
    crate::assert_eventually!(
        {
            let entry = env.roster_entry("beta");
            entry["presence"] == "offline" && entry["runner"].is_null()
        },
        "beta still shows on its dead runner: {}",
        env.roster_entry("beta")
    );
    assert!(env.roster_entry("beta")["reason"].as_str().unwrap_or_default().contains("stopped answering"));
}
