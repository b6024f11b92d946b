//! The runs area (`Runs`): subagent runs, `runs.start`, `runs.list` (with the harness's own
//! native subagents, read from their activity) and `runs.finish` (the runner's report, gaining
//! the run's branch and check before it is recorded, once).
//!
//! Uses the store, delivery, the prompts area (definitions, session defaults), budgets (a
//! spent budget starts no run), repos (a run's checkout and its branch in the report) and
//! `RunEnds`, and issues (a run linked to an issue is announced on its event subject). Does not
//! merge or discard a run's branch (`repos`).

use std::sync::Arc;

use canopy_config::Config;
use canopy_core::acl::Caller;
use canopy_core::{Error, Handle, RoleName};
use canopy_proto::api::*;
use canopy_store::{RunSpec, RunStatus, Store, ops, run_topic};
use dashmap::DashMap;

use crate::budgets::Budgets;
use crate::checks::{Checks, Subject};
use crate::delivery::Delivery;
use crate::issues::Issues;
use crate::prompts::Prompts;
use crate::repos::Repos;
use crate::run_ends::RunEnds;

/// The runs area. Cheap to clone.
#[derive(Clone)]
pub struct Runs {
    store: Store,
    delivery: Delivery,
    prompts: Prompts,
    budgets: Budgets,
    repos: Repos,
    checks: Checks,
    ends: RunEnds,
    issues: Issues,
    config: Arc<Config>,
    /// Runs whose end is being summarised (their checkout read, their check run).
    finishing: Arc<DashMap<i64, ()>>,
}

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
                issue: None,
                scripted: false,
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
        issue: run.issue,
        scripted: run.stand_in,
    }
}

