//! The delivery figures: durable post throughput (and the post's writer job alone), the
//! budget check's cost on the post path, post-to-steer latency, and a broadcast to thousands
//! of online agents, each beside its raw baseline (`baseline.rs`) measured in the same run.
//!
//! Drives the daemon only through its API, as a client would; the stand-in runner and the
//! in-process runner are `setup.rs`'s.

use std::time::{Duration, Instant};

use bytes::Bytes;
use canopy_proto::api::*;
use canopy_proto::method;
use canopy_proto::{ApiMethod, Reply};
use futures_util::StreamExt;

use crate::baseline::poster_body;
use crate::figure::{Figure, Options, percentile};
use crate::setup::{Bench, fake_runner};

/// Durable posts with 64 concurrent posters, one recipient each, against NATS request +
/// SQLite commit + reply.
pub async fn post_throughput(bench: &Bench, options: Options) -> Result<Figure, String> {
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
async fn post_burst(bench: &Bench, homes: &[String], total: usize) -> Result<f64, String> {
    post_burst_timed(bench, homes, total).await.map(|(rate, _)| rate)
}

/// `post_burst`, with every post's round trip, sorted.
///
/// Each poster is a load generator as lean as the raw baseline's: its request is encoded once
/// (the same body every time; no idempotency key, so each is a new message) and each reply is
/// checked to be a success without building the response, so the figure is the daemon's.
pub(crate) async fn post_burst_timed(
    bench: &Bench,
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
pub async fn budget_check(bench: &Bench, options: Options) -> Result<Figure, String> {
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
pub async fn steer_latency(bench: &Bench, options: Options) -> Result<Vec<Figure>, String> {
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
pub async fn broadcast(bench: &Bench, agents: usize) -> Result<Figure, String> {
    let existing = bench.agent_count().await?;
    if existing < agents {
        bench.create_agents("listener", agents - existing, false).await?;
    }
    let online = bench.fake_runner_sync(agents as u32 * 2).await?;
    let raw = bench.raw_publish_burst(online).await?;

    let mut doorbells =
        bench.api.bus.subscribe(&bench.api.subjects.runner_deliver(&fake_runner())).await.map_err(|e| e.to_string())?;
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
    bench: &Bench,
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
