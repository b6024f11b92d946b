//! Canopy's system of record: SQLite behind one writer thread and a pool of readers.
//!
//! Owns the schema, its append-only migrations, and every SQL statement; no other crate
//! links rusqlite. Writes run on one OS thread that owns the only writable connection:
//! callers send a closure, the thread runs a queue's worth of them in one `IMMEDIATE`
//! transaction (each in its own savepoint, so one refusal does not undo its neighbours),
//! commits, and only then answers each caller. Reads run on a small pool of read-only
//! connections, on the calling task when short and on the blocking thread pool when not
//! (`reads.rs`). Does not decide policy: the rules come from
//! `canopy-core`, and limits that are configuration come in as arguments.

mod accounts;
mod budgets;
mod channels;
mod checkpoint;
mod checks;
mod delivery;
mod failover;
mod governance;
mod history;
mod issues;
mod memo;
mod merges;
mod messages;
mod notices;
mod presence;
mod reads;
mod reminders;
mod repos;
mod runs;
mod schema;
mod sessions;
mod spawn;
mod usage;
mod views;
mod workspace;
mod writer;

use std::path::Path;
use std::sync::Arc;

use canopy_core::Error;
use reads::ReadPool;
use rusqlite::{Connection, OpenFlags};

pub use accounts::{AgentSpec, OperatorSpec};
pub use budgets::{Charged, Estimate, Holds, RoleBudget};
pub use channels::ChannelSpec;
pub use checks::{BranchHead, CheckEnd, CheckStart, Conflict};
pub use delivery::{Pending, Reach, Recipient};
pub use failover::FailoverRules;
pub use history::{HistoryPage, HistoryQuery};
pub use issues::{Changed as IssuesChanged, Imported, IssueChange, IssueQuery, IssueView, NewIssue, Owners};
pub use merges::{Landed, MergeCheck, MergeDecided, MergeSpec, QueueStep, Recovered, Submitted};
pub use messages::{Page, PostSpec, Posted};
pub use notices::SESSION_NOTICE_TOPIC;
pub use reminders::Waiting;
pub use repos::{Checkout, CheckoutState, NewCheckout, RepoRow};
pub use runs::{Run, RunSpec, RunStatus, run_topic};
pub use sessions::{Applied, LiveSession, Lost, Report, RunnerHeartbeat, RunnerRow, Synced};
pub use spawn::{Answered, Decided, SpawnPolicy, SpawnSpec, parse_id as parse_request_id, spawn_topic};
pub use usage::{PRUNE_BATCH, Pruned, SeriesScope, UsageReport, UsageView};
pub use workspace::InitSpec;

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "canopy.db";

/// How many writes the writer thread folds into one transaction at most.
pub const MAX_BATCH: usize = 256;

/// A cheap, cloneable handle to the store.
#[derive(Clone)]
pub struct Store {
    writer: writer::WriterHandle,
    readers: Arc<ReadPool>,
    clock: canopy_sys::Clock,
    /// Moves after every commit that changed or removed a session or account row.
    credentials: Arc<std::sync::atomic::AtomicU64>,
}

/// What one piece of store work sees: the connection it runs on and the moment it runs at,
/// read once from the store's clock when the work starts. Every store operation takes it,
/// so the time is an argument (a test drives a `Clock::Manual`), and no `rusqlite` type
/// appears in the store's signatures.
pub struct Db<'a> {
    conn: &'a Connection,
    now_ms: i64,
    /// The writer's memo (`memo.rs`); read connections have none.
    memo: Option<&'a memo::Memo>,
}

impl<'a> Db<'a> {
    /// Milliseconds since the Unix epoch, as of the start of this work.
    pub fn now_ms(&self) -> i64 {
        self.now_ms
    }

    // The connection stays inside the store: these forward exactly what the store's own
    // modules run on it, and none of them is visible to another crate.

    pub(crate) fn prepare_cached(&self, sql: &str) -> rusqlite::Result<rusqlite::CachedStatement<'a>> {
        self.conn.prepare_cached(sql)
    }

    pub(crate) fn execute<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.conn.execute(sql, params)
    }

    pub(crate) fn query_row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    {
        self.conn.query_row(sql, params, f)
    }

    pub(crate) fn last_insert_rowid(&self) -> i64 {
        self.conn.last_insert_rowid()
    }

    /// An uncached statement, for tests that look at one statement's plan or counters.
    #[cfg(test)]
    pub(crate) fn prepare(&self, sql: &str) -> rusqlite::Result<rusqlite::Statement<'a>> {
        self.conn.prepare(sql)
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.readers.path).finish()
    }
}

