//! Runtime records: token usage per model turn, compaction checkpoints, and retention.
//!
//! Usage rows are written as runners report them, whichever harness produced them (the
//! adapters normalise to one shape), and are summed per turn, per session and per agent
//! on read. Retention deletes activity, checkpoints and usage older than their cut-offs
//! in bounded batches, so one pass never holds the writer for long. Does not decide the
//! periods (configuration) or touch files (transcripts are the daemon's).

use canopy_core::Incarnation;
use canopy_core::{Error, Handle, UsageRow, UsageTotals};
use rusqlite::params;

use crate::budgets::{Charged, Estimate};
use crate::views::require_account;
use crate::{Db, rfc3339, sql};

/// Largest token count stored per report and field.
pub const MAX_TOKENS_PER_REPORT: u64 = 1_000_000_000_000;

/// Tokens and cost one model turn used, as a runner reports it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageReport {
    pub turn_id: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    pub cost_usd: Option<f64>,
    /// The cost was computed from `[pricing]`, not reported.
    pub cost_computed: bool,
}

/// Stores one usage report of a live session, replacing the estimate its turn was charged
/// at its start, and charges the budgets that cover the agent. With `attribute`, the row names
/// its issue (`issues::USAGE_ISSUE`) and a spent issue budget re-reads the holds; without, the
/// benchmark's baseline: the same write with no attribution.
pub(crate) fn record_usage(
    conn: &Db<'_>,
    agent_id: i64,
    incarnation: Incarnation,
    usage: &UsageReport,
    estimate: Estimate,
    charged: &mut Charged,
    attribute: bool,
) -> Result<(), Error> {
    let issue_sql = if attribute { crate::issues::USAGE_ISSUE } else { "NULL" };
    // A trillion tokens per report is past any model call; the cap keeps SUM() from
    // overflowing on a runner's nonsense.
    let clamp = |n: u64| n.min(MAX_TOKENS_PER_REPORT) as i64;
    let cost = usage.cost_usd.filter(|c| c.is_finite() && *c >= 0.0).map(|c| c.min(1e9));
    // The turn's estimate (by its id; without one, the session's newest) gives way.
    let replaced: Vec<(f64, i64)> = conn
        .prepare_cached(
            "DELETE FROM usage WHERE id IN (SELECT id FROM usage WHERE agent_id = ?1 AND incarnation = ?2 AND \
             estimated = 1 AND (turn_id = ?3 OR ?3 IS NULL) ORDER BY id DESC LIMIT 1) \
             RETURNING charged_usd, input_tokens",
        )
        .and_then(|mut s| {
            s.query_map(params![agent_id, incarnation.get() as i64, usage.turn_id], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
        .map_err(sql("replacing a turn's estimate"))?;
    for (usd, tokens) in replaced {
        crate::budgets::charge(conn, agent_id, -usd, -tokens, charged)?;
    }
    // Tokens without a price count at the estimate's dollars: never free.
    let charged_usd = cost.unwrap_or(estimate.usd);
    conn.prepare_cached(&format!(
        "INSERT INTO usage (agent_id, incarnation, turn_id, at, input_tokens, output_tokens, cache_read_tokens, \
             cache_write_tokens, cost_usd, cost_computed, charged_usd, issue) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, \
             ?9, ?10, ?11, {issue_sql})"
    ))
    .and_then(|mut s| {
        s.execute(params![
            agent_id,
            incarnation.get() as i64,
            usage.turn_id,
            conn.now_ms(),
            clamp(usage.input_tokens),
            clamp(usage.output_tokens),
            clamp(usage.cache_read_tokens),
            clamp(usage.cache_write_tokens),
            cost,
            usage.cost_computed && cost.is_some(),
            charged_usd
        ])
    })
    .map_err(sql("storing usage"))?;
    if attribute {
        charged.changed |= crate::issues::last_usage_spent_its_issue(conn)?;
    }
    let tokens = clamp(usage.input_tokens) + clamp(usage.cache_write_tokens) + clamp(usage.output_tokens);
    crate::budgets::charge(conn, agent_id, charged_usd, tokens, charged)
}

/// Charges a turn that just started its estimate, stored as a usage row marked estimated
/// until the turn's own usage replaces it (it stays when none ever arrives).
pub(crate) fn record_estimate(
    conn: &Db<'_>,
    agent_id: i64,
    incarnation: Incarnation,
    turn_id: &str,
    estimate: Estimate,
    charged: &mut Charged,
) -> Result<(), Error> {
    if estimate.usd <= 0.0 && estimate.tokens == 0 {
        return Ok(());
    }
    let tokens = estimate.tokens.min(MAX_TOKENS_PER_REPORT) as i64;
    conn.prepare_cached(
        &format!(
            "INSERT INTO usage (agent_id, incarnation, turn_id, at, input_tokens, output_tokens, cache_read_tokens, \
             cache_write_tokens, cost_usd, cost_computed, estimated, charged_usd, issue) VALUES (?1, ?2, ?3, ?4, ?5, 0, \
             0, 0, ?6, 0, 1, ?6, {})",
            crate::issues::USAGE_ISSUE
        ),
    )
    .and_then(|mut s| {
        s.execute(params![agent_id, incarnation.get() as i64, turn_id, conn.now_ms(), tokens, estimate.usd])
    })
    .map_err(sql("storing a turn's estimate"))?;
    charged.changed |= crate::issues::last_usage_spent_its_issue(conn)?;
    crate::budgets::charge(conn, agent_id, estimate.usd, tokens, charged)
}

/// Records that a session's context was compacted, with the newest message sequence then.
pub(crate) fn record_compaction(conn: &Db<'_>, agent_id: i64, incarnation: Incarnation, now: i64) -> Result<(), Error> {
    conn.prepare_cached(
        "INSERT INTO compactions (agent_id, incarnation, at, seq) \
         VALUES (?1, ?2, ?3, (SELECT COALESCE(MAX(seq), 0) FROM messages))",
    )
    .and_then(|mut s| s.execute(params![agent_id, incarnation.get() as i64, now]))
    .map_err(sql("storing a compaction checkpoint"))?;
    Ok(())
}

/// Usage since a time: per agent, and for one agent also per session and per recent turn.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageView {
    pub total: UsageTotals,
    pub agents: Vec<UsageRow>,
    pub sessions: Vec<UsageRow>,
    pub turns: Vec<UsageRow>,
}

/// Most turns listed for one agent.
const TURNS: i64 = 20;

const SUMS: &str = "SUM(u.input_tokens), SUM(u.output_tokens), SUM(u.cache_read_tokens), SUM(u.cache_write_tokens), \
     SUM(u.cost_usd), COUNT(*), SUM(u.cost_usd IS NULL), MAX(u.at), SUM(u.cost_computed), SUM(u.estimated)";

fn totals(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<(UsageTotals, i64)> {
    let n = |i: usize| r.get::<_, Option<i64>>(at + i).map(|v| v.unwrap_or(0).max(0) as u64);
    Ok((
        UsageTotals {
            input_tokens: n(0)?,
            output_tokens: n(1)?,
            cache_read_tokens: n(2)?,
            cache_write_tokens: n(3)?,
            cost_usd: r.get(at + 4)?,
            reports: n(5)?,
            reports_without_cost: n(6)?,
            reports_with_computed_cost: n(8)?,
            reports_estimated: n(9)?,
        },
        r.get::<_, Option<i64>>(at + 7)?.unwrap_or(0),
    ))
}

/// Sums usage reported since `since_ms` (operators only), optionally for one agent.
pub fn usage(conn: &Db<'_>, agent: Option<&Handle>, since_ms: i64) -> Result<UsageView, Error> {
    let agent_id = agent.map(|h| require_account(conn, "agent", h.as_str()).map(|a| a.id)).transpose()?;
    let row = |r: &rusqlite::Row<'_>, incarnation: bool, turn: bool| -> rusqlite::Result<UsageRow> {
        let (totals, last) = totals(r, 3)?;
        Ok(UsageRow {
            agent: Handle::from_trusted(r.get(0)?),
            incarnation: if incarnation { Some(Incarnation(r.get::<_, i64>(1)? as u64)) } else { None },
            turn_id: if turn { r.get(2)? } else { None },
            last_at: rfc3339(last),
            totals,
        })
    };
    let agents: Vec<UsageRow> = conn
        .prepare_cached(&format!(
            "SELECT a.handle, 0, NULL, {SUMS} FROM usage u JOIN accounts a ON a.id = u.agent_id \
             WHERE u.at >= ?1 AND (?2 IS NULL OR u.agent_id = ?2) GROUP BY u.agent_id \
             ORDER BY SUM(u.input_tokens + u.output_tokens) DESC, a.handle"
        ))
        .and_then(|mut s| s.query_map(params![since_ms, agent_id], |r| row(r, false, false))?.collect())
        .map_err(sql("summing usage per agent"))?;
    let (sessions, turns) = match agent_id {
        None => (Vec::new(), Vec::new()),
        Some(agent_id) => {
            let sessions = conn
                .prepare_cached(&format!(
                    "SELECT a.handle, u.incarnation, NULL, {SUMS} FROM usage u JOIN accounts a ON a.id = u.agent_id \
                     WHERE u.at >= ?1 AND u.agent_id = ?2 GROUP BY u.incarnation ORDER BY u.incarnation DESC"
                ))
                .and_then(|mut s| s.query_map(params![since_ms, agent_id], |r| row(r, true, false))?.collect())
                .map_err(sql("summing usage per session"))?;
            let turns = conn
                .prepare_cached(&format!(
                    "SELECT a.handle, u.incarnation, u.turn_id, {SUMS} FROM usage u JOIN accounts a ON a.id = u.agent_id \
                     WHERE u.at >= ?1 AND u.agent_id = ?2 GROUP BY u.incarnation, COALESCE(u.turn_id, u.id) \
                     ORDER BY MAX(u.id) DESC LIMIT ?3"
                ))
                .and_then(|mut s| s.query_map(params![since_ms, agent_id, TURNS], |r| row(r, true, true))?.collect())
                .map_err(sql("summing usage per turn"))?;
            (sessions, turns)
        }
    };
    let total = conn
        .prepare_cached(&format!(
            "SELECT NULL, NULL, NULL, {SUMS} FROM usage u WHERE u.at >= ?1 AND (?2 IS NULL OR u.agent_id = ?2)"
        ))
        .and_then(|mut s| s.query_row(params![since_ms, agent_id], |r| totals(r, 3).map(|(t, _)| t)))
        .map_err(sql("summing usage"))?;
    Ok(UsageView { total, agents, sessions, turns })
}

/// Most rows one retention pass deletes from each table.
pub const PRUNE_BATCH: i64 = 5000;

/// What a retention pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub activity: u64,
    pub compactions: u64,
    pub usage: u64,
}

/// Deletes activity and checkpoints older than `activity_before_ms` and usage older than
/// `usage_before_ms`, at most `PRUNE_BATCH` rows of each; the caller repeats while a
/// batch came back full.
pub fn prune(conn: &Db<'_>, activity_before_ms: i64, usage_before_ms: i64) -> Result<Pruned, Error> {
    let delete = |table: &str, cutoff: i64, what: &'static str| -> Result<u64, Error> {
        conn.prepare_cached(&format!(
            "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE at < ?1 ORDER BY at LIMIT ?2)"
        ))
        .and_then(|mut s| s.execute(params![cutoff, PRUNE_BATCH]))
        .map(|n| n as u64)
        .map_err(sql(what))
    };
    Ok(Pruned {
        activity: delete("activity", activity_before_ms, "pruning activity")?,
        compactions: delete("compactions", activity_before_ms, "pruning checkpoints")?,
        usage: delete("usage", usage_before_ms, "pruning usage")?,
    })
}

