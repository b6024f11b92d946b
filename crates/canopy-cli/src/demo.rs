//! `canopy demo`: the three flows of DESIGN section 1, played and narrated on a temporary
//! workspace (private nats-server, SQLite, the scripted harness), no model account needed.
//!
//! 1. The CI Manager asks for a child Manager; the request appears in its home channel; the
//!    operator (the person at the terminal, or `--yes`, labelled as such) approves; the child
//!    starts with its charter and the CI Manager is told.
//! 2. A post reaches an idle agent at its turn start; an `@mention` steers a busy one.
//! 3. The Supervisor broadcasts; every agent receives it.
//!
//! Everything it started is stopped before it exits.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use canopy_bench::Sandbox;
use canopy_proto::api::*;
use canopy_proto::{ApiMethod, method};

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

struct Demo {
    sandbox: Sandbox,
}

fn say(line: &str) {
    println!("{line}");
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
        let request = AgentsCreateRequest {
            handle: handle.into(),
            name: name.into(),
            role: "manager".into(),
            parent: None,
            charter: format!("{name}'s lane"),
            harness: Some("scripted".into()),
            script: script.map(|text| ScriptSource { name: format!("{handle}.toml"), text: text.into() }),
            persona: None,
            repo: None,
        };
        self.send::<method::AgentsCreate>(&request).await.map(|_| ())
    }

    async fn presence(&self, handle: &str) -> Option<canopy_core::Presence> {
        let roster: RosterResponse = self.send::<method::Roster>(&RosterRequest::default()).await.ok()?;
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
        };
        self.send::<method::MessagesPost>(&request).await
    }
}

fn outcomes(posted: &PostResponse) {
    for o in &posted.outcomes {
        let reason = o.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
        say(&format!("      -> {}: {:?}{reason}", o.recipient, o.outcome));
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
    let sandbox = match Sandbox::start(&edits).await {
        Ok(sandbox) => sandbox,
        Err(e) => {
            eprintln!("error: starting the demo workspace: {e}");
            return crate::EXIT_UNAVAILABLE;
        }
    };
    let demo = Demo { sandbox };
    let result = play(&demo, yes).await;
    demo.sandbox.stop().await;
    match result {
        Ok(()) => {
            say("\nDone: every process the demo started has stopped, and its workspace is removed.");
            0
        }
        Err(e) => {
            eprintln!("error: the demo failed: {e}");
            1
        }
    }
}

async fn play(demo: &Demo, yes: bool) -> Result<(), String> {
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
    let approve = if yes {
        say(&format!("  - operator: approving {} automatically (--yes)", request.id));
        true
    } else {
        print!("  - operator: approve {}? [y/N] ", request.id);
        let _ = std::io::stdout().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        matches!(answer.trim(), "y" | "Y" | "yes")
    };
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

    say("Flow 3: the Supervisor broadcasts; every agent receives it.");
    demo.post("home-supervisor", "ops", "@supervisor please broadcast").await?;
    let agents: AgentsListResponse = demo.send::<method::AgentsList>(&AgentsListRequest {}).await?;
    let listeners: Vec<String> =
        agents.agents.iter().map(|a| a.handle.to_string()).filter(|h| h != "supervisor").collect();
    demo.wait("every agent to receive the broadcast", |d| {
        listeners.iter().all(|h| d.transcript(h).contains("the Supervisor is broadcasting"))
    })
    .await?;
    say(&format!("  - #announcements reached all {} agents: {}", listeners.len(), listeners.join(", ")));
    Ok(())
}
