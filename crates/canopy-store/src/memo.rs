//! The writer's memo: rows every post reads and that change far less often than posts
//! arrive (accounts by handle, a channel's post facts, a channel's agent subscribers with
//! their live state), and whether any issue has a budget (every usage write asks), kept
//! between jobs on the writer's thread.
//!
//! Coherent because the writer is the only writer: SQLite's update hook on the writer's
//! connection marks a part stale the moment any row of a table it was read from changes
//! (`parts_read_from`), and the next lookup drops that part before answering. The update hook
//! does not see `WITHOUT ROWID` tables (`subscriptions`, `channel_posters`), so `watch` gives
//! the writer's connection temporary triggers on them that mark the same way. A job that rolls back,
//! or a commit that fails, drops everything (`forget`): an entry read from a change that never
//! committed must not outlive it. Each part is dropped whole when it grows past `MAX_ENTRIES`.
//! Read connections have no memo. Holds no decision of its own: what a row means is decided
//! where it is read (`views`, `delivery`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use canopy_core::{Channel, Error};

use crate::delivery::Recipient;
use crate::views::AccountRef;

const ACCOUNTS: u8 = 1;
const CHANNELS: u8 = 2;
const RECIPIENTS: u8 = 4;
const ISSUE_BUDGETS: u8 = 8;
/// Entries per part before it is dropped and refilled.
const MAX_ENTRIES: usize = 16_384;

/// Which parts of the memo a change to `table` makes stale.
pub(crate) fn parts_read_from(table: &str) -> u8 {
    match table {
        // Handles, kinds and states; a channel's owner; a recipient's handle and state.
        "accounts" => ACCOUNTS | CHANNELS | RECIPIENTS,
        "channels" | "channel_posters" => CHANNELS,
        "subscriptions" | "presence" | "sessions" => RECIPIENTS,
        // Whether any issue has a budget (every usage write asks).
        "issues" => ISSUE_BUDGETS,
        _ => 0,
    }
}

/// Rows of `subscriptions` and `channel_posters` added or removed mark the parts read from
/// them stale (a cursor moving does not).
pub(crate) fn watch(conn: &rusqlite::Connection, memo: &Memo) -> rusqlite::Result<()> {
    let stale = memo.stale_flags();
    conn.create_scalar_function("canopy_memo_stale", 1, rusqlite::functions::FunctionFlags::SQLITE_UTF8, move |ctx| {
        stale.fetch_or(ctx.get::<u8>(0)?, Ordering::SeqCst);
        Ok(0)
    })?;
    let mut triggers = String::new();
    for table in ["subscriptions", "channel_posters"] {
        let parts = parts_read_from(table);
        for (name, event) in [("in", "INSERT"), ("out", "DELETE"), ("moved", "UPDATE OF account_id, channel_id")] {
            triggers.push_str(&format!(
                "CREATE TEMP TRIGGER memo_{table}_{name} AFTER {event} ON main.{table} \
                 BEGIN SELECT canopy_memo_stale({parts}); END;\n"
            ));
        }
    }
    conn.execute_batch(&triggers)
}

/// The memo. `stale` is shared with the update hook, which may run during any statement.
#[derive(Default)]
pub(crate) struct Memo {
    stale: Arc<AtomicU8>,
    accounts: RefCell<HashMap<String, AccountRef>>,
    channels: RefCell<HashMap<String, (i64, Channel)>>,
    /// Every agent subscribed to a channel (the sender not yet left out), by channel id.
    recipients: RefCell<HashMap<i64, Vec<Recipient>>>,
    /// Whether any issue has a budget of its own, once read.
    issue_budgets: std::cell::Cell<Option<bool>>,
}

impl Memo {
    /// The flag word the update hook sets (`parts_read_from`).
    pub(crate) fn stale_flags(&self) -> Arc<AtomicU8> {
        self.stale.clone()
    }

    /// Drops everything: after a rolled-back job or a failed commit.
    pub(crate) fn forget(&self) {
        self.stale.store(0, Ordering::SeqCst);
        self.accounts.borrow_mut().clear();
        self.channels.borrow_mut().clear();
        self.recipients.borrow_mut().clear();
        self.issue_budgets.set(None);
    }

    fn drop_stale(&self) {
        let stale = self.stale.swap(0, Ordering::SeqCst);
        if stale & ACCOUNTS != 0 {
            self.accounts.borrow_mut().clear();
        }
        if stale & CHANNELS != 0 {
            self.channels.borrow_mut().clear();
        }
        if stale & RECIPIENTS != 0 {
            self.recipients.borrow_mut().clear();
        }
        if stale & ISSUE_BUDGETS != 0 {
            self.issue_budgets.set(None);
        }
    }

    /// Whether any issue has a budget, read by `read` when not remembered.
    pub(crate) fn any_issue_budget(&self, read: impl FnOnce() -> Result<bool, Error>) -> Result<bool, Error> {
        self.drop_stale();
        if let Some(known) = self.issue_budgets.get() {
            return Ok(known);
        }
        let found = read()?;
        self.issue_budgets.set(Some(found));
        Ok(found)
    }

    /// The account with this handle, read by `read` when not remembered (a missing account
    /// is not remembered).
    pub(crate) fn account(
        &self,
        handle: &str,
        read: impl FnOnce() -> Result<Option<AccountRef>, Error>,
    ) -> Result<Option<AccountRef>, Error> {
        self.drop_stale();
        if let Some(hit) = self.accounts.borrow().get(handle) {
            return Ok(Some(hit.clone()));
        }
        let found = read()?;
        if let Some(account) = &found {
            remember(&self.accounts, handle.to_owned(), account.clone());
        }
        Ok(found)
    }

    /// A channel's id and post facts, read by `read` when not remembered.
    pub(crate) fn channel(
        &self,
        name: &str,
        read: impl FnOnce() -> Result<(i64, Channel), Error>,
    ) -> Result<(i64, Channel), Error> {
        self.drop_stale();
        if let Some(hit) = self.channels.borrow().get(name) {
            return Ok(hit.clone());
        }
        let found = read()?;
        remember(&self.channels, name.to_owned(), found.clone());
        Ok(found)
    }

    /// A channel's agent subscribers, read by `read` when not remembered.
    pub(crate) fn recipients(
        &self,
        channel_id: i64,
        read: impl FnOnce() -> Result<Vec<Recipient>, Error>,
    ) -> Result<Vec<Recipient>, Error> {
        self.drop_stale();
        if let Some(hit) = self.recipients.borrow().get(&channel_id) {
            return Ok(hit.clone());
        }
        let found = read()?;
        remember(&self.recipients, channel_id, found.clone());
        Ok(found)
    }
}

fn remember<K: std::hash::Hash + Eq, V>(part: &RefCell<HashMap<K, V>>, key: K, value: V) {
    let mut part = part.borrow_mut();
    if part.len() >= MAX_ENTRIES {
        part.clear();
    }
    part.insert(key, value);
}
