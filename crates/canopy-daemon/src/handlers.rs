//! API handlers: one function per method, from raw payload to reply bytes.
//!
//! Every request goes the same way: authenticate the token, decode the payload strictly,
//! parse names at the edge (so a bad name is `invalid_argument` naming its field), check
//! sizes against configuration, then one store call. A mutation is committed before its
//! reply is built, and a committed message is published as an event after the commit.
//! Nothing here panics on input: every failure is a typed `Error` in the reply.

use bytes::Bytes;
use canopy_bus::Bus;
use canopy_core::acl::Caller;
use canopy_core::{ChannelKind, ChannelName, Desired, Error, Handle, PostPolicy, RoleName, RosterEntry, TopicName};
use canopy_proto::api::*;
use canopy_proto::{Method, Reply, Subjects, WireError, decode_request};
use canopy_store::{AgentSpec, ChannelSpec, PostSpec, Report, RunnerHeartbeat, Store, UsageReport, ops};
use serde::Serialize;

use crate::auth::{session_token, token_hash};
use crate::roles::RoleDefaults;
use canopy_config::Config;

/// Longest display name, in bytes.
pub const MAX_DISPLAY_NAME: usize = 128;
/// Longest charter, in bytes.
pub const MAX_CHARTER: usize = 8192;
/// Longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 128;

/// Everything a handler needs. Cheap to clone into each request task.
#[derive(Clone, Debug)]
pub struct Api {
    pub store: Store,
    pub bus: Bus,
    pub subjects: Subjects,
    pub config: std::sync::Arc<Config>,
    pub roles: std::sync::Arc<RoleDefaults>,
    pub secrets: std::sync::Arc<Secrets>,
    /// Where relative script paths are read from.
    pub data_dir: std::path::PathBuf,
    /// Wakes between pairs of agents (in memory: a restart forgets recent loops).
    pub loops: std::sync::Arc<crate::delivery::LoopGuard>,
    /// Operator token hash -> caller. Operator tokens never change while the daemon runs,
    /// so they are resolved once; session tokens are checked against the store every time,
    /// because they die with their session.
    pub operators: std::sync::Arc<dashmap::DashMap<String, Caller>>,
    /// The prompt bundle in use.
    pub prompts: std::sync::Arc<crate::prompts::Prompts>,
    /// Agent handle -> role (and run definition), for the per-role tool check.
    pub role_cache: std::sync::Arc<dashmap::DashMap<String, crate::prompt_api::RoleOf>>,
}

/// The daemon's credentials for runners and sessions.
pub struct Secrets {
    /// Hash of the workspace's runner token.
    pub runner_token_hash: String,
    /// Secret from which session tokens are derived.
    pub session_secret: String,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secrets { .. }")
    }
}

/// The dispatch, generated from the method table (`canopy_proto::api_methods!`): a runner
/// method needs the runner token; any other needs an account's token and passes the per-role
/// tool check; then the request is decoded as the table's request type and handed to the
/// handler the table names, whose response must be the table's response type.
macro_rules! dispatch {
    (@call $api:ident, Runner, $handler:ident, $req:ty, $resp:ty, $token:ident, $payload:ident, $method:ident) => {{
        $api.authenticate_runner($token)?;
        let request: $req = decode_request($payload)?;
        let response: $resp = $api.$handler(request).await?;
        ok(response)
    }};
    (@call $api:ident, Account, $handler:ident, $req:ty, $resp:ty, $token:ident, $payload:ident, $method:ident) => {{
        let caller = $api.authenticate($token).await?;
        $api.check_tool(&caller, $method).await?;
        let request: $req = decode_request($payload)?;
        let response: $resp = $api.$handler(caller, request).await?;
        ok(response)
    }};
    ($(($variant:ident, $handler:ident, $name:literal, $req:ty => $resp:ty, $callers:ident, $tool:expr)),* $(,)?) => {
        impl Api {
            async fn dispatch(&self, method: &str, token: Option<&str>, payload: &[u8]) -> Result<Bytes, Error> {
                let api = self;
                let method = Method::parse(method).ok_or_else(|| Error::UnknownMethod { method: method.to_owned() })?;
                match method {
                    $(Method::$variant => dispatch!(@call api, $callers, $handler, $req, $resp, token, payload, method),)*
                }
            }
        }
    };
}
canopy_proto::api_methods!(dispatch);

