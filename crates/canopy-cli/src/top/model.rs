//! What `canopy top` shows, read through the API each tick: the tree with every agent's
//! presence and activity, what waits for the operator (spawn and merge requests, failing
//! agents, issues blocked on an answer) with how long each has waited, budget alerts, and the
//! newest messages or, while one agent is watched, its newest activity. Also the acts the keys
//! take (approve, deny, post). Does not draw (`draw.rs`) or read keys (`mod.rs`).

use canopy_bus::CallError;
use canopy_core::{ActivityItem, Message, Presence, RosterEntry, Seq, TreeNode};
use canopy_proto::api::*;
use canopy_proto::method;

use crate::client::Client;

/// One row of the tree: its depth and its roster entry (when the roster has it).
#[derive(Debug, Clone)]
pub struct Row {
    pub depth: usize,
    pub handle: String,
    pub role: String,
    pub entry: Option<RosterEntry>,
}

/// Something waiting for the operator.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Spawn { id: String, from: String, what: String, since: String },
    Merge { id: String, from: String, what: String, since: String },
    Failing { handle: String, why: String, since: Option<String> },
    Issue { number: u64, title: String, since: String },
}

impl Item {
    /// A spawn or merge request's id: what approve and deny act on.
    pub fn decidable(&self) -> Option<&str> {
        match self {
            Item::Spawn { id, .. } | Item::Merge { id, .. } => Some(id),
            _ => None,
        }
    }
}

/// One tick's reading of the workspace.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub rows: Vec<Row>,
    pub waiting: Vec<Item>,
    pub alerts: Vec<String>,
    /// The newest messages, oldest first.
    pub messages: Vec<Message>,
    /// The watched agent's newest activity, oldest first.
    pub activity: Vec<ActivityItem>,
}

fn flatten(node: &TreeNode, depth: usize, roster: &[RosterEntry], out: &mut Vec<Row>) {
    let entry = roster.iter().find(|a| a.handle == node.handle).cloned();
    out.push(Row { depth, handle: node.handle.to_string(), role: node.role.to_string(), entry });
    for child in &node.children {
        flatten(child, depth + 1, roster, out);
    }
}

/// Reads everything a frame shows; `watching` adds that agent's activity.
pub async fn read(client: &Client, watching: Option<&str>, lines: u32) -> Result<Snapshot, CallError> {
    let tree = client.send::<method::Tree>(&TreeRequest { depth: None }).await?;
    let roster = client.roster().await?.agents;
    let mut rows = Vec::new();
    flatten(&tree.root, 0, &roster, &mut rows);
    let pending = SpawnListRequest { state: Some(canopy_core::SpawnState::Pending) };
    let spawns = client.send::<method::SpawnList>(&pending).await?.requests;
    let pending = MergesListRequest { state: Some(canopy_core::MergeState::Pending) };
    let merges = client.send::<method::MergesList>(&pending).await?.merges;
    let issues = client.send::<method::Whoami>(&WhoamiRequest {}).await?.waiting_issues;
    let mut waiting: Vec<Item> = spawns
        .iter()
        .rev()
        .map(|r| Item::Spawn {
            id: r.id.clone(),
            from: r.requester.to_string(),
            what: format!("asks for {} ({}): {}", r.handle, r.role, r.reason),
            since: r.created_at.clone(),
        })
        .collect();
    waiting.extend(merges.iter().rev().map(|m| Item::Merge {
        id: m.id.clone(),
        from: m.requester.to_string(),
        what: format!("{} ({} {} -> {})", m.title, m.repo, m.branch, m.base),
        since: m.created_at.clone(),
    }));
    waiting.extend(roster.iter().filter(|a| matches!(a.presence, Presence::Failing | Presence::Crashed)).map(|a| {
        Item::Failing {
            handle: a.handle.to_string(),
            why: format!("{}: {}", a.presence, a.reason.as_deref().unwrap_or("no reason given")),
            since: a.since.clone(),
        }
    }));
    waiting.extend(issues.iter().map(|i| Item::Issue {
        number: i.number,
        title: i.title.clone(),
        since: i.updated_at.clone(),
    }));
    let alerts = roster
        .iter()
        .filter_map(|a| a.budget.as_ref().map(|b| (a, b)))
        .map(|(a, b)| match b.level {
            canopy_core::budget::Level::Over => format!("{} over budget (@{}'s {})", a.handle, b.owner, b.scope),
            _ => format!("{} at {}% (@{}'s {})", a.handle, b.percent, b.owner, b.scope),
        })
        .collect();
    let messages = newest(client, lines).await?;
    let activity = match watching {
        Some(handle) => {
            let read = ActivityReadRequest { agent: handle.to_owned(), after: 0, limit: None, tail: Some(lines) };
            client.send::<method::ActivityRead>(&read).await?.items
        }
        None => Vec::new(),
    };
    Ok(Snapshot { rows, waiting, alerts, messages, activity })
}

/// The newest `n` messages of every channel, oldest first.
async fn newest(client: &Client, n: u32) -> Result<Vec<Message>, CallError> {
    let channels = client.send::<method::ChannelsList>(&ChannelsListRequest {}).await?.channels;
    let head = channels.iter().map(|c| c.last_seq).max().unwrap_or_default();
    let request = SyncRequest { after: Seq(head.get().saturating_sub(u64::from(n))), channel: None, limit: None };
    let mut messages = client.send::<method::MessagesSync>(&request).await?.messages;
    messages.sort_by_key(|m| m.seq);
    let skip = messages.len().saturating_sub(n as usize);
    Ok(messages.into_iter().skip(skip).collect())
}

/// Approves or denies a spawn (`req-`) or merge (`merge-`) request.
pub async fn decide(client: &Client, id: &str, reason: Option<String>) -> Result<String, CallError> {
    let approve = reason.is_none();
    let verb = if approve { "approved" } else { "denied" };
    if id.starts_with("merge-") {
        let request = MergesDecideRequest { id: id.to_owned(), approve, reason, override_reason: None };
        client.send::<method::MergesDecide>(&request).await?;
    } else {
        let request = SpawnDecideRequest { id: id.to_owned(), approve, reason };
        client.send::<method::SpawnDecide>(&request).await?;
    }
    Ok(format!("{id} {verb}"))
}

/// Posts `body` to `handle`'s home channel, topic `operator`.
pub async fn post_home(client: &Client, handle: &str, body: &str) -> Result<String, CallError> {
    let request = PostRequest {
        channel: format!("home-{handle}"),
        topic: "operator".into(),
        body: body.to_owned(),
        create_topic: true,
        idempotency_key: None,
        ack_only: false,
        wake: false,
    };
    let posted = client.send::<method::MessagesPost>(&request).await?;
    Ok(format!("posted #{} to #home-{handle}", posted.message.seq.get()))
}
