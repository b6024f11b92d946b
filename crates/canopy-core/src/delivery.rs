//! Who gets a committed post, and how: the delivery planner's per-recipient rule and the
//! loop guard, as pure decisions over the facts the daemon read (time passed in).
//!
//! A despawned recipient is refused; one without a live session is held for its next start;
//! an @mentioned recipient in the middle of a turn is steered; an idle one is woken unless
//! the post is an acknowledgement or the loop guard holds the wake; anyone else gets it at
//! its next turn start. Owns these rules and the loop guard's counting. Does not read the
//! store, ring a runner or send a steer: the daemon carries the route out.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{AccountKind, AccountState, Presence, RunnerId};

/// What the planner knows of one recipient.
#[derive(Debug, Clone, Copy)]
pub struct RecipientFacts<'a> {
    pub state: AccountState,
    pub presence: Presence,
    /// The runner hosting its live session, if it has one.
    pub runner: Option<&'a RunnerId>,
    pub mentioned: bool,
}

/// How a post reaches one recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// It is not delivered (a despawned agent).
    Refused(String),
    /// No live session: it waits for the next session start.
    Held(String),
    /// The loop guard holds the wake; `tell` the first time (the operator must be told).
    LoopHeld { tell: bool },
    /// Steer it into the running turn through `runner` (falling back to a doorbell).
    Steer { runner: RunnerId },
    /// Ring `runner` to wake the idle agent.
    Woke { runner: RunnerId },
    /// Ring `runner`; it arrives at the next turn start (`reason` when worth saying).
    Queued { runner: RunnerId, reason: Option<String> },
}

/// The rule for one recipient of a post by a `sender` of this kind. `loop_guard` is asked
/// only for an agent's post that would wake an idle recipient.
pub fn route(
    sender: AccountKind,
    recipient: RecipientFacts<'_>,
    ack_only: bool,
    loop_guard: impl FnOnce() -> Verdict,
) -> Route {
    if recipient.state == AccountState::Despawned {
        return Route::Refused("despawned".into());
    }
    let Some(runner) = recipient.runner.cloned() else {
        let why = match recipient.state {
            AccountState::Crashed => "crashed: delivered when it is started again",
            _ => "offline: delivered at its next session start",
        };
        return Route::Held(why.into());
    };
    let working = matches!(recipient.presence, Presence::Working | Presence::Stalled);
    if recipient.mentioned && working {
        return Route::Steer { runner };
    }
    let idle = recipient.presence == Presence::Idle;
    if idle && !ack_only {
        if sender == AccountKind::Agent
            && let Verdict::Hold { tell } = loop_guard()
        {
            return Route::LoopHeld { tell };
        }
        return Route::Woke { runner };
    }
    let reason = (ack_only && idle).then(|| "an acknowledgement: delivered at its next turn, without waking it".into());
    Route::Queued { runner, reason }
}

/// What the loop guard says about one wake.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Wake,
    /// Hold it; `tell` is true the first time, when the operator must be told.
    Hold {
        tell: bool,
    },
}

/// Counts wakes between pairs of agents; an operator post to either resets the pair. Lives
/// in the daemon's memory: a restart starts the counts over (a restart is an operator act).
#[derive(Debug, Default)]
pub struct LoopGuard {
    wakes: Mutex<HashMap<(String, String), VecDeque<Instant>>>,
    told: Mutex<HashSet<(String, String)>>,
}

impl LoopGuard {
    fn pair(a: &str, b: &str) -> (String, String) {
        if a <= b { (a.to_owned(), b.to_owned()) } else { (b.to_owned(), a.to_owned()) }
    }

    /// Records a wake of `to` by agent `from` at `now`, or says to hold it: more than
    /// `limit` wakes between the two (either way) within `window` are held.
    pub fn wake(&self, from: &str, to: &str, limit: u32, window: Duration, now: Instant) -> Verdict {
        let key = LoopGuard::pair(from, to);
        let Ok(mut wakes) = self.wakes.lock() else { return Verdict::Wake };
        let times = wakes.entry(key.clone()).or_default();
        while times.front().is_some_and(|t| now.duration_since(*t) > window) {
            times.pop_front();
        }
        if times.len() as u32 >= limit {
            let tell = self.told.lock().map(|mut told| told.insert(key)).unwrap_or(false);
            return Verdict::Hold { tell };
        }
        times.push_back(now);
        Verdict::Wake
    }

