//! The sessions area (`Sessions`): what runners ask and report. A runner's sync (heartbeat,
//! placement, the sessions it should host, each with its prompt, checkout and token), its
//! session reports (presence, activity, usage, ends, crash loops, with their notices), the
//! pull and acknowledgement of pending messages, an agent's desired state and interrupt, and
//! the periodic checks (lost runners, stalled sessions, overfull mailboxes).
//!
//! Uses the store, `Auth` (session tokens), delivery, the wire (activity events, interrupts),
//! the prompts area (rendering at placement), repos (a session's checkout) and budgets (a
//! spent budget starts no session, hands over nothing). Does not carry a post (`delivery`).

use canopy_core::acl::Caller;
use canopy_core::{Error, Incarnation};
use canopy_proto::api::*;
use canopy_store::{Report, RunnerHeartbeat, UsageReport, ops};

use std::path::PathBuf;
use std::sync::Arc;

use canopy_config::Config;
use canopy_core::{Desired, Handle, RosterEntry};
use canopy_proto::Subjects;
use canopy_store::Store;

use crate::auth::Auth;
use crate::budgets::Budgets;
use crate::delivery::Delivery;
use crate::edge::{as_runner, bounded_text, encode};
use crate::prompts::Prompts;
use crate::repos::Repos;
use crate::wire::Wire;

/// The sessions area. Cheap to clone.
#[derive(Clone)]
pub struct Sessions {
    store: Store,
    auth: Auth,
    delivery: Delivery,
    wire: Arc<dyn Wire>,
    subjects: Subjects,
    prompts: Prompts,
    repos: Repos,
    budgets: Budgets,
    config: Arc<Config>,
    data_dir: PathBuf,
    /// The daemon's git endpoint as runners reach it (told with every sync).
    git_url: String,
    /// Ends runs lost with their runner.
    runs: crate::runs::Runs,
    /// Tells the operator's `[notify]` command of an agent that began failing.
    notifier: crate::notify::Notifier,
}

