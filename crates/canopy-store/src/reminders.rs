//! `[notify] remind_after`: what has waited for the operator past the reminder age and has not
//! been reminded of yet: a pending spawn request, a merge request waiting for the decision, an
//! agent failing or crashed (one reminder per episode: the item names the time it began). Each
//! is marked in the same transaction that returns it, so it is reminded of once, a restart
//! included. Does not run the notify command (the daemon's notifier) or choose the age.

use canopy_core::{Error, MergeRequest, RosterEntry, SpawnRequest};
use rusqlite::params;

use crate::{Db, sql};

/// One item that waits for the operator.
#[derive(Debug, Clone, PartialEq)]
pub enum Waiting {
    Spawn(SpawnRequest),
    Merge(MergeRequest),
    /// A failing or crashed agent.
    Agent(RosterEntry),
}

/// Items waiting since before `now - older_than_ms` that no reminder has named yet, oldest
/// first within each kind; each is recorded as reminded.
pub fn due_reminders(conn: &Db<'_>, older_than_ms: i64) -> Result<Vec<Waiting>, Error> {
    let now = conn.now_ms();
    let cut = now.saturating_sub(older_than_ms);
    let ids = |query: &str, what: &'static str| -> Result<Vec<(String, i64)>, Error> {
        conn.prepare_cached(query)
            .and_then(|mut s| s.query_map(params![cut], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
            .map_err(sql(what))
    };
    let mut due = Vec::new();
    // A spawn request (`req-N`) waiting since it was made, a merge request (`merge-N@T`) since
    // it last began waiting for the operator (after its check and any review).
    let kinds = [
        ("spawn_requests", "'req-' || id", "created_at"),
        (
            "merges",
            "'merge-' || id || '@' || COALESCE(pending_since, created_at)",
            "COALESCE(pending_since, created_at)",
        ),
    ];
    for (table, item, since) in kinds {
        let query = format!(
            "SELECT {item}, id FROM {table} WHERE state = 'pending' AND {since} < ?1 \
             AND {item} NOT IN (SELECT item FROM reminders) ORDER BY id"
        );
        for (item, id) in ids(&query, "finding requests to remind of")? {
            let waiting = match table {
                "merges" => Waiting::Merge(crate::merges::load_merge(conn, id)?),
                _ => Waiting::Spawn(crate::spawn::load(conn, id)?),
            };
            due.push((item, waiting));
        }
    }
    let agents = conn
        .prepare_cached(
            "SELECT a.handle || '@' || p.state_since, a.handle FROM presence p JOIN accounts a ON a.id = p.agent_id \
             WHERE p.state IN ('failing', 'crashed') AND a.state != 'despawned' AND p.state_since < ?1 \
             AND a.handle || '@' || p.state_since NOT IN (SELECT item FROM reminders) ORDER BY p.state_since",
        )
        .and_then(|mut s| s.query_map(params![cut], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<Vec<_>, _>>())
        .map_err(sql("finding failing agents to remind of"))?;
    for (item, handle) in agents {
        let handle: String = handle;
        due.push((item, Waiting::Agent(crate::sessions::roster_entry(conn, &handle)?)));
    }
    for (item, _) in &due {
        conn.prepare_cached("INSERT OR IGNORE INTO reminders (item, at) VALUES (?1, ?2)")
            .and_then(|mut s| s.execute(params![item, now]))
            .map_err(sql("recording a reminder"))?;
    }
    Ok(due.into_iter().map(|(_, waiting)| waiting).collect())
}