    /// An operator spoke to `agent`: its loops start over.
    pub fn reset(&self, agent: &str) {
        if let Ok(mut wakes) = self.wakes.lock() {
            wakes.retain(|(a, b), _| a != agent && b != agent);
        }
        if let Ok(mut told) = self.told.lock() {
            told.retain(|(a, b)| a != agent && b != agent);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    static R: std::sync::LazyLock<RunnerId> = std::sync::LazyLock::new(|| RunnerId::parse("r").unwrap());

    fn facts(presence: Presence, runner: Option<&str>, mentioned: bool) -> RecipientFacts<'static> {
        RecipientFacts { state: AccountState::Active, presence, runner: runner.map(|_| &*R), mentioned }
    }

    fn never() -> Verdict {
        panic!("the loop guard was asked for a wake that is not one")
    }

    #[test]
    fn each_recipient_gets_the_route_its_state_calls_for() {
        let op = AccountKind::Operator;
        let despawned = RecipientFacts { state: AccountState::Despawned, ..facts(Presence::Idle, Some("r"), false) };
        assert_eq!(route(op, despawned, false, never), Route::Refused("despawned".into()));
        assert!(
            matches!(route(op, facts(Presence::Offline, None, true), false, never), Route::Held(why) if why.starts_with("offline"))
        );
        let crashed = RecipientFacts { state: AccountState::Crashed, ..facts(Presence::Crashed, None, false) };
        assert!(matches!(route(op, crashed, false, never), Route::Held(why) if why.starts_with("crashed")));
        assert_eq!(
            route(op, facts(Presence::Working, Some("r"), true), false, never),
            Route::Steer { runner: R.clone() }
        );
        assert_eq!(
            route(op, facts(Presence::Stalled, Some("r"), true), false, never),
            Route::Steer { runner: R.clone() }
        );
        assert_eq!(
            route(op, facts(Presence::Working, Some("r"), false), false, never),
            Route::Queued { runner: R.clone(), reason: None }
        );
        assert_eq!(route(op, facts(Presence::Idle, Some("r"), false), false, never), Route::Woke { runner: R.clone() });
        assert!(matches!(
            route(op, facts(Presence::Idle, Some("r"), true), true, never),
            Route::Queued { reason: Some(_), .. }
        ));
    }

    #[test]
    fn only_an_agent_s_wakes_pass_the_loop_guard() {
        let idle = facts(Presence::Idle, Some("r"), false);
        let held = route(AccountKind::Agent, idle, false, || Verdict::Hold { tell: true });
        assert_eq!(held, Route::LoopHeld { tell: true });
        assert_eq!(route(AccountKind::Agent, idle, false, || Verdict::Wake), Route::Woke { runner: R.clone() });
        assert_eq!(route(AccountKind::Operator, idle, false, never), Route::Woke { runner: R.clone() });
    }

    #[test]
    fn the_loop_guard_holds_past_its_limit_tells_once_and_resets() {
        let guard = LoopGuard::default();
        let t0 = Instant::now();
        let window = Duration::from_secs(60);
        for i in 0..3 {
            assert_eq!(guard.wake("a", "b", 3, window, t0 + Duration::from_secs(i)), Verdict::Wake);
        }
        assert_eq!(guard.wake("b", "a", 3, window, t0 + Duration::from_secs(4)), Verdict::Hold { tell: true });
        assert_eq!(guard.wake("a", "b", 3, window, t0 + Duration::from_secs(5)), Verdict::Hold { tell: false });
        assert_eq!(guard.wake("a", "c", 3, window, t0 + Duration::from_secs(5)), Verdict::Wake, "pairs are apart");
        assert_eq!(guard.wake("a", "b", 3, window, t0 + Duration::from_secs(120)), Verdict::Wake, "the window passed");
        for _ in 0..3 {
            guard.wake("a", "b", 3, window, t0 + Duration::from_secs(121));
        }
        guard.reset("b");
        assert_eq!(guard.wake("a", "b", 3, window, t0 + Duration::from_secs(122)), Verdict::Wake, "an operator spoke");
    }
}
