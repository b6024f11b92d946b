//! The prompts area (`Prompts`): `prompts.render`, `prompts.skill`, `prompts.rule`, the
//! rendering a runner sync needs, what a session's harness is asked for, and the per-role
//! tool check every agent call passes.
//!
//! The rendering is `canopy_prompt`'s and the facts are `bundle`'s. Uses the store, the
//! bundle, the role defaults and `RunEnds` (a run whose session was lost is ended, not
//! started). Does not start or list runs (`runs`).

use canopy_core::acl::Caller;
use canopy_core::{AccountKind, Error, Handle, RoleName};
use canopy_prompt::Rendered;
use canopy_proto::Method;
use canopy_proto::api::*;
use canopy_store::{LiveSession, RunStatus, Store, ops};
use dashmap::DashMap;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use canopy_config::Config;
use canopy_prompt::Renderer;

use crate::bundle::{self as prompts, Bundles, Identity};
use crate::roles::RoleDefaults;
use crate::run_ends::RunEnds;

/// What a session's role allows, cached by handle (an account's role, and a run's definition and
/// Manager, never change).
#[derive(Debug, Clone)]
pub struct RoleOf {
    pub role: String,
    /// For a subagent run: its definition.
    pub definition: Option<String>,
    /// For a subagent run: its Manager (its activity shows under the Manager too).
    pub manager: Option<String>,
}

/// The prompts area. Cheap to clone.
#[derive(Clone)]
pub struct Prompts {
    store: Store,
    pub(crate) bundles: Arc<Bundles>,
    pub(crate) roles: Arc<RoleDefaults>,
    config: Arc<Config>,
    data_dir: PathBuf,
    ends: RunEnds,
    /// Agent handle -> role (and run definition), for the per-role tool check.
    role_cache: Arc<DashMap<String, RoleOf>>,
}

/// The harness (and script) a new session of `role` runs (see `Prompts::session_defaults`).
fn session_defaults(roles: &RoleDefaults, renderer: &Renderer, role: &str) -> crate::roles::SessionDefaults {
    if let Some(configured) = roles.configured(role) {
        return configured.clone();
    }
    match renderer.bundle().roles.get(role).map(|r| r.harness.as_str()) {
        Some(harness) if !harness.is_empty() && harness != "scripted" => {
            crate::roles::SessionDefaults { harness: harness.to_owned(), script: None }
        }
        _ => roles.for_role(role),
    }
}

/// A role's prompt with example identity facts: `prompts.render` with a role, and `canopy
/// prompt render --role` when no daemon runs (the bundle is local; `workspace` then holds
/// example facts).
pub fn render_role(
    config: &Config,
    data_dir: &Path,
    renderer: &Renderer,
    roles: &RoleDefaults,
    workspace: &canopy_core::Workspace,
    role: &str,
) -> Result<PromptsRenderResponse, Error> {
    let role = RoleName::parse(role).map_err(|e| Error::name("role", e))?;
    if !renderer.bundle().roles.contains_key(role.as_str()) {
        let known: Vec<&str> = renderer.bundle().roles.keys().map(String::as_str).collect();
        return Err(Error::invalid("role", format!("the bundle has no role {role} (roles: {})", known.join(", "))));
    }
    let harness = session_defaults(roles, renderer, role.as_str()).harness;
    let identity = Identity {
        handle: format!("example-{role}"),
        name: String::new(),
        role: role.to_string(),
        parent: (!role.is_supervisor()).then(|| "supervisor".to_owned()),
        home_channel: format!("home-example-{role}"),
        ..Identity::default()
    };
    let facts = prompts::facts(config, data_dir, workspace, &identity, &harness);
    let rendered = renderer
        .render(&facts, prompts::owns_default_prompt(&harness))
        .map_err(|e| Error::invalid("role", e.to_string()))?;
    Ok(response(rendered, harness, renderer.bundle().source.clone(), None))
}

fn response(
    rendered: Rendered,
    harness: String,
    bundle: String,
    session: Option<SessionPrompt>,
) -> PromptsRenderResponse {
    PromptsRenderResponse {
        text: rendered.text,
        hash: rendered.hash,
        role: rendered.role,
        mode: rendered.mode.as_str().to_owned(),
        delivery: rendered.delivery.as_str().to_owned(),
        definition: rendered.definition,
        sections: rendered.sections.iter().map(|s| (*s).to_owned()).collect(),
        tools: rendered.tools,
        harness,
        bundle,
        session,
    }
}

