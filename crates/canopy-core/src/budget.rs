//! Budgets as pure rules: an amount (US dollars and/or tokens) over a period or a lifetime,
//! the window a time falls in, how far a spend has gone (under, near at 80%, over at 100%),
//! which warning a charge makes due (each once per window), what a spawn proposal may carve
//! from the budget above it, and the words Canopy says about each.
//!
//! A budget covers an agent (`Scope::Agent`: its own turns and its subagent runs) or a
//! subtree (`Scope::Subtree`: the agent, every descendant, and all their runs). Does not
//! read spend or decide who is covered: the store sums, the daemon holds.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Error;

/// Largest dollar amount a budget may hold.
pub const MAX_USD: f64 = 1e9;
/// Largest token amount a budget may hold.
pub const MAX_TOKENS: u64 = 1_000_000_000_000_000;
/// Shortest period: below a minute, a window rolls over before a turn ends.
pub const MIN_PERIOD_MS: i64 = 60_000;
/// Longest period: a hundred years (longer is a lifetime).
pub const MAX_PERIOD_MS: i64 = 100 * 365 * 86_400_000;

/// What a budget covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The agent's own turns and its subagent runs.
    Agent,
    /// The agent, its descendants, and all their runs.
    Subtree,
}
crate::macros::string_enum!(Scope { Agent => "agent", Subtree => "subtree" });

/// The amounts of a budget, or what remains of one: either or both may be set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Amount {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
}

impl Amount {
    /// Refuses amounts that are not positive, not finite or past the caps; `field` prefixes
    /// the field named (`budget_` for a spawn request's proposal).
    pub fn check(&self, usd_field: &'static str, tokens_field: &'static str) -> Result<(), Error> {
        if let Some(usd) = self.usd
            && !(usd.is_finite() && usd > 0.0 && usd <= MAX_USD)
        {
            return Err(Error::invalid(usd_field, format!("a budget is more than $0 and at most ${MAX_USD}")));
        }
        if let Some(tokens) = self.tokens
            && !(1..=MAX_TOKENS).contains(&tokens)
        {
            return Err(Error::invalid(tokens_field, format!("a budget is 1 to {MAX_TOKENS} tokens")));
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.usd.is_none() && self.tokens.is_none()
    }
}

/// What has been spent in a window. Tokens are fresh input, cache writes and output; cache
/// reads repeat context already paid for and are priced, not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Spent {
    pub usd: f64,
    pub tokens: u64,
}

/// Checks a period: at least a minute (a shorter one rolls over inside a turn), at most a
/// hundred years.
pub fn check_period(period_ms: i64) -> Result<(), Error> {
    if !(MIN_PERIOD_MS..=MAX_PERIOD_MS).contains(&period_ms) {
        return Err(Error::invalid("period", "a budget's period is 1m to 100years (or `lifetime`)"));
    }
    Ok(())
}

/// The start of the window `now_ms` falls in: windows are `period_ms` long from `anchor_ms`
/// (when the budget was set); a lifetime budget has one window from its anchor.
pub fn window_start(anchor_ms: i64, period_ms: Option<i64>, now_ms: i64) -> i64 {
    match period_ms {
        Some(p) if p > 0 && now_ms > anchor_ms => anchor_ms + (now_ms - anchor_ms) / p * p,
        _ => anchor_ms,
    }
}

/// How far a spend has gone: the larger of its dollar and token fractions.
pub fn fraction(limit: Amount, spent: Spent) -> f64 {
    let usd = limit.usd.map(|l| spent.usd / l).unwrap_or(0.0);
    let tokens = limit.tokens.map(|l| spent.tokens as f64 / l as f64).unwrap_or(0.0);
    usd.max(tokens)
}

/// A spend's level against its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Under,
    /// At 80% or more.
    Near,
    /// At 100% or more: nothing new starts.
    Over,
}

/// Where warnings start.
pub const NEAR: f64 = 0.8;

pub fn level(limit: Amount, spent: Spent) -> Level {
    let f = fraction(limit, spent);
    match f {
        f if f >= 1.0 => Level::Over,
        f if f >= NEAR => Level::Near,
        _ => Level::Under,
    }
}

