//! Subagent runs: ephemeral implementer sessions a Manager starts with a brief.
//!
//! A run is an account (`run-<id>`, so it gets a session, a token and activity through the
//! same machinery as a standing agent) with `run_of` set to its Manager: it is not a tree
//! node, has no home channel and no subscriptions, and needs no approval. Starting checks
//! the per-Manager cap in the writer's transaction, so two concurrent starts cannot both
//! pass it. Finishing (done, failed, timed out) is once only: the account is retired, so its
//! session stops at the runner's next sync, and the outcome is posted into the Manager's
//! home channel under `run: <id>`, which reaches the Manager at its next turn start. This
//! module does not render prompts or talk to runners.

use canopy_core::acl::Caller;
use canopy_core::notices::RunEnd;
use canopy_core::{AccountKind, AccountState, Error, Handle, Message, Presence, RoleName, TopicName};
use rusqlite::{OptionalExtension, params};

use crate::notices::notice_in_home;
use crate::presence::set_presence;
use crate::schema::audit;
use crate::views::require_account;
use crate::{Db, rfc3339, sql};

/// A run to start.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub definition: String,
    pub brief: String,
    /// The delta role the run's session has.
    pub role: RoleName,
    pub harness: String,
    pub script: Option<(String, String)>,
    /// Most runs one Manager may have out at once.
    pub max_running: u32,
    pub timeout_ms: i64,
    /// The run's checkout: its repository and the commit its branch starts from.
    pub checkout: Option<crate::repos::NewCheckout>,
    /// The issue the run works on (the Manager's, or one in its subtree).
    pub issue: Option<u64>,
}

/// How a run ended (or that it has not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Running,
    Done,
    Failed,
    TimedOut,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Done => "done",
            RunStatus::Failed => "failed",
            RunStatus::TimedOut => "timed_out",
        }
    }

    pub fn parse(s: &str) -> RunStatus {
        match s {
            "done" => RunStatus::Done,
            "failed" => RunStatus::Failed,
            "timed_out" => RunStatus::TimedOut,
            _ => RunStatus::Running,
        }
    }
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub id: i64,
    /// The run's own account.
    pub handle: Handle,
    pub manager: Handle,
    pub definition: String,
    pub status: RunStatus,
    pub started_at: String,
    pub ended_at: Option<String>,
    /// The issue it works on.
    pub issue: Option<u64>,
    /// It runs on the scripted stand-in while its Manager runs a real harness: no model ran.
    pub stand_in: bool,
}

/// The topic a run's outcome is posted under in its Manager's home channel.
pub fn run_topic(id: i64) -> TopicName {
    TopicName::from_trusted(format!("run: {id}"))
}

const RUN_SELECT: &str = "SELECT r.id, a.handle, m.handle, r.definition, r.status, r.started_at, r.ended_at, \
     r.issue, a.harness = 'scripted' AND m.harness NOT IN ('scripted', '') FROM runs r JOIN accounts a ON a.id = r.account_id JOIN accounts m ON m.id = r.manager_id";

fn run_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Run> {
    Ok(Run {
        id: row.get(0)?,
        handle: Handle::from_trusted(row.get(1)?),
        manager: Handle::from_trusted(row.get(2)?),
        definition: row.get(3)?,
        status: RunStatus::parse(&row.get::<_, String>(4)?),
        started_at: rfc3339(row.get(5)?),
        ended_at: row.get::<_, Option<i64>>(6)?.map(rfc3339),
        issue: row.get::<_, Option<i64>>(7)?.map(|n| n as u64),
        stand_in: row.get(8)?,
    })
}

/// Starts a run for `caller` (a live agent).
pub fn start_run(conn: &Db<'_>, caller: &Caller, spec: &RunSpec) -> Result<Run, Error> {
    let action = || format!("start a {} run", spec.definition);
    if caller.kind != AccountKind::Agent {
        return Err(Error::Forbidden { action: action(), reason: "only agents start subagent runs".into() });
    }
    let manager = require_account(conn, "caller", caller.handle.as_str())?;
    if manager.state != AccountState::Active {
        return Err(Error::Forbidden { action: action(), reason: format!("{} is {}", caller.handle, manager.state) });
    }
    let out: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM runs WHERE manager_id = ?1 AND ended_at IS NULL")
        .and_then(|mut s| s.query_row(params![manager.id], |r| r.get(0)))
        .map_err(sql("counting open runs"))?;
    if out >= i64::from(spec.max_running) {
        return Err(Error::LimitExceeded(format!(
            "{} has {out} subagent runs out and the cap is {}; wait for a report before starting another",
            caller.handle, spec.max_running
        )));
    }
    let id: i64 = conn
        .query_row("SELECT COALESCE(MAX(id), 0) + 1 FROM runs", [], |r| r.get(0))
        .map_err(sql("numbering a run"))?;
    let handle = format!("run-{id}");
    let now = conn.now_ms();
    let (script_name, script) = match &spec.script {
        Some((name, text)) => (Some(name.as_str()), Some(text.as_str())),
        None => (None, None),
    };
    conn.prepare_cached(
        "INSERT INTO accounts (handle, display_name, kind, role, charter, state, created_at, harness, script_name, \
         script, run_of) VALUES (?1, ?2, 'agent', ?3, '', 'active', ?4, ?5, ?6, ?7, ?8)",
    )
    .and_then(|mut s| {
        s.execute(params![
            handle,
            format!("{} run {id} for {}", spec.definition, caller.handle),
            spec.role.as_str(),
            now,
            spec.harness,
            script_name,
            script,
            manager.id
        ])
    })
    .map_err(sql("inserting a run's account"))?;
    let account_id = conn.last_insert_rowid();
    set_presence(conn, account_id, Presence::Offline, Some("no session yet"), None, now)?;
    conn.prepare_cached(
        "INSERT INTO runs (id, account_id, manager_id, definition, brief, status, started_at, deadline) \
         VALUES (?1, ?2, ?3, ?4, ?5, 'running', ?6, ?7)",
    )
    .and_then(|mut s| {
        s.execute(params![id, account_id, manager.id, spec.definition, spec.brief, now, now + spec.timeout_ms])
    })
    .map_err(sql("recording a run"))?;
    if let Some(new) = &spec.checkout {
        let branch = canopy_core::repos::run_branch(caller.handle.as_str(), id);
        crate::repos::record_checkout(conn, account_id, &branch, new)?;
    }
    if let Some(issue) = spec.issue {
        crate::issues::link_run(conn, &manager, issue, id)?;
    }
    audit(conn, Some(manager.id), "runs.start", &handle, &format!("definition={}", spec.definition))?;
    load(conn, id)
}

