//! Channels, topics and subscriptions.
//!
//! Operators create `general` and `broadcast` channels here; the daemon's own channels
//! (home now; coordination and direct later) are inserted by the code that owns their
//! lifecycle. A new subscription starts its cursor at the channel's newest message: an
//! account is owed what was posted after it joined, not the channel's history.

use canopy_core::Seq;
use canopy_core::acl::{Caller, may_read};
use canopy_core::{
    AccountKind, Channel, ChannelKind, ChannelName, Error, Handle, PostPolicy, SubscriptionPolicy, Topic, TopicName,
};
use rusqlite::{OptionalExtension, params};

use crate::schema::audit;
use crate::views::{load_channel, require_account, require_channel};
use crate::{Db, rfc3339, sql};

/// A channel an operator (or `init`) asks for.
#[derive(Debug, Clone)]
pub struct ChannelSpec {
    pub name: ChannelName,
    pub kind: ChannelKind,
    pub post_policy: PostPolicy,
    pub posters: Vec<Handle>,
    /// Whether posts wake idle recipients; `None` is the kind's default.
    pub wake: Option<canopy_core::WakePolicy>,
}

impl ChannelSpec {
    /// A broadcast channel only operators and `poster` may post in.
    pub fn broadcast(name: &str, poster: &Handle) -> Result<ChannelSpec, Error> {
        Ok(ChannelSpec {
            name: ChannelName::parse(name).map_err(|e| Error::name("name", e))?,
            kind: ChannelKind::Broadcast,
            post_policy: PostPolicy::Restricted,
            posters: vec![poster.clone()],
            wake: None,
        })
    }
}

/// Creates a channel. `caller` is `None` only for `init`, which acts as the system.
pub fn create_channel(conn: &Db<'_>, caller: Option<&Caller>, spec: &ChannelSpec) -> Result<Channel, Error> {
    let actor_id = match caller {
        Some(caller) => Some(require_account(conn, "caller", caller.handle.as_str())?.id),
        None => None,
    };
    if !matches!(spec.kind, ChannelKind::General | ChannelKind::Broadcast) {
        return Err(Error::invalid(
            "kind",
            format!("{} channels are made by the daemon; create a general or broadcast channel", spec.kind),
        ));
    }
    if !spec.posters.is_empty() && spec.post_policy != PostPolicy::Restricted {
        return Err(Error::invalid("posters", "a poster list only applies to post_policy restricted"));
    }
    if load_channel(conn, spec.name.as_str())?.is_some() {
        return Err(Error::AlreadyExists { field: "name", what: format!("channel #{}", spec.name) });
    }
    let mut poster_ids = Vec::with_capacity(spec.posters.len());
    for poster in &spec.posters {
        let account = require_account(conn, "posters", poster.as_str())?;
        if account.kind != AccountKind::Agent {
            return Err(Error::invalid("posters", format!("{poster} is an operator; operators may always post")));
        }
        poster_ids.push(account.id);
    }
    let broadcast = spec.kind == ChannelKind::Broadcast;
    let subscription = if broadcast { SubscriptionPolicy::Mandatory } else { SubscriptionPolicy::Optional };
    let owner = match (broadcast, poster_ids.first()) {
        (true, Some(first)) => Some(*first),
        _ => actor_id,
    };
    let channel_id = insert_channel(conn, &spec.name, spec.kind, spec.post_policy, subscription, owner)?;
    if let Some(wake) = spec.wake {
        conn.execute("UPDATE channels SET wake_policy = ?1 WHERE id = ?2", params![wake.as_str(), channel_id])
            .map_err(sql("setting a wake policy"))?;
    }
    for poster_id in poster_ids {
        conn.execute(
            "INSERT INTO channel_posters (channel_id, account_id) VALUES (?1, ?2)",
            params![channel_id, poster_id],
        )
        .map_err(sql("adding a poster"))?;
    }
    // Operators follow every channel they make; broadcast channels take every agent too.
    let members = if broadcast {
        "SELECT id FROM accounts WHERE kind IN ('agent', 'operator') AND state != 'despawned'"
    } else {
        "SELECT id FROM accounts WHERE kind = 'operator'"
    };
    subscribe_all(conn, members, broadcast, |account| (account, channel_id))?;
    audit(
        conn,
        actor_id,
        "channels.create",
        spec.name.as_str(),
        &format!("kind={} post_policy={}", spec.kind, spec.post_policy),
    )?;
    channel(conn, spec.name.as_str())
}

/// Inserts a channel row. No permission check; the caller owns the channel's lifecycle.
pub(crate) fn insert_channel(
    conn: &Db<'_>,
    name: &ChannelName,
    kind: ChannelKind,
    post_policy: PostPolicy,
    subscription: SubscriptionPolicy,
    owner_id: Option<i64>,
) -> Result<i64, Error> {
    conn.prepare_cached(
        "INSERT INTO channels (name, kind, post_policy, subscription_policy, owner_id, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut s| {
        s.execute(params![
            name.as_str(),
            kind.as_str(),
            post_policy.as_str(),
            subscription.as_str(),
            owner_id,
            conn.now_ms()
        ])
    })
    .map_err(|e| match e {
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::ConstraintViolation => {
            Error::AlreadyExists { field: "name", what: format!("channel #{name}") }
        }
        e => Error::Internal(format!("inserting channel #{name}: {e}")),
    })?;
    Ok(conn.last_insert_rowid())
}

