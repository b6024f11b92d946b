//! The console's pages, rendered on the server with `maud` (templates checked by the
//! compiler, every value escaped). Pure: each takes what the API returned and the time, and
//! returns markup; the `data-live` regions are what the script refreshes on a live event.
//! The script and the style sheet are embedded here (`assets/`), no build step, no CDN.
//! The frame and the helpers here are shared with `issue_pages.rs` (the Issues pages), which
//! this file does not use.

use canopy_bus::CallError;
use canopy_core::budget::say;
use canopy_core::issues::{Blocker, IssueSummary};
use canopy_core::{
    ActivityItem, AuditEntry, Channel, MergeRequest, MergeState, Message, Presence, RosterEntry, Seq, SpawnRequest,
    SpawnState, Topic, TreeNode,
};
use canopy_proto::api::{
    MergeDetail, PostResponse, PromptsRenderResponse, RunInfo, UsageResponse, UsageSeriesResponse,
};
use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::auth::Session;

pub const JS: &str = include_str!("../assets/console.js");
pub const CSS: &str = include_str!("../assets/console.css");

/// Milliseconds since the epoch of an RFC 3339 time; `None` when it does not parse.
pub use canopy_core::timeline::ms_of;

/// A duration as an operator reads it: `45s`, `12m`, `3h 5m`, `2d 4h`.
pub fn span(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// A stored time as `2026-12-02 12:00:01 UTC`, the same on every page and for every reader.
fn when(at: &str) -> String {
    let trimmed = at.split('.').next().unwrap_or(at).trim_end_matches('Z');
    format!("{} UTC", trimmed.replace('T', " "))
}

pub fn time(at: &str) -> Markup {
    html! { time datetime=(at) { (when(at)) } }
}

/// The `<head>` every page shares; `extra` adds what a session's pages need.
fn head(title: &str, extra: Markup) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            (extra)
            title { (title) " · Canopy" }
            link rel="stylesheet" href="/assets/console.css";
        }
    }
}

/// The frame of every page: navigation, the live-connection banner, the CSRF token the
/// script sends with every POST, and the logout button.
pub fn page(title: &str, session: &Session, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title, html! { meta name="csrf" content=(session.csrf); script src="/assets/console.js" defer {} }))
            body {
                a.skip href="#main" { "Skip to content" }
                header {
                    nav aria-label="Console" {
                        a.brand href="/" { "Canopy" }
                        a href="/" { "Waiting" }
                        a href="/tree" { "Tree" }
                        a href="/issues" { "Issues" }
                        a href="/spend" { "Spend" }
                        a href="/channels" { "Channels" }
                        a href="/audit" { "Audit" }
                    }
                    form.logout method="post" action="/logout" {
                        input type="hidden" name="csrf" value=(session.csrf);
                        span.who { (session.operator) }
                        button type="submit" { "Log out" }
                    }
                }
                div #conn role="status" aria-live="polite" hidden { "reconnecting…" }
                div #toast role="status" aria-live="polite" {}
                main #main { h1 { (title) } (body) }
            }
        }
    }
}

/// A page outside a session (login, logout, errors): no navigation, no script.
pub fn bare(title: &str, text: &str) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title, html! {}))
            body { main #main { h1 { (title) } p { (text) } } }
        }
    }
}

/// After a link is opened: the session cookie is set; this page moves on to the console.
pub fn logged_in_page() -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; meta http-equiv="refresh" content="0; url=/"; title { "Logged in · Canopy" } }
            body { main #main { h1 { "Logged in" } p { a href="/" { "Open the console" } } } }
        }
    }
}

