//! The messages area (`Messages`): channels, subscriptions, direct channels, topics, the
//! board, and posting, reading and syncing messages. A post is committed, published, then
//! delivered (`Delivery`) and handed to the registered reply handlers (`Replies`: the gates'
//! readings of an operator's answer). Uses the store, delivery and the replies; knows no gate.

use canopy_core::acl::Caller;
use canopy_core::{ChannelKind, ChannelName, Error, Handle, PostPolicy, TopicName};
use canopy_proto::api::*;
use std::sync::Arc;

use canopy_config::Config;
use canopy_store::{ChannelSpec, PostSpec, Store, ops};

use crate::delivery::{Delivery, Post};
use crate::edge::{idempotency_key, page_limit};
use crate::replies::Replies;

/// The messages area. Cheap to clone.
#[derive(Clone)]
pub struct Messages {
    store: Store,
    delivery: Delivery,
    replies: Replies,
    config: Arc<Config>,
}

impl Messages {
    pub fn new(store: Store, delivery: Delivery, replies: Replies, config: Arc<Config>) -> Self {
        Messages { store, delivery, replies, config }
    }

    pub(crate) async fn channels_subscribe(
        &self,
        caller: Caller,
        req: ChannelRequest,
    ) -> Result<canopy_core::Channel, Error> {
        self.subscribe(caller, req, true).await
    }

    pub(crate) async fn channels_unsubscribe(
        &self,
        caller: Caller,
        req: ChannelRequest,
    ) -> Result<canopy_core::Channel, Error> {
        self.subscribe(caller, req, false).await
    }

    async fn subscribe(&self, caller: Caller, req: ChannelRequest, join: bool) -> Result<canopy_core::Channel, Error> {
        let channel = ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?;
        self.store
            .write(move |conn| {
                if join {
                    ops::subscribe_self(conn, &caller, &channel)
                } else {
                    ops::unsubscribe_self(conn, &caller, &channel)
                }
            })
            .await
    }

    pub(crate) async fn channels_open_direct(
        &self,
        caller: Caller,
        req: OpenDirectRequest,
    ) -> Result<canopy_core::Channel, Error> {
        let peer = Handle::parse(&req.peer).map_err(|e| Error::name("peer", e))?;
        self.store.write(move |conn| ops::open_direct(conn, &caller, &peer)).await
    }

    pub(crate) async fn topics_rename(&self, caller: Caller, req: TopicsRenameRequest) -> Result<Done, Error> {
        let channel = ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?;
        let from = TopicName::parse(&req.topic).map_err(|e| Error::name("topic", e))?;
        let to = TopicName::parse(&req.to).map_err(|e| Error::name("to", e))?;
        self.store.write(move |conn| ops::rename_topic(conn, &caller, &channel, &from, &to)).await?;
        Ok(Done {})
    }

    pub(crate) async fn topics_resolve(&self, caller: Caller, req: TopicsResolveRequest) -> Result<Done, Error> {
        let channel = ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?;
        let topic = TopicName::parse(&req.topic).map_err(|e| Error::name("topic", e))?;
        let resolved = req.resolved;
        self.store.write(move |conn| ops::resolve_topic(conn, &caller, &channel, &topic, resolved)).await?;
        Ok(Done {})
    }

    pub(crate) async fn board_pin(&self, caller: Caller, req: BoardPinRequest) -> Result<BoardResponse, Error> {
        let channel = ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?;
        let name = channel.to_string();
        let seq = req.seq;
        let pins = self.store.write(move |conn| ops::pin(conn, &caller, &channel, seq)).await?;
        Ok(BoardResponse { channel: name, pins })
    }

    pub(crate) async fn board_unpin(&self, caller: Caller, req: BoardPinRequest) -> Result<BoardResponse, Error> {
        let channel = ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?;
        let name = channel.to_string();
        let seq = req.seq;
        let pins = self.store.write(move |conn| ops::unpin(conn, &caller, &channel, seq)).await?;
        Ok(BoardResponse { channel: name, pins })
    }

