//! The benchmark's workspace: `Bench`, a `canopy_cli::sandbox::Sandbox` set up for measuring
//! (no embedded runner, quick runner expiry, room for 100,000 agents), with what only the
//! benchmark needs around it: a real runner in this process, a stand-in runner that holds
//! sessions without processes, and the raw stores the baselines write (`baseline.rs`).
//!
//! Starting, stopping and resuming the daemon are the sandbox's; this adds the benchmark's
//! parts and tears them down with it.

use std::time::{Duration, Instant};

use canopy_cli::sandbox::{Sandbox, Setup, Stopped};
use canopy_config::RunnerCredential;
use canopy_proto::api::*;
use canopy_proto::method;
use canopy_store::Store;
use futures_util::StreamExt;

/// The runner id the broadcast figure registers, so sessions exist without processes.
pub(crate) const FAKE_RUNNER: &str = "bench-fake-runner";

/// The in-process runner's id.
pub(crate) const BENCH_RUNNER: &str = "bench-runner";

/// How the benchmark's `canopy.toml` differs from the defaults.
const EDITS: &[(&str, &str)] = &[
    ("embedded = true", "embedded = false"),
    ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
    ("runner_ttl = \"10s\"", "runner_ttl = \"1s\""),
    ("capacity = 1000", "capacity = 100000"),
];

/// The fake runner's id, typed.
pub fn fake_runner() -> canopy_core::RunnerId {
    canopy_core::RunnerId::from_trusted(FAKE_RUNNER.to_owned())
}

/// A sandbox set up for the benchmark, with its runners and raw stores; its sandbox's
/// clients and operator token are reached through it (`Deref`).
pub struct Bench {
    sandbox: Sandbox,
    /// The stand-in runner's API token.
    runner_token: String,
    /// The in-process runner's credential (`start_runner`).
    bench_runner: RunnerCredential,
    /// The raw baselines' own store, beside the workspace.
    pub(crate) raw: Store,
    /// The raw store made a workspace for the post's writer job alone: its operator and
    /// the home channels it posts to (`post_job_throughput`).
    pub(crate) raw_posts: tokio::sync::OnceCell<(canopy_core::acl::Caller, Vec<canopy_core::ChannelName>)>,
    /// A reader of the workspace's database, for row counts.
    reader: Store,
}

impl std::ops::Deref for Bench {
    type Target = Sandbox;

    fn deref(&self) -> &Sandbox {
        &self.sandbox
    }
}

impl Bench {
    /// Answers the daemon's requests about the stand-in runner's checkouts (`runner.<id>.git`)
    /// as a runner sharing the daemon's directory would: its checkouts are the daemon's own, so
    /// a publish is a fetch into the mirror, confined as the runner's. Other asks are refused.
    pub async fn answer_git_as_stand_in(&self) -> Result<tokio::task::JoinHandle<()>, String> {
        use futures_util::StreamExt;
        let data = self.data().clone();
        let file = data.runner_credential(FAKE_RUNNER);
        let subjects = self.api.subjects.clone();
        let id = fake_runner();
        let login = canopy_bus::Login::reading(
            move || canopy_config::credentials::read_login(&file),
            Some(subjects.inbox(canopy_proto::Party::Runner(&id))),
        );
        let info = canopy_config::read_connection_info(&data).map_err(|e| format!("daemon.json: {e}"))?;
        let bus = canopy_bus::Bus::connect(&info.nats_url, &login, "bench-stand-in", true)
            .await
            .map_err(|e| e.to_string())?;
        let mut asks = bus.serve(&subjects.runner_git(&id), id.as_str()).await.map_err(|e| e.to_string())?;
        bus.flush().await.map_err(|e| e.to_string())?;
        let git = canopy_git::Git::new(
            "git",
            canopy_harness::SandboxSettings::required(data.root()),
            Duration::from_secs(60),
        );
        Ok(tokio::spawn(async move {
            while let Some(ask) = asks.next().await {
                let Some(reply) = ask.reply else { continue };
                let answer = match serde_json::from_slice::<canopy_proto::api::RunnerGitRequest>(&ask.payload) {
                    Ok(canopy_proto::api::RunnerGitRequest {
                        agent,
                        repo,
                        op: canopy_proto::api::RunnerGitOp::Publish { what, to },
                    }) => {
                        let dir = data.sessions().join(&agent).join("work");
                        match git.publish(&git.mirror_path(&repo), &dir, &what, &to).await {
                            Ok(head) => canopy_proto::api::RunnerGitReply::Published { head },
                            Err(e) => canopy_proto::api::RunnerGitReply::Failed { reason: e.to_string() },
                        }
                    }
                    other => {
                        canopy_proto::api::RunnerGitReply::Refused { reason: format!("not the stand-in's: {other:?}") }
                    }
                };
                let _ = bus.publish(&reply, serde_json::to_vec(&answer).unwrap_or_default().into()).await;
            }
        }))
    }

