//! Authorization below and at the API: each NATS login connects and is refused what it may
//! not do (on the daemon's managed server, and on an external server configured with
//! `canopy nats-config`), rotation and revocation close what they replace, and a runner on
//! a second data directory joins with nothing but its credential file.

use std::process::Stdio;
use std::time::Duration;

use canopy_bus::{Bus, ConnectionEvent, Login};
use canopy_proto::{Method, Subjects};
use serde_json::Value;

use crate::env::{Guarded, TestEnv};

/// The managed server's URL and the workspace's subjects, from `daemon.json`.
fn managed(env: &TestEnv) -> (String, Subjects) {
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(env.data_dir().join("daemon.json")).unwrap()).unwrap();
    (info["nats_url"].as_str().unwrap().to_owned(), Subjects::new(info["workspace_id"].as_str().unwrap()))
}

/// A login's user and password from its file (a NATS login or a runner credential).
fn login_of(env: &TestEnv, file: &str) -> (String, String) {
    canopy_config::credentials::read_login(&env.data_dir().join(file)).unwrap()
}

fn connect(env: &TestEnv, url: &str, login: (String, String), inbox: String) -> Result<Bus, String> {
    let login = Login::fixed(&login.0, &login.1, Some(inbox));
    env.rt.block_on(Bus::connect(url, &login, "authz-test", false)).map_err(|e| e.to_string())
}

/// Subscribes to `subject` and says whether the server refused it (it answers a refusal
/// with an error on the connection; an accepted one is proven by a flush without one).
fn may_subscribe(env: &TestEnv, bus: &Bus, subject: &str) -> bool {
    refused(env, bus, |bus| {
        env.rt.block_on(async {
            let _subscription = bus.subscribe(subject).await.unwrap();
            bus.flush().await.unwrap();
        })
    })
    .is_none()
}

fn may_publish(env: &TestEnv, bus: &Bus, subject: &str) -> bool {
    refused(env, bus, |bus| env.rt.block_on(async { bus.publish(subject, bytes::Bytes::new()).await.unwrap() }))
        .is_none()
}

/// Runs `act` and returns the refusal the server sent for it, if any.
fn refused(env: &TestEnv, bus: &Bus, act: impl FnOnce(&Bus)) -> Option<String> {
    let mut events = bus.connection_events();
    act(bus);
    env.rt.block_on(async {
        // A refusal comes back in the round trip of a flush; a PING after it proves none came.
        let _ = bus.flush().await;
        tokio::time::timeout(Duration::from_millis(300), async {
            loop {
                match events.recv().await {
                    Ok(ConnectionEvent::Refused(why)) => return Some(why),
                    Ok(_) => {}
                    Err(_) => return None,
                }
            }
        })
        .await
        .ok()
        .flatten()
    })
}

