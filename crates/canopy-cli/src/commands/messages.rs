//! The messages area: channels, topics, a channel's board, posting (the body from the
//! argument or stdin), reading, and `tail`, which follows new messages live.
//!
//! Does not decide who receives a post: the daemon answers with each recipient's outcome,
//! printed as it is.

use canopy_config::{Config, DataDir};
use canopy_core::{ChannelKind, PostPolicy, Seq};
use canopy_proto::api::*;
use canopy_proto::method;
use futures_util::StreamExt;

use super::call::{call, text_from_stdin};
use crate::args::{
    BoardCommand, ChannelsCommand, KindArg, PostArgs, PostPolicyArg, ReadArgs, TailArgs, TopicsCommand, WakeArg,
};
use crate::client::{CallError, Client, Follower};
use crate::exit::code;
use crate::output;
use crate::writer::{errln, outln};

/// `canopy channels [list|create]`.
pub async fn channels(client: &Client, json: bool, command: Option<ChannelsCommand>) -> u8 {
    let result = match command {
        None | Some(ChannelsCommand::List) => {
            call::<method::ChannelsList>(client, json, &ChannelsListRequest {}, |r: &ChannelsListResponse| {
                output::channels(&r.channels)
            })
            .await
        }
        Some(ChannelsCommand::Create { name, kind, post_policy, posters, wake }) => {
            let request = ChannelsCreateRequest {
                name,
                kind: Some(match kind {
                    KindArg::General => ChannelKind::General,
                    KindArg::Broadcast => ChannelKind::Broadcast,
                }),
                post_policy: post_policy.map(|p| match p {
                    PostPolicyArg::Open => PostPolicy::Open,
                    PostPolicyArg::OwnerOnly => PostPolicy::OwnerOnly,
                    PostPolicyArg::Restricted => PostPolicy::Restricted,
                }),
                posters,
                wake: wake.map(|w| match w {
                    WakeArg::Always => canopy_core::WakePolicy::Always,
                    WakeArg::Mentions => canopy_core::WakePolicy::Mentions,
                    WakeArg::Never => canopy_core::WakePolicy::Never,
                }),
            };
            call::<method::ChannelsCreate>(client, json, &request, |c: &canopy_core::Channel| {
                output::channels(std::slice::from_ref(c))
            })
            .await
        }
    };
    code(json, result)
}

/// `canopy topics --channel C [rename|resolve]`.
pub async fn topics(client: &Client, json: bool, channel: String, command: Option<TopicsCommand>) -> u8 {
    let result = match command {
        None => {
            call::<method::TopicsList>(client, json, &TopicsListRequest { channel }, |r: &TopicsListResponse| {
                output::topics(&r.topics)
            })
            .await
        }
        Some(TopicsCommand::Rename { topic, to }) => {
            let request = TopicsRenameRequest { channel, topic: topic.clone(), to: to.clone() };
            call::<method::TopicsRename>(client, json, &request, |_: &Done| outln!("renamed {topic:?} to {to:?}")).await
        }
        Some(TopicsCommand::Resolve { topic, reopen }) => {
            let request = TopicsResolveRequest { channel, topic: topic.clone(), resolved: !reopen };
            let word = if reopen { "reopened" } else { "resolved" };
            call::<method::TopicsResolve>(client, json, &request, |_: &Done| outln!("{word} {topic:?}")).await
        }
    };
    code(json, result)
}

/// `canopy board --channel C [pin|unpin]`.
pub async fn board(client: &Client, json: bool, channel: String, command: Option<BoardCommand>) -> u8 {
    let result = match command {
        None => call::<method::BoardList>(client, json, &BoardListRequest { channel }, output::board).await,
        Some(BoardCommand::Pin { seq }) => {
            call::<method::BoardPin>(client, json, &BoardPinRequest { channel, seq }, output::board).await
        }
        Some(BoardCommand::Unpin { seq }) => {
            call::<method::BoardUnpin>(client, json, &BoardPinRequest { channel, seq }, output::board).await
        }
    };
    code(json, result)
}

/// `canopy post`: the body from the argument, or from stdin when it is absent or `-`.
pub async fn post(dir: &DataDir, client: &Client, json: bool, mut args: PostArgs) -> u8 {
    let body = match args.body.take() {
        Some(body) if body != "-" => body,
        _ => {
            let max = Config::load(&dir.config()).unwrap_or_default().limits.max_body_bytes;
            match text_from_stdin("the message body", max, "`[limits] max_body_bytes`") {
                Ok(body) => body,
                Err(bad) => return bad.fail(json, "body"),
            }
        }
    };
    let request = PostRequest {
        channel: args.channel,
        topic: args.topic,
        body,
        create_topic: args.create_topic,
        idempotency_key: args.idempotency_key,
        ack_only: args.ack_only,
        wake: args.wake,
    };
    let result = call::<method::MessagesPost>(client, json, &request, |r: &PostResponse| {
        let retry = if r.duplicate { " (already posted with this idempotency key)" } else { "" };
        outln!("posted seq {} to #{} > {}{retry}", r.message.seq, r.message.channel, r.message.topic);
        output::outcomes(r);
    })
    .await;
    code(json, result)
}

/// `canopy read`: a channel's newest page, or forwards from `--after`/the start.
pub async fn read(client: &Client, json: bool, args: ReadArgs) -> u8 {
    let request = ReadRequest {
        channel: args.channel,
        topic: args.topic,
        after: args.after,
        limit: args.limit,
        unread: false,
        newest: !args.from_start && args.after == Seq(0),
    };
    code(json, call::<method::MessagesRead>(client, json, &request, output::read).await)
}

