//! Row mappers: how stored rows become the model types of `canopy-core`.
//!
//! Owns the SELECT lists that feed them, so a column change is made in one place.
//! Also the lookups every area shares (an account or a channel by name, the agents after a
//! page): this module sits below all the others and imports none of them.

use canopy_core::Seq;
use canopy_core::{
    Account, AccountKind, AccountState, Channel, ChannelKind, ChannelName, Error, Handle, Message, PostPolicy,
    RoleName, Sender, SubscriptionPolicy, TopicName, WakePolicy,
};
use rusqlite::{OptionalExtension, Row, params};

use crate::{Db, rfc3339, sql};

/// Columns for `account_from_row`.
pub(crate) const ACCOUNT_SELECT: &str = "SELECT a.handle, a.display_name, a.kind, a.role, p.handle, c.name, \
     a.charter, a.state, a.created_at FROM accounts a \
     LEFT JOIN accounts p ON p.id = a.parent_id LEFT JOIN channels c ON c.id = a.home_channel_id";

pub(crate) fn account_from_row(row: &Row<'_>) -> rusqlite::Result<Account> {
    Ok(Account {
        handle: Handle::from_trusted(row.get(0)?),
        display_name: row.get(1)?,
        kind: parse_enum(row, 2, AccountKind::parse)?,
        role: row.get::<_, Option<String>>(3)?.map(RoleName::from_trusted),
        parent: row.get::<_, Option<String>>(4)?.map(Handle::from_trusted),
        home_channel: row.get::<_, Option<String>>(5)?.map(ChannelName::from_trusted),
        charter: row.get(6)?,
        state: parse_enum(row, 7, AccountState::parse)?,
        created_at: rfc3339(row.get(8)?),
    })
}

/// Columns for `message_from_row`.
pub(crate) const MESSAGE_SELECT: &str = "SELECT m.seq, ch.name, t.name, s.handle, s.kind, s.role, m.body, \
     m.mentions, m.created_at FROM messages m JOIN channels ch ON ch.id = m.channel_id \
     JOIN topics t ON t.id = m.topic_id JOIN accounts s ON s.id = m.sender_id";

pub(crate) fn message_from_row(row: &Row<'_>) -> rusqlite::Result<Message> {
    message_from_row_offset(row, 0)
}

/// `message_from_row` for a SELECT with `offset` extra columns before `MESSAGE_SELECT`'s.
pub(crate) fn message_from_row_offset(row: &Row<'_>, offset: usize) -> rusqlite::Result<Message> {
    let mentions: String = row.get(offset + 7)?;
    let mentions: Vec<String> = serde_json::from_str(&mentions).unwrap_or_default();
    Ok(Message {
        seq: Seq(row.get::<_, i64>(offset)? as u64),
        channel: ChannelName::from_trusted(row.get(offset + 1)?),
        topic: TopicName::from_trusted(row.get(offset + 2)?),
        sender: Sender {
            handle: Handle::from_trusted(row.get(offset + 3)?),
            kind: parse_enum(row, offset + 4, AccountKind::parse)?,
            role: row.get::<_, Option<String>>(offset + 5)?.map(RoleName::from_trusted),
        },
        body: row.get(offset + 6)?,
        mentions: mentions.into_iter().map(Handle::from_trusted).collect(),
        created_at: rfc3339(row.get(offset + 8)?),
    })
}

/// Reads a closed enum column, turning an unknown value into a conversion error.
pub(crate) fn parse_enum<T>(row: &Row<'_>, index: usize, parse: fn(&str) -> Option<T>) -> rusqlite::Result<T> {
    let text: String = row.get(index)?;
    parse(&text).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            index,
            rusqlite::types::Type::Text,
            format!("unexpected stored value {text:?}").into(),
        )
    })
}

