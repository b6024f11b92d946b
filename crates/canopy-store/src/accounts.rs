//! Accounts and the tree: creating agents and operators, reparenting, reading the tree.
//!
//! Creating an agent also creates its home channel and its mandatory subscriptions in the
//! same transaction, so an agent never exists without them. Operator-only actions are
//! checked here against the caller resolved from its token.

use std::collections::HashMap;

use canopy_core::Seq;
use canopy_core::acl::Caller;
use canopy_core::{
    Account, AccountKind, AccountState, ChannelKind, ChannelName, Error, Handle, PostPolicy, Presence, RoleName,
    Subscription, SubscriptionPolicy, TreeNode,
};
use rusqlite::{OptionalExtension, params};

use crate::channels::{insert_channel, subscribe, subscribe_all};
use crate::presence::set_presence;
use crate::schema::audit;
use crate::views::{ACCOUNT_SELECT, account_from_row, account_ref, agents_beyond, require_account};
use crate::{Db, sql};

/// A standing agent to create.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    pub handle: Handle,
    pub display_name: String,
    pub role: RoleName,
    /// The Supervisor when `None` (except for the Supervisor itself).
    pub parent: Option<Handle>,
    pub charter: String,
    /// The harness its sessions run (`scripted`, ...); empty for none.
    pub harness: String,
    /// The scripted harness's script: file name and text.
    pub script: Option<(String, String)>,
    /// A persona overlay rendered last in its prompt.
    pub persona: Option<String>,
    /// The repository it gets a checkout of (recorded `preparing`; the account is held
    /// until the daemon has made it).
    pub repo: Option<i64>,
    /// Runner labels its sessions need (checked, sorted), besides its role's.
    pub needs: Vec<String>,
}

/// An operator to create, with the hash of its bearer token.
#[derive(Debug, Clone)]
pub struct OperatorSpec {
    pub handle: Handle,
    pub display_name: String,
    pub token_hash: String,
}

/// The account a token hash belongs to, if any: an operator's token, or the token of an
/// agent's live session (a token dies with its session).
pub fn resolve_token(conn: &Db<'_>, token_hash: &str) -> Result<Option<Caller>, Error> {
    conn.prepare_cached(
        "SELECT handle, kind FROM accounts WHERE token_hash = ?1 AND state NOT IN ('despawned', 'revoked') \
         UNION ALL SELECT a.handle, a.kind FROM sessions s JOIN accounts a ON a.id = s.agent_id \
         WHERE s.token_hash = ?1 AND s.ended_at IS NULL AND a.state = 'active' LIMIT 1",
    )
    .and_then(|mut s| {
        s.query_row(params![token_hash], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))).optional()
    })
    .map_err(sql("resolving a token"))?
    .map(|(handle, kind)| {
        let kind =
            AccountKind::parse(&kind).ok_or_else(|| Error::Internal(format!("account {handle} has kind {kind:?}")))?;
        Ok(Caller { handle: Handle::from_trusted(handle), kind })
    })
    .transpose()
}

/// One account by handle.
pub fn account(conn: &Db<'_>, field: &'static str, handle: &str) -> Result<Account, Error> {
    conn.prepare_cached(&format!("{ACCOUNT_SELECT} WHERE a.handle = ?1"))
        .and_then(|mut s| s.query_row(params![handle], account_from_row).optional())
        .map_err(sql("reading an account"))?
        .ok_or_else(|| Error::AgentNotFound { field, handle: handle.to_owned(), nearest: None })
}

/// Every agent, ordered by handle.
pub fn list_agents(conn: &Db<'_>, after: Option<&str>, limit: Option<usize>) -> Result<(Vec<Account>, u64), Error> {
    let agents: Vec<Account> = conn
        .prepare_cached(&format!(
            "{ACCOUNT_SELECT} WHERE a.kind = 'agent' AND a.run_of IS NULL AND (?1 IS NULL OR a.handle > ?1) \
             ORDER BY a.handle LIMIT ?2"
        ))
        .and_then(|mut s| s.query_map(params![after, limit.map_or(-1, |l| l as i64)], account_from_row)?.collect())
        .map_err(sql("listing agents"))?;
    let more = agents_beyond(conn, agents.last().map(|a| a.handle.as_str()), agents.len(), limit)?;
    Ok((agents, more))
}

