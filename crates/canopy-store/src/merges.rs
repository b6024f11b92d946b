//! Merge requests, their reviews and the merge queue: their facts, not their git.
//!
//! A request goes `checking` (the daemon checks its merged tree), then `in_review` (the
//! repository requires a review and has no `approve` on this head, or the newest verdict asked
//! for changes) or `pending` (posted for the operators in the requester's home channel under
//! `merge: <title>`). Only an operator's approval moves it on, into its repository's queue
//! (`queued`); the queue takes one entry at a time (`merging`: merged onto the base in a
//! scratch tree, every check run there) and records `merged` or `refused`. A denial is
//! `denied`. An agent's attempt to decide is refused, audited and told to the operators, and
//! that record commits although the attempt fails. Asking again with the same title while the
//! request is undecided takes the branch's new head and checks it again.
//!
//! The git is the daemon's (`canopy-git`); the rules and the sentences are
//! `canopy_core::repos`'s and `canopy_core::review`'s.

use canopy_core::acl::Caller;
use canopy_core::repos::{self as rules, say};
use canopy_core::review::{self, Review, ReviewComment, ReviewPolicy, Verdict};
use canopy_core::{AccountKind, Error, Handle, MergeRequest, MergeState, Message, TopicName};
use rusqlite::{OptionalExtension, params};

use crate::notices::notice_in_home;
use crate::schema::audit;
use crate::views::{parse_enum, require_account};
use crate::{Db, rfc3339, sql};

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
    /// The head that was checked: a request whose head moved since is checked again.
    pub head: String,
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
     g.state, g.commits, g.diffstat, g.check_result, d.handle, g.note, g.merged_commit, g.created_at, g.decided_at, \
     (SELECT v.verdict FROM reviews v WHERE v.merge_id = g.id AND v.head = g.head AND v.state = 'submitted' \
      ORDER BY v.id DESC LIMIT 1), g.override, g.queued_at \
     FROM merges g JOIN accounts q ON q.id = g.requester_id JOIN repos r ON r.id = g.repo_id \
     LEFT JOIN accounts d ON d.id = g.decided_by";

fn merge_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<MergeRequest> {
    let split = |s: String| s.split('\n').filter(|l| !l.is_empty()).map(str::to_owned).collect::<Vec<_>>();
    let verdict: Option<String> = r.get(18)?;
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
        verdict: verdict.as_deref().and_then(Verdict::parse),
        override_reason: r.get(19)?,
        queued_at: r.get::<_, Option<i64>>(20)?.map(rfc3339),
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

/// Every request not yet decided or landed (checking, in review, pending, queued, merging),
/// oldest first: the live branches the conflict scan test-merges.
pub fn open_merges(conn: &Db<'_>, repo_id: i64) -> Result<Vec<MergeRequest>, Error> {
    let mut s = conn
        .prepare_cached(&format!(
            "{MERGE_SELECT} WHERE g.repo_id = ?1 AND g.state IN ('checking', 'in_review', 'pending', 'queued', 'merging') \
             ORDER BY g.id"
        ))
        .map_err(sql("listing open merge requests"))?;
    s.query_map(params![repo_id], merge_from_row)
        .and_then(|rows| rows.collect())
        .map_err(sql("listing open merge requests"))
}

/// A repository's queue in order: the entry merging first, then those queued.
pub fn merge_queue(conn: &Db<'_>, repo_id: Option<i64>) -> Result<Vec<MergeRequest>, Error> {
    let mut s = conn
        .prepare_cached(&format!(
            "{MERGE_SELECT} WHERE (?1 IS NULL OR g.repo_id = ?1) AND g.state IN ('queued', 'merging') \
             ORDER BY r.name, g.state = 'queued', g.queued_at, g.id"
        ))
        .map_err(sql("reading the merge queue"))?;
    s.query_map(params![repo_id], merge_from_row)
        .and_then(|rows| rows.collect())
        .map_err(sql("reading the merge queue"))
}

/// Repositories with entries in their queue (a restarted daemon resumes each).
pub fn queued_repos(conn: &Db<'_>) -> Result<Vec<i64>, Error> {
    conn.prepare_cached("SELECT DISTINCT repo_id FROM merges WHERE state IN ('queued', 'merging') ORDER BY repo_id")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("finding queues"))
}

