//! Repositories and checkouts: their facts, not their git.
//!
//! A checkout row belongs to an account (a standing agent or a run) and says which repository
//! and branch it has and where it stands: `preparing` (recorded with its account, which is
//! held, `desired = stopped`, until the daemon has made it), `ready`, `merged` or `discarded`
//! (a run's, once its Manager decided), `removed` (its directory is gone; its branch stays in
//! the mirror), or `failed`. Merge requests are `merges.rs`'s. The git itself is the daemon's
//! (`canopy-git`); the rules and the sentences are `canopy_core::repos`'s.

use canopy_core::acl::Caller;
use canopy_core::checks::NamedCheck;

use canopy_core::review::ReviewPolicy;
use canopy_core::{AccountKind, Error, Handle, Presence, Repo};
use rusqlite::{OptionalExtension, params};

use crate::presence::set_presence;
use crate::schema::audit;
use crate::views::{parse_enum, require_account};
use crate::{Db, rfc3339, sql};

/// A repository row with its id (the daemon adds the mirror's path to show it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRow {
    pub id: i64,
    pub name: String,
    pub source: String,
    pub base: String,
    /// Its named checks, by name.
    pub checks: Vec<NamedCheck>,
    pub review: ReviewPolicy,
    pub created_at: String,
}

impl RepoRow {
    /// The API's view, with the mirror's path.
    pub fn view(&self, mirror: String) -> Repo {
        let legacy = self.checks.iter().find(|c| c.name == canopy_core::checks::LEGACY_NAME);
        Repo {
            name: self.name.clone(),
            source: self.source.clone(),
            base: self.base.clone(),
            check: legacy.map(|c| c.command.clone()).unwrap_or_default(),
            checks: self.checks.clone(),
            review: self.review,
            mirror,
            created_at: self.created_at.clone(),
        }
    }
}

/// A repository row's checks column (JSON), as written by `add_repo`.
fn checks_column(r: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<Vec<NamedCheck>> {
    let text: String = r.get(index)?;
    serde_json::from_str(&text)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(index, rusqlite::types::Type::Text, Box::new(e)))
}

/// Where a checkout stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckoutState {
    Preparing,
    Ready,
    Merged,
    Discarded,
    Removed,
    Failed,
}

impl CheckoutState {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckoutState::Preparing => "preparing",
            CheckoutState::Ready => "ready",
            CheckoutState::Merged => "merged",
            CheckoutState::Discarded => "discarded",
            CheckoutState::Removed => "removed",
            CheckoutState::Failed => "failed",
        }
    }

    /// Whether its directory is (or is about to be) on disk: not once merged, discarded or
    /// removed, when it is gone and its branch stays in the mirror.
    pub fn has_directory(self) -> bool {
        matches!(self, CheckoutState::Preparing | CheckoutState::Ready | CheckoutState::Failed)
    }

    fn parse(s: &str) -> Option<CheckoutState> {
        [
            CheckoutState::Preparing,
            CheckoutState::Ready,
            CheckoutState::Merged,
            CheckoutState::Discarded,
            CheckoutState::Removed,
            CheckoutState::Failed,
        ]
        .into_iter()
        .find(|state| state.as_str() == s)
    }
}

/// An account's checkout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkout {
    pub account: Handle,
    pub repo: RepoRow,
    pub branch: String,
    /// The commit the branch started from (empty until made).
    pub base_commit: String,
    /// What to start from when making it: a commit in the mirror, or empty for the base.
    pub start: String,
    /// Read-only to its session (a reviewer run's checkout of a merged tree).
    pub read_only: bool,
    pub state: CheckoutState,
    pub note: Option<String>,
    /// For a run's checkout: the run and its Manager.
    pub run: Option<(i64, Handle)>,
    /// Whether the account is despawned (a standing agent gone, or a run ended).
    pub retired: bool,
    pub updated_ms: i64,
}

/// A checkout to record with a new account: the repository and what to start from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCheckout {
    pub repo_id: i64,
    /// A commit already in the mirror; empty for the repository's base branch.
    pub start: String,
    /// Read-only to its session (a reviewer run's checkout of a merged tree).
    pub read_only: bool,
}

const REPO_SELECT: &str = "SELECT id, name, source, base, checks, review, created_at FROM repos";

fn repo_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RepoRow> {
    Ok(RepoRow {
        id: r.get(0)?,
        name: r.get(1)?,
        source: r.get(2)?,
        base: r.get(3)?,
        checks: checks_column(r, 4)?,
        review: parse_enum(r, 5, ReviewPolicy::parse)?,
        created_at: rfc3339(r.get(6)?),
    })
}