/// The handles of an account's children, ordered.
pub fn children(conn: &Db<'_>, handle: &str) -> Result<Vec<String>, Error> {
    conn.prepare_cached(
        "SELECT c.handle FROM accounts c JOIN accounts p ON p.id = c.parent_id WHERE p.handle = ?1 ORDER BY c.handle",
    )
    .and_then(|mut s| s.query_map(params![handle], |r| r.get(0))?.collect())
    .map_err(sql("listing children"))
}

/// An account's subscriptions with their cursors, ordered by channel.
pub fn subscriptions(conn: &Db<'_>, handle: &str) -> Result<Vec<Subscription>, Error> {
    conn.prepare_cached(
        "SELECT c.name, s.mandatory, s.cursor FROM subscriptions s JOIN channels c ON c.id = s.channel_id \
         JOIN accounts a ON a.id = s.account_id WHERE a.handle = ?1 ORDER BY c.name",
    )
    .and_then(|mut s| {
        s.query_map(params![handle], |r| {
            Ok(Subscription {
                channel: ChannelName::from_trusted(r.get(0)?),
                mandatory: r.get(1)?,
                cursor: Seq(r.get::<_, i64>(2)? as u64),
            })
        })?
        .collect()
    })
    .map_err(sql("listing subscriptions"))
}

/// Creates a standing agent on an operator's request.
pub fn create_agent(conn: &Db<'_>, caller: &Caller, spec: &AgentSpec) -> Result<Account, Error> {
    if spec.role.is_supervisor() {
        return Err(Error::Forbidden {
            action: format!("create agent {}", spec.handle),
            reason: "a workspace has exactly one Supervisor, made by canopy init".into(),
        });
    }
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    insert_agent(conn, Some(actor.id), spec)
}

/// Inserts an agent, its home channel and its subscriptions. No permission check.
pub(crate) fn insert_agent(conn: &Db<'_>, actor_id: Option<i64>, spec: &AgentSpec) -> Result<Account, Error> {
    if account_ref(conn, spec.handle.as_str())?.is_some() {
        return Err(Error::AlreadyExists { field: "handle", what: format!("an account with handle {}", spec.handle) });
    }
    let parent_id = match (&spec.parent, spec.role.is_supervisor()) {
        (_, true) => None,
        (Some(parent), false) => Some(require_live_agent(conn, "parent", parent.as_str())?),
        (None, false) => Some(require_live_agent(conn, "parent", "supervisor")?),
    };
    let (script_name, script) = match &spec.script {
        Some((name, text)) => (Some(name.as_str()), Some(text.as_str())),
        None => (None, None),
    };
    let now = conn.now_ms();
    conn.prepare_cached(
        "INSERT INTO accounts (handle, display_name, kind, role, parent_id, charter, state, created_at, harness, \
         script_name, script, persona, needs) VALUES (?1, ?2, 'agent', ?3, ?4, ?5, 'active', ?6, ?7, ?8, ?9, ?10, ?11)",
    )
    .and_then(|mut s| {
        s.execute(params![
            spec.handle.as_str(),
            spec.display_name,
            spec.role.as_str(),
            parent_id,
            spec.charter,
            now,
            spec.harness,
            script_name,
            script,
            spec.persona,
            canopy_core::placement::join(&spec.needs)
        ])
    })
    .map_err(sql("inserting an agent"))?;
    let agent_id = conn.last_insert_rowid();
    set_presence(conn, agent_id, Presence::Offline, Some("no session yet"), None, now)?;
    if let Some(repo_id) = spec.repo {
        let branch = canopy_core::repos::agent_branch(spec.handle.as_str());
        let new = crate::repos::NewCheckout { repo_id, start: String::new(), read_only: false };
        crate::repos::record_checkout(conn, agent_id, &branch, &new)?;
    }

    let home = ChannelName::home_of(&spec.handle);
    let home_id = insert_channel(
        conn,
        &home,
        ChannelKind::Home,
        PostPolicy::Open,
        SubscriptionPolicy::Mandatory,
        Some(agent_id),
    )?;
    conn.execute("UPDATE accounts SET home_channel_id = ?1 WHERE id = ?2", params![home_id, agent_id])
        .map_err(sql("linking a home channel"))?;
    subscribe(conn, agent_id, home_id, true)?;
    subscribe_all(conn, "SELECT id FROM accounts WHERE kind = 'operator'", true, |account| (account, home_id))?;
    subscribe_all(conn, "SELECT id FROM channels WHERE kind = 'broadcast'", true, |channel| (agent_id, channel))?;
    if let Some(parent_id) = parent_id {
        crate::governance::link_parent(conn, agent_id, None, parent_id)?;
    }
    audit(
        conn,
        actor_id,
        "agents.create",
        spec.handle.as_str(),
        &format!("role={} parent={}", spec.role, spec.parent.as_ref().map_or("supervisor", |p| p.as_str())),
    )?;
    account(conn, "handle", spec.handle.as_str())
}

