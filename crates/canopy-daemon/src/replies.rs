//! Reactions to a committed post, registered at start: the spawn gate's (`spawn: <handle>`
//! topics) and the merge gate's (`merge: ...` topics) read an operator's reply as a decision.
//! The post handler calls `Replies::react` after delivery and knows no topic or gate; each
//! handler says which posts it claims. Adding a reaction is one `register` call where the
//! daemon is composed (`api.rs`). Does not decide anything itself.

use std::sync::Arc;

use canopy_core::Message;
use canopy_core::acl::Caller;
use futures_util::future::BoxFuture;

/// A reaction to committed posts of some topics.
pub trait ReplyHandler: Send + Sync + 'static {
    /// The handler's name, for logs.
    fn name(&self) -> &'static str;
    /// Whether this post is one the handler reads (cheap: no store trip).
    fn claims(&self, message: &Message) -> bool;
    /// Reacts to a claimed post. Failures are the handler's to log: the post stands.
    fn react<'a>(&'a self, poster: &'a Caller, message: &'a Message) -> BoxFuture<'a, ()>;
}

/// The registered reactions, in registration order. Cheap to clone.
#[derive(Clone, Default)]
pub struct Replies {
    handlers: Vec<Arc<dyn ReplyHandler>>,
}

impl Replies {
    pub fn register(&mut self, handler: Arc<dyn ReplyHandler>) {
        self.handlers.push(handler);
    }

    /// Hands a committed post to every handler that claims it.
    pub async fn react(&self, poster: &Caller, message: &Message) {
        for handler in self.handlers.iter().filter(|h| h.claims(message)) {
            tracing::debug!(handler = handler.name(), seq = %message.seq, "a reply handler reads a post");
            handler.react(poster, message).await;
        }
    }
}
