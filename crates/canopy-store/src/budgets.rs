//! Budgets: each agent's own and subtree budget with its spend in the current window, kept
//! by the writer as usage is recorded (so no check sums history), the 80% and 100% notices,
//! renewal when a period passes, role defaults, and what a spawn proposal may carve.
//!
//! A budget row holds its limits, its window and the spend charged to it in that window.
//! Every usage row charges the budgets that cover its agent (`covering`): the agent's own
//! (a run's spend also charges its Manager's own), and the subtree budgets of it and every
//! ancestor. A budget set, re-periodised or moved in the tree is recomputed from the dollars
//! and tokens each usage row in its window was charged at, so a lifetime budget counts only usage inside `[retention] usage`.
//! Does not decide when a turn may start (the daemon holds from `holds`) or word anything
//! (`canopy_core::budget::say`).

use std::collections::HashMap;

use canopy_core::acl::{Caller, require_operator};
use canopy_core::budget::{self, Amount, Level, Scope, Spent, say};
use canopy_core::{BudgetMark, BudgetStatus, Error, Handle, Message};
use rusqlite::{OptionalExtension, params};

use crate::schema::audit;
use crate::views::require_account;
use crate::{Db, rfc3339, sql};

/// What an unreported turn counts as, and what a report without a cost counts as in dollars.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Estimate {
    pub usd: f64,
    pub tokens: u64,
}

/// A role's default budget (`[budgets.roles.<role>]`).
#[derive(Debug, Clone, PartialEq)]
pub struct RoleBudget {
    pub role: String,
    pub scope: Scope,
    pub amount: Amount,
    pub period_ms: Option<i64>,
}

/// One stored budget.
#[derive(Debug, Clone)]
struct Row {
    id: i64,
    agent_id: i64,
    owner: String,
    /// Where its notices go: the owner's, or for a run's budget its Manager's.
    notice_to: i64,
    scope: Scope,
    limit: Amount,
    period_ms: Option<i64>,
    anchor_ms: i64,
    window_start: i64,
    spent: Spent,
    warned: u8,
    source: String,
}

impl Row {
    /// The spend in the window `now` is in: nothing once the stored window has passed.
    fn spent_at(&self, now: i64) -> Spent {
        match budget::window_start(self.anchor_ms, self.period_ms, now) == self.window_start {
            true => self.spent,
            false => Spent::default(),
        }
    }

    fn renews_at(&self, now: i64) -> Option<i64> {
        self.period_ms.map(|p| budget::window_start(self.anchor_ms, self.period_ms, now) + p)
    }

    fn period(&self) -> Option<String> {
        self.period_ms.map(|p| humantime::format_duration(std::time::Duration::from_millis(p as u64)).to_string())
    }

    fn words(&self, now: i64) -> (String, String) {
        let spent = say::spend(self.limit, self.spent_at(now));
        let renews = self.renews_at(now).map(rfc3339);
        (spent, say::window(self.period().as_deref(), renews.as_deref()))
    }
}

const SELECT: &str = "SELECT b.id, b.agent_id, a.handle, COALESCE(a.run_of, a.id), b.scope, b.usd, b.tokens, \
     b.period_ms, b.anchor_ms, b.window_start, b.spent_usd, b.spent_tokens, b.warned, b.source FROM budgets b \
     JOIN accounts a ON a.id = b.agent_id";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    let scope: String = r.get(4)?;
    Ok(Row {
        id: r.get(0)?,
        agent_id: r.get(1)?,
        owner: r.get(2)?,
        notice_to: r.get(3)?,
        scope: Scope::parse(&scope).unwrap_or(Scope::Agent),
        limit: Amount { usd: r.get(5)?, tokens: r.get::<_, Option<i64>>(6)?.map(|t| t.max(0) as u64) },
        period_ms: r.get(7)?,
        anchor_ms: r.get(8)?,
        window_start: r.get(9)?,
        spent: Spent { usd: r.get(10)?, tokens: r.get::<_, i64>(11)?.max(0) as u64 },
        warned: r.get::<_, i64>(12)?.clamp(0, 100) as u8,
        source: r.get(13)?,
    })
}