/// Creates an operator and subscribes it to every home and broadcast channel.
pub fn create_operator(conn: &Db<'_>, spec: &OperatorSpec) -> Result<Account, Error> {
    if account_ref(conn, spec.handle.as_str())?.is_some() {
        return Err(Error::AlreadyExists {
            field: "operator",
            what: format!("an account with handle {}", spec.handle),
        });
    }
    conn.execute(
        "INSERT INTO accounts (handle, display_name, kind, token_hash, state, created_at) \
         VALUES (?1, ?2, 'operator', ?3, 'active', ?4)",
        params![spec.handle.as_str(), spec.display_name, spec.token_hash, conn.now_ms()],
    )
    .map_err(sql("inserting an operator"))?;
    let operator_id = conn.last_insert_rowid();
    subscribe_all(conn, "SELECT id FROM channels WHERE kind IN ('home', 'broadcast')", true, |channel| {
        (operator_id, channel)
    })?;
    audit(conn, Some(operator_id), "operators.create", spec.handle.as_str(), "")?;
    account(conn, "operator", spec.handle.as_str())
}

/// Every operator, by handle.
pub fn operators(conn: &Db<'_>) -> Result<Vec<Account>, Error> {
    conn.prepare_cached(&format!("{ACCOUNT_SELECT} WHERE a.kind = 'operator' ORDER BY a.handle"))
        .and_then(|mut s| s.query_map([], account_from_row)?.collect())
        .map_err(sql("listing operators"))
}

/// Revokes an operator: its token stops working at once (the daemon drops its cache entry).
/// Refuses the last active operator, which would lock the workspace.
pub fn revoke_operator(conn: &Db<'_>, caller: &Caller, handle: &Handle) -> Result<Account, Error> {
    let target = require_account(conn, "handle", handle.as_str())?;
    if target.kind != AccountKind::Operator {
        return Err(Error::invalid("handle", format!("{handle} is an agent; despawn agents instead")));
    }
    if target.state == AccountState::Revoked {
        return Err(Error::ConflictOn { field: "handle", reason: format!("{handle} is already revoked") });
    }
    let active: i64 = conn
        .query_row("SELECT COUNT(*) FROM accounts WHERE kind = 'operator' AND state = 'active'", [], |r| r.get(0))
        .map_err(sql("counting operators"))?;
    if active <= 1 {
        return Err(Error::ConflictOn {
            field: "handle",
            reason: format!("{handle} is the last active operator; add another before revoking it"),
        });
    }
    conn.execute("UPDATE accounts SET state = 'revoked' WHERE id = ?1", params![target.id])
        .map_err(sql("revoking an operator"))?;
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    audit(conn, Some(actor.id), "operators.revoke", handle.as_str(), "")?;
    account(conn, "handle", handle.as_str())
}