impl Sessions {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Store,
        auth: Auth,
        delivery: Delivery,
        wire: Arc<dyn Wire>,
        subjects: Subjects,
        prompts: Prompts,
        repos: Repos,
        budgets: Budgets,
        config: Arc<Config>,
        data_dir: PathBuf,
        git_url: String,
        runs: crate::runs::Runs,
        notifier: crate::notify::Notifier,
    ) -> Self {
        Sessions {
            store,
            auth,
            delivery,
            wire,
            subjects,
            prompts,
            repos,
            budgets,
            config,
            data_dir,
            git_url,
            runs,
            notifier,
        }
    }

    pub(crate) async fn agents_start(&self, caller: Caller, req: AgentsStartStopRequest) -> Result<RosterEntry, Error> {
        self.set_desired(caller, req, Desired::Running).await
    }

    pub(crate) async fn agents_stop(&self, caller: Caller, req: AgentsStartStopRequest) -> Result<RosterEntry, Error> {
        if req.harness.is_some() {
            return Err(Error::invalid("harness", "only `agents start` moves a lane to another harness"));
        }
        self.set_desired(caller, req, Desired::Stopped).await
    }

    pub(crate) async fn set_desired(
        &self,
        caller: Caller,
        req: AgentsStartStopRequest,
        desired: Desired,
    ) -> Result<RosterEntry, Error> {
        let handle = Handle::parse(&req.handle).map_err(|e| Error::name("handle", e))?;
        let harness = match req.harness {
            Some(harness) => Some(self.lane_harness(&handle, harness).await?),
            None => None,
        };
        let entry = self
            .store
            .write(move |conn| {
                if let Some(harness) = &harness {
                    ops::set_harness(conn, Some(&caller), &handle, harness)?;
                }
                ops::set_desired(conn, &caller, &handle, desired)
            })
            .await?;
        self.delivery.poke_runners().await;
        Ok(entry)
    }

    /// `harness` checked for `handle`'s lane: a harness Canopy runs, and one of its role's
    /// chain when the role names one.
    async fn lane_harness(&self, handle: &Handle, harness: String) -> Result<String, Error> {
        if canopy_core::harness::HarnessKind::parse(&harness).is_none() {
            return Err(Error::invalid(
                "harness",
                format!("{harness:?} is not one of: scripted, claude, codex, omp, pi"),
            ));
        }
        let name = handle.to_string();
        let entry = self.store.read(move |conn| ops::roster_entry(conn, &name)).await?;
        if let Some(role) = self.config.roles.get(entry.role.as_str())
            && !role.fallback.is_empty()
            && !role.chain().contains(&harness)
        {
            let chain = role.chain().join(", ");
            return Err(Error::invalid("harness", format!("{handle}'s role {} runs only {chain}", entry.role)));
        }
        Ok(harness)
    }

    /// `[sessions]` failover settings and each role's harness chain.
    fn failover_rules(&self) -> canopy_store::FailoverRules {
        let sessions = &self.config.sessions;
        canopy_store::FailoverRules {
            after: sessions.failover_after,
            window_ms: sessions.failover_window.as_millis() as i64,
            chains: self
                .config
                .roles
                .iter()
                .filter(|(_, r)| !r.fallback.is_empty())
                .map(|(role, r)| (role.clone(), r.chain()))
                .collect(),
        }
    }

    /// Lanes past `[sessions] failback_after` on a fallback harness go back to their first
    /// (the daemon's timer); each session moves at its next turn boundary.
    pub async fn check_failback(&self) {
        let after = self.config.sessions.failback_after.as_millis() as i64;
        let moved = self
            .store
            .write(move |conn| {
                let now = conn.now_ms();
                ops::failback_due(conn, now, after)?
                    .into_iter()
                    .map(|(handle, home)| ops::fail_back(conn, &handle, &home))
                    .collect::<Result<Vec<_>, _>>()
            })
            .await;
        match moved {
            Ok(notices) if notices.is_empty() => {}
            Ok(notices) => {
                self.delivery.deliver_notices(notices).await;
                self.delivery.poke_runners().await;
            }
            Err(e) => tracing::warn!(error = %e, "moving lanes back to their first harness failed"),
        }
    }

    /// Stops an agent's running turn through the runner hosting its live session. The
    /// session stays up; messages not yet delivered stay pending, and a steer taken but not
    /// injected comes back as dropped and goes at the next turn start.
    pub(crate) async fn agents_interrupt(
        &self,
        caller: Caller,
        req: AgentsInterruptRequest,
    ) -> Result<AgentsInterruptResponse, Error> {
        let handle = Handle::parse(&req.handle).map_err(|e| Error::name("handle", e))?;
        let name = handle.to_string();
        let entry = self.store.read(move |conn| ops::roster_entry(conn, &name)).await?;
        let Some(runner) = entry.runner.clone() else {
            let reason = entry.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
            return Err(Error::ConflictOn {
                field: "handle",
                reason: format!(
                    "{handle} has no live session to interrupt (it is {}{reason})",
                    entry.presence.as_str()
                ),
            });
        };
        let request = InterruptRequest { agent: handle.to_string(), incarnation: entry.incarnation };
        let timeout = self.config.delivery.steer_timeout.max(std::time::Duration::from_secs(5));
        let reply =
            self.wire.request(&self.subjects.runner_interrupt(&runner), encode(&request), timeout).await.map_err(
                |e| Error::Unavailable(format!("the runner hosting {handle} ({runner}) did not answer ({e})")),
            )?;
        let reply: InterruptReply = serde_json::from_slice(&reply)
            .map_err(|e| Error::Internal(format!("the answer of runner {runner} did not parse: {e}")))?;
        let detail = match (&reply.turn_id, &reply.reason) {
            (Some(turn), _) if reply.interrupted => format!("turn {turn} (incarnation {})", entry.incarnation),
            (_, Some(reason)) => format!("nothing interrupted: {reason}"),
            _ => "nothing interrupted".to_owned(),
        };
        let audited = handle.clone();
        self.store.write(move |conn| ops::record_interrupt(conn, &caller, &audited, &detail)).await?;
        Ok(AgentsInterruptResponse {
            agent: handle.to_string(),
            incarnation: entry.incarnation,
            interrupted: reply.interrupted,
            turn_id: reply.turn_id,
            reason: reply.reason,
        })
    }

    pub(crate) async fn runners_sync(
        &self,
        runner: canopy_core::RunnerId,
        req: RunnersSyncRequest,
    ) -> Result<RunnersSyncResponse, Error> {
        as_runner(&runner, &req.runner_id)?;
        // Every runner but the one inside the daemon keeps its own checkouts.
        let own_checkouts = runner.as_str() != canopy_config::EMBEDDED_RUNNER;
        let running = req.running;
        let beat = RunnerHeartbeat {
            runner_id: req.runner_id,
            boot: bounded_text("boot", req.boot, 64)?,
            hosting: !running.is_empty(),
            name: bounded_text("name", req.name, 128)?,
            mcp_url: bounded_text("mcp_url", req.mcp_url, 512)?,
            capacity: req.capacity,
            ttl_ms: self.config.runner.runner_ttl.as_millis() as i64,
            labels: canopy_core::placement::check_labels("labels", &req.labels)?,
            version: bounded_text("version", req.version, 64)?,
            role_needs: self.config.roles.iter().map(|(role, c)| (role.clone(), c.needs.clone())).collect(),
        };
        let auth = self.auth.clone();
        let live = self
            .store
            .write(move |conn| {
                let hash_for = |agent: &str, incarnation: Incarnation| {
                    crate::auth::token_hash(&auth.session_token(agent, incarnation))
                };
                ops::sync_runner(conn, &beat, &hash_for)
            })
            .await?;
        let canopy_store::Synced { sessions: live, notices, draining, lost_runs, move_at_boundary } = live;
        let move_at_boundary = move_at_boundary
            .into_iter()
            .map(|(agent, incarnation)| RunningSession { agent: agent.to_string(), incarnation })
            .collect();
        self.delivery.deliver_notices(notices).await;
        self.runs_lost(lost_runs);
        let running: std::collections::HashSet<(String, Incarnation)> =
            running.into_iter().map(|r| (r.agent, r.incarnation)).collect();
        let (keep, fresh): (Vec<_>, Vec<_>) =
            live.into_iter().partition(|s| running.contains(&(s.agent.to_string(), s.incarnation)));
        let more = fresh.len() > SYNC_START_BATCH;
        if !fresh.is_empty() {
            // Read fresh, not from the last snapshot: a session's start is a model turn.
            self.budgets.refresh_budgets().await;
        }
        let keep = keep
            .into_iter()
            .map(|s| RunningSession { agent: s.agent.to_string(), incarnation: s.incarnation })
            .collect();
        let fresh: Vec<_> = fresh.into_iter().take(SYNC_START_BATCH).collect();
        let prompts = self.prompts.render_sessions(&fresh).await?;
        let handles: Vec<String> = fresh.iter().map(|s| s.agent.to_string()).collect();
        let checkouts = match handles.is_empty() {
            true => Vec::new(),
            false => {
                self.store
                    .read(move |conn| handles.iter().map(|h| ops::checkout(conn, h)).collect::<Result<Vec<_>, _>>())
                    .await?
            }
        };
        if !own_checkouts {
            // An agent back on the daemon's own checkout after running elsewhere continues from
            // what it pushed there.
            for checkout in checkouts.iter().flatten() {
                self.repos.catch_up(checkout).await;
            }
        }
        let start = fresh
            .into_iter()
            .zip(prompts)
            .zip(checkouts)
            .filter(|((s, rendered), _)| rendered.is_some() || s.run.is_none())
            // A session's first input is a model turn: none starts under a spent budget.
            .filter(|((s, _), _)| self.budgets.gate().hold(s.agent.as_str()).is_none())
            // An account whose checkout is not made (yet, or ever) does not start without it.
            .filter(|(_, checkout)| checkout.as_ref().is_none_or(|c| c.state == canopy_store::CheckoutState::Ready))
            .map(|((s, rendered), checkout)| self.assignment(s, rendered, checkout, own_checkouts))
            .collect();
        Ok(RunnersSyncResponse { keep, start, more, git_url: self.git_url.clone(), draining, move_at_boundary })
    }

    /// What a runner is told to start for one placed session: its prompt, token, working
    /// directory (its checkout when it has a ready one: the daemon's, or for a runner that
    /// keeps its own, what to make it from), harness and run.
    fn assignment(
        &self,
        s: canopy_store::LiveSession,
        rendered: Option<canopy_prompt::Rendered>,
        checkout: Option<canopy_store::Checkout>,
        own_checkouts: bool,
    ) -> SessionAssignment {
        let checkout = checkout.filter(|c| c.state == canopy_store::CheckoutState::Ready);
        let cwd_read_only = checkout.as_ref().is_some_and(|c| c.read_only);
        // Every runner is told the repository; the embedded one also gets the daemon's checkout.
        let repo = checkout.as_ref().map(|c| RepoAssignment {
            name: c.repo.name.clone(),
            branch: c.branch.clone(),
            start: c.base_commit.clone(),
            published: match c.run {
                Some((run, _)) => canopy_core::repos::run_ref(run),
                None => canopy_core::repos::agent_ref(c.account.as_str()),
            },
            read_only: c.read_only,
        });
        let checkout = checkout.filter(|_| !own_checkouts).map(|c| self.repos.session_checkout(&c));
        let (model, harness_tools) = self.prompts.harness_asks(&s);
        SessionAssignment {
            token: self.auth.session_token(s.agent.as_str(), s.incarnation),
            prompt_mode: match rendered.as_ref().map(|r| r.delivery) {
                Some(PromptMode::Append) => PromptMode::Append,
                _ => PromptMode::Replace,
            },
            prompt_hash: rendered.as_ref().map(|r| r.hash.clone()).unwrap_or_default(),
            system_prompt: rendered.map(|r| r.text).unwrap_or_default(),
            cwd: match &checkout {
                Some((dir, _)) => dir.display().to_string(),
                None if repo.is_some() => String::new(),
                None => self.config.workdir(&self.data_dir, s.agent.as_str()).display().to_string(),
            },
            repo,
            repo_mirror: checkout.map(|(_, mirror)| mirror.display().to_string()),
            cwd_read_only,
            allow_hosts: self.config.roles.get(s.role.as_str()).map(|r| r.allow_hosts.clone()).unwrap_or_default(),
            subagents: match s.run.is_none() && crate::bundle::has_native_subagents(&s.harness) {
                true => self.prompts.native_subagents(s.role.as_str()),
                false => Vec::new(),
            },
            model,
            harness_tools,
            run: s.run.map(|(id, definition, brief)| RunAssignment {
                id,
                definition,
                manager: s.parent.clone().unwrap_or_default(),
                brief,
            }),
            agent: s.agent.to_string(),
            display_name: s.display_name,
            role: s.role.to_string(),
            incarnation: s.incarnation,
            harness: s.harness,
            script: s.script_name.zip(s.script).map(|(name, text)| ScriptSource { name, text }),
            home_channel: s.home_channel,
            charter: s.charter,
        }
    }

    pub(crate) async fn runners_list(&self, _: Caller, _: RunnersListRequest) -> Result<RunnersListResponse, Error> {
        let rows = self.store.read(ops::list_runners).await?;
        let now = self.store.clock().now_ms();
        Ok(RunnersListResponse { runners: rows.into_iter().map(|r| self.runner_info(r, now)).collect() })
    }

    pub(crate) async fn runners_drain(&self, caller: Caller, req: RunnersDrainRequest) -> Result<RunnerInfo, Error> {
        let id = canopy_core::RunnerId::parse(&req.id).map_err(|e| Error::invalid("id", e.to_string()))?;
        let drain = req.drain;
        let row = self.store.write(move |conn| ops::set_draining(conn, &caller, id.as_str(), drain)).await?;
        // Its sessions move at their next turn boundary; runners look at once.
        self.delivery.poke_runners().await;
        Ok(self.runner_info(row, self.store.clock().now_ms()))
    }

    fn runner_info(&self, row: canopy_store::RunnerRow, now_ms: i64) -> RunnerInfo {
        let age_ms = (now_ms - row.last_seen_ms).max(0);
        RunnerInfo {
            id: canopy_core::RunnerId::from_trusted(row.id),
            name: row.name,
            labels: row.labels,
            sessions: row.sessions,
            capacity: row.capacity,
            last_sync: humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(row.last_seen_ms.max(0) as u64),
            )
            .to_string(),
            last_sync_secs: (age_ms / 1000) as u64,
            live: age_ms <= self.config.runner.runner_ttl.as_millis() as i64,
            version: row.version,
            draining: row.draining,
        }
    }

    pub(crate) async fn sessions_report(
        &self,
        runner: canopy_core::RunnerId,
        req: SessionsReportRequest,
    ) -> Result<SessionsReportResponse, Error> {
        as_runner(&runner, &req.runner_id)?;
        if req.reports.len() > 10_000 {
            return Err(Error::invalid("reports", "at most 10000 reports per request"));
        }
        let reports: Vec<Report> =
            req.reports
                .into_iter()
                .map(|r| Report {
                    agent: r.agent,
                    incarnation: r.incarnation,
                    presence: r.presence,
                    reason: r.reason.map(|reason| canopy_core::redact::redact(&reason, 500)),
                    activity: r.activity.map(|a| (a.kind, a.turn_id, a.summary, a.detail)),
                    ended: r.ended,
                    crash_loop: r.crash_loop,
                    fatal: r.fatal,
                    usage: r.usage.map(|u| {
                        // Tokens only: priced from `[pricing]` by the session's model, marked computed.
                        let computed = match u.cost_usd {
                            Some(_) => None,
                            None => u.model.as_deref().and_then(|m| self.config.pricing.get(m)).map(|p| {
                                canopy_core::Price { input: p.input, cached_input: p.cached_input, output: p.output }
                                    .cost(u.input_tokens, u.cache_read_tokens, u.cache_write_tokens, u.output_tokens)
                            }),
                        };
                        UsageReport {
                            turn_id: u.turn_id.map(|t| canopy_core::redact::cut(&t, 128)),
                            input_tokens: u.input_tokens,
                            output_tokens: u.output_tokens,
                            cache_read_tokens: u.cache_read_tokens,
                            cache_write_tokens: u.cache_write_tokens,
                            cost_usd: u.cost_usd.or(computed),
                            cost_computed: computed.is_some(),
                        }
                    }),
                })
                .collect();
        let runner_id = req.runner_id;
        let max = self.config.sessions.activity_per_session;
        let estimate = canopy_store::Estimate {
            usd: self.config.budgets.unreported_turn_usd,
            tokens: self.config.budgets.unreported_turn_tokens,
        };
        let rules = self.failover_rules();
        let applied =
            self.store.write(move |conn| ops::apply_reports(conn, &runner_id, &reports, max, estimate, &rules)).await?;
        for item in &applied.activity {
            let event = encode(&ActivityEvent { item: item.clone() });
            self.publish_activity(item.agent.as_str(), event.clone()).await;
            // A run's activity shows under its Manager too.
            if let Some(manager) = self.prompts.manager_of_run(item.agent.as_str()).await {
                self.publish_activity(&manager, event).await;
            }
        }
        if applied.budgets_changed {
            self.budgets.refresh_budgets().await;
        }
        self.delivery.deliver_notices(applied.notices).await;
        for agent in &applied.failing {
            self.notifier.failing(agent, false);
        }
        if applied.poke {
            self.delivery.poke_runners().await;
        }
        Ok(SessionsReportResponse { applied: applied.applied, ignored: applied.ignored })
    }

    /// Ends the sessions of runners that stopped syncing, on the daemon's own timer; runners
    /// are told to sync so the agents are placed again.
    pub async fn check_runners(&self) {
        let ttl = self.config.runner.runner_ttl.as_millis() as i64;
        match self.store.write(move |conn| ops::end_lost_runners(conn, ttl)).await {
            Ok(lost) if lost.sessions == 0 => {}
            Ok(lost) => {
                tracing::info!(ended = lost.sessions, "ended the sessions of runners that stopped syncing");
                self.runs_lost(lost.runs);
                self.delivery.poke_runners().await;
            }
            Err(e) => tracing::warn!(error = %e, "ending the sessions of lost runners failed"),
        }
    }

    /// Ends runs lost with their runner, in a task (their reports read the mirror).
    fn runs_lost(&self, runs: Vec<i64>) {
        if runs.is_empty() {
            return;
        }
        tracing::warn!(?runs, "runs lost with their runner end failed (runner lost)");
        let area = self.runs.clone();
        tokio::spawn(async move { area.runner_lost(runs).await });
    }

    /// Marks silent working sessions as stalled and tells the operator.
    pub async fn check_stalled(&self) {
        let after = self.config.sessions.stall_after.as_millis() as i64;
        match self.store.write(move |conn| ops::mark_stalled(conn, after)).await {
            Ok(notices) => self.delivery.deliver_notices(notices).await,
            Err(e) => tracing::warn!(error = %e, "checking for stalled sessions failed"),
        }
    }

    pub(crate) async fn deliveries_pull(
        &self,
        runner: canopy_core::RunnerId,
        req: DeliveriesPullRequest,
    ) -> Result<DeliveriesPullResponse, Error> {
        as_runner(&runner, &req.runner_id)?;
        let limit = req.limit.unwrap_or(self.config.delivery.batch).clamp(1, MAX_READ_LIMIT);
        // Under a spent budget nothing is handed over, so no turn starts; it stays pending.
        if self.budgets.gate().hold(&req.agent).is_some() {
            return Ok(DeliveriesPullResponse { messages: Vec::new(), wake: false, total: 0, redelivered: Vec::new() });
        }
        let incarnation = req.incarnation;
        let (agent, pending) = self
            .store
            .read(move |conn| {
                let agent = ops::live_agent(conn, &req.agent, req.incarnation, &req.runner_id)?;
                Ok((agent, ops::pending(conn, agent, limit)?))
            })
            .await?;
        // What is handed out is recorded (a write only when there is something), so a later
        // session knows what an earlier one may have seen (`redelivered`).
        let seqs: Vec<canopy_core::Seq> = pending.messages.iter().map(|m| m.seq).collect();
        let redelivered = match seqs.is_empty() {
            true => Vec::new(),
            false => self.store.write(move |conn| ops::offer(conn, agent, incarnation, &seqs)).await?,
        };
        Ok(DeliveriesPullResponse { messages: pending.messages, wake: pending.wake, total: pending.total, redelivered })
    }

    pub(crate) async fn deliveries_ack(
        &self,
        runner: canopy_core::RunnerId,
        req: DeliveriesAckRequest,
    ) -> Result<DeliveriesAckResponse, Error> {
        as_runner(&runner, &req.runner_id)?;
        if req.seqs.len() > MAX_READ_LIMIT as usize {
            return Err(Error::invalid("seqs", format!("at most {MAX_READ_LIMIT} per acknowledgement")));
        }
        let moved = self
            .store
            .write(move |conn| {
                let agent = ops::live_agent(conn, &req.agent, req.incarnation, &req.runner_id)?;
                if req.steered {
                    req.seqs.iter().try_for_each(|seq| ops::record_injected(conn, agent, *seq))?;
                    return Ok(0);
                }
                ops::acknowledge(conn, agent, &req.seqs)
            })
            .await?;
        Ok(DeliveriesAckResponse { moved })
    }

    /// Tells the operator about agents whose pending messages passed the cap.
    pub async fn check_mailboxes(&self) {
        let cap = self.config.delivery.max_pending;
        let batch = self.config.delivery.batch;
        let retention = self.config.delivery.retention;
        let result = self
            .store
            .write(move |conn| {
                let mut notices = Vec::new();
                let cutoff = conn.now_ms() - retention.as_millis() as i64;
                for (agent_id, handle, missed) in ops::expire(conn, cutoff)? {
                    let body = format!(
                        "@{handle} never received {missed} messages older than the retention period ({}); \
                         they expired undelivered. They are still in their channels' history.",
                        humantime::format_duration(retention)
                    );
                    notices.push(ops::notice(conn, agent_id, &body)?);
                }
                for (agent_id, handle, pending) in ops::overflowing(conn, cap)? {
                    let body = format!(
                        "@{handle} has {pending} messages waiting, more than the cap of {cap}. Nothing is dropped; \
                         its next turns take them {batch} at a time. `canopy roster` shows the count."
                    );
                    notices.push(ops::notice(conn, agent_id, &body)?);
                }
                Ok(notices)
            })
            .await;
        match result {
            Ok(notices) => self.delivery.deliver_notices(notices).await,
            Err(e) => tracing::warn!(error = %e, "checking mailboxes failed"),
        }
    }

    /// Publishes an activity event for `agent`'s followers (`canopy watch`, the console). A
    /// lost event is logged: followers read the activity pages.
    async fn publish_activity(&self, agent: &str, event: bytes::Bytes) {
        if let Err(e) = self.wire.publish(&self.subjects.activity_event(agent), event).await {
            tracing::debug!(error = %e, agent, "publishing an activity event failed; followers read the pages");
        }
    }
}

