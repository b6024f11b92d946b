//! Shared test support: runs the `canopy-scripted` binary with a script and talks to it.
//!
//! Owns spawning, writing input lines, reading output lines with a timeout and reading the
//! transcript. It asserts nothing about behaviour; the test files do.

#![allow(dead_code, reason = "each test binary uses a different part of this module")]
#![allow(clippy::unwrap_used, reason = "test support fails loudly on purpose")]

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use canopy_scripted::protocol::Output;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// How long a test waits for any single line or exit before failing.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// A running harness process.
pub struct Harness {
    pub child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    pub transcript: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Harness {
    /// Starts the binary with `script`, the given extra environment, a system prompt and a
    /// transcript; waits for `ready`.
    pub async fn start(script: &str, env: &[(&str, &str)]) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let script_path = dir.path().join("script.toml");
        std::fs::write(&script_path, script).unwrap();
        let prompt_path = dir.path().join("system.md");
        std::fs::write(&prompt_path, "You are a scripted agent.").unwrap();
        let transcript = dir.path().join("transcript.jsonl");
        let mut command = Command::new(env!("CARGO_BIN_EXE_canopy-scripted"));
        command
            .arg("--script")
            .arg(&script_path)
            .arg("--system-prompt-file")
            .arg(&prompt_path)
            .arg("--transcript")
            .arg(&transcript)
            .env_remove("CANOPY_MCP_URL")
            .env_remove("CANOPY_MCP_TOKEN")
            .env("CANOPY_AGENT", "ada")
            .env("CANOPY_HOME_CHANNEL", "ada-home")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut harness = Harness { child, stdin, stdout, transcript, dir };
        match harness.next().await {
            Output::Ready { pid } => assert!(pid > 0),
            other => panic!("expected ready, got {other:?}"),
        }
        harness
    }

    /// Writes one raw line to stdin.
    pub async fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
    }

    /// Writes one JSON input line.
    pub async fn send(&mut self, input: Value) {
        self.send_raw(&input.to_string()).await;
    }

    /// Closes stdin.
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The next output line, or `None` at the end of stdout.
    pub async fn next_or_end(&mut self) -> Option<Output> {
        let line = tokio::time::timeout(STEP_TIMEOUT, self.stdout.next_line())
            .await
            .expect("timed out waiting for an output line")
            .unwrap()?;
        Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad output line {line:?}: {e}")))
    }

    /// The next output line; fails at the end of stdout.
    pub async fn next(&mut self) -> Output {
        self.next_or_end().await.expect("stdout ended")
    }

    /// Waits for the process to exit.
    pub async fn wait(&mut self) -> ExitStatus {
        tokio::time::timeout(STEP_TIMEOUT, self.child.wait()).await.expect("timed out waiting for exit").unwrap()
    }

    /// The transcript lines so far.
    pub fn transcript(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.transcript).unwrap();
        text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
    }
}

/// Shorthand for `Output::Text`.
pub fn text(turn_id: &str, text: &str) -> Output {
    Output::Text { turn_id: turn_id.to_owned(), text: text.to_owned() }
}

/// Shorthand for `Output::TurnStarted`.
pub fn started(turn_id: &str, input_id: &str) -> Output {
    Output::TurnStarted { turn_id: turn_id.to_owned(), input_id: input_id.to_owned() }
}

/// Shorthand for `Output::TurnEnded`.
pub fn ended(turn_id: &str, status: &str) -> Output {
    Output::TurnEnded { turn_id: turn_id.to_owned(), status: status.to_owned() }
}

/// The zero usage a turn with no `usage` action reports as it ends.
pub fn free(turn_id: &str) -> Output {
    Output::Usage {
        turn_id: turn_id.to_owned(),
        input_tokens: 0,
        output_tokens: 0,
        cache_read_tokens: 0,
        cache_write_tokens: 0,
        cost_usd: Some(0.0),
    }
}
