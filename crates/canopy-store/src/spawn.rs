//! The spawn-approval gate: requests for child Managers, their decisions, despawn, audit.
//!
//! A request is checked against policy before anyone sees it, then posted by Canopy in the
//! requester's home channel under `spawn: <handle>`, mentioning the operators. Only an
//! operator's decision moves it: every transition is one transaction that checks the
//! current state, so approving twice spawns once and a concurrent approve and deny have one
//! winner. An agent's attempt to decide is refused, audited, and told to the operators, and
//! that record commits even though the attempt fails. Approval creates the child (with its
//! home, coordination and direct channels) in the same transaction.
//!
//! A reply in a topic (`answer_reply`) decides only in the request's own topic of its
//! requester's home channel; an operator's reply that reads as an answer but does not decide
//! (unclear, misplaced, or on a request no longer pending) is answered in the topic it was
//! posted in, so an operator is never left believing a request was decided.
//!
//! The rules (the limits and their messages, who may decide, only pending requests) and
//! every sentence posted about a request are `canopy_core::spawn`'s: this module gathers the
//! facts in the transaction and persists what those rules decide.

use canopy_core::acl::Caller;
use canopy_core::gate::Reply;
use canopy_core::spawn::{self as spawn_rules, DespawnTarget, SpawnFacts, SpawnLimits, Verb, say};
use canopy_core::{
    AccountKind, AccountState, AuditEntry, ChannelName, Error, Handle, Message, RoleName, SpawnRequest, SpawnState,
    TopicName,
};
use rusqlite::{OptionalExtension, params};

use crate::accounts::{AgentSpec, insert_agent};
use crate::presence::set_presence;
use crate::schema::audit;
use crate::views::{parse_enum, require_account};
use crate::{Db, rfc3339, sql};

/// Limits checked before a request reaches the operator (`canopy.toml` `[policy]`).
#[derive(Debug, Clone)]
pub struct SpawnPolicy {
    pub max_depth: u32,
    pub max_children: u32,
    pub max_agents: u32,
    pub max_pending_per_requester: u32,
    pub ttl_ms: i64,
}

impl SpawnPolicy {
    /// The limits the gate's rules check (`canopy_core::spawn`).
    pub fn limits(&self) -> SpawnLimits {
        SpawnLimits {
            max_depth: self.max_depth,
            max_children: self.max_children,
            max_agents: self.max_agents,
            max_pending_per_requester: self.max_pending_per_requester,
        }
    }
}

/// What an agent asks for.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub handle: Handle,
    pub display_name: String,
    pub role: RoleName,
    pub charter: String,
    pub reason: String,
    pub idempotency_key: Option<String>,
    /// The repository the child gets a checkout of (already resolved by the caller).
    pub repo: Option<i64>,
    /// The child's subtree budget, carved from the nearest one above the requester.
    pub budget: canopy_core::budget::Amount,
}

/// A decision's result: the request, the messages to publish, and, for a refused attempt,
/// the error to return once the audit record has committed.
#[derive(Debug)]
pub struct Decided {
    pub request: SpawnRequest,
    pub notices: Vec<Message>,
    pub refused: Option<Error>,
}

/// What became of a reply in a `spawn: <handle>` topic.
#[derive(Debug, Default)]
pub struct Answered {
    /// Canopy's posts: the decision's notice, an agent's refusal, or why nothing was decided.
    pub notices: Vec<Message>,
    /// True when the reply decided its request (a child may be waiting for a runner).
    pub decided: bool,
}

const SELECT: &str = "SELECT r.id, q.handle, r.handle, r.display_name, r.role, r.charter, r.reason, r.state, \
     d.handle, r.decision_note, r.created_at, r.decided_at, r.expires_at, g.name, r.repo_id, r.budget_usd, r.budget_tokens FROM spawn_requests r \
     JOIN accounts q ON q.id = r.requester_id LEFT JOIN accounts d ON d.id = r.decided_by \
     LEFT JOIN repos g ON g.id = r.repo_id";

fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SpawnRequest> {
    Ok(SpawnRequest {
        id: format!("req-{}", r.get::<_, i64>(0)?),
        requester: Handle::from_trusted(r.get(1)?),
        handle: Handle::from_trusted(r.get(2)?),
        display_name: r.get(3)?,
        role: RoleName::from_trusted(r.get(4)?),
        charter: r.get(5)?,
        reason: r.get(6)?,
        repo: r.get(13)?,
        budget: {
            let amount = canopy_core::budget::Amount {
                usd: r.get(15)?,
                tokens: r.get::<_, Option<i64>>(16)?.map(|t| t.max(0) as u64),
            };
            (!amount.is_empty()).then_some(amount)
        },
        state: parse_enum(r, 7, SpawnState::parse)?,
        decided_by: r.get::<_, Option<String>>(8)?.map(Handle::from_trusted),
        note: r.get(9)?,
        created_at: rfc3339(r.get(10)?),
        decided_at: r.get::<_, Option<i64>>(11)?.map(rfc3339),
        expires_at: rfc3339(r.get(12)?),
    })
}

/// Parses `req-<n>`.
pub fn parse_id(id: &str) -> Result<i64, Error> {
    id.strip_prefix("req-")
        .and_then(|n| n.parse::<i64>().ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| Error::invalid("id", format!("{id:?} is not a request id like req-12")))
}

/// One request by its number.
pub fn load(conn: &Db<'_>, id: i64) -> Result<SpawnRequest, Error> {
    conn.prepare_cached(&format!("{SELECT} WHERE r.id = ?1"))
        .and_then(|mut s| s.query_row(params![id], from_row).optional())
        .map_err(sql("reading a spawn request"))?
        .ok_or_else(|| Error::invalid("id", format!("req-{id} does not exist")))
}

fn count(conn: &Db<'_>, query: &str, id: i64) -> Result<u32, Error> {
    conn.query_row(query, params![id], |r| r.get::<_, i64>(0)).map(|n| n as u32).map_err(sql("checking a limit"))
}

/// Records a request from an agent (after the policy), and posts it for the operator.
pub fn request_spawn(
    conn: &Db<'_>,
    caller: &Caller,
    spec: &SpawnSpec,
    policy: &SpawnPolicy,
) -> Result<(SpawnRequest, Option<Message>), Error> {
    if caller.kind != AccountKind::Agent {
        return Err(Error::invalid("caller", "operators create agents directly with `canopy agents create`"));
    }
    let requester = require_account(conn, "caller", caller.handle.as_str())?;
    if let Some(key) = &spec.idempotency_key {
        let existing: Option<i64> = conn
            .query_row(
                "SELECT id FROM spawn_requests WHERE requester_id = ?1 AND idempotency_key = ?2",
                params![requester.id, key],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("looking up an idempotency key"))?;
        if let Some(id) = existing {
            return Ok((load(conn, id)?, None));
        }
    }
    if spec.role.is_supervisor() {
        return Err(Error::Forbidden { action: "request a Supervisor".into(), reason: "there is exactly one".into() });
    }
    if crate::views::account_ref(conn, spec.handle.as_str())?.is_some() {
        return Err(Error::AlreadyExists { field: "handle", what: format!("an account with handle {}", spec.handle) });
    }
    let taken: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM spawn_requests WHERE handle = ?1 AND state IN ('pending', 'approved'))",
            params![spec.handle.as_str()],
            |r| r.get(0),
        )
        .map_err(sql("checking a handle"))?;
    if taken {
        return Err(Error::ConflictOn {
            field: "handle",
            reason: format!("a pending request already asks for {}", spec.handle),
        });
    }
    let depth = {
        let mut depth = 1u32;
        let mut next = requester.parent_id;
        while let Some(id) = next {
            depth += 1;
            next = crate::views::account_ref_by_id(conn, id)?.and_then(|a| a.parent_id);
            if depth > 10_000 {
                break;
            }
        }
        depth
    };
    let children = count(
        conn,
        "SELECT (SELECT COUNT(*) FROM accounts WHERE parent_id = ?1 AND state != 'despawned') + \
         (SELECT COUNT(*) FROM spawn_requests WHERE requester_id = ?1 AND state = 'pending')",
        requester.id,
    )?;
    let live: u32 = conn
        .query_row(
            "SELECT COUNT(*) FROM accounts WHERE kind = 'agent' AND state != 'despawned' AND run_of IS NULL",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n as u32)
        .map_err(sql("counting agents"))?;
    let pending =
        count(conn, "SELECT COUNT(*) FROM spawn_requests WHERE requester_id = ?1 AND state = 'pending'", requester.id)?;
    let facts = SpawnFacts { requester_depth: depth, children, live_agents: live, pending };
    spawn_rules::check_limits(caller.handle.as_str(), &facts, &policy.limits())?;
    if !spec.budget.is_empty() {
        crate::budgets::check_proposal(conn, requester.id, spec.budget)?;
    }
    let now = conn.now_ms();
    conn.execute(
        "INSERT INTO spawn_requests (requester_id, handle, display_name, role, charter, reason, idempotency_key, state, \
         created_at, expires_at, repo_id, budget_usd, budget_tokens) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', ?8, ?9, ?10, ?11, ?12)",
        params![
            requester.id,
            spec.handle.as_str(),
            spec.display_name,
            spec.role.as_str(),
            spec.charter,
            spec.reason,
            spec.idempotency_key,
            now,
            now + policy.ttl_ms,
            spec.repo,
            spec.budget.usd,
            spec.budget.tokens.map(|t| t as i64)
        ],
    )
    .map_err(sql("recording a spawn request"))?;
    let request = load(conn, conn.last_insert_rowid())?;
    audit(
        conn,
        Some(requester.id),
        "spawn.request",
        &request.id,
        &format!("handle={} role={}", spec.handle, spec.role),
    )?;
    let operators: Vec<String> = conn
        .prepare_cached("SELECT handle FROM accounts WHERE kind = 'operator' ORDER BY handle")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("listing operators"))?;
    let body = say::requested(&operators, caller.handle.as_str(), &request);
    let notice = post_to_requester(conn, requester.id, &spec.handle, &body)?;
    Ok((request, Some(notice)))
}

