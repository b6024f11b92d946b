//! The issues area: the work ledger from the operator's side. Lists issues (every page, or up
//! to `--limit`), files, shows, assigns, moves, comments on, closes, edits and budgets one;
//! imports GitHub's JSON (`gh issue list --json number,title,body,labels,state`) and exports
//! JSON lines.
//!
//! Owns reading a `gh` file, checked whole with the rules the daemon applies before anything is
//! sent, and the text forms of issues. Does not decide who may move, assign or close an issue,
//! or which moves are allowed: the daemon does, with `canopy_core::issues`; numbers and states
//! are parsed here only so a typo is named before any call.

use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

use canopy_core::issues::{self as rules, Blocker, Issue, IssueState, IssueSummary};
use canopy_proto::api::*;
use canopy_proto::method;

use super::call::{BadStdin, call, text_from_stdin};
use crate::args::{IssuesCommand, IssuesEditArgs, IssuesListArgs, IssuesNewArgs};
use crate::client::{CallError, Client};
use crate::exit::{fail, fail_usage};
use crate::output;
use crate::writer::{errln, outln};

/// The most issues `issues.list` answers in one page.
const LIST_PAGE: u32 = 200;
/// The most issues `issues.export` answers in one page.
const EXPORT_PAGE: u32 = 1000;
/// The most issues one `issues.import` call carries.
const IMPORT_CHUNK: usize = 100;
/// The most bytes (as JSON) of issues one `issues.import` call carries, well below the NATS
/// server's 4 MB payload limit.
const IMPORT_CHUNK_BYTES: usize = 1024 * 1024;
/// How `gh` prints what `canopy issues import` reads.
const GH_COMMAND: &str = "gh issue list --state all --limit 1000 --json number,title,body,labels,state";

