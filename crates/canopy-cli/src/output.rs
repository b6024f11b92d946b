//! Output: logging set-up, JSON printing, and the concise text forms.

use canopy_core::{Account, ActivityItem, Channel, Message, RosterEntry, SpawnRequest, Topic, TreeNode};
use canopy_proto::api::{
    AgentsBudgetResponse, BoardResponse, ConflictInfo, CredentialsChangedResponse, MergesListResponse, PostResponse,
    ReadResponse, ReposGcResponse, ReposListResponse, RunnersAddResponse, UsageResponse,
};
use serde::Serialize;
use tracing_subscriber::EnvFilter;

use crate::args::{Cli, Command, LogFormat};
use crate::writer::{errln, outln};

/// Whether times are shown in UTC (`--utc`), set once at start.
static UTC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// An RFC 3339 time from the API as people read it, the same in every command: local time
/// with its offset (`2026-12-02 09:40:12 +02:00`), or with `--utc` in UTC
/// (`2026-12-02 07:40:12 UTC`). As given when it does not parse.
pub fn time(at: &str) -> String {
    let Ok(then) = humantime::parse_rfc3339_weak(at) else { return at.to_owned() };
    let secs = match then.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(_) => return at.to_owned(),
    };
    if UTC.load(std::sync::atomic::Ordering::Relaxed) {
        let text =
            humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs as u64))
                .to_string();
        return format!("{} UTC", text.trim_end_matches('Z').replace('T', " "));
    }
    match canopy_sys::local_time(secs) {
        Some(t) => {
            let sign = if t.offset < 0 { '-' } else { '+' };
            let off = t.offset.unsigned_abs();
            format!(
                "{:04}-{:02}-{:02} {:02}:{:02}:{:02} {sign}{:02}:{:02}",
                t.year,
                t.month,
                t.day,
                t.hour,
                t.minute,
                t.second,
                off / 3600,
                off % 3600 / 60
            )
        }
        None => at.to_owned(),
    }
}

/// Colour only on a terminal, and never when `NO_COLOR` is set (<https://no-color.org>).
pub fn colour(stream: &impl std::io::IsTerminal) -> bool {
    stream.is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

pub fn init_logging(cli: &Cli) {
    UTC.store(cli.utc, std::sync::atomic::Ordering::Relaxed);
    // `top` owns the terminal: a log line on stderr would tear its screen.
    if matches!(cli.command, Command::Top { .. }) {
        return;
    }
    // rmcp logs every MCP session at info; Canopy's own activity covers what matters. For a
    // command, the NATS client's log of each refused connect attempt is noise: the command says
    // why it could not connect, and a credential change expects refusals while it waits.
    let default = if matches!(cli.command, Command::Daemon(_) | Command::Up { .. } | Command::Runner(_)) {
        "info,rmcp=warn"
    } else {
        "warn,async_nats::connector=off"
    };
    log_to_stderr(default, matches!(cli.log_format, LogFormat::Json));
}

/// `tracing` on stderr, at `RUST_LOG`'s level or else `default`, as JSON lines or text (in
/// colour on a terminal): every command's, and the benchmark binary's.
pub fn log_to_stderr(default: &str, json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour(&std::io::stderr()));
    // Fails only when a subscriber is installed already (a test, or a binary embedding
    // the CLI that set its own): that one keeps logging.
    let _ = match json {
        true => builder.json().try_init(),
        false => builder.try_init(),
    };
}

/// Prints a value as one JSON document on stdout.
pub fn json<T: Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => outln!("{text}"),
        Err(e) => errln!("error: encoding output: {e}"),
    }
}

/// Prints a value as one JSON line (for streams such as `tail`).
pub fn json_line<T: Serialize>(value: &T) {
    if let Ok(text) = serde_json::to_string(value) {
        outln!("{text}");
    }
}

pub fn account(account: &Account) {
    outln!("{} ({})", account.handle, account.display_name);
    let role = account.role.as_ref().map_or("-".to_owned(), ToString::to_string);
    outln!("  kind {}  role {}  state {}", account.kind, role, account.state);
    if let Some(parent) = &account.parent {
        outln!("  parent {parent}");
    }
    if let Some(home) = &account.home_channel {
        outln!("  home #{home}");
    }
    if !account.charter.is_empty() {
        outln!("  charter {}", account.charter);
    }
}