#[test]
fn each_nats_login_may_do_only_its_part_on_the_managed_server() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.spawn_daemon(&["daemon"]);
    let (url, s) = managed(&env);
    let embedded = canopy_core::RunnerId::parse("embedded").unwrap();
    let second = canopy_core::RunnerId::parse("second").unwrap();
    env.runner_credential("second");

    // No login, or a wrong password: not even a connection.
    let open = env.rt.block_on(Bus::connect(&url, &Login::open(), "authz-test", false));
    assert!(open.is_err(), "the managed server took a client without credentials");
    let (user, _) = login_of(&env, "credentials/nats-operator.json");
    assert!(connect(&env, &url, (user, "wrong".into()), s.inbox(canopy_proto::Party::Operator)).is_err());

    // An operator client requests and reads events; it cannot serve the API, ring a runner,
    // hear a runner's steers, or read another party's replies.
    // The `runners add` above reloads the server a moment later; a connect that meets the
    // reload mid-handshake is refused once, so this one retries.
    let mut operator;
    crate::assert_eventually!(
        {
            operator = connect(
                &env,
                &url,
                login_of(&env, "credentials/nats-operator.json"),
                s.inbox(canopy_proto::Party::Operator),
            )
            .ok();
            operator.is_some()
        },
        "the operator login never connected"
    );
    let operator = operator.unwrap();
    let whoami = canopy_bus::ApiClient::new(operator.clone(), s.clone(), Duration::from_secs(5));
    let who = env.rt.block_on(whoami.send::<canopy_proto::method::Whoami>(&env.token(), &Default::default()));
    assert!(who.is_ok(), "the operator login cannot make a request: {who:?}");
    assert!(may_subscribe(&env, &operator, &s.message_events_all()));
    assert!(!may_subscribe(&env, &operator, &s.api_wildcard()), "an operator login could answer API requests");
    assert!(!may_subscribe(&env, &operator, &s.runner_steer(&embedded)));
    assert!(!may_publish(&env, &operator, &s.runner_deliver(&embedded)), "an operator login rang a runner");
    assert!(!may_publish(&env, &operator, &s.message_event("announcements")), "an operator login faked an event");
    assert!(!may_subscribe(&env, &operator, &format!("{}.>", s.inbox(canopy_proto::Party::Runner(&second)))));

    // A runner's login: its own subjects and the poke; not the API, not another runner's.
    let runner = connect(
        &env,
        &url,
        login_of(&env, "credentials/runners/second.json"),
        s.inbox(canopy_proto::Party::Runner(&second)),
    )
    .unwrap();
    assert!(may_subscribe(&env, &runner, &s.runner_steer(&second)));
    assert!(may_subscribe(&env, &runner, &s.runner_poke()));
    assert!(!may_subscribe(&env, &runner, &s.api_wildcard()), "a runner login could answer API requests");
    assert!(!may_subscribe(&env, &runner, &s.runner_steer(&embedded)), "a runner heard another's steers");
    assert!(!may_subscribe(&env, &runner, &s.message_events_all()), "a runner read every channel's events");
    assert!(!may_publish(&env, &runner, &s.runner_deliver(&embedded)), "a runner rang another runner");
    assert!(!may_publish(&env, &runner, &s.api(Method::AgentsCreate)), "a runner requested an operator method");
    assert!(may_publish(&env, &runner, &s.api(Method::MessagesPost)), "a runner cannot forward a tool call");

    // The runner joins with its credential and hosts sessions.
    let _second = env.spawn_registered_runner(env.command(&["runner", "--id", "second"]), "second");

    // Rotation: the old logins stop working, everyone on this machine logs in again.
    let old_operator = login_of(&env, "credentials/nats-operator.json");
    let old_runner_token = env.runner_token("second");
    env.ok(&["credentials", "rotate"]);
    crate::assert_eventually!(
        connect(&env, &url, old_operator.clone(), s.inbox(canopy_proto::Party::Operator)).is_err(),
        "the old operator login still connects after a rotation"
    );
    crate::assert_eventually!(env.run(&["whoami"]).status.success(), "the CLI did not log in with the new login");
    assert_ne!(env.runner_token("second"), old_runner_token);
    env.ok(&["post", "--channel", "announcements", "--topic", "t", "--create-topic", "after the rotation"]);
    let audit = env.ok(&["--json", "audit"]);
    assert!(audit.contains("credentials.rotate") && audit.contains("runners.add"), "{audit}");

    // Revocation: the runner's login and token are gone.
    let revoked = login_of(&env, "credentials/runners/second.json");
    env.ok(&["runners", "remove", "second"]);
    crate::assert_eventually!(
        connect(&env, &url, revoked.clone(), s.inbox(canopy_proto::Party::Runner(&second))).is_err(),
        "a revoked runner still connects"
    );
}

/// A free loopback port (bound, then released for the server to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `nats-server` with `canopy nats-config`'s block, as an operator would run it.
fn external_server(env: &TestEnv, port: u16) -> Guarded {
    let conf = env.dir.path().join("external.conf");
    let block = env.ok(&["nats-config"]);
    std::fs::write(&conf, format!("listen: 127.0.0.1:{port}\n{block}")).unwrap();
    let server = Guarded(
        std::process::Command::new(canopy_bus::find_nats_server().unwrap())
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    crate::assert_eventually!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(), "nats-server did not start");
    server
}

#[test]
fn an_external_server_set_up_by_nats_config_takes_a_runner_from_a_second_directory() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    let block = env.ok(&["nats-config"]);
    assert!(block.contains("$2b$04$") && !block.contains(&login_of(&env, "credentials/nats-daemon.json").1), "{block}");
    let port = free_port();
    let url = format!("nats://127.0.0.1:{port}");
    let mut server = external_server(&env, port);
    env.spawn_daemon(&["daemon", "--nats-url", &url]);
    assert!(
        env.rt.block_on(Bus::connect(&url, &Login::open(), "authz-test", false)).is_err(),
        "the configured server took a client without credentials"
    );

    // A runner for another machine: its file, the server told, a second data directory.
    let file = env.dir.path().join("far.json");
    let added = env.json(&["runners", "add", "far", "--out", file.to_str().unwrap()]);
    assert_eq!(added["applied"], false, "an external server cannot have applied it: {added}");
    drop(server);
    server = external_server(&env, port);
    let far = env.dir.path().join("far-data");
    std::fs::create_dir_all(&far).unwrap();
    let mut command = std::process::Command::new(crate::env::CANOPY);
    command.arg("--dir").arg(&far).args(["runner", "--credentials", file.to_str().unwrap(), "--nats-url", &url]);
    command.env_remove("CANOPY_DIR");
    let _runner = env.spawn_registered_runner(command, "far");
    drop(server);
}

