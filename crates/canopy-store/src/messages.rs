//! Messages: posting (with idempotency and topic creation) and paging.
//!
//! A post is one write job: it checks the channel's post policy, finds or (when asked)
//! starts the topic, inserts the message and bumps the topic's activity, all in the
//! writer's transaction. A retry with the same `(sender, idempotency_key)` returns the
//! stored message, and a different message under a used key is a `conflict`. A post the
//! policy forbids is written to the audit log in that same job (`post_audited`).

use canopy_core::acl::{Caller, may_post};
use canopy_core::mention::parse_mentions;
use canopy_core::{AccountKind, ChannelName, Error, Handle, Message, Sender, Seq, TopicName};
use rusqlite::{OptionalExtension, params};

use crate::channels::{is_subscribed, require_readable};
use crate::schema::audit;
use crate::views::{MESSAGE_SELECT, channel_for_post, message_from_row, require_account, require_channel};
use crate::{Db, rfc3339, sql};

/// A message to commit. Names are parsed and the body's size checked by the caller.
#[derive(Debug, Clone)]
pub struct PostSpec {
    pub channel: ChannelName,
    pub topic: TopicName,
    pub body: String,
    pub create_topic: bool,
    pub idempotency_key: Option<String>,
    /// An acknowledgement: delivered at the recipients' next turn, never waking anyone.
    pub ack_only: bool,
    /// Wake every idle recipient whatever the channel's wake policy (operators only).
    pub wake: bool,
}

/// A committed post and whom it reaches.
#[derive(Debug, Clone)]
pub struct Posted {
    pub message: Message,
    /// True when this was a retry of an earlier post with the same key.
    pub duplicate: bool,
    /// For `delivery::reach`, read in the same writer job after the insert (`post_and_reach`).
    pub channel_id: i64,
    pub sender_id: i64,
    /// Why idle recipients it does not mention are not woken (the channel's wake policy), or
    /// `None` when it wakes them.
    pub quiet: Option<String>,
}

/// A page of messages in sequence order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub messages: Vec<Message>,
    /// The sequence to pass as `after` for the next page.
    pub next_after: Seq,
    pub more: bool,
}

