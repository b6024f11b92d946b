//! Repositories, checkouts and merge requests: their facts, not their git.
//!
//! A checkout row belongs to an account (a standing agent or a run) and says which repository
//! and branch it has and where it stands: `preparing` (recorded with its account, which is
//! held, `desired = stopped`, until the daemon has made it), `ready`, `merged` or `discarded`
//! (a run's, once its Manager decided), `removed` (its directory is gone; its branch stays in
//! the mirror), or `failed`. A merge request goes `checking` (the daemon checks the merged
//! tree), `pending` (posted for the operator in the requester's home channel under `merge:
//! <title>`), then only by an operator's decision `merging` and `merged` or `refused`, or
//! `denied`. An agent's attempt to decide is refused, audited and told to the operators, and
//! that record commits although the attempt fails. The git itself is the daemon's
//! (`canopy-git`); the rules and the sentences are `canopy_core::repos`'s.

use canopy_core::acl::Caller;
use canopy_core::repos::{self as rules, say};
use canopy_core::{AccountKind, Error, Handle, MergeRequest, MergeState, Message, Presence, Repo, TopicName};
use rusqlite::{OptionalExtension, params};

use crate::notices::notice_in_home;
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
    pub check: String,
    pub created_at: String,
}

impl RepoRow {
    /// The API's view, with the mirror's path.
    pub fn view(&self, mirror: String) -> Repo {
        Repo {
            name: self.name.clone(),
            source: self.source.clone(),
            base: self.base.clone(),
            check: self.check.clone(),
            mirror,
            created_at: self.created_at.clone(),
        }
    }
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
}

const REPO_SELECT: &str = "SELECT id, name, source, base, check_command, created_at FROM repos";

