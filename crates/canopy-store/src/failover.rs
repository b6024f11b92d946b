//! A lane that outlives its harness: when a session keeps failing for a model-side reason,
//! its agent moves to the next harness of its role's chain (`harness = ["claude", "codex"]`);
//! after `failback_after` it goes back to the first, and the operator may move it at any time.
//!
//! Owns the agent's harness history columns (`home_harness`, `failover`, `failed_over_at`,
//! `failbacks`) and the decisions taken in the reports' transaction: counting a session's
//! model-side failures in the window, moving the lane, and telling its home channel once per
//! move. Does not classify failures (a runner reports `failing` only for model-side ones:
//! a refused key or a missing program stops the session instead) and does not start sessions.

use std::collections::BTreeMap;

use canopy_core::acl::Caller;
use canopy_core::{Error, Handle, Message};
use rusqlite::{OptionalExtension, params};

use crate::notices::notice;
use crate::schema::audit;
use crate::views::require_account;
use crate::{Db, sql};

/// The failover rules, from `[sessions]` and each role's chain.
#[derive(Debug, Clone, Default)]
pub struct FailoverRules {
    /// Model-side failures of one session...
    pub after: u32,
    /// ...within this many milliseconds move it on.
    pub window_ms: i64,
    /// Each role's harness chain, first harness first (roles without one are absent).
    pub chains: BTreeMap<String, Vec<String>>,
}

/// An agent's harness as far as its lane goes.
struct Lane {
    agent_id: i64,
    role: String,
    harness: String,
    home: String,
}

fn lane(conn: &Db<'_>, handle: &str) -> Result<Option<Lane>, Error> {
    conn.prepare_cached("SELECT id, COALESCE(role, ''), harness, home_harness FROM accounts WHERE handle = ?1")
        .and_then(|mut s| {
            s.query_row(params![handle], |r| {
                Ok(Lane { agent_id: r.get(0)?, role: r.get(1)?, harness: r.get(2)?, home: r.get(3)? })
            })
            .optional()
        })
        .map_err(sql("reading an agent's harness"))
}

/// After a `failing` report of session `session_id` of `handle` (`reason`): when the session
/// has failed `after` times within the window and its role's chain goes on, the lane moves to
/// the next harness and its home channel is told. Its session is not ended here: the runner's
/// next sync no longer lists it, so the runner stops it at once (its turn is failing anyway),
/// pushes its branch, and reports the end, after which the lane is placed again. The notice,
/// when it moved.
pub(crate) fn consider(
    conn: &Db<'_>,
    rules: &FailoverRules,
    session_id: i64,
    handle: &str,
    reason: &str,
    now: i64,
) -> Result<Option<Message>, Error> {
    let Some(lane) = lane(conn, handle)? else { return Ok(None) };
    // A session on a harness the lane already left (an operator's move, a failover a moment
    // ago) moves nothing: it is on its way out.
    let running: String = conn
        .prepare_cached("SELECT harness FROM sessions WHERE id = ?1")
        .and_then(|mut s| s.query_row(params![session_id], |r| r.get(0)))
        .map_err(sql("reading a session's harness"))?;
    if running != lane.harness {
        return Ok(None);
    }
    let Some(chain) = rules.chains.get(&lane.role) else { return Ok(None) };
    let Some(next) = chain.iter().position(|h| *h == lane.harness).and_then(|i| chain.get(i + 1)) else {
        return Ok(None);
    };
    let failures: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM activity a JOIN sessions s ON s.agent_id = a.agent_id AND s.incarnation = a.incarnation \
             WHERE s.id = ?1 AND a.kind = 'model_error' AND a.at >= ?2",
        )
        .and_then(|mut s| s.query_row(params![session_id, now - rules.window_ms], |r| r.get(0)))
        .map_err(sql("counting a session's failures"))?;
    if failures < i64::from(rules.after) {
        return Ok(None);
    }
    let first: String = reason.lines().next().unwrap_or_default().chars().take(120).collect();
    let why = format!("{} failing: {first}", lane.harness);
    conn.execute(
        "UPDATE accounts SET harness = ?2, home_harness = CASE WHEN home_harness = '' THEN ?3 ELSE home_harness END, \
         failover = ?4, failed_over_at = ?5 WHERE id = ?1",
        params![lane.agent_id, next, lane.harness, why, now],
    )
    .map_err(sql("moving a lane to its next harness"))?;
    audit(conn, None, "agents.failed_over", handle, &format!("moved to {next}: {why}"))?;
    let home = if lane.home.is_empty() { lane.harness.clone() } else { lane.home.clone() };
    let body = canopy_core::notices::failed_over(handle, &lane.harness, next, reason, &home);
    notice(conn, lane.agent_id, &body).map(Some)
}

/// Moves `handle`'s lane to `harness` (the operator's `agents start --harness`, or a failback):
/// its failover is cleared, and a live session on another harness ends at its next turn
/// boundary (the runner is told at its sync). Audited as `caller`'s when one is given.
pub fn set_harness(conn: &Db<'_>, caller: Option<&Caller>, handle: &Handle, harness: &str) -> Result<(), Error> {
    let account = require_account(conn, "handle", handle.as_str())?;
    conn.execute(
        "UPDATE accounts SET harness = ?2, failover = NULL, failed_over_at = NULL, \
         home_harness = CASE WHEN home_harness = ?2 THEN '' ELSE home_harness END, \
         failbacks = CASE WHEN ?3 THEN 0 ELSE failbacks END WHERE id = ?1",
        params![account.id, harness, caller.is_some()],
    )
    .map_err(sql("setting an agent's harness"))?;
    let actor = match caller {
        Some(caller) => Some(require_account(conn, "caller", caller.handle.as_str())?.id),
        None => None,
    };
    audit(conn, actor, "agents.harness", handle.as_str(), harness)
}

/// Lanes whose failover is older than `cutoff_ms`, with the harness to go back to: the
/// daemon's failback (a lane that failed over again after a failback waits twice as long).
pub fn failback_due(conn: &Db<'_>, now: i64, after_ms: i64) -> Result<Vec<(Handle, String)>, Error> {
    conn.prepare_cached(
        "SELECT handle, home_harness FROM accounts WHERE failover IS NOT NULL AND home_harness != '' \
         AND state = 'active' AND failed_over_at + (?2 << MIN(failbacks, 6)) <= ?1",
    )
    .and_then(|mut s| {
        s.query_map(params![now, after_ms], |r| Ok((Handle::from_trusted(r.get(0)?), r.get(1)?)))?.collect()
    })
    .map_err(sql("finding lanes to move back"))
}

/// A failback: the lane goes back to its first harness (its next session is the probe; one
/// that fails over again waits twice as long before the next try), and its home channel is told.
pub fn fail_back(conn: &Db<'_>, handle: &Handle, home: &str) -> Result<Message, Error> {
    let account = require_account(conn, "handle", handle.as_str())?;
    conn.execute("UPDATE accounts SET failbacks = failbacks + 1 WHERE id = ?1", params![account.id])
        .map_err(sql("counting a failback"))?;
    set_harness(conn, None, handle, home)?;
    let body = canopy_core::notices::failed_back(handle.as_str(), home);
    notice(conn, account.id, &body)
}
