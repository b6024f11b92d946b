//! The issue ledger's rules (DESIGN section 17), decided from values: an issue's states and the
//! moves between them, who may move, close, assign and file, what blocks an issue, `done`
//! waiting for every sub-issue, and dependency cycles refused naming the cycle.
//!
//! Decides nothing about storage or delivery, reads no clock, and knows an account only as the
//! `Caller` and the tree facts the caller read; the store checks these rules against the tree in
//! each change's transaction.

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::acl::Caller;
use crate::macros::string_enum;
use crate::{Error, Handle};

/// Longest resolution line, in bytes.
pub const MAX_RESOLUTION: usize = 1000;
/// Longest note on a move, in bytes.
pub const MAX_NOTE: usize = 4000;

/// Where an issue is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IssueState {
    Open,
    InProgress,
    Blocked,
    InReview,
    Done,
    Wontdo,
}
string_enum!(IssueState {
    Open => "open",
    InProgress => "in_progress",
    Blocked => "blocked",
    InReview => "in_review",
    Done => "done",
    Wontdo => "wontdo",
});

impl IssueState {
    /// `done` or `wontdo`: the issue is closed.
    pub fn is_closed(self) -> bool {
        matches!(self, IssueState::Done | IssueState::Wontdo)
    }
}

/// What a `blocked` issue waits for: other issues, or the operator's answer to a question.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Blocker {
    Issues(Vec<u64>),
    Operator { question: String },
}

/// A requested move, with what it must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move<'a> {
    pub to: IssueState,
    /// Why; every move carries one.
    pub note: &'a str,
    /// For `blocked`: what blocks it.
    pub blocker: Option<&'a Blocker>,
    /// For `done` and `wontdo`: the resolution line.
    pub resolution: Option<&'a str>,
}

/// Whether `from` may move to `to` at all (who may move is `may_move`'s).
pub fn allowed(from: IssueState, to: IssueState) -> bool {
    use IssueState::*;
    match (from, to) {
        (a, b) if a == b => false,
        // A closed issue only reopens.
        (Done | Wontdo, Open) => true,
        (Done | Wontdo, _) => false,
        // `done` is reached from work, review or a cleared block, never straight from `open`.
        (Open, Done) => false,
        _ => true,
    }
}

/// Checks a move of an issue owned by `owner` (`None`: nobody) by `caller`: only the owner or an
/// operator moves or closes it, the move must be allowed, carry a note, name its blocker when it
/// blocks, and a resolution line when it closes. `open_subissues` are the issue's sub-issues not
/// closed; `done` waits for all of them.
pub fn may_move(
    caller: &Caller,
    owner: Option<&Handle>,
    from: IssueState,
    change: &Move<'_>,
    open_subissues: &[u64],
) -> Result<(), Error> {
    let what = format!("move the issue to {}", change.to);
    if !caller.is_operator() && owner != Some(&caller.handle) {
        let reason = match owner {
            Some(owner) => format!("it is @{owner}'s; only its owner or an operator moves it"),
            None => "it has no owner; only an operator moves it".to_owned(),
        };
        return Err(Error::Forbidden { action: what, reason });
    }
    if !allowed(from, change.to) {
        return Err(Error::ConflictOn {
            field: "state",
            reason: format!("an issue {from} cannot move to {}", change.to),
        });
    }
    one_line("note", change.note, MAX_NOTE, true)?;
    match (change.to, change.blocker) {
        (IssueState::Blocked, None) => {
            return Err(Error::invalid("blocked_by", "a blocked issue names what blocks it: issues or a question"));
        }
        (IssueState::Blocked, Some(blocker)) => check_blocker(blocker)?,
        (_, Some(_)) => return Err(Error::invalid("blocked_by", "only a move to blocked names a blocker")),
        (_, None) => {}
    }
    match (change.to.is_closed(), change.resolution) {
        (true, None) => return Err(Error::invalid("resolution", "closing an issue takes a resolution line")),
        (true, Some(line)) => one_line("resolution", line, MAX_RESOLUTION, false)?,
        (false, Some(_)) => return Err(Error::invalid("resolution", "only closing an issue takes a resolution")),
        (false, None) => {}
    }
    if change.to == IssueState::Done && !open_subissues.is_empty() {
        let open: Vec<String> = open_subissues.iter().map(|n| format!("#{n}")).collect();
        return Err(Error::ConflictOn {
            field: "state",
            reason: format!("its sub-issues {} are not closed yet", open.join(", ")),
        });
    }
    Ok(())
}