impl Prompts {
    pub fn new(
        store: Store,
        bundles: Arc<Bundles>,
        roles: Arc<RoleDefaults>,
        config: Arc<Config>,
        data_dir: PathBuf,
        ends: RunEnds,
    ) -> Self {
        Prompts { store, bundles, roles, config, data_dir, ends, role_cache: Arc::default() }
    }

    /// Refuses an agent's call to a tool method its role does not register. Operators pass;
    /// methods that are no tool keep their own checks (most are operator-only, and the
    /// spawn gate audits an agent's attempt to decide).
    pub(crate) async fn check_tool(&self, caller: &Caller, method: Method) -> Result<(), Error> {
        if caller.kind != AccountKind::Agent {
            return Ok(());
        }
        let Some(tool) = method.tool().map(|t| t.name) else { return Ok(()) };
        let tools = self.tools_of(caller).await?;
        let role = self.role_of(caller).await?;
        if tools.iter().any(|t| t == tool) {
            return Ok(());
        }
        let reason = format!("the tool {tool} is not registered for {} (role {})", caller.handle, role.role);
        Err(Error::Forbidden { action: tool.to_owned(), reason })
    }

    /// The native tools registered for an agent's sessions.
    pub(crate) async fn tools_of(&self, caller: &Caller) -> Result<Vec<String>, Error> {
        let role = self.role_of(caller).await?;
        prompts::allowed_tools(&self.bundles.current(), &role.role, role.definition.as_deref())
    }

    pub(crate) async fn role_of(&self, caller: &Caller) -> Result<RoleOf, Error> {
        self.role_of_handle(caller.handle.as_str()).await
    }

    async fn role_of_handle(&self, handle: &str) -> Result<RoleOf, Error> {
        if let Some(hit) = self.role_cache.get(handle) {
            return Ok(hit.clone());
        }
        let key = handle.to_owned();
        let role = self
            .store
            .read(move |conn| {
                let account = ops::account(conn, "caller", &key)?;
                let run = ops::run_of_account(conn, &key)?.map(|(run, _)| run);
                Ok(RoleOf {
                    role: account.role.map(|r| r.to_string()).unwrap_or_default(),
                    definition: run.as_ref().map(|r| r.definition.clone()),
                    manager: run.map(|r| r.manager.to_string()),
                })
            })
            .await?;
        self.role_cache.insert(handle.to_owned(), role.clone());
        Ok(role)
    }

    /// Renders the prompt of each session about to start; `None` for a run whose session
    /// was lost or whose definition no longer renders (it is reported failed instead of
    /// started).
    pub(crate) async fn render_sessions(&self, fresh: &[LiveSession]) -> Result<Vec<Option<Rendered>>, Error> {
        if fresh.is_empty() {
            return Ok(Vec::new());
        }
        let renderer = self.bundles.refreshed();
        let workspace = self
            .store
            .read(ops::workspace)
            .await?
            .ok_or_else(|| Error::Internal("the workspace row is missing".into()))?;
        let mut out = Vec::with_capacity(fresh.len());
        // Runs that will not start: (run id, why).
        let mut lost: Vec<(i64, String)> = Vec::new();
        for s in fresh {
            let identity = Identity {
                handle: s.agent.to_string(),
                name: s.display_name.clone(),
                role: s.role.to_string(),
                parent: s.parent.clone(),
                home_channel: s.home_channel.clone(),
                charter: s.charter.clone(),
                persona: s.persona.clone(),
            };
            let facts = prompts::facts(&self.config, &self.data_dir, &workspace, &identity, &s.harness);
            let owns = prompts::owns_default_prompt(&s.harness);
            let rendered = match &s.run {
                Some((id, _, _)) if s.incarnation.get() > 1 => {
                    let why = "Its session was lost (the runner stopped or the process died) before it reported.";
                    lost.push((*id, why.to_owned()));
                    None
                }
                Some((id, definition, _)) => match renderer.render_run(definition, &facts, owns) {
                    Ok(rendered) => Some(rendered),
                    Err(e) => {
                        lost.push((*id, format!("It could not start: {e}.")));
                        None
                    }
                },
                None => match renderer.render(&facts, owns) {
                    Ok(rendered) => Some(rendered),
                    Err(e) => {
                        tracing::error!(agent = %s.agent, role = %s.role, error = %e, "no prompt could be rendered");
                        None
                    }
                },
            };
            out.push(rendered);
        }
        let hashes: Vec<(String, canopy_core::Incarnation, String)> = fresh
            .iter()
            .zip(&out)
            .filter_map(|(s, r)| r.as_ref().map(|r| (s.agent.to_string(), s.incarnation, r.hash.clone())))
            .collect();
        self.store.write(move |conn| ops::record_prompt_hashes(conn, &hashes)).await?;
        for (id, why) in lost {
            self.ends.finish(id, RunStatus::Failed, why, None).await?;
        }
        Ok(out)
    }

