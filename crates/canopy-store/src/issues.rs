//! The work ledger's records (DESIGN section 17): issues, their labels, dependencies, links to
//! runs and merge requests, and their append-only history; who is told in an issue's topic;
//! usage attributed to issues and the spend read back.
//!
//! Every change checks the rules of `canopy_core::issues` against the tree as it is in the
//! same transaction, appends its event, and returns the notices it committed (for delivery)
//! and what changed (for the event subject). Does not deliver or publish anything, and does
//! not decide wording (`canopy_core::issues::say`).

use std::collections::{BTreeMap, BTreeSet};

use canopy_core::acl::Caller;
use canopy_core::issues::{
    self as rules, Blocker, Filing, Issue, IssueEvent, IssueSpend, IssueState, IssueSummary, Move, say,
};
use canopy_core::{AccountKind, Error, Handle, Message, RoleName, TopicName};
use rusqlite::{OptionalExtension, params};

use crate::notices::notice_in_home;
use crate::views::{AccountRef, account_ref_by_id, parse_enum, require_account};
use crate::{Db, rfc3339, sql};

/// What a change did: the issue after it, its event, and the notices it committed.
#[derive(Debug, Default)]
pub struct Changed {
    pub changes: Vec<(IssueSummary, IssueEvent)>,
    pub notices: Vec<Message>,
    /// A comment's notice, whose mentions steer.
    pub mentioning: Vec<Message>,
}

/// A new issue.
#[derive(Debug, Clone, Default)]
pub struct NewIssue {
    pub title: String,
    pub body: String,
    pub owner: Option<Handle>,
    pub parent: Option<u64>,
    pub labels: Vec<String>,
    pub depends_on: Vec<u64>,
    /// A retry with the same key from the same reporter returns the first filing.
    pub idempotency_key: Option<String>,
}

/// A change to an issue: a move and edits, each optional.
#[derive(Debug, Clone, Default)]
pub struct IssueChange {
    pub state: Option<IssueState>,
    pub note: Option<String>,
    pub blocker: Option<Blocker>,
    pub resolution: Option<String>,
    pub labels: Option<Vec<String>>,
    pub depends_on: Option<Vec<u64>>,
    pub body: Option<String>,
    pub title: Option<String>,
}

/// Whose issues a list shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owners {
    Everyone,
    Nobody,
    /// One account's.
    Of(Handle),
    /// An agent's direct reports'.
    ReportsOf(Handle),
    /// An agent's and all its descendants'.
    SubtreeOf(Handle),
}

/// A list's filters and page.
#[derive(Debug, Clone)]
pub struct IssueQuery {
    pub owners: Owners,
    /// `None`: every state but the closed ones, unless `include_closed`.
    pub state: Option<IssueState>,
    pub include_closed: bool,
    pub label: Option<String>,
    pub after: u64,
    /// Only numbers below this.
    pub before: Option<u64>,
    /// Highest number first.
    pub newest: bool,
    pub limit: usize,
}

/// Everything `issues.show` prints.
#[derive(Debug, Clone)]
pub struct IssueView {
    pub issue: Issue,
    pub events: Vec<IssueEvent>,
    pub subissues: Vec<IssueSummary>,
    pub runs: Vec<i64>,
    pub merges: Vec<i64>,
    pub spend: IssueSpend,
    /// The topic in the owner's home channel, when an agent owns it.
    pub topic: Option<String>,
}

/// Where the Supervisor is told of imported issues to triage.
pub const IMPORT_TOPIC: &str = "issues: imported";

/// One issue from another tracker.
#[derive(Debug, Clone)]
pub struct Imported {
    pub source: String,
    pub title: String,
    pub body: String,
    pub labels: Vec<String>,
    pub closed: bool,
}

const ISSUE_SELECT: &str = "SELECT i.number, i.title, i.body, i.state, o.handle, r.handle, i.parent, i.blocker, \
    i.resolution, i.source, i.budget_usd, i.created_at, i.updated_at, \
    (SELECT group_concat(on_issue) FROM issue_deps WHERE issue = i.number), \
    (SELECT group_concat(label, char(10)) FROM issue_labels WHERE issue = i.number) \
    FROM issues i LEFT JOIN accounts o ON o.id = i.owner_id JOIN accounts r ON r.id = i.reporter_id";

const SUMMARY_SELECT: &str = "SELECT i.number, i.title, i.state, o.handle, i.parent, i.blocker, i.created_at, \
    i.updated_at, (SELECT group_concat(label, char(10)) FROM issue_labels WHERE issue = i.number), \
    (SELECT COALESCE(SUM(charged_usd), 0) FROM usage WHERE issue = i.number) \
    FROM issues i LEFT JOIN accounts o ON o.id = i.owner_id";

fn blocker_from(text: Option<String>) -> Option<Blocker> {
    text.and_then(|t| serde_json::from_str(&t).ok())
}

fn numbers(text: Option<String>) -> Vec<u64> {
    let mut out: Vec<u64> = text.unwrap_or_default().split(',').filter_map(|n| n.parse().ok()).collect();
    out.sort_unstable();
    out
}

fn lines(text: Option<String>) -> Vec<String> {
    let mut out: Vec<String> =
        text.unwrap_or_default().split('\n').filter(|l| !l.is_empty()).map(str::to_owned).collect();
    out.sort();
    out
}

fn issue_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Issue> {
    Ok(Issue {
        number: r.get::<_, i64>(0)? as u64,
        title: r.get(1)?,
        body: r.get(2)?,
        state: parse_enum(r, 3, IssueState::parse)?,
        owner: r.get::<_, Option<String>>(4)?.map(Handle::from_trusted),
        reporter: Handle::from_trusted(r.get(5)?),
        parent: r.get::<_, Option<i64>>(6)?.map(|n| n as u64),
        blocker: blocker_from(r.get(7)?),
        resolution: r.get(8)?,
        source: r.get(9)?,
        budget_usd: r.get(10)?,
        created_at: rfc3339(r.get(11)?),
        updated_at: rfc3339(r.get(12)?),
        depends_on: numbers(r.get(13)?),
        labels: lines(r.get(14)?),
    })
}