/// A query value, percent-encoded (topic names are free text).
pub fn query(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn login_needed() -> Markup {
    bare(
        "Log in",
        "This page needs a console session. Run `canopy web` on the daemon's machine for a one-time login link.",
    )
}

/// An action's answer: the script shows `#outcome` beside the form; without the script it is
/// the page.
pub fn outcome_page(title: &str, result: Result<Markup, &str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title, html! {}))
            body {
                main #main {
                    section #outcome {
                        @match result {
                            Ok(markup) => (markup),
                            Err(why) => p.error role="alert" { "Refused: " (why) },
                        }
                    }
                    p { a href="/" { "Back to the console" } }
                }
            }
        }
    }
}

pub fn failure(error: &CallError) -> Markup {
    html! {
        p.error role="alert" {
            @match error {
                CallError::Refused(e) => { "The API refused (" code { (e.code.as_str()) } "): " (e.message) }
                CallError::Unreachable(why) => { "The daemon did not answer: " (why) }
            }
        }
    }
}

fn amount(a: Option<canopy_core::budget::Amount>) -> String {
    a.map(say::amount).unwrap_or_else(|| "none proposed".into())
}

/// Approve and deny forms; with `override_needed` (a merge request without an approving
/// review), approving asks for the reason, which is recorded.
fn decide_forms(action: &str, label: &str, csrf: &str, override_needed: bool) -> Markup {
    html! {
        div.decide {
            form data-action method="post" action=(action) {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="decision" value="approve";
                @if override_needed {
                    label { span.sr { "Override reason for " (label) } input type="text" name="override" required placeholder="why approve without an approving review"; }
                }
                button.approve type="submit" aria-label=(format!("Approve {label}")) { @if override_needed { "Approve (override)" } @else { "Approve" } }
            }
            form data-action method="post" action=(action) {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="decision" value="deny";
                label { span.sr { "Reason to deny " (label) } input type="text" name="reason" required placeholder="reason to deny"; }
                button.deny type="submit" { "Deny" }
            }
            div.outcome data-outcome aria-live="polite" {}
        }
    }
}

/// A merge request's checks: each check's line, else its one-line result.
fn merge_checks(d: &MergeDetail) -> Markup {
    html! {
        @if d.checks.is_empty() {
            pre { (d.request.check) }
        } @else {
            ul { @for c in &d.checks { li class=(format!("check {}", c.state.as_str())) { (c.line()) } } }
        }
    }
}

/// A merge request's reviews: each verdict (or state), its summary and comments by file and line.
fn merge_review(d: &MergeDetail) -> Markup {
    html! {
        @if d.reviews.is_empty() { "none yet" }
        @for r in &d.reviews {
            div.verdict {
                strong { (r.verdict.map(|v| v.as_str()).unwrap_or(r.state.as_str())) }
                " by " (r.reviewer)
                @if r.head != d.request.head { " (of an older head)" }
                @if !r.summary.is_empty() { p { (r.summary) } }
                ul.comments { @for c in &r.comments { li { code { (c.file) ":" (c.line) } " " (c.body) } } }
            }
        }
    }
}

/// What a blocked issue waits for: issues (each a link), or the operator's answer.
pub fn blocker(b: &Blocker) -> Markup {
    html! {
        @match b {
            Blocker::Issues(numbers) => {
                "blocked by "
                @for (i, n) in numbers.iter().enumerate() {
                    @if i > 0 { ", " }
                    a href=(format!("/issues/{n}")) { "#" (n) }
                }
            }
            Blocker::Operator { question } => { "operator: " (question) }
        }
    }
}