/// Posts in the requester's home channel, topic `spawn: <handle>`.
fn post_to_requester(conn: &Db<'_>, requester_id: i64, handle: &Handle, body: &str) -> Result<Message, Error> {
    crate::notices::notice_in_home(conn, requester_id, &spawn_topic(handle), body)
}

/// The topic a request is discussed in.
pub fn spawn_topic(handle: &Handle) -> TopicName {
    TopicName::from_trusted(format!("spawn: {handle}"))
}

/// An operator's decision (or an agent's refused attempt at one).
pub fn decide_spawn(
    conn: &Db<'_>,
    caller: &Caller,
    id: i64,
    approve: bool,
    note: Option<String>,
    session: (String, Option<(String, String)>),
) -> Result<Decided, Error> {
    let mut request = load(conn, id)?;
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    let verb = if approve { Verb::Approve } else { Verb::Deny };
    if let Err(error) = spawn_rules::may_decide(caller, verb, &request.id) {
        // Refused, but the attempt is on record and the operators hear of it.
        let action = format!("spawn.{}.refused", verb.as_str());
        audit(conn, Some(actor.id), &action, &request.id, "an agent tried to decide")?;
        let requester = require_account(conn, "requester", request.requester.as_str())?;
        let body = say::attempt(caller.handle.as_str(), verb, &request);
        let notice = post_to_requester(conn, requester.id, &request.handle, &body)?;
        return Ok(Decided { request, notices: vec![notice], refused: Some(error) });
    }
    let now = conn.now_ms();
    if request.state == SpawnState::Pending && expired(conn, id, now)? {
        request = load(conn, id)?;
    }
    spawn_rules::check_pending(&request)?;
    let requester = require_account(conn, "requester", request.requester.as_str())?;
    let (state, body) = if approve {
        conn.execute("SAVEPOINT spawn", []).map_err(sql("starting a spawn"))?;
        let spec = AgentSpec {
            handle: request.handle.clone(),
            display_name: request.display_name.clone(),
            role: request.role.clone(),
            parent: Some(request.requester.clone()),
            charter: request.charter.clone(),
            harness: session.0,
            script: session.1,
            persona: None,
            repo: conn
                .query_row("SELECT repo_id FROM spawn_requests WHERE id = ?1", params![id], |r| r.get(0))
                .map_err(sql("reading a request's repository"))?,
            needs: Vec::new(),
        };
        // A proposed budget must still fit what is left above the requester.
        let granted = |child: i64| -> Result<(), Error> {
            let Some(amount) = request.budget else { return Ok(()) };
            let period = crate::budgets::check_proposal(conn, requester.id, amount)?;
            crate::budgets::grant(conn, child, amount, period)
        };
        let inserted = insert_agent(conn, Some(actor.id), &spec)
            .and_then(|child| granted(require_account(conn, "handle", child.handle.as_str())?.id).map(|_| child));
        match inserted {
            Ok(_) => {
                conn.execute("RELEASE spawn", []).map_err(sql("finishing a spawn"))?;
                (SpawnState::Spawned, say::spawned(caller.handle.as_str(), &request))
            }
            Err(e) => {
                conn.execute("ROLLBACK TO spawn", []).map_err(sql("undoing a spawn"))?;
                conn.execute("RELEASE spawn", []).map_err(sql("undoing a spawn"))?;
                (SpawnState::Failed, say::spawn_failed(caller.handle.as_str(), &request, &e.to_string()))
            }
        }
    } else {
        (SpawnState::Denied, say::denied(caller.handle.as_str(), &request, note.as_deref()))
    };
    let failure = (state == SpawnState::Failed).then(|| body.clone());
    conn.execute(
        "UPDATE spawn_requests SET state = ?1, decided_by = ?2, decision_note = ?3, decided_at = ?4, \
         child_id = (SELECT id FROM accounts WHERE handle = ?5 AND ?1 = 'spawned') WHERE id = ?6 AND state = 'pending'",
        params![state.as_str(), actor.id, note.or(failure), now, request.handle.as_str(), id],
    )
    .map_err(sql("deciding a spawn request"))?;
    audit(conn, Some(actor.id), &format!("spawn.{}", verb.as_str()), &request.id, state.as_str())?;
    let notice = post_to_requester(conn, requester.id, &request.handle, &body)?;
    Ok(Decided { request: load(conn, id)?, notices: vec![notice], refused: None })
}

