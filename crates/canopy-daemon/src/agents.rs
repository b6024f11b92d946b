//! The agents area (`Agents`): `whoami`, creating, listing, showing and reparenting agents,
//! their activity lines, the roster and the tree, and `canopy watch`'s activity pages. Uses
//! the store, delivery, the prompts area (a role's tools and session defaults), repos (a new
//! agent's checkout) and budgets (the tree changed; the roster's marks). Does not decide spawn
//! requests (`gate`) or start and stop sessions (`sessions`).

use std::sync::Arc;

use canopy_config::Config;
use canopy_core::acl::Caller;
use canopy_core::{Error, Handle, Presence, RoleName, RosterEntry};
use canopy_proto::api::*;
use canopy_store::{AgentSpec, Store, ops};

use crate::budgets::Budgets;
use crate::delivery::Delivery;
use crate::edge::{MAX_CHARTER, bounded_text, display_name, page_limit};
use crate::prompts::Prompts;
use crate::repos::Repos;

/// The agents area. Cheap to clone.
#[derive(Clone)]
pub struct Agents {
    store: Store,
    delivery: Delivery,
    prompts: Prompts,
    repos: Repos,
    budgets: Budgets,
    config: Arc<Config>,
}

impl Agents {
    pub fn new(
        store: Store,
        delivery: Delivery,
        prompts: Prompts,
        repos: Repos,
        budgets: Budgets,
        config: Arc<Config>,
    ) -> Self {
        Agents { store, delivery, prompts, repos, budgets, config }
    }

    pub(crate) async fn agents_set_activity(
        &self,
        caller: Caller,
        req: SetActivityRequest,
    ) -> Result<RosterEntry, Error> {
        let text = bounded_text("text", req.text, 1000)?;
        self.store.write(move |conn| ops::set_activity(conn, &caller, &text)).await
    }

    /// Whether sessions run unconfined (`[sandbox] mode = "off"`), for every roster line.
    pub(crate) fn unconfined(&self) -> bool {
        self.config.sandbox.mode == canopy_config::config::SandboxModeConfig::Off
    }

    /// The roster, filtered, a page at a time: bounded for agents (a prompt-sized answer at
    /// any tree size), the whole of it for operators unless they ask for less.
    pub(crate) async fn roster(&self, caller: Caller, req: RosterRequest) -> Result<RosterResponse, Error> {
        let limit = match (req.limit, caller.is_operator()) {
            (Some(0), _) => return Err(Error::invalid("limit", "must be at least 1")),
            (Some(n), true) => n.min(MAX_OPERATOR_PAGE) as usize,
            (Some(n), false) => n.min(MAX_ROSTER_PAGE) as usize,
            (None, true) => MAX_OPERATOR_PAGE as usize,
            (None, false) => MAX_ROSTER_PAGE as usize,
        };
        if req.handles.len() > MAX_ROSTER_PAGE as usize {
            return Err(Error::invalid("handles", format!("at most {MAX_ROSTER_PAGE} per request")));
        }
        let handles = req
            .handles
            .iter()
            .map(|h| Handle::parse(h).map_err(|e| Error::name("handles", e)))
            .collect::<Result<std::collections::HashSet<Handle>, Error>>()?;
        let unconfined = self.unconfined();
        let host_network = self.config.sandbox.mode == canopy_config::config::SandboxModeConfig::Required
            && self.config.sandbox.network == canopy_config::config::NetworkConfig::Host;
        let holds = self.budgets.gate().snapshot();
        // Without a filter the store reads just this page; a filter reads every row after
        // `after` and pages here.
        let unfiltered = req.presence.is_none() && handles.is_empty();
        let after = req.after.clone();
        let (rows, beyond) =
            self.store.read(move |c| ops::roster(c, after.as_deref(), unfiltered.then_some(limit))).await?;
        let mut matched: Vec<RosterEntry> = rows
            .into_iter()
            .map(|mut a| {
                a.budget = holds.marks.get(a.handle.as_str()).cloned();
                // Held by a budget, an agent not in a turn waits for the operator or the renewal.
                if let Some(why) = holds.held.get(a.handle.as_str())
                    && !matches!(
                        a.presence,
                        Presence::Working | Presence::Stalled | Presence::Compacting | Presence::Despawned
                    )
                {
                    a.presence = Presence::PausedBudget;
                    a.reason = Some(why.clone());
                }
                a
            })
            .filter(|a| req.presence.is_none_or(|p| a.presence == p))
            .filter(|a| handles.is_empty() || handles.contains(&a.handle))
            .collect();
        let more = (matched.len().saturating_sub(limit) as u64 + beyond) as u32;
        matched.truncate(limit);
        matched.iter_mut().for_each(|a| (a.unconfined, a.host_network) = (unconfined, host_network));
        Ok(RosterResponse { agents: matched, more })
    }