/// Commits a message. Whom it reaches is read afterwards (`delivery::reach`), so the
/// writer's transaction holds only what must be atomic with the insert.
pub fn post(conn: &Db<'_>, caller: &Caller, spec: &PostSpec) -> Result<Posted, Error> {
    let sender = require_account(conn, "caller", caller.handle.as_str())?;
    if let Some(key) = &spec.idempotency_key
        && let Some(seq) = conn
            .prepare_cached("SELECT seq FROM messages WHERE sender_id = ?1 AND idempotency_key = ?2")
            .and_then(|mut s| s.query_row(params![sender.id, key], |r| r.get::<_, i64>(0)).optional())
            .map_err(sql("looking up an idempotency key"))?
    {
        let stored = message(conn, seq)?;
        if stored.channel == spec.channel && stored.topic == spec.topic && stored.body == spec.body {
            return Ok(Posted { message: stored, duplicate: true, channel_id: 0, sender_id: sender.id, quiet: None });
        }
        return Err(Error::ConflictOn {
            field: "idempotency_key",
            reason: format!(
                "key {key:?} was already used for a different message (seq {} in #{} > {})",
                stored.seq, stored.channel, stored.topic
            ),
        });
    }

    let (channel_id, channel) = channel_for_post(conn, spec.channel.as_str())?;
    let subscribed = caller.is_operator() || is_subscribed(conn, sender.id, channel_id)?;
    may_post(caller, &channel, subscribed)?;
    if spec.wake && !caller.is_operator() {
        return Err(Error::Forbidden {
            action: format!("force a wake in #{}", spec.channel),
            reason: "only an operator overrides a channel's wake policy".into(),
        });
    }
    let wake = match (spec.wake, channel.wake) {
        (true, _) | (false, canopy_core::WakePolicy::Always) => "all",
        (false, canopy_core::WakePolicy::Mentions) => "mentioned",
        (false, canopy_core::WakePolicy::Never) => "none",
    };
    let quiet = if spec.wake { None } else { channel.wake.quiet_reason(spec.channel.as_str()) };

    let now = conn.now_ms();
    let topic_id = match topic_id(conn, channel_id, &spec.topic)? {
        Some(id) => id,
        None if spec.create_topic => {
            conn.prepare_cached(
                "INSERT INTO topics (channel_id, name, created_by, created_at, last_activity_at) VALUES (?1, ?2, ?3, ?4, ?4)",
            )
            .and_then(|mut s| s.execute(params![channel_id, spec.topic.as_str(), sender.id, now]))
            .map_err(sql("starting a topic"))?;
            conn.last_insert_rowid()
        }
        None => {
            let existing: Vec<String> = conn
                .prepare_cached("SELECT name FROM topics WHERE channel_id = ?1 ORDER BY last_seq DESC LIMIT 20")
                .and_then(|mut s| s.query_map(params![channel_id], |r| r.get(0))?.collect())
                .map_err(sql("listing topics"))?;
            return Err(Error::TopicNotFound {
                channel: spec.channel.to_string(),
                topic: spec.topic.to_string(),
                existing,
            });
        }
    };

    let new = NewMessage {
        channel_id,
        channel: &spec.channel,
        topic_id,
        topic: &spec.topic,
        sender_id: sender.id,
        sender: Sender { handle: sender.handle.clone(), kind: sender.kind, role: sender.role.clone() },
        body: &spec.body,
        idempotency_key: spec.idempotency_key.as_deref(),
        ack_only: spec.ack_only,
        wake,
    };
    let message = insert_message(conn, new, now)?;
    Ok(Posted { message, duplicate: false, channel_id, sender_id: sender.id, quiet })
}

/// Commits a message like `post`; when the post policy forbids it, commits an audit record
/// of the refusal instead (`messages.post.refused`, naming the channel, the topic and why)
/// and returns the refusal inside `Ok`, so the job's savepoint is kept rather than rolled
/// back. `post` refuses on policy before it writes anything, so the record is all the
/// attempt leaves behind. Any other failure is returned as the job's error and rolls back.
pub fn post_audited(conn: &Db<'_>, caller: &Caller, spec: &PostSpec) -> Result<Result<Posted, Error>, Error> {
    match post(conn, caller, spec) {
        Err(Error::Forbidden { action, reason }) => {
            let actor = require_account(conn, "caller", caller.handle.as_str())?;
            let detail = format!("topic {:?}: {reason}", spec.topic.as_str());
            audit(conn, Some(actor.id), "messages.post.refused", &format!("#{}", spec.channel), &detail)?;
            Ok(Err(Error::Forbidden { action, reason }))
        }
        other => other.map(Ok),
    }
}

/// The writer job behind `messages.post`: the post (or its audited refusal, `post_audited`)
/// and, for a new message, whom it reaches, read in the same job after the insert: one trip
/// to the writer per post instead of a second one to a reader after the commit. A retry of
/// an earlier post (`duplicate`) reaches no one again, so it reads no recipients.
pub fn post_and_reach(
    conn: &Db<'_>,
    caller: &Caller,
    spec: &PostSpec,
) -> Result<(Result<Posted, Error>, Option<crate::delivery::Reach>), Error> {
    let posted = post_audited(conn, caller, spec)?;
    let reach = match &posted {
        Ok(p) if !p.duplicate => Some(crate::delivery::reach(conn, p.channel_id, p.sender_id, &p.message.mentions)?),
        _ => None,
    };
    Ok((posted, reach))
}