pub fn agents(agents: &[Account]) {
    let width = agents.iter().map(|a| a.handle.as_str().len()).max().unwrap_or(6);
    for a in agents {
        let role = a.role.as_ref().map_or("-".to_owned(), ToString::to_string);
        let parent = a.parent.as_ref().map_or("-".to_owned(), ToString::to_string);
        outln!("{:width$}  {:10}  {:10}  {:9}  {}", a.handle, role, parent, a.state.to_string(), a.display_name);
    }
}

pub fn tree(node: &TreeNode) {
    fn walk(node: &TreeNode, prefix: &str, last: bool, root: bool) {
        let (branch, next) = match (root, last) {
            (true, _) => ("", String::new()),
            (false, true) => ("└── ", format!("{prefix}    ")),
            (false, false) => ("├── ", format!("{prefix}│   ")),
        };
        outln!("{prefix}{branch}{} ({}, {}, {})", node.handle, node.display_name, node.role, node.state);
        for (i, child) in node.children.iter().enumerate() {
            walk(child, &next, i + 1 == node.children.len() && node.omitted == 0, false);
        }
        if node.omitted > 0 {
            let branch = if root { "" } else { "└── " };
            outln!("{next}{branch}... {} more", node.omitted);
        }
    }
    walk(node, "", true, true);
}

pub fn channels(channels: &[Channel]) {
    let width = channels.iter().map(|c| c.name.as_str().len() + 1).max().unwrap_or(8);
    for c in channels {
        outln!(
            "{:width$}  {:12}  {:10}  {:9}  wakes {:8}  {} subscribers, last #{}",
            format!("#{}", c.name),
            c.kind.to_string(),
            c.post_policy.to_string(),
            c.subscription_policy.to_string(),
            c.wake.to_string(),
            c.subscribers,
            c.last_seq
        );
    }
}

pub fn topics(topics: &[Topic]) {
    for t in topics {
        let resolved = if t.resolved { "  (resolved)" } else { "" };
        let messages = if t.messages == 1 { "message" } else { "messages" };
        outln!(
            "{}  {} {messages}, last #{} at {}{resolved}",
            t.name,
            t.messages,
            t.last_seq,
            time(&t.last_activity_at)
        );
    }
}

pub fn read(page: &ReadResponse) {
    outln!("#{}", page.channel);
    for group in &page.groups {
        outln!("  {}", group.topic);
        for m in &group.messages {
            outln!("    {}", message_line(m, false));
        }
    }
    if page.more {
        outln!("(more: --after {})", page.next_after);
    }
}

/// One message on one line; with `place` it names its channel and topic too.
pub fn message_line(m: &Message, place: bool) -> String {
    let role = match (&m.sender.role, m.sender.kind) {
        (Some(role), _) => role.to_string(),
        (None, kind) => kind.to_string(),
    };
    let at = time(&m.created_at);
    let place = if place { format!("#{} > {}  ", m.channel, m.topic) } else { String::new() };
    // Later lines keep their own indentation, under a margin that sets them off.
    let body = m.body.replace('\n', "\n    ");
    format!("[{}] {at} {place}{} ({role}): {body}", m.seq, m.sender.handle)
}

pub fn roster(agents: &[RosterEntry]) {
    let width = agents.iter().map(|a| a.handle.as_str().len()).max().unwrap_or(6);
    let presence = agents.iter().map(|a| a.presence.as_str().len()).max().unwrap_or(8);
    for a in agents {
        roster_row(a, width, presence);
    }
}