/// Who the matrix calls every method as, in `canopy_proto::access::CALLERS` order.
struct World {
    env: TestEnv,
    bus: Bus,
    subjects: Subjects,
    /// One token per caller kind; `None` sends no token at all.
    tokens: Vec<Option<String>>,
    /// A message in `#home-lead`, for the board.
    seq: u64,
    counter: std::cell::Cell<u32>,
    /// The fixture number of the one agent the reparent row moves.
    reparented: std::cell::Cell<Option<u32>>,
    /// A run of lead's (started once), for the run-branch methods.
    lead_run: std::cell::Cell<Option<i64>>,
}

const IDLE: &str = "";

/// The script of an implementer run that stays out (its token must be live for the matrix).
const LINGERING_RUN: &str = "[[rule]]\nmatch = { kind = \"start\" }\nactions = [{ sleep = \"600s\" }]\n";

impl World {
    fn new() -> World {
        let linger = tempfile::Builder::new()
            .prefix("linger-")
            .suffix(".toml")
            .tempfile()
            .unwrap()
            .into_temp_path()
            .keep()
            .unwrap();
        std::fs::write(&linger, LINGERING_RUN).unwrap();
        let run_script = format!("script = {:?}", linger.display().to_string());
        let mut edits: Vec<(&str, &str)> = crate::sessions::FAST.to_vec();
        edits.push(("script = \"implementer.toml\"", &run_script));
        edits.extend([
            ("max_pending_requests = 3", "max_pending_requests = 100"),
            ("max_children = 8", "max_children = 100"),
            ("max_per_manager = 4", "max_per_manager = 100"),
        ]);
        let env = TestEnv::started_with(&edits);
        env.create_scripted("lead", IDLE);
        env.create_scripted("other", IDLE);
        env.create_scripted("retired", IDLE);
        env.create_scripted("spare", IDLE);
        let lint = env.script("lint.toml", IDLE);
        env.json(&["agents", "create", "--handle", "lint", "--name", "lint", "--parent", "lead", "--script", &lint]);
        env.ok(&["channels", "create", "matrix"]);
        let token = |handle: &str| session_token(&env, handle);
        let (supervisor, lead, lint, other, retired) =
            (token("supervisor"), token("lead"), token("lint"), token("other"), token("retired"));
        let bus = env.bus();
        let subjects = env.subjects();
        let started = crate::wire::request(
            &env,
            &bus,
            &subjects.api(Method::RunsStart),
            Some(&lead),
            br#"{"definition": "implementer", "brief": "stay out for the matrix"}"#,
        );
        assert!(started.get("ok").is_some(), "{started}");
        // A run's activity shows under its Manager.
        let mut run_pid;
        crate::assert_eventually!(
            {
                run_pid = env
                    .activity("lead")
                    .iter()
                    .find(|i| i["kind"] == "session_ready" && i["agent"] == "run-1")
                    .and_then(|i| i["detail"]["pid"].as_u64());
                run_pid.is_some()
            },
            "run-1 never became ready"
        );
        let run = crate::sessions::process_env(run_pid.unwrap() as u32)["CANOPY_MCP_TOKEN"].clone();
        env.ok(&["agents", "stop", "retired"]);
        crate::assert_eventually!(
            env.roster_entry("retired")["presence"] != "idle",
            "retired's session never ended: {}",
            env.roster_entry("retired")
        );
        let runner = env.runner_token("matrix");
        let posted = env.json(&["post", "--channel", "home-lead", "--topic", "matrix", "--create-topic", "pin me"]);
        let seq = posted["message"]["seq"].as_u64().unwrap();
        let tokens = vec![
            Some(env.token()),
            Some(supervisor),
            Some(lead),
            Some(lint),
            Some(other),
            Some(run),
            Some(runner),
            Some(retired),
            None,
            Some("cnp_not-a-token".to_owned()),
        ];
        World {
            env,
            bus,
            subjects,
            tokens,
            seq,
            counter: std::cell::Cell::new(0),
            reparented: std::cell::Cell::new(None),
            lead_run: std::cell::Cell::new(None),
        }
    }