/// The warning a window has reached (0, 80 or 100), as stored per window.
pub fn warned_mark(level: Level) -> u8 {
    match level {
        Level::Under => 0,
        Level::Near => 80,
        Level::Over => 100,
    }
}

/// The warnings due after a charge moved the spend to `now`, given the mark already told
/// this window: 80 and then 100, each once (a charge past both at once says 100 only).
pub fn warning_due(told: u8, now: Level) -> Option<u8> {
    let mark = warned_mark(now);
    (mark > told).then_some(mark)
}

/// What a budget still has, after what was spent and what its children were given
/// (`carved`: the unspent part of each child's own subtree budget).
pub fn remaining(limit: Amount, spent: Spent, carved: Spent) -> Amount {
    Amount {
        usd: limit.usd.map(|l| (l - spent.usd - carved.usd).max(0.0)),
        tokens: limit.tokens.map(|l| l.saturating_sub(spent.tokens).saturating_sub(carved.tokens)),
    }
}

/// Whether a proposed child budget fits what remains of the budget it is carved from;
/// refused naming the remaining amount. A proposal names what it carves: a dollar
/// proposal from a budget with dollars, tokens from one with tokens.
pub fn check_fit(owner: &str, proposed: Amount, left: Amount) -> Result<(), Error> {
    let short = |what: String| {
        Err(Error::LimitExceeded(format!(
            "the proposed budget does not fit: @{owner}'s subtree budget has {what} left to give; propose at most that"
        )))
    };
    if let (Some(want), Some(have)) = (proposed.usd, left.usd)
        && want > have + 1e-9
    {
        return short(format!("${have:.2}"));
    }
    if let (Some(want), Some(have)) = (proposed.tokens, left.tokens)
        && want > have
    {
        return short(format!("{have} tokens"));
    }
    Ok(())
}

/// The words for budgets.
pub mod say {
    use super::{Amount, Level, Scope, Spent};

    /// `$5.00`, `20000 tokens`, or both.
    pub fn amount(a: Amount) -> String {
        let parts: Vec<String> = [a.usd.map(|u| format!("${u:.2}")), a.tokens.map(|t| format!("{t} tokens"))]
            .into_iter()
            .flatten()
            .collect();
        parts.join(" and ")
    }

    /// `$1.20 of $2.00`, `12000 of 50000 tokens`, or both.
    pub fn spend(limit: Amount, spent: Spent) -> String {
        let mut parts = Vec::new();
        if let Some(usd) = limit.usd {
            parts.push(format!("${:.2} of ${usd:.2}", spent.usd));
        }
        if let Some(tokens) = limit.tokens {
            parts.push(format!("{} of {tokens} tokens", spent.tokens));
        }
        parts.join(", ")
    }

    /// `this 1day` or `its lifetime`, with the renewal time when there is one.
    pub fn window(period: Option<&str>, renews: Option<&str>) -> String {
        match (period, renews) {
            (Some(p), Some(at)) => format!("this {p} period, renews {at}"),
            (Some(p), None) => format!("this {p} period"),
            _ => "its lifetime".to_owned(),
        }
    }

    fn whose(owner: &str, scope: Scope) -> String {
        match scope {
            Scope::Agent => format!("@{owner}'s budget"),
            Scope::Subtree => format!("the budget of @{owner}'s subtree"),
        }
    }

    /// The home-channel notice at 80% or 100%.
    pub fn warning(owner: &str, scope: Scope, level: Level, spent: &str, window: &str) -> String {
        let whose = whose(owner, scope);
        match level {
            Level::Over => format!(
                "Budget: {whose} is spent ({spent}, {window}). No turn, steer or subagent run starts for what it \
                 covers; messages are held, not dropped, and delivered when the operator raises it \
                 (`canopy agents budget {owner}`) or the period renews."
            ),
            _ => format!("Budget: {whose} is at 80% ({spent}, {window}). At 100% its turns are held."),
        }
    }