/// The base commit a request's check ran against, and whether it passed.
pub fn merge_checked_base(conn: &Db<'_>, id: i64) -> Result<(String, bool), Error> {
    conn.query_row("SELECT base_commit, check_passed FROM merges WHERE id = ?1", params![id], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })
    .map_err(sql("reading a merge request's check"))
}

/// Records a Manager's request (state `checking`); its dependencies must be its own. An
/// undecided request of the same title takes the new head and is checked again.
pub fn request_merge(conn: &Db<'_>, caller: &Caller, spec: &MergeSpec) -> Result<MergeRequest, Error> {
    if caller.kind != AccountKind::Agent {
        return Err(Error::invalid("caller", "operators merge with git directly; merge requests are agents'"));
    }
    let requester = require_account(conn, "caller", caller.handle.as_str())?;
    let open: Option<(i64, String)> = conn
        .query_row(
            "SELECT id, state FROM merges WHERE requester_id = ?1 AND title = ?2 \
             AND state IN ('checking', 'in_review', 'pending', 'queued', 'merging')",
            params![requester.id, spec.title],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(sql("checking a title"))?;
    for dep in &spec.depends_on {
        let below =
            load_merge(conn, *dep).map_err(|_| Error::invalid("depends_on", format!("merge-{dep} does not exist")))?;
        if below.requester != caller.handle {
            return Err(Error::invalid("depends_on", format!("merge-{dep} is {}'s, not yours", below.requester)));
        }
        let dep_repo: i64 = conn
            .query_row("SELECT repo_id FROM merges WHERE id = ?1", params![dep], |r| r.get(0))
            .map_err(sql("reading a merge request's repository"))?;
        if dep_repo != spec.repo_id {
            return Err(Error::invalid("depends_on", format!("merge-{dep} is for another repository")));
        }
        // A stack only points down: an updated request stays above what it depends on.
        if open.as_ref().is_some_and(|(own, _)| dep >= own) {
            return Err(Error::invalid("depends_on", format!("merge-{dep} is not below this request")));
        }
        if matches!(below.state, MergeState::Denied | MergeState::Refused) {
            return Err(Error::ConflictOn {
                field: "depends_on",
                reason: format!("merge-{dep} is {}; it will never merge", below.state),
            });
        }
    }
    let deps: Vec<String> = spec.depends_on.iter().map(i64::to_string).collect();
    let id = match open {
        Some((id, state)) if state == "queued" || state == "merging" => {
            return Err(Error::ConflictOn {
                field: "title",
                reason: format!("merge-{id} ({:?}) is approved and {state}; ask under a new title", spec.title),
            });
        }
        Some((id, _)) => {
            conn.execute(
                "UPDATE merges SET branch = ?1, head = ?2, summary = ?3, depends_on = ?4, state = 'checking', \
                 check_result = '', check_passed = 0, commits = '', diffstat = '', base_commit = '' WHERE id = ?5",
                params![spec.branch, spec.head, spec.summary, deps.join(","), id],
            )
            .map_err(sql("updating a merge request"))?;
            audit(conn, Some(requester.id), "merges.update", &format!("merge-{id}"), &format!("head={}", spec.head))?;
            id
        }
        None => {
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
            audit(
                conn,
                Some(requester.id),
                "merges.request",
                &format!("merge-{id}"),
                &format!("branch={} head={}", spec.branch, spec.head),
            )?;
            id
        }
    };
    crate::issues::link_merge(conn, &requester, &spec.issues, id)?;
    load_merge(conn, id)
}

fn post_about(conn: &Db<'_>, request: &MergeRequest, body: &str) -> Result<Message, Error> {
    let requester = require_account(conn, "requester", request.requester.as_str())?;
    notice_in_home(conn, requester.id, &TopicName::from_trusted(rules::merge_topic(&request.title)), body)
}

fn operator_handles(conn: &Db<'_>) -> Result<Vec<String>, Error> {
    conn.prepare_cached("SELECT handle FROM accounts WHERE kind = 'operator' AND state != 'despawned' ORDER BY handle")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("listing operators"))
}