fn all(conn: &Db<'_>) -> Result<Vec<Row>, Error> {
    conn.prepare_cached(&format!("{SELECT} ORDER BY a.handle, b.scope"))
        .and_then(|mut s| s.query_map([], row)?.collect())
        .map_err(sql("reading budgets"))
}

/// The ids of the agents a budget covers: for an agent budget, the agent and its runs; for
/// a subtree budget, the agent, its descendants and all their runs.
fn covered_ids(conn: &Db<'_>, agent_id: i64, scope: Scope) -> Result<Vec<i64>, Error> {
    let query = match scope {
        Scope::Agent => "SELECT id FROM accounts WHERE id = ?1 OR run_of = ?1",
        Scope::Subtree => {
            "WITH RECURSIVE down(id) AS (SELECT ?1 UNION SELECT a.id FROM accounts a JOIN down ON a.parent_id = down.id) \
             SELECT id FROM accounts WHERE id IN down OR run_of IN down"
        }
    };
    conn.prepare_cached(query)
        .and_then(|mut s| s.query_map(params![agent_id], |r| r.get(0))?.collect())
        .map_err(sql("listing who a budget covers"))
}

/// The budgets a charge to `agent_id` counts against.
fn covering(conn: &Db<'_>, agent_id: i64) -> Result<Vec<i64>, Error> {
    conn.prepare_cached(
        "WITH RECURSIVE up(id) AS (SELECT ?1 UNION SELECT COALESCE(a.run_of, a.parent_id) FROM accounts a \
         JOIN up ON a.id = up.id WHERE COALESCE(a.run_of, a.parent_id) IS NOT NULL) \
         SELECT b.id FROM budgets b WHERE (b.scope = 'subtree' AND b.agent_id IN up) OR (b.scope = 'agent' AND \
         (b.agent_id = ?1 OR b.agent_id = (SELECT run_of FROM accounts WHERE id = ?1)))",
    )
    .and_then(|mut s| s.query_map(params![agent_id], |r| r.get(0))?.collect())
    .map_err(sql("finding the budgets that cover an agent"))
}

fn load(conn: &Db<'_>, id: i64) -> Result<Row, Error> {
    conn.prepare_cached(&format!("{SELECT} WHERE b.id = ?1"))
        .and_then(|mut s| s.query_row(params![id], row))
        .map_err(sql("reading a budget"))
}

/// What a charge produced: notices to post, and whether a level changed (a hold, a mark).
#[derive(Debug, Default)]
pub struct Charged {
    pub notices: Vec<Message>,
    pub changed: bool,
}

/// Charges `spent` (negative when an estimate is replaced) to every budget covering
/// `agent_id`, renewing windows that passed, and posts the 80% and 100% notices due.
pub(crate) fn charge(conn: &Db<'_>, agent_id: i64, usd: f64, tokens: i64, out: &mut Charged) -> Result<(), Error> {
    let now = conn.now_ms();
    for id in covering(conn, agent_id)? {
        let mut b = load(conn, id)?;
        let before = budget::level(b.limit, b.spent_at(now));
        let start = budget::window_start(b.anchor_ms, b.period_ms, now);
        if start != b.window_start {
            (b.window_start, b.spent, b.warned) = (start, Spent::default(), 0);
        }
        b.spent.usd = (b.spent.usd + usd).max(0.0);
        b.spent.tokens = (b.spent.tokens as i64).saturating_add(tokens).max(0) as u64;
        let after = budget::level(b.limit, b.spent);
        let due = (usd > 0.0 || tokens > 0).then(|| budget::warning_due(b.warned, after)).flatten();
        if let Some(mark) = due {
            b.warned = mark;
            let (spent, window) = b.words(now);
            let body = say::warning(&b.owner, b.scope, after, &spent, &window);
            out.notices.push(crate::notices::notice(conn, b.notice_to, &body)?);
        }
        out.changed |= before != after;
        conn.prepare_cached(
            "UPDATE budgets SET window_start = ?2, spent_usd = ?3, spent_tokens = ?4, warned = ?5 WHERE id = ?1",
        )
        .and_then(|mut s| s.execute(params![id, b.window_start, b.spent.usd, b.spent.tokens as i64, b.warned]))
        .map_err(sql("charging a budget"))?;
    }
    Ok(())
}