/// Every repository, by name.
pub fn list_repos(conn: &Db<'_>) -> Result<Vec<RepoRow>, Error> {
    conn.prepare_cached(&format!("{REPO_SELECT} ORDER BY name"))
        .and_then(|mut s| s.query_map([], repo_from_row)?.collect())
        .map_err(sql("listing repositories"))
}

/// The repository with this name, if any.
pub fn repo(conn: &Db<'_>, name: &str) -> Result<Option<RepoRow>, Error> {
    conn.prepare_cached(&format!("{REPO_SELECT} WHERE name = ?1"))
        .and_then(|mut s| s.query_row(params![name], repo_from_row).optional())
        .map_err(sql("reading a repository"))
}

/// The repository named in `field`, or `invalid_argument` listing the known ones.
pub fn require_repo(conn: &Db<'_>, field: &'static str, name: &str) -> Result<RepoRow, Error> {
    if let Some(found) = repo(conn, name)? {
        return Ok(found);
    }
    let known: Vec<String> = list_repos(conn)?.into_iter().map(|r| r.name).collect();
    Err(Error::invalid(
        field,
        match known.is_empty() {
            true => format!("no repository {name:?}; the workspace has none (`canopy repos add`)"),
            false => format!("no repository {name:?} (repositories: {})", known.join(", ")),
        },
    ))
}

/// Records a repository whose mirror the daemon has made (an operator's act, audited).
/// `update` replaces an existing entry's source, base and check (`[[repos]]` at start).
pub fn add_repo(conn: &Db<'_>, actor: Option<&Caller>, repo: &RepoRow, update: bool) -> Result<RepoRow, Error> {
    let actor_id = match actor {
        Some(caller) => Some(require_account(conn, "caller", caller.handle.as_str())?.id),
        None => None,
    };
    let checks = serde_json::to_string(&repo.checks).map_err(|e| Error::Internal(format!("encoding checks: {e}")))?;
    if let Some(existing) = self::repo(conn, &repo.name)? {
        if !update {
            return Err(Error::AlreadyExists { field: "name", what: format!("a repository named {}", repo.name) });
        }
        conn.execute(
            "UPDATE repos SET source = ?1, base = ?2, checks = ?3, review = ?4 WHERE id = ?5",
            params![repo.source, repo.base, checks, repo.review.as_str(), existing.id],
        )
        .map_err(sql("updating a repository"))?;
    } else {
        conn.execute(
            "INSERT INTO repos (name, source, base, checks, review, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![repo.name, repo.source, repo.base, checks, repo.review.as_str(), conn.now_ms()],
        )
        .map_err(sql("recording a repository"))?;
    }
    audit(conn, actor_id, "repos.add", &repo.name, &format!("source={} base={}", repo.source, repo.base))?;
    self::repo(conn, &repo.name)?.ok_or_else(|| Error::Internal("a repository vanished as it was recorded".into()))
}

/// Records a new account's checkout as `preparing` and holds the account until it is made.
pub(crate) fn record_checkout(conn: &Db<'_>, account_id: i64, branch: &str, new: &NewCheckout) -> Result<(), Error> {
    let now = conn.now_ms();
    conn.execute(
        "INSERT INTO checkouts (account_id, repo_id, branch, start, read_only, state, created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, 'preparing', ?6, ?6)",
        params![account_id, new.repo_id, branch, new.start, new.read_only, now],
    )
    .map_err(sql("recording a checkout"))?;
    conn.execute("UPDATE accounts SET desired = 'stopped' WHERE id = ?1", params![account_id])
        .map_err(sql("holding an account"))?;
    set_presence(conn, account_id, Presence::Offline, Some("preparing its checkout"), None, now)
}

const CHECKOUT_SELECT: &str = "SELECT a.handle, r.id, r.name, r.source, r.base, r.checks, r.review, r.created_at, \
     k.branch, k.base_commit, k.start, k.state, k.note, run.id, m.handle, a.state = 'despawned', k.updated_at, \
     k.read_only \
     FROM checkouts k JOIN accounts a ON a.id = k.account_id JOIN repos r ON r.id = k.repo_id \
     LEFT JOIN runs run ON run.account_id = a.id LEFT JOIN accounts m ON m.id = run.manager_id";

