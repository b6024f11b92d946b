//! Who gets a committed post, and how: the delivery planner (`plan`: every recipient's
//! route, the steers to send, the doorbells grouped by runner, the wakes held by the loop
//! guard and who must be told, and the outcome list with its counts), the per-recipient rule
//! (`route`) and the loop guard, as pure decisions over the facts the daemon read (time
//! passed in).
//!
//! A despawned recipient is refused; one a spent budget covers is held until it is raised or
//! renews; one without a live session is held for its next start;
//! an @mentioned recipient in the middle of a turn is steered; an idle one is woken unless
//! the post is an acknowledgement or the loop guard holds the wake; anyone else gets it at
//! its next turn start. A steer that fails falls back to a doorbell. Owns these rules and the
//! loop guard's counting. Does not read the store, ring a runner or send a steer: the daemon
//! carries the plan out.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{AccountKind, AccountState, Presence, RunnerId};

/// Posts reaching more agents than this list outcomes only for the mentioned and refused.
pub const LIST_OUTCOMES_UP_TO: usize = 100;

/// What became of a post for one recipient.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Injected into the recipient's running turn (it was @mentioned).
    Steered,
    /// Delivered at the start of the recipient's next turn (it is busy now).
    Queued,
    /// The recipient was idle; a turn starts for it.
    Woke,
    /// The recipient is offline (or its wake was held): delivered at its next start or turn.
    Held,
    /// The recipient cannot receive it.
    Refused,
}

impl Outcome {
    /// The wire and display form.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Steered => "steered",
            Outcome::Queued => "queued",
            Outcome::Woke => "woke",
            Outcome::Held => "held",
            Outcome::Refused => "refused",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecipientOutcome {
    pub recipient: String,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For a steer: microseconds from the message's commit until its line was written to
    /// the recipient's harness (wall clocks of daemon and runner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steer_latency_us: Option<u64>,
}

/// How many recipients got each outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutcomeCounts {
    pub steered: u32,
    pub queued: u32,
    pub woke: u32,
    pub held: u32,
    pub refused: u32,
}

/// One recipient as the planner sees it.
#[derive(Debug, Clone, Copy)]
pub struct PlanRecipient<'a> {
    pub handle: &'a str,
    pub facts: RecipientFacts<'a>,
}

/// The loop guard's limit: more than `wakes` between two agents within `window` are held.
#[derive(Debug, Clone, Copy)]
pub struct LoopLimits {
    pub wakes: u32,
    pub window: Duration,
}

/// One post's delivery, decided. The daemon sends `steers` (settling each with
/// `steered` or `steer_failed`), rings `doorbells`, records `held`, tells the operator of
/// `loop_notices`, and answers with `finish`. Indices are into the recipients planned.
#[derive(Debug, Default)]
pub struct Plan {
    outcomes: Vec<RecipientOutcome>,
    /// Recipients to steer, with the runner hosting each.
    pub steers: Vec<(usize, RunnerId)>,
    /// Agents to ring, grouped by the runner hosting them.
    pub doorbells: BTreeMap<RunnerId, Vec<String>>,
    /// Recipients whose wake the loop guard held (recorded so they are not woken later).
    pub held: Vec<usize>,
    /// Recipients whose loop the operator must be told about (the first hold of a pair).
    pub loop_notices: Vec<usize>,
}