fn repo_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RepoRow> {
    Ok(RepoRow {
        id: r.get(0)?,
        name: r.get(1)?,
        source: r.get(2)?,
        base: r.get(3)?,
        check: r.get(4)?,
        created_at: rfc3339(r.get(5)?),
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
    if let Some(existing) = self::repo(conn, &repo.name)? {
        if !update {
            return Err(Error::AlreadyExists { field: "name", what: format!("a repository named {}", repo.name) });
        }
        conn.execute(
            "UPDATE repos SET source = ?1, base = ?2, check_command = ?3 WHERE id = ?4",
            params![repo.source, repo.base, repo.check, existing.id],
        )
        .map_err(sql("updating a repository"))?;
    } else {
        conn.execute(
            "INSERT INTO repos (name, source, base, check_command, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![repo.name, repo.source, repo.base, repo.check, conn.now_ms()],
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
        "INSERT INTO checkouts (account_id, repo_id, branch, start, state, created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, 'preparing', ?5, ?5)",
        params![account_id, new.repo_id, branch, new.start, now],
    )
    .map_err(sql("recording a checkout"))?;
    conn.execute("UPDATE accounts SET desired = 'stopped' WHERE id = ?1", params![account_id])
        .map_err(sql("holding an account"))?;
    set_presence(conn, account_id, Presence::Offline, Some("preparing its checkout"), None, now)
}

const CHECKOUT_SELECT: &str = "SELECT a.handle, r.id, r.name, r.source, r.base, r.check_command, r.created_at, \
     k.branch, k.base_commit, k.start, k.state, k.note, run.id, m.handle, a.state = 'despawned', k.updated_at \
     FROM checkouts k JOIN accounts a ON a.id = k.account_id JOIN repos r ON r.id = k.repo_id \
     LEFT JOIN runs run ON run.account_id = a.id LEFT JOIN accounts m ON m.id = run.manager_id";

fn checkout_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Checkout> {
    let run: Option<i64> = r.get(12)?;
    let manager: Option<String> = r.get(13)?;
    Ok(Checkout {
        account: Handle::from_trusted(r.get(0)?),
        repo: RepoRow {
            id: r.get(1)?,
            name: r.get(2)?,
            source: r.get(3)?,
            base: r.get(4)?,
            check: r.get(5)?,
            created_at: rfc3339(r.get(6)?),
        },
        branch: r.get(7)?,
        base_commit: r.get(8)?,
        start: r.get(9)?,
        state: parse_enum(r, 10, CheckoutState::parse)?,
        note: r.get(11)?,
        run: run.zip(manager.map(Handle::from_trusted)),
        retired: r.get(14)?,
        updated_ms: r.get(15)?,
    })
}

/// An account's checkout, if it has one.
pub fn checkout(conn: &Db<'_>, handle: &str) -> Result<Option<Checkout>, Error> {
    conn.prepare_cached(&format!("{CHECKOUT_SELECT} WHERE a.handle = ?1"))
        .and_then(|mut s| s.query_row(params![handle], checkout_from_row).optional())
        .map_err(sql("reading a checkout"))
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

// ---- merge requests ----

/// A merge request to record (the daemon has published its head into the mirror).
#[derive(Debug, Clone)]
pub struct MergeSpec {
    pub repo_id: i64,
    pub branch: String,
    pub head: String,
    pub title: String,
    pub summary: String,
    pub depends_on: Vec<i64>,
    /// Issues it works on (the requester's or its reports'): their owners are told when it lands.
    pub issues: Vec<u64>,
}

/// What the check of a request's merged tree found.
#[derive(Debug, Clone)]
pub struct MergeCheck {
    pub base_commit: String,
    pub commits: Vec<String>,
    pub diffstat: String,
    pub check: String,
    pub passed: bool,
}

/// How landing an approved request ended.
#[derive(Debug, Clone)]
pub enum Landed {
    Merged { commit: String, fast_forward: bool },
    Refused(String),
}

const MERGE_SELECT: &str = "SELECT g.id, q.handle, r.name, g.branch, g.head, r.base, g.title, g.summary, g.depends_on, \
     g.state, g.commits, g.diffstat, g.check_result, d.handle, g.note, g.merged_commit, g.created_at, g.decided_at \
     FROM merges g JOIN accounts q ON q.id = g.requester_id JOIN repos r ON r.id = g.repo_id \
     LEFT JOIN accounts d ON d.id = g.decided_by";

fn merge_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<MergeRequest> {
    let split = |s: String| s.split('\n').filter(|l| !l.is_empty()).map(str::to_owned).collect::<Vec<_>>();
    Ok(MergeRequest {
        id: format!("merge-{}", r.get::<_, i64>(0)?),
        requester: Handle::from_trusted(r.get(1)?),
        repo: r.get(2)?,
        branch: r.get(3)?,
        head: r.get(4)?,
        base: r.get(5)?,
        title: r.get(6)?,
        summary: r.get(7)?,
        depends_on: r.get::<_, String>(8)?.split(',').filter(|s| !s.is_empty()).map(|n| format!("merge-{n}")).collect(),
        state: parse_enum(r, 9, MergeState::parse)?,
        commits: split(r.get(10)?),
        diffstat: r.get(11)?,
        check: r.get(12)?,
        decided_by: r.get::<_, Option<String>>(13)?.map(Handle::from_trusted),
        note: r.get(14)?,
        merged_commit: r.get(15)?,
        created_at: rfc3339(r.get(16)?),
        decided_at: r.get::<_, Option<i64>>(17)?.map(rfc3339),
    })
}

/// One merge request by number.
pub fn load_merge(conn: &Db<'_>, id: i64) -> Result<MergeRequest, Error> {
    conn.prepare_cached(&format!("{MERGE_SELECT} WHERE g.id = ?1"))
        .and_then(|mut s| s.query_row(params![id], merge_from_row).optional())
        .map_err(sql("reading a merge request"))?
        .ok_or_else(|| Error::invalid("id", format!("merge-{id} does not exist")))
}

/// Merge requests, newest first, optionally in one state.
pub fn list_merges(conn: &Db<'_>, state: Option<MergeState>) -> Result<Vec<MergeRequest>, Error> {
    let mut s = conn
        .prepare_cached(&format!("{MERGE_SELECT} WHERE ?1 IS NULL OR g.state = ?1 ORDER BY g.id DESC LIMIT 200"))
        .map_err(sql("listing merge requests"))?;
    s.query_map(params![state.map(|s| s.as_str())], merge_from_row)
        .and_then(|rows| rows.collect())
        .map_err(sql("listing merge requests"))
}

/// The base commit a request's check ran against, and whether it passed.
pub fn merge_checked_base(conn: &Db<'_>, id: i64) -> Result<(String, bool), Error> {
    conn.query_row("SELECT base_commit, check_passed FROM merges WHERE id = ?1", params![id], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })
    .map_err(sql("reading a merge request's check"))
}

/// Records a Manager's request (state `checking`); its dependencies must be its own.
pub fn request_merge(conn: &Db<'_>, caller: &Caller, spec: &MergeSpec) -> Result<MergeRequest, Error> {
    if caller.kind != AccountKind::Agent {
        return Err(Error::invalid("caller", "operators merge with git directly; merge requests are agents'"));
    }
    let requester = require_account(conn, "caller", caller.handle.as_str())?;
    for dep in &spec.depends_on {
        let below =
            load_merge(conn, *dep).map_err(|_| Error::invalid("depends_on", format!("merge-{dep} does not exist")))?;
        if below.requester != caller.handle {
            return Err(Error::invalid("depends_on", format!("merge-{dep} is {}'s, not yours", below.requester)));
        }
        if matches!(below.state, MergeState::Denied | MergeState::Refused) {
            return Err(Error::ConflictOn {
                field: "depends_on",
                reason: format!("merge-{dep} is {}; it will never merge", below.state),
            });
        }
    }
    let open: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM merges WHERE requester_id = ?1 AND title = ?2 AND state IN ('checking', 'pending', 'merging'))",
            params![requester.id, spec.title],
            |r| r.get(0),
        )
        .map_err(sql("checking a title"))?;
    if open {
        return Err(Error::ConflictOn {
            field: "title",
            reason: format!("a request titled {:?} is already open", spec.title),
        });
    }
    let deps: Vec<String> = spec.depends_on.iter().map(i64::to_string).collect();
    conn.execute(
        "INSERT INTO merges (requester_id, repo_id, branch, head, title, summary, depends_on, state, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'checking', ?8)",
        params![
            requester.id,
            spec.repo_id,
            spec.branch,
            spec.head,
            spec.title,
            spec.summary,
            deps.join(","),
            conn.now_ms()
        ],
    )
    .map_err(sql("recording a merge request"))?;
    let id = conn.last_insert_rowid();
    crate::issues::link_merge(conn, &requester, &spec.issues, id)?;
    let request = load_merge(conn, id)?;
    audit(
        conn,
        Some(requester.id),
        "merges.request",
        &request.id,
        &format!("branch={} head={}", spec.branch, spec.head),
    )?;
    Ok(request)
}

fn post_about(conn: &Db<'_>, request: &MergeRequest, body: &str) -> Result<Message, Error> {
    let requester = require_account(conn, "requester", request.requester.as_str())?;
    notice_in_home(conn, requester.id, &TopicName::from_trusted(rules::merge_topic(&request.title)), body)
}

/// Records the check of a request's merged tree and posts the request for the operators.
pub fn merge_checked(conn: &Db<'_>, id: i64, check: &MergeCheck) -> Result<(MergeRequest, Message), Error> {
    conn.execute(
        "UPDATE merges SET state = 'pending', base_commit = ?1, commits = ?2, diffstat = ?3, check_result = ?4, \
         check_passed = ?5 WHERE id = ?6 AND state = 'checking'",
        params![check.base_commit, check.commits.join("\n"), check.diffstat, check.check, check.passed, id],
    )
    .map_err(sql("recording a merge check"))?;
    let request = load_merge(conn, id)?;
    let operators: Vec<String> = conn
        .prepare_cached("SELECT handle FROM accounts WHERE kind = 'operator' ORDER BY handle")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("listing operators"))?;
    let notice = post_about(conn, &request, &say::requested(&operators, &request))?;
    Ok((request, notice))
}