/// `handle`'s cursor in `channel`: the last message delivered to it there (0 if none, or
/// not subscribed).
pub fn cursor(conn: &Db<'_>, handle: &str, channel: &ChannelName) -> Result<Seq, Error> {
    let cursor: Option<i64> = conn
        .prepare_cached(
            "SELECT s.cursor FROM subscriptions s JOIN accounts a ON a.id = s.account_id \
             JOIN channels c ON c.id = s.channel_id WHERE a.handle = ?1 AND c.name = ?2",
        )
        .and_then(|mut s| s.query_row(params![handle, channel.as_str()], |r| r.get(0)).optional())
        .map_err(sql("reading a cursor"))?;
    Ok(Seq(cursor.unwrap_or(0).max(0) as u64))
}

/// Subscribes an account to a channel (idempotent), its cursor at the channel's head.
pub(crate) fn subscribe(conn: &Db<'_>, account_id: i64, channel_id: i64, mandatory: bool) -> Result<(), Error> {
    conn.prepare_cached(
        "INSERT OR IGNORE INTO subscriptions (account_id, channel_id, mandatory, cursor, created_at) \
         VALUES (?1, ?2, ?3, (SELECT COALESCE(MAX(seq), 0) FROM messages WHERE channel_id = ?2), ?4)",
    )
    .and_then(|mut s| s.execute(params![account_id, channel_id, mandatory, conn.now_ms()]))
    .map_err(sql("subscribing"))?;
    Ok(())
}

/// Subscribes each `(account, channel)` pair produced from the ids a query returns.
pub(crate) fn subscribe_all(
    conn: &Db<'_>,
    query: &str,
    mandatory: bool,
    pair: impl Fn(i64) -> (i64, i64),
) -> Result<(), Error> {
    let ids: Vec<i64> = conn
        .prepare_cached(query)
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("listing subscription targets"))?;
    for id in ids {
        let (account, channel) = pair(id);
        subscribe(conn, account, channel, mandatory)?;
    }
    Ok(())
}

/// Whether an account is subscribed to a channel.
pub(crate) fn is_subscribed(conn: &Db<'_>, account_id: i64, channel_id: i64) -> Result<bool, Error> {
    conn.prepare_cached("SELECT 1 FROM subscriptions WHERE account_id = ?1 AND channel_id = ?2")
        .and_then(|mut s| s.query_row(params![account_id, channel_id], |_| Ok(())).optional())
        .map(|found| found.is_some())
        .map_err(sql("checking a subscription"))
}

/// One channel by name.
pub fn channel(conn: &Db<'_>, name: &str) -> Result<Channel, Error> {
    Ok(require_channel(conn, "channel", name)?.1)
}

/// Every channel, ordered by name.
pub fn list_channels(conn: &Db<'_>) -> Result<Vec<Channel>, Error> {
    let names: Vec<String> = conn
        .prepare_cached("SELECT name FROM channels ORDER BY name")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("listing channels"))?;
    names.iter().map(|name| channel(conn, name)).collect()
}

/// The topics of a channel the caller may read, most recent activity first.
pub fn list_topics(conn: &Db<'_>, caller: &Caller, channel_name: &str) -> Result<Vec<Topic>, Error> {
    let (channel_id, channel) = require_readable(conn, caller, channel_name)?;
    conn.prepare_cached(
        "SELECT t.name, a.handle, t.message_count, t.last_seq, t.last_activity_at, t.resolved FROM topics t \
         JOIN accounts a ON a.id = t.created_by WHERE t.channel_id = ?1 ORDER BY t.last_seq DESC, t.id DESC",
    )
    .and_then(|mut s| {
        s.query_map(params![channel_id], |r| {
            Ok(Topic {
                channel: channel.name.clone(),
                name: TopicName::from_trusted(r.get(0)?),
                created_by: Handle::from_trusted(r.get(1)?),
                messages: r.get::<_, i64>(2)? as u64,
                last_seq: Seq(r.get::<_, i64>(3)? as u64),
                last_activity_at: rfc3339(r.get(4)?),
                resolved: r.get(5)?,
            })
        })?
        .collect()
    })
    .map_err(sql("listing topics"))
}

/// Loads a channel and checks the caller may read it.
pub(crate) fn require_readable(conn: &Db<'_>, caller: &Caller, name: &str) -> Result<(i64, Channel), Error> {
    // The channel's facts without its counts: a read needs the id and who may read.
    let (channel_id, channel) = crate::views::channel_for_post(conn, name)?;
    let subscribed = if caller.is_operator() {
        true
    } else {
        let account = require_account(conn, "caller", caller.handle.as_str())?;
        is_subscribed(conn, account.id, channel_id)?
    };
    may_read(caller, &channel, subscribed)?;
    Ok((channel_id, channel))
}
