//! An agent's own history, for continuity: `history_search` and the facts of the
//! continuity block.
//!
//! Whose history a caller may read is decided in one place, `history_owners`: today the
//! caller's own account (every incarnation of its sessions); subagent runs join there when
//! they exist. Results are redacted, bounded excerpts (`canopy_core::continuity`), never
//! whole tool outputs. A search text of three characters or more is looked up in the
//! trigram index `message_text`, which `index_text` fills behind the post path: when it
//! matches few messages, only those are read, and what is newer than the index is read from
//! the channels' own indexes; a text too common for that walks the caller's history. Does not
//! build the block's text (that is `continuity_block`) and does not decide when a block is owed.

use canopy_core::acl::Caller;
use canopy_core::continuity::{
    Checkpoint, ContinuityFacts, ContinuityReason, EXCERPT_CHARS, HistoryCursor, HistoryItem, PREVIEW_CHARS,
    PinnedLine, excerpt,
};
use canopy_core::{AccountKind, Error, Message};
use canopy_core::{Incarnation, Seq};
use rusqlite::{OptionalExtension, params};

use crate::views::{MESSAGE_SELECT, message_from_row, message_from_row_offset, require_account};
use crate::{Db, rfc3339, sql};

/// What `history_search` asks for. Limits are checked by the caller.
#[derive(Debug, Clone)]
pub struct HistoryQuery {
    pub text: Option<String>,
    pub before: HistoryCursor,
    pub limit: u32,
    pub include_tool_events: bool,
}

/// A page of history, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryPage {
    pub items: Vec<HistoryItem>,
    /// Pass as `before` for the next (older) page; absent when nothing older matches.
    pub next_before: Option<HistoryCursor>,
}

/// The accounts whose sessions make up the caller's history. The one place that scopes it:
/// an agent reads only its own; subagent runs the caller started will be added here.
pub fn history_owners(conn: &Db<'_>, caller: &Caller) -> Result<Vec<i64>, Error> {
    if caller.kind != AccountKind::Agent {
        return Err(Error::invalid(
            "caller",
            "history_search searches the calling agent's own sessions; operators read channels instead",
        ));
    }
    let agent = require_account(conn, "caller", caller.handle.as_str())?;
    // Its own sessions and those of its subagent runs (accounts whose `run_of` is it).
    let mut owners = vec![agent.id];
    let runs: Vec<i64> = conn
        .prepare_cached("SELECT id FROM accounts WHERE run_of = ?1 ORDER BY id")
        .and_then(|mut s| s.query_map(rusqlite::params![agent.id], |r| r.get(0))?.collect())
        .map_err(crate::sql("listing an agent's subagent runs"))?;
    owners.extend(runs);
    Ok(owners)
}

/// Tool-event kinds of activity, with the status each shows.
const TOOL_EVENTS: &[(&str, &str)] =
    &[("tool_result", "ok"), ("tool_failed", "failed"), ("tool_blocked", "blocked"), ("tool_aborted", "aborted")];

/// Messages the caller sent or received and, when asked, its tool events, newest first.
pub fn history_search(conn: &Db<'_>, caller: &Caller, query: &HistoryQuery) -> Result<HistoryPage, Error> {
    let owners = history_owners(conn, caller)?;
    let search = Search {
        owners_json: serde_json::to_string(&owners).map_err(|e| Error::Internal(format!("encoding owners: {e}")))?,
        text: query.text.as_deref().map(str::trim).filter(|t| !t.is_empty()),
        before: query.before,
        fetch: i64::from(query.limit) + 1,
    };
    let mut items = message_items(message_hits(conn, &search, &owners)?, &search);
    if query.include_tool_events {
        items.extend(tool_events(conn, &search)?);
    }
    Ok(page_of(items, query.limit))
}

/// One search's terms, as its statements bind them.
struct Search<'q> {
    /// The accounts whose history it is (`history_owners`), as a JSON array for `json_each`.
    owners_json: String,
    /// The text to find, trimmed; `None` matches everything.
    text: Option<&'q str>,
    /// Only what sorts before this cursor (the previous page's end).
    before: HistoryCursor,
    /// Rows each walk reads: one more than the page, to know whether there is more.
    fetch: i64,
}

/// A message found: (created at, the message, sent by an owner, redelivered to an owner).
type Hit = (i64, Message, bool, bool);

