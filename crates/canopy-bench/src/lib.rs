//! The benchmark (`canopy-bench`, its own binary; the shipped `canopy` does not link it): the
//! figures of DESIGN section 11 (delivery and the budget check in `delivery.rs`, restart and
//! memory in `restart.rs`, prompt render in `prompt.rs`, session start confined vs unconfined
//! in `sandbox.rs`, checkouts in `checkout.rs`, the issue ledger in `issues.rs`, the conflict scan and merge queue in `merges.rs`, the MCP tool call in `mcp.rs`, the history
//! figures in `large.rs`), each printed beside its raw baseline (`baseline.rs`) measured in
//! the same run on the same machine (these machines are noisy; ratios hold, absolute times
//! do not).
//!
//! Everything is real: a private `nats-server`, the daemon on a temporary data directory
//! (`canopy_cli::sandbox`, which `canopy demo` plays in too), SQLite files, and for steers a
//! runner with a scripted harness session. The baselines use the same server and the same
//! store writer with nothing of Canopy around them. Does not touch any existing workspace.
//! This file only runs the groups asked for and prints the table; `check.rs` holds the
//! regression guard's floors.

pub mod baseline;
pub mod check;
pub mod checkout;
pub mod delivery;
pub mod figure;
pub mod issues;
pub mod large;
pub mod mcp;
pub mod merges;
pub mod prompt;
pub mod restart;
pub mod sandbox;
pub mod setup;

pub use figure::{Figure, Options, PARTS, Parts};
pub use setup::Bench;

/// Runs every figure `options` asks for.
pub async fn run(options: Options) -> Result<Vec<Figure>, String> {
    if options.large {
        return large::figures(options.quick, options.only).await;
    }
    let bench = Bench::start().await?;
    let only = options.only;
    let mut figures = Vec::new();
    if only.has("post") {
        eprintln!("bench: post throughput...");
        figures.push(delivery::post_throughput(&bench, options).await?);
    }
    if only.has("steer") {
        eprintln!("bench: post-to-steer latency...");
        figures.extend(delivery::steer_latency(&bench, options).await?);
    }
    if only.has("mcp") {
        eprintln!("bench: MCP tool calls and the raw HTTP echo...");
        figures.extend(mcp::figures(&bench, options.quick).await?);
    }
    let sizes: &[usize] = if options.quick { &[1_000] } else { &[1_000, 10_000] };
    for &agents in sizes.iter().filter(|_| only.has("broadcast")) {
        eprintln!("bench: broadcast to {agents} agents...");
        figures.push(delivery::broadcast(&bench, agents).await?);
    }
    if only.has("budget") {
        eprintln!("bench: the budget check on the post path...");
        figures.push(delivery::budget_check(&bench, options).await?);
    }
    if only.has("restart") {
        eprintln!("bench: restart with history...");
        figures.extend(restart::figures(bench, options.quick).await?);
    } else {
        // The figures below need no daemon: stopped here as the restart figure stops it.
        bench.stop().await;
    }
    if only.has("prompt") {
        eprintln!("bench: prompt render...");
        figures.extend(prompt::figures(&canopy_daemon::bundle::catalog(), options.quick)?);
    }
    if only.has("sandbox") {
        eprintln!("bench: session start, confined and unconfined...");
        figures.extend(sandbox::figures(options.quick).await?);
    }
    if only.has("checkout") {
        eprintln!("bench: checkouts...");
        figures.extend(checkout::figures(options.quick).await?);
    }
    if only.has("issues") {
        eprintln!("bench: the issue ledger...");
        figures.extend(issues::figures(options.quick).await?);
    }
    if only.has("merges") {
        eprintln!("bench: the conflict scan and the merge queue...");
        figures.extend(merges::figures(options.quick).await?);
    }
    Ok(figures)
}

/// The table `canopy-bench` prints.
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
