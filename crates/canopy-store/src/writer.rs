//! The writer thread: the only code that holds the writable connection.
//!
//! Group commit: it takes one job, then whatever else is already queued (up to
//! `MAX_BATCH`), runs them in one `IMMEDIATE` transaction with a savepoint each, commits,
//! and then completes every job with the commit's outcome. A caller therefore never sees a
//! success that is not on disk. A job that fails or panics rolls back only its savepoint.
//! Checkpoints are the checkpointer's (`checkpoint.rs`), rung after each commit; the rows
//! posts read are remembered between jobs (`memo.rs`), kept coherent by the update hook.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread::JoinHandle;

use canopy_core::Error;
use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::{mpsc, oneshot};

use crate::MAX_BATCH;
use crate::checkpoint::{BACKSTOP_PAGES, Checkpointer};
use crate::memo::{self, Memo};

/// Called after the commit with its outcome.
type Finish = Box<dyn FnOnce(Result<(), Error>) + Send>;
/// Runs inside the transaction; says whether it succeeded and how to answer the caller.
type Work = Box<dyn FnOnce(&Connection, &Memo) -> (bool, Finish) + Send>;

enum Job {
    Write(Work),
    /// Finish what is queued before this, then stop, whatever other handles still exist.
    Stop,
}

#[derive(Clone)]
pub(crate) struct WriterHandle {
    /// Bounded: a full queue makes writers wait rather than pile up memory.
    tx: mpsc::Sender<Job>,
    thread: std::sync::Arc<std::sync::Mutex<Option<JoinHandle<()>>>>,
}

pub(crate) fn spawn(
    mut conn: Connection,
    path: &std::path::Path,
    capacity: usize,
    credentials: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> Result<WriterHandle, Error> {
    // Checkpoints run on their own thread; this connection does one only as a backstop.
    conn.pragma_update(None, "wal_autocheckpoint", BACKSTOP_PAGES)
        .map_err(|e| Error::Unavailable(format!("configuring {}: {e}", path.display())))?;
    let checkpointer = Checkpointer::spawn(path)?;
    // Any row of `sessions` or `accounts` changed or removed may end a credential: the
    // batch's commit then moves `credentials` (`Store::credential_epoch`).
    let touched = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = touched.clone();
    // Any change to a table the memo reads from marks that part stale (`memo.rs`).
    let memo = Memo::default();
    let stale = memo.stale_flags();
    conn.update_hook(Some(move |action: rusqlite::hooks::Action, _: &str, table: &str, _: i64| {
        if action != rusqlite::hooks::Action::SQLITE_INSERT && matches!(table, "sessions" | "accounts") {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let parts = memo::parts_read_from(table);
        if parts != 0 {
            stale.fetch_or(parts, std::sync::atomic::Ordering::SeqCst);
        }
    }))
    .map_err(|e| Error::Internal(format!("watching credential changes: {e}")))?;
    memo::watch(&conn, &memo).map_err(|e| Error::Internal(format!("watching the writer's memo: {e}")))?;
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let thread = std::thread::Builder::new()
        .name("canopy-store-writer".into())
        .spawn(move || run(conn, rx, &touched, &credentials, checkpointer, &memo))
        .map_err(|e| Error::Internal(format!("starting the store writer thread: {e}")))?;
    Ok(WriterHandle { tx, thread: std::sync::Arc::new(std::sync::Mutex::new(Some(thread))) })
}

impl WriterHandle {
    pub(crate) async fn write<T, F>(&self, work: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Memo) -> Result<T, Error> + Send + 'static,
    {
        let (done_tx, done_rx) = oneshot::channel();
        let job = Job::Write(Box::new(move |conn, memo| {
            let result = work(conn, memo);
            let ok = result.is_ok();
            let finish: Finish = Box::new(move |commit| {
                // Fails only when the caller stopped waiting (a timeout, a dropped request):
                // nobody is left to tell, and the write stands (or not) regardless.
                let _ = done_tx.send(commit.and(result));
            });
            (ok, finish)
        }));
        self.tx.send(job).await.map_err(|_| Error::Unavailable("the store is shut down".into()))?;
        done_rx
            .await
            .map_err(|_| Error::Internal("the store write was abandoned (a bug: see the daemon log)".into()))?
    }

    /// Jobs queued and not yet taken by the writer.
    pub(crate) fn waiting(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    pub(crate) async fn close(self) {
        let WriterHandle { tx, thread } = self;
        if tx.send(Job::Stop).await.is_err() {
            tracing::debug!("the store writer had already stopped (another handle closed it)");
        }
        let handle = thread.lock().ok().and_then(|mut t| t.take());
        if let Some(handle) = handle {
            match tokio::task::spawn_blocking(move || handle.join()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => tracing::warn!("the store writer thread panicked while stopping"),
                Err(e) => tracing::warn!(error = %e, "waiting for the store writer thread to stop"),
            }
        }
    }
}

fn run(
    mut conn: Connection,
    mut rx: mpsc::Receiver<Job>,
    touched: &std::sync::atomic::AtomicBool,
    credentials: &std::sync::atomic::AtomicU64,
    mut checkpointer: Checkpointer,
    memo: &Memo,
) {
    let mut batch: Vec<Work> = Vec::with_capacity(MAX_BATCH);
    let mut stopping = false;
    while !stopping {
        match rx.blocking_recv() {
            Some(Job::Write(work)) => batch.push(work),
            Some(Job::Stop) | None => break,
        }
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(Job::Write(work)) => batch.push(work),
                Ok(Job::Stop) => {
                    stopping = true;
                    break;
                }
                Err(_) => break,
            }
        }
        let (commit, finishes) = run_batch(&mut conn, &mut batch, memo);
        if commit.is_err() {
            memo.forget();
        }
        checkpointer.ring();
        // After the commit (or its failure): a lookup that began before it cannot be cached
        // as current (see `Store::credential_epoch`).
        if touched.swap(false, std::sync::atomic::Ordering::SeqCst) {
            credentials.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        for finish in finishes {
            finish(commit.clone());
        }
    }
    // Refuse what arrives from now on: dropping the receiver fails further sends.
    drop(rx);
    checkpointer.stop();
    if let Err(e) = conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)") {
        tracing::debug!(error = %e, "checkpointing the WAL at shutdown");
    }
    tracing::debug!("store writer stopped");
}