    /// The tool-call path of a runner on another machine, as the stand-in runner: over HTTP
    /// to the daemon's endpoint (`daemon.json`'s `git_url`) with the stand-in's login.
    pub fn remote_tools(&self) -> Result<canopy_runner::HttpTools, String> {
        let info = canopy_config::read_connection_info(self.data()).map_err(|e| format!("daemon.json: {e}"))?;
        let tools = canopy_runner::HttpTools::new(self.api.bus.clone(), self.api.timeout);
        tools.set(&info.git_url, canopy_git::http::basic_header(fake_runner().as_str(), &self.runner_token));
        Ok(tools)
    }

    /// A fresh benchmark workspace with its daemon running.
    pub async fn start() -> Result<Bench, String> {
        let setup = Setup { edits: EDITS, files: &[], runners: &[BENCH_RUNNER, FAKE_RUNNER] };
        Bench::around(Sandbox::start(&setup).await?).await
    }

    /// Starts the daemon again on a stopped benchmark's workspace and server.
    pub async fn resume(stopped: Stopped) -> Result<Bench, String> {
        Bench::around(Sandbox::resume(stopped).await?).await
    }

    /// The benchmark's parts around a running sandbox; the sandbox is stopped when one of
    /// them cannot be made.
    async fn around(sandbox: Sandbox) -> Result<Bench, String> {
        let data = sandbox.data();
        let credential = |id: &str| -> Result<RunnerCredential, String> {
            canopy_config::credentials::read(&data.runner_credential(id)).map_err(|e| e.to_string())
        };
        let opened = async {
            let (bench_runner, fake) = (credential(BENCH_RUNNER)?, credential(FAKE_RUNNER)?);
            let raw = Store::open(&sandbox.scratch().join("raw.db"), 4096).map_err(|e| e.to_string())?;
            canopy_store::bench::prepare(&raw).await.map_err(|e| e.to_string())?;
            let reader = Store::open(&data.db(), 16).map_err(|e| e.to_string())?;
            Ok::<_, String>((bench_runner, fake.token, raw, reader))
        };
        match opened.await {
            Ok((bench_runner, runner_token, raw, reader)) => {
                Ok(Bench { sandbox, runner_token, bench_runner, raw, raw_posts: tokio::sync::OnceCell::new(), reader })
            }
            Err(e) => {
                sandbox.stop().await;
                Err(e)
            }
        }
    }

    /// Stops everything; the workspace is removed.
    pub async fn stop(self) {
        self.stop_daemon().await.nats.shutdown().await;
    }

    /// Closes the raw stores and stops the in-process daemon, keeping the server and the
    /// workspace (for a figure that restarts the daemon as its own process).
    pub async fn stop_daemon(self) -> Stopped {
        self.raw.close().await;
        self.reader.close().await;
        self.sandbox.stop_daemon().await
    }

    /// Creates `n` agents `<prefix>-<i>` (32 requests at a time); returns their home channels.
    /// With `stopped`, their sessions are stopped at once, so no runner starts them.
    pub async fn create_agents(&self, prefix: &str, n: usize, stopped: bool) -> Result<Vec<String>, String> {
        self.create_agents_on(prefix, n, stopped, None).await
    }

    /// `create_agents`, each with a checkout of repository `repo` when one is named.
    pub async fn create_agents_on(
        &self,
        prefix: &str,
        n: usize,
        stopped: bool,
        repo: Option<&str>,
    ) -> Result<Vec<String>, String> {
        let start = self.agent_count().await?;
        let handles: Vec<String> = (0..n).map(|i| format!("{prefix}-{}", start + i)).collect();
        let results = futures_util::stream::iter(handles.iter().cloned())
            .map(|handle| async move {
                let request = AgentsCreateRequest {
                    handle: handle.clone(),
                    name: handle.clone(),
                    role: "manager".into(),
                    parent: None,
                    charter: String::new(),
                    harness: None,
                    script: None,
                    persona: None,
                    repo: repo.map(str::to_owned),
                    needs: Vec::new(),
                };
                let account: canopy_core::Account = self
                    .api
                    .send::<method::AgentsCreate>(&self.operator, &request)
                    .await
                    .map_err(|e| format!("creating {handle}: {e}"))?;
                if stopped {
                    let stop = AgentsStartStopRequest { handle: handle.clone(), harness: None };
                    self.api
                        .send::<method::AgentsStop>(&self.operator, &stop)
                        .await
                        .map_err(|e| format!("stopping {handle}: {e}"))?;
                }
                Ok(account.home_channel.map(|c| c.to_string()).unwrap_or_default())
            })
            .buffered(32)
            .collect::<Vec<_>>()
            .await;
        results.into_iter().collect()
    }

    pub async fn agent_count(&self) -> Result<usize, String> {
        let list = self.api.agents_all(&self.operator).await.map_err(|e| e.to_string())?;
        Ok(list.agents.len())
    }