impl Runs {
    /// One argument per service the area names (`Api::build` composes them).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Store,
        delivery: Delivery,
        prompts: Prompts,
        budgets: Budgets,
        repos: Repos,
        checks: Checks,
        ends: RunEnds,
        issues: Issues,
        config: Arc<Config>,
    ) -> Self {
        Runs { store, delivery, prompts, budgets, repos, checks, ends, issues, config, finishing: Arc::default() }
    }

    /// A finished run's report with its branch, commits, diffstat, tree and checks appended
    /// (every named check run on its final tree), and the checks' summary for the report's
    /// headline (none without a checkout).
    async fn report_with_branch(&self, run: i64, report: String) -> (String, Option<String>) {
        let Some((checkout, dir, summary)) = self.repos.run_tree(run).await else { return (report, None) };
        let summary = match summary {
            Ok(summary) => summary,
            Err(e) => {
                let report = format!("{report}\n\n---\nbranch: {} (its state could not be read: {e})", checkout.branch);
                return (report, None);
            }
        };
        let subject = Subject { trigger: canopy_core::checks::CheckTrigger::Run, name: checkout.branch.clone() };
        // A run on another runner's disk is checked on what it pushed, in a scratch checkout.
        let checks = match &dir {
            Some(dir) => self.checks.run_in(&checkout.repo, dir, &summary.head, &subject).await,
            None => self.checks.run_on_commit(&checkout.repo, &summary.head, &subject).await.unwrap_or_else(|e| {
                tracing::warn!(run, error = %e, "checking a run's pushed tree failed");
                Vec::new()
            }),
        };
        let line = (!checkout.repo.checks.is_empty()).then(|| canopy_core::checks::summary(&checks));
        let mut section = canopy_core::repos::run_branch_section(
            &checkout.branch,
            &checkout.base_commit,
            &summary.commits,
            &summary.diffstat,
            &summary.dirty,
            line.as_deref(),
        );
        if let Some((failed, tail)) = self.checks.failure(&checks).await
            && !tail.is_empty()
        {
            let tail = canopy_core::redact::cut(&tail, 3000);
            section.push_str(&format!("{} output (last lines; checks_status has the rest):\n{tail}\n", failed.name));
        }
        (format!("{report}{section}"), line)
    }

    /// Ends runs whose runner was lost mid-run: `failed (runner lost)`, with what each had
    /// pushed of its branch (its checkout went with the runner).
    pub async fn runner_lost(&self, runs: Vec<i64>) {
        for run in runs {
            if self.finishing.insert(run, ()).is_some() {
                continue;
            }
            let report = "failed (runner lost): its runner stopped answering mid-run. Its branch as last pushed is \
                          below; brief a new run to carry on from it."
                .to_owned();
            let (report, check) = self.report_with_branch(run, report).await;
            if let Err(e) = self.ends.finish(run, RunStatus::Failed, report, check).await {
                tracing::warn!(run, error = %e, "recording a lost run's end failed");
            }
            self.finishing.remove(&run);
        }
    }

    /// Stops runs past their deadline (the daemon's periodic checks).
    pub async fn expire(&self) -> Result<(), Error> {
        self.ends.expire().await
    }

    /// The harness (and script) a run of `role` started by `caller` gets: its role's, or with
    /// `harness = "manager"` its Manager's (the role's script when the Manager is scripted).
    async fn run_harness(&self, caller: &Caller, role: &str) -> Result<(String, Option<(String, String)>), Error> {
        let defaults = self.prompts.session_defaults(role);
        if defaults.harness != crate::roles::FOLLOW_MANAGER {
            return Ok((defaults.harness, defaults.script));
        }
        if caller.is_operator() {
            // Operators start no runs: the store refuses it, as for any other role.
            return Ok(("scripted".to_owned(), defaults.script));
        }
        let handle = caller.handle.to_string();
        let manager = self.store.read(move |conn| ops::roster_entry(conn, &handle)).await?;
        match manager.harness.as_str() {
            "scripted" | "" => Ok(("scripted".to_owned(), defaults.script)),
            real => Ok((real.to_owned(), None)),
        }
    }

    /// The delta role that runs `definition` in the bundle as it is now.
    pub(crate) fn delta_role(&self, definition: &str) -> Result<RoleName, Error> {
        let renderer = self.prompts.bundles.refreshed();
        let bundle = renderer.bundle();
        if !bundle.definitions.contains_key(definition) {
            let known: Vec<&str> = bundle.definitions.keys().map(String::as_str).collect();
            return Err(Error::invalid(
                "definition",
                format!("no subagent definition {definition:?} (definitions: {})", known.join(", ")),
            ));
        }
        let role = bundle
            .role_for_definition(definition)
            .ok_or_else(|| Error::invalid("definition", format!("no delta role can run {definition:?}")))?;
        Ok(RoleName::from_trusted(role.id.clone()))
    }

    pub(crate) async fn runs_start(&self, caller: Caller, req: RunsStartRequest) -> Result<RunsStartResponse, Error> {
        if let Some(issue) = req.issue {
            canopy_core::issues::check_number("issue", issue)?;
        }
        canopy_prompt::bundle::check_name(&req.definition).map_err(|m| Error::invalid("definition", m))?;
        if req.definition == "reviewer" {
            return Err(Error::invalid(
                "definition",
                "a reviewer run reviews a merge request: start one with review_request",
            ));
        }
        let role = self.delta_role(&req.definition)?;
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
        self.budgets.gate().require(caller.handle.as_str(), "subagent run")?;
        let checkout = self.repos.run_checkout(&caller, req.repo, req.base).await?;
        self.launch(caller, req.definition, role, req.brief, checkout, req.issue).await
    }

    /// Starts a run of `definition` (whose delta role is `role`) for `caller` with `brief`, in
    /// a checkout when one is given: the store caps runs per Manager; the checkout is made and
    /// the runners rung. Validation is the caller's.
    pub(crate) async fn launch(
        &self,
        caller: Caller,
        definition: String,
        role: RoleName,
        brief: String,
        checkout: Option<canopy_store::NewCheckout>,
        issue: Option<u64>,
    ) -> Result<RunsStartResponse, Error> {
        let (harness, script) = self.run_harness(&caller, role.as_str()).await?;
        let has_checkout = checkout.is_some();
        let spec = RunSpec {
            definition,
            brief,
            role,
            harness,
            script,
            max_running: self.config.runs.max_per_manager,
            timeout_ms: self.config.runs.timeout.as_millis() as i64,
            checkout,
            issue,
        };
        let home = format!("home-{}", caller.handle);
        let manager = caller.handle.to_string();
        let starter = caller.clone();
        let run = self.store.write(move |conn| ops::start_run(conn, &starter, &spec)).await?;
        if let Some(issue) = run.issue {
            self.issues.announce(vec![issue], &caller).await;
        }
        if has_checkout {
            self.repos.prepare_checkouts().await;
        }
        self.budgets.tree_changed().await;
        self.delivery.poke_runners().await;
        let report_topic = run_topic(run.id).to_string();
        let mut info = run_info(run);
        info.branch = has_checkout.then(|| canopy_core::repos::run_branch(&manager, info.id));
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
        let runs = self.clone();
        tokio::spawn(async move {
            let (report, check) = runs.report_with_branch(run.id, req.report).await;
            if let Err(e) = runs.ends.finish(run.id, status, report, check).await {
                tracing::warn!(run = run.id, error = %e, "recording a run's end failed");
            }
            runs.finishing.remove(&run.id);
        });
        Ok(RunsFinishResponse { recorded: true })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::testing::{Fixture, req};

    #[tokio::test]
    async fn a_run_starts_with_its_report_topic_and_bad_briefs_are_refused() {
        let fx = Fixture::new().await;
        let m1 = fx.manager("m1").await;
        let bad = fx.api.runs.runs_start(m1.clone(), req(json!({ "definition": "nope", "brief": "x" }))).await;
        assert!(matches!(bad, Err(canopy_core::Error::InvalidArgument { field: "definition", .. })), "{bad:?}");
        let empty = fx.api.runs.runs_start(m1.clone(), req(json!({ "definition": "implementer", "brief": " " }))).await;
        assert!(matches!(empty, Err(canopy_core::Error::InvalidArgument { field: "brief", .. })), "{empty:?}");
        let start = req(json!({ "definition": "implementer", "brief": "fix the parser" }));
        let started = fx.api.runs.runs_start(m1, start).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(started.report_channel, "home-m1");
        assert!(started.report_topic.contains(&started.run.id.to_string()));
        let listed = fx.api.runs.runs_list(fx.operator.clone(), req(json!({ "agent": "m1" }))).await;
        let listed = listed.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(listed.runs.len(), 1);
        assert_eq!(listed.runs[0].status, "running");
    }
}
