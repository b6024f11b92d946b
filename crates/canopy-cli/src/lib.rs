//! The `canopy` command line: argument parsing, output, exit codes. Glue only.
//!
//! Every workspace command goes through the daemon's API over NATS (`client`), so the CLI
//! and any other client see the same validation and the same errors. The exceptions are
//! `init`, which creates the store before any daemon can run, and `daemon`/`up`, which run
//! the daemon in this process. Does not touch SQLite or spell subjects.
//!
//! `commands/` holds one file per area (the daemon's areas), `exit` the exit codes and error
//! printing every command shares. `sandbox` (public) is the temporary workspace `canopy demo`
//! plays in; the benchmark, its own binary (`canopy-bench`), builds on it, and this crate
//! does not link the benchmark. Everything printed goes through `writer`, the one place a
//! failed write is handled; the lints below keep it so.
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod args;
mod charts;
mod client;
mod commands;
mod completions;
mod demo;
mod doctor;
pub mod exit;
mod import;
mod output;
pub mod sandbox;
mod top;
mod writer;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

use crate::writer::errln;
pub use args::{Cli, cli_commands};
pub use output::{json, log_to_stderr};

/// Parses the process's arguments, runs the command, and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    main_with(std::env::args_os())
}

/// `main` with these arguments (the first is the program's name): for a binary that runs
/// `canopy` as one of its modes, as the benchmark runs its restarted daemon and its sessions'
/// scripted harness.
pub fn main_with(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args: Vec<OsString> = args.into_iter().collect();
    // The scripted harness runs as this same binary, before any runtime exists.
    if args.get(1).is_some_and(|a| a == canopy_runner::wiring::SCRIPTED_SUBCOMMAND) {
        std::process::exit(canopy_scripted::run::main(args.into_iter().skip(2)));
    }
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // Help and the version go to stdout like any output; a usage error to stderr.
            if e.use_stderr() {
                writer::write_err(format_args!("{}", e.render()));
                return ExitCode::from(exit::EXIT_USAGE);
            }
            writer::write_out(format_args!("{}", e.render()));
            return ExitCode::from(writer::exit_code(0));
        }
    };
    output::init_logging(&cli);
    block_on(commands::run(cli))
}

