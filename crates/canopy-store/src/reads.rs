//! The read pool: read-only connections, and where a read runs.
//!
//! A read first runs on the calling task, under a deadline (`INLINE_BUDGET`) that SQLite's
//! progress handler checks every `CHECK_EVERY` virtual-machine steps. Most reads (a token, a
//! topic list, a page of messages) finish well inside it, and then cost no hand-off to
//! another thread: on these machines that hand-off (a `spawn_blocking` wake and the wake
//! back) took longer than the read itself. A read still running at the deadline is
//! interrupted, its answer thrown away whatever it was, and run again from the start on the
//! blocking pool with no deadline, so a long read (a search, a roster of 100,000 agents)
//! holds an async worker for at most the budget. Reads change nothing, so running one twice
//! is safe. The budget counts SQLite's steps, not waits: a page read from disk, or a wait for
//! a lock (rare for a reader of a WAL database), holds the worker for as long as it takes; a
//! new connection is opened only on the pool. Does not decide what a read does or how many
//! run at once (`Store::read`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use canopy_core::Error;
use rusqlite::Connection;

/// The longest a read runs on the calling task before it moves to the blocking pool.
pub(crate) const INLINE_BUDGET: Duration = Duration::from_micros(200);
/// SQLite virtual-machine steps between two looks at the deadline (each look reads the clock).
const CHECK_EVERY: i32 = 1_000;

/// Read-only connections, opened on demand and kept for reuse.
pub(crate) struct ReadPool {
    pub(crate) path: PathBuf,
    idle: Mutex<Vec<Pooled>>,
    /// One permit per connection: at most `MAX` reads run at once; others wait their turn.
    pub(crate) permits: Arc<tokio::sync::Semaphore>,
}

/// A connection and the deadline its progress handler enforces.
struct Pooled {
    conn: Connection,
    deadline: Arc<Deadline>,
}

/// Nanoseconds after `epoch()` at which the running read is cut short (0: never), and
/// whether it was.
#[derive(Default)]
struct Deadline {
    at: AtomicU64,
    passed: AtomicBool,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl ReadPool {
    /// Most read connections, and most reads at once.
    pub(crate) const MAX: usize = 16;

    pub(crate) fn new(path: PathBuf) -> ReadPool {
        ReadPool { path, idle: Mutex::new(Vec::new()), permits: Arc::new(tokio::sync::Semaphore::new(Self::MAX)) }
    }

    /// Runs `query` to completion on this thread.
    pub(crate) fn with<T>(&self, query: impl FnOnce(&Connection) -> Result<T, Error>) -> Result<T, Error> {
        let pooled = self.take()?;
        let result = query(&pooled.conn);
        self.give_back(pooled);
        result
    }

    /// Runs `query` on this thread unless it takes longer than `budget`: then `None`, and
    /// whatever it produced is discarded (an interrupted statement may have been read as an
    /// empty answer). Also `None` without running it when no connection is idle: opening one
    /// (the file, its pragmas, the schema) is the pool's to do, not the caller's.
    pub(crate) fn within<T>(
        &self,
        budget: Duration,
        query: impl FnOnce(&Connection) -> Result<T, Error>,
    ) -> Option<Result<T, Error>> {
        let pooled = self.idle()?;
        let deadline = now_ns().saturating_add(u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX));
        pooled.deadline.at.store(deadline, Ordering::Relaxed);
        let result = query(&pooled.conn);
        pooled.deadline.at.store(0, Ordering::Relaxed);
        let passed = pooled.deadline.passed.swap(false, Ordering::Relaxed);
        // A read that opened a transaction and was cut short leaves it open.
        if !pooled.conn.is_autocommit()
            && let Err(e) = pooled.conn.execute_batch("ROLLBACK")
        {
            // Kept, it would answer every later read from the old snapshot: closed instead.
            tracing::warn!(error = %e, "rolling back a read cut short failed; closing its connection");
            drop(pooled);
        } else {
            self.give_back(pooled);
        }
        (!passed).then_some(result)
    }

    /// An idle connection, if there is one.
    fn idle(&self) -> Option<Pooled> {
        self.idle.lock().map(|mut idle| idle.pop()).unwrap_or(None)
    }

    /// An idle connection, or a new one.
    fn take(&self) -> Result<Pooled, Error> {
        match self.idle() {
            Some(pooled) => Ok(pooled),
            None => {
                let mut conn = crate::open_connection(&self.path, true)?;
                let deadline = Arc::new(Deadline::default());
                let watch = deadline.clone();
                conn.progress_handler(
                    CHECK_EVERY,
                    Some(move || {
                        let at = watch.at.load(Ordering::Relaxed);
                        let passed = at != 0 && now_ns() > at;
                        if passed {
                            watch.passed.store(true, Ordering::Relaxed);
                        }
                        passed
                    }),
                )
                .map_err(|e| Error::Unavailable(format!("configuring {}: {e}", self.path.display())))?;
                Ok(Pooled { conn, deadline })
            }
        }
    }

    fn give_back(&self, pooled: Pooled) {
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < Self::MAX
        {
            idle.push(pooled);
        }
    }
}