/// `select` with the columns `hit_from_row` reads before the message's own.
fn with_hit_columns(select: &str) -> String {
    select.replacen(
        "SELECT ",
        "SELECT m.created_at, m.sender_id IN (SELECT value FROM json_each(?1)), EXISTS (SELECT 1 FROM \
         redeliveries r WHERE r.agent_id IN (SELECT value FROM json_each(?1)) AND r.seq = m.seq), ",
        1,
    )
}

fn hit_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Hit> {
    Ok((r.get(0)?, message_from_row_offset(r, 3)?, r.get(1)?, r.get(2)?))
}

/// The newest `fetch` messages the owners sent or received that match, newest first.
///
/// Received means delivered into the agent's context: at or behind its cursor, or steered.
/// Each of the owners' channels is walked newest first on its own index, then the messages
/// they sent (anywhere) on the sender index, and the pages are merged: the cost follows
/// the caller's own channels, never the size of the workspace's history.
fn message_hits(conn: &Db<'_>, search: &Search<'_>, owners: &[i64]) -> Result<Vec<Hit>, Error> {
    let (mut hits, indexed) = indexed_hits(conn, search)?;
    hits.extend(received_hits(conn, search, indexed)?);
    hits.extend(sent_hits(conn, search, owners, indexed)?);
    hits.sort_by_key(|(at, m, _, _)| std::cmp::Reverse((*at, m.seq)));
    hits.dedup_by_key(|(_, m, _, _)| m.seq);
    hits.truncate(search.fetch as usize);
    Ok(hits)
}

/// A query of three characters or more is looked up in the text index first: when it
/// matches few messages of the workspace, those are the candidates (each kept if it is the
/// caller's and holds the text), and the walks that follow cover only what is newer than the
/// index, the sequence returned beside the hits (0: nothing was looked up). A query too
/// common for that walks the caller's history as it would unindexed.
fn indexed_hits(conn: &Db<'_>, search: &Search<'_>) -> Result<(Vec<Hit>, i64), Error> {
    let Some(text) = search.text.filter(|t| t.chars().count() >= 3) else { return Ok((Vec::new(), 0)) };
    let through = indexed_through(conn)?;
    let Some(candidates) = candidates(conn, text, through)? else { return Ok((Vec::new(), 0)) };
    let before = search.before;
    let hits = conn
        .prepare_cached(&format!(
            "{select} WHERE m.seq IN (SELECT value FROM json_each(?2)) \
             AND instr(lower(m.body), lower(?3)) > 0 AND (m.created_at, 0, m.seq) < (?4, ?5, ?6) \
             AND (m.sender_id IN (SELECT value FROM json_each(?1)) OR EXISTS (SELECT 1 FROM subscriptions sub \
             WHERE sub.account_id IN (SELECT value FROM json_each(?1)) AND sub.channel_id = m.channel_id \
             AND (m.seq <= sub.cursor OR EXISTS (SELECT 1 FROM deliveries d WHERE d.agent_id = sub.account_id \
             AND d.seq = m.seq AND d.state = 'injected')))) \
             ORDER BY m.seq DESC LIMIT ?7",
            select = with_hit_columns(MESSAGE_SELECT)
        ))
        .and_then(|mut s| {
            s.query_map(
                params![search.owners_json, candidates, text, before.at_ms, before.source, before.id, search.fetch],
                hit_from_row,
            )?
            .collect::<Result<Vec<_>, _>>()
        })
        .map_err(sql("searching the text index's candidates"))?;
    Ok((hits, through))
}

