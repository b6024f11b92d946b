//! The chaos suite: processes killed and resources taken away under load, each scenario
//! checking afterwards that nothing committed was lost or done twice, and printing its
//! figures (`chaos figure:` lines on stderr).
//!
//! Two forms. The short one runs with the rest of the end-to-end tests (`.ci/run`); the long
//! one (`scripts/chaos.sh --long`, which sets `CANOPY_CHAOS_LONG=1`) runs 200 kill points and
//! longer loads; `docs/reliability.md` records its latest figures. `CANOPY_CHAOS_SEED`
//! replays the random kill points of a run.
//!
//! Owns the load (posters that retry with idempotency keys, an operator deciding spawn
//! requests) and the exactly-once checks shared by the scenarios; the environment is
//! `env`'s, transcripts are `delivery`'s.

mod cluster;
mod disk;
mod kill9;
mod nats;
mod runner_host;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use canopy_bus::{ApiClient, CallError};
use canopy_core::Seq;
use canopy_proto::api::{PostRequest, PostResponse, ReadRequest};
use canopy_proto::method;

use crate::env::TestEnv;

/// Whether this is the long form.
fn long() -> bool {
    std::env::var("CANOPY_CHAOS_LONG").is_ok_and(|v| v == "1")
}

/// `short` in CI, `long` in the long form.
fn scale(short: u64, long_form: u64) -> u64 {
    if long() { long_form } else { short }
}

/// The seed of this run's random choices, printed so a run can be replayed.
fn seed(scenario: &str) -> u64 {
    let seed = std::env::var("CANOPY_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| canopy_sys::unix_us().max(1) as u64);
    eprintln!("chaos {scenario}: seed {seed} (CANOPY_CHAOS_SEED={seed} replays)");
    seed
}

/// One line of a scenario's figures.
fn figure(scenario: &str, text: impl std::fmt::Display) {
    eprintln!("chaos figure: {scenario}: {text}");
}

/// A worker that reads what it is sent, slows down on `SLOW` (a pretend tool call a steer
/// can land behind) and answers steers.
const WORKER: &str = r#"
[[rule]]
match = { steer = true }
actions = [{ say = "steered" }]

[[rule]]
match = { kind = "message", text_contains = "SLOW" }
actions = [{ sleep = "600ms" }, { say = "slow one done" }]

[[rule]]
match = { kind = "message" }
actions = [{ say = "read it" }]
"#;

/// Whether a call failed in a way a retry with the same idempotency key may get past: the
/// daemon or NATS was away, or the store could not write.
fn transient(error: &CallError) -> bool {
    match error {
        CallError::Unreachable(_) => true,
        CallError::Refused(wire) => wire.code.as_str() == "unavailable",
    }
}

/// What the posters were told, shared with the scenario's checks.
#[derive(Default)]
struct Ledger {
    /// Idempotency key to (channel, body, seq acknowledged).
    acked: std::sync::Mutex<BTreeMap<String, (String, String, Seq)>>,
    attempts: AtomicU64,
    duplicates: AtomicU64,
    /// Refusals a retry cannot get past (none are expected).
    refused: std::sync::Mutex<Vec<String>>,
}

impl Ledger {
    fn acked(&self) -> BTreeMap<String, (String, String, Seq)> {
        self.acked.lock().unwrap().clone()
    }
}

/// Posts `request` until the daemon acknowledges it, retrying transient failures with the
/// same idempotency key; records the acknowledgement.
async fn post_until_acked(api: &ApiClient, token: &str, request: PostRequest, ledger: &Ledger) -> Option<PostResponse> {
    let key = request.idempotency_key.clone().expect("chaos posts carry a key");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        ledger.attempts.fetch_add(1, Ordering::Relaxed);
        match api.send::<method::MessagesPost>(token, &request).await {
            Ok(reply) => {
                if reply.duplicate {
                    ledger.duplicates.fetch_add(1, Ordering::Relaxed);
                }
                let previous = ledger
                    .acked
                    .lock()
                    .unwrap()
                    .insert(key.clone(), (request.channel.clone(), request.body.clone(), reply.message.seq));
                assert!(previous.is_none(), "key {key} was acknowledged twice by one poster");
                return Some(reply);
            }
            Err(e) if transient(&e) => {
                assert!(Instant::now() < deadline, "post {key} was never acknowledged: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => {
                ledger.refused.lock().unwrap().push(format!("{key}: {e}"));
                return None;
            }
        }
    }
}

/// Posters: `count` tasks, each posting to the home channels of `workers` in turn, `pause`
/// between posts, until `stop`, every post retried until acknowledged. One in five mentions
/// its worker (a steer when it is busy); one in seven asks for a slow turn.
fn start_posters(
    env: &TestEnv,
    api: &ApiClient,
    workers: &[&str],
    (count, pause): (usize, Duration),
    stop: &Arc<AtomicBool>,
    ledger: &Arc<Ledger>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let token = env.token();
    (0..count)
        .map(|poster| {
            let (api, token, stop, ledger) = (api.clone(), token.clone(), stop.clone(), ledger.clone());
            let workers: Vec<String> = workers.iter().map(|w| (*w).to_owned()).collect();
            env.rt.spawn(async move {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let worker = &workers[(poster + i) % workers.len()];
                    let key = format!("p{poster}-{i}");
                    let mention = if i.is_multiple_of(5) { format!("@{worker} ") } else { String::new() };
                    let slow = if i % 7 == 3 { " SLOW" } else { "" };
                    let request = PostRequest {
                        channel: format!("home-{worker}"),
                        topic: "load".into(),
                        body: format!("{mention}POST {key}{slow}"),
                        create_topic: true,
                        idempotency_key: Some(key),
                        ack_only: false,
                        wake: false,
                    };
                    post_until_acked(&api, &token, request, &ledger).await;
                    i += 1;
                    tokio::time::sleep(pause).await;
                }
            })
        })
        .collect()
}