fn check_blocker(blocker: &Blocker) -> Result<(), Error> {
    match blocker {
        Blocker::Issues(issues) if issues.is_empty() => {
            Err(Error::invalid("blocked_by", "name at least one issue, or ask the operator a question"))
        }
        Blocker::Issues(issues) if issues.len() > MAX_DEPENDS_ON => {
            Err(Error::invalid("blocked_by", format!("at most {MAX_DEPENDS_ON} issues")))
        }
        Blocker::Issues(_) => Ok(()),
        Blocker::Operator { question } => one_line("question", question, MAX_NOTE, true),
    }
}

/// Text that is not empty and within `max` bytes; with `multiline` false, one line.
fn one_line(field: &'static str, text: &str, max: usize, multiline: bool) -> Result<(), Error> {
    if text.trim().is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if text.len() > max {
        return Err(Error::TooLarge { field, len: text.len(), max });
    }
    if !multiline && text.trim().chars().any(char::is_control) {
        return Err(Error::invalid(field, "is one line of text, without control characters"));
    }
    Ok(())
}

/// Checks an assignment: an operator assigns to anyone; an agent only to itself or one of its
/// descendants (`descendants`, read by the caller from the tree).
pub fn may_assign(caller: &Caller, to: &Handle, descendants: &BTreeSet<Handle>) -> Result<(), Error> {
    if caller.is_operator() || *to == caller.handle || descendants.contains(to) {
        return Ok(());
    }
    Err(Error::Forbidden {
        action: format!("assign an issue to @{to}"),
        reason: format!("@{to} is not @{} or one of its descendants", caller.handle),
    })
}

