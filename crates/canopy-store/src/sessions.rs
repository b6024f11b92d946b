//! Sessions, runners, presence and activity: the store side of running agents.
//!
//! A runner syncs (a heartbeat); the daemon answers with the sessions it should host.
//! Placement is applied here, in the writer's transaction, so two runners syncing at once
//! cannot both take an agent: an agent that should run and has no live session goes where
//! `canopy_core::placement::choose` says (a live runner with the labels it needs, not draining,
//! with room; the fewest live sessions, ties by runner id), or is marked unplaced. A session's incarnation
//! is one more than the agent's last; its token's hash is stored with it, and the token
//! stops working when the session ends. Reports from runners move presence, store
//! activity (bounded per session) and, on a crash loop, mark the agent `crashed` with a
//! notice in its home channel. Reports for a session that is not the agent's live one are
//! ignored (stale incarnation).

use canopy_core::acl::Caller;
use canopy_core::redact::{redact, redact_value};
use canopy_core::{
    AccountKind, AccountState, ActivityItem, Desired, Error, Handle, Message, Presence, RoleName, RosterEntry,
};
use canopy_core::{Incarnation, RunnerId, placement};
use rusqlite::{OptionalExtension, params};

use crate::notices::notice;
use crate::presence::set_presence;
use crate::schema::audit;
use crate::views::{parse_enum, require_account};
use crate::{Db, rfc3339, sql};

/// Longest activity summary kept, in characters.
const SUMMARY_CHARS: usize = 300;
/// Longest activity detail kept, in bytes of JSON.
const DETAIL_BYTES: usize = 4096;

/// A runner's heartbeat, as the store needs it.
#[derive(Debug, Clone)]
pub struct RunnerHeartbeat {
    pub runner_id: RunnerId,
    /// Which start of the runner's process this is (random per start).
    pub boot: String,
    /// Whether it says it hosts sessions now (a process that just started hosts none).
    pub hosting: bool,
    pub name: String,
    pub mcp_url: String,
    pub capacity: u32,
    /// A runner not seen for this long is dead: its sessions end and move elsewhere.
    pub ttl_ms: i64,
    /// Its labels (checked, sorted) and the Canopy version it runs.
    pub labels: Vec<String>,
    pub version: String,
    /// The labels each role's sessions need (`[roles.<role>] needs`), by role.
    pub role_needs: std::collections::BTreeMap<String, Vec<String>>,
}

/// What a runner's sync produced: its sessions, and notices for the daemon to deliver.
#[derive(Debug, Default)]
pub struct Synced {
    pub sessions: Vec<LiveSession>,
    pub notices: Vec<Message>,
    /// The operator drained this runner.
    pub draining: bool,
    /// Runs whose runner was found lost in this sync.
    pub lost_runs: Vec<i64>,
    /// This runner's standing sessions that end at their next turn boundary and start again:
    /// all of them while it drains, and any whose agent's harness changed since it started.
    pub move_at_boundary: Vec<(Handle, Incarnation)>,
}

/// A live session with what a runner needs to start it (the token is derived by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveSession {
    pub agent: Handle,
    pub display_name: String,
    pub role: RoleName,
    pub incarnation: Incarnation,
    pub harness: String,
    pub script_name: Option<String>,
    pub script: Option<String>,
    pub home_channel: String,
    pub charter: String,
    /// The parent's handle (for a run: its Manager).
    pub parent: Option<String>,
    pub persona: Option<String>,
    /// Set when the session is a subagent run: (run id, definition, brief).
    pub run: Option<(i64, String, String)>,
}

/// One event of a session, as the store applies it.
#[derive(Debug, Clone)]
pub struct Report {
    pub agent: String,
    pub incarnation: Incarnation,
    pub presence: Option<Presence>,
    pub reason: Option<String>,
    pub activity: Option<(String, Option<String>, String, serde_json::Value)>,
    pub ended: bool,
    pub crash_loop: bool,
    /// With `crash_loop`: the session could not start at all (it cannot be confined).
    pub fatal: bool,
    /// Tokens (and cost) a model turn used, from the harness's usage event.
    pub usage: Option<crate::usage::UsageReport>,
}

/// What applying a batch of reports produced, for the daemon to publish.
#[derive(Debug, Default)]
pub struct Applied {
    pub applied: u32,
    pub ignored: u32,
    pub activity: Vec<ActivityItem>,
    pub notices: Vec<Message>,
    /// Whether placement may have changed (a session ended), so runners should sync.
    pub poke: bool,
    /// Whether a budget's level changed (80%, 100%, either way), so holds must be read again.
    pub budgets_changed: bool,
    /// Agents that began failing or crashed with these reports: they wait for the operator.
    pub failing: Vec<RosterEntry>,
}