/// One agent, in aligned columns: handle, presence, session, last seen, marks; then why it
/// is as it is and its activity line, which vary in length.
fn roster_row(a: &RosterEntry, width: usize, presence: usize) {
    let why = a.reason.as_deref().map(|r| format!("  ({r})")).unwrap_or_default();
    let activity = a.activity.as_deref().map(|t| format!("  \u{2014} {t}")).unwrap_or_default();
    let seen = a.last_seen.as_deref().map(time).unwrap_or_else(|| "never".to_owned());
    let mut marks = Vec::new();
    if let Some(failover) = &a.failover {
        marks.push(format!("on {} ({failover})", a.harness));
    }
    if a.unconfined {
        marks.push("unconfined".to_owned());
    }
    if a.host_network {
        marks.push("host network".to_owned());
    }
    if a.egress_refused > 0 {
        marks.push(format!("egress refused: {}", a.egress_refused));
    }
    match &a.budget {
        Some(b) if b.level == canopy_core::budget::Level::Over => marks.push(format!("over budget ({}%)", b.percent)),
        Some(b) => marks.push(format!("budget {}%", b.percent)),
        None => {}
    }
    if a.pending > 0 {
        marks.push(format!("{} pending", a.pending));
    }
    let marks = if marks.is_empty() { String::new() } else { format!("  [{}]", marks.join(", ")) };
    outln!(
        "{:width$}  {:presence$}  session {:<3}  seen {seen}{marks}{why}{activity}",
        a.handle,
        a.presence.as_str(),
        a.incarnation.get()
    );
}

/// One activity item: failures stand out, successes stay compact.
pub fn activity(item: &ActivityItem, watched: &str, json: bool) {
    if json {
        json_line(item);
        return;
    }
    let at = time(&item.at);
    // A subagent run's activity shows under its Manager, marked with the run.
    let who = match item.agent.as_str() == watched {
        true => String::new(),
        false => format!("[{}] ", item.agent),
    };
    outln!("{at} #{} {who}{}", item.incarnation, item.summary);
}

/// Per-recipient outcomes of a post, then the counts.
pub fn outcomes(r: &PostResponse) {
    for o in &r.outcomes {
        let outcome = o.outcome.as_str();
        let reason = o.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
        outln!("  {outcome:8} {}{reason}", o.recipient);
    }
    let c = &r.counts;
    if c.steered + c.queued + c.woke + c.held + c.refused > 0 {
        outln!("  {} steered, {} woke, {} queued, {} held, {} refused", c.steered, c.woke, c.queued, c.held, c.refused);
    }
    if !r.unknown_mentions.is_empty() {
        outln!("  unknown mentions (no such account): {}", r.unknown_mentions.join(", "));
    }
}

pub fn board(r: &BoardResponse) {
    outln!("#{} board", r.channel);
    for m in &r.pins {
        outln!("  {}", message_line(m, false));
    }
}

/// `bundle check --gated`: per role, each line its sessions do not see yet.
pub fn gated(lines: &[canopy_prompt::Gated]) {
    if lines.is_empty() {
        outln!("no gated lines: every role sees every line");
    }
    let mut role = "";
    for g in lines {
        if g.role != role {
            role = &g.role;
            outln!("role {role}: lines waiting for a tool");
        }
        outln!("  {}:{}  waits for {}: {}", g.file, g.line, g.waits_for.join(", "), g.text);
    }
}

pub fn operators(operators: &[Account]) {
    let width = operators.iter().map(|a| a.handle.as_str().len()).max().unwrap_or(8);
    for a in operators {
        outln!("{:width$}  {:8}  {}", a.handle.as_str(), a.state.to_string(), a.display_name);
    }
}

pub fn runner_added(r: &RunnersAddResponse, out: Option<&std::path::Path>) {
    let id = &r.credential.runner_id;
    outln!("runner {id}: credential written to {}", r.path);
    if let Some(out) = out {
        outln!("  and to {} (carry it to the runner's machine)", out.display());
    }
    outln!("  start it here:      canopy runner --id {id}");
    outln!("  or on its machine:  canopy runner --credentials FILE --nats-url URL");
    if !r.applied {
        outln!("  the NATS server is external: install `canopy nats-config` there and reload it");
    }
}