/// *Waiting*: every pending spawn request, every merge request waiting for the operator or a
/// review (its checks, verdicts and comments beside the decision), the merge queue, the issues
/// blocked on the operator's answer, and the latest decisions as they land.
pub fn waiting(
    spawns: &[SpawnRequest],
    waiting_merges: &[MergeDetail],
    queue: &[MergeRequest],
    issues: &[IssueSummary],
    now_ms: i64,
    csrf: &str,
) -> Markup {
    let pending: Vec<&SpawnRequest> = spawns.iter().filter(|r| r.state == SpawnState::Pending).collect();
    let decided: Vec<&SpawnRequest> = spawns.iter().filter(|r| r.state != SpawnState::Pending).take(10).collect();
    html! {
        section #waiting data-live aria-labelledby="spawns" {
            h2 #spawns { "Spawn requests (" (pending.len()) ")" }
            @if pending.is_empty() { p.quiet { "Nothing waits for you." } }
            @for r in &pending {
                @let age = ms_of(&r.created_at).map(|t| span(now_ms - t)).unwrap_or_default();
                @let left = ms_of(&r.expires_at).map(|t| span(t - now_ms)).unwrap_or_default();
                article.request id=(format!("spawn-{}", r.id)) data-id=(r.id) {
                    h3 { code { (r.id) } " " (r.requester.as_str()) " asks for " strong { (r.handle.as_str()) } " (" (r.role.as_str()) ")" }
                    dl {
                        dt { "Name" } dd { (r.display_name) }
                        dt { "Charter" } dd { (r.charter) }
                        dt { "Reason" } dd { (r.reason) }
                        dt { "Budget" } dd { (amount(r.budget)) }
                        @if let Some(repo) = &r.repo { dt { "Repository" } dd { (repo) } }
                        dt { "Age" } dd { (age) }
                        dt { "Time left" } dd { (left) }
                    }
                    (decide_forms(&format!("/spawn/{}", r.id), &r.id, csrf, false))
                }
            }
            h2 { "Merge requests (" (waiting_merges.len()) ")" }
            @if waiting_merges.is_empty() { p.quiet { "No merge waits." } }
            @for d in waiting_merges {
                @let m = &d.request;
                article.request id=(format!("merge-{}", m.id)) data-id=(m.id) {
                    h3 { code { (m.id) } " " (m.requester.as_str()) ": " (m.title) " " span class=(format!("state {}", m.state.as_str())) { (m.state.as_str()) } }
                    dl {
                        dt { "Repository" } dd { (m.repo) " " code { (m.branch) } " → " code { (m.base) } }
                        dt { "Summary" } dd { (m.summary) }
                        dt { "Checks" } dd.checks { (merge_checks(d)) }
                        dt { "Review" } dd.review { (merge_review(d)) }
                        @if !d.conflicts.is_empty() {
                            dt { "Conflicts" } dd { @for c in &d.conflicts { div { code { (c.other) } ": " (c.files.join(", ")) } } }
                        }
                        dt { "Changes" } dd { pre { (m.diffstat) } }
                        dt { "Age" } dd { (ms_of(&m.created_at).map(|t| span(now_ms - t)).unwrap_or_default()) }
                    }
                    @let override_needed = m.state == MergeState::InReview
                        || m.verdict == Some(canopy_core::review::Verdict::ChangesRequested);
                    (decide_forms(&format!("/merges/{}", m.id), &m.id, csrf, override_needed))
                }
            }
            h2 #queue { "Merge queue (" (queue.len()) ")" }
            @if queue.is_empty() { p.quiet { "The queue is empty: approved requests land in order, each checked on the base as it is then." } }
            ol.queue {
                @for m in queue {
                    li id=(format!("queued-{}", m.id)) { code { (m.id) } " " (m.title) " (" (m.repo) ") " strong class=(format!("state {}", m.state.as_str())) { (m.state.as_str()) } }
                }
            }
            h2 #issues-waiting { "Issues waiting on you (" (issues.len()) ")" }
            @if issues.is_empty() { p.quiet { "No issue waits for your answer." } }
            @for i in issues {
                article.request id=(format!("waiting-issue-{}", i.number)) data-issue=(i.number) {
                    h3 { a href=(format!("/issues/{}", i.number)) { "#" (i.number) " " (i.title) } }
                    dl {
                        dt { "Owner" } dd { (i.owner.as_ref().map_or("nobody", |o| o.as_str())) }
                        @if let Some(b) = &i.blocker { dt { "Asks" } dd.blocker { (blocker(b)) } }
                        dt { "Waiting for" } dd { (ms_of(&i.updated_at).map(|t| span(now_ms - t)).unwrap_or_default()) }
                    }
                    p.quiet { "Answer with a comment on the issue: it reaches the owner in the issue's topic." }
                }
            }
            h2 { "Latest decisions" }
            @if decided.is_empty() { p.quiet { "None yet." } }
            ul.decided {
                @for r in &decided {
                    li id=(format!("decided-{}", r.id)) {
                        code { (r.id) } " " (r.handle.as_str()) " for " (r.requester.as_str()) ": "
                        strong class=(format!("state {}", r.state.as_str())) { (r.state.as_str()) }
                        @if let Some(note) = &r.note { " (" (note) ")" }
                        @if let Some(by) = &r.decided_by { " by " (by.as_str()) }
                    }
                }
            }
        }
    }
}

