//! The writer thread: the only code that holds the writable connection.
//!
//! Group commit: it takes one job, then whatever else is already queued (up to
//! `MAX_BATCH`), runs them in one `IMMEDIATE` transaction with a savepoint each, commits,
//! and then completes every job with the commit's outcome. A caller therefore never sees a
//! success that is not on disk. A job that fails or panics rolls back only its savepoint.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread::JoinHandle;

use canopy_core::Error;
use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::{mpsc, oneshot};

use crate::MAX_BATCH;

/// Called after the commit with its outcome.
type Finish = Box<dyn FnOnce(Result<(), Error>) + Send>;
/// Runs inside the transaction; says whether it succeeded and how to answer the caller.
type Job = Box<dyn FnOnce(&Connection) -> (bool, Finish) + Send>;

#[derive(Clone)]
pub(crate) struct WriterHandle {
    /// Bounded: a full queue makes writers wait rather than pile up memory.
    tx: mpsc::Sender<Job>,
    thread: std::sync::Arc<std::sync::Mutex<Option<JoinHandle<()>>>>,
}

pub(crate) fn spawn(conn: Connection, capacity: usize) -> Result<WriterHandle, Error> {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let thread = std::thread::Builder::new()
        .name("canopy-store-writer".into())
        .spawn(move || run(conn, rx))
        .map_err(|e| Error::Internal(format!("starting the store writer thread: {e}")))?;
    Ok(WriterHandle { tx, thread: std::sync::Arc::new(std::sync::Mutex::new(Some(thread))) })
}

impl WriterHandle {
    pub(crate) async fn write<T, F>(&self, work: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, Error> + Send + 'static,
    {
        let (done_tx, done_rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let result = work(conn);
            let ok = result.is_ok();
            let finish: Finish = Box::new(move |commit| {
                // The caller may have gone away (timeout); the write stands regardless.
                let _ = done_tx.send(commit.and(result));
            });
            (ok, finish)
        });
        self.tx
            .send(job)
            .await
            .map_err(|_| Error::Unavailable("the store is shut down".into()))?;
        done_rx
            .await
            .map_err(|_| Error::Internal("the store write was abandoned (a bug: see the daemon log)".into()))?
    }

    pub(crate) async fn close(self) {
        let WriterHandle { tx, thread } = self;
        drop(tx);
        let handle = thread.lock().ok().and_then(|mut t| t.take());
        if let Some(handle) = handle {
            // Other clones of the sender may still exist; the thread ends when all are gone.
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
    }
}

fn run(mut conn: Connection, mut rx: mpsc::Receiver<Job>) {
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let finishes = run_batch(&mut conn, &mut batch);
        let (commit, finishes) = finishes;
        for finish in finishes {
            finish(commit.clone());
        }
    }
    tracing::debug!("store writer stopped");
}

fn run_batch(conn: &mut Connection, batch: &mut Vec<Job>) -> (Result<(), Error>, Vec<Finish>) {
    let mut finishes = Vec::with_capacity(batch.len());
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            batch.clear();
            return (Err(Error::Unavailable(format!("starting a write transaction: {e}"))), finishes);
        }
    };
    for job in batch.drain(..) {
        if let Err(e) = tx.execute_batch("SAVEPOINT job") {
            tracing::error!(error = %e, "could not open a savepoint; refusing the write");
            continue;
        }
        match catch_unwind(AssertUnwindSafe(|| job(&tx))) {
            Ok((true, finish)) => {
                let _ = tx.execute_batch("RELEASE job");
                finishes.push(finish);
            }
            Ok((false, finish)) => {
                let _ = tx.execute_batch("ROLLBACK TO job; RELEASE job");
                finishes.push(finish);
            }
            Err(_) => {
                // The job's finish was dropped with it, so its caller gets `Internal`.
                tracing::error!("a store write panicked; its changes were rolled back");
                let _ = tx.execute_batch("ROLLBACK TO job; RELEASE job");
            }
        }
    }
    let commit = tx.commit().map_err(|e| Error::Unavailable(format!("committing writes: {e}")));
    (commit, finishes)
}
