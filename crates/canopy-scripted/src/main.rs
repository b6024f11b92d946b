//! The `canopy-scripted` binary: the scripted harness on its own (`canopy harness-scripted`
//! runs the same code). Behaviour lives in `canopy_scripted::run`.

fn main() {
    std::process::exit(canopy_scripted::run::main(std::env::args_os().skip(1)));
}