/// Marks one request expired if its time has passed.
fn expired(conn: &Db<'_>, id: i64, now: i64) -> Result<bool, Error> {
    let changed = conn
        .execute("UPDATE spawn_requests SET state = 'expired', decided_at = ?1 WHERE id = ?2 AND state = 'pending' AND expires_at <= ?1", params![now, id])
        .map_err(sql("expiring a request"))?;
    Ok(changed > 0)
}

/// Expires every pending request past its time and tells each requester.
pub fn expire_spawns(conn: &Db<'_>) -> Result<Vec<Message>, Error> {
    let now = conn.now_ms();
    let due: Vec<i64> = conn
        .prepare_cached("SELECT id FROM spawn_requests WHERE state = 'pending' AND expires_at <= ?1")
        .and_then(|mut s| s.query_map(params![now], |r| r.get(0))?.collect())
        .map_err(sql("finding expired requests"))?;
    let mut notices = Vec::new();
    for id in due {
        notices.extend(expire_and_tell(conn, id, now)?);
    }
    Ok(notices)
}

/// Expires one request if its time has passed, audits it and tells its requester.
fn expire_and_tell(conn: &Db<'_>, id: i64, now: i64) -> Result<Option<Message>, Error> {
    if !expired(conn, id, now)? {
        return Ok(None);
    }
    let request = load(conn, id)?;
    let requester = require_account(conn, "requester", request.requester.as_str())?;
    audit(conn, None, "spawn.expire", &request.id, "")?;
    let body = say::expired(&request);
    Ok(Some(post_to_requester(conn, requester.id, &request.handle, &body)?))
}

/// A role's session defaults for a new child: its harness, and its script (name, text).
pub type RoleSession<'a> = dyn Fn(&RoleName) -> (String, Option<(String, String)>) + 'a;

