//! `canopy-bench --large`: whether the post path and the reads an agent makes stay flat as
//! history grows. For 0, 1,000,000 and 10,000,000 messages of history (spread over the
//! posters' and the reader's home channels, written straight into the stopped workspace,
//! every cursor at the end), a fresh workspace measures: post throughput and p99 with 64
//! posters beside the raw commit baseline of the same run, and the p99 of `history_search`
//! and `comms_list_messages` pages read as an agent with a live session. Each size's figures
//! are then compared with the empty workspace's. Then post throughput and p99 by number of
//! posters (1, 16, 64, 256), each beside the raw baseline at the same concurrency; last,
//! restart, memory and the roster with 1,000, 10,000 and 100,000 agents.

use canopy_proto::api::*;
use canopy_proto::method;

use crate::delivery::post_burst_timed;
use crate::figure::{Figure, Parts, p99_of, percentile};
use crate::setup::Bench;

const POSTERS: usize = 64;

/// What one history size measured.
struct Measured {
    messages: u64,
    rate: f64,
    raw: f64,
    post_p99_us: f64,
    found_p99_us: f64,
    missed_p99_us: f64,
    read_p99_us: f64,
}

async fn measure(history: usize, quick: bool) -> Result<Measured, String> {
    let mut bench = Bench::start().await?;
    let homes = bench.create_agents("poster-target", POSTERS, true).await?;
    let reader_home = bench.create_agents("reader", 1, false).await?.remove(0);
    let reader = reader_home.trim_start_matches("home-").to_owned();
    let mut messages = 0;
    if history > 0 {
        // Every agent has a home channel: the history is spread over all of them.
        let channels = bench.agent_count().await?;
        let stopped = bench.stop_daemon().await;
        let db = stopped.data.db();
        let per_channel = history.div_ceil(channels);
        eprintln!("bench: writing {history} messages of history...");
        messages = tokio::task::spawn_blocking(move || canopy_store::bench::fill_history(&db, channels, per_channel))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        bench = Bench::resume(stopped).await?;
    }
    let total = if quick { 3_200 } else { 32_000 };
    let raw = bench.raw_commit_throughput(POSTERS, total).await?;
    let (rate, times) = post_burst_timed(&bench, &homes, total).await?;
    let post_p99_us = percentile(&times, 0.99).as_secs_f64() * 1e6;

    let (sessions, heartbeat) = bench.fake_sessions_kept(100_000).await?;
    let token = sessions.iter().find(|s| s.agent == reader).map(|s| s.token.clone());
    let Some(token) = token else {
        heartbeat.abort();
        return Err(format!("{reader} got no session"));
    };
    let samples = if quick { 100 } else { 500 };
    let api = bench.api.clone();
    let search = |query: &'static str| {
        let (api, token) = (api.clone(), token.clone());
        p99_of(samples, move || {
            let (api, token) = (api.clone(), token.clone());
            async move {
                let request = HistorySearchRequest {
                    query: Some(query.into()),
                    before: None,
                    limit: Some(10),
                    include_tool_events: false,
                };
                api.send::<method::HistorySearch>(&token, &request).await.map(|_| ()).map_err(|e| e.to_string())
            }
        })
    };
    // The history written for the reader is its own posts of `x`s: one query finds a page at
    // once, the other walks all of the reader's own history (and only that).
    let found = search("xxx").await;
    let missed = search("no such words").await;
    let read = p99_of(samples, || {
        let (api, token, channel) = (api.clone(), token.clone(), reader_home.clone());
        async move {
            let request = ReadRequest {
                channel,
                topic: None,
                after: canopy_core::Seq::default(),
                limit: Some(50),
                unread: false,
                newest: true,
            };
            api.send::<method::MessagesRead>(&token, &request).await.map(|_| ()).map_err(|e| e.to_string())
        }
    })
    .await;
    heartbeat.abort();
    bench.stop().await;
    Ok(Measured { messages, rate, raw, post_p99_us, found_p99_us: found?, missed_p99_us: missed?, read_p99_us: read? })
}

/// Post throughput and p99 with 1, 16, 64 and 256 posters (each its own channel with one
/// offline recipient) in an empty workspace, each beside the raw commit baseline at the same
/// concurrency in the same run.
async fn posters(quick: bool) -> Result<Vec<Figure>, String> {
    let bench = Bench::start().await?;
    let homes = bench.create_agents("poster-target", 256, true).await?;
    let per_poster = if quick { 25 } else { 250 };
    let mut figures = Vec::new();
    for n in [1, 16, 64, 256] {
        let total = n * per_poster;
        let raw = bench.raw_commit_throughput(n, total).await?;
        let (rate, times) = post_burst_timed(&bench, &homes[..n], total).await?;
        figures.push(Figure {
            figure: format!("post throughput, {n} concurrent poster{}", if n == 1 { "" } else { "s" }),
            value: rate,
            unit: "posts/s".into(),
            baseline: raw,
            baseline_name: format!("raw NATS request + SQLite commit + reply, {n} concurrent (req/s)"),
            ratio: rate / raw,
            target: "(reported: the scaling table)".into(),
            met: true,
            note: format!(
                "{total} posts; p50 {:.0} us, p99 {:.0} us",
                percentile(&times, 0.5).as_secs_f64() * 1e6,
                percentile(&times, 0.99).as_secs_f64() * 1e6
            ),
        });
    }
    bench.stop().await;
    Ok(figures)
}