pub fn spawn_decided(r: &SpawnRequest) -> Markup {
    html! { p.ok { "Request " code { (r.id) } " is " strong { (r.state.as_str()) } "." @if let Some(n) = &r.note { " " (n) } } }
}

pub fn merge_decided(m: &MergeRequest) -> Markup {
    html! { p.ok { "Merge request " code { (m.id) } " is " strong { (m.state.as_str()) } "." @if let Some(n) = &m.note { " " (n) } } }
}

/// A badge for an agent that needs a look.
fn badge(presence: Presence) -> Option<&'static str> {
    match presence {
        Presence::Failing => Some("failing"),
        Presence::Stalled => Some("stalled"),
        Presence::Crashed => Some("crashed"),
        Presence::PausedBudget => Some("over budget"),
        _ => None,
    }
}

/// *Tree*: the tree from the Supervisor down, each agent with its presence, why it is idle,
/// its activity line, session, harness and spend.
pub fn tree(
    root: &TreeNode,
    roster: &[RosterEntry],
    usage: &UsageResponse,
    waiting: &std::collections::HashSet<&str>,
) -> Markup {
    let attention = roster.iter().filter(|a| badge(a.presence).is_some()).count();
    html! {
        section #tree data-live {
            p.summary { (roster.len()) " agents; " (attention) " need a look; " (waiting.len()) " wait for you." }
            div.picture { (crate::charts::tree(root, roster, usage, waiting)) }
        }
    }
}

/// *Spend*: spend over time for the workspace, an agent, its subtree or an issue, hourly over
/// 24 hours or daily over 30 days, with the budgets that cover it.
pub fn spend(series: &UsageSeriesResponse, scope: &str, query: &SpendQuery) -> Markup {
    let total: f64 = series.points.iter().map(|p| p.usd).sum();
    html! {
        form.filter method="get" action="/spend" {
            label { "Agent " input type="text" name="agent" value=(query.agent.as_deref().unwrap_or("")); }
            label.check { input type="checkbox" name="subtree" value="1" checked[query.subtree]; " its subtree" }
            label { "Issue " input type="text" name="issue" inputmode="numeric" value=(query.issue.map(|n| n.to_string()).unwrap_or_default()); }
            label.check { input type="checkbox" name="daily" value="1" checked[query.daily]; " daily, 30 days" }
            button type="submit" { "Show" }
        }
        section #spend data-live {
            p.summary { (scope) ": $" (format!("{total:.2}")) " over the last " (if query.daily { "30 days" } else { "24 hours" }) " (UTC buckets)." }
            div.picture { (crate::charts::spend(series)) }
            p.quiet { "Bars: each bucket's spend. Line: the running total. Dashed: each covering budget's dollar limit." }
        }
    }
}

/// What `/spend` shows.
#[derive(Debug, Default, serde::Deserialize)]
pub struct SpendQuery {
    pub agent: Option<String>,
    #[serde(default, deserialize_with = "flag")]
    pub subtree: bool,
    #[serde(default, deserialize_with = "number")]
    pub issue: Option<u64>,
    #[serde(default, deserialize_with = "flag")]
    pub daily: bool,
}