    /// One request, with time to spare: the matrix starts a few dozen sessions on two cores.
    fn call(&self, method: Method, token: Option<&str>, request: &Value) -> Value {
        let subject = self.subjects.api(method);
        let payload = bytes::Bytes::from(request.to_string());
        let reply = self
            .env
            .rt
            .block_on(self.bus.request(&subject, token, payload, Duration::from_secs(30)))
            .unwrap_or_else(|e| panic!("{subject}: no reply to {request}: {e}"));
        serde_json::from_slice(&reply).unwrap_or_else(|e| panic!("{subject}: reply is not JSON ({e})"))
    }

    /// Calls as the operator (or `lead`), which must succeed.
    fn setup(&self, method: Method, caller: usize, request: Value) -> Value {
        let reply = self.call(method, self.tokens[caller].as_deref(), &request);
        reply.get("ok").cloned().unwrap_or_else(|| panic!("setting up with {}: {reply}", method.as_str()))
    }

    fn fresh(&self) -> u32 {
        self.counter.set(self.counter.get() + 1);
        self.counter.get()
    }

    /// The request that tries `method` as a caller against `lead`'s resources (setting up
    /// whatever it consumes: a pending request to decide, an agent to despawn, a pin).
    fn request(&self, method: Method) -> Value {
        use serde_json::json;
        let n = self.fresh();
        let idle = json!({ "name": "idle.toml", "text": "" });
        let spawn = |handle: String| {
            let request = json!({ "handle": handle, "name": "Child", "charter": "c", "reason": "matrix" });
            self.setup(Method::SpawnRequest, 2, request)["id"].clone()
        };
        // A fresh issue of lead's, filed by the operator.
        let lead_issue = || {
            let request = json!({ "title": format!("lead's issue {n}"), "owner": "lead" });
            self.setup(Method::IssuesCreate, 0, request)["number"].clone()
        };
        let victim = || {
            let handle = format!("victim-{n}");
            let request =
                json!({ "handle": handle, "name": "Victim", "parent": "lead", "harness": "scripted", "script": idle });
            self.setup(Method::AgentsCreate, 0, request);
            handle
        };
        match method {
            Method::MessagesPost => {
                json!({ "channel": "home-lead", "topic": "matrix", "body": format!("post {n}"), "create_topic": true })
            }
            Method::MessagesRead | Method::TopicsList | Method::BoardList => json!({ "channel": "home-lead" }),
            Method::ChannelsList
            | Method::Tree
            | Method::Roster
            | Method::HistorySearch
            | Method::Whoami
            | Method::AgentsList
            | Method::MessagesSync
            | Method::SpawnList
            | Method::AuditList
            | Method::Usage
            | Method::UsageSeries
            | Method::CredentialsRotate => json!({}),
            Method::AgentsSetActivity => json!({ "text": format!("matrix {n}") }),
            Method::AgentsBudget => json!({ "handle": "lead" }),
            Method::ChannelsSubscribe | Method::ChannelsUnsubscribe => json!({ "channel": "matrix" }),
            Method::ChannelsOpenDirect => json!({ "peer": "lead" }),
            Method::BoardPin => json!({ "channel": "home-lead", "seq": self.seq }),
            Method::BoardUnpin => {
                let posted = self.setup(
                    Method::MessagesPost,
                    0,
                    json!({ "channel": "home-lead", "topic": "matrix", "body": format!("pinned {n}") }),
                );
                let seq = posted["message"]["seq"].clone();
                self.setup(Method::BoardPin, 0, json!({ "channel": "home-lead", "seq": seq }));
                json!({ "channel": "home-lead", "seq": seq })
            }
            Method::SpawnRequest => {
                json!({ "handle": format!("child-{n}"), "name": "Child", "charter": "c", "reason": "matrix" })
            }
            Method::SpawnCancel => json!({ "id": spawn(format!("cancel-{n}")) }),
            Method::SpawnDecide => json!({ "id": spawn(format!("decide-{n}")), "approve": false, "reason": "matrix" }),
            Method::AgentsDespawn => json!({ "handle": victim() }),
            // One victim for every caller: only the operator's move succeeds, the rest are refused.
            Method::AgentsReparent => {
                if self.reparented.get().is_none() {
                    self.reparented.set(Some(n));
                    victim();
                }
                let n = self.reparented.get().unwrap_or(n);
                json!({ "handle": format!("victim-{n}"), "parent": "other" })
            }
            Method::RunsStart => json!({ "definition": "implementer", "brief": format!("matrix {n}") }),
            Method::RunsMerge | Method::RunsDiscard => {
                if self.lead_run.get().is_none() {
                    let run =
                        self.setup(Method::RunsStart, 2, json!({ "definition": "implementer", "brief": "matrix" }));
                    self.lead_run.set(run["run"]["id"].as_i64());
                }
                json!({ "run_id": self.lead_run.get().unwrap_or(0) })
            }
            Method::WorkspaceStatus | Method::ReposList | Method::ReposGc | Method::MergesList => json!({}),
            Method::MergesRequest => json!({ "title": format!("matrix {n}"), "summary": "s" }),
            Method::MergesDecide => json!({ "id": "merge-999", "approve": true }),
            Method::MergesShow => json!({ "id": "merge-999" }),
            Method::MergesQueue | Method::ChecksList | Method::ChecksStatus => json!({}),
            Method::ChecksLog => json!({ "id": "check-999" }),
            Method::ReviewsRequest => json!({ "merge_request": "merge-999" }),
            Method::ReviewsSubmit => json!({ "verdict": "approve", "summary": "matrix" }),
            Method::ReposAdd => json!({ "name": format!("repo-{n}"), "source": "/nonexistent/matrix" }),
            Method::IssuesList | Method::IssuesExport => json!({}),
            Method::IssuesCreate => json!({ "title": format!("matrix {n}"), "owner": "lead" }),
            Method::IssuesShow => json!({ "issue": lead_issue() }),
            Method::IssuesComment => json!({ "issue": lead_issue(), "text": format!("comment {n}") }),
            Method::IssuesAssign => json!({ "issue": lead_issue(), "owner": "lint" }),
            Method::IssuesUpdate => json!({ "issue": lead_issue(), "labels": ["matrix"] }),
            Method::IssuesBudget => json!({ "issue": lead_issue(), "usd": 5.0 }),
            Method::IssuesImport => json!({ "source": format!("matrix-{n}"), "issues": [] }),
            Method::PromptsSkill => json!({ "name": "comms-playbook" }),
            Method::PromptsRule => json!({ "name": "never-merge" }),
            Method::AgentsCreate => {
                json!({ "handle": format!("made-{n}"), "name": "Made", "harness": "scripted", "script": idle })
            }
            Method::AgentsShow => json!({ "handle": "lead" }),
            Method::ChannelsCreate => json!({ "name": format!("made-{n}"), "kind": "general" }),
            Method::AgentsStart | Method::AgentsStop => json!({ "handle": "spare" }),
            Method::ActivityRead => json!({ "agent": "lead" }),
            Method::TopicsRename => {
                let topic = format!("rename-{n}");
                self.setup(
                    Method::MessagesPost,
                    0,
                    json!({ "channel": "home-lead", "topic": topic, "body": "x", "create_topic": true }),
                );
                json!({ "channel": "home-lead", "topic": topic, "to": format!("renamed-{n}") })
            }
            Method::TopicsResolve => json!({ "channel": "home-lead", "topic": "matrix", "resolved": true }),
            Method::PromptsRender | Method::RunsList => json!({ "agent": "lead" }),
            Method::AgentsInterrupt => json!({ "handle": "lead" }),
            Method::RunnersAdd => json!({ "id": format!("added-{n}") }),
            Method::OperatorsAdd => json!({ "handle": format!("op-{n}") }),
            Method::OperatorsList | Method::RunnersList => json!({}),
            // Taking back a runner that is not drained changes nothing the matrix relies on.
            Method::RunnersDrain => json!({ "id": "embedded", "drain": false }),
            Method::OperatorsRevoke => {
                let handle = format!("gone-{n}");
                self.setup(Method::OperatorsAdd, 0, json!({ "handle": handle }));
                json!({ "handle": handle })
            }
            Method::RunnersRemove => {
                let id = format!("removed-{n}");
                self.setup(Method::RunnersAdd, 0, json!({ "id": id }));
                json!({ "id": id })
            }
            Method::RunnersSync => json!({
                "runner_id": "matrix", "boot": "matrix", "name": "matrix", "mcp_url": "http://127.0.0.1:1/mcp",
                "capacity": 0, "running": []
            }),
            Method::SessionsReport => json!({ "runner_id": "matrix", "reports": [] }),
            Method::DeliveriesPull => json!({ "runner_id": "matrix", "agent": "lead", "incarnation": 1 }),
            Method::DeliveriesAck => json!({ "runner_id": "matrix", "agent": "lead", "incarnation": 1, "seqs": [] }),
            Method::RunsFinish => json!({ "agent": "run-1", "incarnation": 1, "status": "done", "report": "forged" }),
            Method::SessionsContinuity => {
                json!({ "runner_id": "matrix", "agent": "lead", "incarnation": 1, "when": "start" })
            }
        }
    }
}

