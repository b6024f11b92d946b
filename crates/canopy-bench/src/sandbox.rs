//! The session-start figures: how long a scripted session takes from launch until its harness
//! says it is ready, confined as by default (`[sandbox] mode = "required"`, `network = "proxy"`:
//! bubblewrap with a network namespace of its own, its relays and limits, and Landlock) beside
//! the same launch unconfined, and beside the same launch confined on the machine's network
//! (`network = "host"`, how sessions started before they had a network of their own), all
//! interleaved in the same run.
//!
//! Owns only the timing loop; the launch is `canopy_harness::Session::launch` exactly as the
//! runner calls it (the scripted harness is this binary's `harness-scripted`). No daemon and
//! no MCP endpoint are needed: the scripted harness is ready before its first tool call.

use std::time::{Duration, Instant};

use canopy_harness::{HarnessKind, LaunchSpec, Network, Prompt, SandboxSettings, Session};

use crate::figure::{Figure, percentile};

/// Session start confined vs unconfined, and with a network of its own vs the host's.
pub async fn figures(quick: bool) -> Result<Vec<Figure>, String> {
    let samples = if quick { 10 } else { 40 };
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let program = std::env::current_exe().map_err(|e| format!("finding this binary: {e}"))?;
    let mut confined = Vec::with_capacity(samples);
    let mut unconfined = Vec::with_capacity(samples);
    let mut host = Vec::with_capacity(samples);
    for n in 0..samples {
        let data = dir.path().join("data");
        let on_host = SandboxSettings { network: Network::Host, ..SandboxSettings::required(&data) };
        for (sandbox, times, name) in [
            (SandboxSettings::required(&data), &mut confined, "proxy"),
            (on_host, &mut host, "host"),
            (SandboxSettings::off(&data), &mut unconfined, "off"),
        ] {
            let agent_dir = data.join("sessions").join(format!("a{n}-{name}"));
            let spec = LaunchSpec {
                kind: HarnessKind::Scripted,
                program: program.clone(),
                program_args: vec![canopy_runner::wiring::SCRIPTED_SUBCOMMAND.to_owned()],
                session_dir: agent_dir.join("1"),
                agent_dir: Some(agent_dir.clone()),
                cwd: agent_dir.join("work"),
                builtin_tools: Vec::new(),
                prompt: Prompt::replace("bench".into()),
                mcp_url: "http://127.0.0.1:9/mcp".into(),
                mcp_token: "cns_bench".into(),
                env: Vec::new(),
                model: None,
                provider: None,
                script: Some(("bench.toml".into(), String::new())),
                max_line_bytes: 1 << 20,
                ready_timeout: Duration::from_secs(30),
                sandbox,
                repo_mirror: None,
                cwd_read_only: false,
                subagents: Vec::new(),
            };
            let started = Instant::now();
            let (session, _events) = Session::launch(spec, 16).await.map_err(|e| format!("starting a session: {e}"))?;
            times.push(started.elapsed());
            session.shutdown(Duration::from_secs(2)).await;
        }
    }
    confined.sort();
    unconfined.sort();
    host.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (c50, u50, h50) = (percentile(&confined, 0.5), percentile(&unconfined, 0.5), percentile(&host, 0.5));
    let own_network = Figure {
        figure: "session start with a network of its own (namespace, relays, proxy, limits) p50".into(),
        value: ms(c50),
        unit: "ms".into(),
        baseline: ms(h50),
        baseline_name: "the same session start confined on the machine's network (network = \"host\") p50 (ms)".into(),
        ratio: ms(c50) / ms(h50),
        target: "(reported)".into(),
        met: true,
        note: format!(
            "{samples} starts each, interleaved; p99 {:.1} ms vs {:.1} ms",
            ms(percentile(&confined, 0.99)),
            ms(percentile(&host, 0.99))
        ),
    };
    Ok(vec![
        Figure {
            figure: "session start, confined (bubblewrap with its own network + Landlock), launch to ready p50".into(),
            value: ms(c50),
            unit: "ms".into(),
            baseline: ms(u50),
            baseline_name: "the same session start unconfined p50 (ms)".into(),
            ratio: ms(c50) / ms(u50),
            target: "(reported)".into(),
            met: true,
            note: format!(
                "{samples} starts each, interleaved; p99 confined {:.1} ms, unconfined {:.1} ms",
                ms(percentile(&confined, 0.99)),
                ms(percentile(&unconfined, 0.99))
            ),
        },
        own_network,
    ])
}
