//! The spawn gate's decisions, pure: whether a request may be made (the policy limits, with
//! their actionable messages), who may decide one, which state a decision leaves it in, who
//! may despawn an agent (an operator or a strict ancestor), and every sentence Canopy says
//! about a request in its topic.
//!
//! The store gathers the facts (depth, counts, the request as it stands) inside its
//! transaction, asks here, and persists the answer; it holds no rule and no human text of
//! its own for the gate. Does no IO and reads no clock.

use crate::acl::Caller;
use crate::{Error, SpawnRequest, SpawnState};

/// The limits `[policy]` puts on spawning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpawnLimits {
    pub max_depth: u32,
    pub max_children: u32,
    pub max_agents: u32,
    pub max_pending_per_requester: u32,
}

/// What the store counted for a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpawnFacts {
    /// The requester's depth in the tree (the Supervisor is 1).
    pub requester_depth: u32,
    /// The requester's live children plus its pending requests.
    pub children: u32,
    /// Live agents in the workspace (not runs).
    pub live_agents: u32,
    /// The requester's pending requests.
    pub pending: u32,
}

/// Checks a new request against the limits; the refusal names the limit and what to do.
pub fn check_limits(requester: &str, facts: &SpawnFacts, limits: &SpawnLimits) -> Result<(), Error> {
    let limit = |what: String, advice: &str| Err(Error::LimitExceeded(format!("{what}; {advice}")));
    let depth = facts.requester_depth + 1;
    if depth > limits.max_depth {
        return limit(
            format!(
                "limit policy.max_depth: the child would sit at depth {depth} and the maximum is {}",
                limits.max_depth
            ),
            "ask a Manager higher in the tree to take the lane, or ask the operator to raise the limit",
        );
    }
    if facts.children >= limits.max_children {
        return limit(
            format!(
                "limit policy.max_children: {requester} already has {} children or pending requests (maximum {})",
                facts.children, limits.max_children
            ),
            "despawn a child you no longer need, or ask the operator to raise the limit",
        );
    }
    if facts.live_agents >= limits.max_agents {
        return limit(
            format!(
                "limit policy.max_agents: the workspace has {} live agents (maximum {})",
                facts.live_agents, limits.max_agents
            ),
            "ask the operator to despawn idle agents or raise the limit",
        );
    }
    if facts.pending >= limits.max_pending_per_requester {
        return limit(
            format!(
                "limit policy.max_pending_requests: {requester} has {} requests waiting (maximum {})",
                facts.pending, limits.max_pending_per_requester
            ),
            "wait for the operator to answer, or cancel one",
        );
    }
    Ok(())
}

/// An operator's answer to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Approve,
    Deny,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Approve => "approve",
            Verb::Deny => "deny",
        }
    }
}

/// Who may decide: only an operator. An agent's attempt is refused with this error, after
/// the store has audited it and told the operators (`attempt_notice`).
pub fn may_decide(caller: &Caller, verb: Verb, request_id: &str) -> Result<(), Error> {
    match caller.is_operator() {
        true => Ok(()),
        false => Err(Error::Forbidden {
            action: format!("{} {request_id}", verb.as_str()),
            reason: "only an operator can decide a spawn request".into(),
        }),
    }
}

/// Only a pending request can be decided; another state is a conflict naming it.
pub fn check_pending(request: &SpawnRequest) -> Result<(), Error> {
    match request.state {
        SpawnState::Pending => Ok(()),
        state => Err(Error::ConflictOn {
            field: "id",
            reason: format!("{} is {state}, not pending; nothing changed", request.id),
        }),
    }
}

/// What the store read about an agent someone asks to despawn.
#[derive(Debug, Clone, Copy)]
pub struct DespawnTarget<'a> {
    pub handle: &'a str,
    pub is_agent: bool,
    pub is_supervisor: bool,
    pub despawned: bool,
    /// Its ancestors' handles, from its parent up to the root.
    pub ancestors: &'a [String],
}

/// Who may despawn what: an agent (never the Supervisor, never twice), by an operator or by
/// a strict ancestor of it (never a peer, never the agent itself).
pub fn may_despawn(caller: &Caller, target: &DespawnTarget<'_>) -> Result<(), Error> {
    let handle = target.handle;
    if !target.is_agent {
        return Err(Error::invalid("handle", format!("{handle} is not an agent")));
    }
    if target.is_supervisor {
        return Err(Error::Forbidden {
            action: format!("despawn {handle}"),
            reason: "the Supervisor is the root of the tree".into(),
        });
    }
    if target.despawned {
        return Err(Error::ConflictOn { field: "handle", reason: format!("{handle} is already despawned") });
    }
    if !caller.is_operator() && !target.ancestors.iter().any(|a| a == caller.handle.as_str()) {
        return Err(Error::Forbidden {
            action: format!("despawn {handle}"),
            reason: format!("{} may despawn only its own descendants", caller.handle),
        });
    }
    Ok(())
}