    /// An agent whose session sits in a long "tool call", so mentions are steered.
    pub async fn create_sleeper(&self, handle: &str) -> Result<(), String> {
        let request = AgentsCreateRequest {
            handle: handle.into(),
            name: handle.into(),
            role: "manager".into(),
            parent: None,
            charter: String::new(),
            harness: Some("scripted".into()),
            script: Some(ScriptSource {
                name: "sleeper.toml".into(),
                text: "[[rule]]\nmatch = { kind = \"start\" }\nactions = [{ sleep = \"1h\" }]\n".into(),
            }),
            persona: None,
            repo: None,
            needs: Vec::new(),
        };
        self.api.send::<method::AgentsCreate>(&self.operator, &request).await.map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let request = RosterRequest { handles: vec![handle.to_owned()], ..RosterRequest::default() };
            let roster: RosterResponse =
                self.api.send::<method::Roster>(&self.operator, &request).await.map_err(|e| e.to_string())?;
            if roster.agents.iter().any(|a| a.handle.as_str() == handle && a.presence == canopy_core::Presence::Working)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{handle}'s session never started working"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A real runner in this process (harness: this binary's `harness-scripted`).
    pub async fn start_runner(&self) -> Result<canopy_runner::RunnerHandle, String> {
        let data = self.sandbox.data();
        let options = canopy_runner::wiring::options(
            data,
            self.sandbox.config(),
            self.api.clone(),
            &self.bench_runner,
            &data.runner_credential(BENCH_RUNNER),
        )
        .map_err(|e| e.to_string())?;
        canopy_runner::spawn(options).await.map_err(|e| e.to_string())
    }

    /// Registers the stand-in runner once every real runner has expired; returns how many
    /// sessions (online agents) it holds.
    pub async fn fake_runner_sync(&self, capacity: u32) -> Result<usize, String> {
        tokio::time::sleep(self.sandbox.config().runner.runner_ttl + Duration::from_millis(300)).await;
        self.fake_sessions(capacity).await.map(|s| s.len())
    }

    /// The stand-in runner's sessions: it syncs like a runner that starts everything it is
    /// given (and claims nothing it ran before), until nothing waits.
    pub async fn fake_sessions(&self, capacity: u32) -> Result<Vec<RunningSession>, String> {
        let mut running: Vec<RunningSession> = Vec::new();
        loop {
            let response = self.fake_sync(capacity, running.clone()).await?;
            running = response.keep;
            running.extend(
                response.start.into_iter().map(|s| RunningSession { agent: s.agent, incarnation: s.incarnation }),
            );
            if !response.more {
                return Ok(running);
            }
        }
    }

    /// Like `fake_sessions` once every real runner has expired, keeping what it was given:
    /// each started session with its token, and a heartbeat task that syncs the stand-in
    /// runner every 300 ms so they stay live until it is aborted.
    pub async fn fake_sessions_kept(
        &self,
        capacity: u32,
    ) -> Result<(Vec<SessionAssignment>, tokio::task::JoinHandle<()>), String> {
        tokio::time::sleep(self.sandbox.config().runner.runner_ttl + Duration::from_millis(300)).await;
        let mut running: Vec<RunningSession> = Vec::new();
        let mut started = Vec::new();
        loop {
            let response = self.fake_sync(capacity, running.clone()).await?;
            running = response.keep;
            running.extend(
                response.start.iter().map(|s| RunningSession { agent: s.agent.clone(), incarnation: s.incarnation }),
            );
            started.extend(response.start);
            if !response.more {
                break;
            }
        }
        let (api, token) = (self.api.clone(), self.runner_token.clone());
        let heartbeat = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let request = fake_sync_request(capacity, running.clone());
                if let Ok(response) = api.send::<method::RunnersSync>(&token, &request).await {
                    running = response.keep;
                }
            }
        });
        Ok((started, heartbeat))
    }

    async fn fake_sync(&self, capacity: u32, running: Vec<RunningSession>) -> Result<RunnersSyncResponse, String> {
        let request = fake_sync_request(capacity, running);
        self.api.send::<method::RunnersSync>(&self.runner_token, &request).await.map_err(|e| e.to_string())
    }

    /// Reports a model turn's usage for a stand-in runner's session, as its runner would.
    pub async fn fake_usage(&self, session: &RunningSession, tokens: u64) -> Result<(), String> {
        let report = SessionReport {
            agent: session.agent.clone(),
            incarnation: session.incarnation,
            presence: None,
            reason: None,
            activity: None,
            ended: false,
            crash_loop: false,
            fatal: false,
            usage: Some(ReportedUsage { input_tokens: tokens, cost_usd: Some(0.0), ..ReportedUsage::default() }),
        };
        let request = SessionsReportRequest { runner_id: fake_runner(), reports: vec![report] };
        let _: SessionsReportResponse =
            self.api.send::<method::SessionsReport>(&self.runner_token, &request).await.map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Rows in the workspace's database.
    pub async fn row_count(&self) -> Result<u64, String> {
        canopy_store::bench::row_count(&self.reader).await.map_err(|e| e.to_string())
    }
}

/// The stand-in runner's sync: it claims `running` and takes up to `capacity` sessions.
fn fake_sync_request(capacity: u32, running: Vec<RunningSession>) -> RunnersSyncRequest {
    RunnersSyncRequest {
        runner_id: fake_runner(),
        boot: String::new(),
        name: "benchmark stand-in".into(),
        mcp_url: "http://127.0.0.1:1/mcp".into(),
        capacity,
        running,
        labels: Vec::new(),
        version: String::new(),
    }
}
