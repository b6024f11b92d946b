//! The Issues pages: the board (a column per state, each card with its owner, age, blockers,
//! labels and spend), one issue (its fields, body, spend, sub-issues, runs, merges and history,
//! oldest first), the operator's forms (file, assign, comment) and their outcomes.
//!
//! Pure, like `pages.rs`, whose helpers it uses: each takes what the API returned and the time.
//! Does not read issues (`server.rs`'s routes do) and decides nothing about who may act.

use canopy_core::issues::{Issue, IssueState, IssueSummary, MAX_TITLE};
use canopy_core::{ChannelName, Handle};
use canopy_proto::api::IssueDetail;
use maud::{Markup, html};

use crate::pages::{blocker, ms_of, query, span, time};

/// How many issues of a closed state the board shows: the newest.
pub const CLOSED_SHOWN: usize = 20;

/// What the board is filtered by (each empty when not).
#[derive(Debug, Default)]
pub struct IssueFilter {
    /// A handle: issues owned by it or one of its descendants.
    pub subtree: String,
    /// `nobody`, or a handle.
    pub owner: String,
    pub label: String,
}

impl IssueFilter {
    fn is_empty(&self) -> bool {
        self.subtree.is_empty() && self.owner.is_empty() && self.label.is_empty()
    }
}

/// What the board shows, as the routes read it.
#[derive(Debug, Default)]
pub struct Board {
    /// Every issue not closed that was read, lowest number first.
    pub open: Vec<IssueSummary>,
    /// The read stopped at its bound: more open issues match than `open` holds.
    pub open_capped: bool,
    /// Per closed state: its newest issues (newest first), and whether older ones exist.
    pub closed: Vec<(IssueState, Vec<IssueSummary>, bool)>,
}

/// A state as a column is headed.
fn state_name(state: IssueState) -> &'static str {
    match state {
        IssueState::Open => "Open",
        IssueState::InProgress => "In progress",
        IssueState::Blocked => "Blocked",
        IssueState::InReview => "In review",
        IssueState::Done => "Done",
        IssueState::Wontdo => "Won't do",
    }
}

fn state(state: IssueState) -> Markup {
    html! { strong class=(format!("state {}", state.as_str())) { (state.as_str()) } }
}

fn dollars(usd: f64) -> String {
    format!("${usd:.2}")
}

/// An owner, linking to the board of its issues; an issue without one is nobody's.
fn owner(owner: Option<&Handle>) -> Markup {
    html! {
        @match owner {
            Some(h) => a.owner href=(format!("/issues?owner={}", query(h.as_str()))) { (h.as_str()) },
            None => span.quiet { "nobody" },
        }
    }
}

fn labels(labels: &[String]) -> Markup {
    html! {
        @for l in labels {
            a.label href=(format!("/issues?label={}", query(l))) { (l) } " "
        }
    }
}

