//! API handlers for prompts and subagent runs: `prompts.render`, `prompts.skill`,
//! `prompts.rule`, `runs.start`, `runs.list`, `runs.finish`, plus the rendering a runner
//! sync needs and the per-role tool check every agent call passes.
//!
//! The rendering is `canopy_prompt`'s and the facts are `prompts.rs`'s; the store owns the
//! run records. This module only joins them and validates input.

use canopy_core::acl::Caller;
use canopy_core::{AccountKind, Error, Handle, RoleName};
use canopy_prompt::Rendered;
use canopy_proto::Method;
use canopy_proto::api::*;
use canopy_store::{LiveSession, RunSpec, RunStatus, ops, run_topic};

use std::path::Path;

use canopy_config::Config;
use canopy_prompt::Renderer;

use crate::context::{Api, RoleOf};
use crate::prompts::{self, Identity};
use crate::roles::RoleDefaults;

/// The harness's own subagents (omp's `task`) as runs, from their lifecycle activity
/// (newest first): started, then `done` or `failed` once ended.
fn native_runs(manager: &str, items: Vec<canopy_core::ActivityItem>, open_only: bool) -> Vec<RunInfo> {
    let mut runs: Vec<RunInfo> = Vec::new();
    // Oldest first, so an end finds its start.
    for item in items.into_iter().rev() {
        let id = item.detail.get("id").and_then(|v| v.as_str()).unwrap_or_default().to_owned();
        let payload = item.detail.get("detail").cloned().unwrap_or_default();
        let agent = payload.get("agent").and_then(|v| v.as_str()).unwrap_or("subagent").to_owned();
        match item.kind.as_str() {
            "subagent_started" => runs.push(RunInfo {
                id: 0,
                handle: format!("{manager}/{id}"),
                manager: manager.to_owned(),
                definition: agent,
                status: "running".into(),
                started_at: item.at,
                ended_at: None,
                branch: None,
                native: Some(id),
            }),
            _ => {
                let status = match payload.get("status").and_then(|v| v.as_str()) {
                    Some("completed") => "done",
                    _ => "failed",
                };
                if let Some(run) =
                    runs.iter_mut().rev().find(|r| r.native.as_deref() == Some(id.as_str()) && r.ended_at.is_none())
                {
                    run.status = status.into();
                    run.ended_at = Some(item.at);
                }
            }
        }
    }
    runs.retain(|r| !open_only || r.ended_at.is_none());
    runs.reverse();
    runs
}

fn run_info(run: canopy_store::Run) -> RunInfo {
    RunInfo {
        id: run.id,
        handle: run.handle.to_string(),
        manager: run.manager.to_string(),
        definition: run.definition,
        status: run.status.as_str().to_owned(),
        started_at: run.started_at,
        ended_at: run.ended_at,
        branch: None,
        native: None,
    }
}

/// The harness (and script) a new session of `role` runs (see `Api::session_defaults`).
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