impl Store {
    /// Opens (creating if needed) the database at `path`, migrates it, and starts the writer.
    pub fn open(path: &Path, queue_capacity: usize) -> Result<Store, Error> {
        Store::open_with_clock(path, queue_capacity, canopy_sys::Clock::System)
    }

    /// `open`, stamping time from `clock`.
    pub fn open_with_clock(path: &Path, queue_capacity: usize, clock: canopy_sys::Clock) -> Result<Store, Error> {
        let conn = open_connection(path, false)?;
        schema::migrate(&conn)?;
        let credentials = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let writer = writer::spawn(conn, path, queue_capacity, credentials.clone())?;
        let readers = Arc::new(ReadPool::new(path.to_owned()));
        Ok(Store { writer, readers, clock, credentials })
    }

    /// A number that moves after every commit that changed or removed a row of `sessions` or
    /// `accounts` (a session ended, an account stopped, despawned or revoked): a token resolved
    /// while it held one value may be trusted again only while it still holds it. Read it
    /// before resolving and compare after: a commit in between means the answer may be stale.
    pub fn credential_epoch(&self) -> u64 {
        self.credentials.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Runs `work` inside the writer's transaction. The result is returned only after the
    /// transaction commits; if `work` fails, its changes are rolled back and nothing else is.
    pub async fn write<T, F>(&self, work: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&Db<'_>) -> Result<T, Error> + Send + 'static,
    {
        let clock = self.clock.clone();
        self.writer.write(move |conn, memo| work(&Db { conn, now_ms: clock.now_ms(), memo: Some(memo) })).await
    }

    /// Writes queued behind the one running: how busy the writer is, for work that should
    /// wait its turn (the text index).
    pub fn writes_waiting(&self) -> usize {
        self.writer.waiting()
    }

    /// The clock this store stamps time with.
    pub fn clock(&self) -> &canopy_sys::Clock {
        &self.clock
    }

    /// Runs `query` on a read-only connection: on the calling task when it finishes within
    /// `reads::INLINE_BUDGET`, else again from the start on the blocking pool (`reads.rs`).
    /// `query` may therefore run twice, and must not count on running once.
    pub async fn read<T, F>(&self, query: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: Fn(&Db<'_>) -> Result<T, Error> + Send + 'static,
    {
        let readers = self.readers.clone();
        let clock = self.clock.clone();
        // Bound concurrent reads to the pool, so connections are reused, never churned.
        let permit = readers
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::Unavailable("the store is shut down".into()))?;
        let inline =
            readers.within(reads::INLINE_BUDGET, |conn| query(&Db { conn, now_ms: clock.now_ms(), memo: None }));
        if let Some(result) = inline {
            return result;
        }
        tokio::task::spawn_blocking(move || {
            let result = readers.with(|conn| query(&Db { conn, now_ms: clock.now_ms(), memo: None }));
            drop(permit);
            result
        })
        .await
        .map_err(|e| Error::Internal(format!("store read task failed: {e}")))?
    }

    /// Stops the writer after the queued writes are done and waits for its thread.
    pub async fn close(self) {
        self.writer.close().await;
    }
}

pub(crate) fn open_connection(path: &Path, read_only: bool) -> Result<Connection, Error> {
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| Error::Unavailable(format!("opening {}: {e}", path.display())))?;
    let pragmas = if read_only {
        "PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 5000;"
    } else {
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 5000;"
    };
    conn.execute_batch(pragmas).map_err(|e| Error::Unavailable(format!("configuring {}: {e}", path.display())))?;
    conn.set_prepared_statement_cache_capacity(64);
    // The query planner stability guarantee: a cached statement keeps its plan whatever is
    // bound to it. Without it, a statement whose terms SQLite compared against a partial
    // index's condition is marked to re-prepare on every new binding (`sessions_live` made
    // the recipient query and the channel lookup re-parse and re-plan on every post: a
    // quarter of the writer's time).
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(|e| Error::Unavailable(format!("configuring {}: {e}", path.display())))?;
    Ok(conn)
}

/// Maps a SQLite failure to the domain error, naming what was being done.
pub(crate) fn sql(context: &'static str) -> impl Fn(rusqlite::Error) -> Error {
    move |e| storage_fault(context, e)
}

/// One meaning per code: a fault the store may get past (a full disk, an I/O error, a lock)
/// is `unavailable`, as when it cannot commit: retry later, nothing was written. Anything
/// else is `internal`, a defect.
pub(crate) fn storage_fault(context: &str, e: rusqlite::Error) -> Error {
    use rusqlite::ErrorCode as Code;
    let passing = matches!(
        e.sqlite_error_code(),
        Some(Code::DiskFull | Code::SystemIoFailure | Code::DatabaseBusy | Code::DatabaseLocked | Code::CannotOpen)
    );
    match passing {
        true => Error::Unavailable(format!("{context}: {e} (nothing was written; retry when the store has room)")),
        false => Error::Internal(format!("{context}: {e}")),
    }
}

/// Renders a stored timestamp as RFC 3339 with milliseconds.
pub(crate) fn rfc3339(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// Queries for the daemon and the CLI, grouped by what they touch.
pub mod ops {
    pub use crate::accounts::{
        account, children, create_agent, create_operator, list_agents, operators, reparent, resolve_token,
        revoke_operator, subscriptions, tree,
    };
    pub use crate::budgets::{budgets, covering_budgets, holds, renew as renew_budgets, set_budget, sync_role_budgets};
    pub use crate::channels::{channel, create_channel, cursor, list_channels, list_topics};
    pub use crate::checks::{
        branch_head, check_log, checks_on, conflicts, finish_check, latest_checks, list_checks, load_check, notice_to,
        parse_check_id, prune_checks, recover_checks, set_branch_head, set_conflicts, start_check,
    };
    pub use crate::delivery::{
        acknowledge, agent_id, expire, offer, overflowing, pending, reach, record_held, record_injected,
    };
    pub use crate::failover::{fail_back, failback_due, set_harness};
    pub use crate::governance::{
        board, open_direct, pin, rename_topic, resolve_topic, subscribe_self, unpin, unsubscribe_self,
    };
    pub use crate::history::{continuity_facts, history_owners, history_search, index_text};
    pub use crate::issues::{
        assign_issue, comment_issue, export_issues, file_issue, import_issues, issue, issue_spend, issue_view,
        latest_changes, list_issues, merge_landed as issues_merge_landed, set_issue_budget, update_issue,
        waiting_issues,
    };
    pub use crate::merges::{
        decide_merge, end_review_of_run, finish_merge, list_merges, load_merge, merge_checked, merge_checked_base,
        merge_in_topic, merge_issues, merge_notice, merge_number, merge_queue, open_merges, queue_next, recover_merges,
        request_merge, reviews_of, start_review, submit_review,
    };
    pub use crate::messages::{post, post_and_reach, post_audited, read_channel, sync};
    pub use crate::notices::notice;
    pub use crate::reminders::due_reminders;
    pub use crate::repos::{
        add_repo, checkout, checkout_host, checkouts, close_run_checkout, hosted_checkouts, list_repos,
        record_git_refusal, repo, require_repo, run_checkout_for, run_checkouts, set_checkout, stale_checkouts,
    };
    pub use crate::runs::{expire_runs, finish_run, list_runs, load as run, run_of_account, start_run};
    pub use crate::sessions::{
        apply_reports, end_lost_runners, forget_runner, list_runners, live_agent, mark_stalled, prompt_hash,
        prompt_inputs, read_activity, record_act, record_anonymous, record_interrupt, record_prompt_hashes,
        retire_runner, roster, roster_entry, set_activity, set_desired, set_draining, subagent_activity, sync_runner,
    };
    pub use crate::spawn::{
        answer_reply, audit_log, cancel_spawn, channel_and_system, decide_spawn, despawn, expire_spawns, list_spawns,
        load as spawn_request, request_spawn,
    };
    pub use crate::usage::{live_sessions, prune, usage, usage_series};
    pub use crate::workspace::{init, workspace};
}

#[cfg(test)]
mod tests;

// Benchmark scaffolding: built for canopy-bench (the `testing` feature) and for this
// crate's own tests, never into the shipped store.
#[cfg(any(test, feature = "testing"))]
pub mod bench;