/// The answer's code: `ok`, or the error's.
fn code(reply: &Value) -> String {
    if reply.get("ok").is_some() { "ok".to_owned() } else { reply["error"]["code"].as_str().unwrap_or("?").to_owned() }
}

#[test]
fn the_authorization_matrix_holds_for_every_method_and_caller() {
    let world = World::new();
    // Rotation last: it replaces the runner token the runner column uses.
    let mut methods: Vec<Method> = Method::ALL.iter().copied().filter(|m| *m != Method::CredentialsRotate).collect();
    methods.push(Method::CredentialsRotate);
    assert_eq!(world.tokens.len(), canopy_proto::access::CALLERS.len());
    let mut wrong = Vec::new();
    for method in methods {
        let expected = canopy_proto::access::matrix(method);
        for (caller, want) in expected.iter().enumerate() {
            let request = world.request(method);
            let reply = world.call(method, world.tokens[caller].as_deref(), &request);
            let got = code(&reply);
            if got != *want {
                let who = canopy_proto::access::CALLERS[caller];
                wrong.push(format!("{} as {who}: wanted {want}, got {reply}", method.as_str()));
            }
        }
    }
    assert!(wrong.is_empty(), "the matrix does not hold:\n{}", wrong.join("\n"));

    // Beyond the matrix: a runner's token cannot speak for another runner.
    let forged = serde_json::json!({
        "runner_id": "embedded", "boot": "x", "name": "x", "mcp_url": "http://127.0.0.1:1/mcp", "capacity": 0, "running": []
    });
    let reply = world.call(Method::RunnersSync, world.tokens[6].as_deref(), &forged);
    assert_eq!(code(&reply), "forbidden", "{reply}");
    // After the rotation (the last row), the embedded runner still delivers, on its new token.
    let env = &world.env;
    env.ok(&["post", "--channel", "home-lead", "--topic", "after", "--create-topic", "still delivered"]);
    env.settled("lead");
}

