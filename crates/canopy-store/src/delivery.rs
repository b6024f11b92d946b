//! Delivery state: who receives a message, what an agent has pending, and acknowledgement.
//!
//! The durable state is the per-subscription cursor ("everything up to here is in the
//! agent's context") plus sparse per-message rows only where one message's fate differs
//! from its neighbours': `injected` (steered into a turn ahead of the cursor) and `held`
//! (the loop guard stopped it from waking the agent). A broadcast writes one message row
//! and nothing per recipient. A message is delivered only when a runner acknowledges that
//! the harness accepted it ("ack means injected"); until then it stays pending and is
//! redelivered after any crash.

use canopy_core::{AccountState, Error, Handle, Incarnation, Message, Presence, RunnerId, Seq};
use rusqlite::{OptionalExtension, params};

use crate::views::{MESSAGE_SELECT, message_from_row, parse_enum};
use crate::{Db, sql};

/// An agent that a committed message reaches, with what decides its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient {
    pub agent_id: i64,
    pub handle: Handle,
    pub state: AccountState,
    pub presence: Presence,
    /// The runner hosting its live session, if it has one.
    pub runner: Option<RunnerId>,
    pub incarnation: Incarnation,
    pub mentioned: bool,
}

/// What a post reaches: subscribed agents, and mentions that reach no one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reach {
    pub recipients: Vec<Recipient>,
    /// Mentioned handles that are not accounts.
    pub unknown_mentions: Vec<String>,
    /// Mentioned accounts that are not subscribed to the channel (or are operators).
    pub unreachable_mentions: Vec<String>,
}

/// Every agent subscribed to a channel, with its live state.
pub(crate) const REACH: &str = "SELECT a.id, a.handle, a.state, COALESCE(p.state, 'offline'), s.runner_id, COALESCE(s.incarnation, 0) \
     FROM subscriptions sub JOIN accounts a ON a.id = sub.account_id \
     LEFT JOIN presence p ON p.agent_id = a.id \
     LEFT JOIN sessions s ON s.agent_id = a.id AND s.ended_at IS NULL \
     WHERE sub.channel_id = ?1 AND a.kind = 'agent' ORDER BY a.handle";

/// Every agent subscribed to `channel_id` except the sender, with its live state.
pub fn reach(conn: &Db<'_>, channel_id: i64, sender_id: i64, mentions: &[Handle]) -> Result<Reach, Error> {
    let subscribers = match conn.memo {
        Some(memo) => memo.recipients(channel_id, || subscribers(conn, channel_id))?,
        None => subscribers(conn, channel_id)?,
    };
    // A despawned agent is told nothing, unless it is named (then the sender hears why not).
    let recipients = subscribers
        .into_iter()
        .filter(|r| r.agent_id != sender_id)
        .map(|mut r| {
            r.mentioned = mentions.contains(&r.handle);
            r
        })
        .filter(|r| r.state != AccountState::Despawned || r.mentioned)
        .collect();
    let mut reach = Reach { recipients, ..Reach::default() };
    for mention in mentions {
        if reach.recipients.iter().any(|r| &r.handle == mention) {
            continue;
        }
        let exists = conn
            .prepare_cached("SELECT id FROM accounts WHERE handle = ?1")
            .and_then(|mut s| s.query_row(params![mention.as_str()], |r| r.get::<_, i64>(0)).optional())
            .map_err(sql("checking a mention"))?;
        match exists {
            Some(id) if id == sender_id => {}
            Some(_) => reach.unreachable_mentions.push(mention.to_string()),
            None => reach.unknown_mentions.push(mention.to_string()),
        }
    }
    Ok(reach)
}

/// `REACH`, read.
fn subscribers(conn: &Db<'_>, channel_id: i64) -> Result<Vec<Recipient>, Error> {
    conn.prepare_cached(REACH)
        .and_then(|mut s| {
            s.query_map(params![channel_id], |r| {
                Ok(Recipient {
                    agent_id: r.get(0)?,
                    handle: Handle::from_trusted(r.get(1)?),
                    state: parse_enum(r, 2, AccountState::parse)?,
                    presence: parse_enum(r, 3, Presence::parse)?,
                    runner: r.get::<_, Option<String>>(4)?.map(RunnerId::from_trusted),
                    incarnation: Incarnation(r.get::<_, i64>(5)? as u64),
                    mentioned: false,
                })
            })?
            .collect()
        })
        .map_err(sql("finding a message's recipients"))
}