/// One run by id.
pub fn load(conn: &Db<'_>, id: i64) -> Result<Run, Error> {
    conn.prepare_cached(&format!("{RUN_SELECT} WHERE r.id = ?1"))
        .and_then(|mut s| s.query_row(params![id], run_from_row).optional())
        .map_err(sql("reading a run"))?
        .ok_or_else(|| Error::invalid("run", format!("run {id} does not exist")))
}

/// The run a `run-<id>` account is, if it is one.
pub fn run_of_account(conn: &Db<'_>, handle: &str) -> Result<Option<(Run, String)>, Error> {
    let row: Option<(i64, String)> = conn
        .prepare_cached("SELECT r.id, r.brief FROM runs r JOIN accounts a ON a.id = r.account_id WHERE a.handle = ?1")
        .and_then(|mut s| s.query_row(params![handle], |r| Ok((r.get(0)?, r.get(1)?))).optional())
        .map_err(sql("finding a run by its account"))?;
    match row {
        Some((id, brief)) => Ok(Some((load(conn, id)?, brief))),
        None => Ok(None),
    }
}

/// A Manager's runs, newest first; only those still out when `open_only`.
pub fn list_runs(conn: &Db<'_>, manager: &str, open_only: bool) -> Result<Vec<Run>, Error> {
    let filter = if open_only { " AND r.ended_at IS NULL" } else { "" };
    conn.prepare_cached(&format!("{RUN_SELECT} WHERE m.handle = ?1{filter} ORDER BY r.id DESC LIMIT 200"))
        .and_then(|mut s| s.query_map(params![manager], run_from_row)?.collect())
        .map_err(sql("listing runs"))
}

/// Ends a run once: records the status and report, retires its account and tells its
/// Manager. `None` when it had already ended (a late report changes nothing).
pub fn finish_run(
    conn: &Db<'_>,
    id: i64,
    status: RunStatus,
    report: &str,
    check: Option<&str>,
) -> Result<Option<(Run, Message)>, Error> {
    let run = load(conn, id)?;
    if run.status != RunStatus::Running || status == RunStatus::Running {
        return Ok(None);
    }
    let now = conn.now_ms();
    conn.prepare_cached("UPDATE runs SET status = ?1, report = ?2, ended_at = ?3 WHERE id = ?4 AND ended_at IS NULL")
        .and_then(|mut s| s.execute(params![status.as_str(), report, now, id]))
        .map_err(sql("ending a run"))?;
    let account_id: i64 = conn
        .query_row("SELECT account_id FROM runs WHERE id = ?1", params![id], |r| r.get(0))
        .map_err(sql("finding a run's account"))?;
    conn.execute("UPDATE accounts SET state = 'despawned', desired = 'stopped' WHERE id = ?1", params![account_id])
        .map_err(sql("retiring a run's account"))?;
    crate::repos::retire_checkout(conn, account_id)?;
    conn.execute(
        "UPDATE sessions SET ended_at = ?1, end_reason = ?2 WHERE agent_id = ?3 AND ended_at IS NULL",
        params![now, format!("run {}", status.as_str()), account_id],
    )
    .map_err(sql("ending a run's session"))?;
    set_presence(conn, account_id, Presence::Despawned, Some(&format!("run {}", status.as_str())), None, now)?;
    let manager_id: i64 = conn
        .query_row("SELECT manager_id FROM runs WHERE id = ?1", params![id], |r| r.get(0))
        .map_err(sql("finding a run's Manager"))?;
    let end = match status {
        RunStatus::Done => RunEnd::Done,
        RunStatus::Failed => RunEnd::Failed,
        // `Running` returned early above; timed out keeps the match total without a panic.
        RunStatus::TimedOut | RunStatus::Running => RunEnd::TimedOut,
    };
    let facts = canopy_core::notices::RunFacts { issue: run.issue, check, stand_in: run.stand_in };
    let body = canopy_core::notices::run_ended(id, &run.definition, end, facts, report);
    let message = notice_in_home(conn, manager_id, &run_topic(id), &body)?;
    audit(conn, None, "runs.finish", run.handle.as_str(), status.as_str())?;
    Ok(Some((load(conn, id)?, message)))
}

/// Ends every run past its deadline as timed out.
pub fn expire_runs(conn: &Db<'_>) -> Result<Vec<(Run, Message)>, Error> {
    let due: Vec<i64> = conn
        .prepare_cached("SELECT id FROM runs WHERE ended_at IS NULL AND deadline < ?1 ORDER BY id")
        .and_then(|mut s| s.query_map(params![conn.now_ms()], |r| r.get(0))?.collect())
        .map_err(sql("finding overdue runs"))?;
    let mut ended = Vec::new();
    for id in due {
        if let Some(done) = finish_run(conn, id, RunStatus::TimedOut, "", None)? {
            ended.push(done);
        }
    }
    Ok(ended)
}