/// What the owners received in each of their channels after sequence `indexed`.
fn received_hits(conn: &Db<'_>, search: &Search<'_>, indexed: i64) -> Result<Vec<Hit>, Error> {
    let channels: Vec<(i64, i64, i64)> = conn
        .prepare_cached(
            "SELECT account_id, channel_id, cursor FROM subscriptions WHERE account_id IN (SELECT value FROM json_each(?1))",
        )
        .and_then(|mut s| {
            s.query_map(params![search.owners_json], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect()
        })
        .map_err(sql("listing the channels of a history"))?;
    let mut received = conn
        .prepare_cached(&format!(
            "{select} WHERE m.channel_id = ?2 AND (m.seq <= ?3 OR EXISTS (SELECT 1 FROM deliveries d \
             WHERE d.agent_id = ?4 AND d.seq = m.seq AND d.state = 'injected')) \
             AND (?5 IS NULL OR instr(lower(m.body), lower(?5)) > 0) \
             AND (m.created_at, 0, m.seq) < (?6, ?7, ?8) AND m.seq > ?10 ORDER BY m.seq DESC LIMIT ?9",
            select = with_hit_columns(MESSAGE_SELECT)
        ))
        .map_err(sql("searching message history"))?;
    let before = search.before;
    let mut hits = Vec::new();
    for (owner, channel, cursor) in &channels {
        let page = received
            .query_map(
                params![
                    search.owners_json,
                    channel,
                    cursor,
                    owner,
                    search.text,
                    before.at_ms,
                    before.source,
                    before.id,
                    search.fetch,
                    indexed
                ],
                hit_from_row,
            )
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(sql("searching message history"))?;
        hits.extend(page);
    }
    Ok(hits)
}

/// What each owner sent, anywhere, after sequence `indexed`.
fn sent_hits(conn: &Db<'_>, search: &Search<'_>, owners: &[i64], indexed: i64) -> Result<Vec<Hit>, Error> {
    let mut sent = conn
        .prepare_cached(&format!(
            "{select} WHERE m.sender_id = ?2 AND (?3 IS NULL OR instr(lower(m.body), lower(?3)) > 0) \
             AND (m.created_at, 0, m.seq) < (?4, ?5, ?6) AND m.seq > ?8 ORDER BY m.seq DESC LIMIT ?7",
            select = with_hit_columns(MESSAGE_SELECT)
        ))
        .map_err(sql("searching sent history"))?;
    let before = search.before;
    let mut hits = Vec::new();
    for owner in owners {
        let page = sent
            .query_map(
                params![
                    search.owners_json,
                    owner,
                    search.text,
                    before.at_ms,
                    before.source,
                    before.id,
                    search.fetch,
                    indexed
                ],
                hit_from_row,
            )
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(sql("searching sent history"))?;
        hits.extend(page);
    }
    Ok(hits)
}

/// The messages found as history items, each body cut to an excerpt around the text.
fn message_items(hits: Vec<Hit>, search: &Search<'_>) -> Vec<(HistoryCursor, HistoryItem)> {
    hits.into_iter()
        .map(|(at, mut message, sent, redelivered)| {
            let key = HistoryCursor { at_ms: at, source: 0, id: message.seq.get() as i64 };
            message.body = excerpt(&message.body, search.text, EXCERPT_CHARS);
            (key, HistoryItem::Message { message, sent, redelivered })
        })
        .collect()
}

/// The owners' tool events that match, newest first, at most `fetch` of them.
fn tool_events(conn: &Db<'_>, search: &Search<'_>) -> Result<Vec<(HistoryCursor, HistoryItem)>, Error> {
    let kinds = serde_json::to_string(&TOOL_EVENTS.iter().map(|(k, _)| *k).collect::<Vec<_>>())
        .map_err(|e| Error::Internal(format!("encoding kinds: {e}")))?;
    let before = search.before;
    let events: Vec<(i64, i64, u64, String, Option<String>, String)> = conn
        .prepare_cached(
            "SELECT id, at, incarnation, kind, turn_id, detail FROM activity \
             WHERE agent_id IN (SELECT value FROM json_each(?1)) AND kind IN (SELECT value FROM json_each(?2)) \
             AND (?3 IS NULL OR instr(lower(summary || ' ' || detail), lower(?3)) > 0) \
             AND (at, 1, id) < (?4, ?5, ?6) ORDER BY id DESC LIMIT ?7",
        )
        .and_then(|mut s| {
            s.query_map(
                params![search.owners_json, kinds, search.text, before.at_ms, before.source, before.id, search.fetch],
                |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? as u64, r.get(3)?, r.get(4)?, r.get(5)?)),
            )?
            .collect()
        })
        .map_err(sql("searching tool history"))?;
    Ok(events
        .into_iter()
        .map(|(id, at, incarnation, kind, turn_id, detail)| {
            let item = tool_event_item(at, Incarnation(incarnation), &kind, turn_id, &detail, search.text);
            (HistoryCursor { at_ms: at, source: 1, id }, item)
        })
        .collect())
}