fn flag<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    let text: String = serde::Deserialize::deserialize(d)?;
    Ok(!text.is_empty() && text != "0")
}

fn number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let text: String = serde::Deserialize::deserialize(d)?;
    match text.trim() {
        "" => Ok(None),
        n => n.trim_start_matches('#').parse().map(Some).map_err(|_| serde::de::Error::custom("issue is a number")),
    }
}

/// An agent's timeline page: the last 24 hours of its turns, or one turn zoomed.
pub fn timeline(
    handle: &str,
    t: &canopy_core::timeline::Timeline,
    zoom: Option<&canopy_core::timeline::TurnSpan>,
) -> Markup {
    let busy: i64 = t.turns.iter().map(|turn| turn.end_ms.unwrap_or(t.to_ms) - turn.start_ms).sum();
    html! {
        section #timeline data-live {
            p.summary {
                (t.turns.len()) " turns in the last 24 hours, " (span(busy)) " working. "
                @if let Some(turn) = zoom { "Turn " (turn.turn_id) " of session " (turn.incarnation) ". " a href="?" { "Whole day" } }
                @else { "Select a turn to zoom to it." }
            }
            div.picture { (crate::charts::timeline(handle, t, zoom)) }
            @if let Some(turn) = zoom {
                ol.activity {
                    @for tool in &turn.tools {
                        li data-tool=(tool.name) { (tool.name) " · " (tool.outcome.as_deref().unwrap_or("running")) " · " (span(tool.end_ms.unwrap_or(t.to_ms) - tool.start_ms)) }
                    }
                }
            }
            p.quiet { "Bars: turns (dark while running), tool calls below them; ticks above: deliveries (blue) and steers (amber). The gaps are waits." }
        }
    }
}

/// *Channels*: every channel, most recent first.
pub fn channels(channels: &[Channel]) -> Markup {
    html! {
        section #channels data-live {
            table {
                thead { tr { th scope="col" { "Channel" } th scope="col" { "Kind" } th scope="col" { "Subscribers" } th scope="col" { "Last message" } } }
                tbody {
                    @for c in channels {
                        tr {
                            td { a href=(format!("/channels/{}", c.name.as_str())) { "#" (c.name.as_str()) } }
                            td { (c.kind.as_str()) }
                            td { (c.subscribers) }
                            td { @if c.last_seq > Seq(0) { "#" (c.last_seq.get()) } @else { "none" } }
                        }
                    }
                }
            }
        }
    }
}

/// A message body with its @mentions marked.
fn body(text: &str, mentions: &[canopy_core::Handle]) -> Markup {
    let mut out = String::new();
    for (i, word) in text.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let escaped = html! { (word) }.into_string();
        let handle = word.trim_start_matches('@').trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
        if word.starts_with('@') && mentions.iter().any(|m| m.as_str() == handle) {
            out.push_str(&format!("<mark class=\"mention\">{escaped}</mark>"));
        } else {
            out.push_str(&escaped);
        }
    }
    PreEscaped(out)
}

fn message(m: &Message, pinned: bool) -> Markup {
    let role =
        m.sender.role.as_ref().map(|r| r.as_str().to_owned()).unwrap_or_else(|| m.sender.kind.as_str().to_owned());
    html! {
        li.message id=(format!("m{}", m.seq.get())) {
            div.head {
                span.seq { "#" (m.seq.get()) } " "
                strong.sender { (m.sender.handle.as_str()) } " " span.role { (role) } " " (time(&m.created_at))
                @if pinned { " " span.badge { "pinned" } }
            }
            div.body { (body(&m.body, &m.mentions)) }
        }
    }
}