/// Live sessions as (agent handle, incarnation), so transcript pruning spares them.
pub fn live_sessions(conn: &Db<'_>) -> Result<Vec<(String, Incarnation)>, Error> {
    conn.prepare_cached(
        "SELECT a.handle, s.incarnation FROM sessions s JOIN accounts a ON a.id = s.agent_id WHERE s.ended_at IS NULL",
    )
    .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, Incarnation(r.get::<_, i64>(1)? as u64))))?.collect())
    .map_err(sql("listing live sessions"))
}

/// What a spend series covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesScope<'a> {
    Workspace,
    Agent(&'a Handle),
    /// The agent, every agent below it, and their runs.
    Subtree(&'a Handle),
    Issue(u64),
}

/// Charged dollars, tokens and reports in `buckets` consecutive buckets of `width_ms`, the last
/// holding now, aligned to multiples of `width_ms` since the epoch (UTC hours and days).
/// Oldest first, every bucket present: (start, dollars, tokens, reports).
pub fn usage_series(
    conn: &Db<'_>,
    scope: SeriesScope<'_>,
    width_ms: i64,
    buckets: usize,
) -> Result<Vec<(String, f64, u64, u64)>, Error> {
    let now = conn.now_ms();
    let width = width_ms.max(1);
    let last = now - now.rem_euclid(width);
    let first = last - width * (buckets.saturating_sub(1) as i64);
    let (filter, id) = match scope {
        SeriesScope::Workspace => ("1", 0),
        SeriesScope::Agent(h) => ("u.agent_id = ?4", require_account(conn, "agent", h.as_str())?.id),
        SeriesScope::Subtree(h) => {
            ("u.agent_id IN (SELECT id FROM below)", require_account(conn, "agent", h.as_str())?.id)
        }
        SeriesScope::Issue(number) => {
            crate::issues::issue(conn, number)?;
            ("u.issue = ?4", i64::try_from(number).unwrap_or(i64::MAX))
        }
    };
    let sql_text = format!(
        "WITH RECURSIVE below(id) AS (SELECT ?4 UNION SELECT a.id FROM accounts a JOIN below b \
         ON a.parent_id = b.id OR a.run_of = b.id) \
         SELECT (u.at - ?1) / ?2, SUM(u.charged_usd), SUM(u.input_tokens + u.cache_write_tokens + u.output_tokens), \
         COUNT(*) FROM usage u WHERE u.at >= ?1 AND u.at < ?3 AND {filter} GROUP BY 1"
    );
    let rows: Vec<(i64, f64, i64, i64)> = conn
        .prepare_cached(&sql_text)
        .and_then(|mut s| {
            s.query_map(params![first, width, last + width, id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect()
        })
        .map_err(sql("summing usage over time"))?;
    let mut points: Vec<(i64, f64, u64, u64)> = (0..buckets).map(|i| (first + width * i as i64, 0.0, 0, 0)).collect();
    for (index, usd, tokens, reports) in rows {
        if let Some(point) = usize::try_from(index).ok().and_then(|i| points.get_mut(i)) {
            *point = (point.0, usd, tokens.max(0) as u64, reports.max(0) as u64);
        }
    }
    Ok(points.into_iter().map(|(start, usd, tokens, reports)| (rfc3339(start), usd, tokens, reports)).collect())
}