/// Recomputes a budget's spend from the usage rows in its window (after it is set, its
/// period changes, or the tree moves under it).
fn recompute(conn: &Db<'_>, id: i64) -> Result<(), Error> {
    let b = load(conn, id)?;
    let ids = covered_ids(conn, b.agent_id, b.scope)?;
    let (mut usd, mut tokens) = (0.0f64, 0i64);
    let mut sum = conn
        .prepare_cached(
            "SELECT COALESCE(SUM(charged_usd), 0), COALESCE(SUM(input_tokens + cache_write_tokens + output_tokens), 0) \
             FROM usage WHERE agent_id = ?1 AND at >= ?2",
        )
        .map_err(sql("summing a budget's usage"))?;
    for agent in ids {
        let (u, t): (f64, i64) = sum
            .query_row(params![agent, b.window_start], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(sql("summing a budget's usage"))?;
        usd += u;
        tokens += t;
    }
    let warned = budget::warned_mark(budget::level(b.limit, Spent { usd, tokens: tokens.max(0) as u64 }));
    // Set or moved, it says nothing of what it had already passed; later crossings are told.
    conn.execute(
        "UPDATE budgets SET spent_usd = ?2, spent_tokens = ?3, warned = MIN(warned, ?4) WHERE id = ?1",
        params![id, usd, tokens, warned],
    )
    .map_err(sql("recomputing a budget"))?;
    Ok(())
}

/// Recomputes every subtree budget (the tree moved).
pub(crate) fn recompute_subtrees(conn: &Db<'_>) -> Result<(), Error> {
    let ids: Vec<i64> = conn
        .prepare_cached("SELECT id FROM budgets WHERE scope = 'subtree'")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("listing subtree budgets"))?;
    ids.into_iter().try_for_each(|id| recompute(conn, id))
}