/// What a decision did: the request, Canopy's posts, and for a refused attempt the error.
#[derive(Debug)]
pub struct MergeDecided {
    pub request: MergeRequest,
    pub notices: Vec<Message>,
    pub refused: Option<Error>,
    /// Approved: the daemon now lands it.
    pub land: bool,
}

/// An operator's decision, or an agent's refused and audited attempt at one.
pub fn decide_merge(
    conn: &Db<'_>,
    caller: &Caller,
    id: i64,
    approve: bool,
    note: Option<String>,
) -> Result<MergeDecided, Error> {
    let request = load_merge(conn, id)?;
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    if let Err(error) = rules::may_decide(caller, approve, &request.id) {
        let action = format!("merges.{}.refused", if approve { "approve" } else { "deny" });
        audit(conn, Some(actor.id), &action, &request.id, "an agent tried to decide")?;
        let notice = post_about(conn, &request, &say::attempt(caller.handle.as_str(), approve, &request))?;
        return Ok(MergeDecided { request, notices: vec![notice], refused: Some(error), land: false });
    }
    rules::check_pending(&request)?;
    let now = conn.now_ms();
    if !approve {
        conn.execute(
            "UPDATE merges SET state = 'denied', decided_by = ?1, note = ?2, decided_at = ?3 WHERE id = ?4 AND state = 'pending'",
            params![actor.id, note, now, id],
        )
        .map_err(sql("denying a merge request"))?;
        audit(conn, Some(actor.id), "merges.deny", &request.id, note.as_deref().unwrap_or(""))?;
        let notice = post_about(conn, &request, &say::denied(caller.handle.as_str(), &request, note.as_deref()))?;
        return Ok(MergeDecided { request: load_merge(conn, id)?, notices: vec![notice], refused: None, land: false });
    }
    let below: Vec<(String, MergeState)> = request
        .depends_on
        .iter()
        .map(|dep| {
            let n = rules::parse_merge_id("depends_on", dep)?;
            Ok((dep.clone(), load_merge(conn, n)?.state))
        })
        .collect::<Result<_, Error>>()?;
    rules::check_stack(&request, &below)?;
    conn.execute(
        "UPDATE merges SET state = 'merging', decided_by = ?1, decided_at = ?2 WHERE id = ?3 AND state = 'pending'",
        params![actor.id, now, id],
    )
    .map_err(sql("approving a merge request"))?;
    audit(conn, Some(actor.id), "merges.approve", &request.id, "")?;
    Ok(MergeDecided { request: load_merge(conn, id)?, notices: Vec::new(), refused: None, land: true })
}