fn checkout_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Checkout> {
    let run: Option<i64> = r.get(13)?;
    let manager: Option<String> = r.get(14)?;
    Ok(Checkout {
        account: Handle::from_trusted(r.get(0)?),
        repo: RepoRow {
            id: r.get(1)?,
            name: r.get(2)?,
            source: r.get(3)?,
            base: r.get(4)?,
            checks: checks_column(r, 5)?,
            review: parse_enum(r, 6, ReviewPolicy::parse)?,
            created_at: rfc3339(r.get(7)?),
        },
        branch: r.get(8)?,
        base_commit: r.get(9)?,
        start: r.get(10)?,
        state: parse_enum(r, 11, CheckoutState::parse)?,
        note: r.get(12)?,
        run: run.zip(manager.map(Handle::from_trusted)),
        retired: r.get(15)?,
        updated_ms: r.get(16)?,
        read_only: r.get(17)?,
    })
}

/// An account's checkout, if it has one.
pub fn checkout(conn: &Db<'_>, handle: &str) -> Result<Option<Checkout>, Error> {
    conn.prepare_cached(&format!("{CHECKOUT_SELECT} WHERE a.handle = ?1"))
        .and_then(|mut s| s.query_row(params![handle], checkout_from_row).optional())
        .map_err(sql("reading a checkout"))
}

/// The runner an account's checkout is on: the runner of its newest session (live or
/// ended), since a runner that keeps its own checkouts makes one where the session starts.
/// `None` before the account's first session.
pub fn checkout_host(conn: &Db<'_>, handle: &str) -> Result<Option<String>, Error> {
    conn.prepare_cached(
        "SELECT s.runner_id FROM sessions s JOIN accounts a ON a.id = s.agent_id
         WHERE a.handle = ?1 ORDER BY s.incarnation DESC LIMIT 1",
    )
    .and_then(|mut s| s.query_row(params![handle], |r| r.get(0)).optional())
    .map_err(sql("reading where a checkout is"))
}

/// The checkouts `runner_id` hosts (its accounts' newest session is there), with their
/// repositories: what its git login may fetch, and whose refs it may push.
pub fn hosted_checkouts(conn: &Db<'_>, runner_id: &str) -> Result<Vec<Checkout>, Error> {
    let mut s = conn
        .prepare_cached(&format!(
            "{CHECKOUT_SELECT} WHERE k.state = 'ready' AND (SELECT s.runner_id FROM sessions s WHERE s.agent_id = a.id
             ORDER BY s.incarnation DESC LIMIT 1) = ?1 ORDER BY a.handle"
        ))
        .map_err(sql("listing a runner's checkouts"))?;
    s.query_map(params![runner_id], checkout_from_row)
        .and_then(|rows| rows.collect())
        .map_err(sql("listing a runner's checkouts"))
}

/// Writes a refused request to the daemon's git endpoint to the audit log (`git_refused`):
/// the login that made it (a runner's id, or none), the repository and why.
pub fn record_git_refusal(conn: &Db<'_>, login: &str, repo: &str, why: &str) -> Result<(), Error> {
    crate::schema::audit(conn, None, "git_refused", repo, &format!("{login}: {why}"))
}

/// Every checkout, or those in one state.
pub fn checkouts(conn: &Db<'_>, state: Option<CheckoutState>) -> Result<Vec<Checkout>, Error> {
    let mut s = conn
        .prepare_cached(&format!("{CHECKOUT_SELECT} WHERE ?1 IS NULL OR k.state = ?1 ORDER BY a.handle"))
        .map_err(sql("listing checkouts"))?;
    s.query_map(params![state.map(CheckoutState::as_str)], checkout_from_row)
        .and_then(|rows| rows.collect())
        .map_err(sql("listing checkouts"))
}

/// A Manager's runs that have a checkout, newest first.
pub fn run_checkouts(conn: &Db<'_>, manager: &str) -> Result<Vec<Checkout>, Error> {
    let mut s = conn
        .prepare_cached(&format!("{CHECKOUT_SELECT} WHERE m.handle = ?1 ORDER BY run.id DESC LIMIT 200"))
        .map_err(sql("listing run checkouts"))?;
    s.query_map(params![manager], checkout_from_row)
        .and_then(|rows| rows.collect())
        .map_err(sql("listing run checkouts"))
}