fn summary_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<IssueSummary> {
    Ok(IssueSummary {
        number: r.get::<_, i64>(0)? as u64,
        title: r.get(1)?,
        state: parse_enum(r, 2, IssueState::parse)?,
        owner: r.get::<_, Option<String>>(3)?.map(Handle::from_trusted),
        parent: r.get::<_, Option<i64>>(4)?.map(|n| n as u64),
        blocker: blocker_from(r.get(5)?),
        created_at: rfc3339(r.get(6)?),
        updated_at: rfc3339(r.get(7)?),
        labels: lines(r.get(8)?),
        spend_usd: r.get(9)?,
    })
}

fn not_found(number: u64) -> Error {
    Error::NotFound { field: "issue", what: format!("issue #{number}") }
}

/// One issue by number.
pub fn issue(conn: &Db<'_>, number: u64) -> Result<Issue, Error> {
    conn.prepare_cached(&format!("{ISSUE_SELECT} WHERE i.number = ?1"))
        .and_then(|mut s| s.query_row(params![number as i64], issue_from_row).optional())
        .map_err(sql("reading an issue"))?
        .ok_or_else(|| not_found(number))
}

fn summary(conn: &Db<'_>, number: u64) -> Result<IssueSummary, Error> {
    conn.prepare_cached(&format!("{SUMMARY_SELECT} WHERE i.number = ?1"))
        .and_then(|mut s| s.query_row(params![number as i64], summary_from_row).optional())
        .map_err(sql("reading an issue"))?
        .ok_or_else(|| not_found(number))
}

/// The owner's id and kind, the topic, and the state: what every rule reads first.
struct Row {
    owner: Option<AccountRef>,
    topic: String,
    state: IssueState,
    parent: Option<u64>,
    title: String,
}

fn row(conn: &Db<'_>, number: u64) -> Result<Row, Error> {
    let found = conn
        .prepare_cached("SELECT owner_id, topic, state, parent, title FROM issues WHERE number = ?1")
        .and_then(|mut s| {
            s.query_row(params![number as i64], |r| {
                Ok((
                    r.get::<_, Option<i64>>(0)?,
                    r.get::<_, String>(1)?,
                    parse_enum(r, 2, IssueState::parse)?,
                    r.get::<_, Option<i64>>(3)?,
                    r.get::<_, String>(4)?,
                ))
            })
            .optional()
        })
        .map_err(sql("reading an issue"))?
        .ok_or_else(|| not_found(number))?;
    let owner = match found.0 {
        Some(id) => account_ref_by_id(conn, id)?,
        None => None,
    };
    Ok(Row { owner, topic: found.1, state: found.2, parent: found.3.map(|p| p as u64), title: found.4 })
}

/// Every account below `agent_id` in the tree, runs excluded: its id, handle, and whether it
/// was despawned.
fn below(conn: &Db<'_>, agent_id: i64) -> Result<Vec<(i64, Handle, bool)>, Error> {
    conn.prepare_cached(
        "WITH RECURSIVE down(id) AS (SELECT id FROM accounts WHERE parent_id = ?1 \
         UNION SELECT a.id FROM accounts a JOIN down ON a.parent_id = down.id) \
         SELECT id, handle, state = 'despawned' FROM accounts WHERE id IN down AND run_of IS NULL",
    )
    .and_then(|mut s| {
        s.query_map(params![agent_id], |r| Ok((r.get(0)?, Handle::from_trusted(r.get(1)?), r.get(2)?)))?.collect()
    })
    .map_err(sql("reading an agent's descendants"))
}

/// The handles below `agent_id`: the live ones, to give work to; with `despawned`, also those
/// gone, whose issues an ancestor may still take back.
fn descendants(conn: &Db<'_>, agent_id: i64, despawned: bool) -> Result<BTreeSet<Handle>, Error> {
    Ok(below(conn, agent_id)?.into_iter().filter(|(_, _, gone)| despawned || !gone).map(|(_, h, _)| h).collect())
}

fn event(conn: &Db<'_>, number: u64, actor_id: i64, kind: &str, text: &str) -> Result<IssueEvent, Error> {
    conn.prepare_cached("INSERT INTO issue_events (issue, at, actor_id, kind, text) VALUES (?1, ?2, ?3, ?4, ?5)")
        .and_then(|mut s| s.execute(params![number as i64, conn.now_ms(), actor_id, kind, text]))
        .map_err(sql("recording an issue event"))?;
    conn.execute("UPDATE issues SET updated_at = ?1 WHERE number = ?2", params![conn.now_ms(), number as i64])
        .map_err(sql("touching an issue"))?;
    let actor =
        account_ref_by_id(conn, actor_id)?.map(|a| a.handle).unwrap_or_else(|| Handle::from_trusted("canopy".into()));
    Ok(IssueEvent { at: rfc3339(conn.now_ms()), actor, kind: kind.to_owned(), text: text.to_owned() })
}

/// Records an event and what changed (the issue as it is now).
fn changed(out: &mut Changed, conn: &Db<'_>, number: u64, actor_id: i64, kind: &str, text: &str) -> Result<(), Error> {
    let event = event(conn, number, actor_id, kind, text)?;
    out.changes.push((summary(conn, number)?, event));
    Ok(())
}

fn system_id(conn: &Db<'_>) -> Result<i64, Error> {
    conn.prepare_cached("SELECT id FROM accounts WHERE kind = 'system' ORDER BY id LIMIT 1")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(sql("finding the system account"))
}

/// Posts `body` in the issue's topic in `to`'s home channel, when `to` is an agent with one.
fn tell(conn: &Db<'_>, to: Option<&AccountRef>, topic: &str, body: &str) -> Result<Option<Message>, Error> {
    let Some(to) = to.filter(|a| a.kind == AccountKind::Agent) else { return Ok(None) };
    let has_home: bool = conn
        .query_row("SELECT home_channel_id IS NOT NULL FROM accounts WHERE id = ?1", params![to.id], |r| r.get(0))
        .map_err(sql("finding a home channel"))?;
    if !has_home {
        return Ok(None);
    }
    notice_in_home(conn, to.id, &TopicName::from_trusted(topic.to_owned()), body).map(Some)
}

