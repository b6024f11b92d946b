//! `canopy bench`: the figures of DESIGN section 11 (delivery and the budget check here, restart and memory in
//! `restart.rs`, prompt render in `prompt.rs`, session start confined vs unconfined in
//! `sandbox.rs`, checkouts in `checkout.rs`, the MCP tool call in `mcp.rs`), each printed beside its raw baseline measured
//! in the same run on the same machine (these machines are noisy; ratios hold, absolute times
//! do not).
//!
//! Everything is real: a private `nats-server`, the daemon on a temporary data directory,
//! SQLite files, and for steers a runner with a scripted harness session. The baselines use
//! the same server and the same store writer with nothing of Canopy around them: a NATS
//! echo, a NATS request that commits one row and replies, and a plain NATS publish burst.
//! Does not touch any existing workspace.

pub mod check;
pub mod checkout;
pub mod large;
pub mod mcp;
pub mod prompt;
pub mod restart;
pub mod sandbox;
pub mod setup;

use std::time::{Duration, Instant};

use bytes::Bytes;
use canopy_proto::api::*;
use canopy_proto::method;
use canopy_proto::{ApiMethod, Reply};
use futures_util::StreamExt;
use serde::Serialize;

pub use setup::Sandbox;

/// How big a run is.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Smaller counts, for CI and a first look (about half a minute).
    pub quick: bool,
    /// Only the history figures (`large.rs`): 0, 1,000,000 and 10,000,000 messages (with
    /// `quick`, 0 and 100,000).
    pub large: bool,
    /// Which groups of figures to measure (all by default).
    pub only: Parts,
}

/// The groups of figures `canopy bench --only` selects, by name.
/// The last three are `--large`'s.
pub const PARTS: &[&str] = &[
    "post",
    "steer",
    "mcp",
    "broadcast",
    "budget",
    "restart",
    "prompt",
    "sandbox",
    "checkout",
    "history",
    "posters",
    "agents",
];

/// A set of `PARTS`, as bits in their order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts(u16);

impl Parts {
    pub const ALL: Parts = Parts(u16::MAX);

    /// The parts named, or an error naming the unknown one and the known ones.
    pub fn parse<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Parts, String> {
        let mut bits = 0;
        for name in names {
            let index = PARTS
                .iter()
                .position(|p| *p == name)
                .ok_or_else(|| format!("no figure group {name:?} (known: {})", PARTS.join(", ")))?;
            bits |= 1 << index;
        }
        Ok(if bits == 0 { Parts::ALL } else { Parts(bits) })
    }

    pub fn has(self, name: &str) -> bool {
        PARTS.iter().position(|p| *p == name).is_some_and(|i| self.0 & (1 << i) != 0)
    }
}

/// One measured figure beside its baseline.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub figure: String,
    pub value: f64,
    pub unit: String,
    pub baseline: f64,
    pub baseline_name: String,
    /// For throughput, value / baseline (higher is better); for times, value / baseline
    /// (lower is better). `target` says which.
    pub ratio: f64,
    pub target: String,
    pub met: bool,
    /// Extra facts (rows written, counts).
    pub note: String,
}