/// Why an issues command failed: a call the daemon refused or could not answer, text on stdin
/// that cannot be sent, or bad usage (exit 64: a number, state or file that is not one, found
/// before any call) naming the argument.
enum Failed {
    Call(CallError),
    Stdin { bad: BadStdin, field: &'static str },
    Usage { field: &'static str, message: String },
}

impl From<CallError> for Failed {
    fn from(e: CallError) -> Failed {
        Failed::Call(e)
    }
}

/// `canopy issues [...]`: each command, then its exit code.
pub async fn issues(client: &Client, json: bool, list: IssuesListArgs, command: Option<IssuesCommand>) -> u8 {
    let result = match command {
        None => list_issues(client, json, list).await,
        Some(IssuesCommand::New(args)) => new(client, json, args).await,
        Some(IssuesCommand::Show { issue }) => show(client, json, &issue).await,
        Some(IssuesCommand::Assign { issue, owner, note }) => assign(client, json, &issue, owner, note).await,
        Some(IssuesCommand::Move { issue, state, note, blocked_by, question }) => {
            move_issue(client, json, &issue, &state, note, &blocked_by, question).await
        }
        Some(IssuesCommand::Comment { issue, text }) => comment(client, json, &issue, text).await,
        Some(IssuesCommand::Close { issue, resolution, wontdo, note }) => {
            close(client, json, &issue, resolution, wontdo, note).await
        }
        Some(IssuesCommand::Edit(args)) => edit(client, json, args).await,
        Some(IssuesCommand::Budget { issue, usd, clear: _ }) => budget(client, json, &issue, usd).await,
        Some(IssuesCommand::Import { file, source }) => import(client, json, &file, source).await,
        Some(IssuesCommand::Export { output }) => export(client, json, output.as_deref()).await,
    };
    match result {
        Ok(()) => 0,
        Err(Failed::Call(e)) => fail(json, &e),
        Err(Failed::Stdin { bad, field }) => bad.fail(json, field),
        Err(Failed::Usage { field, message }) => fail_usage(json, field, &message),
    }
}

/// An issue number from the command line, `N` or `#N`.
fn number(field: &'static str, text: &str) -> Result<u64, Failed> {
    rules::parse_number(field, text).map_err(|e| Failed::Usage { field, message: e.to_string() })
}

fn numbers(field: &'static str, texts: &[String]) -> Result<Vec<u64>, Failed> {
    texts.iter().map(|t| number(field, t)).collect()
}

/// A state from the command line.
fn state(text: &str) -> Result<IssueState, Failed> {
    IssueState::parse(text.trim()).ok_or_else(|| Failed::Usage {
        field: "state",
        message: format!("unknown state {text:?}; one of {}", IssueState::expected()),
    })
}

/// Text given as an argument, or read from stdin when it is `-` or absent.
fn text_or_stdin(given: Option<String>, what: &str, field: &'static str) -> Result<String, Failed> {
    match given {
        Some(text) if text != "-" => Ok(text),
        _ => text_from_stdin(what, rules::MAX_BODY, "an issue's body or comment")
            .map_err(|bad| Failed::Stdin { bad, field }),
    }
}

/// `canopy issues`: every page that matches (or up to `--limit`), printed as one list.
async fn list_issues(client: &Client, json: bool, args: IssuesListArgs) -> Result<(), Failed> {
    let closed_too = args.all;
    let filtered = args.state.is_some() || args.owner.is_some() || args.subtree.is_some() || args.label.is_some();
    let mut request = IssuesListRequest {
        state: args.state.as_deref().map(state).transpose()?,
        owner: args.owner,
        subtree: args.subtree,
        label: args.label,
        include_closed: args.all,
        limit: None,
        ..IssuesListRequest::default()
    };
    let wanted = args.limit.map(|n| n as usize);
    let mut all = IssuesListResponse { issues: Vec::new(), next_after: None };
    loop {
        let room = wanted.map_or(LIST_PAGE as usize, |w| w.saturating_sub(all.issues.len()));
        request.limit = Some(room.min(LIST_PAGE as usize) as u32);
        let page = client.send::<method::IssuesList>(&request).await?;
        let got = page.issues.len();
        all.issues.extend(page.issues);
        all.next_after = page.next_after;
        let full = wanted.is_some_and(|w| all.issues.len() >= w);
        match page.next_after {
            // A page that brought nothing, or no progress, ends the walk rather than looping.
            Some(after) if !full && got > 0 && request.after.is_none_or(|before| after > before) => {
                request.after = Some(after)
            }
            _ => break,
        }
    }
    if json {
        output::json(&all);
        return Ok(());
    }
    if all.issues.is_empty() {
        match closed_too || filtered {
            true => outln!("no issues match"),
            false => outln!("no open issues (`--all` lists closed ones too)"),
        }
        return Ok(());
    }
    for line in table(&all.issues, SystemTime::now()) {
        outln!("{line}");
    }
    if let Some(after) = all.next_after {
        outln!("(more after #{after}: raise --limit)");
    }
    Ok(())
}

/// `canopy issues new`.
async fn new(client: &Client, json: bool, args: IssuesNewArgs) -> Result<(), Failed> {
    let IssuesNewArgs { title, body, assign, labels, parent, depends_on, idempotency_key } = args;
    // Numbers first: a typo is named before stdin is read.
    let parent = parent.as_deref().map(|p| number("parent", p)).transpose()?;
    let depends_on = numbers("depends_on", &depends_on)?;
    let body = match body {
        None => String::new(),
        given => text_or_stdin(given, "the issue body", "body")?,
    };
    let request = IssuesCreateRequest { title, body, owner: assign, parent, labels, depends_on, idempotency_key };
    Ok(call::<method::IssuesCreate>(client, json, &request, |i: &Issue| outln!("{}", said("filed", i))).await?)
}

/// `canopy issues show N`.
async fn show(client: &Client, json: bool, issue: &str) -> Result<(), Failed> {
    let request = IssuesShowRequest { issue: number("issue", issue)? };
    Ok(call::<method::IssuesShow>(client, json, &request, |d: &IssueDetail| {
        for line in detail(d, SystemTime::now()) {
            outln!("{line}");
        }
    })
    .await?)
}

/// `canopy issues assign N H`.
async fn assign(client: &Client, json: bool, issue: &str, owner: String, note: Option<String>) -> Result<(), Failed> {
    let request = IssuesAssignRequest { issue: number("issue", issue)?, owner, note };
    Ok(call::<method::IssuesAssign>(client, json, &request, |i: &Issue| outln!("{}", said("assigned", i))).await?)
}

/// `canopy issues move N STATE --note T`: closing is `close`'s, which asks for a resolution.
async fn move_issue(
    client: &Client,
    json: bool,
    issue: &str,
    to: &str,
    note: String,
    blocked_by: &[String],
    question: Option<String>,
) -> Result<(), Failed> {
    let issue = number("issue", issue)?;
    let to = state(to)?;
    if to.is_closed() {
        let message =
            format!("close an issue with `canopy issues close {issue} --resolution TEXT` (--wontdo for wontdo)");
        return Err(Failed::Usage { field: "state", message });
    }
    let request = IssuesUpdateRequest {
        issue,
        state: Some(to),
        note: Some(note),
        blocked_by: numbers("blocked_by", blocked_by)?,
        question,
        ..IssuesUpdateRequest::default()
    };
    Ok(call::<method::IssuesUpdate>(client, json, &request, |i: &Issue| outln!("{}", said("moved", i))).await?)
}

/// `canopy issues comment N TEXT` (the text from stdin when absent or `-`).
async fn comment(client: &Client, json: bool, issue: &str, text: Option<String>) -> Result<(), Failed> {
    let issue = number("issue", issue)?;
    let text = text_or_stdin(text, "the comment", "text")?;
    let request = IssuesCommentRequest { issue, text };
    Ok(call::<method::IssuesComment>(client, json, &request, |i: &Issue| outln!("{}", said("commented on", i))).await?)
}

/// `canopy issues close N --resolution TEXT [--wontdo]`: a move to done or wontdo whose note
/// is the resolution unless one is given.
async fn close(
    client: &Client,
    json: bool,
    issue: &str,
    resolution: String,
    wontdo: bool,
    note: Option<String>,
) -> Result<(), Failed> {
    let request = IssuesUpdateRequest {
        issue: number("issue", issue)?,
        state: Some(if wontdo { IssueState::Wontdo } else { IssueState::Done }),
        note: Some(note.unwrap_or_else(|| resolution.clone())),
        resolution: Some(resolution),
        ..IssuesUpdateRequest::default()
    };
    Ok(call::<method::IssuesUpdate>(client, json, &request, |i: &Issue| outln!("{}", said("closed", i))).await?)
}

/// `canopy issues edit N [--title] [--body] [--label]... [--depends-on]...`.
async fn edit(client: &Client, json: bool, args: IssuesEditArgs) -> Result<(), Failed> {
    let IssuesEditArgs { issue, title, body, labels, clear_labels, depends_on, clear_depends_on } = args;
    let issue = number("issue", &issue)?;
    let labels = (clear_labels || !labels.is_empty()).then_some(labels);
    let depends_on = match clear_depends_on || !depends_on.is_empty() {
        true => Some(numbers("depends_on", &depends_on)?),
        false => None,
    };
    if title.is_none() && body.is_none() && labels.is_none() && depends_on.is_none() {
        let message = "nothing to change: give --title, --body, --label, --depends-on or a --clear flag";
        return Err(Failed::Usage { field: "issue", message: message.into() });
    }
    let body = match body {
        None => None,
        given => Some(text_or_stdin(given, "the issue body", "body")?),
    };
    let request = IssuesUpdateRequest { issue, title, body, labels, depends_on, ..Default::default() };
    Ok(call::<method::IssuesUpdate>(client, json, &request, |i: &Issue| outln!("{}", said("edited", i))).await?)
}

/// `canopy issues budget N --usd X | --clear`.
async fn budget(client: &Client, json: bool, issue: &str, usd: Option<f64>) -> Result<(), Failed> {
    let request = IssuesBudgetRequest { issue: number("issue", issue)?, usd };
    Ok(call::<method::IssuesBudget>(client, json, &request, |i: &Issue| match i.budget_usd {
        Some(usd) => outln!("#{} has a budget of {}: runs for it are held once it is spent", i.number, dollars(usd)),
        None => outln!("#{} has no budget now", i.number),
    })
    .await?)
}

/// `canopy issues import FILE`: the file is read and checked whole, then sent in chunks;
/// issues imported before (the same source and number) are skipped by the daemon.
async fn import(client: &Client, json: bool, file: &Path, source: String) -> Result<(), Failed> {
    let name = if file == Path::new("-") { "stdin".to_owned() } else { file.display().to_string() };
    let text = match file == Path::new("-") {
        true => std::io::read_to_string(std::io::stdin()),
        false => std::fs::read_to_string(file),
    }
    .map_err(|e| Failed::Usage { field: "file", message: format!("reading {name}: {e}") })?;
    let issues = parse_gh(&text).map_err(|why| Failed::Usage { field: "file", message: format!("{name}: {why}") })?;
    let total = issues.len();
    let mut all = IssuesImportResponse { created: Vec::new(), skipped: 0 };
    let mut sent = 0;
    for chunk in chunks(issues, IMPORT_CHUNK, IMPORT_CHUNK_BYTES) {
        let size = chunk.len();
        let request = IssuesImportRequest { source: source.clone(), issues: chunk };
        match client.send::<method::IssuesImport>(&request).await {
            Ok(r) => {
                all.created.extend(r.created);
                all.skipped += r.skipped;
                sent += size;
            }
            Err(e) => {
                if sent > 0 {
                    errln!(
                        "{sent} of {total} issues were imported before this error ({} created); importing the file \
                         again skips them",
                        all.created.len()
                    );
                }
                return Err(e.into());
            }
        }
    }
    match json {
        true => output::json(&all),
        false => outln!("{}", import_summary(&all, &source)),
    }
    Ok(())
}

/// `canopy issues export [--output FILE]`: every issue as a JSON line, page by page. A file is
/// written beside its destination and renamed over it at the end, so a failed export leaves
/// what was there.
async fn export(client: &Client, json: bool, path: Option<&Path>) -> Result<(), Failed> {
    let write_error = |e: std::io::Error| {
        let to = path.map_or("stdout".to_owned(), |p| p.display().to_string());
        Failed::Usage { field: "output", message: format!("writing {to}: {e}") }
    };
    // Stdout is the CLI's writer's (a closed pipe or a full device ends the command as it
    // does every other); a file is ours.
    let (mut out, file): (Option<Box<dyn Write>>, Option<tempfile::NamedTempFile>) = match path {
        None => (None, None),
        Some(path) => {
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let file = tempfile::NamedTempFile::new_in(dir).map_err(write_error)?;
            (Some(Box::new(std::io::BufWriter::new(file.reopen().map_err(write_error)?))), Some(file))
        }
    };
    let mut request = IssuesExportRequest { after: None, limit: Some(EXPORT_PAGE) };
    let mut exported = 0usize;
    loop {
        let page = client.send::<method::IssuesExport>(&request).await?;
        let mut lines = Vec::new();
        for issue in &page.issues {
            serde_json::to_writer(&mut lines, issue).map_err(|e| write_error(e.into()))?;
            lines.push(b'\n');
        }
        match &mut out {
            Some(out) => out.write_all(&lines).map_err(write_error)?,
            None => crate::writer::out_bytes(&lines),
        }
        exported += page.issues.len();
        match page.next_after {
            Some(after) if !page.issues.is_empty() && request.after.is_none_or(|before| after > before) => {
                request.after = Some(after)
            }
            _ => break,
        }
    }
    if let Some(mut out) = out {
        out.flush().map_err(write_error)?;
    }
    let (Some(file), Some(path)) = (file, path) else { return Ok(()) };
    file.persist(path).map_err(|e| write_error(e.error))?;
    match json {
        true => output::json(&serde_json::json!({ "exported": exported, "output": path })),
        false => outln!("exported {exported} issue{} to {}", plural(exported), path.display()),
    }
    Ok(())
}

/// Reads `gh issue list --json number,title,body,labels,state` output: a JSON array of issues
/// (labels may carry more than their name). Every issue is checked as the daemon will check
/// it, so a bad file is refused whole, naming the entry and what is wrong, before anything
/// is filed. States become `OPEN` or `CLOSED` (any case is accepted; a missing one is open).
fn parse_gh(text: &str) -> Result<Vec<ImportedIssue>, String> {
    let entries: Vec<serde_json::Value> = serde_json::from_str(text)
        .map_err(|e| format!("not a JSON array of issues ({e}); make it with `{GH_COMMAND}`"))?;
    let mut seen = std::collections::BTreeMap::new();
    let mut issues = Vec::with_capacity(entries.len());
    for (index, mut entry) in entries.into_iter().enumerate() {
        // `gh` may print an empty body or label list as null: the same as absent.
        if let Some(fields) = entry.as_object_mut() {
            fields.retain(|key, value| !(value.is_null() && matches!(key.as_str(), "body" | "labels" | "state")));
        }
        let at = match entry.get("number").and_then(serde_json::Value::as_u64) {
            Some(n) => format!("entry {} (#{n})", index + 1),
            None => format!("entry {}", index + 1),
        };
        let mut issue: ImportedIssue = serde_json::from_value(entry)
            .map_err(|e| format!("{at}: {e}; each entry needs number and title (`{GH_COMMAND}`)"))?;
        if issue.number == 0 || issue.number > i64::MAX as u64 {
            return Err(format!("{at}: {} is not an issue number", issue.number));
        }
        if let Some(first) = seen.insert(issue.number, index + 1) {
            return Err(format!("{at}: #{} is also entry {first}", issue.number));
        }
        issue.state = match issue.closed() {
            Some(false) => "OPEN".to_owned(),
            Some(true) => "CLOSED".to_owned(),
            None => return Err(format!("{at}: state {:?} is neither OPEN nor CLOSED", issue.state)),
        };
        let labels = rules::imported_labels(issue.labels.iter().map(|l| l.name.as_str()));
        let checked = rules::check_title(&rules::imported_title(&issue.title))
            .and_then(|_| rules::check_text("body", &rules::imported_body(&issue.body), true))
            .and_then(|_| rules::check_labels(&labels));
        checked.map_err(|e| format!("{at}: {e}"))?;
        issues.push(issue);
    }
    Ok(issues)
}

/// Splits issues into calls of at most `max_count` issues and about `max_bytes` of JSON (one
/// issue larger than that still goes, alone).
fn chunks(issues: Vec<ImportedIssue>, max_count: usize, max_bytes: usize) -> Vec<Vec<ImportedIssue>> {
    let mut out: Vec<Vec<ImportedIssue>> = Vec::new();
    let mut bytes = 0;
    for issue in issues {
        let size = serde_json::to_vec(&issue).map_or(0, |v| v.len()) + 1;
        let fits = out.last().is_some_and(|last| last.len() < max_count && bytes + size <= max_bytes);
        if !fits {
            out.push(Vec::new());
            bytes = 0;
        }
        bytes += size;
        if let Some(last) = out.last_mut() {
            last.push(issue);
        }
    }
    out
}

/// What an import did, in one line.
fn import_summary(r: &IssuesImportResponse, source: &str) -> String {
    let created = match (r.created.first(), r.created.last()) {
        (Some(first), Some(last)) if first != last => format!(" (#{first} to #{last})"),
        (Some(first), _) => format!(" (#{first})"),
        _ => String::new(),
    };
    format!("imported from {source}: {} created{created}, {} skipped (imported before)", r.created.len(), r.skipped)
}

/// The list as an aligned table with a header: number, state, owner, age, blocked by, spend,
/// title (last, as long as it is).
fn table(issues: &[IssueSummary], now: SystemTime) -> Vec<String> {
    let rows: Vec<[String; 7]> = issues
        .iter()
        .map(|i| {
            [
                format!("#{}", i.number),
                i.state.to_string(),
                owner(i.owner.as_ref()),
                output::age(&i.created_at, now),
                blocked_by(i.blocker.as_ref(), 40),
                dollars(i.spend_usd),
                i.title.clone(),
            ]
        })
        .collect();
    let header = ["issue", "state", "owner", "age", "blocked by", "spend", "title"].map(str::to_owned);
    let mut widths = [0usize; 7];
    for row in std::iter::once(&header).chain(&rows) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    std::iter::once(&header)
        .chain(&rows)
        .map(|r| {
            let [number, state, owner, age, blocked, spend, title] = r;
            let [n, s, o, a, b, d, _] = widths;
            format!("{number:n$}  {state:s$}  {owner:o$}  {age:>a$}  {blocked:b$}  {spend:>d$}  {title}")
        })
        .collect()
}

/// An issue and its history, as `canopy issues show` prints it: the fields that are set,
/// the body, sub-issues, links, then the events oldest first.
fn detail(d: &IssueDetail, now: SystemTime) -> Vec<String> {
    let i = &d.issue;
    let mut out = vec![format!("#{} {}", i.number, i.title)];
    let mut field = |name: &str, value: String| out.push(format!("  {name:<10}  {value}"));
    field("state", i.state.to_string());
    field("owner", owner(i.owner.as_ref()));
    field("reporter", i.reporter.to_string());
    if let Some(parent) = i.parent {
        field("parent", format!("#{parent}"));
    }
    if !i.depends_on.is_empty() {
        field("depends on", hashes(&i.depends_on));
    }
    if !i.labels.is_empty() {
        field("labels", i.labels.join(", "));
    }
    if let Some(blocker) = &i.blocker {
        field("blocked by", blocked_by(Some(blocker), usize::MAX));
    }
    if let Some(resolution) = &i.resolution {
        field("resolution", resolution.clone());
    }
    if let Some(usd) = i.budget_usd {
        field("budget", dollars(usd));
    }
    field("spend", spend(&d.spend));
    if let Some(topic) = &d.topic {
        field("topic", topic.clone());
    }
    if let Some(source) = &i.source {
        field("source", source.clone());
    }
    field("filed", format!("{} ({} ago)", output::time(&i.created_at), output::age(&i.created_at, now)));
    field("updated", output::time(&i.updated_at));
    if !i.body.trim().is_empty() {
        out.push(String::new());
        out.extend(i.body.lines().map(|l| format!("  {l}").trim_end().to_owned()));
    }
    if !d.subissues.is_empty() {
        out.push(String::new());
        out.push("sub-issues".to_owned());
        out.extend(table(&d.subissues, now).into_iter().map(|l| format!("  {l}")));
    }
    if !d.runs.is_empty() || !d.merges.is_empty() {
        out.push(String::new());
    }
    if !d.runs.is_empty() {
        out.push(format!("runs    {}", d.runs.join(", ")));
    }
    if !d.merges.is_empty() {
        out.push(format!("merges  {}", d.merges.join(", ")));
    }
    out.push(String::new());
    out.push(if d.events.len() >= 200 { "events (the newest 200)" } else { "events" }.to_owned());
    out.extend(events(&d.events));
    out
}

/// Events, oldest first, one each: `at  actor  kind  text`, a text's later lines under its first.
fn events(events: &[canopy_core::issues::IssueEvent]) -> Vec<String> {
    let times: Vec<String> = events.iter().map(|e| output::time(&e.at)).collect();
    let at = times.iter().map(|t| t.chars().count()).max().unwrap_or(0);
    let actor = events.iter().map(|e| e.actor.as_str().len()).max().unwrap_or(0);
    let kind = events.iter().map(|e| e.kind.len()).max().unwrap_or(0);
    let margin = " ".repeat(2 + at + 2 + actor + 2 + kind + 2);
    events
        .iter()
        .zip(&times)
        .map(|(e, time)| {
            let text = e.text.trim_end().replace('\n', &format!("\n{margin}"));
            format!("  {time:at$}  {:actor$}  {:kind$}  {text}", e.actor.as_str(), e.kind).trim_end().to_owned()
        })
        .collect()
}

/// What a command did to an issue, in one line: `filed #5 Fix the login (open, owner -)`.
fn said(verb: &str, i: &Issue) -> String {
    let mut facts = vec![i.state.to_string(), format!("owner {}", owner(i.owner.as_ref()))];
    if let Some(blocker) = &i.blocker {
        facts.push(format!("blocked by {}", blocked_by(Some(blocker), 60)));
    }
    if let Some(resolution) = &i.resolution {
        facts.push(output::one_line(resolution, 80));
    }
    format!("{verb} #{} {} ({})", i.number, i.title, facts.join(", "))
}

fn owner(owner: Option<&canopy_core::Handle>) -> String {
    owner.map_or("-".to_owned(), ToString::to_string)
}

/// What blocks an issue: `#3, #5`, or `operator: <the question, cut to max characters>`; `-`.
fn blocked_by(blocker: Option<&Blocker>, max: usize) -> String {
    match blocker {
        None => "-".to_owned(),
        Some(Blocker::Issues(issues)) => hashes(issues),
        Some(Blocker::Operator { question }) => format!("operator: {}", output::one_line(question, max)),
    }
}

fn hashes(numbers: &[u64]) -> String {
    numbers.iter().map(|n| format!("#{n}")).collect::<Vec<_>>().join(", ")
}

fn dollars(usd: f64) -> String {
    format!("${usd:.2}")
}

/// An issue's spend: its own, its sub-issues' and the total, in dollars and tokens.
fn spend(s: &canopy_core::issues::IssueSpend) -> String {
    let own = format!("{} ({} tokens)", dollars(s.usd), s.tokens);
    if s.subissues_usd == 0.0 && s.subissues_tokens == 0 {
        return own;
    }
    format!(
        "{own} own, {} ({} tokens) sub-issues, {} in all",
        dollars(s.subissues_usd),
        s.subissues_tokens,
        dollars(s.usd + s.subissues_usd)
    )
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

    use std::time::{Duration, UNIX_EPOCH};

    use canopy_core::Handle;

    use super::*;

    fn summary(number: u64, state: IssueState, owner: Option<&str>, blocker: Option<Blocker>) -> IssueSummary {
        IssueSummary {
            number,
            title: format!("Issue {number}"),
            state,
            owner: owner.map(|h| Handle::from_trusted(h.into())),
            parent: None,
            labels: Vec::new(),
            blocker,
            spend_usd: 1.5,
            created_at: "2026-01-01T00:00:00Z".into(),
            updated_at: "2026-01-01T00:00:00Z".into(),
        }
    }

    fn at(secs_after_created: u64) -> SystemTime {
        let created = humantime::parse_rfc3339("2026-01-01T00:00:00Z").unwrap_or(UNIX_EPOCH);
        created + Duration::from_secs(secs_after_created)
    }

    #[test]
    fn gh_json_is_read_with_extra_label_fields_and_states_in_any_case() {
        let text = r#"[
            {"number": 12, "title": "Fix the login", "body": "It fails.", "state": "OPEN",
             "labels": [{"id": "LA_1", "name": "bug", "description": "", "color": "d73a4a"}]},
            {"number": 13, "title": "Old", "body": "", "labels": [], "state": "closed"},
            {"number": 14, "title": "No state or labels"},
            {"number": 15, "title": "Nulls", "body": null, "labels": null}
        ]"#;
        let issues = parse_gh(text).unwrap();
        assert_eq!(issues.len(), 4);
        assert_eq!(issues[0].labels.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), ["bug"]);
        let states: Vec<&str> = issues.iter().map(|i| i.state.as_str()).collect();
        assert_eq!(states, ["OPEN", "CLOSED", "OPEN", "OPEN"]);
        assert!(issues[3].body.is_empty() && issues[3].labels.is_empty());
        assert!(parse_gh("[]").unwrap().is_empty());
    }

