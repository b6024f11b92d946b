//! A runner host killed under load with repository agents: two runners on data directories of
//! their own (neither sees the daemon's), four workers each in a checkout of a repository,
//! posts flowing to all of them; the host of some is killed (`kill -9` of its sandbox, which
//! takes the runner along). Its workers run again on the other runner within `runner_ttl` plus
//! 2 s, each in a checkout made from the commit it had pushed, and nothing posted is lost or
//! delivered twice unmarked.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use super::{Ledger, WORKER, figure, settle_all};
use crate::delivery::QUICK;
use crate::env::TestEnv;
use crate::repos::canonical;

const WORKERS: [&str; 4] = ["w1", "w2", "w3", "w4"];

/// A worker that commits when told to, and otherwise is the suite's worker.
fn worker_script() -> String {
    let commit = r#"
[[rule]]
match = { kind = "message", text_contains = "COMMIT" }
actions = [{ shell = "echo {self} >> work.txt && git add work.txt && git commit -qm 'Work of {self}'", expect = "ok" }]
"#;
    format!("{commit}{WORKER}")
}

#[test]
fn a_runner_host_killed_under_load_moves_its_repository_agents_and_loses_nothing() {
    const SCENARIO: &str = "runner host killed";
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    let extra = [
        ("embedded = true", "embedded = false"),
        ("runner_ttl = \"10s\"", "runner_ttl = \"2s\""),
        ("watch_interval = \"15s\"", "watch_interval = \"300ms\""),
    ];
    env.edit_config(&[QUICK, &extra].concat());
    env.start_daemon();
    let repo = canonical(env.dir.path());
    env.json(&["repos", "add", "app", repo.to_str().unwrap()]);
    let data = env.data_dir();
    let a = env.spawn_far_runner("a", &[], &[&data, &repo]);
    let b = env.spawn_far_runner("b", &[], &[&data, &repo]);
    let script = env.script("worker.toml", &worker_script());
    for worker in WORKERS {
        env.json(&["agents", "create", "--handle", worker, "--name", worker, "--script", &script, "--repo", "app"]);
    }
    settle_all(&env, &WORKERS);
    let on = |runner: &str| -> Vec<&str> {
        WORKERS.iter().copied().filter(|w| env.roster_entry(w)["runner"] == runner).collect()
    };
    let victims = on("a");
    assert!(!victims.is_empty() && !on("b").is_empty(), "both runners host workers: {:?} {:?}", victims, on("b"));

    // Each worker commits, and its commit reaches the daemon's mirror.
    for worker in WORKERS {
        env.say(worker, "COMMIT");
    }
    let mirror = data.join("repos/app.git");
    let pushed = |worker: &str| {
        let out = Command::new("git")
            .current_dir(&mirror)
            .args(["log", "-1", "--format=%s", &format!("refs/canopy/agents/{worker}")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == format!("Work of {worker}")
    };
    for worker in WORKERS {
        crate::assert_eventually!(pushed(worker), "{worker}'s commit never reached the daemon");
    }

    // Load on every worker, then the host of some dies.
    let api = super::api(&env);
    let ledger = Arc::new(Ledger::default());
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = super::start_posters(&env, &api, &WORKERS, (2, Duration::from_millis(40)), &stop, &ledger);
    // Load under way: some posts acknowledged before the kill, more after the move.
    let acked = || ledger.acked().len();
    crate::assert_eventually!(acked() >= 20, "the load never got going: {} posts", acked());
    let crate::remote::Far { _runner: mut host, dir: a_dir } = a;
    let killed = Instant::now();
    host.0.kill().unwrap();
    host.0.wait().unwrap();
    for worker in &victims {
        crate::assert_eventually!(
            env.roster_entry(worker)["runner"] == "b" && env.roster_entry(worker)["presence"] == "idle",
            "{worker} never ran on b: {}",
            env.roster_entry(worker)
        );
    }
    let moved = killed.elapsed();
    assert!(moved < Duration::from_secs(2 + 2 + 3), "its workers took {moved:?} to run on b");
    let before = acked();
    crate::assert_eventually!(acked() >= before + 20, "the load stalled after the move: {} posts", acked());
    super::stop_load(&env, &stop, tasks);
    let checked = super::check_load_on(&env, &api, &ledger, &WORKERS, &super::homes(&WORKERS), &[a_dir, b.dir.clone()]);
    // A moved worker's checkout on b starts from what it pushed.
    for worker in &victims {
        let checkout = b.dir.join(format!("sessions/{worker}/work"));
        let head = crate::repos::git(&checkout, &["log", "-1", "--format=%s"]);
        assert_eq!(head, format!("Work of {worker}"), "{worker}'s checkout on b lost its commit");
    }
    figure(
        SCENARIO,
        format!(
            "{} of 4 repository workers moved from the killed runner and ran again on the other after {moved:?} (runner_ttl 2 s), each from its pushed commit",
            victims.len()
        ),
    );
    super::load_figure(SCENARIO, &ledger, &checked);
}