#[cfg(test)]
mod tests {
    use canopy_core::RunnerId;
    use serde_json::json;

    use crate::testing::{Fixture, req};

    fn sync(runner: &str) -> canopy_proto::api::RunnersSyncRequest {
        req(json!({ "runner_id": runner, "boot": "b1", "name": "test runner", "mcp_url": "http://127.0.0.1:1/mcp",
            "capacity": 10, "running": [] }))
    }

    #[tokio::test]
    async fn a_runner_is_given_its_sessions_with_tokens_that_authenticate_and_acts_only_as_itself() {
        let fx = Fixture::new().await;
        fx.manager("m1").await;
        let r1 = RunnerId::from_trusted("r1".into());
        let other = fx.api.sessions.runners_sync(r1.clone(), sync("r2")).await;
        assert!(matches!(other, Err(canopy_core::Error::Forbidden { .. })), "{other:?}");
        let placed = fx.api.sessions.runners_sync(r1, sync("r1")).await.unwrap_or_else(|e| panic!("{e}"));
        let m1 = placed.start.iter().find(|s| s.agent == "m1").unwrap_or_else(|| panic!("{:?}", placed.start));
        assert!(!m1.system_prompt.is_empty() && m1.prompt_hash.len() > 8);
        let who = fx.api.auth.authenticate(Some(&m1.token)).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(who.handle.as_str(), "m1");
    }

    #[tokio::test]
    async fn a_stopped_agent_is_not_placed_and_its_runner_is_poked() {
        let fx = Fixture::new().await;
        fx.manager("m1").await;
        fx.api
            .sessions
            .agents_stop(fx.operator.clone(), req(json!({ "handle": "m1" })))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let placed = fx.api.sessions.runners_sync(RunnerId::from_trusted("r1".into()), sync("r1")).await;
        let placed = placed.unwrap_or_else(|e| panic!("{e}"));
        assert!(!placed.start.iter().any(|s| s.agent == "m1"), "{:?}", placed.start);
    }
}
