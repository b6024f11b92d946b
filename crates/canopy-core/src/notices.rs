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

/// The first connection a session's egress proxy refused (`what`: the activity line, host and
/// reason); later ones are only counted on its roster line.
pub fn egress_refused(handle: &str, what: &str) -> String {
    format!(
        "@{handle}'s sandbox refused a connection: {what}. Its session reaches only its model endpoints and \
         [sandbox] allow_hosts; add the host there if the work needs it. The roster counts further refusals."
    )
}

/// A session ended for passing one of its `[sandbox]` limits (`what`: `session ended: memory
/// limit 2 GiB reached`).
pub fn limit_reached(handle: &str, what: &str) -> String {
    format!(
        "@{handle}'s {what}. It crashed as far as its runner is concerned and restarts like any crash; raise the \
         limit under [sandbox] if the work needs more."
    )
}

/// A lane moved to the next harness of its role's chain (`why`: the failure, in one line).
pub fn failed_over(handle: &str, from: &str, to: &str, why: &str, home: &str) -> String {
    let why: String = why.lines().next().unwrap_or_default().chars().take(160).collect();
    format!(
        "@{handle}'s {from} harness keeps failing ({why}), so it carries on with {to} in the same checkout, its \
         conversation carried over by its continuity block. It tries {home} again after [sessions] failback_after; \
         `canopy agents start {handle} --harness {home}` moves it back now."
    )
}

/// A lane went back to its first harness after `failback_after`; its next session is the probe.
pub fn failed_back(handle: &str, home: &str) -> String {
    format!(
        "@{handle} goes back to {home} at its next turn boundary: [sessions] failback_after passed. If {home} still \
         fails, it moves on again and waits twice as long before the next try."
    )
}

/// How a subagent run ended, for its Manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    Done,
    Failed,
    TimedOut,
}

/// What a subagent run's headline says besides how it ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunFacts<'a> {
    /// The issue it worked on.
    pub issue: Option<u64>,
    /// Its checks' summary on its final tree (`passed: test`, `failed: ...`).
    pub check: Option<&'a str>,
    /// It ran on the scripted stand-in under a Manager on a real harness: no model ran.
    pub stand_in: bool,
}

/// A subagent run's report to its Manager: the headline (how it ended, for which issue, and its
/// check, so the first line says whether it is green), then the run's last words.
pub fn run_ended(id: i64, definition: &str, end: RunEnd, facts: RunFacts<'_>, report: &str) -> String {
    let scripted = if facts.stand_in { ", scripted: no model ran" } else { "" };
    let what = match facts.issue {
        Some(issue) => format!("Subagent run {id} ({definition}, for issue #{issue}{scripted})"),
        None => format!("Subagent run {id} ({definition}{scripted})"),
    };
    let ended = match end {
        RunEnd::Done => "finished: done",
        RunEnd::Failed => "failed",
        RunEnd::TimedOut => "timed out and was stopped",
    };
    let headline = match facts.check {
        Some(checks) => format!("{what} {ended}; checks {checks}."),
        None => format!("{what} {ended}."),
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
        let none = RunFacts::default();
        assert_eq!(run_ended(3, "implementer", RunEnd::Failed, none, "  "), "Subagent run 3 (implementer) failed.");
        assert!(run_ended(3, "implementer", RunEnd::Done, none, "all green").ends_with("done.\n\nall green"));
        let red = RunFacts {
            issue: Some(7),
            check: Some("failed: test failed (exit 101, 2.0 s; log: check-4)"),
            stand_in: false,
        };
        let first = run_ended(3, "implementer", RunEnd::Done, red, "done, I think");
        assert_eq!(
            first.lines().next(),
            Some(
                "Subagent run 3 (implementer, for issue #7) finished: done; checks failed: test failed (exit 101, 2.0 s; log: check-4)."
            )
        );
        let scripted = RunFacts { stand_in: true, ..RunFacts::default() };
        let first = run_ended(4, "implementer", RunEnd::Done, scripted, "the slice is done");
        assert!(first.starts_with("Subagent run 4 (implementer, scripted: no model ran) finished: done."), "{first}");
    }
}
