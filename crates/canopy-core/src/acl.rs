//! Access decisions: who may post to which channel.
//!
//! Pure functions over the facts the store read in the same transaction. Operators may post
//! anywhere; agents are held to the channel's post policy. Does not read anything itself.

use crate::error::Error;
use crate::model::{AccountKind, Channel, PostPolicy};
use crate::names::Handle;

/// The caller of an API request, resolved from its credential, never from an argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub handle: Handle,
    pub kind: AccountKind,
}

impl Caller {
    pub fn is_operator(&self) -> bool {
        self.kind == AccountKind::Operator
    }
}

/// Refuses `action` unless the caller is an operator.
pub fn require_operator(caller: &Caller, action: &str) -> Result<(), Error> {
    if caller.is_operator() {
        Ok(())
    } else {
        Err(Error::Forbidden {
            action: action.to_owned(),
            reason: format!("only operators may do this, and {} is an agent", caller.handle),
        })
    }
}

/// Whether `caller` may read a channel, given whether it is subscribed to it.
pub fn may_read(caller: &Caller, channel: &Channel, subscribed: bool) -> Result<(), Error> {
    if caller.is_operator() || subscribed {
        Ok(())
    } else {
        Err(Error::Forbidden {
            action: format!("read #{}", channel.name),
            reason: format!("{} is not subscribed to #{}", caller.handle, channel.name),
        })
    }
}

/// Whether `caller` may post in `channel`, given whether it is subscribed to it.
pub fn may_post(caller: &Caller, channel: &Channel, subscribed: bool) -> Result<(), Error> {
    if caller.is_operator() {
        return Ok(());
    }
    let refuse = |reason: String| Err(Error::Forbidden { action: format!("post to #{}", channel.name), reason });
    match channel.post_policy {
        PostPolicy::Open if subscribed => Ok(()),
        PostPolicy::Open => refuse(format!("{} is not subscribed to #{}", caller.handle, channel.name)),
        PostPolicy::OwnerOnly if channel.owner.as_ref() == Some(&caller.handle) => Ok(()),
        PostPolicy::OwnerOnly => refuse(format!(
            "only its owner{} may post there",
            channel.owner.as_ref().map(|o| format!(" ({o})")).unwrap_or_default()
        )),
        PostPolicy::Restricted if channel.posters.contains(&caller.handle) => Ok(()),
        PostPolicy::Restricted => refuse(format!(
            "posting is restricted to operators and {}",
            if channel.posters.is_empty() {
                "nobody else".to_owned()
            } else {
                channel.posters.iter().map(Handle::as_str).collect::<Vec<_>>().join(", ")
            }
        )),
    }
}

/// Whether `caller` may pin a message of `channel` to its board: a pin is said to everyone
/// who reads the channel, so it needs the right to read and to post there (an agent cannot
/// pin into `#announcements`, where only the Supervisor and operators speak).
pub fn may_pin(caller: &Caller, channel: &Channel, subscribed: bool) -> Result<(), Error> {
    may_read(caller, channel, subscribed)?;
    may_post(caller, channel, subscribed).map_err(|e| match e {
        Error::Forbidden { reason, .. } => Error::Forbidden { action: format!("pin to #{}", channel.name), reason },
        other => other,
    })
}

/// Whether `caller` may take a pin off a board: operators any, an agent only its own.
pub fn may_unpin(caller: &Caller, channel: &str, seq: crate::Seq, pinned_by_caller: bool) -> Result<(), Error> {
    if caller.is_operator() || pinned_by_caller {
        Ok(())
    } else {
        Err(Error::Forbidden {
            action: format!("unpin message {seq} in #{channel}"),
            reason: "an agent may unpin only what it pinned".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;
    use crate::model::{ChannelKind, SubscriptionPolicy};
    use crate::names::ChannelName;

    fn h(s: &str) -> Handle {
        Handle::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn channel(policy: PostPolicy) -> Channel {
        Channel {
            name: ChannelName::from_trusted("announcements".into()),
            kind: ChannelKind::Broadcast,
            post_policy: policy,
            subscription_policy: SubscriptionPolicy::Mandatory,
            owner: Some(h("supervisor")),
            posters: vec![h("supervisor")],
            subscribers: 0,
            last_seq: crate::Seq(0),
            created_at: String::new(),
            wake: crate::WakePolicy::Always,
        }
    }

    #[test]
    fn restricted_channels_admit_operators_and_posters_only() {
        let op = Caller { handle: h("root"), kind: AccountKind::Operator };
        let sup = Caller { handle: h("supervisor"), kind: AccountKind::Agent };
        let mgr = Caller { handle: h("ci-manager"), kind: AccountKind::Agent };
        let c = channel(PostPolicy::Restricted);
        assert!(may_post(&op, &c, false).is_ok());
        assert!(may_post(&sup, &c, true).is_ok());
        assert_eq!(may_post(&mgr, &c, true).map_err(|e| e.code()), Err(ErrorCode::Forbidden));
    }

    #[test]
    fn open_channels_need_a_subscription() {
        let mgr = Caller { handle: h("ci-manager"), kind: AccountKind::Agent };
        let c = channel(PostPolicy::Open);
        assert!(may_post(&mgr, &c, true).is_ok());
        assert!(may_post(&mgr, &c, false).is_err());
    }
}
