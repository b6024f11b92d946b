//! Channel governance: optional subscriptions, coordination channels, direct channels,
//! topic rename and resolve, and the pinned board.
//!
//! Coordination channels follow the tree: a Manager with reports owns `coord-<handle>`
//! (owner-only posting, mandatory for its reports), kept in step in the same transaction
//! as every parent edge change. Every parent and child also share a direct channel, so a
//! report can always answer its parent. Pins are pointers to messages of the same channel.

use canopy_core::Seq;
use canopy_core::acl::Caller;
use canopy_core::{
    AccountKind, Channel, ChannelKind, ChannelName, Error, Handle, Message, PostPolicy, SubscriptionPolicy, TopicName,
};
use rusqlite::{OptionalExtension, params};

use crate::channels::{channel, insert_channel, is_subscribed, subscribe, subscribe_all};
use crate::schema::audit;
use crate::views::{MESSAGE_SELECT, message_from_row, require_account, require_channel};
use crate::{Db, sql};

/// Subscribes the caller to an optional channel.
pub fn subscribe_self(conn: &Db<'_>, caller: &Caller, name: &ChannelName) -> Result<Channel, Error> {
    let account = require_account(conn, "caller", caller.handle.as_str())?;
    let (channel_id, channel_view) = require_channel(conn, "channel", name.as_str())?;
    if is_subscribed(conn, account.id, channel_id)? {
        return Ok(channel_view);
    }
    if channel_view.kind != ChannelKind::General || channel_view.subscription_policy != SubscriptionPolicy::Optional {
        return Err(Error::Forbidden {
            action: format!("subscribe to #{name}"),
            reason: format!("#{name} is a {} channel; its members are set by Canopy", channel_view.kind),
        });
    }
    subscribe(conn, account.id, channel_id, false)?;
    channel(conn, name.as_str())
}

/// Unsubscribes the caller from an optional channel; mandatory ones are refused.
pub fn unsubscribe_self(conn: &Db<'_>, caller: &Caller, name: &ChannelName) -> Result<Channel, Error> {
    let account = require_account(conn, "caller", caller.handle.as_str())?;
    let (channel_id, _) = require_channel(conn, "channel", name.as_str())?;
    let mandatory: Option<bool> = conn
        .prepare_cached("SELECT mandatory FROM subscriptions WHERE account_id = ?1 AND channel_id = ?2")
        .and_then(|mut s| s.query_row(params![account.id, channel_id], |r| r.get(0)).optional())
        .map_err(sql("reading a subscription"))?;
    match mandatory {
        None => Err(Error::invalid("channel", format!("{} is not subscribed to #{name}", caller.handle))),
        Some(true) => Err(Error::Forbidden {
            action: format!("leave #{name}"),
            reason: "the subscription is mandatory (home, broadcast, coordination and direct channels cannot be left)"
                .into(),
        }),
        Some(false) => {
            conn.execute(
                "DELETE FROM subscriptions WHERE account_id = ?1 AND channel_id = ?2",
                params![account.id, channel_id],
            )
            .map_err(sql("unsubscribing"))?;
            channel(conn, name.as_str())
        }
    }
}

/// Puts `child` in its parent's coordination channel (creating it) and leaves the old one.
/// Runs in the transaction that writes the parent edge.
pub(crate) fn link_parent(conn: &Db<'_>, child_id: i64, old_parent: Option<i64>, new_parent: i64) -> Result<(), Error> {
    if let Some(old) = old_parent
        && old != new_parent
    {
        let old_coord: Option<i64> = conn
            .query_row("SELECT coord_channel_id FROM accounts WHERE id = ?1", params![old], |r| r.get(0))
            .map_err(sql("reading a coordination channel"))?;
        if let Some(coord) = old_coord {
            conn.execute(
                "DELETE FROM subscriptions WHERE account_id = ?1 AND channel_id = ?2",
                params![child_id, coord],
            )
            .map_err(sql("leaving a coordination channel"))?;
        }
    }
    let coord = coordination_channel(conn, new_parent)?;
    subscribe(conn, child_id, coord, true)?;
    direct_between(conn, new_parent, child_id)?;
    Ok(())
}