/// The handles the forms offer (an `<input list="handles">` takes any other as well).
fn handle_list(handles: &[Handle]) -> Markup {
    html! { datalist #handles { @for h in handles { option value=(h.as_str()) {} } } }
}

fn card(i: &IssueSummary, now_ms: i64) -> Markup {
    let age = ms_of(&i.created_at).map(|t| span(now_ms - t)).unwrap_or_default();
    html! {
        article.card id=(format!("issue-{}", i.number)) data-issue=(i.number) data-state=(i.state.as_str()) {
            h3 { a href=(format!("/issues/{}", i.number)) { "#" (i.number) " " (i.title) } }
            p.meta {
                (owner(i.owner.as_ref())) " · "
                span title=(format!("filed {}", i.created_at)) { (age) " old" } " · "
                span.spend { (dollars(i.spend_usd)) }
            }
            @if let Some(b) = &i.blocker { p.blocker { (blocker(b)) } }
            @if !i.labels.is_empty() { p.labels { (labels(&i.labels)) } }
        }
    }
}

fn column(state: IssueState, issues: &[&IssueSummary], older: bool, now_ms: i64) -> Markup {
    let id = format!("col-{}", state.as_str());
    html! {
        section.column id=(id) data-state=(state.as_str()) aria-labelledby=(format!("{id}-name")) {
            h2 id=(format!("{id}-name")) { (state_name(state)) " " span.meta { "(" (issues.len()) @if older { "+" } ")" } }
            @for i in issues { (card(i, now_ms)) }
            @if older { p.quiet { "The newest " (issues.len()) " shown." } }
        }
    }
}

/// *Issues*: the board, filtered by subtree, owner and label, and the form to file one.
pub fn board(board: &Board, filter: &IssueFilter, handles: &[Handle], now_ms: i64, csrf: &str) -> Markup {
    html! {
        form.filter method="get" action="/issues" role="search" {
            label { "Subtree " input type="text" name="subtree" list="handles" value=(filter.subtree) placeholder="a handle"; }
            label { "Owner " input type="text" name="owner" list="handles" value=(filter.owner) placeholder="a handle or nobody"; }
            label { "Label " input type="text" name="label" value=(filter.label); }
            button type="submit" { "Filter" }
            @if !filter.is_empty() { a href="/issues" { "All issues" } }
        }
        (handle_list(handles))
        section #board data-live aria-label="Board" {
            p.summary {
                (board.open.len()) " not closed"
                @if board.open_capped { " shown; more match than the board reads: narrow it with a filter" }
                "."
            }
            div.board {
                @for s in IssueState::ALL.iter().copied() {
                    @match board.closed.iter().find(|(closed, _, _)| *closed == s) {
                        Some((_, issues, older)) => (column(s, &issues.iter().collect::<Vec<_>>(), *older, now_ms)),
                        None => (column(s, &board.open.iter().filter(|i| i.state == s).collect::<Vec<_>>(), false, now_ms)),
                    }
                }
            }
        }
        form.file data-action method="post" action="/issues" {
            h2 { "File an issue" }
            input type="hidden" name="csrf" value=(csrf);
            label { "Title " input type="text" name="title" required maxlength=(MAX_TITLE); }
            label { "Body " textarea name="body" rows="4" placeholder="What, why, and what done means (markdown)" {} }
            label { "Assign to " input type="text" name="owner" list="handles" placeholder="a handle; empty: the Supervisor triages it"; }
            label { "Labels " input type="text" name="labels" placeholder="comma-separated"; }
            label { "Sub-issue of " input type="text" name="parent" placeholder="#N (optional)"; }
            button type="submit" { "File" }
            div.outcome data-outcome aria-live="polite" {}
        }
    }
}

