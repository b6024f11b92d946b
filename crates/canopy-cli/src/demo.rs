//! `canopy demo`: the three flows of DESIGN section 1 and a repository's, played and narrated on a temporary
//! workspace (private nats-server, SQLite, the scripted harness), no model account needed.
//!
//! 1. The CI Manager asks for a child Manager; the request appears in its home channel; the
//!    operator (the person at the terminal, or `--yes`, labelled as such) approves; the child
//!    starts with its charter and the CI Manager is told.
//! 2. A post reaches an idle agent at its turn start; an `@mention` steers a busy one.
//! 3. The Supervisor broadcasts; every agent receives it.
//! 4. On a git repository, from an issue: the operator files `#1` for the Web Manager, which
//!    moves it `in_progress` and briefs a run for it; the run changes a file in its own
//!    checkout, the Manager merges the run and asks to merge, linking `#1`; the operator
//!    approves, the file is on the base branch, and the Manager, told the merge landed, closes
//!    `#1` with a resolution. The issue's history and spend are printed as `canopy issues show`.
//!
//! Everything it started is stopped before it exits.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use canopy_core::issues::IssueState;
use canopy_proto::api::*;
use canopy_proto::{ApiMethod, method};

use crate::exit::EXIT_UNAVAILABLE;
use crate::sandbox::{Sandbox, Setup, operator_git as git};
use crate::writer::{errln, out, outln};

const CI_MANAGER: &str = r#"
[[rule]]
match = { kind = "start" }
actions = [
  { call = "comms_set_activity", args = { text = "keeping CI green" } },
  { call = "agents_spawn_peer", args = { handle = "flaky-tests", name = "Flaky Tests Manager", charter = "Find and fix the flaky tests in the nightly build.", reason = "CI went red twice today on tests that pass on retry." } },
]
[[rule]]
match = { kind = "message" }
actions = [{ say = "noted" }]
"#;

const BUSY: &str = r#"
[[rule]]
match = { kind = "start" }
actions = [{ say = "running the release checks" }, { sleep = "6s" }, { say = "checks done" }]
[[rule]]
match = { steer = true }
actions = [{ say = "steered: reading the operator's note before the next step" }]
[[rule]]
match = { kind = "message" }
actions = [{ say = "noted" }]
"#;

/// The web Manager, one rule per turn of its issue: told of `#1`, it takes it and briefs a run
/// for it; given the run's report, it merges the run, asks to merge linking `#1` and puts it in
/// review; told the merge landed, it closes `#1`. Rules match on the text Canopy delivers
/// (whatever else shares the turn, and whether it comes at a session start or later); the first
/// rule that matches wins, so the close comes first. The usage lines stand in for the model's
/// cost of a turn: they come after `#1` is `in_progress`, so they count toward it.
const WEB_LEAD: &str = r#"
[[rule]]
match = { text_contains = "works on #1, landed" }
actions = [
  { call = "issues_update", args = { issue = 1, state = "done", note = "merge-1 landed; CHANGELOG.md on main has the 2.4 entry.", resolution = "The 2.4 changelog entry is on web's main (merge-1)." } },
]
[[rule]]
match = { text_contains = "filed #1 " }
actions = [
  { call = "issues_update", args = { issue = 1, state = "in_progress", note = "Briefing a run to write the entry." } },
  { usage = { input_tokens = 2400, output_tokens = 300, cost_usd = 0.03 } },
  { call = "agents_run_subagent", args = { definition = "implementer", brief = "Add a CHANGELOG.md entry for release 2.4.", issue = 1 } },
]
[[rule]]
match = { kind = "message", text_contains = "Report: added CHANGELOG.md" }
actions = [
  { usage = { input_tokens = 3100, output_tokens = 250, cost_usd = 0.02 } },
  { call = "runs_merge", args = { run_id = 1 } },
  { call = "merge_request", args = { title = "Changelog for 2.4", summary = "Adds the 2.4 entry to CHANGELOG.md (run 1).", issues = [1] } },
  { call = "issues_update", args = { issue = 1, state = "in_review", note = "Run 1 is merged into my branch; its merge request waits for the operator." } },
]
[[rule]]
match = { kind = "message" }
actions = []
"#;