/// The sentences Canopy posts in a request's topic.
pub mod say {
    use super::*;

    /// The request itself, for the operators (`mentions` are `@operator` handles).
    pub fn requested(mentions: &[String], requester: &str, request: &SpawnRequest) -> String {
        format!(
            "{mentions} {requester} asks to spawn a child {role}: @{handle} ({name}). Request {id}, expires {expires}.\n\
             Charter: {charter}\nReason: {reason}\n{repo}{budget}\
             To answer: `canopy approve {id}` or `canopy deny {id} --reason TEXT`, or reply `approve` or `deny <reason>` in this topic.",
            mentions = mentions.iter().map(|o| format!("@{o}")).collect::<Vec<_>>().join(" "),
            role = request.role,
            handle = request.handle,
            name = request.display_name,
            id = request.id,
            expires = request.expires_at,
            charter = request.charter,
            reason = request.reason,
            repo = match &request.repo {
                Some(repo) => format!("Repository: {repo} (its own checkout, on branch canopy/{})\n", request.handle),
                None => String::new(),
            },
            budget = match request.budget {
                Some(b) => format!(
                    "Budget for its subtree: {}, carved from the one above {requester}\n",
                    crate::budget::say::amount(b)
                ),
                None => String::new(),
            },
        )
    }

    /// An agent tried to decide.
    pub fn attempt(agent: &str, verb: Verb, request: &SpawnRequest) -> String {
        format!(
            "@{agent} tried to {} {} ({}). Only an operator can decide a spawn request; nothing changed.",
            verb.as_str(),
            request.id,
            request.handle
        )
    }

    pub fn spawned(operator: &str, request: &SpawnRequest) -> String {
        format!(
            "Approved by {operator}: @{} ({}) is spawned as your report and starts with its charter. Request {}.",
            request.handle, request.display_name, request.id
        )
    }

    pub fn spawn_failed(operator: &str, request: &SpawnRequest, error: &str) -> String {
        format!("Approved by {operator}, but spawning @{} failed: {error}. Request {}.", request.handle, request.id)
    }

    pub fn denied(operator: &str, request: &SpawnRequest, why: Option<&str>) -> String {
        let why = why.unwrap_or("no reason given");
        format!("Denied by {operator}: {why}. Request {} for @{}.", request.id, request.handle)
    }

    pub fn expired(request: &SpawnRequest) -> String {
        format!("Request {} for @{} expired without an answer.", request.id, request.handle)
    }

    pub fn cancelled(request: &SpawnRequest) -> String {
        format!("Request {} was cancelled by its requester.", request.id)
    }

    /// A decision on a request that is no longer pending.
    pub fn already_decided(request: &SpawnRequest) -> String {
        format!("Nothing changed: {}. Only a pending request can be decided.", describe(request))
    }

    /// A reply that reads as an answer but is not one.
    pub fn unclear(request: &SpawnRequest) -> String {
        format!(
            "Nothing was decided: Canopy did not read that as an answer to {id}. To decide it, reply exactly \
             `approve` or `deny <reason>` in this topic, or run `canopy approve {id}` or \
             `canopy deny {id} --reason TEXT`.",
            id = request.id
        )
    }

    /// A reply in a `spawn: <handle>` topic of another channel, when no request asks for it.
    pub fn no_such_request(handle: &str) -> String {
        format!(
            "Nothing was decided: there is no spawn request for @{handle}, and a reply decides a request only \
             in its requester's home channel, in the request's own topic."
        )
    }

    /// A reply in `channel`, away from the request's topic in the requester's `home`.
    pub fn misplaced(request: &SpawnRequest, home: &str, channel: &str) -> String {
        format!(
            "Nothing was decided: this is not the topic of {id}. A reply decides a request only in its requester's \
             home channel, in the request's own topic: {id} ({state}, asked by {requester}) is in #{home}, topic \
             `spawn: {handle}`, and #{channel} is not. Reply `approve` or `deny <reason>` there, or run \
             `canopy approve {id}` or `canopy deny {id} --reason TEXT`.",
            id = request.id,
            state = request.state,
            requester = request.requester,
            handle = request.handle,
        )
    }