/// A channel: its topics, most recent first, one topic's messages, and the post box.
pub fn channel(
    name: &str,
    topics: &[Topic],
    topic: Option<&str>,
    messages: &[Message],
    pinned: &[Seq],
    csrf: &str,
) -> Markup {
    let key = canopy_sys::random_hex(8).unwrap_or_default();
    html! {
        div.split {
            nav.topics aria-label="Topics" {
                section #topics data-live {
                    h2 { "Topics" }
                    ul {
                        @for t in topics {
                            li {
                                a href=(format!("/channels/{name}?topic={}", query(t.name.as_str())))
                                  aria-current=[(Some(t.name.as_str()) == topic).then_some("page")] {
                                    (t.name.as_str())
                                }
                                " " span.meta { (t.messages) @if t.resolved { " · resolved" } }
                            }
                        }
                    }
                }
            }
            div.thread {
                section #messages data-live {
                    @match topic {
                        Some(t) => h2 { "#" (name) " › " (t) },
                        None => p.quiet { "No topics yet: post to start one." },
                    }
                    ol.messages { @for m in messages { (message(m, pinned.contains(&m.seq))) } }
                }
                form.post data-action method="post" action="/post" {
                    h2 { "Post" }
                    input type="hidden" name="csrf" value=(csrf);
                    input type="hidden" name="channel" value=(name);
                    input type="hidden" name="idempotency_key" value=(key);
                    label { "Topic " input type="text" name="topic" required value=(topic.unwrap_or("")); }
                    label.check { input type="checkbox" name="create_topic"; " create the topic if it is new" }
                    label { "Message " textarea name="body" required rows="3" {} }
                    button type="submit" { "Post" }
                    div.outcome data-outcome aria-live="polite" {}
                }
            }
        }
    }
}

/// A post's outcome per recipient.
pub fn posted(r: &PostResponse) -> Markup {
    html! {
        p.ok { "Posted " a href=(format!("/channels/{}?topic={}", r.message.channel.as_str(), query(r.message.topic.as_str()))) { "#" (r.message.seq.get()) }
            @if r.duplicate { " (already posted: the same message)" } }
        @if !r.outcomes.is_empty() {
            ul.outcomes {
                @for o in &r.outcomes {
                    li { strong class=(format!("outcome {}", o.outcome.as_str())) { (o.outcome.as_str()) } " " (o.recipient)
                        @if let Some(reason) = &o.reason { " (" (reason) ")" } }
                }
            }
        }
        @if !r.unknown_mentions.is_empty() { p.error { "Unknown mentions: " (r.unknown_mentions.join(", ")) } }
    }
}

/// How an activity item is shown: failures, blocks and aborts stand out, successes stay
/// compact, a running turn is marked active; raw reasoning is never stored, so never shown.
fn activity_class(item: &ActivityItem, open_turn: Option<&str>) -> &'static str {
    match item.kind.as_str() {
        "tool_failed" | "tool_blocked" | "tool_aborted" | "model_error" | "malformed" | "steer_dropped" => "bad",
        "tool_result" => "compact",
        "steer_injected" => "steer",
        "turn_started" if item.turn_id.as_deref() == open_turn => "active",
        _ => "",
    }
}

