//! `canopy-bench`: runs the benchmark and prints each figure beside its baseline (a table, or
//! JSON with `--json`); with `--check`, exits 1 when a guarded ratio is past its floor.
//!
//! The shipped `canopy` does not link the benchmark; this binary links `canopy` instead (the
//! `canopy_cli` library), because the benchmark runs parts of itself as `canopy`: sessions
//! run the scripted harness as this binary (`harness-scripted ...`), and the restart figure
//! runs the daemon as its own process (`canopy-bench canopy --dir DIR daemon`,
//! `restart::AS_CANOPY`). Owns the flags and the exit codes; the figures are the library's.

use std::ffi::OsString;
use std::process::ExitCode;

use canopy_bus::CallError;
use canopy_cli::exit::{fail, fail_usage};
use clap::Parser;

/// Measure delivery performance beside raw NATS and SQLite baselines, on a temporary
/// workspace (build with --release for meaningful numbers).
#[derive(Debug, Parser)]
#[command(name = "canopy-bench", version)]
struct Args {
    /// Smaller counts (about half a minute).
    #[arg(long)]
    quick: bool,
    /// Only the history figures: post throughput and p99, history_search and
    /// comms_list_messages with 0, 1,000,000 and 10,000,000 messages (minutes; with
    /// --quick, 0 and 100,000).
    #[arg(long)]
    large: bool,
    /// Exit 1 when a guarded figure's ratio to its baseline is past its floor (the
    /// regression guard `.ci/run` runs; floors in docs/benchmarks.md).
    #[arg(long)]
    check: bool,
    /// Only these groups of figures, comma-separated: post, steer, mcp, broadcast, budget,
    /// restart, prompt, sandbox, checkout, issues; with --large: history, posters, agents.
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(canopy_bench::PARTS))]
    only: Vec<String>,
    /// Print machine-readable JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    match args.get(1) {
        Some(first) if first == canopy_runner::wiring::SCRIPTED_SUBCOMMAND => return canopy_cli::main_with(args),
        // The rest are `canopy`'s arguments, with `canopy` as the program's name.
        Some(first) if first == canopy_bench::restart::AS_CANOPY => {
            return canopy_cli::main_with(args.into_iter().skip(1));
        }
        _ => {}
    }
    let parsed = match Args::try_parse_from(args) {
        Ok(parsed) => parsed,
        Err(e) => {
            // A usage message that cannot be written has nowhere else to go; the exit code
            // below still tells the caller.
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(canopy_cli::exit::EXIT_USAGE) } else { ExitCode::SUCCESS };
        }
    };
    // Warnings and errors on stderr (`RUST_LOG` sets the level), as `canopy` logs a command.
    canopy_cli::log_to_stderr("warn", false);
    canopy_cli::block_on(bench(parsed))
}

/// Runs the benchmark and prints each figure beside its baseline; the exit code.
async fn bench(args: Args) -> u8 {
    let only = match canopy_bench::Parts::parse(args.only.iter().map(String::as_str)) {
        Ok(only) => only,
        Err(e) => return fail_usage(args.json, "only", &e),
    };
    let options = canopy_bench::Options { quick: args.quick, large: args.large, only };
    match canopy_bench::run(options).await {
        Ok(figures) => {
            if args.json {
                canopy_cli::json(&figures);
            } else {
                print!("{}", canopy_bench::table(&figures));
            }
            let failed = if args.check { canopy_bench::check::check(&figures) } else { Vec::new() };
            for line in &failed {
                eprintln!("canopy-bench --check: {line}");
            }
            u8::from(!failed.is_empty())
        }
        Err(e) => fail(args.json, &CallError::Unreachable(format!("benchmark failed: {e}"))),
    }
}