/// Runs a command on a fresh runtime and makes its code the process's exit code; blocking
/// tasks (stdin readers) that may never finish are not waited for.
pub fn block_on(command: impl std::future::Future<Output = u8>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            errln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // A closed or full stdout drops the command at its next await, so what it started ends.
    let code = runtime.block_on(async {
        tokio::select! {
            code = command => code,
            () = writer::stopped() => 0,
        }
    });
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    ExitCode::from(writer::exit_code(code))
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

    use canopy_daemon::bundle::{BundleSource, check};

    /// A copy of the shipped bundle in a temporary directory.
    fn shipped_copy() -> tempfile::TempDir {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for sub in ["config/prompts", "config/roles", "agents", "skills", "rules"] {
            copy(&root.join(sub), &dir.path().join(sub));
        }
        dir
    }

    fn copy(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("{e}"));
        for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display())).flatten() {
            let path = entry.path();
            if path.is_dir() {
                copy(&path, &to.join(entry.file_name()));
            } else {
                std::fs::copy(&path, to.join(entry.file_name())).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }

    fn problems(dir: &std::path::Path) -> Vec<String> {
        match check(&BundleSource::Dir(dir.to_owned()), crate::args::cli_commands()) {
            Ok(_) => Vec::new(),
            Err(problems) => problems,
        }
    }

    /// The shipped bundle passes the lint with everything it checks: tools, their
    /// arguments, states, the CLI's commands, channel prefixes.
    #[test]
    fn the_shipped_bundle_passes_the_whole_lint() {
        assert_eq!(problems(shipped_copy().path()), Vec::<String>::new());
        let commands = crate::args::cli_commands();
        assert!(
            commands.contains(&"canopy approve".to_owned()) && commands.contains(&"canopy agents create".to_owned())
        );
    }

    /// Each kind of planted error fails the check, naming its file and line.
    #[test]
    fn each_planted_error_is_named_with_its_file_and_line() {
        let line = "- Read the channel with `comms_list_messages`, filtered by `unseen`.\n";
        let cases: [(&str, &str, &str); 5] = [
            ("skills/comms-playbook/SKILL.md", line, "skills/comms-playbook/SKILL.md:"),
            ("skills/comms-playbook/SKILL.md", "- Watch the roster for `asleep_forever`.\n", "`asleep_forever`"),
            ("skills/comms-playbook/SKILL.md", "- Approve with `canopy aprove req-1`.\n", "`canopy aprove`"),
            ("skills/comms-playbook/SKILL.md", "- Post in `house-<you>`.\n", "`house-<you>`"),
            ("rules/never-block.md", "- Call `comms_post_message(channel, subject)`.\n", "`subject`"),
        ];
        for (file, planted, needle) in cases {
            let dir = shipped_copy();
            let path = dir.path().join(file);
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let lines = text.lines().count();
            std::fs::write(&path, format!("{text}{planted}")).unwrap_or_else(|e| panic!("{e}"));
            let found = problems(dir.path());
            let at = format!("{file}:{}", lines + 1);
            assert!(found.iter().any(|p| p.contains(&at) && p.contains(needle)), "{planted:?} gave {found:?}");
        }
        // A file the bundle does not understand, and a bad YAML role.
        let dir = shipped_copy();
        std::fs::write(dir.path().join("skills/notes.txt"), "x").unwrap_or_else(|e| panic!("{e}"));
        assert!(problems(dir.path()).iter().any(|p| p.contains("skills/notes.txt") && p.contains("not a bundle file")));
        let dir = shipped_copy();
        let role = "id: critic\nblock0: manager\nmode: replace\ntools:\n  - comms_*\n  colour: red\n";
        std::fs::write(dir.path().join("config/roles/critic.yaml"), role).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            problems(dir.path()).iter().any(|p| p.contains("config/roles/critic.yaml:6")),
            "{:?}",
            problems(dir.path())
        );
    }

    /// Every shipped prompt file opens with the note on gated lines, and no session reads it.
    #[test]
    fn every_prompt_file_says_how_gated_lines_work() {
        for (path, text) in canopy_prompt::Bundle::embedded_files() {
            if !path.ends_with(".md") || path.ends_with("README.md") {
                continue;
            }
            let body = match text.strip_prefix("---\n") {
                Some(rest) => rest.split_once("\n---\n").map_or(rest, |(_, body)| body),
                None => text,
            };
            assert!(body.starts_with(canopy_prompt::bundle::NOTE), "{path} does not open with the gated-lines note");
        }
        let renderer = match check(&BundleSource::Embedded, Vec::new()) {
            Ok(renderer) => renderer,
            Err(problems) => panic!("{problems:?}"),
        };
        assert!(renderer.bundle().blocks.values().all(|b| !b.text.contains("<!-- flip:")));
    }

    /// `canopy bundle import` brings each supported format in, and says what it skipped.
    #[tokio::test]
    async fn an_import_of_each_format_passes_the_check_and_reports_what_it_skipped() {
        let from = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let put = |rel: &str, text: &str| {
            let path = from.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap_or(from.path())).unwrap_or_else(|e| panic!("{e}"));
            std::fs::write(path, text).unwrap_or_else(|e| panic!("{e}"));
        };
        put(
            ".claude/skills/Release Notes/SKILL.md",
            "---\nname: release-notes\ndescription: Write release notes from merged PRs.\nallowed-tools: Read\n---\n# Release notes\nList the merged PRs.\n",
        );
        put(
            ".claude/agents/test-writer.md",
            "---\nname: test-writer\ndescription: Writes the failing test first.\ntools: Read, Edit\n---\nWrite the test, watch it fail.\n",
        );
        put("CLAUDE.md", "# Project\nRun `cargo test` before you push.\n");
        put("AGENTS.md", "Keep functions small.\n");
        put(
            ".cursor/rules/rust-style.mdc",
            "---\ndescription: Rust style\nglobs: [\"*.rs\"]\nalwaysApply: false\n---\nPrefer iterators.\n",
        );
        put(".mcp.json", "{\"mcpServers\": {\"github\": {\"command\": \"gh-mcp\"}}}");
        let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let bundle = data.path().join("bundle");
        let dir = canopy_config::DataDir::new(data.path().join(".canopy"));
        let code = crate::import::run(&dir, true, from.path(), Some(bundle.clone())).await;
        assert_eq!(code, 0, "the imported bundle does not pass the check");
        for written in [
            "skills/release-notes/SKILL.md",
            "agents/test-writer.md",
            "rules/claude-md.md",
            "rules/agents-md.md",
            "rules/rust-style.md",
            "imported-mcp-servers.json",
        ] {
            assert!(bundle.join(written).is_file(), "{written} was not written");
        }
        let renderer = match check(&BundleSource::Dir(bundle.clone()), crate::args::cli_commands()) {
            Ok(renderer) => renderer,
            Err(problems) => panic!("{problems:?}"),
        };
        let b = renderer.bundle();
        assert!(b.skills.contains_key("release-notes") && b.definitions.contains_key("test-writer"));
        assert!(b.rules.get("claude-md").is_some_and(|r| r.always_apply));
        assert_eq!(b.rules.get("rust-style").map(|r| r.globs.clone()), Some(vec!["*.rs".to_owned()]));
        // Imported twice: nothing is overwritten.
        assert_eq!(crate::import::run(&dir, true, from.path(), Some(bundle)).await, 0);
    }

    /// A YAML role is a role: it loads and renders like a TOML one.
    #[test]
    fn a_yaml_role_loads_and_renders() {
        let dir = shipped_copy();
        let role = "# A critic: reads and comments, never edits.\nid: critic\nblock0: manager\nmode: replace\ntools:\n  - \"*\"\nskills: [review, comms-playbook]\nharness: scripted\n";
        std::fs::write(dir.path().join("config/roles/critic.yaml"), role).unwrap_or_else(|e| panic!("{e}"));
        let renderer = match check(&BundleSource::Dir(dir.path().to_owned()), crate::args::cli_commands()) {
            Ok(renderer) => renderer,
            Err(problems) => panic!("{problems:?}"),
        };
        let critic = renderer.bundle().roles.get("critic").unwrap_or_else(|| panic!("no critic role"));
        assert_eq!(critic.skills, ["review", "comms-playbook"]);
    }
}
