//! The `canopy` command line: argument parsing, output, exit codes. Glue only.
//!
//! Every workspace command goes through the daemon's API over NATS (`client`), so the CLI
//! and any other client see the same validation and the same errors. The exceptions are
//! `init`, which creates the store before any daemon can run, and `daemon`/`up`, which run
//! the daemon in this process. Does not touch SQLite or spell subjects.

mod args;
mod client;
mod commands;
mod demo;
mod doctor;
mod output;

use std::process::ExitCode;

use clap::Parser;

pub use args::Cli;

/// Exit code for bad usage or configuration (EX_USAGE).
pub const EXIT_USAGE: u8 = 64;
/// Exit code when the daemon cannot be reached (EX_UNAVAILABLE).
pub const EXIT_UNAVAILABLE: u8 = 69;
/// Exit code when the daemon refused the request.
pub const EXIT_REFUSED: u8 = 1;

/// Parses the arguments, runs the command, and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    // The scripted harness runs as this same binary, before any runtime exists.
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|a| a == canopy_runner::wiring::SCRIPTED_SUBCOMMAND) {
        std::process::exit(canopy_scripted::run::main(args));
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(EXIT_USAGE) } else { ExitCode::SUCCESS };
        }
    };
    output::init_logging(&cli);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(commands::run(cli));
    // Do not wait for blocking tasks (stdin readers) that may never finish.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    /// The scripts shipped in the daemon parse as the scripted harness reads them: the binary
    /// is where both are known.
    #[test]
    fn shipped_scripts_are_valid() {
        for (name, text) in canopy_daemon::builtin::SCRIPTS {
            if let Err(e) = canopy_harness::scripted::check_script(std::path::Path::new(name), text) {
                panic!("config/scripts/{name} is invalid: {e}");
            }
        }
    }
}