/// *Issue #N*: everything about one issue, and the operator's assign and comment forms (outside
/// the live regions, so a refresh never takes what is being typed).
pub fn issue(detail: &IssueDetail, handles: &[Handle], now_ms: i64, csrf: &str) -> Markup {
    let i = &detail.issue;
    let spend = &detail.spend;
    html! {
        section #issue data-live {
            p.summary {
                (state(i.state)) " · " (owner(i.owner.as_ref()))
                " · filed " (ms_of(&i.created_at).map(|t| span(now_ms - t)).unwrap_or_default()) " ago"
            }
            dl {
                dt { "State" } dd data-field="state" { (state(i.state)) }
                dt { "Owner" } dd data-field="owner" { (owner(i.owner.as_ref())) }
                dt { "Reporter" } dd { (i.reporter.as_str()) }
                @if let Some(p) = i.parent { dt { "Sub-issue of" } dd { a href=(format!("/issues/{p}")) { "#" (p) } } }
                @if !i.depends_on.is_empty() {
                    dt { "Depends on" }
                    dd { @for (k, n) in i.depends_on.iter().enumerate() { @if k > 0 { ", " } a href=(format!("/issues/{n}")) { "#" (n) } } }
                }
                @if !i.labels.is_empty() { dt { "Labels" } dd { (labels(&i.labels)) } }
                @if let Some(b) = &i.blocker { dt { "Blocked on" } dd.blocker { (blocker(b)) } }
                @if let Some(r) = &i.resolution { dt { "Resolution" } dd data-field="resolution" { (r) } }
                dt { "Spend" }
                dd data-field="spend" {
                    (dollars(spend.usd)) " own (" (spend.tokens) " tokens), "
                    (dollars(spend.subissues_usd)) " in sub-issues (" (spend.subissues_tokens) " tokens): "
                    strong { (dollars(spend.usd + spend.subissues_usd)) } " in all"
                    @if let Some(b) = i.budget_usd { "; budget " (dollars(b)) }
                }
                @if let (Some(t), Some(o)) = (&detail.topic, &i.owner) {
                    dt { "Topic" }
                    dd { a href=(format!("/channels/{}?topic={}", ChannelName::home_of(o).as_str(), query(t))) { (t) } }
                }
                @if let Some(s) = &i.source { dt { "Imported from" } dd { code { (s) } } }
                dt { "Filed" } dd { (time(&i.created_at)) }
                dt { "Updated" } dd { (time(&i.updated_at)) }
            }
            h2 { "Body" }
            @if i.body.trim().is_empty() { p.quiet { "No body." } } @else { div.body.issue-body { (i.body) } }
        }
        section #subissues data-live {
            h2 { "Sub-issues (" (detail.subissues.len()) ")" }
            @if detail.subissues.is_empty() { p.quiet { "None." } } @else {
                table {
                    thead { tr { th scope="col" { "Issue" } th scope="col" { "State" } th scope="col" { "Owner" } th scope="col" { "Spend" } } }
                    tbody {
                        @for s in &detail.subissues {
                            tr data-issue=(s.number) {
                                td { a href=(format!("/issues/{}", s.number)) { "#" (s.number) " " (s.title) } }
                                td { (state(s.state)) }
                                td { (owner(s.owner.as_ref())) }
                                td { (dollars(s.spend_usd)) }
                            }
                        }
                    }
                }
            }
        }
        section #links data-live {
            h2 { "Runs (" (detail.runs.len()) ")" }
            @if detail.runs.is_empty() { p.quiet { "No run was briefed for it." } }
            ul { @for r in &detail.runs { li { a href=(format!("/agents/{r}")) { code { (r) } } } } }
            h2 { "Merge requests (" (detail.merges.len()) ")" }
            @if detail.merges.is_empty() { p.quiet { "No merge request links it." } }
            ul { @for m in &detail.merges { li { code { (m) } } } }
        }
        section #events data-live {
            h2 { "History" }
            ol.events {
                @for e in &detail.events {
                    li data-kind=(e.kind) {
                        span.meta { (time(&e.at)) } " " strong { (e.actor.as_str()) } " " span.kind { (e.kind) }
                        @if !e.text.is_empty() { div.body { (e.text) } }
                    }
                }
            }
        }
        (handle_list(handles))
        div.actions {
            form.assign data-action method="post" action=(format!("/issues/{}/assign", i.number)) {
                h2 { "Assign" }
                input type="hidden" name="csrf" value=(csrf);
                label { "Owner " input type="text" name="owner" list="handles" required placeholder="a handle"; }
                label { "Note " input type="text" name="note" placeholder="optional: what the new owner should know"; }
                button type="submit" { "Assign" }
                div.outcome data-outcome aria-live="polite" {}
            }
            form.comment data-action method="post" action=(format!("/issues/{}/comment", i.number)) {
                h2 { "Comment" }
                input type="hidden" name="csrf" value=(csrf);
                label { "Comment " textarea name="text" required rows="3" placeholder="markdown; an @mention steers a busy agent" {} }
                button type="submit" { "Comment" }
                div.outcome data-outcome aria-live="polite" {}
            }
        }
    }
}

/// A filed issue: its number (a link) and whose it is.
pub fn filed(issue: &Issue) -> Markup {
    html! {
        p.ok {
            "Filed " a href=(format!("/issues/{}", issue.number)) { "#" (issue.number) } " " (issue.title) ", "
            @match &issue.owner {
                Some(o) => { "assigned to " strong { (o.as_str()) } }
                None => { "unassigned: the Supervisor triages it" }
            }
            "."
        }
    }
}

pub fn assigned(issue: &Issue) -> Markup {
    html! {
        p.ok {
            a href=(format!("/issues/{}", issue.number)) { "#" (issue.number) } " is now "
            strong { (issue.owner.as_ref().map_or("nobody", |o| o.as_str())) } "'s."
        }
    }
}

