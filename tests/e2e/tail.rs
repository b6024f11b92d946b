//! `canopy tail` follows new messages live and resyncs from the store after NATS restarts.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use crate::env::{TestEnv, signal};

fn spawn_tail(env: &TestEnv, args: &[&str]) -> (std::process::Child, mpsc::Receiver<serde_json::Value>) {
    let mut full = vec!["--json", "tail", "--resync", "100ms"];
    full.extend_from_slice(args);
    let mut child =
        env.command(&full).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    // Ready once it says it follows: its start is read and its subscription is up.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("following messages after") {
        line.clear();
        if stderr.read_line(&mut line).unwrap_or(0) == 0 {
            panic!("tail exited before it followed");
        }
    }
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Ok(value) = serde_json::from_str(&line) {
                let _ = tx.send(value);
            }
        }
    });
    (child, rx)
}

fn next_body(rx: &mpsc::Receiver<serde_json::Value>) -> String {
    let message = rx.recv_timeout(Duration::from_secs(20)).expect("tail printed nothing");
    message["body"].as_str().unwrap().to_owned()
}

#[test]
fn tail_follows_live_and_resyncs_after_a_nats_restart() {
    let env = TestEnv::started();
    env.json(&["post", "--channel", "announcements", "--topic", "t", "--create-topic", "old"]);
    let (mut tail, rx) = spawn_tail(&env, &[]);
    env.json(&["post", "--channel", "announcements", "--topic", "t", "one"]);
    env.json(&["agents", "create", "--handle", "ci-manager", "--name", "CI Manager"]);
    env.json(&["post", "--channel", "home-ci-manager", "--topic", "hi", "--create-topic", "two"]);
    assert_eq!(next_body(&rx), "old", "tail opens with the few messages before it, not a blank screen");
    assert_eq!(next_body(&rx), "one", "then follows from the newest message, not all of history");
    assert_eq!(next_body(&rx), "two");

    // Kill NATS under both the daemon and the tail; the test's ManagedNats restarts it.
    let pid = env.nats.as_ref().unwrap().pid().unwrap();
    signal(pid, canopy_sys::SIGKILL);
    for (i, body) in ["three", "four", "five"].iter().enumerate() {
        let key = format!("after-restart-{i}");
        crate::assert_eventually!(
            env.run(&["post", "--channel", "announcements", "--topic", "t", "--idempotency-key", &key, body])
                .status
                .success(),
            "posting after the NATS restart failed"
        );
    }
    for body in ["three", "four", "five"] {
        assert_eq!(next_body(&rx), body);
    }
    // A repeat would come with a resync (every 100ms here): wait out two.
    assert!(rx.recv_timeout(Duration::from_millis(250)).is_err(), "tail printed a message twice");
    let _ = tail.kill();
    let _ = tail.wait();
}

#[test]
fn tail_of_one_channel_shows_only_that_channel() {
    let env = TestEnv::started();
    let (mut tail, rx) = spawn_tail(&env, &["--channel", "incidents"]);
    env.json(&["post", "--channel", "announcements", "--topic", "t", "--create-topic", "elsewhere"]);
    env.json(&["post", "--channel", "incidents", "--topic", "t", "--create-topic", "here"]);
    assert_eq!(next_body(&rx), "here");
    let _ = tail.kill();
    let _ = tail.wait();
}