/// Records a heartbeat, places agents without a session, and returns this runner's sessions.
pub fn sync_runner(
    conn: &Db<'_>,
    beat: &RunnerHeartbeat,
    token_hash_for: &dyn Fn(&str, Incarnation) -> String,
) -> Result<Synced, Error> {
    let now = conn.now_ms();
    let previous: Option<(String, i64)> = conn
        .prepare_cached("SELECT boot, last_seen FROM runners WHERE id = ?1")
        .and_then(|mut s| s.query_row(params![beat.runner_id.as_str()], |r| Ok((r.get(0)?, r.get(1)?))).optional())
        .map_err(sql("reading a runner's boot"))?;
    // Two live processes with one runner id would end each other's sessions at every sync: a
    // process that hosts sessions while another boot of its id is alive is refused. A fresh
    // start hosts nothing yet, so it takes over (the earlier process is gone, or stopping).
    if let Some((boot, last_seen)) = &previous
        && *boot != beat.boot
        && beat.hosting
        && now - last_seen < beat.ttl_ms
    {
        return Err(Error::ConflictOn {
            field: "runner_id",
            reason: format!("another process of runner {} is alive; one id serves one process", beat.runner_id),
        });
    }
    let previous_boot = previous.map(|(boot, _)| boot);
    conn.execute(
        "INSERT INTO runners (id, name, mcp_url, capacity, started_at, last_seen, boot, labels, version) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6, ?7, ?8) ON CONFLICT (id) DO UPDATE SET name = ?2, mcp_url = ?3, \
         capacity = ?4, last_seen = ?5, boot = ?6, labels = ?7, version = ?8",
        params![
            beat.runner_id.as_str(),
            beat.name,
            beat.mcp_url,
            beat.capacity,
            now,
            beat.boot,
            placement::join(&beat.labels),
            beat.version
        ],
    )
    .map_err(sql("recording a runner heartbeat"))?;

    // The same runner started again: the sessions of its earlier process died with it.
    if previous_boot.is_some_and(|boot| boot != beat.boot) {
        let orphaned: Vec<(i64, i64)> = conn
            .prepare_cached("SELECT id, agent_id FROM sessions WHERE runner_id = ?1 AND ended_at IS NULL")
            .and_then(|mut s| s.query_map(params![beat.runner_id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
            .map_err(sql("finding an earlier boot's sessions"))?;
        for (session_id, agent_id) in orphaned {
            end_session(conn, session_id, "its runner restarted", now)?;
            set_presence(conn, agent_id, Presence::Offline, Some("its runner restarted"), None, now)?;
        }
    }

    // Sessions on runners that stopped syncing end here; their agents get placed again.
    let lost = end_lost_runners(conn, beat.ttl_ms)?;

    let notices = place(conn, beat, token_hash_for, now)?;
    let draining: bool = conn
        .prepare_cached("SELECT draining FROM runners WHERE id = ?1")
        .and_then(|mut s| s.query_row(params![beat.runner_id.as_str()], |r| r.get(0)))
        .map_err(sql("reading whether a runner drains"))?;

    conn.prepare_cached(
        "SELECT a.handle, a.display_name, COALESCE(a.role, ''), s.incarnation, a.harness, a.script_name, a.script, \
         COALESCE(c.name, mc.name, ''), a.charter, COALESCE(p.handle, m.handle), a.persona, r.id, r.definition, r.brief \
         FROM sessions s JOIN accounts a ON a.id = s.agent_id \
         LEFT JOIN channels c ON c.id = a.home_channel_id LEFT JOIN accounts p ON p.id = a.parent_id \
         LEFT JOIN runs r ON r.account_id = a.id LEFT JOIN accounts m ON m.id = a.run_of \
         LEFT JOIN channels mc ON mc.id = m.home_channel_id \
         WHERE s.runner_id = ?1 AND s.ended_at IS NULL \
         AND NOT (a.failover IS NOT NULL AND s.harness != '' AND s.harness != a.harness) ORDER BY a.handle",
    )
    .and_then(|mut s| {
        s.query_map(params![beat.runner_id.as_str()], |r| {
            Ok(LiveSession {
                agent: Handle::from_trusted(r.get(0)?),
                display_name: r.get(1)?,
                role: RoleName::from_trusted(r.get(2)?),
                incarnation: Incarnation(r.get::<_, i64>(3)? as u64),
                harness: r.get(4)?,
                script_name: r.get(5)?,
                script: r.get(6)?,
                home_channel: r.get(7)?,
                charter: r.get(8)?,
                parent: r.get(9)?,
                persona: r.get(10)?,
                run: match r.get::<_, Option<i64>>(11)? {
                    Some(id) => Some((id, r.get(12)?, r.get(13)?)),
                    None => None,
                },
            })
        })?
        .collect()
    })
    .map_err(sql("listing a runner's sessions"))
    .map(|sessions| {
        let move_at_boundary = moving(conn, beat, draining)?;
        Ok(Synced { sessions, notices, draining, lost_runs: lost.runs, move_at_boundary })
    })?
}

/// The standing sessions of the syncing runner that end at their next turn boundary.
fn moving(conn: &Db<'_>, beat: &RunnerHeartbeat, draining: bool) -> Result<Vec<(Handle, Incarnation)>, Error> {
    conn.prepare_cached(
        "SELECT a.handle, s.incarnation FROM sessions s JOIN accounts a ON a.id = s.agent_id \
         WHERE s.runner_id = ?1 AND s.ended_at IS NULL AND a.run_of IS NULL \
         AND (?2 OR (a.failover IS NULL AND s.harness != '' AND s.harness != a.harness)) ORDER BY a.handle",
    )
    .and_then(|mut s| {
        s.query_map(params![beat.runner_id.as_str(), draining], |r| {
            Ok((Handle::from_trusted(r.get(0)?), Incarnation(r.get::<_, i64>(1)? as u64)))
        })?
        .collect()
    })
    .map_err(sql("listing sessions to move"))
}

/// Places every agent that should run and has no live session (`canopy_core::placement`):
/// those this runner should take get a session here; one no live runner can take is marked
/// `unplaced (needs ...)`, and its home channel is told once.
fn place(
    conn: &Db<'_>,
    beat: &RunnerHeartbeat,
    token_hash_for: &dyn Fn(&str, Incarnation) -> String,
    now: i64,
) -> Result<Vec<Message>, Error> {
    let waiting: Vec<(i64, String, String, String)> = conn
        .prepare_cached(
            "SELECT a.id, a.handle, COALESCE(a.role, ''), a.needs FROM accounts a WHERE a.kind = 'agent' \
             AND a.state = 'active' AND a.desired = 'running' AND a.harness != '' \
             AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.agent_id = a.id AND s.ended_at IS NULL) ORDER BY a.id",
        )
        .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?.collect())
        .map_err(sql("listing agents without a session"))?;
    if waiting.is_empty() {
        return Ok(Vec::new());
    }
    let mut runners = live_runners(conn, now - beat.ttl_ms)?;
    let mut notices = Vec::new();
    for (agent_id, handle, role, needs) in waiting {
        let mut needs = placement::split(&needs);
        needs.extend(beat.role_needs.get(&role).into_iter().flatten().cloned());
        needs.sort();
        needs.dedup();
        match placement::choose(&needs, &runners) {
            placement::Choice::Runner(id) if id == beat.runner_id.as_str() => {
                start_session(conn, agent_id, &handle, beat, token_hash_for, now)?;
                if let Some(runner) = runners.iter_mut().find(|r| r.id == id) {
                    runner.sessions += 1;
                }
            }
            // Another runner is less loaded; it takes the agent at its next sync.
            placement::Choice::Runner(_) | placement::Choice::Wait => {}
            placement::Choice::Unplaced => {
                let reason = placement::unplaced(&needs);
                let told: Option<String> = conn
                    .prepare_cached("SELECT reason FROM presence WHERE agent_id = ?1")
                    .and_then(|mut s| s.query_row(params![agent_id], |r| r.get(0)).optional())
                    .map_err(sql("reading an agent's presence"))?
                    .flatten();
                if told.as_deref() != Some(reason.as_str()) {
                    set_presence(conn, agent_id, Presence::Offline, Some(&reason), None, now)?;
                    notices.push(notice(conn, agent_id, &placement::say_unplaced(&handle, &needs))?);
                }
            }
        }
    }
    Ok(notices)
}

/// The runners placement may use: those seen since `since`, with their live sessions.
fn live_runners(conn: &Db<'_>, since: i64) -> Result<Vec<placement::Candidate>, Error> {
    conn.prepare_cached(
        "SELECT r.id, r.labels, r.capacity, r.draining, \
         (SELECT COUNT(*) FROM sessions s WHERE s.runner_id = r.id AND s.ended_at IS NULL) \
         FROM runners r WHERE r.last_seen >= ?1 ORDER BY r.id",
    )
    .and_then(|mut s| {
        s.query_map(params![since], |r| {
            Ok(placement::Candidate {
                id: r.get(0)?,
                labels: placement::split(&r.get::<_, String>(1)?),
                capacity: r.get(2)?,
                draining: r.get(3)?,
                sessions: r.get(4)?,
            })
        })?
        .collect()
    })
    .map_err(sql("listing live runners"))
}

/// A new session of `agent_id` on the syncing runner, in its next incarnation.
fn start_session(
    conn: &Db<'_>,
    agent_id: i64,
    handle: &str,
    beat: &RunnerHeartbeat,
    token_hash_for: &dyn Fn(&str, Incarnation) -> String,
    now: i64,
) -> Result<(), Error> {
    let incarnation: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(incarnation), 0) + 1 FROM sessions WHERE agent_id = ?1")
        .and_then(|mut s| s.query_row(params![agent_id], |r| r.get(0)))
        .map_err(sql("numbering a session"))?;
    let token_hash = token_hash_for(handle, Incarnation(incarnation as u64));
    conn.execute(
        "INSERT INTO sessions (agent_id, incarnation, runner_id, token_hash, started_at, harness) \
         SELECT ?1, ?2, ?3, ?4, ?5, harness FROM accounts WHERE id = ?1",
        params![agent_id, incarnation, beat.runner_id.as_str(), token_hash, now],
    )
    .map_err(sql("creating a session"))?;
    set_presence(conn, agent_id, Presence::Starting, None, Some(Incarnation(incarnation as u64)), now)
}

/// Applies a batch of reports from `runner_id`.
pub fn apply_reports(
    conn: &Db<'_>,
    runner_id: &RunnerId,
    reports: &[Report],
    max_activity: u32,
    estimate: crate::budgets::Estimate,
    failover: &crate::failover::FailoverRules,
) -> Result<Applied, Error> {
    let mut applied = Applied::default();
    let mut charged = crate::budgets::Charged::default();
    let now = conn.now_ms();
    for report in reports {
        let live: Option<(i64, i64)> = conn
            .prepare_cached(
                "SELECT s.id, s.agent_id FROM sessions s JOIN accounts a ON a.id = s.agent_id \
                 WHERE a.handle = ?1 AND s.incarnation = ?2 AND s.runner_id = ?3 AND s.ended_at IS NULL",
            )
            .and_then(|mut s| {
                s.query_row(params![report.agent, report.incarnation.get() as i64, runner_id.as_str()], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()
            })
            .map_err(sql("finding a reported session"))?;
        let Some((session_id, agent_id)) = live else {
            applied.ignored += 1;
            continue;
        };
        applied.applied += 1;
        conn.execute("UPDATE presence SET last_seen = ?1 WHERE agent_id = ?2", params![now, agent_id])
            .map_err(sql("updating last seen"))?;
        if let Some(usage) = &report.usage {
            crate::usage::record_usage(conn, agent_id, report.incarnation, usage, estimate, &mut charged, true)?;
        }
        if let Some((kind, turn_id, summary, detail)) = &report.activity {
            if let ("turn_started", Some(turn)) = (kind.as_str(), turn_id) {
                crate::usage::record_estimate(conn, agent_id, report.incarnation, turn, estimate, &mut charged)?;
            }
            if kind == "compaction_ended" {
                crate::usage::record_compaction(conn, agent_id, report.incarnation, now)?;
            }
            if let Some(body) = sandbox_notice(conn, session_id, &report.agent, kind, summary)? {
                applied.notices.push(notice(conn, agent_id, &body)?);
            }
            applied.activity.push(insert_activity(
                conn,
                agent_id,
                &report.agent,
                report.incarnation,
                kind,
                turn_id.as_deref(),
                summary,
                detail,
                max_activity,
                now,
            )?);
        }
        if report.crash_loop {
            end_session(conn, session_id, report.reason.as_deref().unwrap_or("crash loop"), now)?;
            conn.execute("UPDATE accounts SET state = 'crashed' WHERE id = ?1", params![agent_id])
                .map_err(sql("marking an agent crashed"))?;
            let reason = report.reason.clone().unwrap_or_else(|| "its session kept crashing".into());
            // Stopped because retrying cannot help, it is failing until the operator fixes it.
            let presence = if report.fatal { Presence::Failing } else { Presence::Crashed };
            set_presence(conn, agent_id, presence, Some(&reason), None, now)?;
            audit(conn, None, "agents.crashed", &report.agent, &reason)?;
            let body = canopy_core::notices::session_stopped(&report.agent, &reason, report.fatal);
            applied.notices.push(notice(conn, agent_id, &body)?);
            applied.failing.push(roster_entry(conn, report.agent.as_str())?);
            applied.poke = true;
            continue;
        }
        if report.ended {
            end_session(conn, session_id, report.reason.as_deref().unwrap_or("exited"), now)?;
            applied.poke = true;
        }
        if let Some(presence) = report.presence {
            if presence == Presence::Failing {
                let reason = report.reason.as_deref().unwrap_or("the model API keeps failing");
                if let Some(told) = crate::failover::consider(conn, failover, session_id, &report.agent, reason, now)? {
                    applied.notices.push(told);
                    applied.poke = true;
                    continue;
                }
                // Told once when it starts failing; the roster carries each retry.
                let was: Option<String> = conn
                    .prepare_cached("SELECT state FROM presence WHERE agent_id = ?1")
                    .and_then(|mut s| s.query_row(params![agent_id], |r| r.get(0)).optional())
                    .map_err(sql("reading presence"))?;
                if was.as_deref() != Some(Presence::Failing.as_str()) {
                    let reason = report.reason.as_deref().unwrap_or("the model API keeps failing");
                    let body = canopy_core::notices::session_failing(&report.agent, reason);
                    applied.notices.push(notice(conn, agent_id, &body)?);
                    set_presence(conn, agent_id, presence, report.reason.as_deref(), None, now)?;
                    applied.failing.push(roster_entry(conn, report.agent.as_str())?);
                    continue;
                }
            }
            set_presence(conn, agent_id, presence, report.reason.as_deref(), None, now)?;
        }
    }
    applied.notices.append(&mut charged.notices);
    applied.budgets_changed = charged.changed;
    Ok(applied)
}

/// What the sandbox told of a session that its home channel hears: the first connection its
/// egress proxy refused (each is counted on the session for the roster), and every limit that
/// ended it.
fn sandbox_notice(
    conn: &Db<'_>,
    session_id: i64,
    agent: &str,
    kind: &str,
    summary: &str,
) -> Result<Option<String>, Error> {
    match kind {
        "egress_refused" => {
            let refused: i64 = conn
                .prepare_cached(
                    "UPDATE sessions SET egress_refused = egress_refused + 1 WHERE id = ?1 RETURNING egress_refused",
                )
                .and_then(|mut s| s.query_row(params![session_id], |r| r.get(0)))
                .map_err(sql("counting a refused connection"))?;
            Ok((refused == 1).then(|| canopy_core::notices::egress_refused(agent, summary)))
        }
        "limit_reached" => Ok(Some(canopy_core::notices::limit_reached(agent, summary))),
        _ => Ok(None),
    }
}

/// Ends the sessions of runners silent for longer than `ttl_ms` (their agents go offline,
/// to be placed again); returns how many. Runs at every runner sync and on the daemon's own
/// timer, so a lost runner owns nothing even when no other runner syncs.
pub fn end_lost_runners(conn: &Db<'_>, ttl_ms: i64) -> Result<Lost, Error> {
    let now = conn.now_ms();
    let dead: Vec<(i64, i64, Option<i64>)> = conn
        .prepare_cached(
            "SELECT s.id, s.agent_id, run.id FROM sessions s JOIN runners r ON r.id = s.runner_id \
             LEFT JOIN runs run ON run.account_id = s.agent_id AND run.status = 'running' \
             WHERE s.ended_at IS NULL AND r.last_seen < ?1",
        )
        .and_then(|mut s| s.query_map(params![now - ttl_ms], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect())
        .map_err(sql("finding sessions of lost runners"))?;
    let mut runs = Vec::new();
    for (session_id, agent_id, run) in &dead {
        end_session(conn, *session_id, "its runner stopped answering", now)?;
        set_presence(conn, *agent_id, Presence::Offline, Some("its runner stopped answering"), None, now)?;
        if let Some(run) = run {
            // A run is not started again elsewhere: it ends `failed (runner lost)`, keeping what
            // it pushed (the daemon records the end with its branch).
            conn.execute("UPDATE accounts SET desired = 'stopped' WHERE id = ?1", params![agent_id])
                .map_err(sql("holding a lost run"))?;
            runs.push(*run);
        }
    }
    Ok(Lost { sessions: dead.len(), runs })
}

/// What ending the sessions of lost runners did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Lost {
    pub sessions: usize,
    /// Runs whose runner was lost mid-run, for the daemon to end `failed (runner lost)`.
    pub runs: Vec<i64>,
}

/// Marks sessions silent past `stall_after_ms` while working as `stalled`, with a notice.
pub fn mark_stalled(conn: &Db<'_>, stall_after_ms: i64) -> Result<Vec<Message>, Error> {
    let now = conn.now_ms();
    let stalled: Vec<(i64, String)> = conn
        .prepare_cached(
            "SELECT p.agent_id, a.handle FROM presence p JOIN accounts a ON a.id = p.agent_id \
             WHERE p.state = 'working' AND COALESCE(p.last_seen, p.state_since) < ?1",
        )
        .and_then(|mut s| s.query_map(params![now - stall_after_ms], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .map_err(sql("finding stalled sessions"))?;
    let mut notices = Vec::new();
    for (agent_id, handle) in stalled {
        let silent = humantime::format_duration(std::time::Duration::from_secs((stall_after_ms / 1000) as u64));
        let reason = format!("no activity for {silent} while working");
        set_presence(conn, agent_id, Presence::Stalled, Some(&reason), None, now)?;
        let body = canopy_core::notices::session_stalled(&handle, &reason);
        notices.push(notice(conn, agent_id, &body)?);
    }
    Ok(notices)
}

/// Sets whether an agent's session should run. Stopping ends its live session.
pub fn set_desired(conn: &Db<'_>, caller: &Caller, handle: &Handle, desired: Desired) -> Result<RosterEntry, Error> {
    let agent = require_account(conn, "handle", handle.as_str())?;
    if agent.kind != AccountKind::Agent {
        return Err(Error::invalid("handle", format!("{handle} is not an agent")));
    }
    if agent.state == AccountState::Despawned {
        return Err(Error::ConflictOn { field: "handle", reason: format!("{handle} is despawned") });
    }
    let now = conn.now_ms();
    conn.execute("UPDATE accounts SET desired = ?1 WHERE id = ?2", params![desired.as_str(), agent.id])
        .map_err(sql("setting desired state"))?;
    match desired {
        Desired::Running => {
            if agent.state == AccountState::Crashed {
                conn.execute("UPDATE accounts SET state = 'active' WHERE id = ?1", params![agent.id])
                    .map_err(sql("clearing a crash"))?;
                set_presence(conn, agent.id, Presence::Offline, Some("restarting"), None, now)?;
            }
        }
        Desired::Stopped => {
            let live: Option<i64> = conn
                .prepare_cached("SELECT id FROM sessions WHERE agent_id = ?1 AND ended_at IS NULL")
                .and_then(|mut s| s.query_row(params![agent.id], |r| r.get(0)).optional())
                .map_err(sql("finding a live session"))?;
            if let Some(session_id) = live {
                end_session(conn, session_id, "stopped by an operator", now)?;
            }
            set_presence(conn, agent.id, Presence::Offline, Some("stopped by an operator"), None, now)?;
        }
    }
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    audit(
        conn,
        Some(actor.id),
        &format!("agents.{}", if desired == Desired::Running { "start" } else { "stop" }),
        handle.as_str(),
        "",
    )?;
    roster_entry(conn, handle.as_str())
}

/// Records an operator's interrupt of an agent's turn in the audit log (`agents.interrupt`).
/// The interrupt itself goes to the runner; this only keeps the record.
pub fn record_interrupt(conn: &Db<'_>, caller: &Caller, handle: &Handle, detail: &str) -> Result<(), Error> {
    record_act(conn, caller, "agents.interrupt", handle.as_str(), detail)
}

/// A runner as `canopy runners` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerRow {
    pub id: String,
    pub name: String,
    pub labels: Vec<String>,
    pub sessions: u32,
    pub capacity: u32,
    pub last_seen_ms: i64,
    pub version: String,
    pub draining: bool,
}

const RUNNER_SELECT: &str = "SELECT r.id, r.name, r.labels, \
     (SELECT COUNT(*) FROM sessions s WHERE s.runner_id = r.id AND s.ended_at IS NULL), r.capacity, r.last_seen, \
     r.version, r.draining FROM runners r";

fn runner_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunnerRow> {
    Ok(RunnerRow {
        id: r.get(0)?,
        name: r.get(1)?,
        labels: placement::split(&r.get::<_, String>(2)?),
        sessions: r.get(3)?,
        capacity: r.get(4)?,
        last_seen_ms: r.get(5)?,
        version: r.get(6)?,
        draining: r.get(7)?,
    })
}

/// Every runner the daemon has seen (a removed or retired one is forgotten), by id.
pub fn list_runners(conn: &Db<'_>) -> Result<Vec<RunnerRow>, Error> {
    let mut s = conn.prepare_cached(&format!("{RUNNER_SELECT} ORDER BY r.id")).map_err(sql("listing runners"))?;
    s.query_map([], runner_from_row).and_then(|rows| rows.collect()).map_err(sql("listing runners"))
}

/// Drains runner `id` (no new session goes there) or takes it back; audited as `caller`'s.
pub fn set_draining(conn: &Db<'_>, caller: &Caller, id: &str, draining: bool) -> Result<RunnerRow, Error> {
    let changed = conn
        .execute("UPDATE runners SET draining = ?2 WHERE id = ?1", params![id, draining])
        .map_err(sql("draining a runner"))?;
    if changed == 0 {
        return Err(Error::NotFound { field: "id", what: format!("runner {id}") });
    }
    let action = if draining { "runner_drained" } else { "runner_undrained" };
    record_act(conn, caller, action, id, "")?;
    conn.prepare_cached(&format!("{RUNNER_SELECT} WHERE r.id = ?1"))
        .and_then(|mut s| s.query_row(params![id], runner_from_row))
        .map_err(sql("reading a runner"))
}

/// Ends every live session of a runner whose credential was revoked, and forgets the runner:
/// its agents are placed elsewhere at the next sync.
pub fn forget_runner(conn: &Db<'_>, runner_id: &RunnerId) -> Result<usize, Error> {
    retire_runner(conn, runner_id, "its runner's credential was revoked")
}

/// Ends a runner known to be gone: its live sessions end (`why`), its agents are offline
/// and placed again at the next sync, and the runner is forgotten. The daemon does this at
/// start for its own embedded runner, which died with the previous daemon process.
pub fn retire_runner(conn: &Db<'_>, runner_id: &RunnerId, why: &str) -> Result<usize, Error> {
    let now = conn.now_ms();
    let live: Vec<(i64, i64)> = conn
        .prepare_cached("SELECT id, agent_id FROM sessions WHERE runner_id = ?1 AND ended_at IS NULL")
        .and_then(|mut s| s.query_map(params![runner_id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .map_err(sql("finding a gone runner's sessions"))?;
    for (session_id, agent_id) in &live {
        end_session(conn, *session_id, why, now)?;
        set_presence(conn, *agent_id, Presence::Offline, Some(why), None, now)?;
    }
    conn.execute("DELETE FROM runners WHERE id = ?1", params![runner_id.as_str()])
        .map_err(sql("forgetting a runner"))?;
    Ok(live.len())
}

/// Records an act that happens outside the store (a credential changed, a turn stopped) in
/// the audit log, as `caller`'s.
pub fn record_act(conn: &Db<'_>, caller: &Caller, action: &str, target: &str, detail: &str) -> Result<(), Error> {
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    audit(conn, Some(actor.id), action, target, detail)
}

/// Records an act no account made (a failed login to the console) in the audit log.
pub fn record_anonymous(conn: &Db<'_>, action: &str, target: &str, detail: &str) -> Result<(), Error> {
    audit(conn, None, action, target, &redact(detail, 500))
}

/// Sets the caller's own activity line.
pub fn set_activity(conn: &Db<'_>, caller: &Caller, text: &str) -> Result<RosterEntry, Error> {
    if caller.kind != AccountKind::Agent {
        return Err(Error::invalid("text", "only agents have a roster activity line"));
    }
    let agent = require_account(conn, "caller", caller.handle.as_str())?;
    let text = if text.trim().is_empty() { None } else { Some(redact(text.trim(), 200)) };
    conn.execute("UPDATE presence SET activity = ?1 WHERE agent_id = ?2", params![text, agent.id])
        .map_err(sql("setting an activity line"))?;
    roster_entry(conn, caller.handle.as_str())
}

const ROSTER_SELECT: &str = "SELECT a.handle, a.display_name, COALESCE(a.role, ''), par.handle, \
     COALESCE(p.state, 'offline'), p.reason, p.activity, a.desired, COALESCE(p.incarnation, 0), s.runner_id, \
     a.harness, p.last_seen, a.state, COALESCE(p.overflow, 0), \
     (SELECT COUNT(*) FROM subscriptions sub JOIN messages m ON m.channel_id = sub.channel_id AND m.seq > sub.cursor \
      WHERE sub.account_id = a.id AND m.sender_id != a.id AND NOT EXISTS (SELECT 1 FROM deliveries d \
      WHERE d.agent_id = a.id AND d.seq = m.seq AND d.state = 'injected')), \
     (SELECT MIN(sr.id) FROM spawn_requests sr WHERE sr.requester_id = a.id AND sr.state = 'pending'), \
     COALESCE(s.egress_refused, 0), a.failover, p.state_since FROM accounts a \
     LEFT JOIN accounts par ON par.id = a.parent_id LEFT JOIN presence p ON p.agent_id = a.id \
     LEFT JOIN sessions s ON s.agent_id = a.id AND s.ended_at IS NULL";

fn roster_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RosterEntry> {
    let state: String = r.get(12)?;
    let presence = if state == "despawned" { Presence::Despawned } else { parse_enum(r, 4, Presence::parse)? };
    let mut reason: Option<String> = r.get(5)?;
    // An idle agent whose own spawn request is pending is waiting for the operator.
    let waiting: Option<i64> = r.get(15)?;
    let presence = match (presence, waiting) {
        (Presence::Idle, Some(id)) => {
            reason = Some(format!("waiting for the operator to answer its spawn request req-{id}"));
            Presence::WaitingApproval
        }
        (presence, _) => presence,
    };
    Ok(RosterEntry {
        handle: Handle::from_trusted(r.get(0)?),
        display_name: r.get(1)?,
        role: RoleName::from_trusted(r.get(2)?),
        parent: r.get::<_, Option<String>>(3)?.map(Handle::from_trusted),
        presence,
        reason,
        activity: r.get(6)?,
        desired: parse_enum(r, 7, Desired::parse)?,
        incarnation: Incarnation(r.get::<_, i64>(8)? as u64),
        runner: r.get::<_, Option<String>>(9)?.map(RunnerId::from_trusted),
        harness: r.get(10)?,
        last_seen: r.get::<_, Option<i64>>(11)?.map(rfc3339),
        overflow: r.get(13)?,
        pending: r.get::<_, i64>(14)? as u64,
        egress_refused: r.get::<_, i64>(16)? as u64,
        failover: r.get(17)?,
        since: r.get::<_, Option<i64>>(18)?.map(rfc3339),
        // The daemon knows the sandbox mode and the budget holds; the store does not.
        unconfined: false,
        host_network: false,
        budget: None,
    })
}

/// Agents' live state, ordered by handle: those after `after`, at most `limit` of them (all
/// with `None`), and how many more there are. A page reads only its own rows (and counts the
/// rest on the handle index), so paging through 100,000 agents is linear.
pub fn roster(conn: &Db<'_>, after: Option<&str>, limit: Option<usize>) -> Result<(Vec<RosterEntry>, u64), Error> {
    let rows = limit.map_or(-1, |l| l as i64);
    let entries: Vec<RosterEntry> = conn
        .prepare_cached(&format!(
            "{ROSTER_SELECT} WHERE a.kind = 'agent' AND a.run_of IS NULL AND (?1 IS NULL OR a.handle > ?1) \
             ORDER BY a.handle LIMIT ?2"
        ))
        .and_then(|mut s| s.query_map(params![after, rows], roster_from_row)?.collect())
        .map_err(sql("reading the roster"))?;
    let more = crate::views::agents_beyond(conn, entries.last().map(|e| e.handle.as_str()), entries.len(), limit)?;
    Ok((entries, more))
}

/// One agent's roster line.
pub fn roster_entry(conn: &Db<'_>, handle: &str) -> Result<RosterEntry, Error> {
    conn.prepare_cached(&format!("{ROSTER_SELECT} WHERE a.kind = 'agent' AND a.handle = ?1"))
        .and_then(|mut s| s.query_row(params![handle], roster_from_row).optional())
        .map_err(sql("reading a roster line"))?
        .ok_or_else(|| Error::AgentNotFound { field: "handle", handle: handle.to_owned(), nearest: None })
}

/// An agent's stored activity: after `after`, or the newest `tail` items.
pub fn read_activity(
    conn: &Db<'_>,
    handle: &str,
    after: u64,
    limit: u32,
    tail: Option<u32>,
) -> Result<(Vec<ActivityItem>, bool), Error> {
    let agent = require_account(conn, "agent", handle)?;
    let mut items: Vec<ActivityItem> = match tail {
        Some(tail) => {
            let mut items: Vec<ActivityItem> = conn
                .prepare_cached(&format!("{ACTIVITY_SELECT} WHERE {ACTIVITY_OF} ORDER BY ac.id DESC LIMIT ?2"))
                .and_then(|mut s| s.query_map(params![agent.id, tail], activity_from_row)?.collect())
                .map_err(sql("reading activity"))?;
            items.reverse();
            return Ok((items, false));
        }
        None => conn
            .prepare_cached(&format!("{ACTIVITY_SELECT} WHERE {ACTIVITY_OF} AND ac.id > ?2 ORDER BY ac.id LIMIT ?3"))
            .and_then(|mut s| {
                s.query_map(params![agent.id, after as i64, i64::from(limit) + 1], activity_from_row)?.collect()
            })
            .map_err(sql("reading activity"))?,
    };
    let more = items.len() > limit as usize;
    items.truncate(limit as usize);
    Ok((items, more))
}

/// An agent's harness-native subagents' lifecycle items (started, ended), newest first.
pub fn subagent_activity(conn: &Db<'_>, handle: &str, limit: u32) -> Result<Vec<ActivityItem>, Error> {
    let agent = require_account(conn, "agent", handle)?;
    conn.prepare_cached(&format!(
        "{ACTIVITY_SELECT} WHERE ac.agent_id = ?1 AND ac.kind IN ('subagent_started', 'subagent_ended') \
         ORDER BY ac.id DESC LIMIT ?2"
    ))
    .and_then(|mut s| s.query_map(params![agent.id, limit], activity_from_row)?.collect())
    .map_err(sql("reading subagent activity"))
}

const ACTIVITY_SELECT: &str = "SELECT ac.id, ac.incarnation, ac.at, ac.kind, ac.turn_id, ac.summary, ac.detail, \
     a.handle FROM activity ac JOIN accounts a ON a.id = ac.agent_id";

/// An agent's own activity and its subagent runs' (a run shows under its Manager).
const ACTIVITY_OF: &str = "(ac.agent_id = ?1 OR ac.agent_id IN (SELECT id FROM accounts WHERE run_of = ?1))";

fn activity_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ActivityItem> {
    let detail: String = r.get(6)?;
    Ok(ActivityItem {
        id: r.get::<_, i64>(0)? as u64,
        agent: Handle::from_trusted(r.get(7)?),
        incarnation: Incarnation(r.get::<_, i64>(1)? as u64),
        at: rfc3339(r.get(2)?),
        kind: r.get(3)?,
        turn_id: r.get(4)?,
        summary: r.get(5)?,
        detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::Null),
    })
}

#[allow(clippy::too_many_arguments, reason = "one row's columns; a struct would only rename them")]
fn insert_activity(
    conn: &Db<'_>,
    agent_id: i64,
    handle: &str,
    incarnation: Incarnation,
    kind: &str,
    turn_id: Option<&str>,
    summary: &str,
    detail: &serde_json::Value,
    max_activity: u32,
    now: i64,
) -> Result<ActivityItem, Error> {
    let summary = redact(summary, SUMMARY_CHARS);
    let detail = redact_value(detail, 1000, 50);
    let mut detail_text = serde_json::to_string(&detail).unwrap_or_else(|_| "null".into());
    if detail_text.len() > DETAIL_BYTES {
        detail_text = serde_json::to_string(&serde_json::json!({ "cut": redact(&detail_text, DETAIL_BYTES / 2) }))
            .unwrap_or_else(|_| "null".into());
    }
    conn.prepare_cached(
        "INSERT INTO activity (agent_id, incarnation, at, kind, turn_id, summary, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .and_then(|mut s| s.execute(params![agent_id, incarnation.get() as i64, now, kind, turn_id, summary, detail_text]))
    .map_err(sql("storing activity"))?;
    let id = conn.last_insert_rowid();
    // Keep the newest `max_activity` items of this session; drop the oldest first.
    conn.prepare_cached(
        "DELETE FROM activity WHERE agent_id = ?1 AND incarnation = ?2 AND id <= \
         (SELECT id FROM activity WHERE agent_id = ?1 AND incarnation = ?2 ORDER BY id DESC LIMIT 1 OFFSET ?3)",
    )
    .and_then(|mut s| s.execute(params![agent_id, incarnation.get() as i64, max_activity]))
    .map_err(sql("pruning activity"))?;
    Ok(ActivityItem {
        id: id as u64,
        agent: Handle::from_trusted(handle.to_owned()),
        incarnation,
        at: rfc3339(now),
        kind: kind.to_owned(),
        turn_id: turn_id.map(str::to_owned),
        summary,
        detail: serde_json::from_str(&detail_text).unwrap_or(serde_json::Value::Null),
    })
}

fn end_session(conn: &Db<'_>, session_id: i64, reason: &str, now: i64) -> Result<(), Error> {
    conn.execute(
        "UPDATE sessions SET ended_at = ?1, end_reason = ?2 WHERE id = ?3 AND ended_at IS NULL",
        params![now, reason, session_id],
    )
    .map_err(sql("ending a session"))?;
    Ok(())
}

/// The agent id of a session that is live on `runner_id`, if it is.
/// The agent id of `agent`'s live session `incarnation` on `runner_id`, or `conflict` for a
/// stale or foreign session (a runner's call about a session it no longer hosts).
pub fn live_agent(conn: &Db<'_>, agent: &str, incarnation: Incarnation, runner_id: &RunnerId) -> Result<i64, Error> {
    crate::delivery::live_session_agent(conn, agent, incarnation, runner_id)?.ok_or_else(|| Error::ConflictOn {
        field: "incarnation",
        reason: format!("{agent} session {incarnation} is not live on runner {runner_id}"),
    })
}

/// Records the rendered prompt's hash on each session record `(agent, incarnation, hash)`.
pub fn record_prompt_hashes(conn: &Db<'_>, hashes: &[(String, Incarnation, String)]) -> Result<(), Error> {
    for (agent, incarnation, hash) in hashes {
        conn.prepare_cached(
            "UPDATE sessions SET prompt_hash = ?3 WHERE incarnation = ?2 \
             AND agent_id = (SELECT id FROM accounts WHERE handle = ?1)",
        )
        .and_then(|mut s| s.execute(params![agent, incarnation.get() as i64, hash]))
        .map_err(sql("recording a prompt hash"))?;
    }
    Ok(())
}

/// The prompt hash of an agent's latest session, with its incarnation.
pub fn prompt_hash(conn: &Db<'_>, agent: &str) -> Result<Option<(Incarnation, String)>, Error> {
    conn.prepare_cached(
        "SELECT s.incarnation, s.prompt_hash FROM sessions s JOIN accounts a ON a.id = s.agent_id \
         WHERE a.handle = ?1 AND s.prompt_hash IS NOT NULL ORDER BY s.incarnation DESC LIMIT 1",
    )
    .and_then(|mut s| {
        s.query_row(params![agent], |r| Ok((Incarnation(r.get::<_, i64>(0)? as u64), r.get(1)?))).optional()
    })
    .map_err(sql("reading a prompt hash"))
}

/// What an agent's prompt needs beyond its account: (persona, harness).
pub fn prompt_inputs(conn: &Db<'_>, agent: &str) -> Result<(Option<String>, String), Error> {
    conn.prepare_cached("SELECT persona, harness FROM accounts WHERE handle = ?1")
        .and_then(|mut s| s.query_row(params![agent], |r| Ok((r.get(0)?, r.get(1)?))).optional())
        .map_err(sql("reading an agent's prompt inputs"))?
        .ok_or_else(|| Error::AgentNotFound { field: "agent", handle: agent.to_owned(), nearest: None })
}
