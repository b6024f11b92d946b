//! The restart policy: what a session that ended on its own means for its agent. A crash is
//! restarted after a backoff that doubles with each crash in the window; too many crashes in
//! the window are a crash loop (the agent is marked `crashed`); a fatal end (it cannot be
//! confined, its program is missing) marks it `crashed` at once.
//!
//! Pure: the crash times and the clock are passed in, a report and a backoff come out. Does
//! not start or stop sessions (the runner actor does).

use std::collections::VecDeque;
use std::time::Duration;

use canopy_core::Presence;
use canopy_proto::api::SessionReport;
use tokio::time::Instant;

use crate::options::RunnerSettings;
use crate::session::{SessionExit, ended_report};

/// What the runner does after a crash.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Verdict {
    /// Too many crashes in the window: the agent is marked `crashed`, no restart.
    pub crash_loop: bool,
    /// How long to wait before the next start, when there is one.
    pub backoff: Duration,
    /// What the operator is told.
    pub reason: String,
}

/// Records a crash at `now` in `history` (the agent's recent crash times, older ones than
/// the window dropped) and judges it.
pub(crate) fn judge_crash(
    history: &mut VecDeque<Instant>,
    now: Instant,
    settings: &RunnerSettings,
    exit_reason: &str,
) -> Verdict {
    history.push_back(now);
    while history.front().is_some_and(|t| now.duration_since(*t) > settings.crash_loop_window) {
        history.pop_front();
    }
    let crashes = history.len() as u32;
    let crash_loop = crashes >= settings.crash_loop_count;
    let backoff = settings.restart_backoff_min.saturating_mul(1 << (crashes.saturating_sub(1)).min(16));
    let backoff = backoff.min(settings.restart_backoff_max);
    let reason = if crash_loop {
        format!("{crashes} crashes within {:?}; last: {exit_reason}", settings.crash_loop_window)
    } else {
        format!("{exit_reason}; restarting in {backoff:?}")
    };
    Verdict { crash_loop, backoff, reason }
}

/// The report of a crash the runner judged.
pub(crate) fn crash_report(exit: &SessionExit, verdict: &Verdict) -> SessionReport {
    let (presence, kind) = match verdict.crash_loop {
        true => (Presence::Crashed, "crash_loop"),
        false => (Presence::Starting, "session_crashed"),
    };
    let report = ended_report(exit.agent.clone(), exit.incarnation, presence, kind, verdict.reason.clone());
    SessionReport { crash_loop: verdict.crash_loop, ..report }
}

/// The report of a session that cannot start and whose restart cannot help: the agent stops
/// at once, and the operator is told why in its home channel.
pub(crate) fn fatal_report(exit: &SessionExit) -> SessionReport {
    let report =
        ended_report(exit.agent.clone(), exit.incarnation, Presence::Crashed, "session_failed", exit.reason.clone());
    SessionReport { crash_loop: true, fatal: true, ..report }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests' runner settings, with the backoff and crash-loop numbers these tests count.
    fn settings() -> RunnerSettings {
        RunnerSettings {
            restart_backoff_max: Duration::from_millis(300),
            crash_loop_count: 4,
            ..crate::session::testing::settings()
        }
    }

    fn exit() -> SessionExit {
        SessionExit {
            agent: "a".into(),
            incarnation: canopy_core::Incarnation(2),
            requested: false,
            fatal: false,
            reason: "exited 1".into(),
        }
    }

    #[test]
    fn crashes_back_off_doubling_up_to_the_cap_then_loop() {
        let (settings, t0) = (settings(), Instant::now());
        let mut history = VecDeque::new();
        let backoffs: Vec<(bool, u64)> = (0..4)
            .map(|i| judge_crash(&mut history, t0 + Duration::from_secs(i), &settings, "exited 1"))
            .map(|v| (v.crash_loop, v.backoff.as_millis() as u64))
            .collect();
        assert_eq!(backoffs, vec![(false, 100), (false, 200), (false, 300), (true, 300)]);
        let first = judge_crash(&mut VecDeque::new(), t0, &settings, "exited 1");
        assert_eq!(first.reason, "exited 1; restarting in 100ms");
    }

    #[test]
    fn crashes_outside_the_window_are_forgotten() {
        let (settings, t0) = (settings(), Instant::now());
        let mut history = VecDeque::new();
        for i in 0..3 {
            judge_crash(&mut history, t0 + Duration::from_secs(i), &settings, "x");
        }
        let later = judge_crash(&mut history, t0 + Duration::from_secs(200), &settings, "x");
        assert!(!later.crash_loop);
        assert_eq!((history.len(), later.backoff), (1, Duration::from_millis(100)));
    }

    #[test]
    fn a_crash_is_reported_as_restarting_and_a_loop_as_crashed() {
        let restart = Verdict { crash_loop: false, backoff: Duration::from_millis(100), reason: "r".into() };
        let report = crash_report(&exit(), &restart);
        assert_eq!((report.presence, report.ended, report.crash_loop), (Some(Presence::Starting), true, false));
        assert_eq!(report.activity.map(|a| a.kind), Some("session_crashed".into()));
        let stop = Verdict { crash_loop: true, ..restart };
        let report = crash_report(&exit(), &stop);
        assert_eq!((report.presence, report.crash_loop), (Some(Presence::Crashed), true));
        assert_eq!(report.activity.map(|a| a.kind), Some("crash_loop".into()));
    }

    #[test]
    fn a_fatal_end_is_reported_as_crashed_at_once_with_its_reason() {
        let report = fatal_report(&SessionExit { fatal: true, reason: "cannot be confined".into(), ..exit() });
        assert_eq!((report.presence, report.crash_loop, report.fatal), (Some(Presence::Crashed), true, true));
        assert_eq!(report.reason.as_deref(), Some("cannot be confined"));
        assert_eq!(report.activity.map(|a| a.kind), Some("session_failed".into()));
    }
}