/// Every message of a channel, oldest first, read page by page through the API.
fn channel_messages(env: &TestEnv, api: &ApiClient, channel: &str) -> Vec<canopy_core::Message> {
    let token = env.token();
    let mut after = Seq::default();
    let mut all = Vec::new();
    loop {
        let request = ReadRequest {
            channel: channel.to_owned(),
            topic: None,
            after,
            limit: Some(500),
            unread: false,
            newest: false,
        };
        let page = env.rt.block_on(api.send::<method::MessagesRead>(&token, &request)).unwrap();
        let mut batch: Vec<canopy_core::Message> = page.groups.into_iter().flat_map(|g| g.messages).collect();
        batch.sort_by_key(|m| m.seq);
        all.extend(batch);
        if !page.more {
            break;
        }
        after = page.next_after;
    }
    all
}

/// Checks every acknowledged post is stored exactly once at the sequence it was given, that
/// no body is stored twice, and that sequences are never reused; returns the stored count.
fn check_posts_exactly_once(env: &TestEnv, api: &ApiClient, ledger: &Ledger, channels: &[String]) -> usize {
    let acked = ledger.acked();
    let refused = ledger.refused.lock().unwrap().clone();
    assert!(refused.is_empty(), "posts were refused for good: {refused:?}");
    let mut stored = BTreeMap::<String, Vec<Seq>>::new();
    let mut seqs = std::collections::BTreeSet::new();
    for channel in channels {
        for m in channel_messages(env, api, channel) {
            assert!(seqs.insert(m.seq), "sequence {} was used twice", m.seq);
            if m.body.contains("POST ") && m.sender.handle.as_str() == "ops" {
                stored.entry(m.body.clone()).or_default().push(m.seq);
            }
        }
    }
    for (key, (_, body, seq)) in &acked {
        let at = stored.get(body).unwrap_or_else(|| panic!("acknowledged post {key} ({body}) was lost"));
        assert_eq!(at, &vec![*seq], "post {key} is stored at {at:?}, acknowledged at {seq}");
    }
    for (body, at) in &stored {
        assert_eq!(at.len(), 1, "{body} is stored {} times", at.len());
    }
    stored.len()
}

/// How the messages posted to `agent`'s home channel reached its harness: each sequence's
/// count of deliveries, and of those marked `redelivered` in their fence.
#[derive(Default, Debug)]
struct Deliveries {
    once: u64,
    redelivered_marked: u64,
    unmarked_repeats: Vec<String>,
    missing: Vec<String>,
}

/// Reads every input of `agent`'s sessions on the runners whose data directories are `dirs`
/// and checks each acknowledged post to it arrived at least once, and every repeat is marked
/// `redelivered`.
fn check_deliveries(dirs: &[std::path::PathBuf], agent: &str, ledger: &Ledger) -> Deliveries {
    let mut seen = BTreeMap::<u64, Vec<bool>>::new();
    let inputs = dirs.iter().flat_map(|dir| crate::remote::transcript_in(dir, agent)).filter(|l| l["kind"] == "input");
    for input in inputs {
        let text = input["text"].as_str().unwrap_or_default();
        for line in text.lines() {
            // `[canopy-<nonce> message <seq> from @x (role) in #c > t at <time>[, redelivered]]`
            let Some(rest) = line.strip_prefix("[canopy-") else { continue };
            let mut words = rest.split(' ');
            let (_, kind, seq) = (words.next(), words.next(), words.next());
            if kind != Some("message") {
                continue;
            }
            let Some(seq) = seq.and_then(|s| s.parse::<u64>().ok()) else { continue };
            seen.entry(seq).or_default().push(line.ends_with(", redelivered]"));
        }
    }
    let mut out = Deliveries::default();
    let home = format!("home-{agent}");
    for (key, (channel, _, seq)) in ledger.acked() {
        if channel != home {
            continue;
        }
        match seen.get(&seq.get()).map(Vec::as_slice) {
            None | Some([]) => out.missing.push(key),
            Some([_]) => out.once += 1,
            Some([_, again @ ..]) => {
                if again.iter().all(|marked| *marked) {
                    out.redelivered_marked += 1;
                } else {
                    out.unmarked_repeats.push(format!("{key} (seq {seq}): {again:?}"));
                }
            }
        }
    }
    out
}

