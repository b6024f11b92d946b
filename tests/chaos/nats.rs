//! NATS and runners under chaos: `nats-server` killed mid-load, a standalone runner across
//! restarts of the daemon (SIGTERM and `kill -9`) and of its managed NATS server, and a
//! runner killed while its sessions run.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use canopy_core::fuzz::Rng;

use super::{Ledger, WORKER, api, figure, scale, seed, settle_all};
use crate::delivery::{QUICK, inputs_containing};
use crate::env::{TestEnv, read_pid, signal, wait_timeout};

const WORKERS: [&str; 3] = ["w1", "w2", "w3"];

/// Posts a marker to every worker (retrying while the daemon is not yet back on NATS) and
/// returns how long the slowest took to reach its harness.
fn markers_reach_every_worker(env: &TestEnv, label: &str) -> Duration {
    let at = Instant::now();
    for worker in WORKERS {
        let channel = format!("home-{worker}");
        crate::assert_eventually!(
            env.run(&["post", "--channel", &channel, "--topic", "marker", "--create-topic", label]).status.success(),
            "{label} could not be posted: {}",
            env.daemon_log()
        );
    }
    for worker in WORKERS {
        crate::assert_eventually!(!inputs_containing(env, worker, label).is_empty(), "{label} never reached {worker}");
    }
    at.elapsed()
}

#[test]
fn nats_server_killed_mid_load_loses_nothing() {
    const SCENARIO: &str = "nats-server killed mid-load";
    let kills = scale(3, 20);
    let mut rng = Rng::new(seed(SCENARIO));
    let env = TestEnv::started_with(QUICK);
    for worker in WORKERS {
        env.create_scripted(worker, WORKER);
    }
    settle_all(&env, &WORKERS);
    let api = api(&env);
    let ledger = Arc::new(Ledger::default());
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = super::start_posters(&env, &api, &WORKERS, (4, Duration::from_millis(15)), &stop, &ledger);
    let mut back = Vec::new();
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(400 + rng.below(1200) as u64));
        let before = ledger.acked().len();
        let pid = env.nats.as_ref().unwrap().pid().unwrap();
        signal(pid, canopy_sys::SIGKILL);
        let at = Instant::now();
        // Back when a post is acknowledged again (the server restarts on the same port).
        crate::assert_eventually!(
            env.nats.as_ref().unwrap().pid().is_some_and(|p| p != pid) && ledger.acked().len() > before + 4,
            "posting never resumed after nats-server was killed"
        );
        back.push(at.elapsed());
    }
    super::stop_load(&env, &stop, tasks);
    let checked = super::check_load(&env, &api, &ledger, &WORKERS, &super::homes(&WORKERS));
    let (p50, max) = super::p50_max(&mut back);
    figure(SCENARIO, format!("{kills} kills; posting resumed p50 {p50:.0} ms, max {max:.0} ms after each"));
    super::load_figure(SCENARIO, &ledger, &checked);
}

/// Starts `canopy daemon` with its own NATS server and returns its URL.
fn managed(env: &mut TestEnv) -> String {
    env.spawn_daemon(&["daemon"]);
    let text = std::fs::read_to_string(env.data_dir().join("daemon.json")).unwrap();
    serde_json::from_str::<serde_json::Value>(&text).unwrap()["nats_url"].as_str().unwrap().to_owned()
}

/// A workspace with no embedded runner, its daemon on its own managed NATS, and a standalone
/// runner `second` hosting the workers; with the server's URL.
fn standalone(env: &mut TestEnv) -> (crate::env::Guarded, String) {
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(
        &[QUICK, &[("embedded = true", "embedded = false"), ("runner_ttl = \"10s\"", "runner_ttl = \"2s\"")]].concat(),
    );
    let url = managed(env);
    env.ok(&["runners", "add", "second"]);
    let login =
        canopy_config::credentials::read_login(&env.data_dir().join("credentials/runners/second.json")).unwrap();
    // The server takes the new login at its reload, just after `runners add` answers.
    crate::assert_eventually!(
        env.rt
            .block_on(canopy_bus::Bus::connect(&url, &canopy_bus::Login::fixed(&login.0, &login.1, None), "w", false))
            .is_ok(),
        "the server never took the runner's login"
    );
    let runner = env.spawn_registered_runner(env.command(&["runner", "--id", "second"]), "second");
    for worker in WORKERS {
        env.create_scripted(worker, WORKER);
    }
    settle_all(env, &WORKERS);
    (runner, url)
}