/// Moves a checkout to `state`. Made (`ready` from `preparing`): records the commit it
/// started from and lets its account run; failed: keeps the account held with the reason.
pub fn set_checkout(
    conn: &Db<'_>,
    handle: &str,
    state: CheckoutState,
    base_commit: Option<&str>,
    note: Option<&str>,
) -> Result<(), Error> {
    let account = require_account(conn, "agent", handle)?;
    let now = conn.now_ms();
    conn.execute(
        "UPDATE checkouts SET state = ?1, base_commit = COALESCE(?2, base_commit), note = ?3, updated_at = ?4 \
         WHERE account_id = ?5",
        params![state.as_str(), base_commit, note, now, account.id],
    )
    .map_err(sql("updating a checkout"))?;
    match state {
        CheckoutState::Ready if account.state != canopy_core::AccountState::Despawned && base_commit.is_some() => {
            conn.execute("UPDATE accounts SET desired = 'running' WHERE id = ?1", params![account.id])
                .map_err(sql("releasing an account"))?;
            set_presence(conn, account.id, Presence::Offline, Some("no session yet"), None, now)?;
        }
        CheckoutState::Failed => {
            let reason = format!("its checkout could not be made: {}", note.unwrap_or("unknown"));
            set_presence(conn, account.id, Presence::Offline, Some(&reason), None, now)?;
        }
        _ => {}
    }
    Ok(())
}

/// Marks when an account's checkout stopped being worked in (its agent despawned, its run
/// ended): retention counts from here.
pub(crate) fn retire_checkout(conn: &Db<'_>, account_id: i64) -> Result<(), Error> {
    conn.execute("UPDATE checkouts SET updated_at = ?1 WHERE account_id = ?2", params![conn.now_ms(), account_id])
        .map(|_| ())
        .map_err(sql("retiring a checkout"))
}

/// A run's checkout for its Manager to merge or discard: refused unless `caller` is the
/// run's Manager and the run has ended with a checkout that is still there.
pub fn run_checkout_for(conn: &Db<'_>, caller: &Caller, run: i64) -> Result<Checkout, Error> {
    // Whose run it is comes first: nobody else learns whether it has a checkout.
    let owner: Option<(String, bool)> = conn
        .query_row(
            "SELECT m.handle, r.ended_at IS NOT NULL FROM runs r JOIN accounts m ON m.id = r.manager_id WHERE r.id = ?1",
            params![run],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(sql("reading a run"))?;
    let action = || format!("merge or discard run {run}");
    let Some((manager, ended)) = owner else {
        return match caller.kind {
            AccountKind::Agent => Err(Error::invalid("run_id", format!("run {run} does not exist"))),
            _ => Err(Error::Forbidden {
                action: action(),
                reason: "only the run's Manager merges or discards it".into(),
            }),
        };
    };
    if manager != caller.handle.as_str() {
        return Err(Error::Forbidden { action: action(), reason: format!("run {run} is {manager}'s") });
    }
    let Some(found) = checkout(conn, &format!("run-{run}"))? else {
        return Err(Error::invalid("run_id", format!("run {run} had no checkout (it worked on no repository)")));
    };
    if !ended {
        return Err(Error::ConflictOn {
            field: "run_id",
            reason: format!("run {run} is still running; wait for its report"),
        });
    }
    if found.state != CheckoutState::Ready {
        return Err(Error::ConflictOn {
            field: "run_id",
            reason: format!("run {run}'s checkout is {}; nothing to do", found.state.as_str()),
        });
    }
    Ok(found)
}

/// Records that a Manager merged or discarded a run's branch (audited).
pub fn close_run_checkout(
    conn: &Db<'_>,
    caller: &Caller,
    run: i64,
    state: CheckoutState,
    detail: &str,
) -> Result<(), Error> {
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    set_checkout(conn, &format!("run-{run}"), state, None, None)?;
    let action = if state == CheckoutState::Merged { "runs.merge" } else { "runs.discard" };
    audit(conn, Some(actor.id), action, &format!("run-{run}"), detail)
}

/// Checkouts retention removes: those of despawned agents and of ended runs (neither merged
/// nor discarded) retired before `cutoff_ms`.
pub fn stale_checkouts(conn: &Db<'_>, cutoff_ms: i64) -> Result<Vec<Checkout>, Error> {
    let mut s = conn
        .prepare_cached(&format!(
            "{CHECKOUT_SELECT} WHERE k.state IN ('ready', 'failed') AND a.state = 'despawned' AND k.updated_at < ?1 \
             ORDER BY a.handle LIMIT 100"
        ))
        .map_err(sql("finding stale checkouts"))?;
    s.query_map(params![cutoff_ms], checkout_from_row)
        .and_then(|rows| rows.collect())
        .map_err(sql("finding stale checkouts"))
}