/// What an agent has pending, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub messages: Vec<Message>,
    /// Whether any pending message may start a turn (not held by the loop guard, not an
    /// acknowledgement).
    pub wake: bool,
    /// How many messages are pending in all (may exceed `messages.len()`).
    pub total: u64,
}

/// The live session's agent id, checking that (agent, incarnation) runs on `runner_id`.
pub(crate) fn live_session_agent(
    conn: &Db<'_>,
    agent: &str,
    incarnation: Incarnation,
    runner_id: &RunnerId,
) -> Result<Option<i64>, Error> {
    conn.prepare_cached(
        "SELECT s.agent_id FROM sessions s JOIN accounts a ON a.id = s.agent_id \
         WHERE a.handle = ?1 AND s.incarnation = ?2 AND s.runner_id = ?3 AND s.ended_at IS NULL",
    )
    .and_then(|mut s| {
        s.query_row(params![agent, incarnation.get() as i64, runner_id.as_str()], |r| r.get(0)).optional()
    })
    .map_err(sql("finding a live session"))
}

const PENDING_WHERE: &str = "FROM subscriptions sub JOIN messages m ON m.channel_id = sub.channel_id AND m.seq > sub.cursor \
     WHERE sub.account_id = ?1 AND m.sender_id != ?1 \
     AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.agent_id = ?1 AND d.seq = m.seq AND d.state = 'injected')";

/// The oldest `limit` pending messages of an agent.
pub fn pending(conn: &Db<'_>, agent_id: i64, limit: u32) -> Result<Pending, Error> {
    let select = MESSAGE_SELECT.replacen(
        "FROM messages m",
        "FROM messages m JOIN subscriptions sub ON sub.channel_id = m.channel_id AND m.seq > sub.cursor",
        1,
    );
    let messages: Vec<Message> = conn
        .prepare_cached(&format!(
            "{select} WHERE sub.account_id = ?1 AND m.sender_id != ?1 \
             AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.agent_id = ?1 AND d.seq = m.seq AND d.state = 'injected') \
             ORDER BY m.seq LIMIT ?2"
        ))
        .and_then(|mut s| s.query_map(params![agent_id, limit], message_from_row)?.collect())
        .map_err(sql("reading pending messages"))?;
    let total: i64 = conn
        .prepare_cached(&format!("SELECT COUNT(*) {PENDING_WHERE}"))
        .and_then(|mut s| s.query_row(params![agent_id], |r| r.get(0)))
        .map_err(sql("counting pending messages"))?;
    let wake: bool = conn
        .prepare_cached(&format!(
            "SELECT EXISTS (SELECT 1 {PENDING_WHERE} AND m.ack_only = 0 \
             AND (m.wake = 'all' OR (m.wake = 'mentioned' AND EXISTS (SELECT 1 FROM json_each(m.mentions) j \
                  WHERE j.value = (SELECT handle FROM accounts WHERE id = ?1)))) \
             AND NOT EXISTS (SELECT 1 FROM deliveries h WHERE h.agent_id = ?1 AND h.seq = m.seq AND h.state = 'held'))"
        ))
        .and_then(|mut s| s.query_row(params![agent_id], |r| r.get(0)))
        .map_err(sql("checking for wakeful messages"))?;
    Ok(Pending { messages, wake, total: total as u64 })
}