/// The coordination channel a Manager owns, created on first use.
fn coordination_channel(conn: &Db<'_>, manager_id: i64) -> Result<i64, Error> {
    let (existing, handle): (Option<i64>, String) = conn
        .query_row("SELECT coord_channel_id, handle FROM accounts WHERE id = ?1", params![manager_id], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .map_err(sql("reading a coordination channel"))?;
    if let Some(id) = existing {
        return Ok(id);
    }
    let name = ChannelName::from_trusted(format!("coord-{handle}"));
    let id = insert_channel(
        conn,
        &name,
        ChannelKind::Coordination,
        PostPolicy::OwnerOnly,
        SubscriptionPolicy::Mandatory,
        Some(manager_id),
    )?;
    conn.execute("UPDATE accounts SET coord_channel_id = ?1 WHERE id = ?2", params![id, manager_id])
        .map_err(sql("linking a coordination channel"))?;
    subscribe(conn, manager_id, id, true)?;
    subscribe_all(conn, "SELECT id FROM accounts WHERE kind = 'operator'", true, |operator| (operator, id))?;
    Ok(id)
}

/// The direct (two-party) channel between two agents, created on first use.
fn direct_between(conn: &Db<'_>, a: i64, b: i64) -> Result<i64, Error> {
    // Walk from whichever of the two posts in fewer channels (a new agent, not the Supervisor
    // with a direct channel to each of its thousands of children): the CROSS JOIN keeps that
    // order whatever the planner guesses.
    let channels_of = |id: i64| -> Result<i64, Error> {
        conn.prepare_cached("SELECT COUNT(*) FROM (SELECT 1 FROM channel_posters WHERE account_id = ?1 LIMIT 256)")
            .and_then(|mut s| s.query_row(params![id], |r| r.get(0)))
            .map_err(sql("counting an account's channels"))
    };
    let (few, many) = if channels_of(a)? <= channels_of(b)? { (a, b) } else { (b, a) };
    let existing: Option<i64> = conn
        .prepare_cached(
            "SELECT c.id FROM channel_posters a CROSS JOIN channel_posters b ON b.channel_id = a.channel_id \
             JOIN channels c ON c.id = a.channel_id \
             WHERE a.account_id = ?1 AND b.account_id = ?2 AND c.kind = 'direct' LIMIT 1",
        )
        .and_then(|mut s| s.query_row(params![few, many], |r| r.get(0)).optional())
        .map_err(sql("finding a direct channel"))?;
    if let Some(id) = existing {
        return Ok(id);
    }
    let handles: Vec<String> = [a, b]
        .iter()
        .map(|id| conn.query_row("SELECT handle FROM accounts WHERE id = ?1", params![id], |r| r.get(0)))
        .collect::<rusqlite::Result<_>>()
        .map_err(sql("naming a direct channel"))?;
    let mut sorted = handles.clone();
    sorted.sort();
    let base: String =
        format!("dm-{}-{}", sorted[0], sorted[1]).chars().take(canopy_core::names::MAX_CHANNEL_LEN - 4).collect();
    let base = base.trim_end_matches('-').to_owned();
    let mut name = base.clone();
    let mut n = 2;
    while crate::views::load_channel(conn, &name)?.is_some() {
        name = format!("{base}-{n}");
        n += 1;
    }
    let id = insert_channel(
        conn,
        &ChannelName::from_trusted(name),
        ChannelKind::Direct,
        PostPolicy::Restricted,
        SubscriptionPolicy::Mandatory,
        Some(a),
    )?;
    for member in [a, b] {
        conn.execute("INSERT INTO channel_posters (channel_id, account_id) VALUES (?1, ?2)", params![id, member])
            .map_err(sql("adding a direct member"))?;
        subscribe(conn, member, id, true)?;
    }
    subscribe_all(conn, "SELECT id FROM accounts WHERE kind = 'operator'", true, |operator| (operator, id))?;
    Ok(id)
}

/// Opens (or returns) the caller's direct channel with a peer, its parent or a report.
pub fn open_direct(conn: &Db<'_>, caller: &Caller, peer: &Handle) -> Result<Channel, Error> {
    if caller.kind != AccountKind::Agent {
        return Err(Error::invalid("peer", "operators read every channel; direct channels are between agents"));
    }
    let me = require_account(conn, "caller", caller.handle.as_str())?;
    let other = require_account(conn, "peer", peer.as_str())?;
    if other.kind != AccountKind::Agent || other.id == me.id {
        return Err(Error::invalid("peer", format!("{peer} is not another agent")));
    }
    let related = other.parent_id == Some(me.id)
        || me.parent_id == Some(other.id)
        || (me.parent_id.is_some() && me.parent_id == other.parent_id);
    if !related {
        return Err(Error::Forbidden {
            action: format!("open a direct channel with {peer}"),
            reason: "direct channels connect an agent with its parent, its reports and its peers".into(),
        });
    }
    let id = direct_between(conn, me.id, other.id)?;
    let name: String = conn
        .query_row("SELECT name FROM channels WHERE id = ?1", params![id], |r| r.get(0))
        .map_err(sql("naming a direct channel"))?;
    channel(conn, &name)
}

/// Renames a topic (operators). Refuses a name already used in the channel.
pub fn rename_topic(
    conn: &Db<'_>,
    caller: &Caller,
    channel_name: &ChannelName,
    from: &TopicName,
    to: &TopicName,
) -> Result<(), Error> {
    let (channel_id, _) = require_channel(conn, "channel", channel_name.as_str())?;
    let taken: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM topics WHERE channel_id = ?1 AND name = ?2)",
            params![channel_id, to.as_str()],
            |r| r.get(0),
        )
        .map_err(sql("checking a topic name"))?;
    if taken {
        return Err(Error::AlreadyExists { field: "to", what: format!("topic {to:?} in #{channel_name}") });
    }
    let changed = conn
        .execute(
            "UPDATE topics SET name = ?1 WHERE channel_id = ?2 AND name = ?3",
            params![to.as_str(), channel_id, from.as_str()],
        )
        .map_err(sql("renaming a topic"))?;
    if changed == 0 {
        return Err(Error::TopicNotFound {
            channel: channel_name.to_string(),
            topic: from.to_string(),
            existing: Vec::new(),
        });
    }
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    audit(conn, Some(actor.id), "topics.rename", &format!("#{channel_name} {from:?}"), &format!("to {to:?}"))
}