impl Api {
    /// Handles one request and returns the reply payload.
    pub async fn handle(&self, subject: &str, token: Option<&str>, payload: &[u8]) -> Bytes {
        let method = self.subjects.api_suffix(subject).unwrap_or(subject);
        match self.dispatch(method, token, payload).await {
            Ok(bytes) => bytes,
            Err(err) => {
                tracing::debug!(method, code = %err.code(), error = %err, "request refused");
                encode(&Reply::<()>::Error(WireError::from(&err)))
            }
        }
    }

    async fn authenticate(&self, token: Option<&str>) -> Result<Caller, Error> {
        let token = token.ok_or_else(|| Error::Unauthenticated("the request has no Canopy-Token header".into()))?;
        let hash = token_hash(token);
        if let Some(caller) = self.operators.get(&hash) {
            return Ok(caller.clone());
        }
        let key = hash.clone();
        let caller = self
            .store
            .read(move |conn| ops::resolve_token(conn, &key))
            .await?
            .ok_or_else(|| Error::Unauthenticated("the token is not known to this workspace".into()))?;
        if caller.is_operator() {
            self.operators.insert(hash, caller.clone());
        }
        Ok(caller)
    }

    fn authenticate_runner(&self, token: Option<&str>) -> Result<(), Error> {
        match token {
            Some(token) if token_hash(token) == self.secrets.runner_token_hash => Ok(()),
            Some(_) => Err(Error::Unauthenticated("this method needs the workspace's runner token".into())),
            None => Err(Error::Unauthenticated("the request has no Canopy-Token header".into())),
        }
    }

    /// Rings the runners' doorbell so they sync now rather than at their next tick.
    pub async fn poke_runners(&self) {
        if let Err(e) = self.bus.publish(&self.subjects.runner_poke(), Bytes::new()).await {
            tracing::debug!(error = %e, "poking runners failed; they sync on their timer");
        }
    }

    /// Publishes committed messages as events (doorbells). A failed publish is logged: the
    /// message is committed and followers catch up from their cursors.
    /// Publishes the events of committed messages (followers' doorbells). This alone reaches
    /// no agent: a notice goes through `deliver_notices`, which also rings its recipients.
    pub(crate) async fn publish_messages(&self, messages: Vec<canopy_core::Message>) {
        for message in messages {
            let subject = self.subjects.message_event(message.channel.as_str());
            if let Err(e) = self.bus.publish(&subject, encode(&MessageEvent { message })).await {
                tracing::warn!(error = %e, "publishing a message event failed");
            }
        }
    }

    async fn agents_start(&self, caller: Caller, req: AgentsStartStopRequest) -> Result<RosterEntry, Error> {
        self.set_desired(caller, req, Desired::Running).await
    }

    async fn agents_stop(&self, caller: Caller, req: AgentsStartStopRequest) -> Result<RosterEntry, Error> {
        self.set_desired(caller, req, Desired::Stopped).await
    }

    async fn set_desired(
        &self,
        caller: Caller,
        req: AgentsStartStopRequest,
        desired: Desired,
    ) -> Result<RosterEntry, Error> {
        let handle = Handle::parse(&req.handle).map_err(|e| Error::name("handle", e))?;
        let entry = self.store.write(move |conn| ops::set_desired(conn, &caller, &handle, desired)).await?;
        self.poke_runners().await;
        Ok(entry)
    }