/// Where an agent files a new issue, and as whose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filing<'a> {
    /// For itself.
    Own,
    /// For a descendant, as a sub-issue of one the caller owns.
    ForDescendant { owner: &'a Handle },
    /// Up the tree: owned by the caller's parent (`parent`), `open`, a request.
    ToParent { parent: &'a Handle },
}

/// Checks an agent's filing (operators file anything; an unassigned one goes to the Supervisor's
/// triage): for itself, for a descendant as a sub-issue of an issue it owns, or to its parent.
/// `under` is the owner of the parent issue named, if one is: an agent hangs a sub-issue only
/// under an issue it owns, or, filing up, under one its parent owns, so no one can hold
/// another's issue open with a sub-issue.
pub fn may_file(
    caller: &Caller,
    filing: &Filing<'_>,
    under: Option<Option<&Handle>>,
    descendants: &BTreeSet<Handle>,
) -> Result<(), Error> {
    if caller.is_operator() {
        return Ok(());
    }
    let refuse = |reason: String| Err(Error::Forbidden { action: "file an issue".into(), reason });
    let mine = under.map(|owner| owner == Some(&caller.handle));
    match (filing, mine) {
        (Filing::ForDescendant { owner }, _) if !descendants.contains(*owner) => {
            refuse(format!("@{owner} is not one of @{}'s descendants", caller.handle))
        }
        (Filing::ForDescendant { .. }, None | Some(false)) => {
            refuse("an issue for a report is a sub-issue of one you own".into())
        }
        (Filing::ToParent { parent }, Some(false)) if under != Some(Some(*parent)) => {
            refuse(format!("a request up the tree hangs under an issue of yours or of @{parent}'s"))
        }
        (Filing::Own, Some(false)) => refuse("a sub-issue hangs under an issue you own".into()),
        _ => Ok(()),
    }
}

/// Checks who may give away an issue owned by `owner`: its owner, an ancestor of its owner
/// (`descendants` are the caller's, despawned ones too), the Supervisor for one nobody owns, or
/// an operator. Where it may go is `may_assign`'s.
pub fn may_reassign(
    caller: &Caller,
    owner: Option<&Handle>,
    is_supervisor: bool,
    descendants: &BTreeSet<Handle>,
) -> Result<(), Error> {
    let allowed = match owner {
        _ if caller.is_operator() => true,
        Some(owner) => *owner == caller.handle || descendants.contains(owner),
        None => is_supervisor,
    };
    if allowed {
        return Ok(());
    }
    let whose = owner.map(|o| format!("it is @{o}'s")).unwrap_or_else(|| "it has no owner".into());
    Err(Error::Forbidden {
        action: "reassign the issue".into(),
        reason: format!("{whose}; only its owner, an ancestor of its owner or an operator gives it away"),
    })
}

/// Checks an edit (labels, dependencies, body, title): the owner's or an operator's, as moves are.
pub fn may_edit(caller: &Caller, owner: Option<&Handle>, number: u64) -> Result<(), Error> {
    match caller.is_operator() || owner == Some(&caller.handle) {
        true => Ok(()),
        false => Err(Error::Forbidden {
            action: format!("change #{number}"),
            reason: "only its owner or an operator changes an issue".into(),
        }),
    }
}

/// Checks linking a run or merge request to issue `number` owned by `owner`: the caller's own
/// issue or one a descendant of its owns (`field` names the request's field).
pub fn may_link(
    caller: &Caller,
    owner: Option<&Handle>,
    number: u64,
    descendants: &BTreeSet<Handle>,
) -> Result<(), Error> {
    if owner.is_some_and(|o| *o == caller.handle || descendants.contains(o)) {
        return Ok(());
    }
    let whose = owner.map(|o| format!("@{o}'s")).unwrap_or_else(|| "nobody's".into());
    Err(Error::Forbidden {
        action: format!("link #{number}"),
        reason: format!("it is {whose}, not yours or one of your reports'"),
    })
}

/// Refuses `depends_on` edges that would close a cycle: `edges` are every issue's current
/// dependencies; `issue` would depend on `on`. The error names the cycle (`#3 -> #5 -> #3`).
pub fn check_dependencies(issue: u64, on: &[u64], edges: &BTreeMap<u64, Vec<u64>>) -> Result<(), Error> {
    for &target in on {
        if target == issue {
            return Err(Error::ConflictOn { field: "depends_on", reason: format!("#{issue} cannot depend on itself") });
        }
        if let Some(path) = path(target, issue, edges) {
            let mut cycle: Vec<String> = std::iter::once(issue).chain(path).map(|n| format!("#{n}")).collect();
            cycle.dedup();
            return Err(Error::ConflictOn {
                field: "depends_on",
                reason: format!("that closes a cycle: {}", cycle.join(" -> ")),
            });
        }
    }
    Ok(())
}

/// A path of dependencies from `from` to `to`, both ends included, if there is one.
fn path(from: u64, to: u64, edges: &BTreeMap<u64, Vec<u64>>) -> Option<Vec<u64>> {
    let mut came_from: BTreeMap<u64, u64> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([from]);
    let mut seen = BTreeSet::from([from]);
    while let Some(node) = queue.pop_front() {
        if node == to {
            let mut path = vec![to];
            let mut at = to;
            while let Some(&previous) = came_from.get(&at) {
                path.push(previous);
                at = previous;
            }
            path.reverse();
            return Some(path);
        }
        for &next in edges.get(&node).into_iter().flatten() {
            if seen.insert(next) {
                came_from.insert(next, node);
                queue.push_back(next);
            }
        }
    }
    None
}

/// Longest issue title, in bytes.
pub const MAX_TITLE: usize = 200;
/// Longest issue body or comment, in bytes.
pub const MAX_BODY: usize = 65_536;
/// Most labels on one issue.
pub const MAX_LABELS: usize = 20;
/// Most dependencies of one issue.
pub const MAX_DEPENDS_ON: usize = 50;

/// An issue as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Issue {
    /// `#N` in the workspace.
    pub number: u64,
    pub title: String,
    /// Markdown.
    pub body: String,
    pub state: IssueState,
    /// An agent or an operator; none: nobody (the Supervisor triages it).
    pub owner: Option<Handle>,
    pub reporter: Handle,
    /// The issue this is a sub-issue of.
    pub parent: Option<u64>,
    pub depends_on: Vec<u64>,
    pub labels: Vec<String>,
    /// What a `blocked` issue waits for.
    pub blocker: Option<Blocker>,
    /// The resolution line of a closed issue.
    pub resolution: Option<String>,
    /// Where an imported issue came from (`github#123`).
    pub source: Option<String>,
    /// The issue's own budget in dollars: runs for it are held once it is spent.
    pub budget_usd: Option<f64>,
    pub created_at: String,
    pub updated_at: String,
}

