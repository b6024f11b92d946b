//! The `canopy` binary under another name, so the e2e tests can run it (see Cargo.toml).

fn main() -> std::process::ExitCode {
    canopy_cli::main()
}