    /// Stops an agent's running turn through the runner hosting its live session. The
    /// session stays up; messages not yet delivered stay pending, and a steer taken but not
    /// injected comes back as dropped and goes at the next turn start.
    async fn agents_interrupt(
        &self,
        caller: Caller,
        req: AgentsInterruptRequest,
    ) -> Result<AgentsInterruptResponse, Error> {
        canopy_core::acl::require_operator(&caller, "agents.interrupt")?;
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
            self.bus.request(&self.subjects.runner_interrupt(&runner), None, encode(&request), timeout).await.map_err(
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

    async fn agents_set_activity(&self, caller: Caller, req: SetActivityRequest) -> Result<RosterEntry, Error> {
        let text = bounded_text("text", req.text, 1000)?;
        self.store.write(move |conn| ops::set_activity(conn, &caller, &text)).await
    }

    /// Whether sessions run unconfined (`[sandbox] mode = "off"`), for every roster line.
    fn unconfined(&self) -> bool {
        self.config.sandbox.mode == canopy_config::config::SandboxModeConfig::Off
    }

    async fn roster(&self, _: Caller, _: RosterRequest) -> Result<RosterResponse, Error> {
        let mut agents = self.store.read(ops::roster).await?;
        let unconfined = self.unconfined();
        agents.iter_mut().for_each(|a| a.unconfined = unconfined);
        Ok(RosterResponse { agents })
    }

    async fn activity_read(&self, caller: Caller, req: ActivityReadRequest) -> Result<ActivityReadResponse, Error> {
        let agent = Handle::parse(&req.agent).map_err(|e| Error::name("agent", e))?;
        let limit = page_limit(req.limit)?;
        let tail = req.tail.map(|t| t.min(MAX_READ_LIMIT));
        let after = req.after;
        let (items, more) =
            self.store.read(move |conn| ops::read_activity(conn, &caller, agent.as_str(), after, limit, tail)).await?;
        let next_after = items.last().map_or(after, |i| i.id);
        Ok(ActivityReadResponse { items, next_after, more })
    }

    async fn runners_sync(&self, req: RunnersSyncRequest) -> Result<RunnersSyncResponse, Error> {
        if req.runner_id.is_empty() || req.runner_id.len() > 128 {
            return Err(Error::invalid("runner_id", "must be 1 to 128 bytes"));
        }
        let running = req.running;
        let beat = RunnerHeartbeat {
            runner_id: req.runner_id,
            name: bounded_text("name", req.name, 128)?,
            mcp_url: bounded_text("mcp_url", req.mcp_url, 512)?,
            capacity: req.capacity,
            ttl_ms: self.config.runner.runner_ttl.as_millis() as i64,
        };
        let secrets = self.secrets.clone();
        let live = self
            .store
            .write(move |conn| {
                let hash_for = |agent: &str, incarnation: u64| {
                    token_hash(&session_token(&secrets.session_secret, agent, incarnation))
                };
                ops::sync_runner(conn, &beat, &hash_for)
            })
            .await?;
        let running: std::collections::HashSet<(String, u64)> =
            running.into_iter().map(|r| (r.agent, r.incarnation)).collect();
        let (keep, fresh): (Vec<_>, Vec<_>) =
            live.into_iter().partition(|s| running.contains(&(s.agent.to_string(), s.incarnation)));
        let more = fresh.len() > SYNC_START_BATCH;
        let keep = keep
            .into_iter()
            .map(|s| RunningSession { agent: s.agent.to_string(), incarnation: s.incarnation })
            .collect();
        let fresh: Vec<_> = fresh.into_iter().take(SYNC_START_BATCH).collect();
        let prompts = self.render_sessions(&fresh).await?;
        let start = fresh
            .into_iter()
            .zip(prompts)
            .filter(|(s, rendered)| rendered.is_some() || s.run.is_none())
            .map(|(s, rendered)| {
                let (model, harness_tools) = self.harness_asks(&s);
                SessionAssignment {
                    token: session_token(&self.secrets.session_secret, s.agent.as_str(), s.incarnation),
                    prompt_mode: match rendered.as_ref().map(|r| r.delivery) {
                        Some(canopy_prompt::Delivery::Append) => PromptModeWire::Append,
                        _ => PromptModeWire::Replace,
                    },
                    prompt_hash: rendered.as_ref().map(|r| r.hash.clone()).unwrap_or_default(),
                    system_prompt: rendered.map(|r| r.text).unwrap_or_default(),
                    cwd: self.config.workdir(&self.data_dir, s.agent.as_str()).display().to_string(),
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

    async fn sessions_report(&self, req: SessionsReportRequest) -> Result<SessionsReportResponse, Error> {
        if req.reports.len() > 10_000 {
            return Err(Error::invalid("reports", "at most 10000 reports per request"));
        }
        let reports: Vec<Report> = req
            .reports
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
                usage: r.usage.map(|u| UsageReport {
                    turn_id: u.turn_id.map(|t| canopy_core::redact::cut(&t, 128)),
                    input_tokens: u.input_tokens,
                    output_tokens: u.output_tokens,
                    cache_read_tokens: u.cache_read_tokens,
                    cache_write_tokens: u.cache_write_tokens,
                    cost_usd: u.cost_usd,
                }),
            })
            .collect();
        let runner_id = req.runner_id;
        let max = self.config.sessions.activity_per_session;
        let applied = self.store.write(move |conn| ops::apply_reports(conn, &runner_id, &reports, max)).await?;
        for item in &applied.activity {
            let event = encode(&ActivityEvent { item: item.clone() });
            let _ = self.bus.publish(&self.subjects.activity_event(item.agent.as_str()), event.clone()).await;
            // A run's activity shows under its Manager too.
            if let Some(manager) = self.manager_of_run(item.agent.as_str()).await {
                let _ = self.bus.publish(&self.subjects.activity_event(&manager), event).await;
            }
        }
        self.deliver_notices(applied.notices).await;
        if applied.poke {
            self.poke_runners().await;
        }
        Ok(SessionsReportResponse { applied: applied.applied, ignored: applied.ignored })
    }

    /// Marks silent working sessions as stalled and tells the operator.
    pub async fn check_stalled(&self) {
        let after = self.config.sessions.stall_after.as_millis() as i64;
        match self.store.write(move |conn| ops::mark_stalled(conn, after)).await {
            Ok(notices) => self.deliver_notices(notices).await,
            Err(e) => tracing::warn!(error = %e, "checking for stalled sessions failed"),
        }
    }

    async fn channels_subscribe(&self, caller: Caller, req: ChannelRequest) -> Result<canopy_core::Channel, Error> {
        self.subscribe(caller, req, true).await
    }

    async fn channels_unsubscribe(&self, caller: Caller, req: ChannelRequest) -> Result<canopy_core::Channel, Error> {
        self.subscribe(caller, req, false).await
    }

    async fn subscribe(&self, caller: Caller, req: ChannelRequest, join: bool) -> Result<canopy_core::Channel, Error> {
        let channel = ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?;
        self.store
            .write(move |conn| {
                if join {
                    ops::subscribe_self(conn, &caller, &channel)
                } else {
                    ops::unsubscribe_self(conn, &caller, &channel)
                }
            })
            .await
    }

    async fn channels_open_direct(
        &self,
        caller: Caller,
        req: OpenDirectRequest,
    ) -> Result<canopy_core::Channel, Error> {
        let peer = Handle::parse(&req.peer).map_err(|e| Error::name("peer", e))?;
        self.store.write(move |conn| ops::open_direct(conn, &caller, &peer)).await
    }

    async fn topics_rename(&self, caller: Caller, req: TopicsRenameRequest) -> Result<Done, Error> {
        let channel = ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?;
        let from = TopicName::parse(&req.topic).map_err(|e| Error::name("topic", e))?;
        let to = TopicName::parse(&req.to).map_err(|e| Error::name("to", e))?;
        self.store.write(move |conn| ops::rename_topic(conn, &caller, &channel, &from, &to)).await?;
        Ok(Done {})
    }

    async fn topics_resolve(&self, caller: Caller, req: TopicsResolveRequest) -> Result<Done, Error> {
        let channel = ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?;
        let topic = TopicName::parse(&req.topic).map_err(|e| Error::name("topic", e))?;
        let resolved = req.resolved;
        self.store.write(move |conn| ops::resolve_topic(conn, &caller, &channel, &topic, resolved)).await?;
        Ok(Done {})
    }

    async fn board_pin(&self, caller: Caller, req: BoardPinRequest) -> Result<BoardResponse, Error> {
        let channel = ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?;
        let name = channel.to_string();
        let seq = req.seq;
        let pins = self.store.write(move |conn| ops::pin(conn, &caller, &channel, seq)).await?;
        Ok(BoardResponse { channel: name, pins })
    }

    async fn board_list(&self, caller: Caller, req: BoardListRequest) -> Result<BoardResponse, Error> {
        let channel = ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?;
        let name = channel.to_string();
        let pins = self.store.read(move |conn| ops::board(conn, &caller, &channel)).await?;
        Ok(BoardResponse { channel: name, pins })
    }

    async fn whoami(&self, caller: Caller, _: WhoamiRequest) -> Result<WhoamiResponse, Error> {
        let tools = match caller.kind {
            canopy_core::AccountKind::Agent => self.tools_of(&caller).await?,
            _ => Vec::new(),
        };
        self.store
            .read(move |conn| {
                let account = ops::account(conn, "caller", caller.handle.as_str())?;
                let workspace = ops::workspace(conn)?.ok_or_else(|| Error::Internal("no workspace row".into()))?;
                Ok(WhoamiResponse { account, workspace, version: env!("CARGO_PKG_VERSION").to_owned(), tools })
            })
            .await
    }

    async fn agents_create(&self, caller: Caller, req: AgentsCreateRequest) -> Result<canopy_core::Account, Error> {
        let spec = AgentSpec {
            handle: Handle::parse(&req.handle).map_err(|e| Error::name("handle", e))?,
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
        };
        let defaults = self.session_defaults(spec.role.as_str());
        let harness = req.harness.unwrap_or(defaults.harness);
        let script = match req.script {
            Some(source) => Some((source.name, source.text)),
            None if harness == "scripted" => defaults.script,
            None => None,
        };
        let session = crate::roles::check(&harness, script, self.roles.check_script())?;
        let spec = AgentSpec { harness: session.harness, script: session.script, ..spec };
        let account = self.store.write(move |conn| ops::create_agent(conn, &caller, &spec)).await?;
        self.poke_runners().await;
        Ok(account)
    }

    async fn agents_list(&self, _: Caller, _: AgentsListRequest) -> Result<AgentsListResponse, Error> {
        let agents = self.store.read(ops::list_agents).await?;
        Ok(AgentsListResponse { agents })
    }

    async fn agents_show(&self, _: Caller, req: AgentsShowRequest) -> Result<AgentsShowResponse, Error> {
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

    async fn agents_reparent(&self, caller: Caller, req: AgentsReparentRequest) -> Result<canopy_core::Account, Error> {
        let handle = Handle::parse(&req.handle).map_err(|e| Error::name("handle", e))?;
        let parent = Handle::parse(&req.parent).map_err(|e| Error::name("parent", e))?;
        self.store.write(move |conn| ops::reparent(conn, &caller, &handle, &parent)).await
    }

    async fn tree(&self, _: Caller, _: TreeRequest) -> Result<TreeResponse, Error> {
        Ok(TreeResponse { root: self.store.read(ops::tree).await? })
    }

    async fn channels_list(&self, _: Caller, _: ChannelsListRequest) -> Result<ChannelsListResponse, Error> {
        Ok(ChannelsListResponse { channels: self.store.read(ops::list_channels).await? })
    }

    async fn channels_create(&self, caller: Caller, req: ChannelsCreateRequest) -> Result<canopy_core::Channel, Error> {
        let kind = req.kind.unwrap_or(ChannelKind::General);
        let default_policy = if kind == ChannelKind::Broadcast { PostPolicy::Restricted } else { PostPolicy::Open };
        let posters = req
            .posters
            .iter()
            .map(|p| Handle::parse(p).map_err(|e| Error::name("posters", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let spec = ChannelSpec {
            name: ChannelName::parse_user(&req.name).map_err(|e| Error::name("name", e))?,
            kind,
            post_policy: req.post_policy.unwrap_or(default_policy),
            posters,
        };
        self.store.write(move |conn| ops::create_channel(conn, Some(&caller), &spec)).await
    }

    async fn topics_list(&self, caller: Caller, req: TopicsListRequest) -> Result<TopicsListResponse, Error> {
        let channel = ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?;
        let topics = self.store.read(move |conn| ops::list_topics(conn, &caller, channel.as_str())).await?;
        Ok(TopicsListResponse { topics })
    }

    async fn messages_post(&self, caller: Caller, req: PostRequest) -> Result<PostResponse, Error> {
        let max = self.config.limits.max_body_bytes;
        if req.body.trim().is_empty() {
            return Err(Error::invalid("body", "the message body is empty"));
        }
        if req.body.len() > max {
            return Err(Error::TooLarge { field: "body", len: req.body.len(), max });
        }
        if let Some(key) = &req.idempotency_key
            && (key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY || !key.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(Error::invalid(
                "idempotency_key",
                format!("must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters without spaces"),
            ));
        }
        let spec = PostSpec {
            channel: ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?,
            topic: TopicName::parse(&req.topic).map_err(|e| Error::name("topic", e))?,
            body: req.body,
            create_topic: req.create_topic,
            idempotency_key: req.idempotency_key,
            ack_only: req.ack_only,
        };
        let ack_only = spec.ack_only;
        let poster = caller.clone();
        // A post the policy forbids is refused only once its audit record has committed.
        let posted = self.store.write(move |conn| ops::post_audited(conn, &poster, &spec)).await??;
        let committed_us = crate::delivery::unix_us();
        // The message is committed; a lost event only delays followers, who resync.
        self.publish_messages(vec![posted.message.clone()]).await;
        if posted.duplicate {
            return Ok(PostResponse {
                message: posted.message,
                duplicate: true,
                outcomes: Vec::new(),
                counts: OutcomeCounts::default(),
                unknown_mentions: Vec::new(),
            });
        }
        let (channel_id, sender_id, mentions) = (posted.channel_id, posted.sender_id, posted.message.mentions.clone());
        let reach = self.store.read(move |conn| ops::reach(conn, channel_id, sender_id, &mentions)).await?;
        let (outcomes, counts) = self.deliver(&caller, &posted.message, &reach, ack_only, committed_us).await;
        self.reply_decision(&caller, &posted.message).await;
        Ok(PostResponse {
            unknown_mentions: reach.unknown_mentions,
            message: posted.message,
            duplicate: false,
            outcomes,
            counts,
        })
    }

    async fn messages_read(&self, caller: Caller, req: ReadRequest) -> Result<ReadResponse, Error> {
        let channel = ChannelName::parse(&req.channel).map_err(|e| Error::name("channel", e))?;
        let topic =
            req.topic.as_deref().map(|t| TopicName::parse(t).map_err(|e| Error::name("topic", e))).transpose()?;
        let limit = page_limit(req.limit)?;
        let after = req.after;
        let name = channel.clone();
        let page =
            self.store.read(move |conn| ops::read_channel(conn, &caller, &name, topic.as_ref(), after, limit)).await?;
        Ok(ReadResponse {
            channel: channel.to_string(),
            groups: group_by_topic(page.messages),
            next_after: page.next_after,
            more: page.more,
        })
    }

    async fn messages_sync(&self, caller: Caller, req: SyncRequest) -> Result<SyncResponse, Error> {
        let channel =
            req.channel.as_deref().map(|c| ChannelName::parse(c).map_err(|e| Error::name("channel", e))).transpose()?;
        let limit = page_limit(req.limit)?;
        let after = req.after;
        let page = self.store.read(move |conn| ops::sync(conn, &caller, channel.as_ref(), after, limit)).await?;
        Ok(SyncResponse { messages: page.messages, next_after: page.next_after, more: page.more })
    }
}

/// Groups a page by topic, in order of each topic's first message.
fn group_by_topic(messages: Vec<canopy_core::Message>) -> Vec<TopicGroup> {
    let mut groups: Vec<TopicGroup> = Vec::new();
    for message in messages {
        match groups.iter_mut().find(|g| g.topic == message.topic) {
            Some(group) => group.messages.push(message),
            None => groups.push(TopicGroup { topic: message.topic.clone(), messages: vec![message] }),
        }
    }
    groups
}

fn page_limit(limit: Option<u32>) -> Result<u32, Error> {
    match limit.unwrap_or(DEFAULT_READ_LIMIT) {
        0 => Err(Error::invalid("limit", "must be at least 1")),
        n if n > MAX_READ_LIMIT => {
            Err(Error::invalid("limit", format!("{n} is above the maximum of {MAX_READ_LIMIT}")))
        }
        n => Ok(n),
    }
}

fn display_name(name: &str) -> Result<String, Error> {
    if name.trim().is_empty() || name.trim() != name || name.chars().any(char::is_control) {
        return Err(Error::invalid("name", "a display name is one line of text without surrounding whitespace"));
    }
    bounded_text("name", name.to_owned(), MAX_DISPLAY_NAME)
}

fn bounded_text(field: &'static str, text: String, max: usize) -> Result<String, Error> {
    if text.len() > max {
        return Err(Error::TooLarge { field, len: text.len(), max });
    }
    Ok(text)
}

fn ok<T: Serialize>(value: T) -> Result<Bytes, Error> {
    Ok(encode(&Reply::Ok(value)))
}

/// Serialises a value the daemon built. These types always serialise; the fallback
/// keeps the daemon answering even if one day one does not.
pub(crate) fn encode<T: Serialize>(value: &T) -> Bytes {
    match serde_json::to_vec(value) {
        Ok(bytes) => Bytes::from(bytes),
        Err(e) => Bytes::from(format!(
            r#"{{"error":{{"code":"internal","message":"encoding the reply failed: {}"}}}}"#,
            e.to_string().replace(['"', '\\'], "'")
        )),
    }
}
