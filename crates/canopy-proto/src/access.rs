//! What each NATS login may publish and subscribe to: the daemon, the operators' clients, and
//! each runner, derived from the subject map and the method table.
//!
//! Below the API's tokens there is NATS itself: whoever may subscribe to `api.>` could answer
//! requests as if it were the daemon, and whoever may subscribe to a runner's subjects could
//! read its steers. So each party gets its own login, limited to what it does: only the daemon
//! serves the API and rings runners; a runner requests the runner methods and the tool methods
//! (its sessions' tool calls), hears its own subjects and the poke, and answers the daemon's
//! requests to it; an operator client requests any method and reads the events. Every party
//! takes its replies on its own inbox prefix, so no one reads another's replies. Does not
//! render a server configuration (`canopy_bus::server`) or hold a secret.

use canopy_core::RunnerId;

use crate::{Access, Method, Subjects};

/// Who a NATS login belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Party<'a> {
    Daemon,
    Operator,
    Runner(&'a RunnerId),
}

/// A login's permissions, in `nats-server`'s terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    /// Subjects it may publish to (requests included).
    pub publish: Vec<String>,
    /// Subjects it may subscribe to (queue groups included).
    pub subscribe: Vec<String>,
    /// Whether it may answer a request it received (once, to that request's reply subject).
    pub allow_responses: bool,
}

impl Subjects {
    /// The workspace id these subjects are for.
    fn workspace(&self) -> &str {
        self.prefix().strip_prefix("canopy.").unwrap_or(self.prefix())
    }

    /// The inbox prefix `party`'s client takes replies on: `_INBOX.<ws>.d` (the daemon),
    /// `_INBOX.<ws>.op` (operators), `_INBOX.<ws>.r.<id>` (a runner).
    pub fn inbox(&self, party: Party<'_>) -> String {
        let ws = self.workspace();
        match party {
            Party::Daemon => format!("_INBOX.{ws}.d"),
            Party::Operator => format!("_INBOX.{ws}.op"),
            Party::Runner(id) => format!("_INBOX.{ws}.r.{id}"),
        }
    }

    /// What `party`'s login may do.
    pub fn permissions(&self, party: Party<'_>) -> Permissions {
        let prefix = self.prefix();
        let inbox = format!("{}.>", self.inbox(party));
        match party {
            Party::Daemon => Permissions {
                publish: vec![format!("{prefix}.>"), format!("_INBOX.{}.>", self.workspace())],
                subscribe: vec![format!("{prefix}.>"), inbox],
                allow_responses: false,
            },
            Party::Operator => Permissions {
                publish: vec![self.api_wildcard()],
                subscribe: vec![format!("{prefix}.evt.>"), inbox],
                allow_responses: false,
            },
            Party::Runner(id) => Permissions {
                publish: Method::ALL
                    .iter()
                    // Its own methods, its sessions' tool calls, and `whoami`, with which the
                    // tool server asks which tools a session's role has.
                    .filter(|m| m.access() == Access::Runner || m.tool().is_some() || **m == Method::Whoami)
                    .map(|m| self.api(*m))
                    .collect(),
                subscribe: vec![self.runner_poke(), format!("{prefix}.runner.{id}.>"), inbox],
                allow_responses: true,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    fn covers(patterns: &[String], subject: &str) -> bool {
        patterns.iter().any(|p| {
            let (mut p, mut s) = (p.split('.'), subject.split('.'));
            loop {
                match (p.next(), s.next()) {
                    (Some(">"), Some(_)) => return true,
                    (Some("*"), Some(_)) => {}
                    (Some(a), Some(b)) if a == b => {}
                    (None, None) => return true,
                    _ => return false,
                }
            }
        })
    }

    #[test]
    fn only_the_daemon_serves_the_api_and_rings_runners() {
        let s = Subjects::new("ws-1");
        let (r1, r2) = (RunnerId::parse("r1").unwrap(), RunnerId::parse("r2").unwrap());
        let daemon = s.permissions(Party::Daemon);
        let operator = s.permissions(Party::Operator);
        let runner = s.permissions(Party::Runner(&r1));
        let api = s.api(Method::MessagesPost);
        assert!(covers(&daemon.subscribe, &api));
        assert!(!covers(&operator.subscribe, &api) && !covers(&runner.subscribe, &api));
        assert!(covers(&runner.publish, &api), "a runner forwards its sessions' tool calls");
        assert!(covers(&runner.publish, &s.api(Method::RunnersSync)));
        assert!(!covers(&runner.publish, &s.api(Method::AgentsCreate)), "not an operator method");
        assert!(covers(&operator.publish, &s.api(Method::AgentsCreate)));
        for party in [&operator, &runner] {
            assert!(!covers(&party.publish, &s.runner_deliver(&r1)), "only the daemon rings");
            assert!(!covers(&party.publish, &s.message_event("general")), "only the daemon publishes events");
        }
        assert!(covers(&runner.subscribe, &s.runner_steer(&r1)));
        assert!(!covers(&runner.subscribe, &s.runner_steer(&r2)), "another runner's steers");
        assert!(!covers(&runner.subscribe, &format!("{}.x", s.inbox(Party::Operator))));
        assert!(!covers(&operator.subscribe, &format!("{}.x", s.inbox(Party::Runner(&r1)))));
        assert!(runner.allow_responses && !operator.allow_responses);
        let other = Subjects::new("ws-2");
        assert!(!covers(&daemon.subscribe, &other.api(Method::MessagesPost)), "one workspace's daemon only");
    }
}
