//! The spawn gate (`Gate`): requests, decisions (by command or by an operator's reply in the
//! request's topic, `SpawnReplies`), cancellation, expiry, despawn and the audit log. Uses the
//! store, delivery, the role defaults, repos (a child's repository and checkout), budgets (the
//! tree changed) and the notifier.
//!
//! Only an operator's credential decides. An agent's attempt (the API, the tool, or posting
//! `approve` in the topic) is refused, audited, and told to the operators in the requester's
//! home channel; the refusal record commits even though the attempt fails. A reply decides
//! only in the request's own topic of its requester's home channel; an operator's reply that
//! reads as an answer but decides nothing is answered in its topic, never left unanswered.

use std::sync::Arc;
use std::time::Duration;

use canopy_config::Config;
use canopy_core::acl::Caller;
use canopy_core::gate::Reply;
use canopy_core::{Error, Handle, Message, RoleName, SpawnRequest};
use canopy_proto::api::*;
use canopy_store::{SpawnPolicy, SpawnSpec, Store, ops, parse_request_id};
use futures_util::future::BoxFuture;

use crate::budgets::Budgets;
use crate::delivery::Delivery;
use crate::edge::{MAX_CHARTER, idempotency_key};
use crate::notify::Notifier;
use crate::replies::ReplyHandler;
use crate::repos::Repos;
use crate::roles::RoleDefaults;

/// The spawn gate. Cheap to clone.
#[derive(Clone)]
pub struct Gate {
    store: Store,
    delivery: Delivery,
    roles: Arc<RoleDefaults>,
    repos: Repos,
    budgets: Budgets,
    notifier: Notifier,
    config: Arc<Config>,
}

/// The gate's reading of a reply in a `spawn: <handle>` topic.
pub struct SpawnReplies(pub Gate);

impl ReplyHandler for SpawnReplies {
    fn name(&self) -> &'static str {
        "spawn gate"
    }

    fn claims(&self, message: &Message) -> bool {
        message.topic.as_str().starts_with("spawn: ")
    }

    fn react<'a>(&'a self, poster: &'a Caller, message: &'a Message) -> BoxFuture<'a, ()> {
        Box::pin(self.0.reply_decision(poster, message))
    }
}

impl Gate {
    pub fn new(
        store: Store,
        delivery: Delivery,
        roles: Arc<RoleDefaults>,
        repos: Repos,
        budgets: Budgets,
        notifier: Notifier,
        config: Arc<Config>,
    ) -> Self {
        Gate { store, delivery, roles, repos, budgets, notifier, config }
    }

    fn policy(&self) -> SpawnPolicy {
        let p = &self.config.policy;
        SpawnPolicy {
            max_depth: p.max_depth,
            max_children: p.max_children,
            max_agents: p.max_agents,
            max_pending_per_requester: p.max_pending_requests,
            ttl_ms: p.request_ttl.as_millis() as i64,
        }
    }