/// Stops the load and waits for every task of it to finish its last retry.
fn stop_load(env: &TestEnv, stop: &AtomicBool, tasks: Vec<tokio::task::JoinHandle<()>>) {
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        env.rt.block_on(task).unwrap();
    }
}

/// What the load checks found: posts stored, deliveries once, repeats marked `redelivered`.
struct Checked {
    stored: usize,
    once: u64,
    marked: u64,
}

/// The exactly-once checks of a load on `workers` (once they have settled): every
/// acknowledged post stored once at its sequence in `channels`, every post to a worker
/// delivered, every repeat marked.
fn check_load(env: &TestEnv, api: &ApiClient, ledger: &Ledger, workers: &[&str], channels: &[String]) -> Checked {
    check_load_on(env, api, ledger, workers, channels, &[env.data_dir()])
}

/// `check_load` with the workers' sessions on the runners whose data directories are `dirs`.
fn check_load_on(
    env: &TestEnv,
    api: &ApiClient,
    ledger: &Ledger,
    workers: &[&str],
    channels: &[String],
    dirs: &[std::path::PathBuf],
) -> Checked {
    settle_all(env, workers);
    let stored = check_posts_exactly_once(env, api, ledger, channels);
    let (mut once, mut marked) = (0, 0);
    for worker in workers {
        let d = check_deliveries(dirs, worker, ledger);
        assert!(d.missing.is_empty(), "{worker} never received {:?}", d.missing);
        assert!(d.unmarked_repeats.is_empty(), "{worker}: repeats not marked redelivered: {:?}", d.unmarked_repeats);
        once += d.once;
        marked += d.redelivered_marked;
    }
    Checked { stored, once, marked }
}

/// The home channels of `agents`.
fn homes(agents: &[&str]) -> Vec<String> {
    agents.iter().map(|a| format!("home-{a}")).collect()
}

/// The figure line every load scenario prints.
fn load_figure(scenario: &str, ledger: &Ledger, checked: &Checked) {
    figure(
        scenario,
        format!(
            "{} posts acknowledged ({} attempts, {} answered as duplicates of a committed retry), {} stored, 0 lost, 0 twice; deliveries {} once, {} again marked redelivered, 0 unmarked repeats, 0 missing",
            ledger.acked().len(),
            ledger.attempts.load(Ordering::Relaxed),
            ledger.duplicates.load(Ordering::Relaxed),
            checked.stored,
            checked.once,
            checked.marked
        ),
    );
}

/// Waits until every agent is idle with nothing pending (see `TestEnv::settled`), with a
/// longer patience than the default: a loaded machine after many restarts is slow.
fn settle_all(env: &TestEnv, agents: &[&str]) {
    for agent in agents {
        crate::assert_eventually!(
            within = Duration::from_secs(120),
            {
                let entry = env.roster_entry(agent);
                entry["presence"] == "idle" && entry["pending"] == 0
            },
            "{agent} never settled: {}",
            env.roster_entry(agent)
        );
    }
}

/// An API client on the test's NATS with a short timeout, for load that must notice a dead
/// daemon quickly.
fn api(env: &TestEnv) -> ApiClient {
    ApiClient::new(env.bus(), env.subjects(), Duration::from_secs(3))
}

/// An API client on `url` logged in as the operator's NATS client (the daemon's own server
/// requires a login), with a short timeout.
fn operator_api(env: &TestEnv, url: &str) -> ApiClient {
    let subjects = env.subjects();
    let file = canopy_config::DataDir::new(env.data_dir()).operator_login();
    let login = canopy_bus::Login::reading(
        move || canopy_config::credentials::read_login(&file),
        Some(subjects.inbox(canopy_proto::Party::Operator)),
    );
    let bus = env.rt.block_on(canopy_bus::Bus::connect(url, &login, "chaos", false)).unwrap();
    ApiClient::new(bus, subjects, Duration::from_secs(3))
}

/// p50 and max of some durations, in milliseconds.
fn p50_max(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    match samples {
        [] => (0.0, 0.0),
        all => (ms(all[all.len() / 2]), ms(all[all.len() - 1])),
    }
}

/// A JSON value as text (a string without its quotes).
fn text_of(value: &serde_json::Value) -> String {
    value.as_str().map(str::to_owned).unwrap_or_else(|| value.to_string())
}