#[test]
fn a_standalone_runner_keeps_delivering_across_daemon_and_nats_restarts() {
    const SCENARIO: &str = "standalone runner across restarts";
    let rounds = scale(2, 10);
    let mut env = TestEnv::new();
    let (mut runner, _) = standalone(&mut env);
    // How long a marker took to reach every worker, per kind of restart.
    let (mut sigterm, mut kill, mut server) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        assert_eq!(env.stop_daemon(), Some(0), "log: {}", env.daemon_log());
        managed(&mut env);
        sigterm.push(markers_reach_every_worker(&env, &format!("MARKER {round} after sigterm")));

        env.kill_daemon();
        managed(&mut env);
        kill.push(markers_reach_every_worker(&env, &format!("MARKER {round} after kill")));

        // The daemon's own server killed: it restarts it on the same port.
        let nats = env.data_dir().join("nats/nats-server.pid");
        let pid = read_pid(&nats).unwrap();
        signal(pid, canopy_sys::SIGKILL);
        crate::assert_eventually!(read_pid(&nats).is_some_and(|p| p != pid), "the managed server was not restarted");
        server.push(markers_reach_every_worker(&env, &format!("MARKER {round} after nats")));
    }
    for worker in WORKERS {
        assert_eq!(env.roster_entry(worker)["runner"], "second", "{worker} left the live runner");
    }
    env.kill_daemon();
    signal(runner.0.id(), canopy_sys::SIGTERM);
    assert!(wait_timeout(&mut runner.0, Duration::from_secs(15)).is_some(), "the runner ignored SIGTERM");
    for (kind, times) in [("SIGTERM", &mut sigterm), ("kill -9", &mut kill), ("a nats-server kill", &mut server)] {
        let (p50, max) = super::p50_max(times);
        figure(
            SCENARIO,
            format!(
                "after {kind} ({} times): a marker posted once the daemon answered again reached all 3 workers p50 {p50:.0} ms, max {max:.0} ms",
                times.len()
            ),
        );
    }
}

#[test]
fn a_runner_killed_with_sessions_running_loses_no_delivery() {
    const SCENARIO: &str = "runner killed with sessions running";
    let kills = scale(3, 20);
    let mut rng = Rng::new(seed(SCENARIO));
    let mut env = TestEnv::new();
    let (mut runner, url) = standalone(&mut env);
    let api = super::operator_api(&env, &url);
    let ledger = Arc::new(Ledger::default());
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = super::start_posters(&env, &api, &WORKERS, (3, Duration::from_millis(15)), &stop, &ledger);
    let mut back = Vec::new();
    for k in 0..kills {
        std::thread::sleep(Duration::from_millis(500 + rng.below(1000) as u64));
        let _ = runner.0.kill();
        let _ = runner.0.wait();
        let at = Instant::now();
        runner = env.spawn_registered_runner(env.command(&["runner", "--id", "second"]), &format!("second-{k}"));
        back.push(at.elapsed());
    }
    super::stop_load(&env, &stop, tasks);
    let checked = super::check_load(&env, &api, &ledger, &WORKERS, &super::homes(&WORKERS));
    let (p50, max) = super::p50_max(&mut back);
    figure(SCENARIO, format!("{kills} runner kills; registered again p50 {p50:.0} ms, max {max:.0} ms"));
    super::load_figure(SCENARIO, &ledger, &checked);
}
