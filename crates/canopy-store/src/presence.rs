//! An agent's presence row: the one write every area that starts, stops or moves an agent
//! makes (sessions, accounts, runs, checkouts, despawn).
//!
//! Owns only the upsert of `presence`; does not decide which state an agent is in (the
//! callers do) and does not read presence back (the roster in `sessions.rs` does).

use canopy_core::{Error, Incarnation, Presence};
use rusqlite::params;

use crate::{Db, sql};

/// Moves an agent's presence; `incarnation` is set when a new session starts.
pub(crate) fn set_presence(
    conn: &Db<'_>,
    agent_id: i64,
    state: Presence,
    reason: Option<&str>,
    incarnation: Option<Incarnation>,
    now: i64,
) -> Result<(), Error> {
    conn.prepare_cached(
        "INSERT INTO presence (agent_id, state, reason, incarnation, state_since) VALUES (?1, ?2, ?3, COALESCE(?4, 0), ?5) \
         ON CONFLICT (agent_id) DO UPDATE SET state = ?2, reason = ?3, \
         incarnation = COALESCE(?4, incarnation), \
         state_since = CASE WHEN state = ?2 THEN state_since ELSE ?5 END",
    )
    .and_then(|mut s| s.execute(params![agent_id, state.as_str(), reason, incarnation.map(|i| i.get() as i64), now]))
    .map_err(sql("setting presence"))?;
    Ok(())
}
