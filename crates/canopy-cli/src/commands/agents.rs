//! The agents area: who the operator is, the agents (create, list, show, reparent, despawn),
//! the tree, the roster, and `watch`, which follows one agent's activity live.
//!
//! Starting, stopping and interrupting sessions are `sessions.rs`'s; budgets `budgets.rs`'s.

use canopy_core::ErrorCode;
use canopy_proto::api::*;
use canopy_proto::method;
use futures_util::StreamExt;

use super::call::{call, waiting_banner};
use crate::args::{CreateArgs, WatchArgs};
use crate::client::{CallError, Client, Follower};
use crate::exit::{EXIT_REFUSED, code, fail};
use crate::output;
use crate::writer::{err, errln, outln};

/// `canopy whoami`.
pub async fn whoami(client: &Client, json: bool) -> u8 {
    waiting_banner(client, json).await;
    let result = call::<method::Whoami>(client, json, &WhoamiRequest {}, |r: &WhoamiResponse| {
        outln!(
            "{} ({}) in workspace {} ({}), daemon {}",
            r.account.handle,
            r.account.kind,
            r.workspace.name,
            r.workspace.id,
            r.version
        );
        if !r.waiting_issues.is_empty() {
            outln!("Waiting on you: {}", output::waiting_issues_heading(r.waiting_issues.len()));
            for line in output::waiting_issues(&r.waiting_issues) {
                outln!("  {line}");
            }
        }
    })
    .await;
    code(json, result)
}

/// `canopy agents create`.
pub async fn create(client: &Client, json: bool, args: CreateArgs) -> u8 {
    let CreateArgs { handle, name, role, parent, charter, harness, script, persona, repo, needs } = args;
    let script = match script.map(|path| read_script(&path)).transpose() {
        Ok(script) => script,
        Err(e) => return fail(json, &e),
    };
    let request = AgentsCreateRequest { handle, name, role, parent, charter, harness, script, persona, repo, needs };
    code(json, call::<method::AgentsCreate>(client, json, &request, output::account).await)
}

/// `canopy agents list`.
pub async fn list(client: &Client, json: bool) -> u8 {
    let result = client.agents().await.map(|list| match json {
        true => output::json(&list),
        false => output::agents(&list.agents),
    });
    code(json, result)
}

/// `canopy agents show`: the account, its children and its subscriptions.
pub async fn show(client: &Client, json: bool, handle: String) -> u8 {
    let result = call::<method::AgentsShow>(client, json, &AgentsShowRequest { handle }, |r: &AgentsShowResponse| {
        output::account(&r.account);
        if !r.children.is_empty() {
            outln!("  children {}", r.children.join(", "));
        }
        for s in &r.subscriptions {
            let mandatory = if s.mandatory { "mandatory" } else { "optional" };
            outln!("  subscribed #{} ({mandatory}, cursor {})", s.channel, s.cursor);
        }
    })
    .await;
    code(json, result)
}

/// `canopy agents reparent`.
pub async fn reparent(client: &Client, json: bool, handle: String, parent: String) -> u8 {
    let request = AgentsReparentRequest { handle, parent };
    code(json, call::<method::AgentsReparent>(client, json, &request, output::account).await)
}

/// `canopy agents despawn`: asks first on a terminal unless `--yes`.
pub async fn despawn(client: &Client, json: bool, handle: String, yes: bool) -> u8 {
    if !yes && !confirm_despawn(client, &handle).await {
        errln!("not despawned");
        return EXIT_REFUSED;
    }
    let request = AgentsDespawnRequest { handle };
    let result = call::<method::AgentsDespawn>(client, json, &request, |r: &AgentsDespawnResponse| {
        outln!("despawned {}", r.despawned.join(", "))
    })
    .await;
    code(json, result)
}

/// On a terminal, asks before despawning a subtree (it cannot be undone); elsewhere (a
/// script) the command goes ahead, as with `--yes`.
async fn confirm_despawn(client: &Client, handle: &str) -> bool {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return true;
    }
    let request = AgentsShowRequest { handle: handle.to_owned() };
    let below = match client.send::<method::AgentsShow>(&request).await {
        Ok(shown) if !shown.children.is_empty() => format!(" and its reports ({})", shown.children.join(", ")),
        _ => String::new(),
    };
    err!("despawn {handle}{below}? Their sessions stop; history stays. [y/N] ");
    // A question that could not be flushed is still answered: the read below decides.
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    if let Err(e) = std::io::stdin().lock().read_line(&mut answer) {
        // No answer is a no, as at the prompt's `[y/N]`.
        tracing::debug!("reading the despawn confirmation from stdin: {e}");
    }
    matches!(answer.trim(), "y" | "Y" | "yes")
}