/// Inserts or replaces a budget; an unchanged period keeps its window, a new one starts at
/// `now` (a lifetime budget's window starts at the epoch: all retained usage counts).
fn upsert(
    conn: &Db<'_>,
    agent_id: i64,
    scope: Scope,
    amount: Amount,
    period_ms: Option<i64>,
    source: &str,
) -> Result<i64, Error> {
    let now = conn.now_ms();
    let existing: Option<(i64, Option<i64>)> = conn
        .query_row(
            "SELECT id, period_ms FROM budgets WHERE agent_id = ?1 AND scope = ?2",
            params![agent_id, scope.as_str()],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(sql("reading a budget"))?;
    let tokens = amount.tokens.map(|t| t as i64);
    match existing {
        Some((id, period)) if period == period_ms => {
            conn.execute(
                "UPDATE budgets SET usd = ?2, tokens = ?3, source = ?4, set_at = ?5 WHERE id = ?1",
                params![id, amount.usd, tokens, source, now],
            )
            .map_err(sql("updating a budget"))?;
            // Raised, it may warn again at the new 80% and 100%.
            let b = load(conn, id)?;
            let warned = budget::warned_mark(budget::level(b.limit, b.spent_at(now)));
            conn.execute("UPDATE budgets SET warned = MIN(warned, ?2) WHERE id = ?1", params![id, warned])
                .map_err(sql("updating a budget"))?;
            Ok(id)
        }
        _ => {
            let anchor = if period_ms.is_some() { now } else { 0 };
            conn.execute(
                "INSERT INTO budgets (agent_id, scope, usd, tokens, period_ms, anchor_ms, window_start, warned, source, \
                 set_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, 100, ?7, ?8) ON CONFLICT (agent_id, scope) DO UPDATE SET \
                 usd = excluded.usd, tokens = excluded.tokens, period_ms = excluded.period_ms, anchor_ms = \
                 excluded.anchor_ms, window_start = excluded.window_start, warned = 100, source = excluded.source, \
                 set_at = excluded.set_at",
                params![agent_id, scope.as_str(), amount.usd, tokens, period_ms, anchor, source, now],
            )
            .map_err(sql("storing a budget"))?;
            let id: i64 = conn
                .query_row(
                    "SELECT id FROM budgets WHERE agent_id = ?1 AND scope = ?2",
                    params![agent_id, scope.as_str()],
                    |r| r.get(0),
                )
                .map_err(sql("reading a budget"))?;
            recompute(conn, id)?;
            Ok(id)
        }
    }
}

/// `agents.budget`: sets (or with no amount, clears) an agent's own or subtree budget.
pub fn set_budget(
    conn: &Db<'_>,
    caller: &Caller,
    handle: &Handle,
    scope: Scope,
    amount: Amount,
    period_ms: Option<i64>,
) -> Result<Option<BudgetStatus>, Error> {
    require_operator(caller, "set a budget")?;
    let account = require_account(conn, "handle", handle.as_str())?;
    if account.kind != canopy_core::AccountKind::Agent {
        return Err(Error::invalid("handle", format!("{handle} is not an agent")));
    }
    amount.check("usd", "tokens")?;
    if let Some(p) = period_ms {
        budget::check_period(p)?;
    }
    let caller_id = require_account(conn, "caller", caller.handle.as_str())?.id;
    if amount.is_empty() {
        conn.execute("DELETE FROM budgets WHERE agent_id = ?1 AND scope = ?2", params![account.id, scope.as_str()])
            .map_err(sql("clearing a budget"))?;
        audit(conn, Some(caller_id), "agents.budget", handle.as_str(), &format!("cleared {scope} budget"))?;
        return Ok(None);
    }
    let id = upsert(conn, account.id, scope, amount, period_ms, "operator")?;
    let b = load(conn, id)?;
    let (spent, window) = b.words(conn.now_ms());
    audit(conn, Some(caller_id), "agents.budget", handle.as_str(), &format!("{scope} budget {spent}, {window}"))?;
    Ok(Some(status(conn, &b)?))
}

/// Brings role-default budgets in line with `[budgets.roles]`: every agent and run of a
/// role with a default and no budget of that scope set otherwise gets it; defaults that
/// changed are updated; those no longer configured are removed.
pub fn sync_role_budgets(conn: &Db<'_>, defaults: &[RoleBudget]) -> Result<(), Error> {
    let stale: Vec<(i64, String, String)> = conn
        .prepare_cached(
            "SELECT b.id, a.role, b.scope FROM budgets b JOIN accounts a ON a.id = b.agent_id WHERE b.source = 'role'",
        )
        .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect())
        .map_err(sql("reading role budgets"))?;
    for (id, role, scope) in stale {
        if !defaults.iter().any(|d| d.role == role && d.scope.as_str() == scope) {
            conn.execute("DELETE FROM budgets WHERE id = ?1", params![id]).map_err(sql("removing a role budget"))?;
        }
    }
    for d in defaults {
        let tokens = d.amount.tokens.map(|t| t as i64);
        // Agents of the role with no budget of the scope, or a role one that changed.
        let due: Vec<i64> = conn
            .prepare_cached(
                "SELECT a.id FROM accounts a LEFT JOIN budgets b ON b.agent_id = a.id AND b.scope = ?2 \
                 WHERE a.kind = 'agent' AND a.role = ?1 AND a.state != 'despawned' AND (b.id IS NULL OR \
                 (b.source = 'role' AND (b.period_ms IS NOT ?3 OR b.usd IS NOT ?4 OR b.tokens IS NOT ?5)))",
            )
            .and_then(|mut s| {
                s.query_map(params![d.role, d.scope.as_str(), d.period_ms, d.amount.usd, tokens], |r| r.get(0))?
                    .collect()
            })
            .map_err(sql("listing a role's agents"))?;
        for agent in due {
            upsert(conn, agent, d.scope, d.amount, d.period_ms, "role")?;
        }
    }
    Ok(())
}