    /// A request's state in a sentence, for answering a decision that came too late.
    pub fn describe(request: &SpawnRequest) -> String {
        let by = request.decided_by.as_ref().map(|h| format!(" by {h}")).unwrap_or_default();
        let at = request.decided_at.as_ref().map(|t| format!(" at {t}")).unwrap_or_default();
        let note = request.note.as_ref().map(|n| format!(" ({n})")).unwrap_or_default();
        let state = match request.state {
            SpawnState::Spawned => format!("approved{by}{at} and spawned"),
            SpawnState::Failed => format!("approved{by}{at}, but the spawn failed{note}"),
            SpawnState::Denied => format!("denied{by}{at}{note}"),
            SpawnState::Expired => format!("expired{at} without an answer"),
            SpawnState::Cancelled => format!("cancelled by its requester{at}"),
            SpawnState::Approved | SpawnState::Pending => format!("{}{by}{at}", request.state),
        };
        format!("{} for @{} is already {state}", request.id, request.handle)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;
    use crate::{AccountKind, Handle, RoleName};

    const LIMITS: SpawnLimits =
        SpawnLimits { max_depth: 3, max_children: 2, max_agents: 10, max_pending_per_requester: 1 };

    fn facts() -> SpawnFacts {
        SpawnFacts { requester_depth: 2, children: 0, live_agents: 3, pending: 0 }
    }

    fn request(state: SpawnState) -> SpawnRequest {
        SpawnRequest {
            id: "req-7".into(),
            requester: Handle::from_trusted("ci".into()),
            handle: Handle::from_trusted("flaky".into()),
            display_name: "Flaky".into(),
            role: RoleName::from_trusted("manager".into()),
            charter: "c".into(),
            reason: "r".into(),
            repo: None,
            budget: None,
            state,
            decided_by: Some(Handle::from_trusted("ops".into())),
            note: Some("not now".into()),
            created_at: "t0".into(),
            decided_at: Some("t1".into()),
            expires_at: "t2".into(),
        }
    }

    #[test]
    fn each_limit_refuses_naming_itself_and_what_to_do() {
        assert_eq!(check_limits("ci", &facts(), &LIMITS), Ok(()));
        let refused = |f: SpawnFacts| check_limits("ci", &f, &LIMITS).unwrap_err().to_string();
        assert!(refused(SpawnFacts { requester_depth: 3, ..facts() }).contains("policy.max_depth"));
        assert!(refused(SpawnFacts { children: 2, ..facts() }).contains("policy.max_children: ci already has 2"));
        assert!(refused(SpawnFacts { live_agents: 10, ..facts() }).contains("despawn idle agents"));
        assert!(refused(SpawnFacts { pending: 1, ..facts() }).contains("policy.max_pending_requests"));
    }

    #[test]
    fn only_operators_decide_and_only_pending_requests() {
        let agent = Caller { handle: Handle::from_trusted("ci".into()), kind: AccountKind::Agent };
        let operator = Caller { handle: Handle::from_trusted("ops".into()), kind: AccountKind::Operator };
        assert!(matches!(may_decide(&agent, Verb::Approve, "req-7"), Err(Error::Forbidden { .. })));
        assert_eq!(may_decide(&operator, Verb::Deny, "req-7"), Ok(()));
        assert_eq!(check_pending(&request(SpawnState::Pending)), Ok(()));
        let late = check_pending(&request(SpawnState::Denied)).unwrap_err();
        assert_eq!(late.field(), Some("id"));
        assert!(late.to_string().contains("req-7 is denied, not pending"), "{late}");
    }

    #[test]
    fn only_ancestors_and_operators_despawn_and_never_the_supervisor() {
        let agent = |h: &str| Caller { handle: Handle::from_trusted(h.into()), kind: AccountKind::Agent };
        let operator = Caller { handle: Handle::from_trusted("ops".into()), kind: AccountKind::Operator };
        let ancestors = ["lead".to_owned(), "supervisor".to_owned()];
        let target = DespawnTarget {
            handle: "flaky",
            is_agent: true,
            is_supervisor: false,
            despawned: false,
            ancestors: &ancestors,
        };
        assert_eq!(may_despawn(&agent("lead"), &target), Ok(()));
        assert_eq!(may_despawn(&operator, &target), Ok(()));
        assert!(matches!(may_despawn(&agent("peer"), &target), Err(Error::Forbidden { .. })));
        assert!(matches!(may_despawn(&agent("flaky"), &target), Err(Error::Forbidden { .. })), "not itself");
        let root = DespawnTarget { is_supervisor: true, ..target };
        assert!(matches!(may_despawn(&operator, &root), Err(Error::Forbidden { .. })));
        let gone = DespawnTarget { despawned: true, ..target };
        assert_eq!(may_despawn(&operator, &gone).unwrap_err().field(), Some("handle"));
        let human = DespawnTarget { is_agent: false, ..target };
        assert_eq!(may_despawn(&operator, &human).unwrap_err().field(), Some("handle"));
    }

    #[test]
    fn a_late_decision_is_told_the_state_it_found() {
        let denied = say::already_decided(&request(SpawnState::Denied));
        assert!(denied.contains("req-7 for @flaky is already denied by ops at t1 (not now)"), "{denied}");
        let spawned = say::describe(&request(SpawnState::Spawned));
        assert!(spawned.ends_with("approved by ops at t1 and spawned"), "{spawned}");
        assert!(say::misplaced(&request(SpawnState::Pending), "home-ci", "home-other").contains("#home-ci"));
        assert!(say::denied("ops", &request(SpawnState::Pending), None).contains("no reason given"));
    }
}