/// Runs every figure.
pub async fn run(options: Options) -> Result<Vec<Figure>, String> {
    if options.large {
        return large::figures(options.quick, options.only).await;
    }
    let bench = Sandbox::for_bench().await?;
    let only = options.only;
    let mut figures = Vec::new();
    if only.has("post") {
        eprintln!("bench: post throughput...");
        figures.push(post_throughput(&bench, options).await?);
    }
    if only.has("steer") {
        eprintln!("bench: post-to-steer latency...");
        figures.extend(steer_latency(&bench, options).await?);
    }
    if only.has("mcp") {
        eprintln!("bench: MCP tool calls and the raw HTTP echo...");
        figures.extend(mcp::figures(&bench, options.quick).await?);
    }
    let sizes: &[usize] = if options.quick { &[1_000] } else { &[1_000, 10_000] };
    for &agents in sizes.iter().filter(|_| only.has("broadcast")) {
        eprintln!("bench: broadcast to {agents} agents...");
        figures.push(broadcast(&bench, agents).await?);
    }
    if only.has("budget") {
        eprintln!("bench: the budget check on the post path...");
        figures.push(budget_check(&bench, options).await?);
    }
    if only.has("restart") {
        eprintln!("bench: restart with history...");
        figures.extend(restart::figures(bench, options.quick).await?);
    }
    if only.has("prompt") {
        eprintln!("bench: prompt render...");
        figures.extend(prompt::figures(&canopy_daemon::prompts::catalog(), options.quick)?);
    }
    if only.has("sandbox") {
        eprintln!("bench: session start, confined and unconfined...");
        figures.extend(sandbox::figures(options.quick).await?);
    }
    if only.has("checkout") {
        eprintln!("bench: checkouts...");
        figures.extend(checkout::figures(options.quick).await?);
    }
    Ok(figures)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Durable posts with 64 concurrent posters, one recipient each, against NATS request +
/// SQLite commit + reply.
async fn post_throughput(bench: &Sandbox, options: Options) -> Result<Figure, String> {
    const POSTERS: usize = 64;
    let total = if options.quick { 3_200 } else { 32_000 };
    // Offline recipients: the figure is the durable post path, not 64 harness processes.
    let homes = bench.create_agents("poster-target", POSTERS, true).await?;

    let raw = bench.raw_commit_throughput(POSTERS, total).await?;
    let job = bench.post_job_throughput(POSTERS, total).await?;
    let rate = post_burst(bench, &homes, total).await?;
    let ratio = rate / raw;
    Ok(Figure {
        figure: "post throughput, durable, 64 concurrent posters, one recipient each".into(),
        value: rate,
        unit: "posts/s".into(),
        baseline: raw,
        baseline_name: "raw NATS request + SQLite commit + reply, 64 concurrent (req/s)".into(),
        ratio,
        target: ">= 0.7x baseline".into(),
        met: ratio >= 0.7,
        note: format!(
            "{total} posts; the post's writer job alone, behind the same raw request and reply: {job:.0}/s ({:.2}x of \
             the baseline; the daemon's handling around it takes the rest)",
            job / raw
        ),
    })
}

/// `total` posts from one poster per channel of `homes`, concurrently; posts per second.
async fn post_burst(bench: &Sandbox, homes: &[String], total: usize) -> Result<f64, String> {
    post_burst_timed(bench, homes, total).await.map(|(rate, _)| rate)
}

/// `post_burst`, with every post's round trip, sorted.
///
/// Each poster is a load generator as lean as the raw baseline's: its request is encoded once
/// (the same body every time; no idempotency key, so each is a new message) and each reply is
/// checked to be a success without building the response, so the figure is the daemon's.
pub(crate) async fn post_burst_timed(
    bench: &Sandbox,
    homes: &[String],
    total: usize,
) -> Result<(f64, Vec<Duration>), String> {
    let posters = homes.len();
    let subject = bench.api.subjects.api(method::MessagesPost::METHOD);
    let started = Instant::now();
    let tasks: Vec<_> = (0..posters)
        .map(|i| {
            let (bus, token, subject) = (bench.api.bus.clone(), bench.operator.clone(), subject.clone());
            let request = PostRequest {
                channel: homes[i].clone(),
                topic: "bench".into(),
                body: poster_body(i),
                create_topic: true,
                idempotency_key: None,
                ack_only: false,
                wake: false,
            };
            tokio::spawn(async move {
                let request = Bytes::from(serde_json::to_vec(&request).map_err(|e| e.to_string())?);
                let mut times = Vec::with_capacity(total / posters);
                for _ in 0..total / posters {
                    let at = Instant::now();
                    let reply = bus
                        .request(&subject, Some(&token), request.clone(), Duration::from_secs(10))
                        .await
                        .map_err(|e| format!("posting: {e}"))?;
                    match serde_json::from_slice::<Reply<serde::de::IgnoredAny>>(&reply) {
                        Ok(Reply::Ok(_)) => times.push(at.elapsed()),
                        Ok(Reply::Error(e)) => return Err(format!("posting: {e}")),
                        Err(e) => return Err(format!("posting: the reply did not parse: {e}")),
                    }
                }
                Ok::<_, String>(times)
            })
        })
        .collect();
    let mut times = Vec::with_capacity(total);
    for task in tasks {
        times.extend(task.await.map_err(|e| e.to_string())??);
    }
    let rate = times.len() as f64 / started.elapsed().as_secs_f64();
    times.sort();
    Ok((rate, times))
}

/// The budget check's cost on the post path: the post burst of `post_throughput` while a
/// spent budget holds an agent (so every recipient is looked up in the holds) and a budget
/// covers every recipient, beside the same burst while no budget holds anyone (the check
/// has nothing to look up), alternating rounds in one run; medians of each.
async fn budget_check(bench: &Sandbox, options: Options) -> Result<Figure, String> {
    let total = if options.quick { 3_200 } else { 16_000 };
    let homes = bench.create_agents("budget-target", 64, true).await?;
    for home in &homes {
        let handle = home.strip_prefix("home-").unwrap_or(home).to_owned();
        let request = budget_request(handle, Some(1000.0), None, false);
        let _: AgentsBudgetResponse =
            bench.api.send::<method::AgentsBudget>(&bench.operator, &request).await.map_err(|e| e.to_string())?;
    }
    // Kept live by the stand-in runner's heartbeat for the whole figure: a debug build's
    // bursts outlast `runner_ttl`.
    let (sessions, heartbeat) = bench.fake_sessions_kept(1_000_000).await?;
    let spent = sessions
        .first()
        .map(|s| RunningSession { agent: s.agent.clone(), incarnation: s.incarnation })
        .ok_or("the stand-in runner hosts no session to hold")?;
    let result = budget_rounds(bench, &homes, &spent, total).await;
    heartbeat.abort();
    let (rate, base) = result?;
    let ratio = rate / base;
    Ok(Figure {
        figure: "post throughput with the budget check: a budget on every recipient, a spent one holding an agent"
            .into(),
        value: rate,
        unit: "posts/s".into(),
        baseline: base,
        baseline_name: "the same posts while no budget holds anyone (posts/s)".into(),
        ratio,
        target: ">= 0.95x baseline (the check under 5%)".into(),
        met: ratio >= 0.95,
        note: format!("{BUDGET_ROUNDS} alternating rounds of {total} posts, medians"),
    })
}

/// Mention committed to steer accepted by the harness, against a NATS round trip.
async fn steer_latency(bench: &Sandbox, options: Options) -> Result<Vec<Figure>, String> {
    let samples = if options.quick { 200 } else { 1_000 };
    let raw = bench.raw_round_trips(samples).await?;
    let runner = bench.start_runner().await?;
    bench.create_sleeper("steer-target").await?;
    let mut latencies = Vec::with_capacity(samples);
    let mut round_trips = Vec::with_capacity(samples);
    for n in 0..samples {
        let request = PostRequest {
            channel: "home-steer-target".into(),
            topic: "steers".into(),
            body: format!("@steer-target ping {n}"),
            create_topic: true,
            idempotency_key: None,
            ack_only: false,
            wake: false,
        };
        let started = Instant::now();
        let posted: PostResponse = bench
            .api
            .send::<method::MessagesPost>(&bench.operator, &request)
            .await
            .map_err(|e| format!("posting: {e}"))?;
        round_trips.push(started.elapsed());
        let steered = posted.outcomes.iter().find(|o| o.outcome == Outcome::Steered);
        let Some(latency) = steered.and_then(|o| o.steer_latency_us) else {
            return Err(format!("a mention was not steered: {:?}", posted.outcomes));
        };
        latencies.push(Duration::from_micros(latency));
    }
    runner.shutdown().await;
    latencies.sort();
    round_trips.sort();
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    let (raw50, raw99) = (percentile(&raw, 0.5), percentile(&raw, 0.99));
    let micros = |d: Duration| d.as_secs_f64() * 1e6;
    let p99_ratio = micros(p99) / micros(raw99);
    let note = format!(
        "{samples} steers; the whole post round trip (commit, steer, harness takes it, reply) was p50 {:.0} us, p99 {:.0} us",
        micros(percentile(&round_trips, 0.5)),
        micros(percentile(&round_trips, 0.99))
    );
    Ok(vec![
        Figure {
            figure: "post-to-steer latency p50 (mention committed to its line written to the harness)".into(),
            value: micros(p50),
            unit: "us".into(),
            baseline: micros(raw50),
            baseline_name: "raw NATS request round trip p50 (us)".into(),
            ratio: micros(p50) / micros(raw50),
            target: "(reported; the target is on p99)".into(),
            met: true,
            note: note.clone(),
        },
        Figure {
            figure: "post-to-steer latency p99".into(),
            value: micros(p99),
            unit: "us".into(),
            baseline: micros(raw99),
            baseline_name: "raw NATS request round trip p99 (us)".into(),
            ratio: p99_ratio,
            target: "<= 5x baseline p99".into(),
            met: p99_ratio <= 5.0,
            note,
        },
    ])
}

/// A broadcast to `agents` online agents: commit until every one's runner is notified.
async fn broadcast(bench: &Sandbox, agents: usize) -> Result<Figure, String> {
    let existing = bench.agent_count().await?;
    if existing < agents {
        bench.create_agents("listener", agents - existing, false).await?;
    }
    let online = bench.fake_runner_sync(agents as u32 * 2).await?;
    let raw = bench.raw_publish_burst(online).await?;

    let mut doorbells = bench
        .api
        .bus
        .subscribe(&bench.api.subjects.runner_deliver(&setup::fake_runner()))
        .await
        .map_err(|e| e.to_string())?;
    bench.api.bus.flush().await.map_err(|e| e.to_string())?;
    let before = bench.row_count().await?;
    let request = PostRequest {
        channel: "announcements".into(),
        topic: format!("broadcast to {agents}"),
        body: "all hands".into(),
        create_topic: true,
        idempotency_key: None,
        ack_only: false,
        wake: false,
    };
    let started = Instant::now();
    let posted: PostResponse =
        bench.api.send::<method::MessagesPost>(&bench.operator, &request).await.map_err(|e| format!("posting: {e}"))?;
    let mut notified = 0usize;
    while notified < online {
        let next = tokio::time::timeout(Duration::from_secs(30), doorbells.next())
            .await
            .map_err(|_| format!("only {notified} of {online} agents were notified"))?;
        let Some(doorbell) = next else { break };
        let doorbell: DeliverDoorbell = serde_json::from_slice(&doorbell.payload).map_err(|e| e.to_string())?;
        notified += doorbell.agents.len();
    }
    let elapsed = started.elapsed();
    let rows = bench.row_count().await?.saturating_sub(before);
    let ms = elapsed.as_secs_f64() * 1e3;
    let (target, met) =
        if agents >= 10_000 { ("< 50 ms".to_owned(), ms < 50.0) } else { ("(reported)".to_owned(), true) };
    Ok(Figure {
        figure: format!("broadcast to {agents} agents: commit until every online agent's runner is notified"),
        value: ms,
        unit: "ms".into(),
        baseline: raw.as_secs_f64() * 1e3,
        baseline_name: format!("raw NATS publish of {online} messages, all received (ms)"),
        ratio: ms / (raw.as_secs_f64() * 1e3),
        target,
        met,
        note: format!(
            "{rows} rows added for the broadcast (plus its topic's activity update); {} recipients ({} queued)",
            online, posted.counts.queued
        ),
    })
}

/// Rounds of the budget check figure, each with and without the hold.
const BUDGET_ROUNDS: usize = 3;

/// A daily budget request for `handle`.
fn budget_request(handle: String, usd: Option<f64>, tokens: Option<u64>, clear: bool) -> AgentsBudgetRequest {
    AgentsBudgetRequest { handle, usd, tokens, period: Some("1day".into()), subtree: false, clear }
}

/// Alternating rounds of the post burst without and with `spent` held by its budget;
/// (median with, median without).
async fn budget_rounds(
    bench: &Sandbox,
    homes: &[String],
    spent: &RunningSession,
    total: usize,
) -> Result<(f64, f64), String> {
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..BUDGET_ROUNDS {
        let clear = budget_request(spent.agent.clone(), None, None, true);
        let _: AgentsBudgetResponse =
            bench.api.send::<method::AgentsBudget>(&bench.operator, &clear).await.map_err(|e| e.to_string())?;
        without.push(post_burst(bench, homes, total).await?);
        let hold = budget_request(spent.agent.clone(), None, Some(1), false);
        let _: AgentsBudgetResponse =
            bench.api.send::<method::AgentsBudget>(&bench.operator, &hold).await.map_err(|e| e.to_string())?;
        bench.fake_usage(spent, 10).await?;
        let roster: RosterResponse = bench
            .api
            .send::<method::Roster>(
                &bench.operator,
                &RosterRequest { handles: vec![spent.agent.clone()], ..RosterRequest::default() },
            )
            .await
            .map_err(|e| e.to_string())?;
        if roster.agents.first().map(|a| a.presence) != Some(canopy_core::Presence::PausedBudget) {
            return Err(format!("{} is not held by its spent budget", spent.agent));
        }
        with.push(post_burst(bench, homes, total).await?);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok((median(&mut with), median(&mut without)))
}

/// The table printed by `canopy bench`.
pub fn table(figures: &[Figure]) -> String {
    let mut out = String::new();
    for f in figures {
        let guard = match check::guard(f) {
            Some(guard) if guard.holds(f.ratio) => format!("   guard {guard} ok"),
            Some(guard) => format!("   guard {guard} FAILED"),
            None => String::new(),
        };
        out.push_str(&format!(
            "{}\n  value    {:.1} {}\n  baseline {:.1}  [{}]\n  ratio    {:.2}   target {}   {}{guard}\n  note     {}\n",
            f.figure,
            f.value,
            f.unit,
            f.baseline,
            f.baseline_name,
            f.ratio,
            f.target,
            if f.met { "met" } else { "NOT MET" },
            f.note
        ));
    }
    out
}

/// Payload for the raw baselines: the size of a typical post.
/// What poster `i` of a post burst says, every time.
pub(crate) fn poster_body(i: usize) -> String {
    format!("a message from poster {i}: {}", "x".repeat(200))
}

pub(crate) fn payload(n: usize) -> Bytes {
    Bytes::from(vec![b'x'; n])
}
