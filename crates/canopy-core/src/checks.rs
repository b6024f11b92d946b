//! A repository's named checks: their names, what one run of a check says (`CheckRun`), the
//! topic a failure is told under, and every sentence Canopy posts about checks. Runs nothing
//! and reads nothing: the git is `canopy-git`'s, the records the store's.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Error;
pub use crate::model::NamedCheck;

/// The name a repository's single `check` command has among its named checks.
pub const LEGACY_NAME: &str = "check";
/// Most checks one repository may name.
pub const MAX_CHECKS: usize = 20;
/// Longest check command, in bytes.
pub const MAX_COMMAND: usize = 4096;
/// The most of a check's output kept (its last bytes).
pub const MAX_LOG: usize = 1024 * 1024;
/// Lines of a failing check's log a notice quotes.
pub const TAIL_LINES: usize = 60;

/// A check's name: a short name, as a repository's (`names::is_short_name`).
pub fn check_name(field: &'static str, name: &str) -> Result<(), Error> {
    match crate::names::is_short_name(name) {
        true => Ok(()),
        false => Err(Error::invalid(field, format!("{name:?} is not a check name (1-40 of a-z, 0-9, -, _)"))),
    }
}

/// A repository's checks as configured: each name valid, each command one non-empty, bounded
/// string, at most `MAX_CHECKS`; returned in name order.
pub fn check_checks(field: &'static str, checks: &[(String, String)]) -> Result<Vec<NamedCheck>, Error> {
    if checks.len() > MAX_CHECKS {
        return Err(Error::invalid(field, format!("at most {MAX_CHECKS} checks per repository")));
    }
    let mut out: Vec<NamedCheck> = Vec::with_capacity(checks.len());
    for (name, command) in checks {
        check_name(field, name)?;
        let command = command.trim();
        if command.is_empty() {
            return Err(Error::invalid(field, format!("check {name} has an empty command")));
        }
        if command.len() > MAX_COMMAND {
            return Err(Error::TooLarge { field, len: command.len(), max: MAX_COMMAND });
        }
        if out.iter().any(|c| c.name == *name) {
            return Err(Error::invalid(field, format!("check {name} is named twice")));
        }
        out.push(NamedCheck { name: name.clone(), command: command.to_owned() });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Reads `NAME=CMD` (a command line's `--check`); a value whose part before `=` is not a
/// check name is one command, named `check` (the single check of old).
pub fn parse_assignment(value: &str) -> (String, String) {
    match value.split_once('=') {
        Some((name, command)) if check_name("check", name).is_ok() && !command.trim().is_empty() => {
            (name.to_owned(), command.trim().to_owned())
        }
        _ => (LEGACY_NAME.to_owned(), value.trim().to_owned()),
    }
}

/// Where one run of a check stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CheckState {
    Running,
    Passed,
    Failed,
    TimedOut,
    /// It could not run (no sandbox, no checkout) or the daemon stopped while it ran.
    Error,
}
crate::macros::string_enum!(CheckState {
    Running => "running",
    Passed => "passed",
    Failed => "failed",
    TimedOut => "timed_out",
    Error => "error",
});

/// What a check ran for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CheckTrigger {
    /// A run's final tree, when it reported.
    Run,
    /// A new commit on a standing agent's branch.
    Branch,
    /// A merge request's merged tree, when asked.
    Merge,
    /// A queued merge on the base as it is now, before the base moves.
    Queue,
}
crate::macros::string_enum!(CheckTrigger {
    Run => "run",
    Branch => "branch",
    Merge => "merge",
    Queue => "queue",
});

/// One run of one check on one commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckRun {
    /// `check-<n>`: `canopy checks log check-<n>` prints its output.
    pub id: String,
    pub repo: String,
    pub name: String,
    pub command: String,
    /// The commit it ran on.
    pub commit: String,
    pub trigger: CheckTrigger,
    /// What it ran for: the branch (`canopy/m1`, a run's), or `merge-<n>`.
    pub subject: String,
    pub state: CheckState,
    /// `exit 0`, `exit 101`, `timed out after 600s`, or why it could not run.
    pub outcome: String,
    pub duration_ms: u64,
    /// Bytes of output kept (its last `MAX_LOG`).
    pub log_bytes: u64,
    pub started_at: String,
    pub finished_at: Option<String>,
}

impl CheckRun {
    /// One line: `test passed (1.2 s)` or `test failed (exit 101, 1.0 s; canopy checks log check-4)`.
    pub fn line(&self) -> String {
        let secs = self.duration_ms as f64 / 1000.0;
        match self.state {
            CheckState::Passed => format!("{} passed ({secs:.1} s)", self.name),
            CheckState::Running => format!("{} running", self.name),
            state => format!(
                "{} {} ({}, {secs:.1} s; log: {})",
                self.name,
                state.as_str().replace('_', " "),
                self.outcome,
                self.id
            ),
        }
    }
}

/// Whether every check passed (none configured passes).
pub fn all_passed(runs: &[CheckRun]) -> bool {
    runs.iter().all(|r| r.state == CheckState::Passed)
}