    pub(crate) async fn activity_read(
        &self,
        _operator: Caller,
        req: ActivityReadRequest,
    ) -> Result<ActivityReadResponse, Error> {
        let agent = Handle::parse(&req.agent).map_err(|e| Error::name("agent", e))?;
        let limit = page_limit(req.limit)?;
        let tail = req.tail.map(|t| t.min(MAX_READ_LIMIT));
        let after = req.after;
        let (items, more) =
            self.store.read(move |conn| ops::read_activity(conn, agent.as_str(), after, limit, tail)).await?;
        let next_after = items.last().map_or(after, |i| i.id);
        Ok(ActivityReadResponse { items, next_after, more })
    }

    pub(crate) async fn whoami(&self, caller: Caller, _: WhoamiRequest) -> Result<WhoamiResponse, Error> {
        let tools = match caller.kind {
            canopy_core::AccountKind::Agent => self.prompts.tools_of(&caller).await?,
            _ => Vec::new(),
        };
        let (account, workspace, waiting_issues) = self
            .store
            .read(move |conn| {
                let account = ops::account(conn, "caller", caller.handle.as_str())?;
                let workspace = ops::workspace(conn)?.ok_or_else(|| Error::Internal("no workspace row".into()))?;
                // Issues blocked on the operator: every one for an operator, an agent's own.
                let owner = (!caller.is_operator()).then_some(&caller.handle);
                Ok((account, workspace, ops::waiting_issues(conn, owner)?))
            })
            .await?;
        let version = env!("CARGO_PKG_VERSION").to_owned();
        Ok(WhoamiResponse { account, workspace, version, tools, waiting_issues })
    }

    pub(crate) async fn agents_create(
        &self,
        caller: Caller,
        req: AgentsCreateRequest,
    ) -> Result<canopy_core::Account, Error> {
        let handle = Handle::parse(&req.handle).map_err(|e| Error::name("handle", e))?;
        handle.check_function_name("handle", &self.config.policy.forbidden_handle_words)?;
        let spec = AgentSpec {
            handle,
            display_name: display_name(&req.name)?,
            role: RoleName::parse(&req.role).map_err(|e| Error::name("role", e))?,
            parent: req
                .parent
                .as_deref()
                .map(|p| Handle::parse(p).map_err(|e| Error::name("parent", e)))
                .transpose()?,
            charter: bounded_text("charter", req.charter, MAX_CHARTER)?,
            harness: String::new(),
            script: None,
            persona: req
                .persona
                .map(|p| bounded_text("persona", p, MAX_CHARTER))
                .transpose()?
                .filter(|p| !p.trim().is_empty()),
            repo: None,
            needs: canopy_core::placement::check_labels("needs", &req.needs)?,
        };
        // A delta role is an implementer's: briefed per slice by a Manager, never standing.
        if self
            .prompts
            .bundles
            .current()
            .bundle()
            .roles
            .get(spec.role.as_str())
            .is_some_and(|r| r.mode == canopy_prompt::Mode::Delta)
        {
            return Err(Error::invalid(
                "role",
                format!(
                    "{} is a subagent role: a Manager briefs one per slice with agents_run_subagent; \
                     a standing agent takes a replace role such as manager",
                    spec.role
                ),
            ));
        }
        let defaults = self.prompts.session_defaults(spec.role.as_str());
        let harness = req.harness.unwrap_or(defaults.harness);
        let script = match req.script {
            Some(source) => Some((source.name, source.text)),
            None if harness == "scripted" => defaults.script,
            None => None,
        };
        let session = crate::roles::check(&harness, script, self.prompts.roles.check_script())?;
        let repo = match req.repo {
            Some(name) => Some(self.store.read(move |conn| ops::require_repo(conn, "repo", &name)).await?.id),
            None => None,
        };
        let spec = AgentSpec { harness: session.harness, script: session.script, repo, ..spec };
        let account = self.store.write(move |conn| ops::create_agent(conn, &caller, &spec)).await?;
        if repo.is_some() {
            // Made before the reply, so the operator hears of a checkout that failed.
            self.repos.prepare_checkouts().await;
        }
        self.budgets.tree_changed().await;
        self.delivery.poke_runners().await;
        Ok(account)
    }