impl Api {
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
        match tools.iter().any(|t| t == tool) {
            true => Ok(()),
            false => Err(Error::Forbidden {
                action: tool.to_owned(),
                reason: format!("the tool {tool} is not registered for {} (role {})", caller.handle, role.role),
            }),
        }
    }

    /// The native tools registered for an agent's sessions.
    pub(crate) async fn tools_of(&self, caller: &Caller) -> Result<Vec<String>, Error> {
        let role = self.role_of(caller).await?;
        prompts::allowed_tools(&self.prompts.current(), &role.role, role.definition.as_deref())
    }

    async fn role_of(&self, caller: &Caller) -> Result<RoleOf, Error> {
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
        let renderer = self.prompts.refreshed();
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
            self.finish_run(id, RunStatus::Failed, why).await?;
        }
        Ok(out)
    }

    pub(crate) async fn prompts_render(
        &self,
        _operator: Caller,
        req: PromptsRenderRequest,
    ) -> Result<PromptsRenderResponse, Error> {
        let renderer = self.prompts.refreshed();
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
        let renderer = self.prompts.current();
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

    pub(crate) async fn runs_start(&self, caller: Caller, req: RunsStartRequest) -> Result<RunsStartResponse, Error> {
        canopy_prompt::bundle::check_name(&req.definition).map_err(|m| Error::invalid("definition", m))?;
        let renderer = self.prompts.refreshed();
        let bundle = renderer.bundle();
        if !bundle.definitions.contains_key(&req.definition) {
            let known: Vec<&str> = bundle.definitions.keys().map(String::as_str).collect();
            return Err(Error::invalid(
                "definition",
                format!("no subagent definition {:?} (definitions: {})", req.definition, known.join(", ")),
            ));
        }
        let role = bundle
            .role_for_definition(&req.definition)
            .ok_or_else(|| Error::invalid("definition", format!("no delta role can run {:?}", req.definition)))?;
        if req.brief.trim().is_empty() {
            return Err(Error::invalid(
                "brief",
                "must not be empty: say what to do, what done means, and what to report",
            ));
        }
        let max = self.config.runs.max_brief_bytes;
        if req.brief.len() > max {
            return Err(Error::TooLarge { field: "brief", len: req.brief.len(), max });
        }
        self.require_budget(caller.handle.as_str(), "subagent run")?;
        let defaults = self.session_defaults(&role.id);
        let checkout = self.run_checkout(&caller, req.repo, req.base).await?;
        let has_checkout = checkout.is_some();
        let spec = RunSpec {
            definition: req.definition,
            brief: req.brief,
            role: RoleName::from_trusted(role.id.clone()),
            harness: defaults.harness,
            script: defaults.script,
            max_running: self.config.runs.max_per_manager,
            timeout_ms: self.config.runs.timeout.as_millis() as i64,
            checkout,
        };
        let home = format!("home-{}", caller.handle);
        let manager = caller.handle.to_string();
        let run = self.store.write(move |conn| ops::start_run(conn, &caller, &spec)).await?;
        if has_checkout {
            self.prepare_checkouts().await;
        }
        self.tree_changed().await;
        self.poke_runners().await;
        let report_topic = run_topic(run.id).to_string();
        let mut info = run_info(run);
        info.branch = has_checkout.then(|| canopy_core::workspace::run_branch(&manager, info.id));
        Ok(RunsStartResponse { run: info, report_channel: home, report_topic })
    }

    pub(crate) async fn runs_list(&self, _operator: Caller, req: RunsListRequest) -> Result<RunsListResponse, Error> {
        let Some(agent) = req.agent else {
            return Err(Error::invalid("agent", "name the agent whose runs to list"));
        };
        let agent = Handle::parse(&agent).map_err(|e| Error::name("agent", e))?.to_string();
        let open = req.open;
        let listed = agent.clone();
        let runs = self.store.read(move |conn| ops::list_runs(conn, &listed, open)).await?;
        let manager = agent.clone();
        let (checkouts, native) = self
            .store
            .read(move |conn| Ok((ops::run_checkouts(conn, &manager)?, ops::subagent_activity(conn, &manager, 400)?)))
            .await?;
        let runs = runs
            .into_iter()
            .map(|run| {
                let branch = checkouts
                    .iter()
                    .find(|c| c.run.as_ref().is_some_and(|(id, _)| *id == run.id))
                    .map(|c| c.branch.clone());
                RunInfo { branch, ..run_info(run) }
            })
            .collect();
        let mut runs: Vec<RunInfo> = runs;
        runs.extend(native_runs(&agent, native, open));
        Ok(RunsListResponse { runs })
    }

    pub(crate) async fn runs_finish(
        &self,
        runner: canopy_core::RunnerId,
        req: RunsFinishRequest,
    ) -> Result<RunsFinishResponse, Error> {
        let status = match req.status.as_str() {
            "done" => RunStatus::Done,
            "failed" => RunStatus::Failed,
            other => return Err(Error::invalid("status", format!("{other:?} is not one of: done, failed"))),
        };
        let (agent, incarnation) = (req.agent.clone(), req.incarnation);
        // Only the runner hosting the run's live session reports its end.
        let run = self
            .store
            .read(move |conn| {
                ops::live_agent(conn, &agent, incarnation, &runner)?;
                ops::run_of_account(conn, &agent)
            })
            .await?;
        let Some((run, _)) = run else {
            return Err(Error::invalid("agent", format!("{} is not a subagent run", req.agent)));
        };
        if run.status != RunStatus::Running {
            return Ok(RunsFinishResponse { recorded: false });
        }
        // The report gains the run's branch (and check) first, which can take as long as the
        // check: the end is recorded by a task, once, and a repeated report is accepted.
        if self.finishing.insert(run.id, ()).is_some() {
            return Ok(RunsFinishResponse { recorded: true });
        }
        let api = self.clone();
        tokio::spawn(async move {
            let report = api.run_report_with_branch(run.id, req.report).await;
            if let Err(e) = api.finish_run(run.id, status, report).await {
                tracing::warn!(run = run.id, error = %e, "recording a run's end failed");
            }
            api.finishing.remove(&run.id);
        });
        Ok(RunsFinishResponse { recorded: true })
    }

    /// Ends a run once and tells its Manager; false when it had already ended.
    pub(crate) async fn finish_run(&self, id: i64, status: RunStatus, report: String) -> Result<bool, Error> {
        // The report is a message body: keep it within the body limit.
        let report = canopy_core::redact::cut(&report, self.config.limits.max_body_bytes.saturating_sub(512) / 4);
        let done = self.store.write(move |conn| ops::finish_run(conn, id, status, &report)).await?;
        let Some((_, message)) = done else { return Ok(false) };
        self.deliver_notices(vec![message]).await;
        self.poke_runners().await;
        Ok(true)
    }

    /// The subagent definitions a session of `role` gets for its harness's own subagents:
    /// every bundle definition, when the role delegates natively.
    pub(crate) fn native_subagents(&self, role: &str) -> Vec<SubagentFile> {
        let renderer = self.prompts.current();
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
        session_defaults(&self.roles, &self.prompts.current(), role)
    }

    /// What the bundle asks of a session's harness: (model, built-in tools). The model is its
    /// run definition's `model`, else its role's (empty: the harness's configured default);
    /// the tools are its role's `harness_tools` (a run: its delta role's).
    pub(crate) fn harness_asks(&self, session: &LiveSession) -> (String, Vec<String>) {
        let renderer = self.prompts.current();
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

    /// Stops runs past their deadline (called from the daemon's periodic checks).
    pub async fn expire_runs(&self) -> Result<(), Error> {
        let ended = self.store.write(ops::expire_runs).await?;
        if !ended.is_empty() {
            self.deliver_notices(ended.into_iter().map(|(_, m)| m).collect()).await;
            self.poke_runners().await;
        }
        Ok(())
    }
}