/// The demo's implementer run: it edits a file in its checkout and commits it.
const CHANGELOG_RUN: &str = r#"
[[rule]]
match = { kind = "start" }
actions = [
  { shell = "printf '# Changelog\n\n## 2.4\n- Release notes drafted in the Canopy demo.\n' > CHANGELOG.md && git add CHANGELOG.md && git commit -qm 'Add the 2.4 changelog entry'", expect = "ok" },
  { usage = { input_tokens = 5200, output_tokens = 900, cost_usd = 0.06 } },
  { say = "Report: added CHANGELOG.md with the 2.4 entry, committed as 'Add the 2.4 changelog entry'." },
]
"#;

struct Demo {
    sandbox: Sandbox,
}

fn say(line: &str) {
    outln!("{line}");
}

impl Demo {
    async fn send<M: ApiMethod>(&self, req: &M::Request) -> Result<M::Response, String> {
        self.sandbox
            .api
            .send::<M>(&self.sandbox.operator, req)
            .await
            .map_err(|e| format!("{}: {e}", M::METHOD.as_str()))
    }

    fn transcript(&self, agent: &str) -> String {
        let dir = self.sandbox.data().sessions().join(agent);
        let mut text = String::new();
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                text.push_str(&std::fs::read_to_string(entry.path().join("transcript.jsonl")).unwrap_or_default());
            }
        }
        text
    }

    async fn wait(&self, what: &str, mut ready: impl FnMut(&Demo) -> bool) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready(self) {
            if Instant::now() > deadline {
                return Err(format!("timed out waiting for {what}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    async fn create(&self, handle: &str, name: &str, script: Option<&str>) -> Result<(), String> {
        self.create_on(handle, name, script, None).await
    }

    async fn create_on(
        &self,
        handle: &str,
        name: &str,
        script: Option<&str>,
        repo: Option<&str>,
    ) -> Result<(), String> {
        let request = AgentsCreateRequest {
            handle: handle.into(),
            name: name.into(),
            role: "manager".into(),
            parent: None,
            charter: format!("{name}'s lane"),
            harness: Some("scripted".into()),
            script: script.map(|text| ScriptSource { name: format!("{handle}.toml"), text: text.into() }),
            persona: None,
            repo: repo.map(str::to_owned),
            needs: Vec::new(),
        };
        self.send::<method::AgentsCreate>(&request).await.map(|_| ())
    }

    async fn presence(&self, handle: &str) -> Option<canopy_core::Presence> {
        let request = RosterRequest { handles: vec![handle.to_owned()], ..RosterRequest::default() };
        let roster: RosterResponse = self.send::<method::Roster>(&request).await.ok()?;
        roster.agents.into_iter().find(|a| a.handle.as_str() == handle).map(|a| a.presence)
    }

    async fn wait_presence(&self, handle: &str, presence: canopy_core::Presence) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.presence(handle).await != Some(presence) {
            if Instant::now() > deadline {
                return Err(format!("timed out waiting for {handle} to be {presence}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    async fn post(&self, channel: &str, topic: &str, body: &str) -> Result<PostResponse, String> {
        let request = PostRequest {
            channel: channel.into(),
            topic: topic.into(),
            body: body.into(),
            create_topic: true,
            idempotency_key: None,
            ack_only: false,
            wake: false,
        };
        self.send::<method::MessagesPost>(&request).await
    }
}

/// The operator's answer: yes with `--yes` (said so), else what is typed at the prompt.
fn operator_says_yes(yes: bool, id: &str, question: &str) -> bool {
    if yes {
        say(&format!("  - operator: approving {id} automatically (--yes)"));
        return true;
    }
    out!("  - operator: {question} [y/N] ");
    // A question that could not be flushed is still answered: the read below decides.
    let _ = std::io::stdout().flush();
    let mut answer = String::new();
    if let Err(e) = std::io::stdin().lock().read_line(&mut answer) {
        // No answer is a no, as at the prompt's `[y/N]`.
        tracing::debug!("reading the operator's answer from stdin: {e}");
    }
    matches!(answer.trim(), "y" | "Y" | "yes")
}

fn outcomes(posted: &PostResponse) {
    for o in &posted.outcomes {
        let reason = o.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
        say(&format!("      -> {}: {}{reason}", o.recipient, o.outcome.as_str()));
    }
}

/// Plays the demo; returns the process exit code.
pub async fn run(yes: bool) -> u8 {
    say("Canopy demo: a temporary workspace with a private nats-server, SQLite and the scripted harness");
    say("(a deterministic stand-in for the model). No model account is used.\n");
    let edits = [
        ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
        ("quiet_window = \"2s\"", "quiet_window = \"300ms\""),
        ("resync = \"5s\"", "resync = \"1s\""),
    ];
    let edits =
        [edits[0], edits[1], edits[2], ("script = \"implementer.toml\"", "script = \"demo-changelog-run.toml\"")];
    let setup = Setup { edits: &edits, files: &[("demo-changelog-run.toml", CHANGELOG_RUN)], runners: &[] };
    let sandbox = match Sandbox::start(&setup).await {
        Ok(sandbox) => sandbox,
        Err(e) => {
            errln!("error: starting the demo workspace: {e}");
            return EXIT_UNAVAILABLE;
        }
    };
    let demo = Demo { sandbox };
    let mut result = play(&demo, yes).await;
    if result.is_ok() {
        result = play_repository(&demo, yes).await;
    }
    demo.sandbox.stop().await;
    match result {
        Ok(()) => {
            say("\nDone: every process the demo started has stopped, and its workspace is removed.");
            0
        }
        Err(e) => {
            errln!("error: the demo failed: {e}");
            1
        }
    }
}

/// Flows 1 to 3, in order.
async fn play(demo: &Demo, yes: bool) -> Result<(), String> {
    play_spawn(demo, yes).await?;
    play_delivery(demo).await?;
    play_broadcast(demo).await
}

/// Flow 1: a Manager asks for a child Manager; only the operator can say yes.
async fn play_spawn(demo: &Demo, yes: bool) -> Result<(), String> {
    say("Flow 1: a Manager asks for a child Manager; only the operator can say yes.");
    demo.create("ci-manager", "CI Manager", Some(CI_MANAGER)).await?;
    say("  - created the CI Manager; its session starts and calls agents_spawn_peer (it returns `pending` at once)");
    let mut request = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while request.is_none() {
        let list: SpawnListResponse = demo.send::<method::SpawnList>(&SpawnListRequest::default()).await?;
        request = list.requests.into_iter().next();
        if Instant::now() > deadline {
            return Err("the CI Manager never asked".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let request = request.ok_or("no request")?;
    let page: ReadResponse = demo
        .send::<method::MessagesRead>(&ReadRequest {
            channel: "home-ci-manager".into(),
            topic: Some(format!("spawn: {}", request.handle)),
            after: canopy_core::Seq(0),
            limit: None,
            unread: false,
            newest: false,
        })
        .await?;
    say(&format!("  - {} appears in #home-ci-manager, topic \"spawn: {}\":", request.id, request.handle));
    for group in &page.groups {
        for m in &group.messages {
            for line in m.body.lines() {
                say(&format!("      | {line}"));
            }
        }
    }
    let approve = operator_says_yes(yes, &request.id, &format!("approve {}?", request.id));
    let decision = SpawnDecideRequest {
        id: request.id.clone(),
        approve,
        reason: (!approve).then(|| "declined at the demo prompt".into()),
    };
    let decided: canopy_core::SpawnRequest = demo.send::<method::SpawnDecide>(&decision).await?;
    say(&format!("  - {} is now {}", decided.id, decided.state));
    if approve {
        demo.wait("the child's first turn", |d| d.transcript("flaky-tests").contains("Find and fix the flaky tests"))
            .await?;
        say("  - flaky-tests started with the Manager prompt and its charter as its first input");
    }
    demo.wait("the CI Manager to hear the answer", |d| {
        let t = d.transcript("ci-manager");
        t.contains("Approved by") || t.contains("Denied by")
    })
    .await?;
    say("  - the CI Manager learned the answer at the start of its next turn\n");
    Ok(())
}

/// Flow 2: posts reach idle agents at their next turn; an @mention steers a busy one.
async fn play_delivery(demo: &Demo) -> Result<(), String> {
    say("Flow 2: posts reach idle agents at their next turn; an @mention steers a busy one.");
    demo.create("docs", "Docs Manager", None).await?;
    demo.wait_presence("docs", canopy_core::Presence::Idle).await?;
    let posted = demo.post("home-docs", "release notes", "Please draft the release notes for 2.4.").await?;
    say("  - operator posts to #home-docs > release notes while docs is idle:");
    outcomes(&posted);
    demo.wait("docs to receive it", |d| d.transcript("docs").contains("release notes for 2.4")).await?;
    say("  - docs woke; its turn began with the message, fenced and attributed");
    demo.create("builder", "Release Builder", Some(BUSY)).await?;
    demo.wait_presence("builder", canopy_core::Presence::Working).await?;
    let posted = demo.post("home-builder", "checks", "@builder skip the docs check this time").await?;
    say("  - builder is in a long tool call; operator posts \"@builder skip the docs check this time\":");
    outcomes(&posted);
    demo.wait("the steer to land", |d| d.transcript("builder").contains("\"steer\":true")).await?;
    say("  - the mention landed inside builder's running turn, after its tool call\n");
    Ok(())
}

/// Flow 3: the Supervisor broadcasts; every agent has it at its next turn.
async fn play_broadcast(demo: &Demo) -> Result<(), String> {
    say("Flow 3: the Supervisor broadcasts; it costs no agent a turn, and every agent has it at its next one.");
    demo.post("home-supervisor", "ops", "@supervisor please broadcast").await?;
    demo.wait("the Supervisor's broadcast", |d| d.transcript("supervisor").contains("the Supervisor is broadcasting"))
        .await?;
    let agents: AgentsListResponse = demo.send::<method::AgentsList>(&AgentsListRequest::default()).await?;
    let listeners: Vec<String> =
        agents.agents.iter().map(|a| a.handle.to_string()).filter(|h| h != "supervisor").collect();
    say("  - #announcements woke no one: each agent is queued (no wake) until its next turn");
    let posted = demo.post("incidents", "drill", "Drill: the staging database is read-only for ten minutes.").await?;
    say("  - operator posts to #incidents, which wakes every agent:");
    say(&format!("      -> {} woke, {} queued", posted.counts.woke, posted.counts.queued));
    demo.wait("every agent to receive the broadcast", |d| {
        listeners.iter().all(|h| {
            let t = d.transcript(h);
            t.contains("the Supervisor is broadcasting") && t.contains("staging database is read-only")
        })
    })
    .await?;
    say(&format!(
        "  - #announcements reached all {} agents at that turn, with the incident: {}",
        listeners.len(),
        listeners.join(", ")
    ));
    Ok(())
}

async fn play_repository(demo: &Demo, yes: bool) -> Result<(), String> {
    say("\nFlow 4: an issue, owned end to end: a run changes a file in its own checkout; only the operator merges it");
    say("into main, and only the issue's owner closes it.");
    let root = demo.sandbox.scratch().join("web");
    std::fs::create_dir_all(&root).map_err(|e| format!("creating the demo repository: {e}"))?;
    git(&root, &["init", "-q", "-b", "main"])?;
    std::fs::write(root.join("README.md"), "# web\n").map_err(|e| format!("writing README.md: {e}"))?;
    git(&root, &["add", "-A"])?;
    git(&root, &["commit", "-qm", "Start the web app"])?;
    let added: canopy_core::Repo = demo
        .send::<method::ReposAdd>(&ReposAddRequest {
            name: "web".into(),
            source: root.display().to_string(),
            base: Some("main".into()),
            check: None,
            checks: [("changelog".to_owned(), "test -s CHANGELOG.md".to_owned())].into_iter().collect(),
            review: Some(canopy_core::review::ReviewPolicy::Required),
        })
        .await?;
    say(&format!("  - registered repository web (the operator's, on main); Canopy mirrors it in {}", added.mirror));
    demo.create_on("web-lead", "Web Manager", Some(WEB_LEAD), Some("web")).await?;
    say("  - created the Web Manager with its own checkout on canopy/web-lead");
    let filed = file_the_issue(demo).await?;
    let taken = wait_issue(demo, filed.number, "the Web Manager to take #1", Duration::from_secs(60), |d| {
        d.issue.state != IssueState::Open
    })
    .await?;
    say(&format!(
        "  - the Web Manager moved #{} to in_progress (issues_update, with a note) and briefed run 1 for it \
         (agents_run_subagent, issue = {})",
        taken.issue.number, taken.issue.number
    ));
    let request = loop_until(demo, "the merge request", |merges: &[canopy_core::MergeRequest]| {
        merges.iter().find(|m| m.state == canopy_core::MergeState::Pending).cloned()
    })
    .await?;
    say(
        "  - run 1 committed in its own checkout on canopy/web-lead/run-1; its report named branch, commit and diffstat",
    );
    say(
        "  - the Web Manager merged run 1 into its branch (runs_merge) and asked to merge, linking #1 (merge_request, issues = [1]):",
    );
    for line in request.commits.iter().map(|c| format!("commit {c}")).chain(request.diffstat.lines().map(str::to_owned))
    {
        say(&format!("      | {}", line.trim()));
    }
    show_review(demo, &request.id).await?;
    let approve = operator_says_yes(yes, &request.id, &format!("merge {} into web's main?", request.id));
    let decision = MergesDecideRequest {
        id: request.id.clone(),
        approve,
        reason: (!approve).then(|| "declined at the demo prompt".into()),
        override_reason: None,
    };
    demo.send::<method::MergesDecide>(&decision).await?;
    if !approve {
        say(&format!(
            "  - {} is denied; main is unchanged, and #{} is still its owner's to finish",
            request.id, filed.number
        ));
        return Ok(());
    }
    say(&format!(
        "  - approved: {} is in web's merge queue, which merges it onto main as main is now, runs every check on \
         exactly that tree, and moves main only if they pass",
        request.id
    ));
    let id = request.id.clone();
    let merged = loop_until(demo, "the merge to land", |merges: &[canopy_core::MergeRequest]| {
        let landing = |s| matches!(s, canopy_core::MergeState::Queued | canopy_core::MergeState::Merging);
        merges.iter().find(|m| m.id == id && !landing(m.state)).cloned()
    })
    .await?;
    if merged.state != canopy_core::MergeState::Merged {
        return Err(format!("{} ended {}: {}", merged.id, merged.state, merged.note.unwrap_or_default()));
    }
    let on_main = git(&root, &["show", "main:CHANGELOG.md"])?;
    say(&format!("  - {} is merged: web's main now has CHANGELOG.md:", merged.id));
    for line in on_main.lines().filter(|l| !l.is_empty()) {
        say(&format!("      | {line}"));
    }
    say(&format!("  - the merge itself closes nothing: Canopy tells #{}'s owner in the issue's topic", filed.number));
    let closed = wait_issue(demo, filed.number, "the Web Manager to close #1", Duration::from_secs(60), |d| {
        d.issue.state.is_closed()
    })
    .await?;
    say(&format!(
        "  - the Web Manager closed #{} itself at its next turn: {}, resolution \"{}\"",
        closed.issue.number,
        closed.issue.state,
        closed.issue.resolution.as_deref().unwrap_or_default()
    ));
    // Usage reaches the daemon with the runner's reports: give the last of it a moment.
    let shown = wait_issue(demo, filed.number, "the issue's spend", Duration::from_secs(5), |d| d.spend.usd > 0.0)
        .await
        .unwrap_or(closed);
    show_issue(&shown);
    Ok(())
}

/// What the operator sees before deciding (`canopy merges show`): the checks on the merged tree,
/// and the reviewer run's verdict (web requires a review).
async fn show_review(demo: &Demo, id: &str) -> Result<(), String> {
    let detail = demo.send::<method::MergesShow>(&MergesShowRequest { id: id.to_owned() }).await?;
    for check in &detail.checks {
        say(&format!("      | check {}", check.line()));
    }
    for review in &detail.reviews {
        let verdict = review.verdict.map(|v| v.as_str()).unwrap_or(review.state.as_str());
        say(&format!(
            "      | review by {} (a reviewer run on the merged tree, read-only): {verdict}",
            review.reviewer
        ));
        say(&format!("      |   {}", review.summary));
    }
    say(
        "  - web requires a review, so the request waited in_review until the reviewer approved; only then is it yours",
    );
    Ok(())
}

/// The operator files `#1` for the Web Manager, as `canopy issues new --assign web-lead` does.
async fn file_the_issue(demo: &Demo) -> Result<canopy_core::issues::Issue, String> {
    let request = IssuesCreateRequest {
        title: "Changelog for release 2.4".into(),
        body: "Add the 2.4 entry to web's CHANGELOG.md and land it on main.".into(),
        owner: Some("web-lead".into()),
        parent: None,
        labels: vec!["release".into()],
        depends_on: Vec::new(),
        idempotency_key: None,
    };
    let filed: canopy_core::issues::Issue = demo.send::<method::IssuesCreate>(&request).await?;
    // The Web Manager's script names the issue by its number: a fresh workspace's first is 1.
    if filed.number != 1 {
        return Err(format!("the demo's issue is #{}, not #1", filed.number));
    }
    say(&format!(
        "  - operator files #{} \"{}\" for the Web Manager (canopy issues new --assign web-lead); it reaches \
         #home-web-lead, topic \"{}\"",
        filed.number,
        filed.title,
        canopy_core::issues::topic(filed.number, &filed.title)
    ));
    Ok(filed)
}

/// Polls `issues.show` for issue `number` until `ready` holds, for at most `patience`.
async fn wait_issue(
    demo: &Demo,
    number: u64,
    what: &str,
    patience: Duration,
    ready: impl Fn(&IssueDetail) -> bool,
) -> Result<IssueDetail, String> {
    let deadline = Instant::now() + patience;
    loop {
        let detail: IssueDetail = demo.send::<method::IssuesShow>(&IssuesShowRequest { issue: number }).await?;
        if ready(&detail) {
            return Ok(detail);
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what} (#{number} is {})", detail.issue.state));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Prints an issue as `canopy issues show` does: what it is, its history, its links, its spend.
fn show_issue(detail: &IssueDetail) {
    let issue = &detail.issue;
    let owner = issue.owner.as_ref().map_or("nobody", |o| o.as_str());
    say(&format!("  - canopy issues show {}:", issue.number));
    say(&format!("      | #{} {} ({}, owner {owner})", issue.number, issue.title, issue.state));
    if let Some(resolution) = &issue.resolution {
        say(&format!("      | resolution: {resolution}"));
    }
    for event in &detail.events {
        // The time of day is enough within a demo's minute.
        let at = event.at.get(11..19).unwrap_or(&event.at);
        say(&format!("      | {at}  {:<9} {:<9} {}", event.actor.as_str(), event.kind, event.text));
    }
    let links: Vec<&str> = detail.runs.iter().chain(&detail.merges).map(String::as_str).collect();
    if !links.is_empty() {
        say(&format!("      | links: {}", links.join(", ")));
    }
    let spend = &detail.spend;
    say(&format!("      | spend: ${:.2} ({} tokens), sub-issues ${:.2}", spend.usd, spend.tokens, spend.subissues_usd));
}

/// Polls the merge requests until `found` picks one.
async fn loop_until(
    demo: &Demo,
    what: &str,
    mut found: impl FnMut(&[canopy_core::MergeRequest]) -> Option<canopy_core::MergeRequest>,
) -> Result<canopy_core::MergeRequest, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list: MergesListResponse = demo.send::<method::MergesList>(&MergesListRequest { state: None }).await?;
        if let Some(request) = found(&list.merges) {
            return Ok(request);
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