pub fn commented(issue: &Issue) -> Markup {
    html! { p.ok { "Commented on " a href=(format!("/issues/{}", issue.number)) { "#" (issue.number) } "." } }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    fn summary(number: u64, state: IssueState) -> IssueSummary {
        IssueSummary {
            number,
            title: format!("issue {number} <b>"),
            state,
            owner: Some(Handle::from_trusted("lead".into())),
            parent: None,
            labels: vec!["ci".into()],
            blocker: None,
            spend_usd: 1.234,
            created_at: "2026-01-01T00:00:00Z".into(),
            updated_at: "2026-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn a_card_lands_in_its_states_column_and_closed_columns_say_older_ones_exist() {
        let mut blocked = summary(2, IssueState::Blocked);
        blocked.blocker = Some(canopy_core::issues::Blocker::Operator { question: "which db?".into() });
        let board = Board {
            open: vec![summary(1, IssueState::Open), blocked],
            open_capped: false,
            closed: vec![
                (IssueState::Done, vec![summary(9, IssueState::Done)], true),
                (IssueState::Wontdo, vec![], false),
            ],
        };
        let now = ms_of("2026-01-01T00:05:00Z").unwrap();
        let html = super::board(&board, &IssueFilter::default(), &[], now, "c").into_string();
        let column = |state: &str| {
            let at = html.find(&format!("id=\"col-{state}\"")).unwrap();
            let end = html[at..].find("</section>").unwrap();
            html[at..at + end].to_owned()
        };
        assert!(column("open").contains("data-issue=\"1\""), "{html}");
        assert!(!column("open").contains("data-issue=\"2\""));
        assert!(column("blocked").contains("operator: which db?"));
        assert!(column("done").contains("data-issue=\"9\"") && column("done").contains("(1+)"));
        assert!(column("in_progress").contains("(0)") && column("wontdo").contains("(0)"));
        assert!(html.contains("$1.23") && html.contains("5m old") && html.contains("issue 1 &lt;b&gt;"));
    }

    #[test]
    fn an_issue_page_shows_its_spend_in_all_its_topic_and_its_history_oldest_first() {
        let lead = Handle::from_trusted("lead".into());
        let event = |kind: &str, text: &str| canopy_core::issues::IssueEvent {
            at: "2026-01-01T00:00:00Z".into(),
            actor: Handle::from_trusted("ops".into()),
            kind: kind.into(),
            text: text.into(),
        };
        let detail = IssueDetail {
            issue: Issue {
                number: 3,
                title: "Ship it".into(),
                body: "line one\nline two".into(),
                state: IssueState::InProgress,
                owner: Some(lead.clone()),
                reporter: Handle::from_trusted("ops".into()),
                parent: Some(1),
                depends_on: vec![2],
                labels: vec!["ui".into()],
                blocker: None,
                resolution: None,
                source: None,
                budget_usd: None,
                created_at: "2026-01-01T00:00:00Z".into(),
                updated_at: "2026-01-01T00:00:00Z".into(),
            },
            events: vec![event("filed", "first"), event("commented", "second")],
            subissues: vec![summary(4, IssueState::Open)],
            runs: vec!["run-7".into()],
            merges: vec!["merge-2".into()],
            spend: canopy_core::issues::IssueSpend { usd: 1.5, tokens: 10, subissues_usd: 0.25, subissues_tokens: 5 },
            topic: Some("issue #3: Ship it".into()),
        };
        let html = issue(&detail, &[lead], 0, "c").into_string();
        assert!(html.contains("$1.75</strong> in all"), "{html}");
        assert!(html.contains("/channels/home-lead?topic=issue%20%233%3A%20Ship%20it"), "{html}");
        assert!(html.find("first").unwrap() < html.find("second").unwrap());
        assert!(html.contains("href=\"/issues/1\"") && html.contains("href=\"/issues/4\"") && html.contains("run-7"));
        assert!(html.contains("action=\"/issues/3/assign\"") && html.contains("action=\"/issues/3/comment\""));
    }
}
