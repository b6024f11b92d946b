//! What Canopy's own account says in a home channel about sessions and runs: a stalled
//! session, a session stopped after a crash loop or because it could not start, a finished
//! subagent run. Pure sentences from facts; the store posts them, the spawn gate's own are
//! in `spawn::say`. Does no IO.

/// A working session that went silent.
pub fn session_stalled(handle: &str, reason: &str) -> String {
    format!("@{handle}'s session is stalled: {reason}. `canopy watch {handle}` shows its last steps.")
}

/// A session stopped for good: `fatal` when retrying cannot help (it cannot be
/// confined), else after a crash loop.
pub fn session_stopped(handle: &str, reason: &str, fatal: bool) -> String {
    match fatal {
        true => format!(
            "@{handle}'s session was stopped, since retrying cannot help: {reason}. \
             Fix it, then run `canopy agents start {handle}`."
        ),
        false => format!(
            "@{handle}'s session crashed repeatedly and was stopped: {reason}. \
             Fix its harness or script, then run `canopy agents start {handle}`."
        ),
    }
}

/// A session whose model calls keep failing (the harness retries): told once per episode.
pub fn session_failing(handle: &str, reason: &str) -> String {
    format!(
        "@{handle} is failing: {reason}. Its harness keeps retrying; `canopy roster` shows it as failing until a \
         turn gets through. Check the harness's credentials and network, `canopy watch {handle}`, and `canopy doctor`."
    )
}

/// How a subagent run ended, for its Manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    Done,
    Failed,
    TimedOut,
}

/// A subagent run's report to its Manager: the headline, then the run's last words.
pub fn run_ended(id: i64, definition: &str, end: RunEnd, report: &str) -> String {
    let headline = match end {
        RunEnd::Done => format!("Subagent run {id} ({definition}) finished: done."),
        RunEnd::Failed => format!("Subagent run {id} ({definition}) failed."),
        RunEnd::TimedOut => format!("Subagent run {id} ({definition}) timed out and was stopped."),
    };
    match report.trim() {
        "" => headline,
        report => format!("{headline}\n\n{report}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_name_the_agent_and_what_to_do() {
        assert!(session_stalled("ci", "no activity for 5m").contains("`canopy watch ci`"));
        assert!(session_stopped("ci", "bwrap missing", true).contains("retrying cannot help"));
        assert!(session_stopped("ci", "exit 101", false).contains("crashed repeatedly"));
        assert_eq!(run_ended(3, "implementer", RunEnd::Failed, "  "), "Subagent run 3 (implementer) failed.");
        assert!(run_ended(3, "implementer", RunEnd::Done, "all green").ends_with("done.\n\nall green"));
    }
}