fn repo_policy(conn: &Db<'_>, merge_id: i64) -> Result<ReviewPolicy, Error> {
    let policy: String = conn
        .query_row(
            "SELECT r.review FROM merges g JOIN repos r ON r.id = g.repo_id WHERE g.id = ?1",
            params![merge_id],
            |r| r.get(0),
        )
        .map_err(sql("reading a repository's review policy"))?;
    Ok(ReviewPolicy::parse(&policy).unwrap_or_default())
}

/// Whether a checked request waits for a review (`in_review`) or for the operator (`pending`).
fn settled_state(policy: ReviewPolicy, verdict: Option<Verdict>) -> MergeState {
    match review::override_needed(policy, verdict) {
        Some(_) => MergeState::InReview,
        None => MergeState::Pending,
    }
}

/// Records the check of a request's merged tree (unless its head moved since: the newer head
/// is being checked) and posts the request for the operators.
pub fn merge_checked(conn: &Db<'_>, id: i64, check: &MergeCheck) -> Result<Option<(MergeRequest, Message)>, Error> {
    let before = load_merge(conn, id)?;
    if before.state != MergeState::Checking || before.head != check.head {
        return Ok(None);
    }
    let state = settled_state(repo_policy(conn, id)?, before.verdict);
    conn.execute(
        "UPDATE merges SET state = ?1, base_commit = ?2, commits = ?3, diffstat = ?4, check_result = ?5, \
         check_passed = ?6, pending_since = CASE WHEN ?1 = 'pending' THEN ?8 ELSE pending_since END WHERE id = ?7",
        params![
            state.as_str(),
            check.base_commit,
            check.commits.join("\n"),
            check.diffstat,
            check.check,
            check.passed,
            id,
            conn.now_ms()
        ],
    )
    .map_err(sql("recording a merge check"))?;
    let request = load_merge(conn, id)?;
    let notice = post_about(conn, &request, &say::requested(&operator_handles(conn)?, &request))?;
    Ok(Some((request, notice)))
}

/// What a decision did: the request, Canopy's posts, and for a refused attempt the error.
#[derive(Debug)]
pub struct MergeDecided {
    pub request: MergeRequest,
    pub notices: Vec<Message>,
    pub refused: Option<Error>,
    /// Approved: it is in its repository's queue, which the daemon now works.
    pub queued: bool,
}

/// An operator's decision, or an agent's refused and audited attempt at one. Approving puts
/// the request in its repository's queue; approving over a missing or negative verdict needs
/// `override_reason`, which is recorded.
pub fn decide_merge(
    conn: &Db<'_>,
    caller: &Caller,
    id: i64,
    approve: bool,
    note: Option<String>,
    override_reason: Option<String>,
) -> Result<MergeDecided, Error> {
    let request = load_merge(conn, id)?;
    let actor = require_account(conn, "caller", caller.handle.as_str())?;
    if let Err(error) = rules::may_decide(caller, approve, &request.id) {
        let action = format!("merges.{}.refused", if approve { "approve" } else { "deny" });
        audit(conn, Some(actor.id), &action, &request.id, "an agent tried to decide")?;
        let notice = post_about(conn, &request, &say::attempt(caller.handle.as_str(), approve, &request))?;
        return Ok(MergeDecided { request, notices: vec![notice], refused: Some(error), queued: false });
    }
    rules::check_decidable(&request, approve)?;
    let now = conn.now_ms();
    if !approve {
        conn.execute(
            "UPDATE merges SET state = 'denied', decided_by = ?1, note = ?2, decided_at = ?3 WHERE id = ?4",
            params![actor.id, note, now, id],
        )
        .map_err(sql("denying a merge request"))?;
        audit(conn, Some(actor.id), "merges.deny", &request.id, note.as_deref().unwrap_or(""))?;
        let notice = post_about(conn, &request, &say::denied(caller.handle.as_str(), &request, note.as_deref()))?;
        return Ok(MergeDecided {
            request: load_merge(conn, id)?,
            notices: vec![notice],
            refused: None,
            queued: false,
        });
    }
    if let Some(why) = review::override_needed(repo_policy(conn, id)?, request.verdict)
        && override_reason.is_none()
    {
        return Err(Error::ConflictOn {
            field: "override",
            reason: format!("{}: {why}; approve it with an override reason to merge it anyway", request.id),
        });
    }
    let below = stack_states(conn, &request)?;
    rules::check_stack(&request, &below)?;
    conn.execute(
        "UPDATE merges SET state = 'queued', decided_by = ?1, decided_at = ?2, queued_at = ?2, override = ?3 WHERE id = ?4",
        params![actor.id, now, override_reason, id],
    )
    .map_err(sql("approving a merge request"))?;
    let detail = override_reason.as_deref().map(|r| format!("override: {r}")).unwrap_or_default();
    audit(conn, Some(actor.id), "merges.approve", &request.id, &detail)?;
    let request = load_merge(conn, id)?;
    let ahead: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM merges WHERE repo_id = (SELECT repo_id FROM merges WHERE id = ?1) \
             AND state IN ('queued', 'merging') AND id != ?1",
            params![id],
            |r| r.get(0),
        )
        .map_err(sql("reading the merge queue"))?;
    let notice = post_about(conn, &request, &say::queued(caller.handle.as_str(), &request, ahead as usize))?;
    Ok(MergeDecided { request, notices: vec![notice], refused: None, queued: true })
}