/// Answers a reply posted in `channel` under `topic` that reads as a decision (`reply`).
///
/// It decides only when posted in the requester's home channel under the request's own
/// topic, `spawn: <handle>`; the request is the newest one from that requester for that
/// handle. An agent's `approve` or `deny <reason>` there is refused and audited like any
/// agent's attempt (`decide_spawn`); anything else an agent writes is left as conversation,
/// so Canopy never answers an agent's chatter (and never loops with one). An operator's
/// reply that does not decide is answered where it was posted: an unclear one with the
/// grammar, one on a request no longer pending with its state, one outside the request's
/// topic with where the request is. `session` gives a role's session defaults for the child.
pub fn answer_reply(
    conn: &Db<'_>,
    caller: &Caller,
    channel: &ChannelName,
    topic: &TopicName,
    reply: &Reply,
    session: &RoleSession<'_>,
) -> Result<Answered, Error> {
    let Some(handle) = topic.as_str().strip_prefix("spawn: ") else { return Ok(Answered::default()) };
    let operator = caller.is_operator();
    if !operator && *reply == Reply::Unclear {
        return Ok(Answered::default());
    }
    let own: Option<i64> = conn
        .prepare_cached(
            "SELECT r.id FROM spawn_requests r JOIN accounts q ON q.id = r.requester_id \
             JOIN channels c ON c.id = q.home_channel_id WHERE c.name = ?1 AND r.handle = ?2 ORDER BY r.id DESC LIMIT 1",
        )
        .and_then(|mut s| s.query_row(params![channel.as_str(), handle], |r| r.get(0)).optional())
        .map_err(sql("finding the request of a topic"))?;
    let Some(id) = own else {
        if !operator {
            return Ok(Answered::default());
        }
        let body = misplaced(conn, channel, handle)?;
        let notice = crate::messages::post_as_system(conn, channel, topic, &body)?;
        return Ok(Answered { notices: vec![notice], decided: false });
    };
    let (approve, note) = match reply {
        Reply::Approve => (true, None),
        Reply::Deny { reason } => (false, Some(canopy_core::redact::cut(reason, 1000))),
        Reply::Unclear => (false, None),
    };
    let mut request = load(conn, id)?;
    if !operator {
        let decided = decide_spawn(conn, caller, id, approve, note, session(&request.role))?;
        return Ok(Answered { notices: decided.notices, decided: false });
    }
    let mut notices = Vec::new();
    if request.state == SpawnState::Pending
        && let Some(notice) = expire_and_tell(conn, id, conn.now_ms())?
    {
        notices.push(notice);
        request = load(conn, id)?;
    }
    let requester = require_account(conn, "requester", request.requester.as_str())?;
    if request.state != SpawnState::Pending {
        let body = say::already_decided(&request);
        notices.push(post_to_requester(conn, requester.id, &request.handle, &body)?);
        return Ok(Answered { notices, decided: false });
    }
    if *reply == Reply::Unclear {
        let body = say::unclear(&request);
        notices.push(post_to_requester(conn, requester.id, &request.handle, &body)?);
        return Ok(Answered { notices, decided: false });
    }
    let decided = decide_spawn(conn, caller, id, approve, note, session(&request.role))?;
    notices.extend(decided.notices);
    Ok(Answered { notices, decided: decided.refused.is_none() })
}

/// Why an operator's answer in `channel`'s `spawn: <handle>` topic decided nothing: the
/// topic is not a request's, so the text says where the request for `handle` is, if any.
fn misplaced(conn: &Db<'_>, channel: &ChannelName, handle: &str) -> Result<String, Error> {
    let newest: Option<(i64, String)> = conn
        .prepare_cached(
            "SELECT r.id, c.name FROM spawn_requests r JOIN accounts q ON q.id = r.requester_id \
             JOIN channels c ON c.id = q.home_channel_id WHERE r.handle = ?1 ORDER BY r.id DESC LIMIT 1",
        )
        .and_then(|mut s| s.query_row(params![handle], |r| Ok((r.get(0)?, r.get(1)?))).optional())
        .map_err(sql("finding a request by handle"))?;
    let Some((number, home)) = newest else { return Ok(say::no_such_request(handle)) };
    Ok(say::misplaced(&load(conn, number)?, &home, channel.as_str()))
}

/// The requester cancels its own pending request.
pub fn cancel_spawn(conn: &Db<'_>, caller: &Caller, id: i64) -> Result<(SpawnRequest, Message), Error> {
    let request = load(conn, id)?;
    if request.requester != caller.handle {
        return Err(Error::Forbidden {
            action: format!("cancel {}", request.id),
            reason: "only its requester may cancel it".into(),
        });
    }
    let changed = conn
        .execute(
            "UPDATE spawn_requests SET state = 'cancelled', decided_at = ?1 WHERE id = ?2 AND state = 'pending'",
            params![conn.now_ms(), id],
        )
        .map_err(sql("cancelling a request"))?;
    if changed == 0 {
        return Err(Error::ConflictOn {
            field: "id",
            reason: format!("{} is {}, not pending", request.id, request.state),
        });
    }
    let requester = require_account(conn, "caller", caller.handle.as_str())?;
    audit(conn, Some(requester.id), "spawn.cancel", &request.id, "")?;
    let notice = post_to_requester(conn, requester.id, &request.handle, &say::cancelled(&request))?;
    Ok((load(conn, id)?, notice))
}

/// Requests, newest first, optionally in one state.
pub fn list_spawns(conn: &Db<'_>, state: Option<SpawnState>) -> Result<Vec<SpawnRequest>, Error> {
    let state = state.map(|s| s.as_str().to_owned());
    conn.prepare_cached(&format!("{SELECT} WHERE (?1 IS NULL OR r.state = ?1) ORDER BY r.id DESC LIMIT 1000"))
        .and_then(|mut s| s.query_map(params![state], from_row)?.collect())
        .map_err(sql("listing spawn requests"))
}