    #[test]
    fn a_bad_gh_file_is_refused_naming_the_entry_and_what_is_wrong() {
        let cases = [
            (r#"{"number": 1}"#, "not a JSON array"),
            ("[{\"number\": 1, \"title\": \"a\"}", "not a JSON array"),
            (r#"[{"number": 1, "title": "a"}, {"number": 2}]"#, "entry 2 (#2): missing field `title`"),
            (r#"[{"number": 1, "title": "a", "state": "MERGED"}]"#, "entry 1 (#1): state \"MERGED\""),
            (r#"[{"number": 1, "title": "a"}, {"number": 1, "title": "b"}]"#, "#1 is also entry 1"),
            (r#"[{"number": 0, "title": "a"}]"#, "entry 1 (#0): 0 is not an issue number"),
            (r#"[{"number": 3, "title": " "}]"#, "entry 1 (#3): "),
            (r#"[{"number": "x", "title": "a"}]"#, "entry 1: invalid type"),
        ];
        for (text, expected) in cases {
            match parse_gh(text) {
                Err(why) => assert!(why.contains(expected), "{text}: {why}"),
                Ok(issues) => panic!("{text} was read: {issues:?}"),
            }
        }
    }

    #[test]
    fn imports_go_in_chunks_by_count_and_by_size() {
        let issue = |n: u64, body: usize| ImportedIssue {
            number: n,
            title: "t".into(),
            body: "b".repeat(body),
            labels: Vec::new(),
            state: "OPEN".into(),
        };
        let sizes: Vec<usize> =
            chunks((1..=250).map(|n| issue(n, 0)).collect(), 100, usize::MAX).iter().map(Vec::len).collect();
        assert_eq!(sizes, [100, 100, 50]);
        let big: Vec<ImportedIssue> = (1..=5).map(|n| issue(n, 400)).collect();
        let sizes: Vec<usize> = chunks(big, 100, 1000).iter().map(Vec::len).collect();
        assert_eq!(sizes, [2, 2, 1]);
        let huge = chunks(vec![issue(1, 5000), issue(2, 1)], 100, 1000);
        assert_eq!(huge.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1], "a large issue goes alone");
        assert!(chunks(Vec::new(), 100, 1000).is_empty());
    }

    #[test]
    fn the_list_is_an_aligned_table_with_owner_age_blocker_and_spend() {
        let question =
            Blocker::Operator { question: "Which database should the\nlogin use, Postgres or SQLite?".into() };
        let issues = [
            summary(3, IssueState::Open, None, None),
            summary(12, IssueState::Blocked, Some("web-manager"), Some(Blocker::Issues(vec![3, 5]))),
            summary(13, IssueState::Blocked, Some("web"), Some(question)),
        ];
        let lines = table(&issues, at(3 * 86_400 + 5));
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with("issue  state  "), "{lines:#?}");
        assert!(lines[1].starts_with("#3     open     -             3d  -  "), "{lines:#?}");
        assert!(lines[2].contains("web-manager   3d  #3, #5"), "{lines:#?}");
        assert!(lines[3].contains("operator: Which database should the login use, Po…"), "{lines:#?}");
        assert!(lines[1].ends_with("$1.50  Issue 3"), "{lines:#?}");
        let title_at = lines[0].find("title").unwrap();
        let column = |l: &String| l.chars().skip(title_at).collect::<String>();
        assert!(lines.iter().skip(1).all(|l| column(l).starts_with("Issue ")), "aligned by characters: {lines:#?}");
    }

    #[test]
    fn an_issue_shows_its_fields_body_links_and_events_oldest_first() {
        let issue = Issue {
            number: 7,
            title: "Ship the login".into(),
            body: "First line.\n\n- a point".into(),
            state: IssueState::Done,
            owner: Some(Handle::from_trusted("web".into())),
            reporter: Handle::from_trusted("ops".into()),
            parent: Some(2),
            depends_on: vec![4],
            labels: vec!["ui".into()],
            blocker: None,
            resolution: Some("merged as merge-3".into()),
            source: None,
            budget_usd: Some(5.0),
            created_at: "2026-01-01T00:00:00Z".into(),
            updated_at: "2026-01-02T00:00:00Z".into(),
        };
        let event = |actor: &str, kind: &str, text: &str| canopy_core::issues::IssueEvent {
            at: "2026-01-01T00:00:00Z".into(),
            actor: Handle::from_trusted(actor.into()),
            kind: kind.into(),
            text: text.into(),
        };
        let d = IssueDetail {
            issue,
            events: vec![event("ops", "filed", "Ship the login"), event("web", "moved", "done: merged\nand checked")],
            subissues: vec![summary(8, IssueState::Done, Some("w1"), None)],
            runs: vec!["run-4".into()],
            merges: vec!["merge-3".into()],
            spend: canopy_core::issues::IssueSpend {
                usd: 1.25,
                tokens: 900,
                subissues_usd: 0.5,
                subissues_tokens: 100,
            },
            topic: Some("issue #7: Ship the login".into()),
        };
        let lines = detail(&d, at(60));
        let text = lines.join("\n");
        assert_eq!(lines[0], "#7 Ship the login");
        for expected in [
            "  state       done",
            "  owner       web",
            "  reporter    ops",
            "  parent      #2",
            "  depends on  #4",
            "  labels      ui",
            "  resolution  merged as merge-3",
            "  budget      $5.00",
            "  spend       $1.25 (900 tokens) own, $0.50 (100 tokens) sub-issues, $1.75 in all",
            "  topic       issue #7: Ship the login",
            "  First line.\n\n  - a point",
            "runs    run-4",
            "merges  merge-3",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
        let sub = lines.iter().position(|l| l == "sub-issues").unwrap();
        assert!(lines[sub + 2].starts_with("  #8 "), "{text}");
        let events_at = lines.iter().position(|l| l == "events").unwrap();
        assert!(lines[events_at + 1].contains("ops  filed  Ship the login"), "{text}");
        assert!(lines[events_at + 2].contains("web  moved  done: merged\n"), "{text}");
        let continued = lines[events_at + 2].split('\n').nth(1).unwrap();
        let first_text = lines[events_at + 2].find("done:").unwrap();
        assert_eq!(continued.find("and checked"), Some(first_text), "{text}");
        assert!(!text.contains("Some(") && !text.contains("None"), "no Debug formatting: {text}");
    }

    #[test]
    fn a_command_says_what_it_did_in_one_line() {
        let mut issue = Issue {
            number: 5,
            title: "Fix the login".into(),
            body: String::new(),
            state: IssueState::Open,
            owner: None,
            reporter: Handle::from_trusted("ops".into()),
            parent: None,
            depends_on: Vec::new(),
            labels: Vec::new(),
            blocker: None,
            resolution: None,
            source: None,
            budget_usd: None,
            created_at: String::new(),
            updated_at: String::new(),
        };
        assert_eq!(said("filed", &issue), "filed #5 Fix the login (open, owner -)");
        issue.state = IssueState::Blocked;
        issue.owner = Some(Handle::from_trusted("web".into()));
        issue.blocker = Some(Blocker::Operator { question: "which db?".into() });
        assert_eq!(
            said("moved", &issue),
            "moved #5 Fix the login (blocked, owner web, blocked by operator: which db?)"
        );
        let summary = IssuesImportResponse { created: vec![1, 2, 3], skipped: 4 };
        assert_eq!(
            import_summary(&summary, "github"),
            "imported from github: 3 created (#1 to #3), 4 skipped (imported before)"
        );
        let none = IssuesImportResponse { created: Vec::new(), skipped: 200 };
        assert_eq!(import_summary(&none, "github"), "imported from github: 0 created, 200 skipped (imported before)");
    }

    #[test]
    fn numbers_and_states_are_named_when_they_are_not_ones() {
        assert_eq!(number("issue", "#3").ok(), Some(3));
        assert_eq!(number("issue", "3").ok(), Some(3));
        for bad in ["x", "#", "0", "-1"] {
            match number("issue", bad) {
                Err(Failed::Usage { field, message }) => {
                    assert_eq!(field, "issue");
                    assert!(message.contains("is not an issue number"), "{message}");
                }
                _ => panic!("{bad:?} was read as a number"),
            }
        }
        assert_eq!(state("in_progress").ok(), Some(IssueState::InProgress));
        match state("started") {
            Err(Failed::Usage { field, message }) => {
                assert_eq!(field, "state");
                assert!(message.contains("one of open, in_progress"), "{message}");
            }
            _ => panic!("\"started\" was read as a state"),
        }
    }
}