/// Moves an agent under a new parent. Refuses the Supervisor and cycles.
pub fn reparent(conn: &Db<'_>, caller: &Caller, handle: &Handle, parent: &Handle) -> Result<Account, Error> {
    let child = require_account(conn, "handle", handle.as_str())?;
    if child.kind != AccountKind::Agent {
        return Err(Error::invalid("handle", format!("{handle} is an operator, not an agent in the tree")));
    }
    let parent_id = require_live_agent(conn, "parent", parent.as_str())?;
    let ancestors = ancestors(conn, parent_id)?;
    let is_supervisor = child.role.as_ref().is_some_and(RoleName::is_supervisor);
    canopy_core::tree::check_reparent(handle, is_supervisor, parent, &ancestors)?;
    conn.execute("UPDATE accounts SET parent_id = ?1 WHERE id = ?2", params![parent_id, child.id])
        .map_err(sql("reparenting"))?;
    crate::governance::link_parent(conn, child.id, child.parent_id, parent_id)?;
    crate::budgets::recompute_subtrees(conn)?;
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    audit(conn, Some(actor.id), "agents.reparent", handle.as_str(), &format!("parent={parent}"))?;
    account(conn, "handle", handle.as_str())
}

/// The whole agent tree, from the Supervisor down.
pub fn tree(conn: &Db<'_>) -> Result<TreeNode, Error> {
    struct Row {
        handle: String,
        display_name: String,
        role: String,
        state: String,
        parent: Option<String>,
    }
    let rows: Vec<Row> = conn
        .prepare_cached(
            "SELECT a.handle, a.display_name, COALESCE(a.role, ''), a.state, p.handle FROM accounts a \
             LEFT JOIN accounts p ON p.id = a.parent_id WHERE a.kind = 'agent' AND a.run_of IS NULL ORDER BY a.handle",
        )
        .and_then(|mut s| {
            s.query_map([], |r| {
                Ok(Row {
                    handle: r.get(0)?,
                    display_name: r.get(1)?,
                    role: r.get(2)?,
                    state: r.get(3)?,
                    parent: r.get(4)?,
                })
            })?
            .collect()
        })
        .map_err(sql("reading the tree"))?;
    let mut by_parent: HashMap<Option<String>, Vec<&Row>> = HashMap::new();
    for row in &rows {
        by_parent.entry(row.parent.clone()).or_default().push(row);
    }
    fn build(row: &Row, by_parent: &HashMap<Option<String>, Vec<&Row>>, depth: usize) -> TreeNode {
        let children = if depth > 10_000 {
            Vec::new() // Unreachable while reparent refuses cycles; a guard, not a rule.
        } else {
            by_parent
                .get(&Some(row.handle.clone()))
                .map(|kids| kids.iter().map(|k| build(k, by_parent, depth + 1)).collect())
                .unwrap_or_default()
        };
        TreeNode {
            handle: Handle::from_trusted(row.handle.clone()),
            display_name: row.display_name.clone(),
            role: RoleName::from_trusted(row.role.clone()),
            state: AccountState::parse(&row.state).unwrap_or(AccountState::Active),
            children,
            omitted: 0,
        }
    }
    let root = rows
        .iter()
        .find(|r| r.parent.is_none() && r.role == RoleName::SUPERVISOR)
        .ok_or_else(|| Error::Internal("the workspace has no Supervisor".into()))?;
    Ok(build(root, &by_parent, 0))
}

/// The row id of a live agent, refusing operators and despawned agents.
fn require_live_agent(conn: &Db<'_>, field: &'static str, handle: &str) -> Result<i64, Error> {
    let account = require_account(conn, field, handle)?;
    if account.kind != AccountKind::Agent {
        return Err(Error::invalid(field, format!("{handle} is an operator; only agents can have children")));
    }
    if account.state == AccountState::Despawned {
        return Err(Error::invalid(field, format!("{handle} is despawned")));
    }
    Ok(account.id)
}

/// The handles above `id`, from itself up to the root. Bounded so a corrupt row cannot loop.
fn ancestors(conn: &Db<'_>, id: i64) -> Result<Vec<Handle>, Error> {
    let mut out = Vec::new();
    let mut next = Some(id);
    while let Some(current) = next {
        if out.len() > 10_000 {
            return Err(Error::Internal("the tree has a cycle above an agent".into()));
        }
        let row = crate::views::account_ref_by_id(conn, current)?;
        let Some(row) = row else { break };
        out.push(row.handle);
        next = row.parent_id;
    }
    Ok(out)
}