/// `canopy runners`: one aligned line per runner.
pub fn runners(runners: &[canopy_proto::api::RunnerInfo]) {
    if runners.is_empty() {
        outln!("no runners have synced (the daemon's own starts with it; add one with `canopy runners add ID`)");
        return;
    }
    let id = runners.iter().map(|r| r.id.as_str().len()).max().unwrap_or(2).max(2);
    let labels: Vec<String> =
        runners.iter().map(|r| if r.labels.is_empty() { "-".into() } else { r.labels.join(",") }).collect();
    let lw = labels.iter().map(String::len).max().unwrap_or(6).max(6);
    outln!(
        "{:id$}  {:lw$}  {:>8}  {:>9}  {:10}  {:8}  state",
        "id",
        "labels",
        "sessions",
        "capacity",
        "last sync",
        "version"
    );
    for (r, labels) in runners.iter().zip(&labels) {
        let state = match (r.live, r.draining) {
            (true, true) => "draining",
            (true, false) => "live",
            (false, true) => "lost, draining",
            (false, false) => "lost",
        };
        let synced = format!("{}s ago", r.last_sync_secs);
        let version = if r.version.is_empty() { "-" } else { r.version.as_str() };
        outln!(
            "{:id$}  {labels:lw$}  {:>8}  {:>9}  {synced:10}  {version:8}  {state}",
            r.id.as_str(),
            r.sessions,
            r.capacity
        );
    }
}

pub fn credentials_changed(what: &str, r: &CredentialsChangedResponse) {
    outln!("{what}; NATS users now: {}", r.users.join(", "));
    if !r.applied {
        outln!("  the NATS server is external: install `canopy nats-config` there and reload it");
    }
}

pub fn spawn_request(r: &SpawnRequest) {
    let note = r.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default();
    let budget = r.budget.map(|b| format!(", budget {}", canopy_core::budget::say::amount(b))).unwrap_or_default();
    outln!(
        "{} {:9} {} asks for @{} ({}, {}{budget}){note}",
        r.id,
        r.state.to_string(),
        r.requester,
        r.handle,
        r.display_name,
        r.role
    );
    let when = match (&r.decided_at, r.state) {
        (_, canopy_core::SpawnState::Pending) => {
            format!("asked {}, expires {}", relative(&r.created_at), relative(&r.expires_at))
        }
        (Some(at), _) => format!("asked {}, decided {}", relative(&r.created_at), relative(at)),
        (None, _) => format!("asked {}", relative(&r.created_at)),
    };
    outln!("    {when}; reason: {}", r.reason);
}

/// The line that opens `whoami`, `roster` and `tree` while requests wait for the operator.
pub fn waiting(spawns: &[SpawnRequest], merges: &[canopy_core::MergeRequest]) -> Option<String> {
    let n = spawns.len() + merges.len();
    if n == 0 {
        return None;
    }
    let mut items: Vec<String> =
        spawns.iter().map(|r| format!("{} from {} ({})", r.id, r.requester, relative(&r.created_at))).collect();
    items.extend(merges.iter().map(|m| format!("{} from {} ({})", m.id, m.requester, relative(&m.created_at))));
    let noun = if n == 1 { "request waits" } else { "requests wait" };
    let commands = match (spawns.is_empty(), merges.is_empty()) {
        (false, true) => "`canopy requests`",
        (true, false) => "`canopy merges`",
        _ => "`canopy requests`, `canopy merges`",
    };
    Some(format!("{n} {noun} for you: {}; see {commands}", items.join(", ")))
}

/// `5m ago`, `in 23h`: an RFC 3339 time relative to now (as given when it does not parse).
pub fn relative(at: &str) -> String {
    let Ok(then) = humantime::parse_rfc3339_weak(at) else { return at.to_owned() };
    match std::time::SystemTime::now().duration_since(then) {
        Ok(ago) => format!("{} ago", short(ago)),
        Err(ahead) => format!("in {}", short(ahead.duration())),
    }
}

/// How old an RFC 3339 time is at `now`, short (`45s`, `5m`, `23h`, `3d`), for an age
/// column; `-` when it does not parse, `0s` when it lies ahead (clocks differ a little).
pub fn age(at: &str, now: std::time::SystemTime) -> String {
    match humantime::parse_rfc3339_weak(at) {
        Ok(then) => short(now.duration_since(then).unwrap_or_default()),
        Err(_) => "-".to_owned(),
    }
}