/// A page of one channel (optionally one topic) after `after`, for a caller who may read it.
pub fn read_channel(
    conn: &Db<'_>,
    caller: &Caller,
    channel: &ChannelName,
    topic: Option<&TopicName>,
    after: Seq,
    limit: u32,
    newest: bool,
) -> Result<Page, Error> {
    let (channel_id, _) = require_readable(conn, caller, channel.as_str())?;
    let topic_id = match topic {
        None => None,
        Some(topic) => Some(topic_id(conn, channel_id, topic)?.ok_or_else(|| {
            let existing = conn
                .prepare_cached("SELECT name FROM topics WHERE channel_id = ?1 ORDER BY last_seq DESC LIMIT 20")
                .and_then(|mut s| s.query_map(params![channel_id], |r| r.get(0))?.collect())
                .unwrap_or_default();
            Error::TopicNotFound { channel: channel.to_string(), topic: topic.to_string(), existing }
        })?),
    };
    let fetch = i64::from(limit) + 1;
    // The newest page reads backwards from the end; either way a page is oldest first.
    let order = if newest { "DESC" } else { "ASC" };
    let mut messages: Vec<Message> = match topic_id {
        Some(topic_id) => conn
            .prepare_cached(&format!(
                "{MESSAGE_SELECT} WHERE m.topic_id = ?1 AND m.seq > ?2 ORDER BY m.seq {order} LIMIT ?3"
            ))
            .and_then(|mut s| s.query_map(params![topic_id, after.get() as i64, fetch], message_from_row)?.collect()),
        None => conn
            .prepare_cached(&format!(
                "{MESSAGE_SELECT} WHERE m.channel_id = ?1 AND m.seq > ?2 ORDER BY m.seq {order} LIMIT ?3"
            ))
            .and_then(|mut s| s.query_map(params![channel_id, after.get() as i64, fetch], message_from_row)?.collect()),
    }
    .map_err(sql("reading messages"))?;
    if newest {
        // `more` then says older messages exist; `next_after` is the newest, to follow from.
        let more = messages.len() > limit as usize;
        messages.truncate(limit as usize);
        messages.reverse();
        let next_after = messages.last().map_or(after, |m| m.seq);
        return Ok(Page { messages, next_after, more });
    }
    Ok(page(messages, after, limit))
}

/// A flat page of every channel the caller may read (or one channel) after `after`.
pub fn sync(
    conn: &Db<'_>,
    caller: &Caller,
    channel: Option<&ChannelName>,
    after: Seq,
    limit: u32,
) -> Result<Page, Error> {
    if let Some(channel) = channel {
        return read_channel(conn, caller, channel, None, after, limit, false);
    }
    let fetch = i64::from(limit) + 1;
    let messages: Vec<Message> = if caller.is_operator() {
        conn.prepare_cached(&format!("{MESSAGE_SELECT} WHERE m.seq > ?1 ORDER BY m.seq LIMIT ?2"))
            .and_then(|mut s| s.query_map(params![after.get() as i64, fetch], message_from_row)?.collect())
    } else {
        let account = require_account(conn, "caller", caller.handle.as_str())?;
        conn.prepare_cached(&format!(
            "{MESSAGE_SELECT} WHERE m.seq > ?1 AND m.channel_id IN \
             (SELECT channel_id FROM subscriptions WHERE account_id = ?2) ORDER BY m.seq LIMIT ?3"
        ))
        .and_then(|mut s| s.query_map(params![after.get() as i64, account.id, fetch], message_from_row)?.collect())
    }
    .map_err(sql("syncing messages"))?;
    Ok(page(messages, after, limit))
}

fn page(mut messages: Vec<Message>, after: Seq, limit: u32) -> Page {
    let more = messages.len() > limit as usize;
    messages.truncate(limit as usize);
    let next_after = messages.last().map_or(after, |m| m.seq);
    Page { messages, next_after, more }
}

fn topic_id(conn: &Db<'_>, channel_id: i64, topic: &TopicName) -> Result<Option<i64>, Error> {
    conn.prepare_cached("SELECT id FROM topics WHERE channel_id = ?1 AND name = ?2")
        .and_then(|mut s| s.query_row(params![channel_id, topic.as_str()], |r| r.get(0)).optional())
        .map_err(sql("finding a topic"))
}