/// Marks a topic resolved or open again (operators).
pub fn resolve_topic(
    conn: &Db<'_>,
    caller: &Caller,
    channel_name: &ChannelName,
    topic: &TopicName,
    resolved: bool,
) -> Result<(), Error> {
    let (channel_id, _) = require_channel(conn, "channel", channel_name.as_str())?;
    let changed = conn
        .execute(
            "UPDATE topics SET resolved = ?1 WHERE channel_id = ?2 AND name = ?3",
            params![resolved, channel_id, topic.as_str()],
        )
        .map_err(sql("resolving a topic"))?;
    if changed == 0 {
        return Err(Error::TopicNotFound {
            channel: channel_name.to_string(),
            topic: topic.to_string(),
            existing: Vec::new(),
        });
    }
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    let action = if resolved { "topics.resolve" } else { "topics.reopen" };
    audit(conn, Some(actor.id), action, &format!("#{channel_name} {:?}", topic.as_str()), "")
}

/// Pins a message of a channel to its board. The caller must be able to read the channel
/// (operators, or subscribed agents); the message must belong to that channel.
pub fn pin(conn: &Db<'_>, caller: &Caller, channel_name: &ChannelName, seq: Seq) -> Result<Vec<Message>, Error> {
    let (channel_id, channel_view) = require_channel(conn, "channel", channel_name.as_str())?;
    let account = require_account(conn, "caller", caller.handle.as_str())?;
    let subscribed = caller.is_operator() || is_subscribed(conn, account.id, channel_id)?;
    canopy_core::acl::may_pin(caller, &channel_view, subscribed)?;
    let message_channel: Option<i64> = conn
        .query_row("SELECT channel_id FROM messages WHERE seq = ?1", params![seq.get() as i64], |r| r.get(0))
        .optional()
        .map_err(sql("finding a message to pin"))?;
    match message_channel {
        None => return Err(Error::invalid("seq", format!("there is no message {seq}"))),
        Some(c) if c != channel_id => {
            return Err(Error::invalid(
                "seq",
                format!("message {seq} is not in #{channel_name}; pins point into their own channel"),
            ));
        }
        Some(_) => {}
    }
    let pinned = conn
        .execute(
            "INSERT OR IGNORE INTO pins (channel_id, seq, pinned_by, at) VALUES (?1, ?2, ?3, ?4)",
            params![channel_id, seq.get() as i64, account.id, conn.now_ms()],
        )
        .map_err(sql("pinning"))?;
    if pinned > 0 {
        crate::schema::audit(conn, Some(account.id), "board.pin", channel_name.as_str(), &seq.to_string())?;
    }
    board(conn, caller, channel_name)
}

/// Takes message `seq` off the channel's board: an operator may unpin any pin, an agent only
/// its own. A message that is not pinned there is `not_found` naming `seq`.
pub fn unpin(conn: &Db<'_>, caller: &Caller, channel_name: &ChannelName, seq: Seq) -> Result<Vec<Message>, Error> {
    let (channel_id, _) = require_channel(conn, "channel", channel_name.as_str())?;
    let account = require_account(conn, "caller", caller.handle.as_str())?;
    let pinned_by: Option<i64> = conn
        .query_row(
            "SELECT pinned_by FROM pins WHERE channel_id = ?1 AND seq = ?2",
            params![channel_id, seq.get() as i64],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql("finding a pin"))?;
    match pinned_by {
        None => {
            return Err(Error::NotFound { field: "seq", what: format!("a pin of message {seq} in #{channel_name}") });
        }
        Some(by) => canopy_core::acl::may_unpin(caller, channel_name.as_str(), seq, by == account.id)?,
    }
    conn.execute("DELETE FROM pins WHERE channel_id = ?1 AND seq = ?2", params![channel_id, seq.get() as i64])
        .map_err(sql("unpinning"))?;
    crate::schema::audit(conn, Some(account.id), "board.unpin", channel_name.as_str(), &seq.to_string())?;
    board(conn, caller, channel_name)
}

/// A channel's pinned messages, in pin order.
pub fn board(conn: &Db<'_>, caller: &Caller, channel_name: &ChannelName) -> Result<Vec<Message>, Error> {
    let (channel_id, _) = crate::channels::require_readable(conn, caller, channel_name.as_str())?;
    conn.prepare_cached(&format!(
        "{MESSAGE_SELECT} JOIN pins p ON p.seq = m.seq AND p.channel_id = m.channel_id WHERE m.channel_id = ?1 ORDER BY p.at, p.seq"
    ))
    .and_then(|mut s| s.query_map(params![channel_id], message_from_row)?.collect())
    .map_err(sql("reading a board"))
}