/// The Supervisor (by its role), who triages what nobody owns.
fn supervisor(conn: &Db<'_>) -> Result<Option<AccountRef>, Error> {
    let id: Option<i64> = conn
        .query_row(
            "SELECT id FROM accounts WHERE role = ?1 AND state != 'despawned' ORDER BY id LIMIT 1",
            [RoleName::SUPERVISOR],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql("finding the Supervisor"))?;
    match id {
        Some(id) => account_ref_by_id(conn, id),
        None => Ok(None),
    }
}

fn check_exist(conn: &Db<'_>, field: &'static str, issues: &[u64]) -> Result<(), Error> {
    if issues.len() > rules::MAX_DEPENDS_ON {
        return Err(Error::invalid(field, format!("at most {} issues", rules::MAX_DEPENDS_ON)));
    }
    for &n in issues {
        let found: bool = conn
            .query_row("SELECT EXISTS (SELECT 1 FROM issues WHERE number = ?1)", params![n as i64], |r| r.get(0))
            .map_err(sql("reading an issue"))?;
        if !found {
            return Err(Error::NotFound { field, what: format!("issue #{n}") });
        }
    }
    Ok(())
}

/// The dependency edges reachable from `from` (enough to find a cycle through them).
fn reachable_edges(conn: &Db<'_>, from: &[u64]) -> Result<BTreeMap<u64, Vec<u64>>, Error> {
    let start = serde_json::to_string(from).map_err(|e| Error::Internal(format!("encoding issues: {e}")))?;
    let pairs: Vec<(i64, i64)> = conn
        .prepare_cached(
            "WITH RECURSIVE r(n) AS (SELECT value FROM json_each(?1) \
             UNION SELECT d.on_issue FROM issue_deps d JOIN r ON d.issue = r.n) \
             SELECT issue, on_issue FROM issue_deps WHERE issue IN r",
        )
        .and_then(|mut s| s.query_map(params![start], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .map_err(sql("reading issue dependencies"))?;
    let mut edges: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (a, b) in pairs {
        edges.entry(a as u64).or_default().push(b as u64);
    }
    Ok(edges)
}

fn set_dependencies(conn: &Db<'_>, number: u64, on: &[u64]) -> Result<(), Error> {
    check_exist(conn, "depends_on", on)?;
    let mut edges = reachable_edges(conn, on)?;
    edges.remove(&number);
    rules::check_dependencies(number, on, &edges)?;
    conn.execute("DELETE FROM issue_deps WHERE issue = ?1", params![number as i64])
        .map_err(sql("replacing issue dependencies"))?;
    for &n in on.iter().collect::<BTreeSet<_>>() {
        conn.execute("INSERT INTO issue_deps (issue, on_issue) VALUES (?1, ?2)", params![number as i64, n as i64])
            .map_err(sql("recording an issue dependency"))?;
    }
    Ok(())
}

fn set_labels(conn: &Db<'_>, number: u64, labels: &[String]) -> Result<(), Error> {
    conn.execute("DELETE FROM issue_labels WHERE issue = ?1", params![number as i64])
        .map_err(sql("replacing issue labels"))?;
    for label in labels {
        conn.prepare_cached("INSERT INTO issue_labels (label, issue) VALUES (?1, ?2)")
            .and_then(|mut s| s.execute(params![label, number as i64]))
            .map_err(sql("recording an issue label"))?;
    }
    Ok(())
}

fn insert(
    conn: &Db<'_>,
    spec: &NewIssue,
    owner_id: Option<i64>,
    reporter_id: i64,
    state: IssueState,
    source: Option<&str>,
) -> Result<u64, Error> {
    let number: i64 = conn
        .query_row("SELECT COALESCE(MAX(number), 0) + 1 FROM issues", [], |r| r.get(0))
        .map_err(sql("numbering an issue"))?;
    let topic = rules::topic(number as u64, &spec.title);
    conn.prepare_cached(
        "INSERT INTO issues (number, title, body, state, owner_id, reporter_id, parent, source, topic, created_at, \
         updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10)",
    )
    .and_then(|mut s| {
        s.execute(params![
            number,
            spec.title,
            spec.body,
            state.as_str(),
            owner_id,
            reporter_id,
            spec.parent.map(|p| p as i64),
            source,
            topic,
            conn.now_ms()
        ])
    })
    .map_err(sql("filing an issue"))?;
    let number = number as u64;
    set_labels(conn, number, &spec.labels)?;
    set_dependencies(conn, number, &spec.depends_on)?;
    Ok(number)
}

/// Files an issue: an operator's for anyone (or nobody: the Supervisor is told to triage it);
/// an agent's for itself, for a descendant as a sub-issue of one it owns, or to its parent.
pub fn file_issue(conn: &Db<'_>, caller: &Caller, spec: &NewIssue) -> Result<(Issue, Changed), Error> {
    let reporter = require_account(conn, "caller", caller.handle.as_str())?;
    if let Some(key) = &spec.idempotency_key {
        let filed: Option<i64> = conn
            .prepare_cached("SELECT number FROM issues WHERE reporter_id = ?1 AND idempotency_key = ?2")
            .and_then(|mut s| s.query_row(params![reporter.id, key], |r| r.get(0)).optional())
            .map_err(sql("reading an issue by its idempotency key"))?;
        if let Some(number) = filed {
            return Ok((issue(conn, number as u64)?, Changed::default()));
        }
    }
    let title = rules::check_title(&spec.title)?;
    let body = rules::check_text("body", &spec.body, true)?;
    let labels = rules::check_labels(&spec.labels)?;
    let owner = match (&spec.owner, caller.is_operator()) {
        (Some(handle), _) => Some(require_account(conn, "owner", handle.as_str())?),
        (None, true) => None,
        (None, false) => Some(reporter.clone()),
    };
    if let Some(owner) = &owner
        && owner.kind == AccountKind::System
    {
        return Err(Error::invalid("owner", "an issue belongs to an agent or an operator"));
    }
    let parent = match spec.parent {
        Some(p) => Some(row(conn, p).map_err(|_| Error::NotFound { field: "parent", what: format!("issue #{p}") })?),
        None => None,
    };
    if let (Some(p), Some(number)) = (&parent, spec.parent)
        && p.state.is_closed()
    {
        return Err(Error::ConflictOn {
            field: "parent",
            reason: format!("#{number} is {}; reopen it first", p.state),
        });
    }
    let to_parent = !caller.is_operator() && owner.as_ref().is_some_and(|o| Some(o.id) == reporter.parent_id);
    if !caller.is_operator() {
        let filing = match &owner {
            Some(o) if o.id == reporter.id => Filing::Own,
            Some(o) if to_parent => Filing::ToParent { parent: &o.handle },
            Some(o) => Filing::ForDescendant { owner: &o.handle },
            None => Filing::Own,
        };
        let under = parent.as_ref().map(|p| p.owner.as_ref().map(|a| &a.handle));
        rules::may_file(caller, &filing, under, &descendants(conn, reporter.id, false)?)?;
    }
    let new = NewIssue { title: title.clone(), body: body.clone(), labels, ..spec.clone() };
    let number = insert(conn, &new, owner.as_ref().map(|o| o.id), reporter.id, IssueState::Open, None)?;
    if let Some(key) = &spec.idempotency_key {
        conn.execute("UPDATE issues SET idempotency_key = ?1 WHERE number = ?2", params![key, number as i64])
            .map_err(sql("recording an issue's idempotency key"))?;
    }
    let mut out = Changed::default();
    let owner_text = owner.as_ref().map(|o| format!("for {}", o.handle)).unwrap_or_else(|| "with no owner".into());
    changed(&mut out, conn, number, reporter.id, "filed", &format!("{title} ({owner_text})"))?;
    let topic = rules::topic(number, &title);
    let by = caller.handle.as_str();
    let told = match &owner {
        Some(o) if o.id != reporter.id => {
            tell(conn, Some(o), &topic, &say::filed(by, number, &title, &body, to_parent, false))?
        }
        Some(_) => None,
        None => tell(conn, supervisor(conn)?.as_ref(), &topic, &say::filed(by, number, &title, &body, false, true))?,
    };
    out.notices.extend(told);
    Ok((issue(conn, number)?, out))
}

/// The last events, one line each, for a new owner.
fn history_lines(conn: &Db<'_>, number: u64) -> Result<Vec<String>, Error> {
    let mut events = events(conn, number, 20)?;
    events.retain(|e| e.kind != "assigned");
    Ok(events
        .iter()
        .map(|e| format!("- {} {} {}: {}", e.at, e.actor, e.kind, canopy_core::redact::cut(&e.text, 300)))
        .collect())
}

/// Gives an issue a new owner; its topic moves to the new owner's home channel with its
/// history, and the previous owner is told.
pub fn assign_issue(
    conn: &Db<'_>,
    caller: &Caller,
    number: u64,
    to: &Handle,
    note: Option<&str>,
) -> Result<(Issue, Changed), Error> {
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    let current = row(conn, number)?;
    let target = require_account(conn, "owner", to.as_str())?;
    if target.kind == AccountKind::System {
        return Err(Error::invalid("owner", "an issue belongs to an agent or an operator"));
    }
    let note = note.map(rules::check_note).transpose()?;
    let note = note.as_deref();
    let owner = current.owner.as_ref().map(|o| &o.handle);
    let is_supervisor = actor.role.as_ref().is_some_and(RoleName::is_supervisor);
    rules::may_reassign(caller, owner, is_supervisor, &descendants(conn, actor.id, true)?)?;
    rules::may_assign(caller, to, &descendants(conn, actor.id, false)?)?;
    if current.state.is_closed() {
        return Err(Error::ConflictOn {
            field: "issue",
            reason: format!("#{number} is {}; reopen it first", current.state),
        });
    }
    if current.owner.as_ref().is_some_and(|o| o.id == target.id) {
        return Err(Error::ConflictOn { field: "owner", reason: format!("#{number} is already {to}'s") });
    }
    conn.execute("UPDATE issues SET owner_id = ?1 WHERE number = ?2", params![target.id, number as i64])
        .map_err(sql("assigning an issue"))?;
    let mut out = Changed::default();
    let from = current.owner.as_ref().map(|o| o.handle.as_str().to_owned()).unwrap_or_else(|| "nobody".into());
    let text = match note {
        Some(note) => format!("{from} -> {to}: {note}"),
        None => format!("{from} -> {to}"),
    };
    changed(&mut out, conn, number, actor.id, "assigned", &text)?;
    let by = caller.handle.as_str();
    if target.id != actor.id {
        let history = history_lines(conn, number)?;
        let body = say::assigned(by, number, &current.title, note, &history);
        out.notices.extend(tell(conn, Some(&target), &current.topic, &body)?);
    }
    if let Some(previous) = current.owner.as_ref().filter(|o| o.id != actor.id) {
        out.notices.extend(tell(conn, Some(previous), &current.topic, &say::taken(by, number, to.as_str()))?);
    }
    Ok((issue(conn, number)?, out))
}

fn open_subissues(conn: &Db<'_>, number: u64) -> Result<Vec<u64>, Error> {
    conn.prepare_cached(
        "SELECT number FROM issues WHERE parent = ?1 AND state NOT IN ('done', 'wontdo') ORDER BY number",
    )
    .and_then(|mut s| s.query_map(params![number as i64], |r| r.get::<_, i64>(0).map(|n| n as u64))?.collect())
    .map_err(sql("reading sub-issues"))
}

/// Changes an issue: a move (owner or operator; with a note, a blocker, a resolution as the
/// move needs) and edits (owner or operator). Closing tells whoever waits for it.
pub fn update_issue(
    conn: &Db<'_>,
    caller: &Caller,
    number: u64,
    change: &IssueChange,
) -> Result<(Issue, Changed), Error> {
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    let current = row(conn, number)?;
    let owner_handle = current.owner.as_ref().map(|o| &o.handle);
    let edits =
        change.labels.is_some() || change.depends_on.is_some() || change.body.is_some() || change.title.is_some();
    if change.state.is_none() && !edits {
        return Err(Error::invalid("state", "name a state to move to, or something to change"));
    }
    if change.state.is_none() && (change.blocker.is_some() || change.resolution.is_some()) {
        return Err(Error::invalid("state", "a blocker or a resolution comes with a move"));
    }
    if edits {
        rules::may_edit(caller, owner_handle, number)?;
    }
    let mut out = Changed::default();
    if let Some(to) = change.state {
        let note = change.note.as_deref().unwrap_or("");
        let requested = Move { to, note, blocker: change.blocker.as_ref(), resolution: change.resolution.as_deref() };
        let open = match to {
            IssueState::Done => open_subissues(conn, number)?,
            _ => Vec::new(),
        };
        rules::may_move(caller, owner_handle, current.state, &requested, &open)?;
        if let Some(Blocker::Issues(on)) = &change.blocker {
            check_exist(conn, "blocked_by", on)?;
            if on.contains(&number) {
                return Err(Error::invalid("blocked_by", format!("#{number} cannot wait for itself")));
            }
        }
        let blocker = match &change.blocker {
            Some(b) => Some(serde_json::to_string(b).map_err(|e| Error::Internal(format!("encoding a blocker: {e}")))?),
            None => None,
        };
        conn.execute(
            "UPDATE issues SET state = ?1, blocker = ?2, resolution = ?3 WHERE number = ?4",
            params![to.as_str(), blocker, change.resolution.as_deref().map(str::trim), number as i64],
        )
        .map_err(sql("moving an issue"))?;
        let mut text = format!("{} -> {to}: {}", current.state, note.trim());
        match (&change.blocker, &change.resolution) {
            (Some(Blocker::Issues(on)), _) => {
                let on: Vec<String> = on.iter().map(|n| format!("#{n}")).collect();
                text.push_str(&format!(" (waits for {})", on.join(", ")));
            }
            (Some(Blocker::Operator { question }), _) => text.push_str(&format!(" (asks the operator: {question})")),
            (None, Some(resolution)) => text.push_str(&format!(" (resolution: {})", resolution.trim())),
            (None, None) => {}
        }
        changed(&mut out, conn, number, actor.id, "moved", &text)?;
        if current.owner.as_ref().is_some_and(|o| o.id != actor.id) {
            let body = say::moved_for_you(caller.handle.as_str(), number, current.state.as_str(), to.as_str(), note);
            out.notices.extend(tell(conn, current.owner.as_ref(), &current.topic, &body)?);
        }
        if to.is_closed() {
            closed(conn, number, &current, to, change.resolution.as_deref().unwrap_or(""), &mut out)?;
        }
    }
    if edits {
        edit(conn, number, actor.id, change, &mut out)?;
    }
    Ok((issue(conn, number)?, out))
}

fn edit(conn: &Db<'_>, number: u64, actor_id: i64, change: &IssueChange, out: &mut Changed) -> Result<(), Error> {
    let mut what = Vec::new();
    if let Some(title) = &change.title {
        let title = rules::check_title(title)?;
        conn.execute("UPDATE issues SET title = ?1 WHERE number = ?2", params![title, number as i64])
            .map_err(sql("retitling an issue"))?;
        what.push(format!("title: {title}"));
    }
    if let Some(body) = &change.body {
        let body = rules::check_text("body", body, true)?;
        conn.execute("UPDATE issues SET body = ?1 WHERE number = ?2", params![body, number as i64])
            .map_err(sql("editing an issue"))?;
        what.push("body".to_owned());
    }
    if let Some(labels) = &change.labels {
        let labels = rules::check_labels(labels)?;
        set_labels(conn, number, &labels)?;
        what.push(format!("labels: {}", labels.join(", ")));
    }
    if let Some(on) = &change.depends_on {
        set_dependencies(conn, number, on)?;
        let on: Vec<String> = on.iter().map(|n| format!("#{n}")).collect();
        what.push(format!("depends on: {}", if on.is_empty() { "nothing".to_owned() } else { on.join(", ") }));
    }
    changed(out, conn, number, actor_id, "edited", &what.join("; "))
}

/// An issue closed: the owners of issues blocked by it or depending on it, and of its parent,
/// are told.
fn closed(
    conn: &Db<'_>,
    number: u64,
    current: &Row,
    to: IssueState,
    resolution: &str,
    out: &mut Changed,
) -> Result<(), Error> {
    let system = system_id(conn)?;
    let waiting: Vec<i64> = conn
        .prepare_cached(
            "SELECT d.issue FROM issue_deps d JOIN issues i ON i.number = d.issue \
             WHERE d.on_issue = ?1 AND i.state NOT IN ('done', 'wontdo') \
             UNION SELECT number FROM issues WHERE state = 'blocked' \
             AND EXISTS (SELECT 1 FROM json_each(json_extract(blocker, '$.issues')) WHERE value = ?1) ORDER BY 1",
        )
        .and_then(|mut s| s.query_map(params![number as i64], |r| r.get(0))?.collect())
        .map_err(sql("finding issues waiting for one"))?;
    for waiter in waiting {
        let waiter = waiter as u64;
        let w = row(conn, waiter)?;
        changed(out, conn, waiter, system, "unblocked", &format!("#{number} is {to}"))?;
        let body = say::unblocked(number, waiter, to.as_str(), resolution);
        out.notices.extend(tell(conn, w.owner.as_ref(), &w.topic, &body)?);
    }
    if let Some(parent) = current.parent {
        let p = row(conn, parent)?;
        changed(out, conn, parent, system, "sub_issue_closed", &format!("#{number} is {to}: {resolution}"))?;
        let body = say::subissue_closed(number, parent, to.as_str(), resolution);
        out.notices.extend(tell(conn, p.owner.as_ref(), &p.topic, &body)?);
    }
    Ok(())
}

/// Adds a comment to an issue's history; it reaches an agent owner (not the commenter) in
/// the issue's topic, where its mentions steer.
pub fn comment_issue(conn: &Db<'_>, caller: &Caller, number: u64, text: &str) -> Result<(Issue, Changed), Error> {
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    let text = rules::check_text("text", text, false)?;
    let current = row(conn, number)?;
    let mut out = Changed::default();
    changed(&mut out, conn, number, actor.id, "commented", &text)?;
    if current.owner.as_ref().is_some_and(|o| o.id != actor.id) {
        let body = say::commented(caller.handle.as_str(), number, &text);
        out.mentioning.extend(tell(conn, current.owner.as_ref(), &current.topic, &body)?);
    }
    Ok((issue(conn, number)?, out))
}

/// Sets or clears an issue's own dollar budget (operators).
pub fn set_issue_budget(
    conn: &Db<'_>,
    caller: &Caller,
    number: u64,
    usd: Option<f64>,
) -> Result<(Issue, Changed), Error> {
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    if let Some(usd) = usd
        && !(usd.is_finite() && usd > 0.0 && usd <= canopy_core::budget::MAX_USD)
    {
        return Err(Error::invalid(
            "usd",
            format!("a budget is more than $0 and at most ${}", canopy_core::budget::MAX_USD),
        ));
    }
    row(conn, number)?;
    conn.execute("UPDATE issues SET budget_usd = ?1 WHERE number = ?2", params![usd, number as i64])
        .map_err(sql("setting an issue budget"))?;
    let mut out = Changed::default();
    let text = usd.map(|u| format!("${u:.2}")).unwrap_or_else(|| "cleared".into());
    changed(&mut out, conn, number, actor.id, "budget", &text)?;
    Ok((issue(conn, number)?, out))
}

/// Files issues from another tracker as `caller`'s (unowned, open or done), skipping any whose
/// source is already here. Returns the new numbers and how many were skipped.
pub fn import_issues(conn: &Db<'_>, caller: &Caller, issues: &[Imported]) -> Result<(Vec<u64>, u32, Changed), Error> {
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    let mut created = Vec::new();
    let (mut skipped, mut open) = (0u32, 0usize);
    let mut out = Changed::default();
    for (index, imported) in issues.iter().enumerate() {
        let exists: bool = conn
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM issues WHERE source = ?1)")
            .and_then(|mut s| s.query_row(params![imported.source], |r| r.get(0)))
            .map_err(sql("reading an imported issue"))?;
        if exists {
            skipped += 1;
            continue;
        }
        let field_error = |e: Error| Error::invalid("issues", format!("item {index} ({}): {e}", imported.source));
        let spec = NewIssue {
            title: rules::check_title(&imported.title).map_err(field_error)?,
            body: rules::check_text("body", &imported.body, true).map_err(field_error)?,
            labels: rules::check_labels(&imported.labels).map_err(field_error)?,
            ..NewIssue::default()
        };
        let state = if imported.closed { IssueState::Done } else { IssueState::Open };
        let number = insert(conn, &spec, None, actor.id, state, Some(&imported.source))?;
        if imported.closed {
            conn.execute(
                "UPDATE issues SET resolution = 'closed before import' WHERE number = ?1",
                params![number as i64],
            )
            .map_err(sql("importing an issue"))?;
        }
        changed(&mut out, conn, number, actor.id, "imported", &imported.source)?;
        created.push(number);
        open += usize::from(!imported.closed);
    }
    if open > 0 {
        let body = say::imported(caller.handle.as_str(), open);
        out.notices.extend(tell(conn, supervisor(conn)?.as_ref(), IMPORT_TOPIC, &body)?);
    }
    Ok((created, skipped, out))
}

/// Whole issues after `after`, lowest number first, and the next page's start.
pub fn export_issues(conn: &Db<'_>, after: u64, limit: usize) -> Result<(Vec<Issue>, Option<u64>), Error> {
    let mut page: Vec<Issue> = conn
        .prepare_cached(&format!("{ISSUE_SELECT} WHERE i.number > ?1 ORDER BY i.number LIMIT ?2"))
        .and_then(|mut s| s.query_map(params![after as i64, limit as i64 + 1], issue_from_row)?.collect())
        .map_err(sql("exporting issues"))?;
    let next = (page.len() > limit).then(|| {
        page.truncate(limit);
        page.last().map(|i| i.number)
    });
    Ok((page, next.flatten()))
}

/// A page of issues by owner, state and label.
pub fn list_issues(conn: &Db<'_>, query: &IssueQuery) -> Result<(Vec<IssueSummary>, Option<u64>), Error> {
    let owners = match &query.owners {
        Owners::Everyone => None,
        Owners::Nobody => Some(Vec::new()),
        Owners::Of(h) => Some(vec![require_account(conn, "owner", h.as_str())?.id]),
        Owners::ReportsOf(h) => {
            let id = require_account(conn, "owner", h.as_str())?.id;
            Some(ids(conn, "SELECT id FROM accounts WHERE parent_id = ?1 AND run_of IS NULL", id)?)
        }
        Owners::SubtreeOf(h) => {
            let id = require_account(conn, "subtree", h.as_str())?.id;
            Some(std::iter::once(id).chain(below(conn, id)?.into_iter().map(|(id, _, _)| id)).collect())
        }
    };
    let mut clauses = vec!["i.number > ?1".to_owned(), "(?6 IS NULL OR i.number < ?6)".to_owned()];
    match (&query.owners, &owners) {
        (Owners::Nobody, _) => clauses.push("i.owner_id IS NULL".into()),
        // A few owners: their rows off `issues_owner`, then sorted. Many (a quarter of the
        // agents or more, a big subtree): their issues are dense, so walking the numbers in
        // order (`+` keeps the owner index out) fills a page sooner than sorting them all.
        (_, Some(ids)) if ids.len() * 4 >= agent_count(conn)? => {
            clauses.push("+i.owner_id IN (SELECT value FROM json_each(?2))".into())
        }
        (_, Some(_)) => clauses.push("i.owner_id IN (SELECT value FROM json_each(?2))".into()),
        (_, None) => {}
    }
    match (query.state, query.include_closed) {
        (Some(_), _) => clauses.push("i.state = ?3".into()),
        (None, false) => clauses.push("i.state NOT IN ('done', 'wontdo')".into()),
        (None, true) => {}
    }
    if query.label.is_some() {
        clauses.push("i.number IN (SELECT issue FROM issue_labels WHERE label = ?4)".into());
    }
    let ids_json = serde_json::to_string(&owners.unwrap_or_default()).map_err(|e| Error::Internal(e.to_string()))?;
    let order = if query.newest { "DESC" } else { "ASC" };
    let sql_text = format!("{SUMMARY_SELECT} WHERE {} ORDER BY i.number {order} LIMIT ?5", clauses.join(" AND "));
    let mut page: Vec<IssueSummary> = conn
        .prepare_cached(&sql_text)
        .and_then(|mut s| {
            s.query_map(
                params![
                    query.after as i64,
                    ids_json,
                    query.state.map(|s| s.as_str()),
                    query.label,
                    query.limit as i64 + 1,
                    query.before.map(|b| b as i64)
                ],
                summary_from_row,
            )?
            .collect()
        })
        .map_err(sql("listing issues"))?;
    let next = match page.len() > query.limit {
        true => {
            page.truncate(query.limit);
            page.last().map(|i| i.number)
        }
        false => None,
    };
    Ok((page, next))
}

/// Agents in the tree (runs excluded), for choosing how to read a subtree's issues.
fn agent_count(conn: &Db<'_>) -> Result<usize, Error> {
    conn.prepare_cached("SELECT COUNT(*) FROM accounts WHERE kind = 'agent' AND run_of IS NULL")
        .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
        .map(|n| n.max(0) as usize)
        .map_err(sql("counting agents"))
}

fn ids(conn: &Db<'_>, query: &str, id: i64) -> Result<Vec<i64>, Error> {
    conn.prepare_cached(query)
        .and_then(|mut s| s.query_map(params![id], |r| r.get(0))?.collect())
        .map_err(sql("reading the tree"))
}

fn events(conn: &Db<'_>, number: u64, newest: usize) -> Result<Vec<IssueEvent>, Error> {
    let mut events: Vec<IssueEvent> = conn
        .prepare_cached(
            "SELECT e.at, a.handle, e.kind, e.text FROM issue_events e JOIN accounts a ON a.id = e.actor_id \
             WHERE e.issue = ?1 ORDER BY e.id DESC LIMIT ?2",
        )
        .and_then(|mut s| {
            s.query_map(params![number as i64, newest as i64], |r| {
                Ok(IssueEvent {
                    at: rfc3339(r.get(0)?),
                    actor: Handle::from_trusted(r.get(1)?),
                    kind: r.get(2)?,
                    text: r.get(3)?,
                })
            })?
            .collect()
        })
        .map_err(sql("reading an issue's history"))?;
    events.reverse();
    Ok(events)
}

/// Each issue as it now is with its newest event (for the event subject, after a link).
pub fn latest_changes(conn: &Db<'_>, numbers: &[u64]) -> Result<Vec<(IssueSummary, IssueEvent)>, Error> {
    let mut out = Vec::new();
    for &number in numbers {
        if let Some(event) = events(conn, number, 1)?.pop() {
            out.push((summary(conn, number)?, event));
        }
    }
    Ok(out)
}

/// An issue's own spend and its sub-issues' (every level).
pub fn issue_spend(conn: &Db<'_>, number: u64) -> Result<IssueSpend, Error> {
    let sums = |query: &str| {
        conn.prepare_cached(query)
            .and_then(|mut s| {
                s.query_row(params![number as i64], |r| Ok((r.get::<_, f64>(0)?, r.get::<_, i64>(1)?.max(0) as u64)))
            })
            .map_err(sql("reading an issue's spend"))
    };
    let tokens = "COALESCE(SUM(input_tokens + output_tokens + cache_write_tokens), 0)";
    let (usd, own_tokens) =
        sums(&format!("SELECT COALESCE(SUM(charged_usd), 0), {tokens} FROM usage WHERE issue = ?1"))?;
    let (sub_usd, sub_tokens) = sums(&format!(
        "WITH RECURSIVE down(n) AS (SELECT number FROM issues WHERE parent = ?1 \
         UNION SELECT i.number FROM issues i JOIN down ON i.parent = down.n) \
         SELECT COALESCE(SUM(charged_usd), 0), {tokens} FROM usage WHERE issue IN down"
    ))?;
    Ok(IssueSpend { usd, tokens: own_tokens, subissues_usd: sub_usd, subissues_tokens: sub_tokens })
}

/// Everything `issues.show` prints about one issue.
pub fn issue_view(conn: &Db<'_>, number: u64) -> Result<IssueView, Error> {
    let issue = issue(conn, number)?;
    let current = row(conn, number)?;
    let subissues: Vec<IssueSummary> = conn
        .prepare_cached(&format!("{SUMMARY_SELECT} WHERE i.parent = ?1 ORDER BY i.number LIMIT 200"))
        .and_then(|mut s| s.query_map(params![number as i64], summary_from_row)?.collect())
        .map_err(sql("reading sub-issues"))?;
    let links = |kind: &str| -> Result<Vec<i64>, Error> {
        conn.prepare_cached("SELECT ref FROM issue_links WHERE issue = ?1 AND kind = ?2 ORDER BY ref")
            .and_then(|mut s| s.query_map(params![number as i64, kind], |r| r.get(0))?.collect())
            .map_err(sql("reading an issue's links"))
    };
    let topic = current.owner.as_ref().filter(|o| o.kind == AccountKind::Agent).map(|_| current.topic.clone());
    Ok(IssueView {
        issue,
        events: events(conn, number, 200)?,
        subissues,
        runs: links("run")?,
        merges: links("merge")?,
        spend: issue_spend(conn, number)?,
        topic,
    })
}

/// Links a new run to an issue the Manager owns, or one owned in its subtree; refused when
/// the issue's own budget is spent.
pub(crate) fn link_run(conn: &Db<'_>, manager: &AccountRef, number: u64, run_id: i64) -> Result<(), Error> {
    let current = row(conn, number)?;
    may_link(conn, manager, &current, number)?;
    if current.state.is_closed() {
        return Err(Error::ConflictOn { field: "issue", reason: format!("#{number} is {}", current.state) });
    }
    if let Some((budget, spent)) = spent_budget(conn, number)? {
        return Err(Error::LimitExceeded(format!(
            "#{number}'s budget is spent (${spent:.2} of ${budget:.2}); runs for it are held until an operator raises it"
        )));
    }
    conn.execute("UPDATE runs SET issue = ?1 WHERE id = ?2", params![number as i64, run_id])
        .map_err(sql("linking a run to an issue"))?;
    conn.execute(
        "INSERT OR IGNORE INTO issue_links (issue, kind, ref) VALUES (?1, 'run', ?2)",
        params![number as i64, run_id],
    )
    .map_err(sql("linking a run to an issue"))?;
    event(conn, number, manager.id, "run", &format!("run-{run_id} briefed"))?;
    Ok(())
}

/// The budget and spend of an issue whose own budget is spent.
fn spent_budget(conn: &Db<'_>, number: u64) -> Result<Option<(f64, f64)>, Error> {
    conn.prepare_cached(
        "SELECT budget_usd, (SELECT COALESCE(SUM(charged_usd), 0) FROM usage WHERE issue = ?1) FROM issues \
         WHERE number = ?1 AND budget_usd IS NOT NULL",
    )
    .and_then(|mut s| {
        s.query_row(params![number as i64], |r| Ok((r.get::<_, f64>(0)?, r.get::<_, f64>(1)?))).optional()
    })
    .map(|found| found.filter(|(budget, spent)| spent >= budget))
    .map_err(sql("reading an issue's budget"))
}

/// Whether the usage row just inserted on this connection spent its issue's own budget: the
/// holds are then re-read at once, as when an agent budget is crossed.
pub(crate) fn last_usage_spent_its_issue(conn: &Db<'_>) -> Result<bool, Error> {
    let any = || {
        conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM issues WHERE budget_usd IS NOT NULL)")
            .and_then(|mut s| s.query_row([], |r| r.get(0)))
            .map_err(sql("looking for issue budgets"))
    };
    let budgets = match conn.memo {
        Some(memo) => memo.any_issue_budget(any)?,
        None => any()?,
    };
    if !budgets {
        return Ok(false);
    }
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM usage u JOIN issues i ON i.number = u.issue \
         WHERE u.id = last_insert_rowid() AND i.budget_usd IS NOT NULL \
         AND (SELECT COALESCE(SUM(charged_usd), 0) FROM usage WHERE issue = i.number) >= i.budget_usd)",
    )
    .and_then(|mut s| s.query_row([], |r| r.get(0)))
    .map_err(sql("checking an issue's budget"))
}

