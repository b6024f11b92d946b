//! The ledger's figures (issue 34): `issues_list` p99 for one agent's own page and for a
//! subtree filter with 100,000 issues over 1,000 agents, called as an agent with a live
//! session over NATS beside the cheapest call on the same path (`whoami`) in the same run;
//! and the cost of attributing a turn's usage to its issue on the turn path, the writer's
//! usage write with the attribution beside the same write without it, interleaved rounds.
//!
//! The ledger is written straight into the stopped workspace (`canopy_store::bench`), the
//! agents through the store operation behind `agents.create`. Measures only these figures.

use std::time::Instant;

use canopy_proto::api::*;
use canopy_proto::method;

use crate::figure::{Figure, p99_of};
use crate::setup::Bench;

/// Agents in the tree and issues each owns: 1,000 x 100 (and the lead's 100).
const AGENTS: usize = 1_000;
const PER_AGENT: usize = 100;

/// The `issues_list` figures and the attribution figure.
pub async fn figures(quick: bool) -> Result<Vec<Figure>, String> {
    let bench = Bench::start().await?;
    let lead = bench.create_agents("lead", 1, false).await?.remove(0).trim_start_matches("home-").to_owned();
    let stopped = bench.stop_daemon().await;
    let db = stopped.data.db();
    eprintln!("bench: {AGENTS} agents and {} issues...", (AGENTS + 1) * PER_AGENT);
    canopy_store::bench::fill_agents(&db, "agent", AGENTS).await.map_err(|e| e.to_string())?;
    let (fill_db, fill_lead) = (db.clone(), lead.clone());
    let issues =
        tokio::task::spawn_blocking(move || canopy_store::bench::fill_issues(&fill_db, "agent", &fill_lead, PER_AGENT))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    let bench = Bench::resume(stopped).await?;
    let (sessions, heartbeat) = bench.fake_sessions_kept(100_000).await?;
    let Some(token) = sessions.iter().find(|s| s.agent == lead).map(|s| s.token.clone()) else {
        heartbeat.abort();
        bench.stop().await;
        return Err(format!("{lead} got no session"));
    };
    let samples = if quick { 200 } else { 1_000 };
    let api = bench.api.clone();
    let list = |owner: Option<&'static str>, subtree: Option<&'static str>| {
        let (api, token) = (api.clone(), token.clone());
        p99_of(samples, move || {
            let (api, token) = (api.clone(), token.clone());
            async move {
                let request = IssuesListRequest {
                    owner: owner.map(str::to_owned),
                    subtree: subtree.map(str::to_owned),
                    ..IssuesListRequest::default()
                };
                let page = api.send::<method::IssuesList>(&token, &request).await.map_err(|e| e.to_string())?;
                match page.issues.len() {
                    50 => Ok(()),
                    n => Err(format!("issues_list gave {n} issues, not a page of 50")),
                }
            }
        })
    };
    let own = list(None, None).await;
    let subtree = list(Some("subtree"), None).await;
    let whole = list(None, Some("supervisor")).await;
    let whoami = p99_of(samples, || {
        let (api, token) = (api.clone(), token.clone());
        async move { api.send::<method::Whoami>(&token, &WhoamiRequest {}).await.map(drop).map_err(|e| e.to_string()) }
    })
    .await;
    heartbeat.abort();
    let attribution = attribution(&bench, quick).await;
    bench.stop().await;
    let (own, subtree, whoami) = (own?, subtree?, whoami?);
    let mut figures = Vec::new();
    for (what, value) in [
        ("one agent's own page", own),
        ("a subtree filter (the lead and its 111 descendants: 11,200 issues)", subtree),
        ("the Supervisor's subtree (every agent: 100,100 issues)", whole?),
    ] {
        figures.push(Figure {
            figure: format!("issues_list p99, {what}, with {issues} issues and {AGENTS} agents"),
            value,
            unit: "us".into(),
            baseline: whoami,
            baseline_name: "whoami p99 over the same path, same session (us)".into(),
            ratio: value / whoami.max(1.0),
            target: "< 10 ms".into(),
            met: value < 10_000.0,
            note: format!("pages of 50, as an agent with a live session, over NATS; {samples} calls"),
        });
    }
    figures.push(attribution?);
    Ok(figures)
}

/// A turn's usage write with its issue attributed, beside the same write without: rounds of
/// each in turn on one store, a Manager owning 100 issues with one `in_progress`.
async fn attribution(bench: &Bench, quick: bool) -> Result<Figure, String> {
    let path = bench.scratch().join("usage.db");
    let store = canopy_store::Store::open(&path, 4096).map_err(|e| e.to_string())?;
    let measured = async {
        let (_, _) = canopy_store::bench::prepare_posts(&store, 1).await.map_err(|e| e.to_string())?;
        canopy_store::bench::own_issues(&store, "floor-0", 100).await.map_err(|e| e.to_string())?;
        let (rounds, per_round) = if quick { (6, 500) } else { (10, 2_000) };
        let (mut with, mut without) = (0.0, 0.0);
        for round in 0..rounds {
            for attributed in [round % 2 == 0, round % 2 != 0] {
                let at = Instant::now();
                canopy_store::bench::usage_writes(&store, "floor-0", per_round, attributed)
                    .await
                    .map_err(|e| e.to_string())?;
                let rate = per_round as f64 / at.elapsed().as_secs_f64();
                if attributed { with += rate } else { without += rate }
            }
        }
        Ok::<_, String>((with / rounds as f64, without / rounds as f64, rounds * per_round))
    }
    .await;
    store.close().await;
    let (with, without, writes) = measured?;
    Ok(Figure {
        figure: "usage writes on the turn path, attributed to the Manager's in-progress issue".into(),
        value: with,
        unit: "writes/s".into(),
        baseline: without,
        baseline_name: "the same write naming no issue, interleaved rounds (writes/s)".into(),
        ratio: with / without,
        target: ">= 0.95x baseline (attribution within 5%)".into(),
        met: with >= 0.95 * without,
        note: format!("{writes} writes each way, one write per turn through the store's writer"),
    })
}