    pub(crate) async fn agents_list(&self, _: Caller, req: AgentsListRequest) -> Result<AgentsListResponse, Error> {
        let limit = match req.limit {
            Some(0) => return Err(Error::invalid("limit", "must be at least 1")),
            limit => limit.unwrap_or(MAX_OPERATOR_PAGE).min(MAX_OPERATOR_PAGE) as usize,
        };
        let after = req.after;
        let (agents, more) = self.store.read(move |c| ops::list_agents(c, after.as_deref(), Some(limit))).await?;
        Ok(AgentsListResponse { agents, more: more as u32 })
    }

    pub(crate) async fn agents_show(&self, _: Caller, req: AgentsShowRequest) -> Result<AgentsShowResponse, Error> {
        let handle = Handle::parse(&req.handle).map_err(|e| Error::name("handle", e))?;
        self.store
            .read(move |conn| {
                Ok(AgentsShowResponse {
                    account: ops::account(conn, "handle", handle.as_str())?,
                    children: ops::children(conn, handle.as_str())?,
                    subscriptions: ops::subscriptions(conn, handle.as_str())?,
                })
            })
            .await
    }

    pub(crate) async fn agents_reparent(
        &self,
        caller: Caller,
        req: AgentsReparentRequest,
    ) -> Result<canopy_core::Account, Error> {
        let handle = Handle::parse(&req.handle).map_err(|e| Error::name("handle", e))?;
        let parent = Handle::parse(&req.parent).map_err(|e| Error::name("parent", e))?;
        let account = self.store.write(move |conn| ops::reparent(conn, &caller, &handle, &parent)).await?;
        self.budgets.tree_changed().await;
        Ok(account)
    }

    /// The whole tree for an operator; for an agent, the tree around it (`tree::around`).
    pub(crate) async fn tree(&self, caller: Caller, req: TreeRequest) -> Result<TreeResponse, Error> {
        let whole = self.store.read(ops::tree).await?;
        if caller.is_operator() {
            return Ok(TreeResponse { root: whole });
        }
        let depth = req.depth.unwrap_or(canopy_core::tree::DEFAULT_AROUND_DEPTH);
        let root = canopy_core::tree::around(&whole, &caller.handle, depth).ok_or_else(|| Error::AgentNotFound {
            field: "caller",
            handle: caller.handle.to_string(),
            nearest: None,
        })?;
        Ok(TreeResponse { root })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::testing::{Fixture, req};

    #[tokio::test]
    async fn a_created_manager_knows_itself_and_shows_in_the_roster_and_the_tree() {
        let fx = Fixture::new().await;
        let m1 = fx.manager("m1").await;
        let me = fx.api.agents.whoami(m1.clone(), req(json!({}))).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(me.account.handle.as_str(), "m1");
        assert!(me.tools.iter().any(|t| t == "comms_post_message"), "{:?}", me.tools);
        let roster = fx.api.agents.roster(fx.operator.clone(), req(json!({}))).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(roster.agents.iter().any(|a| a.handle.as_str() == "m1"));
        let tree = fx.api.agents.tree(m1, req(json!({}))).await.unwrap_or_else(|e| panic!("{e}"));
        let drawn = serde_json::to_string(&tree.root).unwrap_or_default();
        assert!(drawn.contains("\"m1\"") && drawn.contains("supervisor"), "{drawn}");
        assert!(fx.sent().iter().any(|s| s.ends_with(".runner.poke")), "a new agent pokes the runners");
    }

    #[tokio::test]
    async fn a_subagent_role_is_refused_as_a_standing_agent_and_nothing_is_made() {
        let fx = Fixture::new().await;
        let create = req(json!({ "handle": "impl1", "name": "impl1", "role": "implementer" }));
        let refused = fx.api.agents.agents_create(fx.operator.clone(), create).await;
        assert!(matches!(refused, Err(canopy_core::Error::InvalidArgument { field: "role", .. })), "{refused:?}");
        let roster = fx.api.agents.roster(fx.operator.clone(), req(json!({}))).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(!roster.agents.iter().any(|a| a.handle.as_str() == "impl1"));
    }
}