/// A channel's id and its view without counts or posters.
fn channel_row(conn: &Db<'_>, name: &str) -> Result<Option<(i64, Channel)>, Error> {
    conn.prepare_cached(
        "SELECT c.id, c.name, c.kind, c.post_policy, c.subscription_policy, o.handle, c.created_at, c.wake_policy \
         FROM channels c LEFT JOIN accounts o ON o.id = c.owner_id WHERE c.name = ?1",
    )
    .and_then(|mut s| {
        s.query_row(params![name], |row| {
            let name: String = row.get(1)?;
            let kind = parse_enum(row, 2, ChannelKind::parse)?;
            let wake = row
                .get::<_, Option<String>>(7)?
                .and_then(|w| WakePolicy::parse(&w))
                .unwrap_or_else(|| WakePolicy::default_for(kind, &name));
            Ok((
                row.get::<_, i64>(0)?,
                Channel {
                    name: ChannelName::from_trusted(name),
                    kind,
                    post_policy: parse_enum(row, 3, PostPolicy::parse)?,
                    subscription_policy: parse_enum(row, 4, SubscriptionPolicy::parse)?,
                    owner: row.get::<_, Option<String>>(5)?.map(Handle::from_trusted),
                    posters: Vec::new(),
                    created_at: rfc3339(row.get(6)?),
                    subscribers: 0,
                    last_seq: Seq(0),
                    wake,
                },
            ))
        })
        .optional()
    })
    .map_err(sql("reading a channel"))
}

/// A channel's id and the parts of its view that decide who may post or read (no counts).
pub(crate) fn channel_for_post(conn: &Db<'_>, name: &str) -> Result<(i64, Channel), Error> {
    match conn.memo {
        Some(memo) => memo.channel(name, || read_channel_for_post(conn, name)),
        None => read_channel_for_post(conn, name),
    }
}

fn read_channel_for_post(conn: &Db<'_>, name: &str) -> Result<(i64, Channel), Error> {
    let Some((id, mut channel)) = channel_row(conn, name)? else {
        return Err(channel_not_found(conn, "channel", name)?);
    };
    if channel.post_policy == PostPolicy::Restricted {
        channel.posters = posters(conn, id)?;
    }
    Ok((id, channel))
}

fn posters(conn: &Db<'_>, channel_id: i64) -> Result<Vec<Handle>, Error> {
    conn.prepare_cached(
        "SELECT a.handle FROM channel_posters p JOIN accounts a ON a.id = p.account_id \
         WHERE p.channel_id = ?1 ORDER BY a.handle",
    )
    .and_then(|mut s| {
        s.query_map(params![channel_id], |r| r.get::<_, String>(0).map(Handle::from_trusted))?
            .collect::<rusqlite::Result<Vec<_>>>()
    })
    .map_err(sql("reading a channel's posters"))
}