fn run_batch(conn: &mut Connection, batch: &mut Vec<Work>, memo: &Memo) -> (Result<(), Error>, Vec<Finish>) {
    let mut finishes = Vec::with_capacity(batch.len());
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            batch.clear();
            return (Err(Error::Unavailable(format!("starting a write transaction: {e}"))), finishes);
        }
    };
    // Cached statements: these run twice per job, so parsing them each time shows up.
    let run = |sql: &str| tx.prepare_cached(sql).and_then(|mut s| s.execute([])).map(|_| ());
    let rollback = || run("ROLLBACK TO job").and_then(|()| run("RELEASE job"));
    // A failed job whose savepoint could not be rolled back would commit its changes with
    // the batch: then nothing of the batch commits, and every caller is told so.
    let mut unrolled: Option<rusqlite::Error> = None;
    for job in batch.drain(..) {
        if let Err(e) = run("SAVEPOINT job") {
            tracing::error!(error = %e, "could not open a savepoint; refusing the write");
            continue;
        }
        match catch_unwind(AssertUnwindSafe(|| job(&tx, memo))) {
            Ok((true, finish)) => {
                // A savepoint left open still commits with the batch (COMMIT releases it),
                // and the next job's savepoint nests inside it, so the write stands.
                if let Err(e) = run("RELEASE job") {
                    tracing::warn!(error = %e, "releasing a write's savepoint; it commits with the batch");
                }
                finishes.push(finish);
            }
            Ok((false, finish)) => {
                if let Err(e) = rollback() {
                    tracing::error!(error = %e, "rolling back a refused write failed; abandoning its batch");
                    unrolled.get_or_insert(e);
                }
                memo.forget();
                finishes.push(finish);
            }
            Err(_) => {
                // The job's finish was dropped with it, so its caller gets `Internal`.
                tracing::error!("a store write panicked; its changes were rolled back");
                if let Err(e) = rollback() {
                    tracing::error!(error = %e, "rolling back a panicked write failed; abandoning its batch");
                    unrolled.get_or_insert(e);
                }
                memo.forget();
            }
        }
    }
    if let Some(e) = unrolled {
        // Dropping the transaction rolls the whole batch back.
        drop(tx);
        return (Err(crate::storage_fault("rolling back a failed write", e)), finishes);
    }
    let commit = tx.commit().map_err(|e| Error::Unavailable(format!("committing writes: {e}")));
    (commit, finishes)
}