/// The handles of running runs whose issue's budget is spent, with why (for the budget holds).
pub(crate) fn held_runs(conn: &Db<'_>) -> Result<Vec<(String, String)>, Error> {
    conn.prepare_cached(
        "SELECT a.handle, i.number, i.budget_usd FROM runs r JOIN accounts a ON a.id = r.account_id \
         JOIN issues i ON i.number = r.issue WHERE r.ended_at IS NULL AND i.budget_usd IS NOT NULL \
         AND (SELECT COALESCE(SUM(charged_usd), 0) FROM usage WHERE issue = i.number) >= i.budget_usd",
    )
    .and_then(|mut s| {
        s.query_map([], |r| {
            let (handle, number, budget): (String, i64, f64) = (r.get(0)?, r.get(1)?, r.get(2)?);
            Ok((handle, format!("issue #{number}'s budget of ${budget:.2} is spent")))
        })?
        .collect()
    })
    .map_err(sql("reading spent issue budgets"))
}

/// Checks that `by` may link issue `number`: its own, or one a descendant of its owns.
fn may_link(conn: &Db<'_>, by: &AccountRef, current: &Row, number: u64) -> Result<(), Error> {
    let caller = Caller { handle: by.handle.clone(), kind: by.kind };
    let owner = current.owner.as_ref().map(|o| &o.handle);
    rules::may_link(&caller, owner, number, &descendants(conn, by.id, true)?)
}