/// The one-line summary of a commit's checks: `none configured`, `passed: lint, test`, or
/// `failed: test (exit 101, ...); passed: lint`.
pub fn summary(runs: &[CheckRun]) -> String {
    if runs.is_empty() {
        return "none configured".into();
    }
    let passed: Vec<&str> = runs.iter().filter(|r| r.state == CheckState::Passed).map(|r| r.name.as_str()).collect();
    let other: Vec<String> = runs.iter().filter(|r| r.state != CheckState::Passed).map(CheckRun::line).collect();
    match (other.is_empty(), passed.is_empty()) {
        (true, _) => format!("passed: {}", passed.join(", ")),
        (false, true) => format!("failed: {}", other.join("; ")),
        (false, false) => format!("failed: {}; passed: {}", other.join("; "), passed.join(", ")),
    }
}

/// The last `n` lines of a log, each cut to 300 characters.
pub fn tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().map(str::trim_end).collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].iter().map(|l| l.chars().take(300).collect::<String>()).collect::<Vec<_>>().join("\n")
}

/// The topic a branch's failing checks are told under, in its owner's home channel.
pub fn topic(branch: &str) -> String {
    format!("checks: {branch}")
}

/// The topic a branch's conflicts are told under, in its owner's home channel.
pub fn conflicts_topic(branch: &str) -> String {
    format!("conflicts: {branch}")
}

/// Canopy's posts about checks and conflicts.
pub mod say {
    use super::CheckRun;

    /// A live branch that no longer merges cleanly with the base, or with another live branch.
    pub fn conflict(branch: &str, other: &str, base: bool, files: &[String]) -> String {
        let files = files.join(", ");
        match base {
            true => format!(
                "{branch} no longer merges cleanly with {other}: both change {files}. Merge {other} into your \
                 branch and resolve it now, before you ask to merge."
            ),
            false => format!(
                "{branch} and {other} both change {files} and do not merge cleanly. Whichever lands second must \
                 resolve it: agree the order with {other}'s owner now."
            ),
        }
    }

    /// A failing check on a branch, with its log's tail.
    pub fn failed(branch: &str, run: &CheckRun, tail: &str) -> String {
        let short = &run.commit[..run.commit.len().min(10)];
        format!(
            "Check {name} failed on {branch} at {short} ({outcome}). The last lines of its log ({id}; \
             checks_status shows every check):\n```\n{tail}\n```",
            name = run.name,
            outcome = run.outcome,
            id = run.id,
        )
    }

    /// Every check passing again on a branch after a failure.
    pub fn green(branch: &str, commit: &str, names: &[&str]) -> String {
        let short = &commit[..commit.len().min(10)];
        format!("Checks pass again on {branch} at {short}: {}.", names.join(", "))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    fn run(name: &str, state: CheckState) -> CheckRun {
        CheckRun {
            id: "check-1".into(),
            repo: "app".into(),
            name: name.into(),
            command: "make".into(),
            commit: "0123456789abcdef".into(),
            trigger: CheckTrigger::Branch,
            subject: "canopy/m1".into(),
            state,
            outcome: if state == CheckState::Passed { "exit 0".into() } else { "exit 2".into() },
            duration_ms: 1500,
            log_bytes: 0,
            started_at: String::new(),
            finished_at: None,
        }
    }

    #[test]
    fn names_and_lists_of_checks_are_checked() {
        assert!(check_name("checks", "lint_2").is_ok());
        assert!(check_name("checks", "Lint").is_err());
        assert!(check_name("checks", "").is_err());
        let ok = check_checks("checks", &[("test".into(), " cargo test ".into()), ("lint".into(), "clippy".into())]);
        let ok = ok.unwrap();
        assert_eq!(ok[0].name, "lint");
        assert_eq!(ok[1].command, "cargo test");
        assert!(check_checks("checks", &[("t".into(), " ".into())]).is_err());
        assert!(check_checks("checks", &[("t".into(), "a".into()), ("t".into(), "b".into())]).is_err());
    }

    #[test]
    fn an_assignment_names_a_check_or_is_the_old_single_one() {
        assert_eq!(parse_assignment("lint=cargo clippy"), ("lint".into(), "cargo clippy".into()));
        assert_eq!(parse_assignment("cargo test --x=1"), ("check".into(), "cargo test --x=1".into()));
        assert_eq!(parse_assignment("FOO=1 make"), ("check".into(), "FOO=1 make".into()));
    }

    #[test]
    fn a_summary_leads_with_what_failed() {
        assert_eq!(summary(&[]), "none configured");
        assert_eq!(summary(&[run("lint", CheckState::Passed)]), "passed: lint");
        let mixed = summary(&[run("lint", CheckState::Passed), run("test", CheckState::TimedOut)]);
        assert_eq!(mixed, "failed: test timed out (exit 2, 1.5 s; log: check-1); passed: lint");
        assert!(!all_passed(&[run("lint", CheckState::Passed), run("test", CheckState::Failed)]));
    }

    #[test]
    fn a_tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("", 60), "");
    }
}