fn status(conn: &Db<'_>, b: &Row) -> Result<BudgetStatus, Error> {
    let now = conn.now_ms();
    let spent = b.spent_at(now);
    let carved = match b.scope {
        Scope::Subtree => carved(conn, b, now)?,
        Scope::Agent => Spent::default(),
    };
    Ok(BudgetStatus {
        owner: Handle::from_trusted(b.owner.clone()),
        scope: b.scope,
        limit: b.limit,
        spent,
        left: budget::remaining(b.limit, spent, carved),
        period: b.period(),
        window_start: rfc3339(budget::window_start(b.anchor_ms, b.period_ms, now)),
        renews_at: b.renews_at(now).map(rfc3339),
        level: budget::level(b.limit, spent),
        percent: percent(b.limit, spent),
        source: b.source.clone(),
    })
}

fn percent(limit: Amount, spent: Spent) -> u32 {
    (budget::fraction(limit, spent) * 100.0).floor().clamp(0.0, 1e6) as u32
}

/// The unspent part of the nearest subtree budgets below `b` (each child's allotment).
fn carved(conn: &Db<'_>, b: &Row, now: i64) -> Result<Spent, Error> {
    // Subtree budgets strictly below the owner, with the depth of their owners.
    let below: Vec<(i64, i64)> = conn
        .prepare_cached(
            "WITH RECURSIVE down(id, depth) AS (SELECT ?1, 0 UNION SELECT a.id, down.depth + 1 FROM accounts a \
             JOIN down ON a.parent_id = down.id) SELECT b.id, down.depth FROM budgets b JOIN down ON down.id = b.agent_id \
             WHERE b.scope = 'subtree' AND down.depth > 0",
        )
        .and_then(|mut s| s.query_map(params![b.agent_id], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .map_err(sql("listing the budgets below one"))?;
    let rows: Vec<Row> = below.iter().map(|(id, _)| load(conn, *id)).collect::<Result<_, _>>()?;
    let owners: std::collections::HashSet<i64> = rows.iter().map(|r| r.agent_id).collect();
    let mut total = Spent::default();
    for child in &rows {
        // Only the nearest: one nested inside another budgeted subtree is that one's to give.
        let mut parent = parent_of(conn, child.agent_id)?;
        let mut nested = false;
        while let Some(p) = parent {
            if p == b.agent_id {
                break;
            }
            if owners.contains(&p) {
                nested = true;
                break;
            }
            parent = parent_of(conn, p)?;
        }
        if nested {
            continue;
        }
        let spent = child.spent_at(now);
        if let Some(usd) = child.limit.usd {
            total.usd += (usd - spent.usd).max(0.0);
        }
        if let Some(tokens) = child.limit.tokens {
            total.tokens += tokens.saturating_sub(spent.tokens);
        }
    }
    Ok(total)
}

fn parent_of(conn: &Db<'_>, id: i64) -> Result<Option<i64>, Error> {
    conn.prepare_cached("SELECT parent_id FROM accounts WHERE id = ?1")
        .and_then(|mut s| s.query_row(params![id], |r| r.get(0)).optional())
        .map(Option::flatten)
        .map_err(sql("reading a parent"))
}

/// Every budget with its current window, for `canopy usage` (optionally those covering or
/// owned by one agent).
pub fn budgets(conn: &Db<'_>) -> Result<Vec<BudgetStatus>, Error> {
    all(conn)?.iter().map(|b| status(conn, b)).collect()
}

/// The budgets that cover one agent: those its usage is charged to.
pub fn covering_budgets(conn: &Db<'_>, handle: &str) -> Result<Vec<BudgetStatus>, Error> {
    let account = require_account(conn, "handle", handle)?;
    covering(conn, account.id)?.into_iter().map(|id| status(conn, &load(conn, id)?)).collect()
}

/// Checks a spawn proposal against the nearest subtree budget covering the requester;
/// returns the period the child's budget gets (the one it is carved from, else lifetime).
pub(crate) fn check_proposal(conn: &Db<'_>, requester_id: i64, proposed: Amount) -> Result<Option<i64>, Error> {
    proposed.check("budget_usd", "budget_tokens")?;
    let now = conn.now_ms();
    let mut at = Some(requester_id);
    while let Some(id) = at {
        let found: Option<i64> = conn
            .query_row("SELECT id FROM budgets WHERE agent_id = ?1 AND scope = 'subtree'", params![id], |r| r.get(0))
            .optional()
            .map_err(sql("reading a subtree budget"))?;
        if let Some(budget_id) = found {
            let b = load(conn, budget_id)?;
            let left = budget::remaining(b.limit, b.spent_at(now), carved(conn, &b, now)?);
            budget::check_fit(&b.owner, proposed, left)?;
            return Ok(b.period_ms);
        }
        at = parent_of(conn, id)?;
    }
    Ok(None)
}

/// Gives an approved child the subtree budget its request proposed.
pub(crate) fn grant(conn: &Db<'_>, child_id: i64, amount: Amount, period_ms: Option<i64>) -> Result<(), Error> {
    upsert(conn, child_id, Scope::Subtree, amount, period_ms, "spawn").map(|_| ())
}

/// Renews the budgets whose window passed; returns how many did.
pub fn renew(conn: &Db<'_>) -> Result<usize, Error> {
    let now = conn.now_ms();
    let mut renewed = 0;
    for b in all(conn)? {
        let start = budget::window_start(b.anchor_ms, b.period_ms, now);
        if start != b.window_start {
            conn.execute(
                "UPDATE budgets SET window_start = ?2, spent_usd = 0, spent_tokens = 0, warned = 0 WHERE id = ?1",
                params![b.id, start],
            )
            .map_err(sql("renewing a budget"))?;
            renewed += 1;
        }
    }
    Ok(renewed)
}

/// Who is held by a spent budget, with why, and each covered agent's mark at 80% or more
/// (the highest, for an agent several budgets cover).
#[derive(Debug, Default, Clone)]
pub struct Holds {
    pub held: HashMap<String, String>,
    pub marks: HashMap<String, BudgetMark>,
}

pub fn holds(conn: &Db<'_>) -> Result<Holds, Error> {
    let now = conn.now_ms();
    let mut out = Holds::default();
    for b in all(conn)? {
        let spent = b.spent_at(now);
        let level = budget::level(b.limit, spent);
        if level == Level::Under {
            continue;
        }
        let mark = BudgetMark {
            level,
            percent: percent(b.limit, spent),
            owner: Handle::from_trusted(b.owner.clone()),
            scope: b.scope,
        };
        let reason = (level == Level::Over).then(|| {
            let (spent, window) = b.words(now);
            say::held(&b.owner, b.scope, &spent, &window)
        });
        let mut handles = conn
            .prepare_cached("SELECT handle FROM accounts WHERE id = ?1 AND state != 'despawned'")
            .map_err(sql("naming who a budget covers"))?;
        for id in covered_ids(conn, b.agent_id, b.scope)? {
            let Some(handle) =
                handles.query_row(params![id], |r| r.get::<_, String>(0)).optional().map_err(sql("naming an agent"))?
            else {
                continue;
            };
            if let Some(reason) = &reason {
                out.held.entry(handle.clone()).or_insert_with(|| reason.clone());
            }
            let better = out.marks.get(&handle).is_none_or(|m| m.percent < mark.percent);
            if better {
                out.marks.insert(handle, mark.clone());
            }
        }
    }
    for (handle, reason) in crate::issues::held_runs(conn)? {
        out.held.entry(handle).or_insert(reason);
    }
    Ok(out)
}