fn message(conn: &Db<'_>, seq: i64) -> Result<Message, Error> {
    conn.prepare_cached(&format!("{MESSAGE_SELECT} WHERE m.seq = ?1"))
        .and_then(|mut s| s.query_row(params![seq], message_from_row))
        .map_err(sql("reading a message"))
}

/// Posts as Canopy itself (the `system` account), starting the topic if needed. Used for
/// notices the daemon owes the operator; no post policy applies.
pub(crate) fn post_as_system(
    conn: &Db<'_>,
    channel: &ChannelName,
    topic: &TopicName,
    body: &str,
) -> Result<Message, Error> {
    let system_id: i64 = conn
        .prepare_cached("SELECT id FROM accounts WHERE kind = 'system' ORDER BY id LIMIT 1")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(sql("finding the system account"))?;
    let (channel_id, _) = require_channel(conn, "channel", channel.as_str())?;
    let now = conn.now_ms();
    let topic_id = match topic_id(conn, channel_id, topic)? {
        Some(id) => id,
        None => {
            conn.prepare_cached(
                "INSERT INTO topics (channel_id, name, created_by, created_at, last_activity_at) VALUES (?1, ?2, ?3, ?4, ?4)",
            )
            .and_then(|mut s| s.execute(params![channel_id, topic.as_str(), system_id, now]))
            .map_err(sql("starting a topic"))?;
            conn.last_insert_rowid()
        }
    };
    let sender = Sender { handle: Handle::from_trusted("canopy".into()), kind: AccountKind::System, role: None };
    let new = NewMessage {
        channel_id,
        channel,
        topic_id,
        topic,
        sender_id: system_id,
        sender,
        body,
        idempotency_key: None,
        ack_only: false,
        wake: "all",
    };
    insert_message(conn, new, now)
}

/// A message row to insert.
struct NewMessage<'a> {
    channel_id: i64,
    channel: &'a ChannelName,
    topic_id: i64,
    topic: &'a TopicName,
    sender_id: i64,
    sender: Sender,
    body: &'a str,
    idempotency_key: Option<&'a str>,
    ack_only: bool,
    /// Whom it wakes: `all`, `mentioned` or `none`.
    wake: &'a str,
}

/// Inserts a message and bumps its topic; returns the stored message.
fn insert_message(conn: &Db<'_>, new: NewMessage<'_>, now: i64) -> Result<Message, Error> {
    let NewMessage { channel_id, channel, topic_id, topic, sender_id, sender, body, idempotency_key, ack_only, wake } =
        new;
    let mentions = parse_mentions(body);
    let mentions_json =
        serde_json::to_string(&mentions).map_err(|e| Error::Internal(format!("encoding mentions: {e}")))?;
    conn.prepare_cached(
        "INSERT INTO messages (channel_id, topic_id, sender_id, body, mentions, idempotency_key, created_at, ack_only, \
         wake) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )
    .and_then(|mut s| {
        s.execute(params![channel_id, topic_id, sender_id, body, mentions_json, idempotency_key, now, ack_only, wake])
    })
    .map_err(sql("inserting a message"))?;
    let seq = conn.last_insert_rowid();
    conn.prepare_cached(
        "UPDATE topics SET last_seq = ?1, last_activity_at = ?2, message_count = message_count + 1 WHERE id = ?3",
    )
    .and_then(|mut s| s.execute(params![seq, now, topic_id]))
    .map_err(sql("updating a topic"))?;
    // Built from what is known rather than read back: this is the hot path of every post.
    Ok(Message {
        seq: Seq(seq as u64),
        channel: channel.clone(),
        topic: topic.clone(),
        sender,
        body: body.to_owned(),
        mentions,
        created_at: rfc3339(now),
    })
}