/// The history figures: each size against the empty workspace, and the reads' p99 targets;
/// then throughput by number of posters.
pub async fn figures(quick: bool, only: Parts) -> Result<Vec<Figure>, String> {
    let sizes: &[usize] = if quick { &[0, 100_000] } else { &[0, 1_000_000, 10_000_000] };
    let mut measured = Vec::new();
    let mut figures = Vec::new();
    for &size in sizes.iter().filter(|_| only.has("history")) {
        eprintln!("bench: history of {size} messages...");
        measured.push(measure(size, quick).await?);
    }
    for m in &measured {
        let empty = &measured[0];
        let label = format!("{} messages of history", m.messages);
        figures.push(Figure {
            figure: format!("post throughput with {label} (relative to its raw commit baseline)"),
            value: m.rate / m.raw,
            unit: "x raw".into(),
            baseline: empty.rate / empty.raw,
            baseline_name: "the same ratio in an empty workspace".into(),
            ratio: (m.rate / m.raw) / (empty.rate / empty.raw),
            target: ">= 0.9x baseline (flat as history grows)".into(),
            met: (m.rate / m.raw) >= 0.9 * (empty.rate / empty.raw),
            note: format!("{:.0} posts/s against {:.0} raw commits/s in the same run", m.rate, m.raw),
        });
        figures.push(Figure {
            figure: format!("post p99 with {label}"),
            value: m.post_p99_us,
            unit: "us".into(),
            baseline: empty.post_p99_us,
            baseline_name: "post p99 in an empty workspace (us)".into(),
            ratio: m.post_p99_us / empty.post_p99_us,
            target: "<= 1.11x baseline (0.9x the speed)".into(),
            met: m.post_p99_us <= empty.post_p99_us / 0.9,
            note: format!("{POSTERS} posters"),
        });
        for (what, p99, base) in [
            ("history_search page (10, a query its newest messages match)", m.found_p99_us, empty.found_p99_us),
            (
                "history_search page (a query nothing matches: all of its own history)",
                m.missed_p99_us,
                empty.missed_p99_us,
            ),
            ("comms_list_messages page (newest 50)", m.read_p99_us, empty.read_p99_us),
        ] {
            figures.push(Figure {
                figure: format!("{what} p99 with {label}"),
                value: p99,
                unit: "us".into(),
                baseline: base,
                baseline_name: "the same read in an empty workspace, p99 (us)".into(),
                ratio: p99 / base,
                target: "< 10 ms".into(),
                met: p99 < 10_000.0,
                note: "as an agent with a live session, over NATS".into(),
            });
        }
    }
    if only.has("posters") {
        eprintln!("bench: posters 1, 16, 64, 256...");
        figures.extend(posters(quick).await?);
    }
    if only.has("agents") {
        figures.extend(agents(quick).await?);
    }
    Ok(figures)
}

/// Restart, memory and the roster with 1,000, 10,000 and 100,000 agents (with `quick`, the
/// first two): each a fresh workspace whose agents are added while it is stopped, through the
/// store operation behind `agents.create`; then `canopy daemon` runs as its own process.
/// Each size beside the smallest.
async fn agents(quick: bool) -> Result<Vec<Figure>, String> {
    let sizes: &[usize] = if quick { &[1_000, 10_000] } else { &[1_000, 10_000, 100_000] };
    let mut measured = Vec::new();
    for &size in sizes {
        eprintln!("bench: {size} agents...");
        let stopped = Bench::start().await?.stop_daemon().await;
        let db = stopped.data.db();
        canopy_store::bench::fill_agents(&db, "agent", size).await.map_err(|e| e.to_string())?;
        let restarted = crate::restart::restart_process(&stopped).await?;
        stopped.nats.shutdown().await;
        measured.push((size, restarted));
    }
    let (base_size, base) = &measured[0];
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let mut figures = Vec::new();
    for (size, r) in &measured {
        let work = *size as f64 / *base_size as f64;
        let note = format!("{} agents in the roster; {work:.0}x the agents of the baseline", r.agents);
        for (what, value, baseline, unit) in [
            ("daemon restart to ready", ms(r.ready), ms(base.ready), "ms"),
            ("daemon memory after ready and a full roster", r.rss, base.rss, "MiB RSS"),
            ("the full roster, first after ready", ms(r.roster), ms(base.roster), "ms"),
        ] {
            figures.push(Figure {
                figure: format!("{what} with {size} agents"),
                value,
                unit: unit.into(),
                baseline,
                baseline_name: format!("the same with {base_size} agents"),
                ratio: value / baseline.max(0.001),
                target: "(reported: the scaling table)".into(),
                met: true,
                note: note.clone(),
            });
        }
    }
    Ok(figures)
}
