//! Named checks' records (DESIGN section 18): every run of a check on a commit with its log,
//! the newest head and check state of each standing agent's branch, and the conflicts found
//! between live branches and the base.
//!
//! A run is recorded `running` before it starts and finished with its outcome and the last
//! bytes of its log, so a daemon stopped mid-check leaves a row that recovery marks `error`.
//! Does not run anything (`canopy-git`), decide wording (`canopy_core::checks::say`) or
//! decide who is told (the daemon's checks service).

use canopy_core::checks::{CheckRun, CheckState, CheckTrigger};
use canopy_core::{Error, Message, TopicName};
use rusqlite::{OptionalExtension, params};

use crate::notices::notice_in_home;
use crate::views::{parse_enum, require_account};
use crate::{Db, rfc3339, sql};

/// A check about to run.
#[derive(Debug, Clone)]
pub struct CheckStart {
    pub repo_id: i64,
    pub name: String,
    pub command: String,
    pub commit: String,
    pub trigger: CheckTrigger,
    /// What it runs for: a branch, or `merge-<n>`.
    pub subject: String,
}

/// How a check ended.
#[derive(Debug, Clone)]
pub struct CheckEnd {
    pub state: CheckState,
    pub outcome: String,
    pub duration_ms: u64,
    pub log: String,
}

const CHECK_SELECT: &str = "SELECT k.id, r.name, k.name, k.command, k.commit_sha, k.trigger, k.subject, k.state, \
     k.outcome, k.duration_ms, k.log_bytes, k.started_at, k.finished_at FROM check_runs k JOIN repos r ON r.id = k.repo_id";

fn check_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CheckRun> {
    Ok(CheckRun {
        id: format!("check-{}", r.get::<_, i64>(0)?),
        repo: r.get(1)?,
        name: r.get(2)?,
        command: r.get(3)?,
        commit: r.get(4)?,
        trigger: parse_enum(r, 5, CheckTrigger::parse)?,
        subject: r.get(6)?,
        state: parse_enum(r, 7, CheckState::parse)?,
        outcome: r.get(8)?,
        duration_ms: r.get::<_, i64>(9)?.max(0) as u64,
        log_bytes: r.get::<_, i64>(10)?.max(0) as u64,
        started_at: rfc3339(r.get(11)?),
        finished_at: r.get::<_, Option<i64>>(12)?.map(rfc3339),
    })
}

/// `check-<n>` as its number.
pub fn parse_check_id(field: &'static str, id: &str) -> Result<i64, Error> {
    id.strip_prefix("check-")
        .and_then(|n| n.parse::<i64>().ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| Error::invalid(field, format!("{id:?} is not a check id like check-4")))
}

/// Records a check as `running`; returns its number.
pub fn start_check(conn: &Db<'_>, start: &CheckStart) -> Result<i64, Error> {
    conn.prepare_cached(
        "INSERT INTO check_runs (repo_id, name, command, commit_sha, trigger, subject, state, started_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running', ?7)",
    )
    .and_then(|mut s| {
        s.execute(params![
            start.repo_id,
            start.name,
            start.command,
            start.commit,
            start.trigger.as_str(),
            start.subject,
            conn.now_ms()
        ])
    })
    .map_err(sql("recording a check"))?;
    Ok(conn.last_insert_rowid())
}

/// Records how a check ended, with its log.
pub fn finish_check(conn: &Db<'_>, id: i64, end: &CheckEnd) -> Result<CheckRun, Error> {
    conn.prepare_cached(
        "UPDATE check_runs SET state = ?1, outcome = ?2, duration_ms = ?3, log = ?4, log_bytes = ?5, finished_at = ?6 \
         WHERE id = ?7",
    )
    .and_then(|mut s| {
        s.execute(params![
            end.state.as_str(),
            end.outcome,
            end.duration_ms as i64,
            end.log,
            end.log.len() as i64,
            conn.now_ms(),
            id
        ])
    })
    .map_err(sql("finishing a check"))?;
    load_check(conn, id)
}

