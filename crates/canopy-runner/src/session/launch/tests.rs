//! The launch step's decisions: the launch a session's assignment and the runner's options
//! come to, and how each refusal or failure ends the session. No harness is started.

#![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

use std::collections::HashMap;
use std::path::PathBuf;

use canopy_harness::{HarnessKind, HarnessSettings, LaunchError, Unconfinable};

use super::{launch_failed, model_of, prepare};
use crate::session::interface::EndReport;
use crate::session::testing::{assignment, offline_api, options};

#[test]
fn usage_is_priced_by_the_assignments_model_else_the_harnesss_else_its_name() {
    let mut harnesses = HashMap::new();
    let mut manager = assignment();
    assert_eq!(model_of(&manager, &harnesses), "scripted");
    manager.harness = "claude".into();
    harnesses.insert(HarnessKind::Claude, HarnessSettings { model: Some("opus".into()), ..HarnessSettings::default() });
    assert_eq!(model_of(&manager, &harnesses), "opus");
    manager.model = "sonnet".into();
    assert_eq!(model_of(&manager, &harnesses), "sonnet");
}

#[tokio::test]
async fn a_launch_carries_the_agent_its_directories_and_its_harnesss_settings() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = options(offline_api().await, dir.path(), "echo");
    options.harnesses.insert(
        HarnessKind::Claude,
        HarnessSettings {
            env: vec![("KEY".into(), "k".into())],
            model: Some("opus".into()),
            ..HarnessSettings::default()
        },
    );
    let spec = prepare(&assignment(), &options, "http://127.0.0.1:9/mcp").unwrap();
    assert_eq!(spec.kind, HarnessKind::Scripted);
    assert_eq!(
        (spec.program.clone(), spec.program_args.clone()),
        (PathBuf::from("/bin/sh"), vec!["-c".into(), "echo".into()])
    );
    assert_eq!(spec.session_dir, dir.path().join("sessions/a/1"));
    assert_eq!(spec.cwd, dir.path().join("sessions/a/work"), "an empty cwd is the agent's work directory");
    assert_eq!((spec.mcp_url.as_str(), spec.mcp_token.as_str()), ("http://127.0.0.1:9/mcp", "cns_test"));
    assert!(spec.env.contains(&("CANOPY_AGENT".into(), "a".into())));
    assert!(spec.env.contains(&("CANOPY_INCARNATION".into(), "1".into())));
    assert_eq!(spec.sandbox, options.sandbox, "every launch is confined as the runner is configured");
    assert_eq!(spec.sandbox.mode, canopy_harness::SandboxMode::Required);
    let mut registry = assignment();
    registry.allow_hosts = vec!["registry.npmjs.org".into()];
    let spec = prepare(&registry, &options, "http://127.0.0.1:9/mcp").unwrap();
    let mut expected = options.sandbox.allow_hosts.clone();
    expected.push("registry.npmjs.org".into());
    assert_eq!(spec.sandbox.allow_hosts, expected, "a role's hosts add to the runner's");
    let mut claude = assignment();
    claude.harness = "claude".into();
    let spec = prepare(&claude, &options, "").unwrap();
    assert_eq!(spec.program, PathBuf::from("claude"), "a real harness runs its default program");
    assert_eq!(spec.model.as_deref(), Some("opus"));
    assert!(spec.env.contains(&("KEY".into(), "k".into())));
}

#[tokio::test]
async fn an_unknown_harness_fails_the_session_and_may_be_retried() {
    let dir = tempfile::tempdir().unwrap();
    let mut unknown = assignment();
    unknown.harness = "nope".into();
    let ending = prepare(&unknown, &options(offline_api().await, dir.path(), ""), "").unwrap_err();
    assert_eq!((ending.fatal, ending.report), (false, EndReport::Failed));
    assert_eq!(ending.reason, "unknown harness \"nope\"");
}

#[tokio::test]
async fn a_checkout_not_on_this_machine_ends_the_agent_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut elsewhere = assignment();
    elsewhere.repo_mirror = Some(dir.path().join("repos/r.git").display().to_string());
    elsewhere.cwd = dir.path().join("checkouts/c").display().to_string();
    let options = options(offline_api().await, dir.path(), "");
    let ending = prepare(&elsewhere, &options, "").unwrap_err();
    assert_eq!((ending.fatal, ending.report), (true, EndReport::Failed));
    assert!(ending.reason.contains("is not on this machine"), "{}", ending.reason);
    std::fs::create_dir_all(dir.path().join("checkouts/c/.git")).unwrap();
    assert!(prepare(&elsewhere, &options, "").is_ok(), "a checkout that is here launches");
}

#[test]
fn launch_failures_that_retrying_cannot_fix_are_fatal_and_name_the_fix() {
    let unconfinable = launch_failed(HarnessKind::Claude, LaunchError::Unconfinable(Unconfinable("no bwrap".into())));
    assert_eq!((unconfinable.fatal, unconfinable.report), (true, EndReport::Nothing));
    assert!(
        unconfinable.reason.ends_with("see `canopy doctor` and [sandbox] in canopy.toml"),
        "{}",
        unconfinable.reason
    );
    let missing = LaunchError::Spawn { program: "claude".into(), source: std::io::ErrorKind::NotFound.into() };
    let missing = launch_failed(HarnessKind::Claude, missing);
    assert_eq!((missing.fatal, missing.report), (true, EndReport::Failed));
    assert!(missing.reason.contains("[harness.claude] bin"), "{}", missing.reason);
    let invalid = launch_failed(HarnessKind::Codex, LaunchError::Invalid("no provider".into()));
    assert!(invalid.fatal && invalid.reason.starts_with("no provider; fix it in canopy.toml"), "{}", invalid.reason);
}

#[test]
fn other_launch_failures_are_crashes_the_runner_retries() {
    let denied = LaunchError::Spawn { program: "claude".into(), source: std::io::ErrorKind::PermissionDenied.into() };
    let denied = launch_failed(HarnessKind::Claude, denied);
    assert_eq!((denied.fatal, denied.requested, denied.report), (false, false, EndReport::Failed));
    assert!(denied.reason.starts_with("the harness did not start: "), "{}", denied.reason);
    let slow = launch_failed(HarnessKind::Claude, LaunchError::NotReady(std::time::Duration::from_secs(30)));
    assert!(!slow.fatal);
}