/// Records that `seqs` are handed to the session `incarnation` of the agent; returns those
/// an earlier session was handed and never confirmed (redeliveries: that session may have
/// seen them before it ended).
pub fn offer(conn: &Db<'_>, agent_id: i64, incarnation: Incarnation, seqs: &[Seq]) -> Result<Vec<Seq>, Error> {
    let mut again = Vec::new();
    for seq in seqs {
        let earlier: Option<i64> = conn
            .prepare_cached("SELECT incarnation FROM offers WHERE agent_id = ?1 AND seq = ?2")
            .and_then(|mut s| s.query_row(params![agent_id, seq.get() as i64], |r| r.get(0)).optional())
            .map_err(sql("reading an offer"))?;
        match earlier {
            Some(i) if i != incarnation.get() as i64 => {
                conn.prepare_cached("INSERT OR IGNORE INTO redeliveries (agent_id, seq) VALUES (?1, ?2)")
                    .and_then(|mut s| s.execute(params![agent_id, seq.get() as i64]))
                    .map_err(sql("recording a redelivery"))?;
                again.push(*seq);
            }
            Some(_) => {}
            None => {
                conn.prepare_cached("INSERT INTO offers (agent_id, seq, incarnation) VALUES (?1, ?2, ?3)")
                    .and_then(|mut s| s.execute(params![agent_id, seq.get() as i64, incarnation.get() as i64]))
                    .map_err(sql("recording an offer"))?;
            }
        }
    }
    Ok(again)
}

/// Records that the harness accepted `seqs` at a turn start: each subscription's cursor
/// moves to the highest acknowledged sequence in its channel (never backwards), and sparse
/// rows behind the cursor are dropped. Idempotent. Returns how many cursors moved.
pub fn acknowledge(conn: &Db<'_>, agent_id: i64, seqs: &[Seq]) -> Result<u32, Error> {
    let mut moved = 0;
    for seq in seqs {
        let channel: Option<i64> = conn
            .prepare_cached("SELECT channel_id FROM messages WHERE seq = ?1")
            .and_then(|mut s| s.query_row(params![seq.get() as i64], |r| r.get(0)).optional())
            .map_err(sql("finding an acknowledged message"))?;
        let Some(channel) = channel else { continue };
        moved += conn
            .prepare_cached(
                "UPDATE subscriptions SET cursor = ?1 WHERE account_id = ?2 AND channel_id = ?3 AND cursor < ?1",
            )
            .and_then(|mut s| s.execute(params![seq.get() as i64, agent_id, channel]))
            .map_err(sql("advancing a cursor"))? as u32;
    }
    // Sparse rows at or behind every cursor say nothing the cursors do not.
    conn.prepare_cached(
        "DELETE FROM deliveries WHERE agent_id = ?1 AND seq <= \
         (SELECT COALESCE(MIN(cursor), 0) FROM subscriptions WHERE account_id = ?1)",
    )
    .and_then(|mut s| s.execute(params![agent_id]))
    .map_err(sql("dropping delivered rows"))?;
    forget_offers(conn, agent_id, seqs)?;
    Ok(moved)
}

/// Confirmed messages are offers no more.
fn forget_offers(conn: &Db<'_>, agent_id: i64, seqs: &[Seq]) -> Result<(), Error> {
    let mut delete = conn
        .prepare_cached("DELETE FROM offers WHERE agent_id = ?1 AND seq = ?2")
        .map_err(sql("dropping confirmed offers"))?;
    for seq in seqs {
        delete.execute(params![agent_id, seq.get() as i64]).map_err(sql("dropping confirmed offers"))?;
    }
    Ok(())
}

/// Records that `seq` was steered into a running turn of the agent (ahead of its cursor).
pub fn record_injected(conn: &Db<'_>, agent_id: i64, seq: Seq) -> Result<(), Error> {
    forget_offers(conn, agent_id, &[seq])?;
    conn.prepare_cached(
        "INSERT INTO deliveries (agent_id, seq, state, at) VALUES (?1, ?2, 'injected', ?3) \
         ON CONFLICT (agent_id, seq) DO UPDATE SET state = 'injected', at = ?3",
    )
    .and_then(|mut s| s.execute(params![agent_id, seq.get() as i64, conn.now_ms()]))
    .map_err(sql("recording a steer"))?;
    Ok(())
}

/// Records that the loop guard stopped `seq` from waking the agent.
pub fn record_held(conn: &Db<'_>, agent_id: i64, seq: Seq) -> Result<(), Error> {
    conn.prepare_cached("INSERT OR IGNORE INTO deliveries (agent_id, seq, state, at) VALUES (?1, ?2, 'held', ?3)")
        .and_then(|mut s| s.execute(params![agent_id, seq.get() as i64, conn.now_ms()]))
        .map_err(sql("recording a held wake"))?;
    Ok(())
}