    pub(crate) async fn spawn_request(&self, caller: Caller, req: SpawnRequestRequest) -> Result<SpawnRequest, Error> {
        let text = |field: &'static str, value: String, max: usize| {
            if value.trim().is_empty() {
                Err(Error::invalid(field, "must not be empty"))
            } else if value.len() > max {
                Err(Error::TooLarge { field, len: value.len(), max })
            } else {
                Ok(value)
            }
        };
        idempotency_key(req.idempotency_key.as_deref())?;
        let handle = Handle::parse(&req.handle).map_err(|e| Error::name("handle", e))?;
        handle.check_function_name("handle", &self.config.policy.forbidden_handle_words)?;
        let spec = SpawnSpec {
            handle,
            display_name: text("name", req.name, 128)?,
            role: RoleName::parse(&req.role).map_err(|e| Error::name("role", e))?,
            charter: text("charter", req.charter, MAX_CHARTER)?,
            reason: text("reason", req.reason, 4096)?,
            idempotency_key: req.idempotency_key,
            repo: self.repos.spawn_repo(&caller, req.repo).await?,
            budget: canopy_core::budget::Amount { usd: req.budget_usd, tokens: req.budget_tokens },
        };
        let policy = self.policy();
        let (request, notice) = self.store.write(move |conn| ops::request_spawn(conn, &caller, &spec, &policy)).await?;
        // A repeated idempotency key returns the stored request and posts nothing new.
        if notice.is_some() {
            self.notifier.spawn(&request, false);
        }
        self.delivery.deliver_notices(notice.into_iter().collect()).await;
        Ok(request)
    }

    pub(crate) async fn spawn_decide(&self, caller: Caller, req: SpawnDecideRequest) -> Result<SpawnRequest, Error> {
        let id = parse_request_id(&req.id)?;
        self.decide(caller, id, req.approve, req.reason).await
    }

    /// Decides a request; the child (on approval) gets its role's session defaults.
    async fn decide(
        &self,
        caller: Caller,
        id: i64,
        approve: bool,
        note: Option<String>,
    ) -> Result<SpawnRequest, Error> {
        let note = note.map(|n| canopy_core::redact::cut(n.trim(), 1000)).filter(|n| !n.is_empty());
        let roles = self.roles.clone();
        let decided = self
            .store
            .write(move |conn| {
                let role = ops::spawn_request(conn, id)?.role;
                let defaults = roles.for_role(role.as_str());
                ops::decide_spawn(conn, &caller, id, approve, note, (defaults.harness, defaults.script))
            })
            .await?;
        self.delivery.deliver_notices(decided.notices).await;
        self.repos.prepare_checkouts().await;
        self.budgets.tree_changed().await;
        self.delivery.poke_runners().await;
        match decided.refused {
            Some(error) => Err(error),
            None => Ok(decided.request),
        }
    }

    pub(crate) async fn spawn_cancel(&self, caller: Caller, req: SpawnCancelRequest) -> Result<SpawnRequest, Error> {
        let id = parse_request_id(&req.id)?;
        let (request, notice) = self.store.write(move |conn| ops::cancel_spawn(conn, &caller, id)).await?;
        self.delivery.deliver_notices(vec![notice]).await;
        Ok(request)
    }

    pub(crate) async fn spawn_list(&self, _: Caller, req: SpawnListRequest) -> Result<SpawnListResponse, Error> {
        let state = req.state;
        Ok(SpawnListResponse { requests: self.store.read(move |conn| ops::list_spawns(conn, state)).await? })
    }

    pub(crate) async fn agents_despawn(
        &self,
        caller: Caller,
        req: AgentsDespawnRequest,
    ) -> Result<AgentsDespawnResponse, Error> {
        let handle = Handle::parse(&req.handle).map_err(|e| Error::name("handle", e))?;
        let (despawned, notice) = self.store.write(move |conn| ops::despawn(conn, &caller, &handle)).await?;
        self.delivery.deliver_notices(notice.into_iter().collect()).await;
        self.delivery.poke_runners().await;
        Ok(AgentsDespawnResponse { despawned: despawned.into_iter().map(|h| h.to_string()).collect() })
    }

    pub(crate) async fn audit_list(
        &self,
        _operator: Caller,
        req: AuditListRequest,
    ) -> Result<AuditListResponse, Error> {
        let since = match req.since_secs {
            Some(secs) => self
                .store
                .clock()
                .now_ms()
                .saturating_sub(i64::try_from(Duration::from_secs(secs).as_millis()).unwrap_or(i64::MAX)),
            None => 0,
        };
        Ok(AuditListResponse { entries: self.store.read(move |conn| ops::audit_log(conn, since)).await? })
    }

    /// A post in a `spawn: <handle>` topic that reads as an answer (`canopy_core::gate`).
    /// It decides only in the request's own topic of its requester's home channel, and only
    /// an operator's does; an agent's is refused and audited. An operator's reply that does
    /// not decide is answered in the topic, saying why (see `ops::answer_reply`).
    async fn reply_decision(&self, caller: &Caller, message: &Message) {
        let Some(reply) = Reply::parse(&message.body) else { return };
        if reply == Reply::Unclear && !caller.is_operator() {
            return;
        }
        let (caller, channel, topic) = (caller.clone(), message.channel.clone(), message.topic.clone());
        let roles = self.roles.clone();
        let answered = self
            .store
            .write(move |conn| {
                let session = |role: &RoleName| {
                    let defaults = roles.for_role(role.as_str());
                    (defaults.harness, defaults.script)
                };
                ops::answer_reply(conn, &caller, &channel, &topic, &reply, &session)
            })
            .await;
        match answered {
            Ok(answered) => {
                self.delivery.deliver_notices(answered.notices).await;
                if answered.decided {
                    self.repos.prepare_checkouts().await;
                    self.budgets.tree_changed().await;
                    self.delivery.poke_runners().await;
                }
            }
            Err(e) => tracing::warn!(error = %e, seq = %message.seq, "answering a reply in a spawn topic failed"),
        }
    }

    /// Expires unanswered requests and tells their requesters.
    pub async fn check_requests(&self) {
        match self.store.write(ops::expire_spawns).await {
            Ok(notices) => self.delivery.deliver_notices(notices).await,
            Err(e) => tracing::warn!(error = %e, "expiring spawn requests failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use canopy_core::{Presence, SpawnState};

    use crate::testing::{Fixture, agent, req};

    async fn request_child(fx: &Fixture) -> canopy_core::SpawnRequest {
        let ask = req(json!({ "handle": "child", "name": "Child", "role": "manager",
            "charter": "the parser", "reason": "too much work" }));
        fx.api.gate.spawn_request(agent("m1"), ask).await.unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn an_agents_approve_is_refused_and_audited_and_an_operators_reply_decides() {
        let fx = Fixture::new().await;
        fx.manager("m1").await;
        let request = request_child(&fx).await;
        let topic = "spawn: child";
        let reply = |body: &str| req(json!({ "channel": "home-m1", "topic": topic, "body": body }));
        // The reply handlers are reached through the post, as a session's tool call reaches them.
        fx.api.messages.messages_post(agent("m1"), reply("approve")).await.unwrap_or_else(|e| panic!("{e}"));
        let pending =
            fx.api.gate.spawn_list(fx.operator.clone(), req(json!({}))).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(pending.requests[0].state, SpawnState::Pending, "an agent's approve decides nothing");
        assert!(fx.audited().await.iter().any(|a| a.contains("refused")), "{:?}", fx.audited().await);
        fx.api.messages.messages_post(fx.operator.clone(), reply("approve")).await.unwrap_or_else(|e| panic!("{e}"));
        let decided =
            fx.api.gate.spawn_list(fx.operator.clone(), req(json!({}))).await.unwrap_or_else(|e| panic!("{e}"));
        let decided = decided.requests.iter().find(|r| r.id == request.id).map(|r| r.state);
        assert!(matches!(decided, Some(SpawnState::Approved | SpawnState::Spawned)), "{decided:?}");
    }

    #[tokio::test]
    async fn despawning_outside_ones_subtree_is_refused_and_audited() {
        let fx = Fixture::new().await;
        fx.manager("m1").await;
        fx.manager("m2").await;
        let refused = fx.api.gate.agents_despawn(agent("m1"), req(json!({ "handle": "m2" }))).await;
        assert!(matches!(refused, Err(canopy_core::Error::Forbidden { .. })), "{refused:?}");
        let token = fx.token("m1").await;
        let answer = fx.call(&token, "agents.despawn", json!({ "handle": "m2" })).await;
        assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
        assert!(fx.audited().await.iter().any(|a| a == "agents.despawn.refused"), "{:?}", fx.audited().await);
        let roster = fx.api.agents.roster(fx.operator.clone(), req(json!({}))).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(roster.agents.iter().any(|a| a.handle.as_str() == "m2" && a.presence != Presence::Despawned));
    }
}