/// What happened to an issue: one line of its append-only history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueEvent {
    pub at: String,
    /// Who did it (`canopy` for the daemon's own events).
    pub actor: Handle,
    /// `filed`, `assigned`, `moved`, `commented`, `edited`, `run`, `merge`, `landed`,
    /// `unblocked`, `sub_issue_closed`, `budget`, `imported`.
    pub kind: String,
    /// The note, comment or what changed.
    pub text: String,
}

/// An issue's spend: its own usage and its sub-issues' (all levels), in dollars and tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueSpend {
    pub usd: f64,
    pub tokens: u64,
    pub subissues_usd: f64,
    pub subissues_tokens: u64,
}

/// A row of an issue list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueSummary {
    pub number: u64,
    pub title: String,
    pub state: IssueState,
    pub owner: Option<Handle>,
    pub parent: Option<u64>,
    pub labels: Vec<String>,
    pub blocker: Option<Blocker>,
    /// The issue's own spend in dollars.
    pub spend_usd: f64,
    pub created_at: String,
    pub updated_at: String,
}

/// Checks a title: one line, not empty, within `MAX_TITLE`.
pub fn check_title(title: &str) -> Result<String, Error> {
    one_line("title", title, MAX_TITLE, false)?;
    Ok(title.trim().to_owned())
}

/// Checks a note on a move or an assignment: not empty, within `MAX_NOTE`; returns it trimmed.
pub fn check_note(note: &str) -> Result<String, Error> {
    one_line("note", note, MAX_NOTE, true)?;
    Ok(note.trim().to_owned())
}

/// Checks an issue number from the wire (`field` names it): 1 and up, and within what the
/// store holds (`i64::MAX`).
pub fn check_number(field: &'static str, number: u64) -> Result<u64, Error> {
    match number {
        1..=MAX_NUMBER => Ok(number),
        _ => Err(Error::invalid(field, format!("{number} is not an issue number (1 to {MAX_NUMBER})"))),
    }
}

/// The largest issue number.
pub const MAX_NUMBER: u64 = i64::MAX as u64;

/// Checks a body or comment: within `MAX_BODY` (`field` names it); a comment must say something.
pub fn check_text(field: &'static str, text: &str, may_be_empty: bool) -> Result<String, Error> {
    if may_be_empty && text.trim().is_empty() {
        return Ok(String::new());
    }
    one_line(field, text, MAX_BODY, true)?;
    Ok(text.trim_end().to_owned())
}

/// Longest label, in characters.
pub const MAX_LABEL_CHARS: usize = 50;

/// A character a label may hold: letters, digits, spaces, `-`, `_`, `.`, `:`, `/`.
fn label_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/' | ' ')
}

/// Checks labels: at most `MAX_LABELS`, each 1-50 characters of letters, digits, spaces, `-`,
/// `_`, `.`, `:` or `/`; returns them sorted without repeats.
pub fn check_labels(labels: &[String]) -> Result<Vec<String>, Error> {
    if labels.len() > MAX_LABELS {
        return Err(Error::invalid("labels", format!("at most {MAX_LABELS} labels")));
    }
    labels.iter().map(|l| check_label("labels", l)).collect::<Result<BTreeSet<_>, _>>().map(|s| s.into_iter().collect())
}