/// Plans a committed post by `sender` to `recipients`. An operator's post resets the loop
/// guard for each recipient; an agent's wake of an idle recipient is counted by it at `now`.
pub fn plan(
    sender: (&str, AccountKind),
    recipients: &[PlanRecipient<'_>],
    ack_only: bool,
    quiet: Option<&str>,
    guard: &LoopGuard,
    limits: LoopLimits,
    now: Instant,
) -> Plan {
    let (from, kind) = sender;
    let mut plan = Plan { outcomes: Vec::with_capacity(recipients.len()), ..Plan::default() };
    for (index, recipient) in recipients.iter().enumerate() {
        if kind == AccountKind::Operator {
            guard.reset(recipient.handle);
        }
        let wake = || guard.wake(from, recipient.handle, limits.wakes, limits.window, now);
        let outcome = |outcome, reason: Option<String>| RecipientOutcome {
            recipient: recipient.handle.to_owned(),
            outcome,
            reason,
            steer_latency_us: None,
        };
        match route(kind, recipient.facts, ack_only, quiet, wake) {
            Route::Refused(why) => plan.outcomes.push(outcome(Outcome::Refused, Some(why))),
            Route::Held(why) => plan.outcomes.push(outcome(Outcome::Held, Some(why))),
            Route::LoopHeld { tell } => {
                plan.held.push(index);
                if tell {
                    plan.loop_notices.push(index);
                }
                let why = "loop guard: these two agents keep waking each other; the operator was told";
                plan.outcomes.push(outcome(Outcome::Held, Some(why.into())));
            }
            Route::Steer { runner } => plan.steers.push((index, runner)),
            Route::Woke { runner } => {
                plan.doorbells.entry(runner).or_default().push(recipient.handle.to_owned());
                plan.outcomes.push(outcome(Outcome::Woke, None));
            }
            Route::Queued { runner, reason } => {
                plan.doorbells.entry(runner).or_default().push(recipient.handle.to_owned());
                plan.outcomes.push(outcome(Outcome::Queued, reason));
            }
        }
    }
    plan
}

impl Plan {
    /// A recipient outside the plan is refused (an @mention of someone not subscribed).
    pub fn refuse(&mut self, handle: &str, reason: String) {
        self.outcomes.push(RecipientOutcome {
            recipient: handle.to_owned(),
            outcome: Outcome::Refused,
            reason: Some(reason),
            steer_latency_us: None,
        });
    }

    /// The steer to `handle` landed in `turn`, `latency_us` after the commit.
    pub fn steered(&mut self, handle: &str, turn: &str, latency_us: Option<u64>) {
        self.outcomes.push(RecipientOutcome {
            recipient: handle.to_owned(),
            outcome: Outcome::Steered,
            reason: Some(format!("into turn {turn}")),
            steer_latency_us: latency_us,
        });
    }

    /// The steer to `handle` on `runner` failed: it falls back to its next turn start.
    pub fn steer_failed(&mut self, handle: &str, runner: RunnerId, why: &str) {
        self.doorbells.entry(runner).or_default().push(handle.to_owned());
        self.outcomes.push(RecipientOutcome {
            recipient: handle.to_owned(),
            outcome: Outcome::Queued,
            reason: Some(format!("fell back to its next turn start: {why}")),
            steer_latency_us: None,
        });
    }

    /// The answer: the counts over everyone, and the outcomes listed (past
    /// `LIST_OUTCOMES_UP_TO` recipients, only the refused and the `mentioned`).
    pub fn finish(self, mentioned: &HashSet<&str>) -> (Vec<RecipientOutcome>, OutcomeCounts) {
        let mut outcomes = self.outcomes;
        let mut counts = OutcomeCounts::default();
        for o in &outcomes {
            *match o.outcome {
                Outcome::Steered => &mut counts.steered,
                Outcome::Queued => &mut counts.queued,
                Outcome::Woke => &mut counts.woke,
                Outcome::Held => &mut counts.held,
                Outcome::Refused => &mut counts.refused,
            } += 1;
        }
        if outcomes.len() > LIST_OUTCOMES_UP_TO {
            outcomes.retain(|o| o.outcome == Outcome::Refused || mentioned.contains(o.recipient.as_str()));
        }
        (outcomes, counts)
    }
}

/// What the planner knows of one recipient.
#[derive(Debug, Clone, Copy)]
pub struct RecipientFacts<'a> {
    pub state: AccountState,
    pub presence: Presence,
    /// The runner hosting its live session, if it has one.
    pub runner: Option<&'a RunnerId>,
    pub mentioned: bool,
    /// Why a spent budget holds it, if one does: nothing starts a turn for it.
    pub budget: Option<&'a str>,
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
    quiet: Option<&str>,
    loop_guard: impl FnOnce() -> Verdict,
) -> Route {
    if recipient.state == AccountState::Despawned {
        return Route::Refused("despawned".into());
    }
    if let Some(why) = recipient.budget {
        return Route::Held(why.to_owned());
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
    // The channel's wake policy: a quiet post wakes only those it mentions.
    let quieted = quiet.filter(|_| !recipient.mentioned);
    if idle && !ack_only && quieted.is_none() {
        if sender == AccountKind::Agent
            && let Verdict::Hold { tell } = loop_guard()
        {
            return Route::LoopHeld { tell };
        }
        return Route::Woke { runner };
    }
    let reason = match (idle, ack_only, quieted) {
        (true, true, _) => Some("an acknowledgement: delivered at its next turn, without waking it".into()),
        (true, false, Some(why)) => Some(why.to_owned()),
        _ => None,
    };
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
        RecipientFacts { state: AccountState::Active, presence, runner: runner.map(|_| &*R), mentioned, budget: None }
    }

    fn never() -> Verdict {
        panic!("the loop guard was asked for a wake that is not one")
    }

    #[test]
    fn each_recipient_gets_the_route_its_state_calls_for() {
        let op = AccountKind::Operator;
        let despawned = RecipientFacts { state: AccountState::Despawned, ..facts(Presence::Idle, Some("r"), false) };
        assert_eq!(route(op, despawned, false, None, never), Route::Refused("despawned".into()));
        assert!(
            matches!(route(op, facts(Presence::Offline, None, true), false, None, never), Route::Held(why) if why.starts_with("offline"))
        );
        let crashed = RecipientFacts { state: AccountState::Crashed, ..facts(Presence::Crashed, None, false) };
        assert!(matches!(route(op, crashed, false, None, never), Route::Held(why) if why.starts_with("crashed")));
        assert_eq!(
            route(op, facts(Presence::Working, Some("r"), true), false, None, never),
            Route::Steer { runner: R.clone() }
        );
        assert_eq!(
            route(op, facts(Presence::Stalled, Some("r"), true), false, None, never),
            Route::Steer { runner: R.clone() }
        );
        assert_eq!(
            route(op, facts(Presence::Working, Some("r"), false), false, None, never),
            Route::Queued { runner: R.clone(), reason: None }
        );
        assert_eq!(
            route(op, facts(Presence::Idle, Some("r"), false), false, None, never),
            Route::Woke { runner: R.clone() }
        );
        assert!(matches!(
            route(op, facts(Presence::Idle, Some("r"), true), true, None, never),
            Route::Queued { reason: Some(_), .. }
        ));
        // A spent budget holds even a mention to a working agent: no steer, no wake.
        let spent = RecipientFacts { budget: Some("budget: spent"), ..facts(Presence::Working, Some("r"), true) };
        assert_eq!(route(op, spent, false, None, never), Route::Held("budget: spent".into()));
        let idle = RecipientFacts { budget: Some("budget: spent"), ..facts(Presence::Idle, Some("r"), false) };
        assert_eq!(route(AccountKind::Agent, idle, false, None, never), Route::Held("budget: spent".into()));
    }

    #[test]
    fn only_an_agent_s_wakes_pass_the_loop_guard() {
        let idle = facts(Presence::Idle, Some("r"), false);
        let held = route(AccountKind::Agent, idle, false, None, || Verdict::Hold { tell: true });
        assert_eq!(held, Route::LoopHeld { tell: true });
        assert_eq!(route(AccountKind::Agent, idle, false, None, || Verdict::Wake), Route::Woke { runner: R.clone() });
        assert_eq!(route(AccountKind::Operator, idle, false, None, never), Route::Woke { runner: R.clone() });
    }

    fn recipient(handle: &'static str, presence: Presence, mentioned: bool) -> PlanRecipient<'static> {
        PlanRecipient { handle, facts: facts(presence, (presence != Presence::Offline).then_some("r"), mentioned) }
    }

    const LIMITS: LoopLimits = LoopLimits { wakes: 2, window: Duration::from_secs(60) };

    #[test]
    fn a_plan_groups_doorbells_by_runner_and_settles_steers() {
        let recipients = [
            recipient("idle", Presence::Idle, false),
            recipient("busy", Presence::Working, false),
            recipient("asked", Presence::Working, true),
            recipient("away", Presence::Offline, false),
        ];
        let guard = LoopGuard::default();
        let mut plan = plan(("ops", AccountKind::Operator), &recipients, false, None, &guard, LIMITS, Instant::now());
        assert_eq!(plan.steers, [(2, R.clone())]);
        assert_eq!(plan.doorbells.get(&*R).cloned().unwrap(), ["idle", "busy"]);
        plan.refuse("stranger", "not subscribed to #general".into());
        plan.steer_failed("asked", R.clone(), "the turn ended");
        assert_eq!(plan.doorbells.get(&*R).cloned().unwrap(), ["idle", "busy", "asked"], "a failed steer rings");
        let (outcomes, counts) = plan.finish(&HashSet::new());
        let got: Vec<(&str, Outcome)> = outcomes.iter().map(|o| (o.recipient.as_str(), o.outcome)).collect();
        assert_eq!(
            got,
            [
                ("idle", Outcome::Woke),
                ("busy", Outcome::Queued),
                ("away", Outcome::Held),
                ("stranger", Outcome::Refused),
                ("asked", Outcome::Queued)
            ],
            "steers settle last, after they return"
        );
        assert_eq!(counts, OutcomeCounts { steered: 0, queued: 2, woke: 1, held: 1, refused: 1 });
    }

    #[test]
    fn an_agents_loop_is_held_and_told_once_and_an_operator_post_clears_it() {
        let guard = LoopGuard::default();
        let now = Instant::now();
        let to = [recipient("b", Presence::Idle, false)];
        for _ in 0..2 {
            let woke = plan(("a", AccountKind::Agent), &to, false, None, &guard, LIMITS, now);
            assert_eq!(woke.doorbells.len(), 1);
        }
        let held = plan(("a", AccountKind::Agent), &to, false, None, &guard, LIMITS, now);
        assert_eq!((held.held.as_slice(), held.loop_notices.as_slice()), (&[0][..], &[0][..]));
        assert!(held.doorbells.is_empty(), "a held wake does not ring");
        let again = plan(("a", AccountKind::Agent), &to, false, None, &guard, LIMITS, now);
        assert!(again.loop_notices.is_empty(), "the operator is told once");
        plan(("ops", AccountKind::Operator), &to, false, None, &guard, LIMITS, now);
        let after = plan(("a", AccountKind::Agent), &to, false, None, &guard, LIMITS, now);
        assert!(after.held.is_empty(), "an operator's post starts the count over");
    }

    #[test]
    fn a_large_posts_outcomes_list_only_the_mentioned_and_refused() {
        let handles: Vec<String> = (0..150).map(|i| format!("a{i}")).collect();
        let recipients: Vec<PlanRecipient<'_>> = handles
            .iter()
            .enumerate()
            .map(|(i, h)| PlanRecipient { handle: h, facts: facts(Presence::Idle, Some("r"), i == 7) })
            .collect();
        let guard = LoopGuard::default();
        let mut plan = plan(("ops", AccountKind::Operator), &recipients, false, None, &guard, LIMITS, Instant::now());
        plan.refuse("outsider", "not subscribed".into());
        let (outcomes, counts) = plan.finish(&HashSet::from(["a7"]));
        let listed: Vec<&str> = outcomes.iter().map(|o| o.recipient.as_str()).collect();
        assert_eq!(listed, ["a7", "outsider"]);
        assert_eq!((counts.woke, counts.refused), (150, 1), "the counts cover everyone");
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