/// A duration in its largest whole unit: `45s`, `5m`, `23h`, `3d`.
fn short(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// What opens the list of issues blocked on the operator: how many, and how to answer.
pub fn waiting_issues_heading(n: usize) -> String {
    let noun = if n == 1 { "issue is blocked" } else { "issues are blocked" };
    format!("{n} {noun} on your answer (answer with `canopy issues comment N TEXT`)")
}

/// Issues blocked on the operator's answer, one line each: `#N title: question (5m)`, cut to
/// one line, with how long it has waited (`status` and `whoami` show them).
pub fn waiting_issues(issues: &[canopy_core::issues::IssueSummary]) -> Vec<String> {
    issues
        .iter()
        .map(|i| {
            let question = match &i.blocker {
                Some(canopy_core::issues::Blocker::Operator { question }) => question.as_str(),
                _ => "",
            };
            let waited = age(&i.updated_at, std::time::SystemTime::now());
            format!("#{} {}: {} ({waited})", i.number, one_line(&i.title, 60), one_line(question, 100))
        })
        .collect()
}

/// `text` on one line (runs of whitespace, newlines too, become one space), cut to `max`
/// characters with `…`.
pub fn one_line(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(max.saturating_sub(1)) {
        Some((at, _)) if flat.chars().count() > max => format!("{}…", flat[..at].trim_end()),
        _ => flat,
    }
}

/// Budgets, one line each: whose, what it covers, spent of the limit, the window.
pub fn budgets(list: &[canopy_core::BudgetStatus]) {
    let width = list.iter().map(|b| b.owner.as_str().len()).max().unwrap_or(5).max(5);
    for b in list {
        let spent = canopy_core::budget::say::spend(b.limit, b.spent);
        let window = match (&b.period, &b.renews_at) {
            (Some(p), Some(at)) => format!("per {p}, renews {}", time(at)),
            _ => "lifetime".to_owned(),
        };
        let level = match b.level {
            canopy_core::budget::Level::Over => "  SPENT",
            canopy_core::budget::Level::Near => "  near",
            canopy_core::budget::Level::Under => "",
        };
        let left = match b.scope {
            canopy_core::budget::Scope::Subtree => {
                format!("  {} left to give", canopy_core::budget::say::amount(b.left))
            }
            canopy_core::budget::Scope::Agent => String::new(),
        };
        outln!("{:width$}  {:7}  {:>4}%  {}  {window}{left}{level}", b.owner, b.scope.to_string(), b.percent, spent);
    }
}

/// `canopy agents budget`: what changed, then every budget that covers the agent.
pub fn budget_change(r: &AgentsBudgetResponse) {
    if r.covering.is_empty() {
        outln!("no budget covers it");
    }
    budgets(&r.covering);
    if !r.released.is_empty() {
        outln!("released (what they held is delivered now): {}", r.released.join(", "));
    }
}

/// A repository, one line.
pub fn repo(r: &canopy_core::Repo) {
    let checks = match r.checks.is_empty() {
        true => "no checks".to_owned(),
        false => {
            let named: Vec<String> = r.checks.iter().map(|c| format!("{} `{}`", c.name, c.command)).collect();
            format!("checks {}", named.join(", "))
        }
    };
    outln!("{}  {} (base {}, review {}, {checks})", r.name, r.source, r.base, r.review.as_str());
}

/// `canopy repos list`: the repositories, then every checkout.
pub fn repos(r: &ReposListResponse) {
    if r.repos.is_empty() {
        outln!("no repositories (add one with `canopy repos add NAME PATH_OR_URL`)");
        return;
    }
    for one in &r.repos {
        repo(one);
    }
    if r.checkouts.is_empty() {
        return;
    }
    outln!();
    let agent = r.checkouts.iter().map(|c| c.agent.len()).max().unwrap_or(5).max(5);
    let branch = r.checkouts.iter().map(|c| c.branch.len()).max().unwrap_or(6).max(6);
    outln!("{:agent$}  {:8}  {:branch$}  {:9}  {:9}  path", "agent", "repo", "branch", "state", "conflicts");
    for c in &r.checkouts {
        let note = c.note.as_deref().map(|n| format!("  ({n})")).unwrap_or_default();
        let path = c.path.as_deref().unwrap_or("-");
        let clash = conflict_cell(&r.conflicts, &c.repo, &c.branch);
        outln!("{:agent$}  {:8}  {:branch$}  {:9}  {clash:9}  {path}{note}", c.agent, c.repo, c.branch, c.state);
    }
    if !r.conflicts.is_empty() {
        outln!();
        conflicts(&r.conflicts);
    }
}

/// A branch's conflicts as one cell: `-`, or how many it has.
fn conflict_cell(conflicts: &[ConflictInfo], repo: &str, branch: &str) -> String {
    let n = conflicts.iter().filter(|c| c.repo == repo && (c.branch == branch || c.other == branch)).count();
    match n {
        0 => "-".into(),
        1 => "1 conflict".into(),
        n => format!("{n} conflicts"),
    }
}

/// Conflicts as lines: `conflict  branch  x  other: files`.
pub fn conflicts(conflicts: &[ConflictInfo]) {
    for c in conflicts {
        outln!("conflict  {}  x  {}: {}", c.branch, c.other, c.files.join(", "));
    }
}

/// `canopy repos gc`.
pub fn gc(r: &ReposGcResponse) {
    if r.leftovers.is_empty() {
        outln!("no leftovers");
        return;
    }
    let verb = if r.removed { "removed" } else { "found" };
    for l in &r.leftovers {
        outln!("{verb}  {}  ({})", l.path, l.why);
    }
}

/// A merge request, one line (and its note).
pub fn merge(m: &canopy_core::MergeRequest) {
    let note = m.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default();
    let landed = m.merged_commit.as_deref().map(|c| format!(" at {}", &c[..c.len().min(10)])).unwrap_or_default();
    outln!(
        "{} {:8} {}: {} ({} into {} {}){landed}{note}",
        m.id,
        m.state.to_string(),
        m.requester,
        m.title,
        m.branch,
        m.repo,
        m.base
    );
}

/// `canopy merges`.
pub fn merges(r: &MergesListResponse) {
    if r.merges.is_empty() {
        outln!("no merge requests");
    }
    for m in &r.merges {
        merge(m);
        let open = !matches!(
            m.state,
            canopy_core::MergeState::Merged | canopy_core::MergeState::Denied | canopy_core::MergeState::Refused
        );
        let clash = conflict_cell(&r.conflicts, &m.repo, &m.branch);
        if open && clash != "-" {
            outln!("         {clash} (canopy merges show {})", m.id);
        }
    }
}

/// `canopy usage`: tokens first (many pay by quota), cost where a harness reported one.
pub fn usage(r: &UsageResponse) {
    if r.total.reports == 0 {
        outln!("no usage reported");
    } else {
        usage_table(r);
    }
    if !r.budgets.is_empty() {
        outln!();
        outln!("budgets");
        budgets(&r.budgets);
    }
}

fn usage_table(r: &UsageResponse) {
    let width = r.agents.iter().map(|a| a.agent.as_str().len()).max().unwrap_or(5).max(5);
    outln!("{:width$}  {:>10}  {:>10}  {:>10}  {:>7}  cost", "agent", "input", "output", "cached", "reports");
    for row in &r.agents {
        outln!("{}", usage_row(row.agent.as_str(), &row.totals, width));
    }
    if r.agents.len() > 1 {
        outln!("{}", usage_row("total", &r.total, width));
    }
    if !r.sessions.is_empty() {
        outln!();
        for row in &r.sessions {
            let label = format!("session {}", row.incarnation.unwrap_or_default());
            outln!("{}", usage_row(&label, &row.totals, width.max(12)));
        }
    }
    if !r.turns.is_empty() {
        outln!();
        for row in &r.turns {
            let label = format!("#{} {}", row.incarnation.unwrap_or_default(), row.turn_id.as_deref().unwrap_or("-"));
            outln!("{}", usage_row(&label, &row.totals, width.max(12)));
        }
    }
}

fn usage_row(label: &str, t: &canopy_core::UsageTotals, width: usize) -> String {
    let computed = match t.reports_with_computed_cost {
        0 => String::new(),
        n if n == t.reports => " (computed)".to_owned(),
        n => format!(" ({n} computed)"),
    };
    let estimated = match t.reports_estimated {
        0 => String::new(),
        n => format!(" ({n} estimated)"),
    };
    let computed = format!("{computed}{estimated}");
    let cost = match t.cost_usd {
        None => "-".to_owned(),
        Some(cost) if t.reports_without_cost > 0 => {
            format!("${cost:.4}+ ({} without cost){computed}", t.reports_without_cost)
        }
        Some(cost) => format!("${cost:.4}{computed}"),
    };
    format!(
        "{label:width$}  {:>10}  {:>10}  {:>10}  {:>7}  {cost}",
        t.input_tokens,
        t.output_tokens,
        t.cache_read_tokens + t.cache_write_tokens,
        t.reports
    )
}

/// What `canopy status` shows (and prints as JSON with `--json`).
#[derive(Debug, Serialize)]
pub struct Status {
    pub workspace: String,
    pub daemon_pid: u32,
    pub daemon_version: String,
    pub nats_url: String,
    pub agents: Vec<RosterEntry>,
    pub spawns: Vec<SpawnRequest>,
    pub merges: Vec<canopy_core::MergeRequest>,
    /// The newest messages of `#incidents`, oldest first.
    pub incidents: Vec<Message>,
    /// Issues blocked on the operator's answer (from `whoami`).
    pub waiting_issues: Vec<canopy_core::issues::IssueSummary>,
}

/// `canopy status`, one screen.
pub fn status(s: &Status) {
    outln!("workspace {}  daemon pid {} (canopy {}), NATS {}", s.workspace, s.daemon_pid, s.daemon_version, s.nats_url);
    let mut runners: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for a in &s.agents {
        if let Some(runner) = &a.runner {
            *runners.entry(runner.to_string()).or_default() += 1;
        }
    }
    let runners: Vec<String> =
        runners.iter().map(|(r, n)| format!("{r} ({n} session{})", if *n == 1 { "" } else { "s" })).collect();
    outln!("runners   {}", if runners.is_empty() { "none hosting sessions".to_owned() } else { runners.join(", ") });
    let mut by_presence: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for a in &s.agents {
        *by_presence.entry(a.presence.as_str()).or_default() += 1;
    }
    let counts: Vec<String> = by_presence.iter().map(|(p, n)| format!("{n} {p}")).collect();
    outln!("agents    {} ({})", s.agents.len(), counts.join(", "));
    let now = std::time::SystemTime::now();
    let trouble: Vec<String> = s
        .agents
        .iter()
        .filter(|a| {
            use canopy_core::Presence::{Crashed, Failing, Stalled};
            matches!(a.presence, Crashed | Stalled | Failing)
        })
        .map(|a| match &a.since {
            Some(since) => format!("{} {} for {}", a.handle, a.presence, age(since, now)),
            None => format!("{} {}", a.handle, a.presence),
        })
        .collect();
    if !trouble.is_empty() {
        outln!("attention {}", trouble.join(", "));
    }
    match waiting(&s.spawns, &s.merges) {
        Some(line) => outln!("waiting   {line}"),
        None if s.waiting_issues.is_empty() => outln!("waiting   nothing waits for you"),
        None => {}
    }
    if !s.waiting_issues.is_empty() {
        outln!("waiting on you: {}", waiting_issues_heading(s.waiting_issues.len()));
        for line in waiting_issues(&s.waiting_issues) {
            outln!("  {line}");
        }
    }
    let alerts: Vec<String> = s
        .agents
        .iter()
        .filter_map(|a| a.budget.as_ref().map(|b| (a, b)))
        .map(|(a, b)| match b.level {
            canopy_core::budget::Level::Over => {
                format!("{} over budget ({}%, @{}'s {})", a.handle, b.percent, b.owner, b.scope)
            }
            _ => format!("{} at {}% (@{}'s {})", a.handle, b.percent, b.owner, b.scope),
        })
        .collect();
    if !alerts.is_empty() {
        outln!("budgets   {}", alerts.join(", "));
    }
    match s.incidents.is_empty() {
        true => outln!("incidents none"),
        false => {
            outln!("incidents");
            for m in &s.incidents {
                outln!("  {}", message_line(m, false));
            }
        }
    }
}