/// Records how landing an approved request ended, and tells the requester.
pub fn finish_merge(conn: &Db<'_>, id: i64, landed: &Landed) -> Result<(MergeRequest, Message), Error> {
    let request = load_merge(conn, id)?;
    let operator = request.decided_by.as_ref().map(Handle::as_str).unwrap_or("an operator").to_owned();
    let (state, note, commit, body) = match landed {
        Landed::Merged { commit, fast_forward } => {
            (MergeState::Merged, None, Some(commit.clone()), say::merged(&operator, &request, commit, *fast_forward))
        }
        Landed::Refused(why) => (MergeState::Refused, Some(why.clone()), None, say::refused(&operator, &request, why)),
    };
    conn.execute(
        "UPDATE merges SET state = ?1, note = ?2, merged_commit = ?3 WHERE id = ?4 AND state = 'merging'",
        params![state.as_str(), note, commit, id],
    )
    .map_err(sql("finishing a merge"))?;
    audit(conn, None, &format!("merges.{}", state.as_str()), &request.id, note.as_deref().unwrap_or(""))?;
    let notice = post_about(conn, &request, &body)?;
    Ok((load_merge(conn, id)?, notice))
}

/// At start: a request left `merging` by a stopped daemon is pending again (told), and one
/// left `checking` is returned to be checked again.
pub fn recover_merges(conn: &Db<'_>) -> Result<(Vec<Message>, Vec<i64>), Error> {
    let merging: Vec<i64> = conn
        .prepare_cached("SELECT id FROM merges WHERE state = 'merging'")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("finding interrupted merges"))?;
    let mut notices = Vec::new();
    for id in merging {
        conn.execute(
            "UPDATE merges SET state = 'pending', decided_by = NULL, decided_at = NULL WHERE id = ?1",
            params![id],
        )
        .map_err(sql("resetting a merge"))?;
        let request = load_merge(conn, id)?;
        notices.push(post_about(conn, &request, &say::interrupted(&request))?);
    }
    let checking: Vec<i64> = conn
        .prepare_cached("SELECT id FROM merges WHERE state = 'checking'")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("finding unchecked merges"))?;
    Ok((notices, checking))
}

/// The newest pending request discussed in `topic` of `channel` (a requester's home).
pub fn merge_in_topic(conn: &Db<'_>, channel: &str, topic: &str) -> Result<Option<i64>, Error> {
    let title = topic.strip_prefix("merge: ").unwrap_or(topic);
    conn.query_row(
        "SELECT g.id FROM merges g JOIN accounts q ON q.id = g.requester_id JOIN channels c ON c.id = q.home_channel_id \
         WHERE c.name = ?1 AND g.title = ?2 ORDER BY g.id DESC LIMIT 1",
        params![channel, title],
        |r| r.get(0),
    )
    .optional()
    .map_err(sql("finding a merge request by topic"))
}

/// Posts `body` in a merge request's topic (an answer to a reply that decided nothing).
pub fn merge_notice(conn: &Db<'_>, id: i64, body: &str) -> Result<Message, Error> {
    let request = load_merge(conn, id)?;
    post_about(conn, &request, body)
}

/// A merge request's number (for callers holding the view).
pub fn merge_number(request: &MergeRequest) -> i64 {
    rules::parse_merge_id("id", &request.id).unwrap_or_default()
}
