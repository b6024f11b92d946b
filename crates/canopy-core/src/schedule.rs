//! When a session's next turn-start delivery is due: the turn scheduler a runner's session
//! task drives, as a state machine with time passed in.
//!
//! Doorbells (and steers that never reached the model) open a window; the delivery is due
//! after `quiet` without another doorbell, or `cap` after the window's first one, whichever
//! comes first, so a burst costs one turn. Nothing is due while a turn runs, while a
//! delivery is in flight, or once the session is stopping. A turn's end makes whatever
//! arrived during it due at once; a delivery the harness did not take is retried. A
//! compaction makes the next delivery carry the continuity block. Owns only these rules:
//! pulling, rendering and sending are the runner's.

use std::time::{Duration, Instant};

/// The scheduler of one session.
#[derive(Debug, Clone)]
pub struct TurnSchedule {
    quiet: Duration,
    cap: Duration,
    /// The doorbell window since the last delivery: (first, last).
    window: Option<(Instant, Instant)>,
    /// The window is due at once (a turn ended or the idle resync looked): later doorbells
    /// do not push it back, or a steady stream of them would hold a backlog until the cap.
    at_once: bool,
    turn: Option<String>,
    delivering: bool,
    stopping: bool,
    continuity_owed: bool,
}

/// A turn-start delivery the scheduler has started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// Whether it should open with the continuity block (a compaction happened).
    pub continuity: bool,
}

impl TurnSchedule {
    pub fn new(quiet: Duration, cap: Duration) -> TurnSchedule {
        TurnSchedule {
            quiet,
            cap,
            window: None,
            at_once: false,
            turn: None,
            delivering: false,
            stopping: false,
            continuity_owed: false,
        }
    }

    /// New messages may be pending (a doorbell), or a steer never reached the model.
    pub fn hint(&mut self, now: Instant) {
        self.window = Some(self.window.map_or((now, now), |(first, _)| (first, now)));
    }

    /// Pending messages should be looked for now (a turn ended, or the idle resync).
    fn hint_now(&mut self, now: Instant) {
        self.window = Some(self.window.map_or((now, now), |(first, _)| (first.min(now), now)));
        self.at_once = true;
    }

    pub fn turn_started(&mut self, turn_id: &str) {
        self.turn = Some(turn_id.to_owned());
    }

    /// The turn ended: anything that arrived during it goes at the next one, at once.
    pub fn turn_ended(&mut self, now: Instant) {
        self.turn = None;
        self.hint_now(now);
    }

    /// A subagent run's turn ended: its report goes to its Manager, nothing more is
    /// delivered to it.
    pub fn run_ended(&mut self) {
        self.turn = None;
    }

    /// The turn running now, if one is.
    pub fn turn(&self) -> Option<&str> {
        self.turn.as_deref()
    }

    /// Whether the idle resync may look for pending messages (no turn, no delivery, no
    /// window open).
    pub fn resync_wanted(&self) -> bool {
        self.turn.is_none() && !self.delivering && self.window.is_none() && !self.stopping
    }

    /// The idle resync: doorbells are at most once, so look for pending messages now.
    pub fn resync(&mut self, now: Instant) {
        if self.resync_wanted() {
            self.hint_now(now);
        }
    }

    /// When the next delivery is due, if one is.
    pub fn due(&self) -> Option<Instant> {
        match self.window {
            Some((first, _)) if self.at_once && self.turn.is_none() && !self.delivering && !self.stopping => {
                Some(first)
            }
            Some((first, last)) if self.turn.is_none() && !self.delivering && !self.stopping => {
                Some((last + self.quiet).min(first + self.cap))
            }
            _ => None,
        }
    }

    /// Starts the due delivery (the window closes); `None` when none may start now.
    pub fn start_delivery(&mut self, now: Instant) -> Option<Delivery> {
        match self.due() {
            Some(due) if due <= now => {
                self.window = None;
                self.at_once = false;
                self.delivering = true;
                Some(Delivery { continuity: self.continuity_owed })
            }
            _ => None,
        }
    }

    /// The delivery ended: `started` when the harness took it as a turn start,
    /// `continuity` when it carried the continuity block. One not taken is retried.
    pub fn delivered(&mut self, started: bool, continuity: bool, now: Instant) {
        self.delivering = false;
        if started && continuity {
            self.continuity_owed = false;
        }
        if !started {
            self.window = Some(self.window.unwrap_or((now, now)));
        }
    }

    /// A compaction ended: the next delivery opens with the continuity block.
    pub fn compacted(&mut self) {
        self.continuity_owed = true;
    }

    pub fn continuity_owed(&self) -> bool {
        self.continuity_owed
    }