fn stack_states(conn: &Db<'_>, request: &MergeRequest) -> Result<Vec<(String, MergeState)>, Error> {
    request
        .depends_on
        .iter()
        .map(|dep| {
            let n = rules::parse_merge_id("depends_on", dep)?;
            Ok((dep.clone(), load_merge(conn, n)?.state))
        })
        .collect()
}

/// What the queue does next in one repository.
#[derive(Debug, Default)]
pub struct QueueStep {
    /// The entry now `merging` (the one a stopped daemon left merging, or the oldest queued
    /// whose stack below has merged), if any.
    pub next: Option<MergeRequest>,
    /// Entries refused on the way (their stack below was denied or refused), and their notices.
    pub refused: Vec<MergeRequest>,
    pub notices: Vec<Message>,
}

/// Takes repository `repo_id`'s next queue entry: refuses those whose stack below will never
/// merge, skips those whose stack below has not merged yet, and marks the first ready one
/// `merging`.
pub fn queue_next(conn: &Db<'_>, repo_id: i64) -> Result<QueueStep, Error> {
    let mut step = QueueStep::default();
    for request in merge_queue(conn, Some(repo_id))? {
        let id = merge_number(&request);
        if request.state == MergeState::Merging {
            step.next = Some(request);
            return Ok(step);
        }
        let below = stack_states(conn, &request)?;
        if let Some((dep, state)) = below.iter().find(|(_, s)| matches!(s, MergeState::Denied | MergeState::Refused)) {
            let why = format!("it depends on {dep}, which is {state}, so it cannot merge on top of it");
            conn.execute("UPDATE merges SET state = 'refused', note = ?1 WHERE id = ?2", params![why, id])
                .map_err(sql("refusing a queued merge"))?;
            audit(conn, None, "merges.refused", &request.id, &why)?;
            let operator = request.decided_by.as_ref().map(Handle::as_str).unwrap_or("an operator").to_owned();
            step.notices.push(post_about(conn, &request, &say::refused(&operator, &request, &why))?);
            step.refused.push(load_merge(conn, id)?);
            continue;
        }
        if below.iter().all(|(_, s)| *s == MergeState::Merged) {
            conn.execute("UPDATE merges SET state = 'merging' WHERE id = ?1 AND state = 'queued'", params![id])
                .map_err(sql("taking a queued merge"))?;
            step.next = Some(load_merge(conn, id)?);
            return Ok(step);
        }
    }
    Ok(step)
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

/// What a restarted daemon picks up: requests to check again, and queues to resume.
#[derive(Debug, Default)]
pub struct Recovered {
    pub checking: Vec<i64>,
    pub queues: Vec<i64>,
    pub notices: Vec<Message>,
}

/// At start: a request left `merging` by a stopped daemon stays at the head of its queue (the
/// queue checks whether it already landed before merging anything), one left `checking` is
/// checked again, and a reviewer run that ended with the daemon is no longer awaited.
pub fn recover_merges(conn: &Db<'_>) -> Result<Recovered, Error> {
    let mut out = Recovered::default();
    let merging: Vec<i64> = conn
        .prepare_cached("SELECT id FROM merges WHERE state = 'merging'")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("finding interrupted merges"))?;
    for id in merging {
        let request = load_merge(conn, id)?;
        out.notices.push(post_about(conn, &request, &say::interrupted(&request))?);
    }
    out.checking = conn
        .prepare_cached("SELECT id FROM merges WHERE state = 'checking'")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("finding unchecked merges"))?;
    out.queues = queued_repos(conn)?;
    Ok(out)
}

