//! Raw baselines and fixtures for `canopy-bench`: the cheapest durable write this store can
//! do, so a benchmark can print Canopy's figures beside what SQLite alone costs on the same
//! machine, and the fillers that give a benchmark a workspace of a given size.
//!
//! Compiled only with the `testing` feature: benchmark scaffolding, not part of the shipped
//! store. Does not measure anything itself; `canopy-bench` times these calls.

use canopy_core::Error;

use crate::{Store, sql};

/// Creates the baseline table (idempotent).
pub async fn prepare(store: &Store) -> Result<(), Error> {
    store
        .write(|c| {
            c.execute("CREATE TABLE IF NOT EXISTS bench_raw (id INTEGER PRIMARY KEY, body BLOB NOT NULL)", [])
                .map(|_| ())
                .map_err(sql("creating the baseline table"))
        })
        .await
}

/// Inserts one row through the writer (group commit), as a post would.
pub async fn insert(store: &Store, body: Vec<u8>) -> Result<(), Error> {
    store
        .write(move |c| {
            c.prepare_cached("INSERT INTO bench_raw (body) VALUES (?1)")
                .and_then(|mut s| s.execute([body]))
                .map(|_| ())
                .map_err(sql("inserting a baseline row"))
        })
        .await
}

/// Fills a stopped workspace's database with history for the restart figure: `per_channel`
/// messages in each of the first `channels` agents' home channels (posted by the agent
/// under one topic), with every subscriber's cursor at the end and the text index filled,
/// as a workspace whose history has all been delivered and indexed looks. Opens its own
/// connection: the daemon must not be running. Returns the messages written.
pub fn fill_history(db: &std::path::Path, channels: usize, per_channel: usize) -> Result<u64, Error> {
    let mut conn = rusqlite::Connection::open(db).map_err(sql("opening the database"))?;
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;").map_err(sql("setting pragmas"))?;
    let homes: Vec<(i64, i64)> = conn
        .prepare(
            "SELECT a.home_channel_id, a.id FROM accounts a WHERE a.kind = 'agent'                  AND a.home_channel_id IS NOT NULL ORDER BY a.id LIMIT ?1",
        )
        .and_then(|mut s| s.query_map([channels as i64], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .map_err(sql("listing home channels"))?;
    let body = "x".repeat(120);
    let now = canopy_sys::unix_ms();
    let mut written = 0;
    for chunk in homes.chunks(50) {
        let tx = conn.transaction().map_err(sql("starting a fill transaction"))?;
        for (channel, agent) in chunk {
            tx.execute(
                "INSERT INTO topics (channel_id, name, created_by, created_at, last_activity_at)                      VALUES (?1, 'history', ?2, ?3, ?3)",
                rusqlite::params![channel, agent, now],
            )
            .map_err(sql("starting a history topic"))?;
            let topic = tx.last_insert_rowid();
            {
                let mut insert = tx
                    .prepare_cached(
                        "INSERT INTO messages (channel_id, topic_id, sender_id, body, created_at)                              VALUES (?1, ?2, ?3, ?4, ?5)",
                    )
                    .map_err(sql("preparing the fill"))?;
                for _ in 0..per_channel {
                    insert.execute(rusqlite::params![channel, topic, agent, body, now]).map_err(sql("filling"))?;
                }
            }
            let last = tx.last_insert_rowid();
            tx.execute(
                "UPDATE topics SET last_seq = ?1, message_count = ?2 WHERE id = ?3",
                rusqlite::params![last, per_channel as i64, topic],
            )
            .map_err(sql("updating a history topic"))?;
            tx.execute("UPDATE subscriptions SET cursor = ?1 WHERE channel_id = ?2", rusqlite::params![last, channel])
                .map_err(sql("advancing cursors"))?;
            written += per_channel as u64;
        }
        tx.commit().map_err(sql("committing a fill"))?;
    }
    // Indexed, as a workspace whose text index has caught up.
    let tx = conn.transaction().map_err(sql("starting the fill's indexing"))?;
    crate::history::index_text(&crate::Db { conn: &tx, now_ms: now, memo: None }, i64::MAX as usize)?;
    tx.commit().map_err(sql("committing the fill's indexing"))?;
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").map_err(sql("checkpointing"))?;
    Ok(written)
}

/// Adds `count` agents `<prefix>-<i>` (managers under the Supervisor, each with its home
/// channel, no harness, so nothing places them) through `create_agent`, the operation
/// behind `agents.create`, 500 to a transaction. Opens its own store: the daemon must not
/// be running.
pub async fn fill_agents(db: &std::path::Path, prefix: &str, count: usize) -> Result<(), Error> {
    use canopy_core::acl::Caller;
    use canopy_core::{AccountKind, Handle};
    let store = Store::open(db, 16)?;
    let operator: Result<String, Error> = store
        .read(|c| {
            c.query_row("SELECT handle FROM accounts WHERE kind = 'operator' ORDER BY id LIMIT 1", [], |r| r.get(0))
                .map_err(sql("finding the operator"))
        })
        .await;
    let added = match operator {
        Ok(operator) => {
            let caller = Caller { handle: Handle::from_trusted(operator), kind: AccountKind::Operator };
            add_agents(&store, &caller, prefix, count).await
        }
        Err(e) => Err(e),
    };
    store.close().await;
    added
}

/// `fill_agents` on an open store, as `caller` (an operator).
async fn add_agents(store: &Store, caller: &canopy_core::acl::Caller, prefix: &str, count: usize) -> Result<(), Error> {
    use canopy_core::{Handle, RoleName};
    let role = RoleName::parse("manager").map_err(|e| Error::Internal(format!("the manager role: {e}")))?;
    for start in (0..count).step_by(500) {
        let specs = (start..(start + 500).min(count))
            .map(|i| {
                let handle = Handle::parse(&format!("{prefix}-{i}"))
                    .map_err(|e| Error::Internal(format!("an agent's handle: {e}")))?;
                Ok(crate::AgentSpec {
                    display_name: handle.to_string(),
                    handle,
                    role: role.clone(),
                    parent: None,
                    charter: String::new(),
                    harness: String::new(),
                    script: None,
                    persona: None,
                    repo: None,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let caller = caller.clone();
        store
            .write(move |c| specs.iter().try_for_each(|spec| crate::ops::create_agent(c, &caller, spec).map(drop)))
            .await?;
    }
    Ok(())
}

/// Makes `store` a workspace whose operator posts to `count` agents' home channels, for
/// the figure of a post's writer job alone (`post`). Returns the operator and the home
/// channels.
pub async fn prepare_posts(
    store: &Store,
    count: usize,
) -> Result<(canopy_core::acl::Caller, Vec<canopy_core::ChannelName>), Error> {
    use canopy_core::acl::Caller;
    use canopy_core::{AccountKind, ChannelName, Handle};
    let operator = Handle::parse("bench-operator").map_err(|e| Error::name("operator", e))?;
    let spec = crate::InitSpec {
        workspace_id: "ws-bench".into(),
        name: "bench".into(),
        mission: String::new(),
        operator: crate::OperatorSpec {
            handle: operator.clone(),
            display_name: operator.to_string(),
            token_hash: String::new(),
        },
        supervisor_harness: String::new(),
        supervisor_script: None,
    };
    store.write(move |c| crate::ops::init(c, &spec).map(drop)).await?;
    let caller = Caller { handle: operator, kind: AccountKind::Operator };
    add_agents(store, &caller, "floor", count).await?;
    (0..count)
        .map(|i| ChannelName::parse(&format!("home-floor-{i}")).map_err(|e| Error::name("channel", e)))
        .collect::<Result<Vec<_>, Error>>()
        .map(|channels| (caller, channels))
}

/// The writer job of one `messages.post` (`ops::post_and_reach`), without the daemon
/// around it.
pub async fn post(store: &Store, caller: canopy_core::acl::Caller, spec: crate::PostSpec) -> Result<(), Error> {
    store.write(move |c| crate::ops::post_and_reach(c, &caller, &spec).map(drop)).await
}

/// Rows in every table Canopy writes, for "rows written per broadcast".
pub async fn row_count(store: &Store) -> Result<u64, Error> {
    store
        .read(|c| {
            let tables = [
                "messages",
                "topics",
                "deliveries",
                "subscriptions",
                "activity",
                "usage",
                "compactions",
                "presence",
                "sessions",
                "audit",
                "pins",
                "channels",
                "accounts",
            ];
            let query = tables.iter().map(|t| format!("(SELECT COUNT(*) FROM {t})")).collect::<Vec<_>>().join(" + ");
            c.query_row(&format!("SELECT {query}"), [], |r| r.get::<_, i64>(0))
                .map(|n| n as u64)
                .map_err(sql("counting rows"))
        })
        .await
}