/// One stored tool event as a history item: its tool's name, status and a preview of its
/// output (or the reason it did not run).
fn tool_event_item(
    at: i64,
    incarnation: Incarnation,
    kind: &str,
    turn_id: Option<String>,
    detail: &str,
    text: Option<&str>,
) -> HistoryItem {
    let detail: serde_json::Value = serde_json::from_str(detail).unwrap_or(serde_json::Value::Null);
    let name = detail.get("name").and_then(|n| n.as_str()).unwrap_or("tool").to_owned();
    let shown = match detail.get("output").or_else(|| detail.get("reason")) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let status = TOOL_EVENTS.iter().find(|(k, _)| *k == kind).map_or("ok", |(_, s)| s).to_owned();
    let preview = excerpt(&shown.replace('\n', " "), text, PREVIEW_CHARS);
    HistoryItem::ToolEvent {
        at: rfc3339(at),
        incarnation,
        turn_id,
        name: canopy_core::redact::redact(&name, 80),
        status,
        preview,
    }
}

/// The newest `limit` items, and where the next (older) page starts when there is one.
fn page_of(mut items: Vec<(HistoryCursor, HistoryItem)>, limit: u32) -> HistoryPage {
    items.sort_by_key(|(key, _)| std::cmp::Reverse(*key));
    let more = items.len() > limit as usize;
    items.truncate(limit as usize);
    let next_before = if more { items.last().map(|(key, _)| *key) } else { None };
    HistoryPage { items: items.into_iter().map(|(_, item)| item).collect(), next_before }
}

/// Most trigrams of a query looked up in the index (spread over it); the text check that
/// follows keeps the answer exact whatever is left out.
const MAX_TRIGRAMS: usize = 12;

/// A text index query for the messages holding every trigram of `text` (each quoted, so
/// nothing in it is query syntax).
fn trigrams(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let all: Vec<String> = chars.windows(3).map(|w| w.iter().collect::<String>()).collect();
    let step = all.len().div_ceil(MAX_TRIGRAMS).max(1);
    let mut picked: Vec<&String> = all.iter().step_by(step).collect();
    if let Some(last) = all.last()
        && picked.last() != Some(&last)
    {
        picked.push(last);
    }
    picked.iter().map(|t| format!("\"{}\"", t.replace('"', "\"\""))).collect::<Vec<_>>().join(" AND ")
}

/// Most messages of the workspace a query may match in the text index for them to be its
/// candidates; past this, the caller's own history is walked instead.
const MAX_CANDIDATES: usize = 2_000;

/// The messages up to `through` holding `text`'s trigrams, as a JSON array of sequences, or
/// `None` when there are more than `MAX_CANDIDATES` of them.
fn candidates(conn: &Db<'_>, text: &str, through: i64) -> Result<Option<String>, Error> {
    let seqs: Vec<i64> = conn
        .prepare_cached(
            "SELECT rowid FROM message_text WHERE message_text MATCH ?1 AND rowid <= ?2 ORDER BY rowid DESC LIMIT ?3",
        )
        .and_then(|mut s| {
            s.query_map(params![trigrams(text), through, MAX_CANDIDATES as i64 + 1], |r| r.get(0))?.collect()
        })
        .map_err(sql("looking a query up in the text index"))?;
    if seqs.len() > MAX_CANDIDATES {
        return Ok(None);
    }
    serde_json::to_string(&seqs).map(Some).map_err(|e| Error::Internal(format!("encoding candidates: {e}")))
}

/// How far the text index has been filled: every message up to this sequence is in it.
fn indexed_through(conn: &Db<'_>) -> Result<i64, Error> {
    conn.prepare_cached("SELECT indexed_through FROM text_index WHERE id = 1")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(sql("reading how far the text index reaches"))
}

/// Adds the next messages after the text index's end to it, at most `max` (a writer job the
/// daemon repeats behind the post path); how many it added.
pub fn index_text(conn: &Db<'_>, max: usize) -> Result<usize, Error> {
    let from = indexed_through(conn)?;
    let through: Option<i64> = conn
        .prepare_cached("SELECT MAX(seq) FROM (SELECT seq FROM messages WHERE seq > ?1 ORDER BY seq LIMIT ?2)")
        .and_then(|mut s| s.query_row(params![from, max as i64], |r| r.get(0)))
        .map_err(sql("finding messages to index"))?;
    let Some(through) = through else { return Ok(0) };
    let added = conn
        .prepare_cached(
            "INSERT INTO message_text (rowid, body) SELECT seq, body FROM messages WHERE seq > ?1 AND seq <= ?2",
        )
        .and_then(|mut s| s.execute(params![from, through]))
        .map_err(sql("indexing message text"))?;
    conn.prepare_cached("UPDATE text_index SET indexed_through = ?1 WHERE id = 1")
        .and_then(|mut s| s.execute(params![through]))
        .map_err(sql("recording how far the text index reaches"))?;
    Ok(added)
}

