//! The distributed shape: three `nats-server`s on loopback joined by routes, as machines of
//! one deployment would run them; the daemon on the first, a standalone runner on each of
//! the others, load on the third. Each server is killed and restarted mid-load; nothing is
//! lost, and every runner delivers again within seconds.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use canopy_bus::{ApiClient, Bus, Login};
use canopy_proto::api::PostRequest;

use super::{Ledger, WORKER, figure, scale, settle_all};
use crate::delivery::{QUICK, inputs_containing};
use crate::env::{Guarded, TestEnv};

/// A free loopback port (bound and released; the race with another program is lost only by
/// a test that then fails to start its server, loudly).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One server of the cluster: its ports and, while it runs, its process.
struct Node {
    name: String,
    client: u16,
    monitor: u16,
    conf: PathBuf,
    log: PathBuf,
    process: Option<Child>,
}

impl Node {
    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.client)
    }

    fn start(&mut self) {
        let bin = canopy_bus::find_nats_server().unwrap();
        self.process = Some(
            Command::new(bin)
                .arg("-c")
                .arg(&self.conf)
                .arg("-l")
                .arg(&self.log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// How many routes the server has, from its monitoring endpoint (`/routez`).
    fn routes(&self) -> Option<u64> {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.monitor)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        stream.write_all(b"GET /routez HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).ok()?;
        let body = text.split_once("\r\n\r\n")?.1;
        serde_json::from_str::<serde_json::Value>(body).ok()?["num_routes"].as_u64()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Three servers with full routes between them, started and meshed.
fn cluster(dir: &Path) -> Vec<Node> {
    std::fs::create_dir_all(dir).unwrap();
    let routes: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let list: String = routes.iter().map(|p| format!("    nats-route://127.0.0.1:{p}\n")).collect();
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| {
            let (client, monitor) = (free_port(), free_port());
            let name = format!("n{}", i + 1);
            let conf = dir.join(format!("{name}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "server_name: {name}\nlisten: 127.0.0.1:{client}\nhttp: 127.0.0.1:{monitor}\nmax_payload: 4MB\n\
                     cluster {{\n  name: canopy-chaos\n  listen: 127.0.0.1:{route}\n  routes: [\n{list}  ]\n}}\n",
                    route = routes[i]
                ),
            )
            .unwrap();
            Node { log: dir.join(format!("{name}.log")), name, client, monitor, conf, process: None }
        })
        .collect();
    for node in &mut nodes {
        node.start();
    }
    meshed(&nodes);
    nodes
}

/// Waits until every server has routes to both others.
fn meshed(nodes: &[Node]) {
    crate::assert_eventually!(
        nodes.iter().all(|n| n.routes() == Some(2)),
        "the cluster never formed: {:?}",
        nodes.iter().map(|n| (n.name.clone(), n.routes())).collect::<Vec<_>>()
    );
}

const WORKERS: [&str; 4] = ["w1", "w2", "w3", "w4"];

#[test]
fn a_three_server_cluster_loses_nothing_when_each_server_is_killed_mid_load() {
    const SCENARIO: &str = "three-server cluster";
    let rounds = scale(1, 5);
    let mut env = TestEnv::new();
    let mut nodes = cluster(&env.dir.path().join("cluster"));
    env.ok(&["init", "--operator", "ops"]);
    env.edit_config(
        &[QUICK, &[("embedded = true", "embedded = false"), ("runner_ttl = \"10s\"", "runner_ttl = \"3s\"")]].concat(),
    );
    env.spawn_daemon(&["daemon", "--nats-url", &nodes[0].url()]);
    let mut runners: Vec<Guarded> = Vec::new();
    for (id, node) in [("r2", 1), ("r3", 2)] {
        env.ok(&["runners", "add", id]);
        let command = env.command(&["runner", "--id", id, "--nats-url", &nodes[node].url()]);
        runners.push(env.spawn_registered_runner(command, id));
    }
    for worker in WORKERS {
        env.create_scripted(worker, WORKER);
    }
    settle_all(&env, &WORKERS);
    let placed: Vec<String> = WORKERS.iter().map(|w| super::text_of(&env.roster_entry(w)["runner"])).collect();
    assert!(
        placed.contains(&"r2".to_owned()) && placed.contains(&"r3".to_owned()),
        "both runners host workers: {placed:?}"
    );

    // Load from the third server, so every post crosses a route to the daemon.
    let subjects = env.subjects();
    let login = Login { read: None, inbox: Some(subjects.inbox(canopy_proto::Party::Operator)) };
    let bus = env.rt.block_on(Bus::connect(&nodes[2].url(), &login, "chaos-load", false)).unwrap();
    let api = ApiClient::new(bus, subjects, Duration::from_secs(3));
    let ledger = Arc::new(Ledger::default());
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = super::start_posters(&env, &api, &WORKERS, (2, Duration::from_millis(40)), &stop, &ledger);

    let token = env.token();
    let mut reach = Vec::new();
    let mut marker = 0;
    for _ in 0..rounds {
        for victim in [1, 0, 2] {
            std::thread::sleep(Duration::from_millis(800));
            nodes[victim].kill();
            std::thread::sleep(Duration::from_millis(500));
            nodes[victim].start();
            meshed(&nodes);
            // Every runner delivers again: a marker to each worker arrives.
            let at = Instant::now();
            for worker in WORKERS {
                marker += 1;
                let key = format!("marker-{marker}");
                let request = PostRequest {
                    channel: format!("home-{worker}"),
                    topic: "marker".into(),
                    body: format!("POST {key} after n{} restarted", victim + 1),
                    create_topic: true,
                    idempotency_key: Some(key),
                    ack_only: false,
                    wake: false,
                };
                env.rt.block_on(super::post_until_acked(&api, &token, request, &ledger));
            }
            let posted = at.elapsed();
            let mut arrived = Vec::new();
            for worker in WORKERS {
                let last = format!("after n{} restarted", victim + 1);
                crate::assert_eventually!(
                    inputs_containing(&env, worker, &last).len() > reach.len() / 3,
                    "{worker} did not get the marker after n{} restarted: {}\n{}\n{}",
                    victim + 1,
                    env.roster_entry(worker),
                    env.ok(&["watch", worker, "--no-follow", "--tail", "30"]),
                    log_tail(
                        &env.dir.path().join(format!("{}.log", super::text_of(&env.roster_entry(worker)["runner"])))
                    )
                );
                arrived.push((worker, super::text_of(&env.roster_entry(worker)["runner"]), at.elapsed()));
            }
            reach.push(at.elapsed());
            eprintln!(
                "chaos cluster: n{} back: markers acknowledged after {posted:?}, in every worker after {:?} ({arrived:?})",
                victim + 1,
                at.elapsed()
            );
        }
    }
    super::stop_load(&env, &stop, tasks);
    let checked = super::check_load(&env, &api, &ledger, &WORKERS, &super::homes(&WORKERS));
    let (p50, max) = super::p50_max(&mut reach);
    figure(
        SCENARIO,
        format!(
            "{} server kills (each server in turn); markers reached all 4 workers on both runners p50 {p50:.0} ms, max {max:.0} ms after the restart",
            reach.len()
        ),
    );
    super::load_figure(SCENARIO, &ledger, &checked);
}

/// The last lines of a log file, for a failure message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