/// The newest request discussed in `topic` of `channel` (a requester's home).
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

// ---- reviews ----

const REVIEW_SELECT: &str = "SELECT v.id, v.merge_id, v.head, a.handle, v.run_id, v.focus, v.state, v.verdict, \
     v.summary, v.comments, v.created_at, v.submitted_at FROM reviews v JOIN accounts a ON a.id = v.reviewer_id";

fn review_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Review> {
    let verdict: Option<String> = r.get(7)?;
    let comments: String = r.get(9)?;
    Ok(Review {
        id: format!("review-{}", r.get::<_, i64>(0)?),
        merge: format!("merge-{}", r.get::<_, i64>(1)?),
        head: r.get(2)?,
        reviewer: r.get(3)?,
        run_id: r.get(4)?,
        focus: r.get(5)?,
        state: r.get(6)?,
        verdict: verdict.as_deref().and_then(Verdict::parse),
        summary: r.get(8)?,
        comments: serde_json::from_str(&comments).unwrap_or_default(),
        created_at: rfc3339(r.get(10)?),
        submitted_at: r.get::<_, Option<i64>>(11)?.map(rfc3339),
    })
}

/// A merge request's reviews, oldest first.
pub fn reviews_of(conn: &Db<'_>, merge_id: i64) -> Result<Vec<Review>, Error> {
    let mut s = conn
        .prepare_cached(&format!("{REVIEW_SELECT} WHERE v.merge_id = ?1 ORDER BY v.id"))
        .map_err(sql("reading reviews"))?;
    s.query_map(params![merge_id], review_from_row).and_then(|rows| rows.collect()).map_err(sql("reading reviews"))
}

/// Records a reviewer run started on a request at `head`, the head whose merged tree it reads;
/// refused if the request has moved to another head meanwhile.
pub fn start_review(conn: &Db<'_>, merge_id: i64, run_id: i64, head: &str, focus: &str) -> Result<Review, Error> {
    let request = load_merge(conn, merge_id)?;
    if request.head != head {
        return Err(Error::ConflictOn {
            field: "merge_request",
            reason: format!("{} moved to a new head while its review started; ask for a review again", request.id),
        });
    }
    let reviewer: i64 = conn
        .query_row("SELECT account_id FROM runs WHERE id = ?1", params![run_id], |r| r.get(0))
        .map_err(sql("finding a reviewer run"))?;
    conn.execute(
        "INSERT INTO reviews (merge_id, head, reviewer_id, run_id, focus, state, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, 'running', ?6)",
        params![merge_id, request.head, reviewer, run_id, focus, conn.now_ms()],
    )
    .map_err(sql("recording a review"))?;
    let id = conn.last_insert_rowid();
    conn.prepare_cached(&format!("{REVIEW_SELECT} WHERE v.id = ?1"))
        .and_then(|mut s| s.query_row(params![id], review_from_row))
        .map_err(sql("reading a review"))
}

/// A review submitted: the review, the request after it, and the notices it committed.
#[derive(Debug)]
pub struct Submitted {
    pub review: Review,
    pub request: MergeRequest,
    pub notices: Vec<Message>,
}

