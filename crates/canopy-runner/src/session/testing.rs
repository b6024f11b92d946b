//! Values the session's tests build: a message, an assignment, runner options. Test-only.

#![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use canopy_bus::ApiClient;
use canopy_harness::SandboxSettings;
use canopy_proto::api::{PromptMode, ScriptSource, SessionAssignment};
use serde_json::json;

use crate::options::{RunnerOptions, RunnerSettings, RunnerToken};

/// Message `seq` from @ops in #home-a > t.
pub(crate) fn message(seq: u64, body: &str) -> canopy_core::Message {
    serde_json::from_value(json!({
        "seq": seq, "channel": "home-a", "topic": "t", "body": body, "mentions": [],
        "sender": { "handle": "ops", "kind": "operator", "role": null },
        "created_at": "2026-12-01T00:00:00Z",
    }))
    .unwrap()
}

/// Agent @a's first session, a manager on the scripted harness.
pub(crate) fn assignment() -> SessionAssignment {
    SessionAssignment {
        agent: "a".into(),
        display_name: "A".into(),
        role: "manager".into(),
        incarnation: canopy_core::Incarnation(1),
        token: "cns_test".into(),
        harness: "scripted".into(),
        script: Some(ScriptSource { name: "s.toml".into(), text: String::new() }),
        system_prompt: "prompt".into(),
        prompt_mode: PromptMode::Replace,
        prompt_hash: String::new(),
        cwd: String::new(),
        repo_mirror: None,
        repo: None,
        cwd_read_only: false,
        allow_hosts: Vec::new(),
        subagents: Vec::new(),
        model: String::new(),
        harness_tools: Vec::new(),
        run: None,
        home_channel: "home-a".into(),
        charter: String::new(),
    }
}

/// Quick settings: deliveries 10 ms after a doorbell, no idle resync to speak of.
pub(crate) fn settings() -> RunnerSettings {
    RunnerSettings {
        sync_interval: Duration::from_secs(60),
        capacity: 4,
        restart_backoff_min: Duration::from_millis(100),
        restart_backoff_max: Duration::from_secs(1),
        crash_loop_count: 5,
        crash_loop_window: Duration::from_secs(60),
        ready_timeout: Duration::from_secs(10),
        stop_grace: Duration::from_secs(1),
        max_line_bytes: 1 << 20,
        report_queue: 64,
        quiet_window: Duration::from_millis(10),
        coalesce_cap: Duration::from_millis(50),
        delivery_batch: 10,
        delivery_resync: Duration::from_secs(3600),
        labels: Vec::new(),
    }
}

/// A runner's options with `api`, its sessions under `dir`, the scripted harness run by
/// `sh -c script`.
pub(crate) fn options(api: ApiClient, dir: &Path, script: &str) -> RunnerOptions {
    RunnerOptions {
        api,
        id: canopy_core::RunnerId::parse("r1").unwrap(),
        token: RunnerToken::fixed("cnr_test"),
        name: "test".into(),
        sessions_dir: dir.join("sessions"),
        scripted_program: "/bin/sh".into(),
        scripted_args: vec!["-c".into(), script.into()],
        harnesses: HashMap::new(),
        sandbox: SandboxSettings::required(dir.join("data")),
        settings: settings(),
        checkouts: crate::checkouts::Checkouts::new(
            canopy_git::Git::new("git", SandboxSettings::off(dir.join("data")), Duration::from_secs(60)),
            dir.join("sessions"),
            canopy_core::RunnerId::parse("r1").unwrap(),
            std::sync::Arc::new(|| Ok("cnr_test".to_owned())),
            Duration::from_secs(5),
        ),
    }
}

/// A client of a daemon that is not there: built without a NATS server (its connection is
/// only ever tried in the background), for tests that need options but make no call.
pub(crate) async fn offline_api() -> ApiClient {
    let login = canopy_bus::Login::open();
    let bus = canopy_bus::Bus::connect("nats://127.0.0.1:1", &login, "offline", true).await.unwrap();
    ApiClient::new(bus, canopy_proto::Subjects::new("ws-000000000000"), Duration::from_millis(100))
}