    pub(crate) async fn prompts_render(
        &self,
        _operator: Caller,
        req: PromptsRenderRequest,
    ) -> Result<PromptsRenderResponse, Error> {
        let renderer = self.bundles.refreshed();
        let bundle = renderer.bundle().source.clone();
        let workspace = self
            .store
            .read(ops::workspace)
            .await?
            .ok_or_else(|| Error::Internal("the workspace row is missing".into()))?;
        match (req.agent, req.role) {
            (Some(agent), None) => {
                let handle = Handle::parse(&agent).map_err(|e| Error::name("agent", e))?;
                let (account, (persona, harness), session) = self
                    .store
                    .read(move |conn| {
                        Ok((
                            ops::account(conn, "agent", handle.as_str())?,
                            ops::prompt_inputs(conn, handle.as_str())?,
                            ops::prompt_hash(conn, handle.as_str())?,
                        ))
                    })
                    .await?;
                if account.kind != AccountKind::Agent {
                    return Err(Error::invalid(
                        "agent",
                        format!("{} is an operator; operators have no prompt", account.handle),
                    ));
                }
                let identity = Identity {
                    handle: account.handle.to_string(),
                    name: account.display_name,
                    role: account.role.map(|r| r.to_string()).unwrap_or_default(),
                    parent: account.parent.map(|p| p.to_string()),
                    home_channel: account.home_channel.map(|c| c.to_string()).unwrap_or_default(),
                    charter: account.charter,
                    persona,
                };
                let facts = prompts::facts(&self.config, &self.data_dir, &workspace, &identity, &harness);
                let rendered = renderer
                    .render(&facts, prompts::owns_default_prompt(&harness))
                    .map_err(|e| Error::invalid("agent", e.to_string()))?;
                let session = session.map(|(incarnation, hash)| SessionPrompt { incarnation, hash });
                Ok(response(rendered, harness, bundle, session))
            }
            (None, Some(role)) => render_role(&self.config, &self.data_dir, &renderer, &self.roles, &workspace, &role),
            _ => Err(Error::invalid("agent", "pass exactly one of agent or role")),
        }
    }

    /// `prompts.skill` and `prompts.rule`: a body the caller's prompt lists.
    pub(crate) async fn prompts_skill(
        &self,
        caller: Caller,
        req: PromptsReadRequest,
    ) -> Result<PromptsReadResponse, Error> {
        self.prompts_read(caller, req, true).await
    }

    pub(crate) async fn prompts_rule(
        &self,
        caller: Caller,
        req: PromptsReadRequest,
    ) -> Result<PromptsReadResponse, Error> {
        self.prompts_read(caller, req, false).await
    }

    pub(crate) async fn prompts_read(
        &self,
        caller: Caller,
        req: PromptsReadRequest,
        skill: bool,
    ) -> Result<PromptsReadResponse, Error> {
        let kind = if skill { "skill" } else { "rule" };
        canopy_prompt::bundle::check_name(&req.name).map_err(|m| Error::invalid("name", m))?;
        let renderer = self.bundles.current();
        let bundle = renderer.bundle();
        let (tools, role) = match caller.kind {
            AccountKind::Agent => {
                let role = self.role_of(&caller).await?;
                let tools = prompts::allowed_tools(&renderer, &role.role, role.definition.as_deref())?;
                (tools, bundle.role(&role.role).cloned())
            }
            _ => (renderer.catalog().to_vec(), None),
        };
        let listed = |name: &str| {
            role.as_ref().is_none_or(|r| r.skills.iter().any(|p| canopy_prompt::bundle::glob_match(p, name)))
        };
        let found = match skill {
            true => bundle.skills.get(&req.name).filter(|s| listed(&s.name)).map(|s| (s.description.clone(), &s.body)),
            false => bundle.rules.get(&req.name).map(|r| (r.description.clone(), &r.body)),
        };
        let Some((description, body)) = found else {
            let names: Vec<&str> = match skill {
                true => bundle.skills.keys().filter(|n| listed(n)).map(String::as_str).collect(),
                false => bundle.rules.keys().map(String::as_str).collect(),
            };
            return Err(Error::invalid(
                "name",
                format!("no {kind} {:?} is listed for you ({kind}s: {})", req.name, names.join(", ")),
            ));
        };
        Ok(PromptsReadResponse {
            name: req.name,
            description,
            body: canopy_prompt::render::apply_requires(&body.text, &tools).trim().to_owned(),
        })
    }

