//! A sandbox: a temporary workspace, a private nats-server and the daemon in this process,
//! torn down by `stop`. The benchmark and `canopy demo` run in one; the raw baselines of the
//! benchmark (NATS echo, NATS + SQLite commit, NATS publish burst) live here too.

use std::time::{Duration, Instant};

use canopy_bus::{ApiClient, Bus, Login, ManagedNats, NatsServerConfig, find_nats_server};
use canopy_config::{Config, DataDir};
use canopy_daemon::InitOptions;
use canopy_proto::Subjects;
use canopy_proto::api::*;
use canopy_proto::method;
use canopy_store::Store;
use futures_util::StreamExt;
use tokio::sync::oneshot;

use crate::payload;

/// The runner id the broadcast figure registers, so sessions exist without processes.
pub const FAKE_RUNNER: &str = "bench-fake-runner";

/// The in-process runner's id.
pub const BENCH_RUNNER: &str = "bench-runner";

/// The fake runner's id, typed.
pub fn fake_runner() -> canopy_core::RunnerId {
    canopy_core::RunnerId::from_trusted(FAKE_RUNNER.to_owned())
}

/// A sandbox whose daemon has stopped: its server and workspace remain until dropped.
pub struct Stopped {
    pub nats: ManagedNats,
    pub data: DataDir,
    pub operator: String,
    _dir: tempfile::TempDir,
}

pub struct Sandbox {
    pub api: ApiClient,
    /// The same API called in this process, as the embedded runner and the console call it.
    pub in_process: ApiClient,
    pub operator: String,
    runner_token: String,
    bench_runner: canopy_config::RunnerCredential,
    data: DataDir,
    config: Config,
    nats: ManagedNats,
    daemon: tokio::task::JoinHandle<Result<(), canopy_daemon::DaemonError>>,
    stop: oneshot::Sender<()>,
    raw: Store,
    /// The raw store made a workspace for the post's writer job alone: its operator and
    /// the home channels it posts to (`post_job_throughput`).
    raw_posts: tokio::sync::OnceCell<(canopy_core::acl::Caller, Vec<canopy_core::ChannelName>)>,
    reader: Store,
    _dir: tempfile::TempDir,
}

impl Sandbox {
    /// A sandbox for the benchmark: no embedded runner, quick runner expiry.
    pub async fn for_bench() -> Result<Sandbox, String> {
        Sandbox::start(&[
            ("embedded = true", "embedded = false"),
            ("sync_interval = \"2s\"", "sync_interval = \"200ms\""),
            ("runner_ttl = \"10s\"", "runner_ttl = \"1s\""),
            ("capacity = 1000", "capacity = 100000"),
        ])
        .await
    }

    /// A sandbox whose `canopy.toml` differs from the defaults by `edits` (from, to).
    pub async fn start(edits: &[(&str, &str)]) -> Result<Sandbox, String> {
        Sandbox::start_with(edits, &[]).await
    }