    /// The session is stopping: nothing is due any more.
    pub fn stop(&mut self) {
        self.stopping = true;
    }

    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// A turn-start delivery is in flight.
    pub fn delivering(&self) -> bool {
        self.delivering
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET: Duration = Duration::from_millis(2000);
    const CAP: Duration = Duration::from_millis(5000);

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn a_burst_of_doorbells_is_one_delivery_after_the_quiet_window() {
        let t0 = Instant::now();
        let mut s = TurnSchedule::new(QUIET, CAP);
        assert_eq!(s.due(), None);
        s.hint(t0);
        s.hint(at(t0, 500));
        s.hint(at(t0, 1000));
        assert_eq!(s.due(), Some(at(t0, 3000)));
        assert_eq!(s.start_delivery(at(t0, 2999)), None, "not before it is due");
        assert_eq!(s.start_delivery(at(t0, 3000)), Some(Delivery { continuity: false }));
        assert_eq!(s.due(), None, "one delivery at a time");
        s.hint(at(t0, 3100));
        assert_eq!(s.due(), None, "a doorbell during a delivery waits for it");
        s.delivered(true, false, at(t0, 3200));
        assert_eq!(s.due(), Some(at(t0, 5100)));
    }

    #[test]
    fn doorbells_that_keep_coming_are_delivered_at_the_cap() {
        let t0 = Instant::now();
        let mut s = TurnSchedule::new(QUIET, CAP);
        for ms in (0..=6000).step_by(1000) {
            s.hint(at(t0, ms));
        }
        assert_eq!(s.due(), Some(at(t0, 5000)));
    }

    #[test]
    fn nothing_is_due_during_a_turn_and_its_end_makes_what_waited_due_at_once() {
        let t0 = Instant::now();
        let mut s = TurnSchedule::new(QUIET, CAP);
        s.turn_started("t1");
        s.hint(t0);
        assert_eq!(s.due(), None);
        assert_eq!(s.turn(), Some("t1"));
        s.turn_ended(at(t0, 10_000));
        assert_eq!(s.turn(), None);
        let due = s.due().unwrap_or(at(t0, 99_999));
        assert!(due <= at(t0, 10_000), "due at once after the turn: {due:?}");
    }

    #[test]
    fn doorbells_during_and_after_a_turn_do_not_hold_back_what_its_end_made_due() {
        let t0 = Instant::now();
        let mut s = TurnSchedule::new(QUIET, CAP);
        s.turn_started("t1");
        // A steady stream, one doorbell every 15 ms, during the turn and after it.
        for ms in (0..=1000).step_by(15) {
            s.hint(at(t0, ms));
        }
        s.turn_ended(at(t0, 1000));
        for ms in (1015..=1100).step_by(15) {
            s.hint(at(t0, ms));
        }
        let due = s.due().unwrap_or(at(t0, 99_999));
        assert!(due <= at(t0, 1000), "a backlog waits for neither the quiet window nor the cap: {due:?}");
        assert!(s.start_delivery(at(t0, 1100)).is_some());
        // The next window is a normal one again.
        s.delivered(true, false, at(t0, 1150));
        s.hint(at(t0, 1200));
        assert_eq!(s.due(), Some(at(t0, 3200)));
    }

    #[test]
    fn a_delivery_the_harness_did_not_take_is_retried() {
        let t0 = Instant::now();
        let mut s = TurnSchedule::new(QUIET, CAP);
        s.hint(t0);
        assert!(s.start_delivery(at(t0, 2000)).is_some());
        s.delivered(false, false, at(t0, 2100));
        assert_eq!(s.due(), Some(at(t0, 4100)));
    }

    #[test]
    fn the_idle_resync_looks_only_when_idle_and_nothing_is_open() {
        let t0 = Instant::now();
        let mut s = TurnSchedule::new(QUIET, CAP);
        assert!(s.resync_wanted());
        s.resync(t0);
        assert!(s.due().is_some_and(|d| d <= t0), "the resync looks at once");
        assert!(!s.resync_wanted(), "a window is open");
        assert!(s.start_delivery(t0).is_some());
        assert!(!s.resync_wanted(), "a delivery is in flight");
        s.delivered(true, false, t0);
        s.turn_started("t2");
        assert!(!s.resync_wanted(), "a turn runs");
    }

    #[test]
    fn a_compaction_makes_the_next_delivery_carry_the_continuity_block_once() {
        let t0 = Instant::now();
        let mut s = TurnSchedule::new(QUIET, CAP);
        s.compacted();
        s.hint(t0);
        assert_eq!(s.start_delivery(at(t0, 2000)), Some(Delivery { continuity: true }));
        s.delivered(false, true, at(t0, 2001));
        assert!(s.continuity_owed(), "a delivery not taken still owes the block");
        assert_eq!(s.start_delivery(at(t0, 4001)), Some(Delivery { continuity: true }));
        s.delivered(true, true, at(t0, 4002));
        assert!(!s.continuity_owed());
    }

    #[test]
    fn a_stopping_session_has_nothing_due() {
        let t0 = Instant::now();
        let mut s = TurnSchedule::new(QUIET, CAP);
        s.hint(t0);
        s.stop();
        assert!(s.stopping());
        assert_eq!(s.due(), None);
        assert!(!s.resync_wanted());
        assert_eq!(s.start_delivery(at(t0, 9000)), None);
    }
}
