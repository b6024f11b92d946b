//! `kill -9` of the daemon at random points under concurrent load: posts to workers (some
//! mentioning a busy worker, so steers are in flight), a Manager asking for children and
//! subagent runs, and the operator deciding every request. Everything is retried with its
//! idempotency key or re-read; afterwards posts, decisions, deliveries and runs are checked
//! exactly once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use canopy_core::fuzz::Rng;
use canopy_core::{ErrorCode, SpawnState};
use canopy_proto::api::{AuditListRequest, PostRequest, RunsListRequest, SpawnDecideRequest, SpawnListRequest};
use canopy_proto::method;

use super::{Ledger, WORKER, api, figure, scale, seed, settle_all};
use crate::env::TestEnv;

/// A Manager that asks for a child named by the topic of `ASK-SPAWN`, and briefs a run on
/// `ASK-RUN`.
const LEAD: &str = r#"
[[rule]]
match = { kind = "message", text_contains = "ASK-SPAWN" }
actions = [{ call = "agents_spawn_peer", args = { handle = "{input.topic}", name = "Kid", charter = "chaos child", reason = "chaos" } }]

[[rule]]
match = { kind = "message", text_contains = "ASK-RUN" }
actions = [{ call = "agents_run_subagent", args = { definition = "implementer", brief = "chaos brief" } }]

[[rule]]
match = { kind = "message" }
actions = [{ say = "noted" }]
"#;

const WORKERS: [&str; 3] = ["w1", "w2", "w3"];

