//! The restart figure: with the benchmark's agents (10,000 and more after the broadcast
//! figures) and a million messages of history, how long the daemon takes from process start
//! until it answers, and how much memory it holds once it has served a roster of every agent.
//!
//! The history is written straight into the stopped workspace's database (every cursor at
//! the end, as in a workspace whose history has been delivered); then `canopy daemon` runs as
//! its own process (this binary running as `canopy`, `AS_CANOPY`) against the same
//! `nats-server`, so its resident memory is its own. DESIGN gives no baseline; the one shown
//! is opening the database and counting its messages in this process.

use std::time::{Duration, Instant};

use canopy_bus::{ApiClient, Bus};
use canopy_cli::sandbox::Stopped;
use canopy_proto::Subjects;
use canopy_proto::api::*;
use canopy_proto::method;

use crate::figure::Figure;
use crate::setup::Bench;

/// The first argument that makes the benchmark's binary run as `canopy` with the rest
/// (`main.rs`): the restarted daemon is `canopy-bench canopy --dir DIR daemon`, the same
/// code as the shipped binary's, in a process of its own.
pub const AS_CANOPY: &str = "canopy";

/// Resident memory of a process, in MiB (Linux `/proc`).
fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Stops `bench`'s daemon, fills its history, restarts it as a process and measures it.
pub async fn figures(bench: Bench, quick: bool) -> Result<Vec<Figure>, String> {
    let messages_wanted: usize = if quick { 100_000 } else { 1_000_000 };
    let agents = bench.agent_count().await?;
    let stopped = bench.stop_daemon().await;
    let db = stopped.data.db();
    let channels = agents.clamp(1, 1_000);
    let per_channel = messages_wanted.div_ceil(channels);
    let fill = {
        let db = db.clone();
        tokio::task::spawn_blocking(move || canopy_store::bench::fill_history(&db, channels, per_channel))
    };
    let written = fill.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;

    // Baseline: open the database and count its messages, in this process.
    let started = Instant::now();
    let count = {
        let db = db.clone();
        tokio::task::spawn_blocking(move || {
            let store = canopy_store::Store::open(&db, 1).map_err(|e| e.to_string())?;
            let rt = tokio::runtime::Handle::current();
            let n = rt.block_on(canopy_store::bench::row_count(&store)).map_err(|e| e.to_string());
            rt.block_on(store.close());
            n
        })
    };
    count.await.map_err(|e| e.to_string())??;
    let baseline = started.elapsed();

    let restarted = restart_process(&stopped).await?;
    stopped.nats.shutdown().await;
    let (ready, rss_ready, rss) = (restarted.ready, restarted.rss_ready, restarted.rss);

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let note = format!(
        "{} agents, {written} messages of history in {channels} home channels; RSS {rss_ready:.0} MiB when ready",
        restarted.agents
    );
    let targets = if quick { " (quick: fewer messages)" } else { "" };
    Ok(vec![
        Figure {
            figure: format!("daemon restart to ready (process start until it answers){targets}"),
            value: ms(ready),
            unit: "ms".into(),
            baseline: ms(baseline),
            baseline_name: "opening the database and counting its rows, in process (ms)".into(),
            ratio: ms(ready) / ms(baseline).max(0.001),
            target: "< 2 s".into(),
            met: ready < Duration::from_secs(2),
            note: note.clone(),
        },
        Figure {
            figure: format!("daemon memory after ready and a full roster{targets}"),
            value: rss,
            unit: "MiB RSS".into(),
            baseline: 0.0,
            baseline_name: "none (DESIGN gives the target only)".into(),
            ratio: 0.0,
            target: "< 150 MB".into(),
            met: rss * 1.048_576 < 150.0,
            note,
        },
    ])
}

/// What a restart measured.
pub(crate) struct Restarted {
    /// From process start until it answered `whoami`.
    pub ready: Duration,
    pub rss_ready: f64,
    /// After serving the roster and the agent list.
    pub rss: f64,
    pub agents: usize,
    /// The roster's round trip, the first after ready.
    pub roster: Duration,
}

/// Runs `canopy daemon` as its own process on the stopped workspace until it answers, serves
/// the whole roster and agent list, measures it and stops it.
pub(crate) async fn restart_process(stopped: &Stopped) -> Result<Restarted, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this binary: {e}"))?;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(&exe)
        .arg(AS_CANOPY)
        .arg("--dir")
        .arg(stopped.data.root())
        .args(["daemon", "--nats-url", stopped.nats.url()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", exe.display()))?;
    let pid = child.id().ok_or("the daemon exited at once")?;
    // The daemon answers only on its workspace's inboxes; the workspace id is in any credential.
    let credential: canopy_config::RunnerCredential =
        canopy_config::credentials::read(&stopped.data.runner_credential(canopy_config::EMBEDDED_RUNNER))
            .map_err(|e| e.to_string())?;
    let inbox = Subjects::new(&credential.workspace_id).inbox(canopy_proto::Party::Operator);
    let login = canopy_bus::Login { read: None, inbox: Some(inbox) };
    let bus =
        Bus::connect(stopped.nats.url(), &login, "canopy-bench-restart", false).await.map_err(|e| e.to_string())?;
    let deadline = started + Duration::from_secs(120);
    let api = loop {
        if let Ok(info) = canopy_config::read_connection_info(&stopped.data) {
            let api = ApiClient::new(bus.clone(), Subjects::new(&info.workspace_id), Duration::from_secs(30));
            if api.send::<method::Whoami>(&stopped.operator, &WhoamiRequest {}).await.is_ok() {
                break api;
            }
        }
        if Instant::now() > deadline {
            return Err("the restarted daemon did not answer within 120 s".into());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the restarted daemon exited: {status}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let ready = started.elapsed();
    let rss_ready = rss_mib(pid).unwrap_or(0.0);
    // Serve the whole roster and agent list once, as an operator's first look would.
    let asked = Instant::now();
    let roster = api.roster_all(&stopped.operator, RosterRequest::default()).await.map_err(|e| e.to_string())?;
    let roster_took = asked.elapsed();
    let _: AgentsListResponse = api.agents_all(&stopped.operator).await.map_err(|e| e.to_string())?;
    let rss = rss_mib(pid).unwrap_or(0.0).max(rss_ready);
    // Cleanup, not a figure: a daemon that exited already refuses the kill, and a wait that
    // fails leaves nothing running (`kill_on_drop`).
    let _ = child.start_kill();
    let _ = child.wait().await;
    Ok(Restarted { ready, rss_ready, rss, agents: roster.agents.len(), roster: roster_took })
}
