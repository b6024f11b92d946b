//! The areas' unit-test fixture: a fresh workspace on a real SQLite file in a temporary
//! directory, every area built by `Api::build` as the daemon builds them, and a recording
//! wire instead of NATS (so a test reads what would have been published). Test-only.

use std::sync::Arc;
use std::time::Duration;

use canopy_config::{Config, DataDir};
use canopy_core::acl::Caller;
use canopy_core::{AccountKind, Handle};
use canopy_store::Store;
use serde::de::DeserializeOwned;

use crate::api::{Api, Parts};
use crate::auth::Secrets;
use crate::wire::recording::Recording;

/// A workspace and its areas, with no NATS.
pub(crate) struct Fixture {
    pub api: Api,
    pub wire: Arc<Recording>,
    pub operator: Caller,
    _dir: tempfile::TempDir,
}

fn any_script(_: &std::path::Path, _: &str) -> Result<(), String> {
    Ok(())
}

/// A request body from JSON, so a test names only the fields it sets.
pub(crate) fn req<T: DeserializeOwned>(value: serde_json::Value) -> T {
    match serde_json::from_value(value) {
        Ok(req) => req,
        Err(e) => panic!("a test request did not decode: {e}"),
    }
}

pub(crate) fn agent(handle: &str) -> Caller {
    Caller { handle: Handle::from_trusted(handle.to_owned()), kind: AccountKind::Agent }
}

impl Fixture {
    pub(crate) async fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary directory: {e}"));
        let data = DataDir::new(dir.path().join("ws"));
        let options = crate::InitOptions {
            mission: "tests".into(),
            operator: "op".into(),
            name: "Test".into(),
            check_script: any_script,
        };
        let report = crate::init(&data, &options).await.unwrap_or_else(|e| panic!("init: {e}"));
        let config = Arc::new(Config::default());
        let store = Store::open(&data.db(), 1024).unwrap_or_else(|e| panic!("opening the store: {e}"));
        let roles = crate::roles::RoleDefaults::resolve(&config, &data.config(), data.root(), any_script)
            .unwrap_or_else(|e| panic!("role defaults: {e}"));
        let bundles = crate::bundle::Bundles::open(&config, &data.config(), data.root())
            .unwrap_or_else(|e| panic!("the bundle: {e}"));
        let wire = Arc::new(Recording::silent());
        let sandbox = canopy_harness::sandbox::SandboxSettings::off(data.root());
        let api = Api::build(Parts {
            store: store.clone(),
            wire: wire.clone(),
            subjects: canopy_proto::Subjects::new(&report.workspace.id),
            config,
            roles: Arc::new(roles),
            bundles: Arc::new(bundles),
            secrets: Arc::new(Secrets { runners: Default::default(), session_secret: "test-secret".into() }),
            data_dir: data.root().to_owned(),
            nats: None,
            git: Arc::new(canopy_git::Git::new("git", sandbox, Duration::from_secs(60))),
            workspace_id: report.workspace.id.clone(),
            git_url: String::new(),
        });
        let operator = Caller { handle: Handle::from_trusted(report.operator), kind: AccountKind::Operator };
        Fixture { api, wire, operator, _dir: dir }
    }

    /// A standing Manager under the Supervisor, created by the operator.
    pub(crate) async fn manager(&self, handle: &str) -> Caller {
        let create = req(serde_json::json!({ "handle": handle, "name": handle, "role": "manager" }));
        if let Err(e) = self.api.agents.agents_create(self.operator.clone(), create).await {
            panic!("creating {handle}: {e}");
        }
        agent(handle)
    }

    /// A live session's token for `handle` (placed by a runner's sync, as the runner gets it).
    pub(crate) async fn token(&self, handle: &str) -> String {
        let sync = req(serde_json::json!({ "runner_id": "r1", "boot": "b1", "name": "test runner",
            "mcp_url": "http://127.0.0.1:1/mcp", "capacity": 100, "running": [] }));
        let runner = canopy_core::RunnerId::from_trusted("r1".into());
        let placed = self.api.sessions.runners_sync(runner, sync).await.unwrap_or_else(|e| panic!("sync: {e}"));
        match placed.start.into_iter().find(|s| s.agent == handle) {
            Some(session) => session.token,
            None => panic!("{handle} was not placed"),
        }
    }

    /// Calls a method as a client does (its token, its JSON), through the whole dispatch.
    pub(crate) async fn call(&self, token: &str, method: &str, body: serde_json::Value) -> serde_json::Value {
        let payload = serde_json::to_vec(&body).unwrap_or_default();
        let answer = self.api.handle(method, Some(token), &payload).await;
        serde_json::from_slice(&answer).unwrap_or_else(|e| panic!("{method}'s answer did not parse: {e}"))
    }

    /// The audit log's actions, oldest first.
    pub(crate) async fn audited(&self) -> Vec<String> {
        let log = self.api.gate.audit_list(self.operator.clone(), req(serde_json::json!({}))).await;
        log.map(|l| l.entries.into_iter().map(|e| e.action).collect()).unwrap_or_default()
    }

    /// The subjects published or requested on so far.
    pub(crate) fn sent(&self) -> Vec<String> {
        self.wire.subjects()
    }
}