/// Despawns `handle` and its subtree. Agents may despawn only their descendants; operators
/// anyone but the Supervisor. Sessions end; accounts and history stay. Returns the despawned
/// handles and the notice to the parent.
pub fn despawn(conn: &Db<'_>, caller: &Caller, handle: &Handle) -> Result<(Vec<Handle>, Option<Message>), Error> {
    let target = require_account(conn, "handle", handle.as_str())?;
    let mut ancestors = Vec::new();
    let mut next = target.parent_id;
    while let Some(id) = next {
        let Some(account) = crate::views::account_ref_by_id(conn, id)? else { break };
        ancestors.push(account.handle.to_string());
        next = account.parent_id;
        if ancestors.len() > 10_000 {
            break;
        }
    }
    spawn_rules::may_despawn(
        caller,
        &DespawnTarget {
            handle: handle.as_str(),
            is_agent: target.kind == AccountKind::Agent,
            is_supervisor: target.role.as_ref().is_some_and(RoleName::is_supervisor),
            despawned: target.state == AccountState::Despawned,
            ancestors: &ancestors,
        },
    )?;
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    // The subtree, target first.
    let mut subtree = vec![target.id];
    let mut index = 0;
    while index < subtree.len() {
        let kids: Vec<i64> = conn
            .prepare_cached("SELECT id FROM accounts WHERE parent_id = ?1 AND state != 'despawned'")
            .and_then(|mut s| s.query_map(params![subtree[index]], |r| r.get(0))?.collect())
            .map_err(sql("walking a subtree"))?;
        subtree.extend(kids);
        index += 1;
    }
    let now = conn.now_ms();
    let mut handles = Vec::new();
    for id in &subtree {
        conn.execute("UPDATE accounts SET state = 'despawned', desired = 'stopped' WHERE id = ?1", params![id])
            .map_err(sql("despawning"))?;
        crate::repos::retire_checkout(conn, *id)?;
        conn.execute(
            "UPDATE sessions SET ended_at = ?1, end_reason = 'despawned' WHERE agent_id = ?2 AND ended_at IS NULL",
            params![now, id],
        )
        .map_err(sql("ending a session"))?;
        set_presence(conn, *id, canopy_core::Presence::Despawned, Some("despawned"), None, now)?;
        let h: String = conn
            .query_row("SELECT handle FROM accounts WHERE id = ?1", params![id], |r| r.get(0))
            .map_err(sql("naming"))?;
        audit(conn, Some(actor.id), "agents.despawn", &h, &format!("by {}", caller.handle))?;
        handles.push(Handle::from_trusted(h));
    }
    let notice = match target.parent_id {
        Some(parent) => {
            let names: Vec<&str> = handles.iter().map(Handle::as_str).collect();
            let body =
                format!("{} despawned @{handle} ({}). Their history stays readable.", caller.handle, names.join(", "));
            Some(crate::notices::notice(conn, parent, &body)?)
        }
        None => None,
    };
    Ok((handles, notice))
}

/// The audit log since a time, newest first (at most 1000 lines).
pub fn audit_log(conn: &Db<'_>, since_ms: i64) -> Result<Vec<AuditEntry>, Error> {
    conn.prepare_cached(
        "SELECT l.id, l.at, a.handle, l.action, l.target, l.detail FROM audit l LEFT JOIN accounts a ON a.id = l.actor_id \
         WHERE l.at >= ?1 ORDER BY l.id DESC LIMIT 1000",
    )
    .and_then(|mut s| {
        s.query_map(params![since_ms], |r| {
            Ok(AuditEntry {
                id: r.get::<_, i64>(0)? as u64,
                at: rfc3339(r.get(1)?),
                actor: r.get::<_, Option<String>>(2)?.map(Handle::from_trusted),
                action: r.get(3)?,
                target: r.get(4)?,
                detail: r.get(5)?,
            })
        })?
        .collect()
    })
    .map_err(sql("reading the audit log"))
}

/// A channel's id and the system account's id, for delivering Canopy's own notices.
pub fn channel_and_system(conn: &Db<'_>, channel: &ChannelName) -> Result<(i64, i64), Error> {
    let (channel_id, _) = crate::views::require_channel(conn, "channel", channel.as_str())?;
    let system: i64 = conn
        .query_row("SELECT id FROM accounts WHERE kind = 'system' ORDER BY id LIMIT 1", [], |r| r.get(0))
        .map_err(sql("finding the system account"))?;
    Ok((channel_id, system))
}