#[test]
fn kill_9_at_random_points_under_load_loses_and_repeats_nothing() {
    const SCENARIO: &str = "kill -9 under load";
    let kills = scale(8, 200);
    let mut rng = Rng::new(seed(SCENARIO));
    let mut env = TestEnv::started_with(
        &[
            crate::delivery::QUICK,
            &[("max_children = 8", "max_children = 100"), ("max_pending_requests = 3", "max_pending_requests = 50")],
        ]
        .concat(),
    );
    for worker in WORKERS {
        env.create_scripted(worker, WORKER);
    }
    env.create_scripted("lead", LEAD);
    settle_all(&env, &[&WORKERS[..], &["lead"]].concat());

    let api = api(&env);
    let token = env.token();
    let ledger = Arc::new(Ledger::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = super::start_posters(&env, &api, &WORKERS, (4, Duration::from_millis(15)), &stop, &ledger);

    // The Manager is asked for children and runs now and then, each ask a post retried
    // with its key; a bounded number, so the tree stays small.
    let asks = scale(8, 60);
    tasks.push({
        let (api, token, stop, ledger) = (api.clone(), token.clone(), stop.clone(), ledger.clone());
        env.rt.spawn(async move {
            for n in 0..asks {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let (topic, ask) =
                    if n % 3 == 2 { (format!("ask-run-{n}"), "ASK-RUN") } else { (format!("kid-{n}"), "ASK-SPAWN") };
                let key = format!("a-{n}");
                let request = PostRequest {
                    channel: "home-lead".into(),
                    topic,
                    body: format!("POST {key} {ask}"),
                    create_topic: true,
                    idempotency_key: Some(key),
                    ack_only: false,
                    wake: false,
                };
                super::post_until_acked(&api, &token, request, &ledger).await;
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
        })
    });

    // The operator decides every pending request: one in three approved.
    let decided = Arc::new(std::sync::Mutex::new(BTreeMap::<String, SpawnState>::new()));
    let already = Arc::new(AtomicU64::new(0));
    let decider_stop = Arc::new(AtomicBool::new(false));
    let decider = {
        let (api, token, stop, decided, already) =
            (api.clone(), token.clone(), decider_stop.clone(), decided.clone(), already.clone());
        env.rt.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(150)).await;
                let Ok(list) =
                    api.send::<method::SpawnList>(&token, &SpawnListRequest { state: Some(SpawnState::Pending) }).await
                else {
                    continue;
                };
                for request in list.requests {
                    let approve =
                        request.handle.as_str().trim_start_matches("kid-").parse::<u64>().unwrap_or(1) % 3 == 0;
                    let decide = SpawnDecideRequest { id: request.id.clone(), approve, reason: Some("chaos".into()) };
                    match api.send::<method::SpawnDecide>(&token, &decide).await {
                        Ok(after) => {
                            let previous = decided.lock().unwrap().insert(request.id.clone(), after.state);
                            assert!(
                                previous.is_none(),
                                "request {} was decided twice: {previous:?} then {:?}",
                                request.id,
                                after.state
                            );
                        }
                        Err(canopy_bus::CallError::Refused(e)) if e.code == ErrorCode::Conflict => {
                            already.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {}
                    }
                }
            }
        })
    };

    // The kills.
    let started = Instant::now();
    let mut ready = Vec::new();
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(150 + rng.below(900) as u64));
        env.kill_daemon();
        let at = Instant::now();
        env.start_daemon();
        ready.push(at.elapsed());
    }
    super::stop_load(&env, &stop, tasks);
    let load_time = started.elapsed();

    // Quiet: every agent idle with nothing pending, every request decided, every run over.
    settle_all(&env, &[&WORKERS[..], &["lead"]].concat());
    crate::assert_eventually!(
        env.rt
            .block_on(api.send::<method::SpawnList>(&token, &SpawnListRequest { state: Some(SpawnState::Pending) }))
            .is_ok_and(|l| l.requests.is_empty()),
        "spawn requests stayed pending"
    );
    decider_stop.store(true, Ordering::Relaxed);
    env.rt.block_on(decider).unwrap();
    let runs = || {
        env.rt
            .block_on(
                api.send::<method::RunsList>(&token, &RunsListRequest { agent: Some("lead".into()), open: false }),
            )
            .unwrap()
            .runs
    };
    crate::assert_eventually!(
        within = Duration::from_secs(90),
        !runs().iter().any(|r| r.status == "running"),
        "runs never ended: {:?}",
        runs()
    );

    // Posts exactly once at their sequence; every post reached its worker, repeats marked.
    let channels = super::homes(&[&WORKERS[..], &["lead"]].concat());
    let checked = super::check_load(&env, &api, &ledger, &WORKERS, &channels);

    // Decisions: each request decided once, in the audit log once, and each spawned child
    // exists once under its Manager.
    let all =
        env.rt.block_on(api.send::<method::SpawnList>(&token, &SpawnListRequest { state: None })).unwrap().requests;
    let audit = env.rt.block_on(api.send::<method::AuditList>(&token, &AuditListRequest { since_secs: None })).unwrap();
    let mut decisions = BTreeMap::<String, u32>::new();
    for entry in &audit.entries {
        if entry.action == "spawn.approve" || entry.action == "spawn.deny" {
            *decisions.entry(entry.target.clone()).or_default() += 1;
        }
    }
    let roster = env.json(&["roster"]);
    let agents = roster["agents"].as_array().unwrap();
    let mut spawned = 0;
    for request in &all {
        let count = decisions.get(&request.id).copied().unwrap_or(0);
        match request.state {
            SpawnState::Spawned | SpawnState::Denied | SpawnState::Failed => {
                assert_eq!(
                    count, 1,
                    "request {} ({:?}) has {count} decisions in the audit log",
                    request.id, request.state
                )
            }
            other => assert_eq!(count, 0, "request {} is {other:?} with {count} decisions", request.id),
        }
        if let Some(state) = decided.lock().unwrap().get(&request.id) {
            assert_eq!(*state, request.state, "request {} answered {state:?}, stored {:?}", request.id, request.state);
        }
        if request.state == SpawnState::Spawned {
            spawned += 1;
            let children: Vec<_> = agents.iter().filter(|a| a["handle"] == request.handle.as_str()).collect();
            assert_eq!(children.len(), 1, "{} is in the roster {} times", request.handle, children.len());
            assert_eq!(children[0]["parent"], "lead");
        }
    }

    // Runs: each reported at most once.
    let runs = runs();
    let reports = super::channel_messages(&env, &api, "home-lead");
    for run in &runs {
        let topic = format!("run: {}", run.id);
        let count =
            reports.iter().filter(|m| m.topic.as_str() == topic && m.sender.handle.as_str() == "canopy").count();
        assert!(count <= 1, "run {} was reported {count} times", run.id);
    }

    let (p50, max) = super::p50_max(&mut ready);
    figure(
        SCENARIO,
        format!(
            "{kills} kill points in {:.1} s; ready again p50 {p50:.0} ms, max {max:.0} ms",
            load_time.as_secs_f64()
        ),
    );
    super::load_figure(SCENARIO, &ledger, &checked);
    figure(
        SCENARIO,
        format!(
            "{} spawn requests, {} decisions answered ({} retries found it decided), {spawned} children spawned once each; {} runs, none reported twice",
            all.len(),
            decided.lock().unwrap().len(),
            already.load(Ordering::Relaxed),
            runs.len()
        ),
    );
}