/// `canopy tail`: follows new messages: event doorbells, resync from the store on reconnect
/// and on a timer; after a daemon restart, from the daemon's new server (`Follower`), from the
/// same cursor.
pub async fn tail(follower: Follower, json: bool, args: TailArgs) -> u8 {
    code(json, follow_messages(follower, json, args).await)
}

async fn follow_messages(mut follower: Follower, json: bool, args: TailArgs) -> Result<(), CallError> {
    let mut last = match args.after {
        Some(after) => after,
        None => {
            let request = ChannelsListRequest {};
            let channels: ChannelsListResponse = follower.client.send::<method::ChannelsList>(&request).await?;
            channels
                .channels
                .iter()
                .filter(|c| args.channel.as_deref().is_none_or(|name| c.name.as_str() == name.trim_start_matches('#')))
                .map(|c| c.last_seq)
                .max()
                .unwrap_or_default()
        }
    };
    if args.after.is_none() && args.last > 0 {
        recent(&follower.client, json, &args, last).await?;
    }
    let mut told = false;
    loop {
        let lost = tail_connection(&mut follower, json, &args, &mut last, &mut told).await?;
        let mut timer = tokio::time::interval(args.resync);
        loop {
            timer.tick().await;
            if follower.recover(&lost).await {
                break;
            }
        }
    }
}

/// Prints the last `args.last` messages up to `head`, so `tail` does not open on a blank
/// screen: one channel's newest page, or (every channel) the newest of the sequences just
/// before `head`, which an operator reads all of.
async fn recent(client: &Client, json: bool, args: &TailArgs, head: Seq) -> Result<(), CallError> {
    let n = args.last.min(100);
    let messages: Vec<canopy_core::Message> = match &args.channel {
        Some(channel) => {
            let request = ReadRequest {
                channel: channel.trim_start_matches('#').to_owned(),
                topic: None,
                after: Seq(0),
                limit: Some(n),
                unread: false,
                newest: true,
            };
            client.send::<method::MessagesRead>(&request).await?.groups.into_iter().flat_map(|g| g.messages).collect()
        }
        None => {
            let request =
                SyncRequest { after: Seq(head.get().saturating_sub(u64::from(n))), channel: None, limit: None };
            client.send::<method::MessagesSync>(&request).await?.messages
        }
    };
    let mut messages: Vec<_> = messages.into_iter().filter(|m| m.seq <= head).collect();
    messages.sort_by_key(|m| m.seq);
    for message in messages.iter().skip(messages.len().saturating_sub(n as usize)) {
        match json {
            true => output::json_line(message),
            false => outln!("{}", output::message_line(message, true)),
        }
    }
    Ok(())
}

/// Follows messages over one connection until a call finds the daemon unreachable; returns why.
async fn tail_connection(
    follower: &mut Follower,
    json: bool,
    args: &TailArgs,
    last: &mut Seq,
    told: &mut bool,
) -> Result<String, CallError> {
    let client = &follower.client.clone();
    let subject = match &args.channel {
        Some(channel) => client.api.subjects.message_event(channel.trim_start_matches('#')),
        None => client.api.subjects.message_events_all(),
    };
    let mut connection = client.api.bus.connection_events();
    let mut events = client.api.bus.subscribe(&subject).await.map_err(|e| CallError::Unreachable(e.to_string()))?;
    let mut timer = tokio::time::interval(args.resync);
    let channel = args.channel.as_deref();
    // Catch up once now: anything committed before subscribing (or while the daemon was away).
    let mut result = catch_up(client, json, channel, last).await;
    if result.is_ok() {
        follower.answered();
    }
    if !std::mem::replace(told, true) {
        // On stderr, so `--json` output stays one message per line; scripts can wait for it.
        errln!("following messages after {last} (Ctrl-C to stop)");
    }
    loop {
        match result {
            Err(CallError::Unreachable(reason)) => return Ok(reason),
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        result = tokio::select! {
            event = events.next() => {
                let Some(event) = event else { return Ok("the event subscription ended".into()) };
                let seq = serde_json::from_slice::<MessageEvent>(&event.payload).map(|e| e.message.seq).unwrap_or(Seq(u64::MAX));
                if seq > *last { catch_up(client, json, channel, last).await } else { Ok(()) }
            }
            change = connection.recv() => {
                if matches!(change, Ok(canopy_bus::ConnectionEvent::Connected)) {
                    tracing::info!("reconnected to NATS; resyncing from #{last}");
                    catch_up(client, json, channel, last).await
                } else {
                    Ok(())
                }
            }
            _ = timer.tick() => catch_up(client, json, channel, last).await,
        };
    }
}

/// Prints every message after `last` from the store, moving `last`.
async fn catch_up(client: &Client, json: bool, channel: Option<&str>, last: &mut Seq) -> Result<(), CallError> {
    loop {
        let request = SyncRequest { after: *last, channel: channel.map(str::to_owned), limit: None };
        let page: SyncResponse = client.send::<method::MessagesSync>(&request).await?;
        for message in &page.messages {
            if json {
                output::json_line(message);
            } else {
                outln!("{}", output::message_line(message, true));
            }
        }
        *last = page.next_after.max(*last);
        if !page.more {
            return Ok(());
        }
    }
}
