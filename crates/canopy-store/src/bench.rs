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
                    needs: Vec::new(),
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

/// Gives a stopped workspace a tree and a ledger for the issue figures: the agents
/// `<prefix>-<i>` (from `fill_agents`) become a tree of tens (`<prefix>-<i>`'s parent is
/// `<prefix>-<i/10>`, and `lead` is `<prefix>-1`'s parent), and each of them and `lead` owns
/// `per_agent` issues (one in five done, one in ten labelled `ui`). Opens its own
/// connection: the daemon must not be running. Returns the issues written.
pub fn fill_issues(db: &std::path::Path, prefix: &str, lead: &str, per_agent: usize) -> Result<u64, Error> {
    let mut conn = rusqlite::Connection::open(db).map_err(sql("opening the database"))?;
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;").map_err(sql("setting pragmas"))?;
    let tx = conn.transaction().map_err(sql("starting the issue fill"))?;
    let id = |handle: &str| {
        tx.query_row("SELECT id FROM accounts WHERE handle = ?1", [handle], |r| r.get::<_, i64>(0))
            .map_err(sql("finding an agent"))
    };
    let lead_id = id(lead)?;
    let agents: Vec<(i64, String)> = tx
        .prepare("SELECT id, handle FROM accounts WHERE handle LIKE ?1 || '-%' ORDER BY id")
        .and_then(|mut s| s.query_map([prefix], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .map_err(sql("listing agents"))?;
    let by_index: std::collections::HashMap<usize, i64> = agents
        .iter()
        .filter_map(|(id, handle)| handle.rsplit('-').next()?.parse::<usize>().ok().map(|i| (i, *id)))
        .collect();
    for (&i, &agent) in &by_index {
        let parent = match i {
            0 => continue,
            1 => Some(lead_id),
            _ => by_index.get(&(i / 10)).copied(),
        };
        tx.execute("UPDATE accounts SET parent_id = ?1 WHERE id = ?2", rusqlite::params![parent, agent])
            .map_err(sql("shaping the tree"))?;
    }
    let now = canopy_sys::unix_ms();
    let mut number: i64 = 0;
    {
        let mut issue = tx
            .prepare(
                "INSERT INTO issues (number, title, body, state, owner_id, reporter_id, topic, created_at, updated_at) \
                 VALUES (?1, ?2, 'body', ?3, ?4, ?4, ?5, ?6, ?6)",
            )
            .map_err(sql("preparing the issue fill"))?;
        let mut label = tx
            .prepare("INSERT INTO issue_labels (label, issue) VALUES ('ui', ?1)")
            .map_err(sql("preparing the label fill"))?;
        let owners = std::iter::once(lead_id).chain(agents.iter().map(|(id, _)| *id));
        for owner in owners {
            for k in 0..per_agent {
                number += 1;
                let state = if k % 5 == 4 { "done" } else { "open" };
                let title = format!("issue {number}");
                let topic = canopy_core::issues::topic(number as u64, &title);
                issue.execute(rusqlite::params![number, title, state, owner, topic, now]).map_err(sql("filling"))?;
                if number % 10 == 0 {
                    label.execute([number]).map_err(sql("labelling"))?;
                }
            }
        }
    }
    tx.commit().map_err(sql("committing the issue fill"))?;
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").map_err(sql("checkpointing"))?;
    Ok(number as u64)
}

/// Records `count` usage reports for `handle` through the writer, one write each, as a turn's
/// end does (incarnation 1): with `attributed`, the shipped write (the row names the agent's
/// issue); without, the same write naming none, the baseline.
pub async fn usage_writes(store: &Store, handle: &str, count: usize, attributed: bool) -> Result<(), Error> {
    let handle = handle.to_owned();
    let agent_id = store
        .read(move |c| {
            c.query_row("SELECT id FROM accounts WHERE handle = ?1", [&handle], |r| r.get::<_, i64>(0))
                .map_err(sql("finding an agent"))
        })
        .await?;
    for i in 0..count {
        let report = crate::UsageReport {
            turn_id: Some(format!("bench-{i}")),
            input_tokens: 1000,
            output_tokens: 100,
            cost_usd: Some(0.001),
            ..crate::UsageReport::default()
        };
        store
            .write(move |c| {
                let mut charged = crate::Charged { notices: Vec::new(), changed: false };
                let estimate = crate::Estimate { usd: 0.0, tokens: 0 };
                let incarnation = canopy_core::Incarnation(1);
                crate::usage::record_usage(c, agent_id, incarnation, &report, estimate, &mut charged, attributed)
            })
            .await?;
    }
    Ok(())
}

/// Files `count` issues owned by `handle`, one `in_progress` (a Manager working on one issue,
/// the case attribution looks up), through the store's own filing.
pub async fn own_issues(store: &Store, handle: &str, count: usize) -> Result<(), Error> {
    use canopy_core::acl::Caller;
    use canopy_core::{AccountKind, Handle};
    let caller = Caller { handle: Handle::from_trusted(handle.to_owned()), kind: AccountKind::Agent };
    store
        .write(move |c| {
            for i in 0..count {
                let spec = crate::NewIssue { title: format!("bench issue {i}"), ..crate::NewIssue::default() };
                let (issue, _) = crate::ops::file_issue(c, &caller, &spec)?;
                if i == 0 {
                    let change = crate::IssueChange {
                        state: Some(canopy_core::issues::IssueState::InProgress),
                        note: Some("working".into()),
                        ..crate::IssueChange::default()
                    };
                    crate::ops::update_issue(c, &caller, issue.number, &change)?;
                }
            }
            Ok(())
        })
        .await
}