/// Links a merge request to issues its requester (or one of its reports) owns.
pub(crate) fn link_merge(conn: &Db<'_>, requester: &AccountRef, issues: &[u64], merge_id: i64) -> Result<(), Error> {
    if issues.len() > 20 {
        return Err(Error::invalid("issues", "at most 20 issues"));
    }
    for &number in issues.iter().collect::<BTreeSet<_>>() {
        let current = match row(conn, number) {
            Err(Error::NotFound { what, .. }) => return Err(Error::NotFound { field: "issues", what }),
            other => other?,
        };
        may_link(conn, requester, &current, number)?;
        conn.execute(
            "INSERT OR IGNORE INTO issue_links (issue, kind, ref) VALUES (?1, 'merge', ?2)",
            params![number as i64, merge_id],
        )
        .map_err(sql("linking a merge request to an issue"))?;
        event(conn, number, requester.id, "merge", &format!("merge-{merge_id} asks to land it"))?;
    }
    Ok(())
}

/// A merge landed: each linked issue's owner is told; the issue stays as it is.
pub fn merge_landed(conn: &Db<'_>, merge_id: i64, commit: &str) -> Result<Changed, Error> {
    let linked: Vec<i64> = conn
        .prepare_cached("SELECT issue FROM issue_links WHERE kind = 'merge' AND ref = ?1 ORDER BY issue")
        .and_then(|mut s| s.query_map(params![merge_id], |r| r.get(0))?.collect())
        .map_err(sql("reading a merge request's issues"))?;
    let system = system_id(conn)?;
    let mut out = Changed::default();
    for number in linked {
        let number = number as u64;
        let current = row(conn, number)?;
        let merge = format!("merge-{merge_id}");
        changed(
            &mut out,
            conn,
            number,
            system,
            "landed",
            &format!("{merge} landed ({})", &commit[..commit.len().min(10)]),
        )?;
        out.notices.extend(tell(conn, current.owner.as_ref(), &current.topic, &say::landed(&merge, number, commit))?);
    }
    Ok(out)
}