    /// `start`, with files (name, text) written into the data directory before the daemon
    /// reads its configuration (scripts the edits name).
    pub async fn start_with(edits: &[(&str, &str)], files: &[(&str, &str)]) -> Result<Sandbox, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("creating a temporary directory: {e}"))?;
        let data = DataDir::new(dir.path().join("data"));
        let options = InitOptions {
            mission: "benchmark".into(),
            operator: "bench".into(),
            name: "bench".into(),
            check_script: canopy_harness::scripted::check_script,
        };
        let report = canopy_daemon::init(&data, &options).await.map_err(|e| e.to_string())?;
        // The in-process runner's and the stand-in runner's credentials, before the daemon reads them.
        let workspace_id = report.workspace.id.clone();
        for id in [BENCH_RUNNER, FAKE_RUNNER] {
            canopy_daemon::credentials::add_runner(
                &data,
                &workspace_id,
                &canopy_core::RunnerId::from_trusted(id.to_owned()),
            )
            .map_err(|e| e.to_string())?;
        }
        let mut text = std::fs::read_to_string(data.config()).map_err(|e| e.to_string())?;
        for (from, to) in edits {
            text = text.replacen(from, to, 1);
        }
        std::fs::write(data.config(), text).map_err(|e| e.to_string())?;
        for (name, text) in files {
            std::fs::write(data.root().join(name), text).map_err(|e| format!("writing {name}: {e}"))?;
        }
        let nats = ManagedNats::start(NatsServerConfig {
            bin: find_nats_server().map_err(|e| e.to_string())?,
            dir: dir.path().join("nats"),
            users: Vec::new(),
            restart_min: Duration::from_millis(100),
            restart_max: Duration::from_secs(1),
        })
        .await
        .map_err(|e| e.to_string())?;
        Sandbox::launch(dir, data, nats).await
    }

    /// Starts the daemon again on a stopped sandbox's workspace and server (after its
    /// database was filled, say).
    pub async fn resume(stopped: Stopped) -> Result<Sandbox, String> {
        Sandbox::launch(stopped._dir, stopped.data, stopped.nats).await
    }

    /// The daemon in this process on an initialised workspace, and the benchmark's clients.
    async fn launch(dir: tempfile::TempDir, data: DataDir, nats: ManagedNats) -> Result<Sandbox, String> {
        let config = Config::load(&data.config()).map_err(|e| e.to_string())?;
        let credential = |id: &str| -> Result<canopy_config::RunnerCredential, String> {
            canopy_config::credentials::read(&data.runner_credential(id)).map_err(|e| e.to_string())
        };
        let (bench_runner, fake_credential) = (credential(BENCH_RUNNER)?, credential(FAKE_RUNNER)?);
        let (stop, stopped) = oneshot::channel::<()>();
        let (client, in_process) = oneshot::channel::<ApiClient>();
        let daemon_options = canopy_daemon::DaemonOptions {
            dir: data.clone(),
            git: canopy_runner::wiring::git(&config, data.root()),
            config: config.clone(),
            nats_url: Some(nats.url().to_owned()),
            embedded: Some(Box::new(canopy_runner::wiring::embedded)),
            web: None,
            client: Some(client),
            check_script: canopy_harness::scripted::check_script,
        };
        let daemon = tokio::spawn(canopy_daemon::run(daemon_options, async move {
            let _ = stopped.await;
        }));
        let deadline = Instant::now() + Duration::from_secs(120);
        let info = loop {
            if let Ok(info) = canopy_config::read_connection_info(&data) {
                break info;
            }
            if Instant::now() > deadline {
                return Err("the daemon did not start".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let subjects = Subjects::new(&info.workspace_id);
        let login = Login { read: None, inbox: Some(subjects.inbox(canopy_proto::Party::Operator)) };
        let bus = Bus::connect(nats.url(), &login, "canopy-bench", false).await.map_err(|e| e.to_string())?;
        let api = ApiClient::new(bus, subjects, Duration::from_secs(30));
        let operator = std::fs::read_to_string(data.operator_token())
            .map(|t| t.trim().to_owned())
            .map_err(|e| format!("{}: {e}", data.operator_token().display()))?;
        // A resumed workspace may still hold the previous daemon's `daemon.json`: wait for
        // this one to answer.
        while api.send::<method::Whoami>(&operator, &WhoamiRequest {}).await.is_err() {
            if Instant::now() > deadline {
                return Err("the daemon did not answer".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let in_process = in_process.await.map_err(|_| "the daemon gave no client in this process".to_owned())?;
        let raw = Store::open(&dir.path().join("raw.db"), 4096).map_err(|e| e.to_string())?;
        canopy_store::bench::prepare(&raw).await.map_err(|e| e.to_string())?;
        let reader = Store::open(&data.db(), 16).map_err(|e| e.to_string())?;
        Ok(Sandbox {
            in_process,
            operator,
            runner_token: fake_credential.token,
            bench_runner,
            api,
            data,
            config,
            nats,
            daemon,
            stop,
            raw,
            raw_posts: tokio::sync::OnceCell::new(),
            reader,
            _dir: dir,
        })
    }

    /// The workspace's data directory.
    pub fn data(&self) -> &DataDir {
        &self.data
    }

    pub async fn stop(self) {
        self.stop_daemon().await.nats.shutdown().await;
    }

    /// Stops the in-process daemon and closes the stores, keeping the server and the
    /// workspace (for a figure that restarts the daemon as its own process).
    pub async fn stop_daemon(self) -> Stopped {
        let _ = self.stop.send(());
        let _ = self.daemon.await;
        self.raw.close().await;
        self.reader.close().await;
        Stopped { nats: self.nats, data: self.data, operator: self.operator, _dir: self._dir }
    }

    /// Creates `n` agents `<prefix>-<i>` (32 requests at a time); returns their home channels.
    /// With `stopped`, their sessions are stopped at once, so no runner starts them.
    pub async fn create_agents(&self, prefix: &str, n: usize, stopped: bool) -> Result<Vec<String>, String> {
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
                    repo: None,
                };
                let account: canopy_core::Account = self
                    .api
                    .send::<method::AgentsCreate>(&self.operator, &request)
                    .await
                    .map_err(|e| format!("creating {handle}: {e}"))?;
                if stopped {
                    let stop = AgentsStartStopRequest { handle: handle.clone() };
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
        let options = canopy_runner::wiring::options(
            &self.data,
            &self.config,
            self.api.clone(),
            &self.bench_runner,
            &self.data.runner_credential(BENCH_RUNNER),
        )
        .map_err(|e| e.to_string())?;
        canopy_runner::spawn(options).await.map_err(|e| e.to_string())
    }

    /// Registers the stand-in runner once every real runner has expired; returns how many
    /// sessions (online agents) it holds.
    pub async fn fake_runner_sync(&self, capacity: u32) -> Result<usize, String> {
        tokio::time::sleep(self.config.runner.runner_ttl + Duration::from_millis(300)).await;
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
        tokio::time::sleep(self.config.runner.runner_ttl + Duration::from_millis(300)).await;
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

    pub async fn row_count(&self) -> Result<u64, String> {
        canopy_store::bench::row_count(&self.reader).await.map_err(|e| e.to_string())
    }

    /// Sequential NATS request round trips to an echo responder.
    pub async fn raw_round_trips(&self, samples: usize) -> Result<Vec<std::time::Duration>, String> {
        let bus = self.api.bus.clone();
        let mut echo = bus.serve("bench.echo", "bench").await.map_err(|e| e.to_string())?;
        let responder = bus.clone();
        let server = tokio::spawn(async move {
            while let Some(request) = echo.next().await {
                if let Some(reply) = request.reply {
                    let _ = responder.publish(&reply, request.payload).await;
                }
            }
        });
        bus.flush().await.map_err(|e| e.to_string())?;
        let mut times = Vec::with_capacity(samples);
        for _ in 0..samples {
            let started = Instant::now();
            bus.request("bench.echo", None, payload(300), Duration::from_secs(5)).await.map_err(|e| e.to_string())?;
            times.push(started.elapsed());
        }
        server.abort();
        times.sort();
        Ok(times)
    }

    /// NATS requests that each commit one row through the store's writer, then reply.
    pub async fn raw_commit_throughput(&self, concurrency: usize, total: usize) -> Result<f64, String> {
        let bus = self.api.bus.clone();
        let mut requests = bus.serve("bench.commit", "bench").await.map_err(|e| e.to_string())?;
        let (responder, store) = (bus.clone(), self.raw.clone());
        let server = tokio::spawn(async move {
            while let Some(request) = requests.next().await {
                let (responder, store) = (responder.clone(), store.clone());
                tokio::spawn(async move {
                    let _ = canopy_store::bench::insert(&store, request.payload.to_vec()).await;
                    if let Some(reply) = request.reply {
                        let _ = responder.publish(&reply, bytes::Bytes::from_static(b"{}")).await;
                    }
                });
            }
        });
        let rate = request_rate(&bus, "bench.commit", concurrency, total, |_| payload(300)).await;
        server.abort();
        rate
    }

    /// NATS requests that each run the writer job of one post (`ops::post_and_reach`, on
    /// the raw store made a workspace with `concurrency` agents), then reply: the post's
    /// commit without the daemon's handling around it, one channel per caller.
    pub async fn post_job_throughput(&self, concurrency: usize, total: usize) -> Result<f64, String> {
        let (caller, channels) = self
            .raw_posts
            .get_or_try_init(|| canopy_store::bench::prepare_posts(&self.raw, concurrency))
            .await
            .map_err(|e| e.to_string())?;
        let specs: std::sync::Arc<Vec<canopy_store::PostSpec>> = std::sync::Arc::new(
            channels
                .iter()
                .enumerate()
                .map(|(i, channel)| {
                    Ok(canopy_store::PostSpec {
                        channel: channel.clone(),
                        topic: canopy_core::TopicName::parse("bench").map_err(|e| e.to_string())?,
                        body: crate::poster_body(i),
                        create_topic: true,
                        idempotency_key: None,
                        ack_only: false,
                        wake: false,
                    })
                })
                .collect::<Result<_, String>>()?,
        );
        let bus = self.api.bus.clone();
        let mut requests = bus.serve("bench.post-job", "bench").await.map_err(|e| e.to_string())?;
        let (responder, store, caller) = (bus.clone(), self.raw.clone(), caller.clone());
        let server = tokio::spawn(async move {
            while let Some(request) = requests.next().await {
                let (responder, store, caller, specs) =
                    (responder.clone(), store.clone(), caller.clone(), specs.clone());
                tokio::spawn(async move {
                    let channel = std::str::from_utf8(&request.payload).ok().and_then(|s| s.parse::<usize>().ok());
                    let Some(spec) = channel.and_then(|i| specs.get(i)).cloned() else { return };
                    if canopy_store::bench::post(&store, caller, spec).await.is_ok()
                        && let Some(reply) = request.reply
                    {
                        let _ = responder.publish(&reply, bytes::Bytes::from_static(b"{}")).await;
                    }
                });
            }
        });
        let rate =
            request_rate(&bus, "bench.post-job", concurrency, total, |i| bytes::Bytes::from(i.to_string())).await;
        server.abort();
        rate
    }

    /// Publishes `count` messages and waits until a subscriber has all of them. A burst the
    /// server cut short (core NATS drops for a consumer it finds slow, and the benchmark's
    /// subscriber shares two cores with everything else) is measured again, at most thrice.
    pub async fn raw_publish_burst(&self, count: usize) -> Result<std::time::Duration, String> {
        let mut lost = String::new();
        for _ in 0..3 {
            match self.raw_publish_burst_once(count).await {
                Ok(took) => return Ok(took),
                Err(e) => lost = e,
            }
        }
        Err(lost)
    }

    async fn raw_publish_burst_once(&self, count: usize) -> Result<std::time::Duration, String> {
        let bus = self.api.bus.clone();
        let mut sub = bus.subscribe("bench.burst").await.map_err(|e| e.to_string())?;
        bus.flush().await.map_err(|e| e.to_string())?;
        let started = Instant::now();
        for _ in 0..count {
            bus.publish("bench.burst", payload(64)).await.map_err(|e| e.to_string())?;
        }
        bus.flush().await.map_err(|e| e.to_string())?;
        let mut received = 0;
        while received < count {
            match tokio::time::timeout(Duration::from_secs(2), sub.next()).await {
                Ok(Some(_)) => received += 1,
                _ => return Err(format!("the raw burst lost messages ({received} of {count})")),
            }
        }
        Ok(started.elapsed())
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
    }
}

/// Runs git in `dir` as the operator would (a fixed identity), for the repositories the bench
/// and `canopy demo` make: its stdout, or what failed.
pub fn operator_git(dir: &std::path::Path, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "Demo Operator")
        .env("GIT_AUTHOR_EMAIL", "operator@example.com")
        .env("GIT_COMMITTER_NAME", "Demo Operator")
        .env("GIT_COMMITTER_EMAIL", "operator@example.com")
        .output()
        .map_err(|e| format!("running git: {e}"))?;
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
        false => Err(format!("git {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())),
    }
}

/// `concurrency` clients sending `total` requests in all to `subject` (client `i` sends
/// `payload(i)` each time), each waiting for its reply; requests per second.
async fn request_rate(
    bus: &Bus,
    subject: &'static str,
    concurrency: usize,
    total: usize,
    payload: impl Fn(usize) -> bytes::Bytes,
) -> Result<f64, String> {
    bus.flush().await.map_err(|e| e.to_string())?;
    let started = Instant::now();
    let clients: Vec<_> = (0..concurrency)
        .map(|i| {
            let (bus, payload) = (bus.clone(), payload(i));
            tokio::spawn(async move {
                for _ in 0..total / concurrency {
                    bus.request(subject, None, payload.clone(), Duration::from_secs(10))
                        .await
                        .map_err(|e| format!("{subject}: {e}"))?;
                }
                Ok::<_, String>(())
            })
        })
        .collect();
    for client in clients {
        client.await.map_err(|e| e.to_string())??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}