/// Most pins the block lists; it shows fewer when they do not fit.
const PINS: i64 = 20;
/// Compaction checkpoints the block lists.
const CHECKPOINTS: i64 = 3;

/// Everything the continuity block says about an agent's live session, except subagent
/// runs (the daemon adds those).
pub fn continuity_facts(
    conn: &Db<'_>,
    agent: &str,
    incarnation: Incarnation,
    compaction: bool,
) -> Result<ContinuityFacts, Error> {
    let account = require_account(conn, "agent", agent)?;
    let (home_id, home, display_name): (Option<i64>, Option<String>, String) = conn
        .prepare_cached(
            "SELECT a.home_channel_id, c.name, a.display_name FROM accounts a \
             LEFT JOIN channels c ON c.id = a.home_channel_id WHERE a.id = ?1",
        )
        .and_then(|mut s| s.query_row(params![account.id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))))
        .map_err(sql("reading a home channel"))?;
    let reason = if compaction {
        ContinuityReason::Compaction
    } else {
        let previous: Option<Option<String>> = conn
            .prepare_cached(
                "SELECT end_reason FROM sessions WHERE agent_id = ?1 AND incarnation < ?2 ORDER BY incarnation DESC LIMIT 1",
            )
            .and_then(|mut s| s.query_row(params![account.id, incarnation.get() as i64], |r| r.get(0)).optional())
            .map_err(sql("reading the previous session"))?;
        ContinuityReason::Start {
            previous: previous
                .map(|why| format!("ended: {}", why.unwrap_or_else(|| "without a recorded reason".into()))),
        }
    };
    let checkpoints = conn
        .prepare_cached("SELECT at, incarnation, seq FROM compactions WHERE agent_id = ?1 ORDER BY id DESC LIMIT ?2")
        .and_then(|mut s| {
            s.query_map(params![account.id, CHECKPOINTS], |r| {
                Ok(Checkpoint {
                    at: rfc3339(r.get(0)?),
                    incarnation: Incarnation(r.get::<_, i64>(1)? as u64),
                    seq: Seq(r.get::<_, i64>(2)? as u64),
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sql("reading compaction checkpoints"))?;
    let open_spawn_requests = conn
        .prepare_cached(
            "SELECT id, handle, state FROM spawn_requests WHERE requester_id = ?1 \
             AND state IN ('pending', 'approved') ORDER BY id",
        )
        .and_then(|mut s| {
            s.query_map(params![account.id], |r| {
                Ok(format!("req-{}: @{} ({})", r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sql("reading open spawn requests"))?;
    // The home channel and every coordination channel the agent is in (its own and its parent's).
    let pins = conn
        .prepare_cached(&format!(
            "{MESSAGE_SELECT} JOIN pins p ON p.seq = m.seq AND p.channel_id = m.channel_id \
             WHERE m.channel_id = ?1 OR m.channel_id IN (SELECT sub.channel_id FROM subscriptions sub \
             JOIN channels c ON c.id = sub.channel_id WHERE sub.account_id = ?2 AND c.kind = 'coordination') \
             ORDER BY p.at DESC, p.seq DESC LIMIT ?3"
        ))
        .and_then(|mut s| {
            s.query_map(params![home_id, account.id, PINS], message_from_row)?.collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sql("reading pins"))?
        .into_iter()
        .map(|m| PinnedLine {
            channel: m.channel.to_string(),
            seq: m.seq,
            sender: m.sender.handle.to_string(),
            body: m.body,
        })
        .collect();
    Ok(ContinuityFacts {
        agent: account.handle.to_string(),
        display_name,
        role: account.role.map(|r| r.to_string()).unwrap_or_default(),
        incarnation,
        home_channel: home.unwrap_or_default(),
        reason,
        checkpoints,
        open_spawn_requests,
        pins,
        runs_out: Vec::new(),
    })
}
