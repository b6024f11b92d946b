//! The daemon's lifecycle with its own managed nats-server: start, restart of a dead
//! server, graceful stop, `kill -9` (no orphan), the directory lock, and `canopy up`.

use crate::env::{TestEnv, alive, read_pid, signal};

impl TestEnv {
    /// Starts `canopy daemon` with its own private nats-server.
    fn start_managed_daemon(&mut self) {
        self.spawn_daemon(&["daemon"]);
    }

    fn managed_nats_pid(&self) -> u32 {
        read_pid(&self.data_dir().join("nats").join("nats-server.pid")).unwrap()
    }
}

#[test]
fn the_managed_nats_server_dies_with_a_killed_daemon() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.start_managed_daemon();
    let nats = env.managed_nats_pid();
    assert!(alive(nats));
    env.kill_daemon();
    crate::assert_eventually!(!alive(nats), "nats-server {nats} outlived the daemon after kill -9");

    // The next daemon starts cleanly on the same directory.
    env.start_managed_daemon();
    env.json(&["post", "--channel", "announcements", "--topic", "t", "--create-topic", "after restart"]);
}

#[test]
fn sigterm_stops_the_daemon_and_its_server_gracefully() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.start_managed_daemon();
    let nats = env.managed_nats_pid();
    assert_eq!(env.stop_daemon(), Some(0), "log: {}", env.daemon_log());
    assert!(!alive(nats), "nats-server {nats} outlived a graceful stop");
    assert!(!env.data_dir().join("daemon.json").exists(), "daemon.json left behind");
    assert!(env.daemon_log().contains("canopy daemon stopped"), "{}", env.daemon_log());
}

#[test]
fn a_dead_managed_server_is_restarted_and_the_daemon_keeps_serving() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.start_managed_daemon();
    let first = env.managed_nats_pid();
    env.json(&["post", "--channel", "announcements", "--topic", "t", "--create-topic", "before"]);
    signal(first, canopy_sys::SIGKILL);
    crate::assert_eventually!(
        read_pid(&env.data_dir().join("nats").join("nats-server.pid")).is_some_and(|p| p != first),
        "nats-server was not restarted"
    );
    crate::assert_eventually!(
        env.run(&["post", "--channel", "announcements", "--topic", "t", "--idempotency-key", "after-1", "after"])
            .status
            .success(),
        "the daemon did not serve again after its server restarted"
    );
    let page = env.json(&["read", "--channel", "announcements"]);
    let bodies: Vec<&str> =
        page["groups"][0]["messages"].as_array().unwrap().iter().map(|m| m["body"].as_str().unwrap()).collect();
    assert_eq!(bodies, ["before", "after"]);
}

#[test]
fn a_second_daemon_on_the_same_directory_is_refused() {
    let mut env = TestEnv::started();
    let out = env.command(&["daemon", "--nats-url", &env.nats_url()]).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(crate::env::text(&out.stderr).contains("another daemon"), "{}", crate::env::text(&out.stderr));
    // The first one is unharmed.
    env.json(&["whoami"]);
    assert_eq!(env.stop_daemon(), Some(0));
}

#[test]
fn up_initialises_once_then_runs_the_daemon() {
    let mut env = TestEnv::new();
    let url = env.nats_url();
    env.spawn_daemon(&["up", "--operator", "ops", "--nats-url", &url]);
    let id = env.json(&["whoami"])["workspace"]["id"].as_str().unwrap().to_owned();
    assert_eq!(env.stop_daemon(), Some(0));

    // A second `up` reuses the workspace.
    env.spawn_daemon(&["up", "--nats-url", &url]);
    assert_eq!(env.json(&["whoami"])["workspace"]["id"], id.as_str());
}