/// Checks one label (`field` names it: `labels`, or a list's `label` filter).
pub fn check_label(field: &'static str, label: &str) -> Result<String, Error> {
    let label = label.trim();
    if label.is_empty() || label.chars().count() > MAX_LABEL_CHARS || !label.chars().all(label_char) {
        return Err(Error::invalid(
            field,
            format!("{label:?} is not a label (1-50 letters, digits, spaces, - _ . : /)"),
        ));
    }
    Ok(label.to_owned())
}

/// Labels from another tracker, made ours: a character a label may not hold becomes `-`,
/// each is cut to 50 characters, empty ones and repeats drop, and at most `MAX_LABELS` stay
/// (GitHub allows any text in a label; an import should not fail on one).
pub fn imported_labels<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out = BTreeSet::new();
    for name in names {
        let mapped: String =
            name.trim().chars().map(|c| if label_char(c) { c } else { '-' }).take(MAX_LABEL_CHARS).collect();
        let label = mapped.trim_matches(|c| c == '-' || c == ' ').to_owned();
        if !label.is_empty() && out.len() < MAX_LABELS {
            out.insert(label);
        }
    }
    out.into_iter().collect()
}

/// A title from another tracker, made ours: control characters become spaces, and a title past
/// `MAX_TITLE` bytes is cut at a character with `…` (GitHub allows 256 characters).
pub fn imported_title(title: &str) -> String {
    let plain: String = title.trim().chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    cut_bytes(&plain, MAX_TITLE)
}

/// A body from another tracker, cut to `MAX_BODY` bytes at a character with `…`.
pub fn imported_body(body: &str) -> String {
    cut_bytes(body.trim_end(), MAX_BODY)
}