/// A channel's id and its full view.
pub(crate) fn load_channel(conn: &Db<'_>, name: &str) -> Result<Option<(i64, Channel)>, Error> {
    let Some((id, mut channel)) = channel_row(conn, name)? else { return Ok(None) };
    let (subscribers, last_seq): (i64, i64) = conn
        .prepare_cached(
            "SELECT (SELECT COUNT(*) FROM subscriptions s WHERE s.channel_id = ?1), \
             (SELECT COALESCE(MAX(seq), 0) FROM messages m WHERE m.channel_id = ?1)",
        )
        .and_then(|mut s| s.query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(sql("counting a channel"))?;
    channel.subscribers = subscribers as u64;
    channel.last_seq = Seq(last_seq as u64);
    channel.posters = posters(conn, id)?;
    Ok(Some((id, channel)))
}

/// The facts about one account that rules need: its row id, kind, role and state.
#[derive(Debug, Clone)]
pub(crate) struct AccountRef {
    pub id: i64,
    pub handle: Handle,
    pub kind: AccountKind,
    pub role: Option<RoleName>,
    pub state: AccountState,
    pub parent_id: Option<i64>,
}

pub(crate) fn account_ref(conn: &Db<'_>, handle: &str) -> Result<Option<AccountRef>, Error> {
    match conn.memo {
        Some(memo) => memo.account(handle, || read_account_ref(conn, handle)),
        None => read_account_ref(conn, handle),
    }
}

fn read_account_ref(conn: &Db<'_>, handle: &str) -> Result<Option<AccountRef>, Error> {
    conn.prepare_cached("SELECT id, handle, kind, role, state, parent_id FROM accounts WHERE handle = ?1")
        .and_then(|mut s| s.query_row(params![handle], account_ref_from_row).optional())
        .map_err(sql("reading an account"))
}

pub(crate) fn account_ref_by_id(conn: &Db<'_>, id: i64) -> Result<Option<AccountRef>, Error> {
    conn.prepare_cached("SELECT id, handle, kind, role, state, parent_id FROM accounts WHERE id = ?1")
        .and_then(|mut s| s.query_row(params![id], account_ref_from_row).optional())
        .map_err(sql("reading an account"))
}

fn account_ref_from_row(row: &Row<'_>) -> rusqlite::Result<AccountRef> {
    Ok(AccountRef {
        id: row.get(0)?,
        handle: Handle::from_trusted(row.get(1)?),
        kind: parse_enum(row, 2, AccountKind::parse)?,
        role: row.get::<_, Option<String>>(3)?.map(RoleName::from_trusted),
        state: parse_enum(row, 4, AccountState::parse)?,
        parent_id: row.get(5)?,
    })
}

/// The account with this handle, or `AgentNotFound` naming `field`.
pub(crate) fn require_account(conn: &Db<'_>, field: &'static str, handle: &str) -> Result<AccountRef, Error> {
    match account_ref(conn, handle)? {
        Some(account) => Ok(account),
        None => {
            let nearest = nearest_name(conn, "SELECT handle FROM accounts WHERE state != 'despawned'", handle)?;
            Err(Error::AgentNotFound { field, handle: handle.to_owned(), nearest })
        }
    }
}

/// `ChannelNotFound` for `name`, with the nearest existing channel when one is close.
fn channel_not_found(conn: &Db<'_>, field: &'static str, name: &str) -> Result<Error, Error> {
    let nearest = nearest_name(conn, "SELECT name FROM channels", name)?;
    Ok(Error::ChannelNotFound { field, channel: name.to_owned(), nearest })
}

/// The name among `query`'s results closest to `wanted` (`canopy_core::names::nearest`).
fn nearest_name(conn: &Db<'_>, query: &str, wanted: &str) -> Result<Option<String>, Error> {
    let names: Vec<String> = conn
        .prepare_cached(query)
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("listing names for a suggestion"))?;
    Ok(canopy_core::names::nearest(wanted, names.iter().map(String::as_str)).map(str::to_owned))
}

/// The channel with this name, or `ChannelNotFound` naming `field`.
pub(crate) fn require_channel(conn: &Db<'_>, field: &'static str, name: &str) -> Result<(i64, Channel), Error> {
    match load_channel(conn, name)? {
        Some(found) => Ok(found),
        None => Err(channel_not_found(conn, field, name)?),
    }
}

/// How many standing agents come after a page that ended at `last` with `len` of at most
/// `limit` entries (none when the page was not full): the `more` of the agent list and the
/// roster, counted on the handle index.
pub(crate) fn agents_beyond(conn: &Db<'_>, last: Option<&str>, len: usize, limit: Option<usize>) -> Result<u64, Error> {
    let Some(last) = last.filter(|_| limit.is_some_and(|l| len >= l)) else { return Ok(0) };
    conn.prepare_cached("SELECT COUNT(*) FROM accounts WHERE kind = 'agent' AND run_of IS NULL AND handle > ?1")
        .and_then(|mut s| s.query_row(params![last], |r| r.get::<_, i64>(0)))
        .map(|n| n as u64)
        .map_err(sql("counting the agents after a page"))
}
