//! The `canopy` binary: everything lives in the library so tests can build the same entry.

fn main() -> std::process::ExitCode {
    canopy_cli::main()
}
