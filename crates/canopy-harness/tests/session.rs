//! The session layer against real processes: readiness timeout, malformed and oversized
//! output lines, and stopping. `/bin/sh` plays a badly behaved harness.

#![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

use std::time::Duration;

use canopy_harness::{HarnessEvent, HarnessKind, LaunchError, LaunchSpec, Prompt, SandboxSettings, Session};

fn spec(dir: &std::path::Path, shell: &str, ready_timeout: Duration) -> LaunchSpec {
    LaunchSpec {
        kind: HarnessKind::Scripted,
        program: "/bin/sh".into(),
        // The scripted adapter appends its own flags; `sh -c` takes them as $0, $1, ...
        program_args: vec!["-c".into(), shell.into()],
        session_dir: dir.join("session"),
        agent_dir: None,
        cwd: dir.join("work"),
        builtin_tools: Vec::new(),
        prompt: Prompt::replace("prompt".into()),
        mcp_url: "http://127.0.0.1:1/mcp".into(),
        mcp_token: "t".into(),
        env: vec![],
        model: None,
        provider: None,
        script: Some(("script.toml".into(), String::new())),
        max_line_bytes: 1024,
        ready_timeout,
        sandbox: SandboxSettings::required(dir.join("data")),
        repo_mirror: None,
        cwd_read_only: false,
        subagents: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harness_that_never_becomes_ready_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let started = Session::launch(spec(dir.path(), "sleep 30", Duration::from_millis(300)), 16).await;
    assert!(matches!(started, Err(LaunchError::NotReady(_))), "{started:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harness_that_exits_at_once_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let started = Session::launch(spec(dir.path(), "exit 3", Duration::from_secs(5)), 16).await;
    assert!(matches!(started, Err(LaunchError::ExitedEarly(_))), "{started:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_lines_are_reported_and_reading_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let shell = r#"echo '{"type":"ready","pid":1}'; echo 'not json'; head -c 5000 /dev/zero | tr '\0' x; echo; echo '{"type":"status","text":"still here"}'; sleep 30"#;
    let (session, mut events) = Session::launch(spec(dir.path(), shell, Duration::from_secs(5)), 16).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let event = tokio::time::timeout(Duration::from_secs(5), events.recv()).await.unwrap().unwrap();
        seen.push(event);
    }
    assert_eq!(seen[0], HarnessEvent::Ready);
    assert!(matches!(&seen[1], HarnessEvent::Malformed { .. }), "{:?}", seen[1]);
    assert!(
        matches!(&seen[2], HarnessEvent::Malformed { reason } if reason.contains("longer than 1024")),
        "{:?}",
        seen[2]
    );
    assert_eq!(seen[3], HarnessEvent::Status { text: "still here".into() });

    // Stopping escalates: sh ignores the shutdown line, so SIGTERM ends it.
    let pid = session.pid();
    session.shutdown(Duration::from_millis(200)).await;
    let exited = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.recv().await {
                Some(HarnessEvent::Exited { .. }) | None => return,
                Some(_) => {}
            }
        }
    })
    .await;
    assert!(exited.is_ok() && !canopy_sys::alive(pid), "the harness survived shutdown");
}