/// One check run by number.
pub fn load_check(conn: &Db<'_>, id: i64) -> Result<CheckRun, Error> {
    conn.prepare_cached(&format!("{CHECK_SELECT} WHERE k.id = ?1"))
        .and_then(|mut s| s.query_row(params![id], check_from_row).optional())
        .map_err(sql("reading a check"))?
        .ok_or_else(|| Error::invalid("id", format!("check-{id} does not exist")))
}

/// A check run and its log (empty once retention removed it).
pub fn check_log(conn: &Db<'_>, id: i64) -> Result<(CheckRun, String), Error> {
    let run = load_check(conn, id)?;
    let log: Option<String> = conn
        .query_row("SELECT log FROM check_runs WHERE id = ?1", params![id], |r| r.get(0))
        .map_err(sql("reading a check's log"))?;
    Ok((run, log.unwrap_or_default()))
}

/// The newest run of each check on `commit` for `subject`, by name.
pub fn checks_on(conn: &Db<'_>, repo_id: i64, subject: &str, commit: &str) -> Result<Vec<CheckRun>, Error> {
    let mut s = conn
        .prepare_cached(&format!(
            "{CHECK_SELECT} WHERE k.id IN (SELECT MAX(id) FROM check_runs WHERE repo_id = ?1 AND subject = ?2 \
             AND commit_sha = ?3 GROUP BY name) ORDER BY k.name"
        ))
        .map_err(sql("reading checks"))?;
    s.query_map(params![repo_id, subject, commit], check_from_row)
        .and_then(|rows| rows.collect())
        .map_err(sql("reading checks"))
}

/// The newest run of each check on the newest commit checked for `subject`.
pub fn latest_checks(conn: &Db<'_>, repo_id: i64, subject: &str) -> Result<Vec<CheckRun>, Error> {
    let commit: Option<String> = conn
        .query_row(
            "SELECT commit_sha FROM check_runs WHERE repo_id = ?1 AND subject = ?2 ORDER BY id DESC LIMIT 1",
            params![repo_id, subject],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql("reading checks"))?;
    match commit {
        Some(commit) => checks_on(conn, repo_id, subject, &commit),
        None => Ok(Vec::new()),
    }
}

/// Check runs, newest first, of one repository or subject when named.
pub fn list_checks(
    conn: &Db<'_>,
    repo: Option<&str>,
    subject: Option<&str>,
    limit: u32,
) -> Result<Vec<CheckRun>, Error> {
    let mut s = conn
        .prepare_cached(&format!(
            "{CHECK_SELECT} WHERE (?1 IS NULL OR r.name = ?1) AND (?2 IS NULL OR k.subject = ?2) ORDER BY k.id DESC LIMIT ?3"
        ))
        .map_err(sql("listing checks"))?;
    s.query_map(params![repo, subject, limit], check_from_row)
        .and_then(|rows| rows.collect())
        .map_err(sql("listing checks"))
}

/// At start: a check a stopped daemon left running ended with it.
pub fn recover_checks(conn: &Db<'_>) -> Result<usize, Error> {
    conn.execute(
        "UPDATE check_runs SET state = 'error', outcome = 'the daemon stopped while it ran', finished_at = ?1 \
         WHERE state = 'running'",
        params![conn.now_ms()],
    )
    .map_err(sql("recovering checks"))
}

/// Retention: check runs that ended before `cutoff_ms` are deleted, with their logs.
pub fn prune_checks(conn: &Db<'_>, cutoff_ms: i64) -> Result<usize, Error> {
    conn.execute("DELETE FROM check_runs WHERE finished_at IS NOT NULL AND finished_at < ?1", params![cutoff_ms])
        .map_err(sql("pruning checks"))
}

/// A standing agent's branch as the daemon last saw it: its head, the head its checks last
/// ran on, and whether they failed there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BranchHead {
    pub head: String,
    pub checked: String,
    pub failing: bool,
}

pub fn branch_head(conn: &Db<'_>, repo_id: i64, branch: &str) -> Result<Option<BranchHead>, Error> {
    conn.prepare_cached("SELECT head, checked, failing FROM branch_heads WHERE repo_id = ?1 AND branch = ?2")
        .and_then(|mut s| {
            s.query_row(params![repo_id, branch], |r| {
                Ok(BranchHead { head: r.get(0)?, checked: r.get(1)?, failing: r.get(2)? })
            })
            .optional()
        })
        .map_err(sql("reading a branch's head"))
}