/// Reads a script file for `agents create --script`; the daemon validates it.
fn read_script(path: &std::path::Path) -> Result<ScriptSource, CallError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CallError::Refused(canopy_proto::WireError {
            code: ErrorCode::InvalidArgument,
            message: format!("reading {}: {e}", path.display()),
            field: Some("script".into()),
        })
    })?;
    Ok(ScriptSource { name: path.display().to_string(), text })
}

/// `canopy tree`.
pub async fn tree(client: &Client, json: bool) -> u8 {
    waiting_banner(client, json).await;
    let result =
        call::<method::Tree>(client, json, &TreeRequest { depth: None }, |r: &TreeResponse| output::tree(&r.root))
            .await;
    code(json, result)
}

/// `canopy roster`.
pub async fn roster(client: &Client, json: bool) -> u8 {
    waiting_banner(client, json).await;
    let result = client.roster().await.map(|roster| match json {
        true => output::json(&roster),
        false => output::roster(&roster.agents),
    });
    code(json, result)
}

/// `canopy watch`: follows an agent's activity: stored items first, then doorbells, resyncing
/// on reconnect and on a timer; after a daemon restart, from the daemon's new server
/// (`Follower`).
pub async fn watch(follower: Follower, json: bool, args: WatchArgs) -> u8 {
    code(json, follow_activity(follower, json, args).await)
}

async fn follow_activity(mut follower: Follower, json: bool, args: WatchArgs) -> Result<(), CallError> {
    if args.timeline {
        return timeline(&follower.client, json, &args.handle).await;
    }
    let first = ActivityReadRequest { agent: args.handle.clone(), after: 0, limit: None, tail: Some(args.tail) };
    let page: ActivityReadResponse = follower.client.send::<method::ActivityRead>(&first).await?;
    for item in &page.items {
        output::activity(item, &args.handle, json);
    }
    let mut last = page.next_after;
    if args.no_follow {
        return Ok(());
    }
    loop {
        let lost = watch_connection(&mut follower, json, &args, &mut last).await?;
        let mut timer = tokio::time::interval(args.resync);
        loop {
            timer.tick().await;
            if follower.recover(&lost).await {
                break;
            }
        }
    }
}

/// `canopy watch --timeline`: the last 24 hours of the agent's turns, from its newest
/// `MAX_READ_LIMIT` activity items.
async fn timeline(client: &Client, json: bool, handle: &str) -> Result<(), CallError> {
    let tail = canopy_proto::api::MAX_READ_LIMIT;
    let read = ActivityReadRequest { agent: handle.to_owned(), after: 0, limit: None, tail: Some(tail) };
    let page: ActivityReadResponse = client.send::<method::ActivityRead>(&read).await?;
    let now = canopy_sys::unix_ms();
    let timeline = canopy_core::timeline::build(&page.items, now - 86_400_000, now);
    match json {
        true => output::json(&timeline),
        false => crate::charts::timeline(handle, &timeline),
    }
    Ok(())
}

/// Follows activity over one connection until a call finds the daemon unreachable; returns why.
async fn watch_connection(
    follower: &mut Follower,
    json: bool,
    args: &WatchArgs,
    last: &mut u64,
) -> Result<String, CallError> {
    let client = &follower.client.clone();
    let subject = client.api.subjects.activity_event(&args.handle);
    let mut connection = client.api.bus.connection_events();
    let mut events = client.api.bus.subscribe(&subject).await.map_err(|e| CallError::Unreachable(e.to_string()))?;
    let mut timer = tokio::time::interval(args.resync);
    let mut due = true;
    loop {
        while due {
            let request = ActivityReadRequest { agent: args.handle.clone(), after: *last, limit: None, tail: None };
            let page: ActivityReadResponse = match client.send::<method::ActivityRead>(&request).await {
                Ok(page) => page,
                Err(CallError::Unreachable(reason)) => return Ok(reason),
                Err(e) => return Err(e),
            };
            follower.answered();
            for item in &page.items {
                output::activity(item, &args.handle, json);
            }
            *last = page.next_after.max(*last);
            due = page.more;
        }
        due = tokio::select! {
            event = events.next() => match event {
                Some(event) => serde_json::from_slice::<ActivityEvent>(&event.payload).map_or(true, |e| e.item.id > *last),
                None => return Ok("the event subscription ended".into()),
            },
            change = connection.recv() => matches!(change, Ok(canopy_bus::ConnectionEvent::Connected)),
            _ = timer.tick() => true,
        };
    }
}