/// The issue a usage row of agent `?1` counts toward, as an SQL expression: a run's issue;
/// else the agent's one `in_progress` issue when it has exactly one; else none (unattributed).
pub(crate) const USAGE_ISSUE: &str = "COALESCE((SELECT issue FROM runs WHERE account_id = ?1), \
    (SELECT CASE WHEN COUNT(*) = 1 THEN MAX(number) END FROM \
    (SELECT number FROM issues WHERE owner_id = ?1 AND state = 'in_progress' LIMIT 2)))";

/// Issues blocked on the operator's answer: every one, or `owner`'s.
pub fn waiting_issues(conn: &Db<'_>, owner: Option<&Handle>) -> Result<Vec<IssueSummary>, Error> {
    let owner_id = match owner {
        Some(h) => Some(require_account(conn, "owner", h.as_str())?.id),
        None => None,
    };
    conn.prepare_cached(&format!(
        "{SUMMARY_SELECT} WHERE i.state = 'blocked' AND json_extract(i.blocker, '$.operator') IS NOT NULL \
         AND (?1 IS NULL OR i.owner_id = ?1) ORDER BY i.number LIMIT 200"
    ))
    .and_then(|mut s| s.query_map(params![owner_id], summary_from_row)?.collect())
    .map_err(sql("reading issues waiting on the operator"))
}