/// The agent id of a handle.
pub fn agent_id(conn: &Db<'_>, handle: &str) -> Result<i64, Error> {
    crate::views::require_account(conn, "agent", handle).map(|a| a.id)
}

/// Agents whose pending messages may exceed `cap`, with their pending count; and clears
/// the overflow mark of agents back under it. Returns (agent id, handle, pending) for newly
/// overflowing agents.
pub fn overflowing(conn: &Db<'_>, cap: u64) -> Result<Vec<(i64, String, u64)>, Error> {
    // A cheap upper bound first: a subscription whose channel head is far past its cursor.
    let candidates: Vec<(i64, String, bool)> = conn
        .prepare_cached(
            "SELECT DISTINCT a.id, a.handle, COALESCE(p.overflow, 0) FROM accounts a \
             JOIN subscriptions sub ON sub.account_id = a.id LEFT JOIN presence p ON p.agent_id = a.id \
             WHERE a.kind = 'agent' AND (COALESCE(p.overflow, 0) = 1 OR \
             (SELECT COALESCE(MAX(seq), 0) FROM messages m WHERE m.channel_id = sub.channel_id) - sub.cursor > ?1)",
        )
        .and_then(|mut s| s.query_map(params![cap as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect())
        .map_err(sql("finding full mailboxes"))?;
    let mut newly = Vec::new();
    for (agent_id, handle, marked) in candidates {
        let total: i64 = conn
            .prepare_cached(&format!("SELECT COUNT(*) {PENDING_WHERE}"))
            .and_then(|mut s| s.query_row(params![agent_id], |r| r.get(0)))
            .map_err(sql("counting pending messages"))?;
        let over = total as u64 > cap;
        if over != marked {
            conn.execute("UPDATE presence SET overflow = ?1 WHERE agent_id = ?2", params![over, agent_id])
                .map_err(sql("marking a full mailbox"))?;
            if over {
                newly.push((agent_id, handle, total as u64));
            }
        }
    }
    Ok(newly)
}

/// Moves cursors past pending messages older than `cutoff_ms` (the retention period) and
/// returns, per agent, how many it never received, so the operator can be told.
pub fn expire(conn: &Db<'_>, cutoff_ms: i64) -> Result<Vec<(i64, String, u64)>, Error> {
    let stale: Vec<(i64, String, i64, i64, i64)> = conn
        .prepare_cached(
            "SELECT sub.account_id, a.handle, sub.channel_id, MAX(m.seq), \
             SUM(CASE WHEN m.sender_id != sub.account_id AND NOT EXISTS (SELECT 1 FROM deliveries d \
                 WHERE d.agent_id = sub.account_id AND d.seq = m.seq AND d.state = 'injected') THEN 1 ELSE 0 END) \
             FROM subscriptions sub JOIN accounts a ON a.id = sub.account_id \
             JOIN messages m ON m.channel_id = sub.channel_id AND m.seq > sub.cursor \
             WHERE a.kind = 'agent' AND m.created_at < ?1 GROUP BY sub.account_id, sub.channel_id",
        )
        .and_then(|mut s| {
            s.query_map(params![cutoff_ms], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))?.collect()
        })
        .map_err(sql("finding expired messages"))?;
    let mut per_agent: Vec<(i64, String, u64)> = Vec::new();
    for (agent_id, handle, channel_id, max_seq, missed) in stale {
        conn.execute(
            "UPDATE subscriptions SET cursor = ?1 WHERE account_id = ?2 AND channel_id = ?3 AND cursor < ?1",
            params![max_seq, agent_id, channel_id],
        )
        .map_err(sql("expiring messages"))?;
        match per_agent.iter_mut().find(|(id, _, _)| *id == agent_id) {
            Some(entry) => entry.2 += missed as u64,
            None => per_agent.push((agent_id, handle, missed as u64)),
        }
    }
    per_agent.retain(|(_, _, missed)| *missed > 0);
    Ok(per_agent)
}