    /// The subagent definitions a session of `role` gets for its harness's own subagents:
    /// every bundle definition, when the role delegates natively.
    pub(crate) fn native_subagents(&self, role: &str) -> Vec<SubagentFile> {
        let renderer = self.bundles.current();
        let Some(found) = renderer.bundle().roles.get(role).filter(|r| r.delegates_natively()) else {
            return Vec::new();
        };
        let mut tools = renderer.tools_for(found, None);
        tools.push(canopy_prompt::render::NATIVE_TASK_TOOL.to_owned());
        renderer
            .native_definitions(&tools)
            .into_iter()
            .map(|(name, description, body)| SubagentFile { name, description, body })
            .collect()
    }

    /// The harness (and script) a new session of `role` runs: `[roles.<role>]` in
    /// `canopy.toml` when it lists the role; else the bundle role's `harness` when it names a
    /// real harness (which needs no script); else the `manager` defaults.
    pub(crate) fn session_defaults(&self, role: &str) -> crate::roles::SessionDefaults {
        session_defaults(&self.roles, &self.bundles.current(), role)
    }

    /// What the bundle asks of a session's harness: (model, built-in tools). The model is its
    /// run definition's `model`, else its role's (empty: the harness's configured default);
    /// the tools are its role's `harness_tools` (a run: its delta role's).
    pub(crate) fn harness_asks(&self, session: &LiveSession) -> (String, Vec<String>) {
        let renderer = self.bundles.current();
        let bundle = renderer.bundle();
        let definition = session.run.as_ref().and_then(|(_, d, _)| bundle.definitions.get(d));
        let role = match &session.run {
            Some((_, d, _)) => bundle.role_for_definition(d),
            None => bundle.role(session.role.as_str()),
        };
        let model =
            definition.and_then(|d| d.model.clone()).or_else(|| role.map(|r| r.model.clone())).unwrap_or_default();
        (model, role.map(|r| r.harness_tools.clone()).unwrap_or_default())
    }

    /// The Manager of a subagent run's account (`None` for any other account), from the
    /// same cache as the tool check: one store read per run, not per activity item.
    pub(crate) async fn manager_of_run(&self, handle: &str) -> Option<String> {
        if !handle.starts_with("run-") {
            return None;
        }
        self.role_of_handle(handle).await.ok()?.manager
    }
}

#[cfg(test)]
mod tests {
    use canopy_proto::Method;
    use serde_json::json;

    use crate::testing::{Fixture, agent, req};

    #[tokio::test]
    async fn a_run_calling_a_tool_its_role_lacks_is_refused_and_audited() {
        let fx = Fixture::new().await;
        let m1 = fx.manager("m1").await;
        let start = req(json!({ "definition": "implementer", "brief": "fix the parser; report the diff" }));
        let run = fx.api.runs.runs_start(m1.clone(), start).await.unwrap_or_else(|e| panic!("{e}"));
        let refused = fx.api.prompts.check_tool(&agent(&run.run.handle), Method::SpawnRequest).await;
        assert!(matches!(refused, Err(canopy_core::Error::Forbidden { .. })), "{refused:?}");
        // Through the dispatch, as the run's session calls it: refused and on record.
        let token = fx.token(&run.run.handle).await;
        let ask = json!({ "handle": "c", "name": "C", "role": "manager", "charter": "x", "reason": "y" });
        let answer = fx.call(&token, "spawn.request", ask).await;
        assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
        assert!(fx.audited().await.iter().any(|a| a == "spawn.request.refused"), "{:?}", fx.audited().await);
        // Its Manager's role registers every tool; an operator passes.
        assert!(fx.api.prompts.check_tool(&m1, Method::SpawnRequest).await.is_ok());
        assert!(fx.api.prompts.check_tool(&fx.operator, Method::SpawnRequest).await.is_ok());
    }

    #[tokio::test]
    async fn a_skill_not_listed_for_the_caller_is_refused_naming_the_ones_that_are() {
        let fx = Fixture::new().await;
        let m1 = fx.manager("m1").await;
        let refused = fx.api.prompts.prompts_skill(m1, req(json!({ "name": "no-such-skill" }))).await;
        match refused {
            Err(canopy_core::Error::InvalidArgument { field: "name", reason }) => assert!(reason.contains("skills:")),
            other => panic!("{other:?}"),
        }
    }
}
