//! The checkpointer: copies committed WAL frames into the database file on its own thread and
//! connection, so the writer never stops for a checkpoint's `fsync`.
//!
//! The writer's connection checkpoints automatically only past `BACKSTOP_PAGES`. After each commit the writer rings; this thread then runs a
//! `PASSIVE` checkpoint, which neither blocks nor waits for the writer or readers, and rests
//! `REST` before the next, so a burst of commits costs one pass. It stops when the writer
//! drops its bell. Owns no data: a failed pass (a full disk) is logged and retried at the
//! next ring; SQLite's recovery makes a checkpoint cut short by `kill -9` harmless.

use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use canopy_core::Error;
use rusqlite::Connection;

/// WAL pages past which the writer's own connection checkpoints (about 16 MiB). By then this
/// thread has copied nearly every frame, so the writer's pass is short; it is what lets the
/// WAL start over from its beginning under a write load that never pauses.
pub(crate) const BACKSTOP_PAGES: u32 = 4_000;
/// The least time between two passes.
const REST: Duration = Duration::from_millis(20);

/// What the writer keeps: a bell to ring after each commit, and the thread to join.
pub(crate) struct Checkpointer {
    bell: Option<mpsc::SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts the thread on a connection of its own to `path`.
    pub(crate) fn spawn(path: &Path) -> Result<Checkpointer, Error> {
        let conn = crate::open_connection(path, false)?;
        let (bell, rings) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("canopy-store-ckpt".into())
            .spawn(move || run(&conn, &rings))
            .map_err(|e| Error::Internal(format!("starting the store checkpointer thread: {e}")))?;
        Ok(Checkpointer { bell: Some(bell), thread: Some(thread) })
    }

    /// Says a commit landed; never waits (a ring already pending covers this one).
    pub(crate) fn ring(&self) {
        if let Some(bell) = &self.bell {
            match bell.try_send(()) {
                // Full: a ring is already pending, and the pass it starts covers this commit too.
                Ok(()) | Err(mpsc::TrySendError::Full(())) => {}
                Err(mpsc::TrySendError::Disconnected(())) => {
                    tracing::debug!("the checkpointer thread is gone; the writer's backstop checkpoints alone");
                }
            }
        }
    }

    /// Stops the thread after its current pass and waits for it.
    pub(crate) fn stop(&mut self) {
        self.bell = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::warn!("the store checkpointer thread panicked; SQLite checkpoints at the next open");
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(conn: &Connection, rings: &mpsc::Receiver<()>) {
    while rings.recv().is_ok() {
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::debug!(error = %e, "a background WAL checkpoint failed; the next commit retries it");
        }
        std::thread::sleep(REST);
    }
}