pub fn set_branch_head(conn: &Db<'_>, repo_id: i64, branch: &str, head: &BranchHead) -> Result<(), Error> {
    conn.prepare_cached(
        "INSERT INTO branch_heads (repo_id, branch, head, checked, failing, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
         ON CONFLICT (repo_id, branch) DO UPDATE SET head = excluded.head, checked = excluded.checked, \
         failing = excluded.failing, updated_at = excluded.updated_at",
    )
    .and_then(|mut s| s.execute(params![repo_id, branch, head.head, head.checked, head.failing, conn.now_ms()]))
    .map_err(sql("recording a branch's head"))?;
    Ok(())
}

/// A conflict between a live branch (or open merge request's branch) and the base or
/// another branch: the files both change that do not merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub repo: String,
    pub branch: String,
    /// The base branch's name, or the other branch.
    pub other: String,
    pub files: Vec<String>,
    pub found_at: String,
}

/// Replaces repository `repo_id`'s conflicts with `found` (branch, other, files); returns
/// those that are new or name different files (their owners have not been told).
pub fn set_conflicts(
    conn: &Db<'_>,
    repo_id: i64,
    found: &[(String, String, Vec<String>)],
) -> Result<Vec<(String, String, Vec<String>)>, Error> {
    let before: Vec<(String, String, String, i64)> = conn
        .prepare_cached("SELECT branch, other, files, found_at FROM conflicts WHERE repo_id = ?1")
        .and_then(|mut s| {
            s.query_map(params![repo_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?.collect()
        })
        .map_err(sql("reading conflicts"))?;
    conn.execute("DELETE FROM conflicts WHERE repo_id = ?1", params![repo_id]).map_err(sql("clearing conflicts"))?;
    let mut new = Vec::new();
    let now = conn.now_ms();
    for (branch, other, files) in found {
        let joined = files.join("\n");
        let known = before.iter().find(|(b, o, f, _)| b == branch && o == other && *f == joined);
        let found_at = match known {
            Some((.., at)) => *at,
            None => {
                new.push((branch.clone(), other.clone(), files.clone()));
                now
            }
        };
        conn.prepare_cached(
            "INSERT INTO conflicts (repo_id, branch, other, files, found_at) VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .and_then(|mut s| s.execute(params![repo_id, branch, other, joined, found_at]))
        .map_err(sql("recording a conflict"))?;
    }
    Ok(new)
}

/// The conflicts known, of one repository when named, or of one branch when named.
pub fn conflicts(conn: &Db<'_>, repo: Option<&str>, branch: Option<&str>) -> Result<Vec<Conflict>, Error> {
    let mut s = conn
        .prepare_cached(
            "SELECT r.name, c.branch, c.other, c.files, c.found_at FROM conflicts c JOIN repos r ON r.id = c.repo_id \
             WHERE (?1 IS NULL OR r.name = ?1) AND (?2 IS NULL OR c.branch = ?2 OR c.other = ?2) \
             ORDER BY r.name, c.branch, c.other",
        )
        .map_err(sql("reading conflicts"))?;
    s.query_map(params![repo, branch], |r| {
        Ok(Conflict {
            repo: r.get(0)?,
            branch: r.get(1)?,
            other: r.get(2)?,
            files: r.get::<_, String>(3)?.split('\n').filter(|f| !f.is_empty()).map(str::to_owned).collect(),
            found_at: rfc3339(r.get(4)?),
        })
    })
    .and_then(|rows| rows.collect())
    .map_err(sql("reading conflicts"))
}

/// Posts `body` in `topic` of agent `handle`'s home channel (a check's or a conflict's notice).
pub fn notice_to(conn: &Db<'_>, handle: &str, topic: &str, body: &str) -> Result<Message, Error> {
    let account = require_account(conn, "agent", handle)?;
    notice_in_home(conn, account.id, &TopicName::from_trusted(topic.to_owned()), body)
}