    pub(crate) async fn board_list(&self, caller: Caller, req: BoardListRequest) -> Result<BoardResponse, Error> {
        let channel = ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?;
        let name = channel.to_string();
        let pins = self.store.read(move |conn| ops::board(conn, &caller, &channel)).await?;
        Ok(BoardResponse { channel: name, pins })
    }

    pub(crate) async fn channels_list(&self, _: Caller, _: ChannelsListRequest) -> Result<ChannelsListResponse, Error> {
        Ok(ChannelsListResponse { channels: self.store.read(ops::list_channels).await? })
    }

    pub(crate) async fn channels_create(
        &self,
        caller: Caller,
        req: ChannelsCreateRequest,
    ) -> Result<canopy_core::Channel, Error> {
        let kind = req.kind.unwrap_or(ChannelKind::General);
        let default_policy = if kind == ChannelKind::Broadcast { PostPolicy::Restricted } else { PostPolicy::Open };
        let posters = req
            .posters
            .iter()
            .map(|p| Handle::parse(p).map_err(|e| Error::name("posters", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let spec = ChannelSpec {
            name: ChannelName::parse_user(&req.name).map_err(|e| Error::name("name", e))?,
            kind,
            post_policy: req.post_policy.unwrap_or(default_policy),
            posters,
            wake: req.wake,
        };
        self.store.write(move |conn| ops::create_channel(conn, Some(&caller), &spec)).await
    }

    pub(crate) async fn topics_list(
        &self,
        caller: Caller,
        req: TopicsListRequest,
    ) -> Result<TopicsListResponse, Error> {
        let channel = ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?;
        let topics = self.store.read(move |conn| ops::list_topics(conn, &caller, channel.as_str())).await?;
        Ok(TopicsListResponse { topics })
    }

    pub(crate) async fn messages_post(&self, caller: Caller, req: PostRequest) -> Result<PostResponse, Error> {
        let max = self.config.limits.max_body_bytes;
        if req.body.trim().is_empty() {
            return Err(Error::invalid("body", "the message body is empty"));
        }
        if req.body.len() > max {
            return Err(Error::TooLarge { field: "body", len: req.body.len(), max });
        }
        idempotency_key(req.idempotency_key.as_deref())?;
        let spec = PostSpec {
            channel: ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?,
            topic: TopicName::parse(&req.topic).map_err(|e| Error::name("topic", e))?,
            body: req.body,
            create_topic: req.create_topic,
            idempotency_key: req.idempotency_key,
            ack_only: req.ack_only,
            wake: req.wake,
        };
        let ack_only = spec.ack_only;
        let poster = caller.clone();
        // A post the policy forbids is refused only once its audit record has committed.
        let (posted, reach) = self.store.write(move |conn| ops::post_and_reach(conn, &poster, &spec)).await?;
        let posted = posted?;
        let committed_us = canopy_sys::unix_us();
        // The message is committed; a lost event only delays followers, who resync.
        self.delivery.publish_messages(std::slice::from_ref(&posted.message)).await;
        // A duplicate reaches no one again (its job read no recipients).
        let Some(reach) = reach else {
            return Ok(PostResponse {
                message: posted.message,
                duplicate: true,
                outcomes: Vec::new(),
                counts: OutcomeCounts::default(),
                unknown_mentions: Vec::new(),
            });
        };
        let post = Post {
            sender: &caller,
            message: &posted.message,
            reach: &reach,
            ack_only,
            quiet: posted.quiet.as_deref(),
            committed_us,
        };
        let (outcomes, counts) = self.delivery.deliver(post).await;
        self.replies.react(&caller, &posted.message).await;
        Ok(PostResponse {
            unknown_mentions: reach.unknown_mentions,
            message: posted.message,
            duplicate: false,
            outcomes,
            counts,
        })
    }

    pub(crate) async fn messages_read(&self, caller: Caller, req: ReadRequest) -> Result<ReadResponse, Error> {
        let channel = ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?;
        let topic =
            req.topic.as_deref().map(|t| TopicName::parse(t).map_err(|e| Error::name("topic", e))).transpose()?;
        let limit = page_limit(req.limit)?;
        if req.unread && caller.is_operator() {
            return Err(Error::invalid("unread", "operators have no cursor; pass `after` instead"));
        }
        let (after, unread, newest) = (req.after, req.unread, req.newest);
        let name = channel.clone();
        let page = self
            .store
            .read(move |conn| {
                let after = match unread {
                    true => after.max(ops::cursor(conn, caller.handle.as_str(), &name)?),
                    false => after,
                };
                ops::read_channel(conn, &caller, &name, topic.as_ref(), after, limit, newest)
            })
            .await?;
        Ok(ReadResponse {
            channel: channel.to_string(),
            groups: group_by_topic(page.messages),
            next_after: page.next_after,
            more: page.more,
        })
    }

    pub(crate) async fn messages_sync(&self, caller: Caller, req: SyncRequest) -> Result<SyncResponse, Error> {
        let channel =
            req.channel.as_deref().map(|c| ChannelName::parse(c).map_err(|e| Error::name("channel", e))).transpose()?;
        let limit = page_limit(req.limit)?;
        let after = req.after;
        let page = self.store.read(move |conn| ops::sync(conn, &caller, channel.as_ref(), after, limit)).await?;
        Ok(SyncResponse { messages: page.messages, next_after: page.next_after, more: page.more })
    }
}

/// Groups a page by topic, in order of each topic's first message.
fn group_by_topic(messages: Vec<canopy_core::Message>) -> Vec<TopicGroup> {
    let mut groups: Vec<TopicGroup> = Vec::new();
    for message in messages {
        match groups.iter_mut().find(|g| g.topic == message.topic) {
            Some(group) => group.messages.push(message),
            None => groups.push(TopicGroup { topic: message.topic.clone(), messages: vec![message] }),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::testing::{Fixture, req};

    #[tokio::test]
    async fn a_post_is_committed_then_published_and_a_retry_reaches_no_one_again() {
        let fx = Fixture::new().await;
        fx.manager("m1").await;
        let post = || {
            req(json!({ "channel": "home-m1", "topic": "plan", "body": "start on the parser",
                "create_topic": true, "idempotency_key": "k1" }))
        };
        let first = fx.api.messages.messages_post(fx.operator.clone(), post()).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(!first.duplicate);
        let events = |fx: &Fixture| fx.sent().iter().filter(|s| s.ends_with(".evt.message.home-m1")).count();
        assert_eq!(events(&fx), 1);
        let again = fx.api.messages.messages_post(fx.operator.clone(), post()).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(again.duplicate && again.outcomes.is_empty());
        assert_eq!(again.message.seq, first.message.seq);
        let read = req(json!({ "channel": "home-m1" }));
        let page = fx.api.messages.messages_read(fx.operator.clone(), read).await.unwrap_or_else(|e| panic!("{e}"));
        let bodies: Vec<&str> = page.groups.iter().flat_map(|g| &g.messages).map(|m| m.body.as_str()).collect();
        assert!(bodies.contains(&"start on the parser"), "{bodies:?}");
    }

    #[tokio::test]
    async fn a_bad_post_is_refused_naming_its_field_and_commits_nothing() {
        let fx = Fixture::new().await;
        fx.manager("m1").await;
        let empty = req(json!({ "channel": "home-m1", "topic": "plan", "body": "  " }));
        let refused = fx.api.messages.messages_post(fx.operator.clone(), empty).await;
        assert!(matches!(refused, Err(canopy_core::Error::InvalidArgument { field: "body", .. })), "{refused:?}");
        let key = req(json!({ "channel": "home-m1", "topic": "plan", "body": "x", "idempotency_key": "has space" }));
        let refused = fx.api.messages.messages_post(fx.operator.clone(), key).await;
        assert!(matches!(refused, Err(canopy_core::Error::InvalidArgument { field: "idempotency_key", .. })));
        assert!(!fx.sent().iter().any(|s| s.contains(".evt.message.")), "{:?}", fx.sent());
    }
}