    /// Why a recipient is held: the budget that holds it.
    pub fn held(owner: &str, scope: Scope, spent: &str, window: &str) -> String {
        format!("budget: {} is spent ({spent}, {window}); delivered when it is raised or renews", whose(owner, scope))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    const DAY: i64 = 86_400_000;

    #[test]
    fn windows_are_periods_from_the_anchor_and_a_lifetime_is_one() {
        assert_eq!(window_start(1000, Some(DAY), 1000), 1000);
        assert_eq!(window_start(1000, Some(DAY), 1000 + DAY - 1), 1000);
        assert_eq!(window_start(1000, Some(DAY), 1000 + DAY), 1000 + DAY);
        assert_eq!(window_start(1000, Some(DAY), 1000 + 5 * DAY + 7), 1000 + 5 * DAY);
        assert_eq!(window_start(1000, None, 1000 + 50 * DAY), 1000);
        assert_eq!(window_start(1000, Some(DAY), 10), 1000, "a clock behind the anchor stays in the first window");
    }

    #[test]
    fn the_level_is_the_larger_fraction_and_each_warning_is_due_once() {
        let both = Amount { usd: Some(1.0), tokens: Some(1000) };
        assert_eq!(level(both, Spent { usd: 0.5, tokens: 100 }), Level::Under);
        assert_eq!(level(both, Spent { usd: 0.1, tokens: 800 }), Level::Near, "tokens alone reach 80%");
        assert_eq!(level(both, Spent { usd: 1.0, tokens: 0 }), Level::Over);
        assert_eq!(warning_due(0, Level::Under), None);
        assert_eq!(warning_due(0, Level::Near), Some(80));
        assert_eq!(warning_due(80, Level::Near), None, "told once");
        assert_eq!(warning_due(80, Level::Over), Some(100));
        assert_eq!(warning_due(0, Level::Over), Some(100), "past both at once says 100 only");
        assert_eq!(warning_due(100, Level::Over), None);
    }

    #[test]
    fn a_proposal_fits_what_is_left_after_spend_and_what_children_hold() {
        let limit = Amount { usd: Some(10.0), tokens: None };
        let left = remaining(limit, Spent { usd: 2.0, tokens: 0 }, Spent { usd: 3.0, tokens: 0 });
        assert_eq!(left.usd, Some(5.0));
        assert!(check_fit("lead", Amount { usd: Some(5.0), tokens: None }, left).is_ok());
        let err = check_fit("lead", Amount { usd: Some(5.5), tokens: None }, left).unwrap_err();
        assert!(err.to_string().contains("$5.00 left"), "{err}");
        let tokens =
            remaining(Amount { usd: None, tokens: Some(100) }, Spent { usd: 0.0, tokens: 90 }, Spent::default());
        let err = check_fit("lead", Amount { usd: None, tokens: Some(11) }, tokens).unwrap_err();
        assert!(err.to_string().contains("10 tokens left"), "{err}");
        assert!(
            check_fit("lead", Amount { usd: Some(99.0), tokens: None }, tokens).is_ok(),
            "no dollars to carve from"
        );
        assert_eq!(remaining(limit, Spent { usd: 20.0, tokens: 0 }, Spent::default()).usd, Some(0.0));
    }

    #[test]
    fn amounts_and_periods_are_checked() {
        assert!(Amount { usd: Some(0.0), tokens: None }.check("usd", "tokens").is_err());
        assert!(Amount { usd: Some(f64::NAN), tokens: None }.check("usd", "tokens").is_err());
        assert!(Amount { usd: None, tokens: Some(0) }.check("usd", "tokens").is_err());
        assert!(Amount { usd: Some(2.5), tokens: Some(10) }.check("usd", "tokens").is_ok());
        assert!(check_period(1000).is_err());
        assert!(check_period(i64::MAX).is_err());
        assert!(check_period(DAY).is_ok());
    }

    #[test]
    fn the_words_name_the_spend_and_the_window() {
        let spent = say::spend(Amount { usd: Some(2.0), tokens: Some(50) }, Spent { usd: 1.2, tokens: 12 });
        assert_eq!(spent, "$1.20 of $2.00, 12 of 50 tokens");
        let window = say::window(Some("1day"), Some("2026-12-03T07:00:00Z"));
        let held = say::held("lead", Scope::Subtree, &spent, &window);
        assert!(held.starts_with("budget: the budget of @lead's subtree is spent"), "{held}");
        assert_eq!(say::window(None, None), "its lifetime");
    }
}
