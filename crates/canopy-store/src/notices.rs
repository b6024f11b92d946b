//! Notices from Canopy into an agent's home channel: the system posts that sessions, budgets,
//! runs, merges and spawns send their agents.
//!
//! Owns the session notice topic and the lookup of an agent's home channel. Does not write
//! the message itself (`messages.rs` does) and does not decide what a notice says (the
//! wording comes from `canopy-core`).

use canopy_core::{ChannelName, Error, Message, TopicName};
use rusqlite::params;

use crate::messages::post_as_system;
use crate::{Db, sql};

/// Topic of the notices Canopy posts about an agent's sessions in its home channel.
pub const SESSION_NOTICE_TOPIC: &str = "canopy: sessions";

/// Posts a notice from Canopy into an agent's home channel.
pub fn notice(conn: &Db<'_>, agent_id: i64, body: &str) -> Result<Message, Error> {
    notice_in_home(conn, agent_id, &TopicName::from_trusted(SESSION_NOTICE_TOPIC.to_owned()), body)
}

/// Posts a notice from Canopy into an agent's home channel under `topic`.
pub(crate) fn notice_in_home(conn: &Db<'_>, agent_id: i64, topic: &TopicName, body: &str) -> Result<Message, Error> {
    let home: String = conn
        .prepare_cached(
            "SELECT COALESCE(c.name, mc.name) FROM accounts a LEFT JOIN channels c ON c.id = a.home_channel_id \
             LEFT JOIN accounts m ON m.id = a.run_of LEFT JOIN channels mc ON mc.id = m.home_channel_id \
             WHERE a.id = ?1",
        )
        .and_then(|mut s| s.query_row(params![agent_id], |r| r.get::<_, Option<String>>(0)))
        .map(Option::unwrap_or_default)
        .map_err(sql("finding a home channel"))?;
    post_as_system(conn, &ChannelName::from_trusted(home), topic, body)
}