fn cut_bytes(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The first ten characters of a commit id, as notices show it.
pub fn short_commit(commit: &str) -> &str {
    commit.char_indices().nth(10).map_or(commit, |(at, _)| &commit[..at])
}

/// Parses `#N` or `N` as an issue number (`field` names it in the error).
pub fn parse_number(field: &'static str, text: &str) -> Result<u64, Error> {
    let digits = text.trim().trim_start_matches('#');
    match digits.parse::<u64>() {
        Ok(n) if (1..=MAX_NUMBER).contains(&n) => Ok(n),
        _ => Err(Error::invalid(field, format!("{text:?} is not an issue number (#N)"))),
    }
}

/// The topic an issue is discussed under in its owner's home channel: `issue #N: <title>`,
/// cut to a topic's length.
pub fn topic(number: u64, title: &str) -> String {
    let plain: String = title.trim().chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let full = format!("issue #{number}: {plain}");
    let max = crate::names::MAX_TOPIC_CHARS;
    if full.chars().count() <= max {
        return full;
    }
    let kept: String = full.chars().take(max - 1).collect();
    format!("{}…", kept.trim_end())
}

/// What Canopy says in an issue's topic. The wording is here; who is told is the store's.
pub mod say {
    /// To the owner of a new issue (or the Supervisor, for one nobody owns).
    pub fn filed(by: &str, number: u64, title: &str, body: &str, to_parent: bool, unassigned: bool) -> String {
        let what = match (to_parent, unassigned) {
            (true, _) => format!("{by} asks this of you, up the tree: #{number} {title}. It is yours now."),
            (_, true) => format!(
                "{by} filed #{number} {title} with no owner. Triage it: give it to the Manager whose lane it is."
            ),
            _ => format!("{by} filed #{number} {title}. It is yours."),
        };
        with_body(what, body)
    }

    /// To the Supervisor, when an import filed issues nobody owns.
    pub fn imported(by: &str, count: usize) -> String {
        format!(
            "{by} imported {count} open issues with no owner. Triage them: list them by owner nobody, and give each to the Manager whose lane it is."
        )
    }

    /// To the new owner of a reassigned issue, with what happened so far.
    pub fn assigned(by: &str, number: u64, title: &str, note: Option<&str>, history: &[String]) -> String {
        let mut text = format!("{by} gave you #{number} {title}.");
        if let Some(note) = note {
            text.push_str(&format!(" Note: {note}"));
        }
        if !history.is_empty() {
            text.push_str("\nSo far:\n");
            text.push_str(&history.join("\n"));
        }
        text
    }

    /// To the previous owner of a reassigned issue.
    pub fn taken(by: &str, number: u64, to: &str) -> String {
        format!("{by} gave #{number} to {to}: it is no longer yours; leave its state to its owner.")
    }

    /// To the owner, when someone else moved its issue.
    pub fn moved_for_you(by: &str, number: u64, from: &str, to: &str, note: &str) -> String {
        format!("{by} moved #{number} from {from} to {to}: {note}")
    }

    /// To the owner, when someone else commented.
    pub fn commented(by: &str, number: u64, text: &str) -> String {
        format!("{by} commented on #{number}:\n\n{text}")
    }

    /// To a blocked or dependent issue's owner, when an issue it waits for closed.
    pub fn unblocked(number: u64, waiting: u64, state: &str, resolution: &str) -> String {
        format!("#{number}, which #{waiting} waits for, is {state}: {resolution}")
    }

    /// To the parent issue's owner, when a sub-issue closed.
    pub fn subissue_closed(number: u64, parent: u64, state: &str, resolution: &str) -> String {
        format!("Sub-issue #{number} of #{parent} is {state}: {resolution}")
    }

    /// To a linked issue's owner, when a merge request that names it landed.
    pub fn landed(merge: &str, number: u64, commit: &str) -> String {
        let short = super::short_commit(commit);
        format!(
            "{merge}, which works on #{number}, landed ({short}). #{number} stays as it is until you close it: \
             move it to done with a resolution when the work is finished."
        )
    }

    fn with_body(head: String, body: &str) -> String {
        match body.trim().is_empty() {
            true => head,
            false => format!("{head}\n\n{}", crate::redact::cut(body.trim(), 2000)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AccountKind;
    use IssueState::*;

    fn agent(handle: &str) -> Caller {
        Caller { handle: Handle::from_trusted(handle.into()), kind: AccountKind::Agent }
    }

    fn operator() -> Caller {
        Caller { handle: Handle::from_trusted("op".into()), kind: AccountKind::Operator }
    }

    fn handle(h: &str) -> Handle {
        Handle::from_trusted(h.into())
    }

    fn to(state: IssueState) -> Move<'static> {
        Move { to: state, note: "because", blocker: None, resolution: None }
    }

    #[test]
    fn states_round_trip_and_closed_ones_only_reopen() {
        for state in IssueState::ALL {
            assert_eq!(IssueState::parse(state.as_str()), Some(*state));
        }
        assert!(allowed(Open, InProgress) && allowed(InProgress, Done) && allowed(Blocked, InProgress));
        assert!(allowed(InReview, Done) && allowed(Open, Wontdo) && allowed(Done, Open));
        assert!(!allowed(Open, Done), "done is reached from work");
        assert!(!allowed(Done, InProgress) && !allowed(Wontdo, Done) && !allowed(Open, Open));
    }

    #[test]
    fn only_the_owner_or_an_operator_moves_an_issue() {
        let owner = handle("m1");
        assert!(may_move(&agent("m1"), Some(&owner), Open, &to(InProgress), &[]).is_ok());
        assert!(may_move(&operator(), Some(&owner), Open, &to(InProgress), &[]).is_ok());
        let other = may_move(&agent("m2"), Some(&owner), Open, &to(InProgress), &[]);
        assert!(matches!(other, Err(Error::Forbidden { .. })), "{other:?}");
        let nobody = may_move(&agent("m1"), None, Open, &to(InProgress), &[]);
        assert!(matches!(nobody, Err(Error::Forbidden { reason, .. }) if reason.contains("no owner")));
    }

    #[test]
    fn a_move_carries_a_note_a_block_names_its_blocker_and_a_close_its_resolution() {
        let owner = handle("m1");
        let m1 = agent("m1");
        let silent = Move { note: " ", ..to(InProgress) };
        assert!(matches!(
            may_move(&m1, Some(&owner), Open, &silent, &[]),
            Err(Error::InvalidArgument { field: "note", .. })
        ));
        let unnamed = may_move(&m1, Some(&owner), InProgress, &to(Blocked), &[]);
        assert!(matches!(unnamed, Err(Error::InvalidArgument { field: "blocked_by", .. })));
        let question = Blocker::Operator { question: "which database?".into() };
        let blocked = Move { blocker: Some(&question), ..to(Blocked) };
        assert!(may_move(&m1, Some(&owner), InProgress, &blocked, &[]).is_ok());
        let none = Blocker::Issues(Vec::new());
        let empty = Move { blocker: Some(&none), ..to(Blocked) };
        assert!(may_move(&m1, Some(&owner), InProgress, &empty, &[]).is_err());
        let unresolved = may_move(&m1, Some(&owner), InProgress, &to(Done), &[]);
        assert!(matches!(unresolved, Err(Error::InvalidArgument { field: "resolution", .. })));
        let two_lines = Move { resolution: Some("merged\nand more"), ..to(Done) };
        assert!(may_move(&m1, Some(&owner), InProgress, &two_lines, &[]).is_err());
        let resolved = Move { resolution: Some("merged as merge-4"), ..to(Done) };
        assert!(may_move(&m1, Some(&owner), InProgress, &resolved, &[]).is_ok());
        let stray = Move { resolution: Some("x"), ..to(InReview) };
        assert!(may_move(&m1, Some(&owner), InProgress, &stray, &[]).is_err());
    }

    #[test]
    fn done_waits_for_every_sub_issue_and_names_the_open_ones() {
        let owner = handle("m1");
        let resolved = Move { resolution: Some("shipped"), ..to(Done) };
        let refused = may_move(&agent("m1"), Some(&owner), InReview, &resolved, &[7, 9]);
        match refused {
            Err(Error::ConflictOn { field: "state", reason }) => assert!(reason.contains("#7, #9"), "{reason}"),
            other => panic!("{other:?}"),
        }
        let wontdo = Move { resolution: Some("superseded"), ..to(Wontdo) };
        assert!(may_move(&agent("m1"), Some(&owner), InReview, &wontdo, &[7]).is_ok(), "wontdo does not wait");
    }

    #[test]
    fn an_agent_assigns_only_to_itself_or_its_descendants() {
        let descendants: BTreeSet<Handle> = [handle("w1"), handle("w2")].into();
        assert!(may_assign(&agent("m1"), &handle("m1"), &descendants).is_ok());
        assert!(may_assign(&agent("m1"), &handle("w2"), &descendants).is_ok());
        assert!(matches!(may_assign(&agent("m1"), &handle("m2"), &descendants), Err(Error::Forbidden { .. })));
        assert!(may_assign(&operator(), &handle("m2"), &BTreeSet::new()).is_ok());
    }

    #[test]
    fn an_agent_files_for_itself_up_to_its_parent_or_a_sub_issue_for_a_report() {
        let descendants: BTreeSet<Handle> = [handle("w1")].into();
        let (m1, w1, m2, boss) = (handle("m1"), handle("w1"), handle("m2"), handle("boss"));
        let up = Filing::ToParent { parent: &boss };
        assert!(may_file(&agent("m1"), &Filing::Own, None, &descendants).is_ok());
        assert!(may_file(&agent("m1"), &Filing::Own, Some(Some(&m1)), &descendants).is_ok());
        assert!(may_file(&agent("m1"), &up, None, &descendants).is_ok());
        assert!(may_file(&agent("m1"), &up, Some(Some(&boss)), &descendants).is_ok(), "under the parent's");
        let sub = Filing::ForDescendant { owner: &w1 };
        assert!(may_file(&agent("m1"), &sub, Some(Some(&m1)), &descendants).is_ok());
        assert!(may_file(&agent("m1"), &sub, None, &descendants).is_err(), "a report's issue is a sub-issue");
        let sideways = Filing::ForDescendant { owner: &m2 };
        assert!(may_file(&agent("m1"), &sideways, Some(Some(&m1)), &descendants).is_err());
        assert!(may_file(&operator(), &sideways, None, &BTreeSet::new()).is_ok());
        // Nobody hangs a sub-issue under someone else's issue, holding it open.
        for filing in [Filing::Own, up, sub] {
            assert!(may_file(&agent("m1"), &filing, Some(Some(&m2)), &descendants).is_err(), "{filing:?}");
            assert!(may_file(&agent("m1"), &filing, Some(None), &descendants).is_err(), "{filing:?}");
        }
    }

    #[test]
    fn who_gives_an_issue_away_edits_it_and_links_it() {
        let below: BTreeSet<Handle> = [handle("w1")].into();
        let (m1, w1, m2) = (handle("m1"), handle("w1"), handle("m2"));
        assert!(may_reassign(&agent("m1"), Some(&m1), false, &below).is_ok());
        assert!(may_reassign(&agent("m1"), Some(&w1), false, &below).is_ok(), "an ancestor redistributes");
        assert!(may_reassign(&agent("m1"), Some(&m2), false, &below).is_err());
        assert!(may_reassign(&agent("m1"), None, false, &below).is_err());
        assert!(may_reassign(&agent("sup"), None, true, &below).is_ok(), "the Supervisor triages");
        assert!(may_reassign(&operator(), Some(&m2), false, &BTreeSet::new()).is_ok());
        assert!(may_edit(&agent("m1"), Some(&m1), 1).is_ok() && may_edit(&operator(), None, 1).is_ok());
        assert!(matches!(may_edit(&agent("m1"), Some(&w1), 1), Err(Error::Forbidden { .. })));
        assert!(may_link(&agent("m1"), Some(&w1), 1, &below).is_ok());
        assert!(matches!(may_link(&agent("m1"), Some(&m2), 1, &below), Err(Error::Forbidden { .. })));
        assert!(may_link(&agent("m1"), None, 1, &below).is_err());
    }

    #[test]
    fn titles_labels_numbers_and_topics_are_checked() {
        assert_eq!(check_title("  Fix the login  ").ok().as_deref(), Some("Fix the login"));
        assert!(check_title("two\nlines").is_err() && check_title(" ").is_err() && check_title("a\tb").is_err());
        assert_eq!(imported_title("a\tb"), "a b");
        let long = imported_title(&"é".repeat(256));
        assert!(long.len() <= MAX_TITLE && long.ends_with('…') && check_title(&long).is_ok());
        assert!(check_labels(&["é".repeat(50)]).is_ok(), "fifty characters, not bytes");
        assert_eq!(short_commit("0123456789abcdef"), "0123456789");
        assert!(check_title(&"x".repeat(MAX_TITLE + 1)).is_err());
        let labels = check_labels(&["ui".into(), "bug".into(), "ui".into()]).ok();
        assert_eq!(labels, Some(vec!["bug".to_owned(), "ui".to_owned()]));
        assert!(check_labels(&["no\nline".into()]).is_err());
        let imported = imported_labels(["P1 (high)", "🚀 launch", "ui", "ui", "   "]);
        assert_eq!(imported, vec!["P1 -high".to_owned(), "launch".to_owned(), "ui".to_owned()]);
        assert!(check_labels(&imported).is_ok());
        assert_eq!(parse_number("issue", "#12").ok(), Some(12));
        assert!(parse_number("issue", "0").is_err() && parse_number("issue", "x").is_err());
        assert_eq!(topic(3, "Ship it"), "issue #3: Ship it");
        let long = topic(3, &"word ".repeat(40));
        assert!(long.chars().count() <= crate::names::MAX_TOPIC_CHARS && long.ends_with('…'));
        assert!(crate::TopicName::parse(&long).is_ok());
    }

    #[test]
    fn a_dependency_that_closes_a_cycle_is_refused_naming_it() {
        let edges: BTreeMap<u64, Vec<u64>> = [(5, vec![8]), (8, vec![3]), (4, vec![])].into();
        assert!(check_dependencies(3, &[4], &edges).is_ok());
        match check_dependencies(3, &[5], &edges) {
            Err(Error::ConflictOn { field: "depends_on", reason }) => {
                assert!(reason.ends_with("#3 -> #5 -> #8 -> #3"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        assert!(check_dependencies(3, &[3], &edges).is_err());
    }
}
