//! The sessions and runners area: a runner's sync (heartbeat, placement, the sessions it
//! should host) and its session reports (presence, activity, usage, ends, crash loops, with
//! their notices), and the stall check. Does not deliver messages (`delivery`).

use canopy_core::acl::Caller;
use canopy_core::{Error, Incarnation};
use canopy_proto::api::*;
use canopy_store::{Report, RunnerHeartbeat, UsageReport, ops};

use crate::auth::{session_token, token_hash};
use crate::context::{Api, bounded_text, encode};
use crate::credentials;

impl Api {
    pub(crate) async fn runners_sync(
        &self,
        runner: canopy_core::RunnerId,
        req: RunnersSyncRequest,
    ) -> Result<RunnersSyncResponse, Error> {
        crate::context::as_runner(&runner, &req.runner_id)?;
        let running = req.running;
        let beat = RunnerHeartbeat {
            runner_id: req.runner_id,
            boot: bounded_text("boot", req.boot, 64)?,
            hosting: !running.is_empty(),
            name: bounded_text("name", req.name, 128)?,
            mcp_url: bounded_text("mcp_url", req.mcp_url, 512)?,
            capacity: req.capacity,
            ttl_ms: self.config.runner.runner_ttl.as_millis() as i64,
        };
        let secrets = self.secrets.clone();
        let live = self
            .store
            .write(move |conn| {
                let hash_for = |agent: &str, incarnation: Incarnation| {
                    token_hash(&session_token(&secrets.session_secret, agent, incarnation))
                };
                ops::sync_runner(conn, &beat, &hash_for)
            })
            .await?;
        let running: std::collections::HashSet<(String, Incarnation)> =
            running.into_iter().map(|r| (r.agent, r.incarnation)).collect();
        let (keep, fresh): (Vec<_>, Vec<_>) =
            live.into_iter().partition(|s| running.contains(&(s.agent.to_string(), s.incarnation)));
        let more = fresh.len() > SYNC_START_BATCH;
        if !fresh.is_empty() {
            // Read fresh, not from the last snapshot: a session's start is a model turn.
            self.refresh_budgets().await;
        }
        let keep = keep
            .into_iter()
            .map(|s| RunningSession { agent: s.agent.to_string(), incarnation: s.incarnation })
            .collect();
        let fresh: Vec<_> = fresh.into_iter().take(SYNC_START_BATCH).collect();
        let prompts = self.render_sessions(&fresh).await?;
        let handles: Vec<String> = fresh.iter().map(|s| s.agent.to_string()).collect();
        let checkouts = match handles.is_empty() {
            true => Vec::new(),
            false => {
                self.store
                    .read(move |conn| handles.iter().map(|h| ops::checkout(conn, h)).collect::<Result<Vec<_>, _>>())
                    .await?
            }
        };
        let start = fresh
            .into_iter()
            .zip(prompts)
            .zip(checkouts)
            .filter(|((s, rendered), _)| rendered.is_some() || s.run.is_none())
            // A session's first input is a model turn: none starts under a spent budget.
            .filter(|((s, _), _)| self.budgets.hold(s.agent.as_str()).is_none())
            // An account whose checkout is not made (yet, or ever) does not start without it.
            .filter(|(_, checkout)| checkout.as_ref().is_none_or(|c| c.state == canopy_store::CheckoutState::Ready))
            .map(|((s, rendered), checkout)| {
                let checkout = checkout
                    .filter(|c| c.state == canopy_store::CheckoutState::Ready)
                    .map(|c| self.session_checkout(&c));
                let (model, harness_tools) = self.harness_asks(&s);
                SessionAssignment {
                    token: session_token(&self.secrets.session_secret, s.agent.as_str(), s.incarnation),
                    prompt_mode: match rendered.as_ref().map(|r| r.delivery) {
                        Some(PromptMode::Append) => PromptMode::Append,
                        _ => PromptMode::Replace,
                    },
                    prompt_hash: rendered.as_ref().map(|r| r.hash.clone()).unwrap_or_default(),
                    system_prompt: rendered.map(|r| r.text).unwrap_or_default(),
                    cwd: match &checkout {
                        Some((dir, _)) => dir.display().to_string(),
                        None => self.config.workdir(&self.data_dir, s.agent.as_str()).display().to_string(),
                    },
                    repo_mirror: checkout.map(|(_, mirror)| mirror.display().to_string()),
                    subagents: match s.run.is_none() && crate::prompts::has_native_subagents(&s.harness) {
                        true => self.native_subagents(s.role.as_str()),
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
            })
            .collect();
        Ok(RunnersSyncResponse { keep, start, more })
    }

    pub(crate) async fn sessions_report(
        &self,
        runner: canopy_core::RunnerId,
        req: SessionsReportRequest,
    ) -> Result<SessionsReportResponse, Error> {
        crate::context::as_runner(&runner, &req.runner_id)?;
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
        let applied =
            self.store.write(move |conn| ops::apply_reports(conn, &runner_id, &reports, max, estimate)).await?;
        for item in &applied.activity {
            let event = encode(&ActivityEvent { item: item.clone() });
            let _ = self.bus.publish(&self.subjects.activity_event(item.agent.as_str()), event.clone()).await;
            // A run's activity shows under its Manager too.
            if let Some(manager) = self.manager_of_run(item.agent.as_str()).await {
                let _ = self.bus.publish(&self.subjects.activity_event(&manager), event).await;
            }
        }
        if applied.budgets_changed {
            self.refresh_budgets().await;
        }
        self.deliver_notices(applied.notices).await;
        if applied.poke {
            self.poke_runners().await;
        }
        Ok(SessionsReportResponse { applied: applied.applied, ignored: applied.ignored })
    }

    /// Ends the sessions of runners that stopped syncing, on the daemon's own timer; runners
    /// are told to sync so the agents are placed again.
    pub async fn check_runners(&self) {
        let ttl = self.config.runner.runner_ttl.as_millis() as i64;
        match self.store.write(move |conn| ops::end_lost_runners(conn, ttl)).await {
            Ok(0) => {}
            Ok(ended) => {
                tracing::info!(ended, "ended the sessions of runners that stopped syncing");
                self.poke_runners().await;
            }
            Err(e) => tracing::warn!(error = %e, "ending the sessions of lost runners failed"),
        }
    }

    /// Marks silent working sessions as stalled and tells the operator.
    pub async fn check_stalled(&self) {
        let after = self.config.sessions.stall_after.as_millis() as i64;
        match self.store.write(move |conn| ops::mark_stalled(conn, after)).await {
            Ok(notices) => self.deliver_notices(notices).await,
            Err(e) => tracing::warn!(error = %e, "checking for stalled sessions failed"),
        }
    }
}

/// How long after answering a credential change the NATS server reloads its users.
const RELOAD_AFTER: std::time::Duration = std::time::Duration::from_millis(250);

/// How long a runner token replaced by a rotation is still accepted: a runner re-reads its
/// credential before each sync, and its calls in between must not be lost.
const OLD_TOKENS_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// Runner credentials and rotation. One change at a time (`credentials_lock`, held until the
/// server has reloaded): the files change first, then the token map, the audit record, and,
/// after the reply, the server's users, read from the files as they are then.
impl Api {
    pub(crate) async fn runners_add(
        &self,
        caller: Caller,
        req: RunnersAddRequest,
    ) -> Result<RunnersAddResponse, Error> {
        let id = canopy_core::RunnerId::parse(&req.id).map_err(|e| Error::name("id", e))?;
        let guard = self.credentials_lock.clone().lock_owned().await;
        let dir = canopy_config::DataDir::new(&self.data_dir);
        let credential = credentials::add_runner(&dir, &self.workspace_id, &id)?;
        let applied = self.credentials_changed(guard, &caller, "runners.add", id.as_str(), false).await?;
        Ok(RunnersAddResponse {
            path: dir.runner_credential(id.as_str()).display().to_string(),
            credential: RunnerCredentialWire {
                workspace_id: credential.workspace_id,
                runner_id: id,
                nats_user: credential.nats.user,
                nats_password: credential.nats.password,
                token: credential.token,
            },
            applied: applied.applied,
        })
    }

    /// Revokes a runner: its credential, its connection (at the reload), its live sessions.
    pub(crate) async fn runners_remove(
        &self,
        caller: Caller,
        req: RunnersRemoveRequest,
    ) -> Result<CredentialsChangedResponse, Error> {
        let id = canopy_core::RunnerId::parse(&req.id).map_err(|e| Error::name("id", e))?;
        let guard = self.credentials_lock.clone().lock_owned().await;
        credentials::remove_runner(&canopy_config::DataDir::new(&self.data_dir), &id)?;
        let changed = self.credentials_changed(guard, &caller, "runners.remove", id.as_str(), false).await?;
        let ended = self.store.write(move |conn| ops::forget_runner(conn, &id)).await?;
        if ended > 0 {
            self.poke_runners().await;
        }
        Ok(changed)
    }

    pub(crate) async fn credentials_rotate(
        &self,
        caller: Caller,
        _req: CredentialsRotateRequest,
    ) -> Result<CredentialsChangedResponse, Error> {
        let guard = self.credentials_lock.clone().lock_owned().await;
        // Whatever the rotation managed to write is applied, even when it stopped partway:
        // the server must accept the passwords the files now hold.
        let rotated = credentials::rotate(&canopy_config::DataDir::new(&self.data_dir), &self.workspace_id);
        let changed = self.credentials_changed(guard, &caller, "credentials.rotate", "all", true).await?;
        rotated.map(|_| changed)
    }

    /// A new NATS login for operator clients (a revoked operator keeps no way in below the
    /// API), applied like any credential change.
    pub(crate) async fn rotate_operator_login(&self, caller: &Caller, revoked: &str) -> Result<(), Error> {
        let guard = self.credentials_lock.clone().lock_owned().await;
        credentials::rotate_operator(&canopy_config::DataDir::new(&self.data_dir))?;
        self.credentials_changed(guard, caller, "credentials.rotate_operator", revoked, false).await.map(|_| ())
    }

    /// Applies the credential files as they now are: the runner tokens (with `keep_old`, the
    /// replaced ones stay valid for `OLD_TOKENS_FOR`), the audit log, and the managed server's
    /// users (a reload after the reply, which closes the connections of renamed users, the
    /// caller's and the daemon's own included; they log in again from their files).
    async fn credentials_changed(
        &self,
        guard: tokio::sync::OwnedMutexGuard<()>,
        caller: &Caller,
        action: &'static str,
        target: &str,
        keep_old: bool,
    ) -> Result<CredentialsChangedResponse, Error> {
        let dir = canopy_config::DataDir::new(&self.data_dir);
        let now = credentials::load(&dir)?;
        if let Ok(mut tokens) = self.secrets.runners.write() {
            let fresh = now.runner_tokens();
            if keep_old {
                // The old tokens stay beside the new ones for a while, then go.
                let secrets = self.secrets.clone();
                let current = fresh.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(OLD_TOKENS_FOR).await;
                    if let Ok(mut tokens) = secrets.runners.write() {
                        tokens.retain(|hash, _| current.contains_key(hash));
                    }
                });
            } else {
                tokens.clear();
            }
            tokens.extend(fresh);
        }
        let applied = match &self.nats {
            Some(nats) => {
                let (nats, subjects) = (nats.clone(), self.subjects.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(RELOAD_AFTER).await;
                    // The files as they are now; the lock keeps the next change out until then.
                    match credentials::load(&dir) {
                        Ok(now) => {
                            if let Err(e) = nats.reload(&now.users(&subjects)) {
                                tracing::error!(error = %e, "reloading the NATS server's users failed");
                            }
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "reading the credentials to reload the NATS server failed")
                        }
                    }
                    drop(guard);
                });
                true
            }
            None => false,
        };
        let (caller, target, detail) =
            (caller.clone(), target.to_owned(), if applied { "applied" } else { "install canopy nats-config" });
        self.store.write(move |conn| ops::record_act(conn, &caller, action, &target, detail)).await?;
        tracing::info!(action, applied, "credentials changed");
        Ok(CredentialsChangedResponse { users: now.user_names(), applied })
    }
}