/// *Agent*: one agent's live activity, its prompt, runs and usage.
pub fn agent(
    handle: &str,
    entry: Option<&RosterEntry>,
    activity: &[ActivityItem],
    prompt: &Result<PromptsRenderResponse, String>,
    runs: &[RunInfo],
    usage: &UsageResponse,
) -> Markup {
    // The open turn: started, not yet ended.
    let mut open: Option<&str> = None;
    for item in activity {
        match item.kind.as_str() {
            "turn_started" => open = item.turn_id.as_deref(),
            "turn_ended" if item.turn_id.as_deref() == open => open = None,
            _ => {}
        }
    }
    html! {
        section #status data-live {
            @match entry {
                Some(a) => p.summary {
                    span class=(format!("presence {}", a.presence.as_str())) { (a.presence.as_str()) }
                    @if let Some(b) = badge(a.presence) { " " span.badge { (b) } }
                    @if let Some(r) = &a.reason { " (" (r) ")" }
                    " · session " (a.incarnation.get()) " · " (a.harness)
                    @if let Some(t) = &a.activity { " — " (t) }
                    @if open.is_some() { " · " strong.active { "turn running" } }
                    " · " a href=(format!("/agents/{handle}/timeline")) { "timeline" }
                    " · " a href=(format!("/spend?agent={handle}&subtree=1")) { "spend" }
                },
                None => p.quiet { "No such agent on the roster." },
            }
        }
        section #activity data-live aria-label="Activity" {
            h2 { "Activity" }
            @if activity.is_empty() { p.quiet { "Nothing yet." } }
            ol.activity {
                @for item in activity {
                    li class=(activity_class(item, open)) data-kind=(item.kind) {
                        span.meta { (time(&item.at)) " #" (item.incarnation.get()) }
                        @if item.agent.as_str() != handle { " " span.badge { (item.agent.as_str()) } }
                        " " (item.summary)
                    }
                }
            }
        }
        section #prompt {
            h2 { "Prompt" }
            @match prompt {
                Ok(p) => {
                    p { "Hash " code { (p.hash) } " · " (p.mode) " · role " (p.role) " · " (p.harness) }
                    p { "Sections: " (p.sections.join(", ")) }
                    p { "Tools: " (p.tools.join(", ")) }
                    details { summary { "The full prompt" } pre { (p.text) } }
                }
                Err(why) => p.error { (why) },
            }
        }
        section #runs data-live {
            h2 { "Runs" }
            @if runs.is_empty() { p.quiet { "No subagent runs." } }
            ul { @for r in runs { li { code { (r.handle) } " " (r.definition) " " strong { (r.status) } " " (time(&r.started_at))
                @if let Some(b) = &r.branch { " " code { (b) } } } } }
        }
        section #usage data-live {
            h2 { "Usage" }
            p { (usage.total.input_tokens) " input and " (usage.total.output_tokens) " output tokens"
                @if let Some(c) = usage.total.cost_usd { ", $" (format!("{c:.4}")) } }
            ul { @for b in &usage.budgets { li { (b.owner.as_str()) " " (b.scope.as_str()) ": " (say::spend(b.limit, b.spent)) " (" (b.percent) "%)" } } }
        }
    }
}

/// What the audit page filters by (substrings; empty matches all).
#[derive(Debug, Default)]
pub struct AuditFilter {
    pub action: String,
    pub actor: String,
    pub text: String,
}

/// *Audit*: the audit log, newest first, filtered.
pub fn audit(entries: &[AuditEntry], filter: &AuditFilter) -> Markup {
    let keep = |e: &&AuditEntry| {
        e.action.contains(filter.action.trim())
            && e.actor.as_ref().map_or("", |a| a.as_str()).contains(filter.actor.trim())
            && (filter.text.trim().is_empty()
                || e.target.contains(filter.text.trim())
                || e.detail.contains(filter.text.trim()))
    };
    let shown: Vec<&AuditEntry> = entries.iter().filter(keep).collect();
    html! {
        form.filter method="get" action="/audit" role="search" {
            label { "Action " input type="text" name="action" value=(filter.action); }
            label { "Actor " input type="text" name="actor" value=(filter.actor); }
            label { "Text " input type="text" name="text" value=(filter.text); }
            button type="submit" { "Filter" }
        }
        section #audit data-live {
            p.summary { (shown.len()) " of " (entries.len()) " entries" }
            table {
                thead { tr { th scope="col" { "When" } th scope="col" { "Actor" } th scope="col" { "Action" } th scope="col" { "Target" } th scope="col" { "Detail" } } }
                tbody {
                    @for e in &shown {
                        tr { td { (time(&e.at)) } td { (e.actor.as_ref().map_or("canopy", |a| a.as_str())) } td { code { (e.action) } } td { (e.target) } td { (e.detail) } }
                    }
                }
            }
        }
    }
}