/// A reviewer run's verdict on the request it was started for. A verdict on the current head
/// settles the request: `approve` moves one in review to pending (posted for the operators),
/// `changes_requested` moves a pending one back to review. One on an older head is kept, and
/// changes nothing.
pub fn submit_review(
    conn: &Db<'_>,
    caller: &Caller,
    verdict: Verdict,
    summary: &str,
    comments: &[ReviewComment],
) -> Result<Submitted, Error> {
    review::check_submission(summary, comments)?;
    let reviewer = require_account(conn, "caller", caller.handle.as_str())?;
    let found: Option<(i64, i64)> = conn
        .query_row(
            "SELECT id, merge_id FROM reviews WHERE reviewer_id = ?1 AND state = 'running' ORDER BY id DESC LIMIT 1",
            params![reviewer.id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(sql("finding a review"))?;
    let Some((review_id, merge_id)) = found else {
        return Err(Error::Forbidden {
            action: "review_submit".into(),
            reason: "only a reviewer run started for a merge request submits a verdict, once".into(),
        });
    };
    let encoded = serde_json::to_string(comments).map_err(|e| Error::Internal(format!("encoding comments: {e}")))?;
    conn.execute(
        "UPDATE reviews SET state = 'submitted', verdict = ?1, summary = ?2, comments = ?3, submitted_at = ?4 WHERE id = ?5",
        params![verdict.as_str(), summary.trim(), encoded, conn.now_ms(), review_id],
    )
    .map_err(sql("recording a verdict"))?;
    let request = load_merge(conn, merge_id)?;
    audit(conn, Some(reviewer.id), "reviews.submit", &request.id, verdict.as_str())?;
    let mut notices = vec![post_about(
        conn,
        &request,
        &review::say::submitted(&request.id, caller.handle.as_str(), verdict, summary.trim(), comments),
    )?];
    if matches!(request.state, MergeState::InReview | MergeState::Pending) {
        let next = settled_state(repo_policy(conn, merge_id)?, request.verdict);
        if next != request.state {
            conn.execute(
                "UPDATE merges SET state = ?1, pending_since = CASE WHEN ?1 = 'pending' THEN ?3 ELSE pending_since END \
                 WHERE id = ?2",
                params![next.as_str(), merge_id, conn.now_ms()],
            )
            .map_err(sql("settling a merge request's review"))?;
            if next == MergeState::Pending {
                let request = load_merge(conn, merge_id)?;
                notices.push(post_about(conn, &request, &say::requested(&operator_handles(conn)?, &request))?);
            }
        }
    }
    let review = conn
        .prepare_cached(&format!("{REVIEW_SELECT} WHERE v.id = ?1"))
        .and_then(|mut s| s.query_row(params![review_id], review_from_row))
        .map_err(sql("reading a review"))?;
    Ok(Submitted { review, request: load_merge(conn, merge_id)?, notices })
}

/// A reviewer run ended: its review, if still awaited, is abandoned and the requester told.
pub fn end_review_of_run(conn: &Db<'_>, run_id: i64, why: &str) -> Result<Option<Message>, Error> {
    let found: Option<(i64, i64)> = conn
        .query_row("SELECT id, merge_id FROM reviews WHERE run_id = ?1 AND state = 'running'", params![run_id], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .map_err(sql("finding a run's review"))?;
    let Some((review_id, merge_id)) = found else { return Ok(None) };
    conn.execute("UPDATE reviews SET state = 'abandoned' WHERE id = ?1", params![review_id])
        .map_err(sql("abandoning a review"))?;
    let request = load_merge(conn, merge_id)?;
    Ok(Some(post_about(conn, &request, &review::say::abandoned(&request.id, run_id, why))?))
}

/// The issues a merge request works on: number and title, lowest first.
pub fn merge_issues(conn: &Db<'_>, merge_id: i64) -> Result<Vec<(u64, String)>, Error> {
    conn.prepare_cached(
        "SELECT i.number, i.title FROM issue_links l JOIN issues i ON i.number = l.issue \
         WHERE l.kind = 'merge' AND l.ref = ?1 ORDER BY i.number",
    )
    .and_then(|mut s| s.query_map(params![merge_id], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))?.collect())
    .map_err(sql("reading a merge request's issues"))
}