/// A live session's token, as its harness holds it.
pub(crate) fn session_token(env: &TestEnv, handle: &str) -> String {
    let pid = env.wait_harness_pid(handle, 1);
    crate::sessions::process_env(pid)["CANOPY_MCP_TOKEN"].clone()
}

/// Calls `method` with `token` and a JSON body.
fn call(env: &TestEnv, method: Method, token: &str, body: Value) -> Value {
    let bus = env.bus();
    crate::wire::request(env, &bus, &env.subjects().api(method), Some(token), body.to_string().as_bytes())
}

#[test]
fn pins_need_the_right_to_post_and_each_pin_and_unpin_is_audited() {
    use serde_json::json;
    let env = TestEnv::started_with(crate::sessions::FAST);
    env.create_scripted("lead", IDLE);
    let lead = session_token(&env, "lead");
    let broadcast = env.json(&["post", "--channel", "announcements", "--topic", "news", "--create-topic", "hello"]);
    let seq = broadcast["message"]["seq"].as_u64().unwrap();
    // Lead reads #announcements but may not speak there, so it may not pin there either.
    let refused = call(&env, Method::BoardPin, &lead, json!({ "channel": "announcements", "seq": seq }));
    assert_eq!(code(&refused), "forbidden", "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("pin to #announcements"), "{refused}");
    assert!(env.json(&["board", "--channel", "announcements"])["pins"].as_array().unwrap().is_empty());

    let own = env.json(&["post", "--channel", "home-lead", "--topic", "t", "--create-topic", "worth keeping"]);
    let own = own["message"]["seq"].as_u64().unwrap();
    assert_eq!(code(&call(&env, Method::BoardPin, &lead, json!({ "channel": "home-lead", "seq": own }))), "ok");
    env.ok(&["board", "--channel", "announcements", "pin", &seq.to_string()]);
    // Lead unpins its own pin; the operator's pin in its home is not lead's to take off.
    let second = env.json(&["post", "--channel", "home-lead", "--topic", "t", "second"]);
    let second = second["message"]["seq"].as_u64().unwrap();
    env.ok(&["board", "--channel", "home-lead", "pin", &second.to_string()]);
    let theirs = call(&env, Method::BoardUnpin, &lead, json!({ "channel": "home-lead", "seq": second }));
    assert_eq!(code(&theirs), "forbidden", "{theirs}");
    assert_eq!(code(&call(&env, Method::BoardUnpin, &lead, json!({ "channel": "home-lead", "seq": own }))), "ok");
    env.ok(&["board", "--channel", "home-lead", "unpin", &second.to_string()]);
    let audit = env.json(&["audit"]);
    let actions: Vec<(&str, &str)> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"].as_str().unwrap().starts_with("board."))
        .map(|e| (e["action"].as_str().unwrap(), e["actor"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(actions.iter().filter(|(a, _)| *a == "board.pin").count(), 3, "{audit}");
    assert_eq!(actions.iter().filter(|(a, _)| *a == "board.unpin").count(), 2, "{audit}");
}

#[test]
fn an_agent_sees_the_tree_around_it_and_a_bounded_roster() {
    use serde_json::json;
    let env = TestEnv::started_with(crate::sessions::FAST);
    for handle in ["lead", "other", "third"] {
        env.create_scripted(handle, IDLE);
    }
    let lint = env.script("lint.toml", IDLE);
    env.json(&["agents", "create", "--handle", "lint", "--name", "lint", "--parent", "lead", "--script", &lint]);
    let leaf = env.script("leaf.toml", IDLE);
    env.json(&["agents", "create", "--handle", "leaf", "--name", "leaf", "--parent", "lint", "--script", &leaf]);
    let lead = session_token(&env, "lead");

    let view = call(&env, Method::Tree, &lead, json!({ "depth": 1 }))["ok"]["root"].clone();
    assert_eq!(view["handle"], "supervisor", "{view}");
    let children: Vec<&str> =
        view["children"].as_array().unwrap().iter().map(|c| c["handle"].as_str().unwrap()).collect();
    assert_eq!(children[0], "lead", "the caller comes first: {view}");
    assert!(children.contains(&"other") && children.contains(&"third"), "{view}");
    let me = &view["children"][0];
    assert_eq!(me["children"][0]["handle"], "lint", "{view}");
    assert_eq!(me["children"][0]["omitted"], 1, "leaf is below the asked depth: {view}");
    let peer = view["children"].as_array().unwrap().iter().find(|c| c["handle"] == "other").unwrap();
    assert!(peer["children"].as_array().unwrap().is_empty(), "a peer's subtree is not the caller's: {view}");
    // The operator sees everything.
    let whole = env.json(&["tree"]);
    assert!(whole.to_string().contains("\"leaf\""), "{whole}");

    let page = call(&env, Method::Roster, &lead, json!({ "limit": 2 }))["ok"].clone();
    assert_eq!(page["agents"].as_array().unwrap().len(), 2, "{page}");
    assert!(page["more"].as_u64().unwrap() >= 3, "{page}");
    let last = page["agents"][1]["handle"].as_str().unwrap().to_owned();
    let next = call(&env, Method::Roster, &lead, json!({ "limit": 2, "after": last }))["ok"].clone();
    assert!(next["agents"][0]["handle"].as_str().unwrap() > last.as_str(), "{next}");
    let named = call(&env, Method::Roster, &lead, json!({ "handles": ["lint", "leaf"] }))["ok"].clone();
    assert_eq!(named["agents"].as_array().unwrap().len(), 2, "{named}");
    let bad = call(&env, Method::Roster, &lead, json!({ "presence": "asleep" }));
    assert_eq!(code(&bad), "invalid_argument", "{bad}");
}

#[test]
fn handles_named_for_tools_or_vendors_are_refused_with_the_rule() {
    use serde_json::json;
    let env = TestEnv::started_with(crate::sessions::FAST);
    let err = env.refused(&["agents", "create", "--handle", "aws-manager", "--name", "AWS"]);
    assert_eq!(err["field"], "handle", "{err}");
    assert!(err["message"].as_str().unwrap().contains("name the lane by its function"), "{err}");
    env.create_scripted("lead", IDLE);
    let lead = session_token(&env, "lead");
    let request = json!({ "handle": "claude-bot", "name": "Bot", "charter": "c", "reason": "r" });
    let refused = call(&env, Method::SpawnRequest, &lead, request);
    assert_eq!(code(&refused), "invalid_argument", "{refused}");
    assert_eq!(env.json(&["requests"])["requests"].as_array().unwrap().len(), 0, "a refused request was recorded");
    let fine = json!({ "handle": "release-manager", "name": "Release", "charter": "c", "reason": "r" });
    assert_eq!(code(&call(&env, Method::SpawnRequest, &lead, fine)), "ok");
}

#[test]
fn a_revoked_operator_is_refused_at_once_and_the_last_one_stays() {
    let env = TestEnv::started();
    let file = env.dir.path().join("second.token");
    env.ok(&["operators", "add", "second", "--out", file.to_str().unwrap()]);
    let second = std::fs::read_to_string(&file).unwrap().trim().to_owned();
    let whoami = || call(&env, Method::Whoami, &second, serde_json::json!({}));
    assert_eq!(code(&whoami()), "ok");
    assert_eq!(code(&whoami()), "ok", "now from the cache");
    env.ok(&["operators", "revoke", "second"]);
    assert_eq!(code(&whoami()), "forbidden", "a revoked token still worked");
    let last = env.refused(&["operators", "revoke", "ops"]);
    assert_eq!(last["code"], "conflict", "{last}");
    let list = env.json(&["operators", "list"]);
    let states: Vec<(&str, &str)> = list["operators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["handle"].as_str().unwrap(), o["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, [("ops", "active"), ("second", "revoked")]);
    assert!(env.ok(&["--json", "audit"]).contains("operators.revoke"));
}

/// A session's token works while its session lives and never after, however often it was
/// used before (the daemon keeps resolved session tokens only until a session or an account
/// changes): stopped, restarted as a new incarnation, despawned.
#[test]
fn a_session_token_dies_with_its_session_though_it_was_used_a_moment_before() {
    use serde_json::json;
    let env = TestEnv::started_with(crate::sessions::FAST);
    env.create_scripted("lead", IDLE);
    let first = session_token(&env, "lead");
    for _ in 0..3 {
        assert_eq!(call(&env, Method::Whoami, &first, json!({}))["ok"]["account"]["handle"], "lead");
    }
    env.json(&["agents", "stop", "lead"]);
    crate::assert_eventually!(env.roster_entry("lead")["presence"] == "offline", "lead never stopped");
    let refused = call(&env, Method::Whoami, &first, json!({}));
    assert_eq!(code(&refused), "forbidden", "a stopped session's token still works: {refused}");

    env.json(&["agents", "start", "lead"]);
    let pid = env.wait_harness_pid("lead", 2);
    let second = crate::sessions::process_env(pid)["CANOPY_MCP_TOKEN"].clone();
    assert_ne!(first, second);
    assert_eq!(call(&env, Method::Whoami, &second, json!({}))["ok"]["account"]["handle"], "lead");
    assert_eq!(code(&call(&env, Method::Whoami, &first, json!({}))), "forbidden", "the old incarnation's token works");

    env.ok(&["agents", "despawn", "lead", "--yes"]);
    let refused = call(&env, Method::Whoami, &second, json!({}));
    assert_eq!(code(&refused), "forbidden", "a despawned agent's token still works: {refused}");
}

/// Whether the managed server takes `login` right now: one connection, no retry.
fn takes(env: &TestEnv, login: &(String, String)) -> bool {
    let url = managed(env).0;
    env.rt.block_on(Bus::connect(&url, &Login::fixed(&login.0, &login.1, None), "authz-now", false)).is_ok()
}

#[test]
fn credential_changes_are_applied_when_the_command_returns_and_a_runner_waits_for_its_login() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    env.spawn_daemon(&["daemon"]);
    assert!(!takes(&env, &("nobody".into(), "nothing".into())), "the managed server takes any login");
    for round in 0..3 {
        let id = format!("box{round}");
        env.ok(&["runners", "add", &id]);
        let login = login_of(&env, &format!("credentials/runners/{id}.json"));
        assert!(takes(&env, &login), "round {round}: the server did not take {id}'s login when `runners add` returned");
        env.ok(&["runners", "remove", &id]);
        assert!(!takes(&env, &login), "round {round}: the server still took {id}'s login after `runners remove`");
    }
    let before = login_of(&env, "credentials/nats-operator.json");
    env.ok(&["credentials", "rotate"]);
    let after = login_of(&env, "credentials/nats-operator.json");
    assert_ne!(before, after);
    assert!(takes(&env, &after) && !takes(&env, &before), "the rotation was not applied when it returned");

    // `runners add` then at once `runner --id`: it registers.
    env.ok(&["runners", "add", "quick"]);
    let _quick = env.spawn_registered_runner(env.command(&["runner", "--id", "quick"]), "quick");

    // A login the server never learns: the runner tries for a while, then exits naming it.
    let file = env.data_dir().join("credentials/runners/quick.json");
    let mut credential: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    credential["nats"]["password"] = Value::from("not-the-password");
    credential["runner_id"] = Value::from("stranger");
    let stranger = env.dir.path().join("stranger.json");
    std::fs::write(&stranger, credential.to_string()).unwrap();
    let started = std::time::Instant::now();
    let out = env.run(&["runner", "--credentials", stranger.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(69), "{}", crate::env::text(&out.stderr));
    let stderr = crate::env::text(&out.stderr);
    assert!(stderr.contains("authorization") && stderr.contains("refused this login"), "{stderr}");
    assert!(started.elapsed() >= Duration::from_secs(9), "it gave up at once: {:?}", started.elapsed());
}
