//! A running harness process: spawn, JSON-lines framing, send with confirmation, stop.
//!
//! The session owns the child. One task reads stdout line by line (each line bounded: a
//! longer one is cut off, reported as `Malformed`, and reading goes on), hands it to the
//! adapter's codec, forwards events, and resolves pending sends when the harness confirms
//! them. Another task waits for the exit and reports it last. Stopping is shutdown line,
//! grace, SIGTERM to the process group, grace, SIGKILL. The child has its own process
//! group and dies with its parent.
//!
//! A launch that resumes the agent's previous conversation and fails before the harness is
//! ready is retried once with a fresh conversation, and the first event then says so: a
//! failed resume never fails the session.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{ChildStdin, Command};
use tokio::sync::{mpsc, oneshot, watch};

use crate::event::{HarnessEvent, SendMode, SendOutcome};
use crate::sandbox::{self, Capability, Grants, SandboxMode, SandboxSettings, Unconfinable};
use crate::{HarnessKind, PromptMode, ProviderSettings, claude, scripted};

/// A session's system prompt: its text, and how it relates to the harness's own default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub mode: PromptMode,
    pub text: String,
}

impl Prompt {
    /// Replaces the harness's default system prompt entirely (Managers).
    pub fn replace(text: String) -> Prompt {
        Prompt { mode: PromptMode::Replace, text }
    }

    /// Keeps the harness's default and appends this delta (implementers).
    pub fn append(text: String) -> Prompt {
        Prompt { mode: PromptMode::Append, text }
    }

    pub fn text(&self) -> &str {
        &self.text
    }
}

/// Everything needed to start one session.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub kind: HarnessKind,
    /// The executable and its leading arguments (the scripted harness is `canopy
    /// harness-scripted`, so it runs as the same binary as Canopy itself).
    pub program: PathBuf,
    pub program_args: Vec<String>,
    /// A private directory for this session: prompt file, transcript, HOME, logs.
    pub session_dir: PathBuf,
    /// The agent's directory on this machine (`sessions/<agent>`, the parent of
    /// `session_dir`), which outlives incarnations. A harness that can resume a conversation
    /// keeps it there (Claude Code's config directory, Codex's home) with a small file naming
    /// it, and the next incarnation resumes it. `None` starts a fresh conversation every time
    /// and keeps nothing (`canopy doctor`'s start check).
    pub agent_dir: Option<PathBuf>,
    /// The working directory of the harness.
    pub cwd: PathBuf,
    pub prompt: Prompt,
    /// The harness's own built-in tools the session may use (Claude Code); empty: none.
    pub builtin_tools: Vec<String>,
    /// Canopy's MCP endpoint and this session's bearer token.
    pub mcp_url: String,
    pub mcp_token: String,
    /// Extra environment; the session otherwise starts from a clean environment.
    pub env: Vec<(String, String)>,
    /// The model the harness asks for (`[harness.<name>] model`); `None` is its default.
    pub model: Option<String>,
    /// A model provider for harnesses configured with one (Codex).
    pub provider: Option<ProviderSettings>,
    /// The scripted harness's script (file name, text).
    pub script: Option<(String, String)>,
    /// Longest stdout line read; longer lines are cut off and reported.
    pub max_line_bytes: usize,
    /// How long the harness may take to say it is ready.
    pub ready_timeout: Duration,
    /// How the process is confined (`[sandbox]`); `mode = Off` runs it unconfined.
    pub sandbox: SandboxSettings,
    /// The mirror of the repository its working directory is a checkout of: granted
    /// read-only (the checkout's objects are shared with it). Must lie in the data
    /// directory's `repos/`.
    pub repo_mirror: Option<PathBuf>,
    /// Subagent definitions for the harness's own subagent mechanism (omp's `task` tool
    /// finds them in the session's `$HOME/.omp/agent/agents/`; Claude Code takes `--agents`).
    pub subagents: Vec<Subagent>,
}

/// Where an input came from, for the harness's attribution (and the scripted harness's rules).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InputContext {
    /// `start` for a session's first input, `message` for deliveries.
    pub kind: String,
    pub sender: Option<String>,
    pub channel: Option<String>,
    pub topic: Option<String>,
    /// The newest message's sequence number, when the input carries messages.
    pub seq: Option<u64>,
    /// The input carries a message an earlier session was handed and never confirmed.
    pub redelivered: bool,
}

/// One subagent definition for a harness's own subagents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subagent {
    pub name: String,
    pub description: String,
    /// The definition's body: spliced into omp's default prompt, or Claude Code's whole
    /// subagent prompt.
    pub body: String,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    #[error("preparing the session directory {path}: {source}")]
    Files { path: PathBuf, source: std::io::Error },
    #[error("starting {program}: {source}")]
    Spawn { program: PathBuf, source: std::io::Error },
    #[error("the harness did not become ready within {0:?}")]
    NotReady(Duration),
    #[error("the harness exited before it was ready ({0})")]
    ExitedEarly(String),
    #[error("{0}")]
    Invalid(String),
    /// The session cannot be confined here and `[sandbox] mode` requires it: retrying
    /// cannot help until the machine or the configuration changes.
    #[error("the session cannot be confined: {0}")]
    Unconfinable(#[from] Unconfinable),
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    #[error("writing to the harness failed: {0}")]
    Write(std::io::Error),
    #[error("the harness did not answer input {0} within 10s")]
    NoAnswer(String),
    #[error("the harness has exited")]
    Exited,
}

/// Whether `prepare` may resume the agent's previous conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resume {
    /// Resume the recorded conversation if there is one (and `agent_dir` is set).
    IfRecorded,
    /// Start a fresh conversation: the resume was tried and failed.
    Fresh,
}

/// Encodes inputs and decodes output lines for one harness's protocol.
pub(crate) trait Codec: Send + 'static {
    /// The conversation this launch resumes, if it resumes one: a launch that fails is then
    /// tried once more with a fresh conversation.
    fn resuming(&self) -> Option<String> {
        None
    }
    /// Lines written as soon as the process starts, before it is ready (a handshake's first
    /// step; later steps are `Decoded::Write`s answering what the harness printed).
    fn start(&mut self) -> Vec<Vec<u8>> {
        Vec::new()
    }
    /// Answers a send at once, without writing anything, when the harness cannot take it
    /// now (a next-turn input while a turn runs, a steer for a turn that already ended).
    fn answer_now(&mut self, _mode: &SendMode) -> Option<SendOutcome> {
        None
    }
    /// Called once the line for `input_id` is written: an outcome resolves the send at once
    /// (the harness confirms nothing more for it, or the adapter already knows the answer).
    fn written(&mut self, _input_id: &str) -> Option<SendOutcome> {
        None
    }
    /// One line (without the newline) that delivers `text`.
    fn encode_send(&mut self, input_id: &str, text: &str, context: &InputContext, mode: &SendMode) -> Vec<u8>;
    /// The line that stops the running turn; empty when there is nothing to stop.
    fn encode_interrupt(&mut self) -> Vec<u8>;
    /// The line that asks the harness to exit, or empty; stdin is closed after it either way.
    fn encode_shutdown(&mut self) -> Vec<u8>;
    /// Decodes one output line.
    fn decode(&mut self, line: &[u8]) -> Vec<Decoded>;
}

/// What one output line means.
pub(crate) enum Decoded {
    Event(HarnessEvent),
    /// The harness confirmed what became of an input.
    Ack {
        input_id: String,
        outcome: SendOutcome,
    },
    /// A line to write back to the harness: the next handshake step, or an answer to a
    /// request the harness made.
    Write(Vec<u8>),
}

/// The harness's stdin, shared by callers and the reader (which answers the harness);
/// `None` once it was closed at shutdown.
type Stdin = Arc<tokio::sync::Mutex<Option<ChildStdin>>>;

type Pending = Arc<Mutex<HashMap<String, oneshot::Sender<SendOutcome>>>>;

/// A running harness session. Dropping it kills the process.
pub struct Session {
    kind: HarnessKind,
    pid: u32,
    stdin: Stdin,
    codec: Arc<Mutex<Box<dyn Codec>>>,
    pending: Pending,
    exited: watch::Receiver<bool>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("kind", &self.kind).field("pid", &self.pid).finish()
    }
}

impl Session {
    /// Starts the harness and waits until it is ready. Events arrive on the returned
    /// receiver (bounded by `event_capacity`; the reader waits when it is full).
    ///
    /// A harness that keeps conversations resumes the agent's previous one when it recorded
    /// one in `agent_dir`. If that launch fails (the conversation is missing or cannot be
    /// loaded, and the harness exits or never becomes ready), the record is dropped and the
    /// harness starts once more with a fresh conversation; a `Status` event says so. A failed
    /// resume never fails the session.
    pub async fn launch(
        spec: LaunchSpec,
        event_capacity: usize,
    ) -> Result<(Session, mpsc::Receiver<HarnessEvent>), LaunchError> {
        let (resumed, error) = match Session::launch_once(&spec, event_capacity, Resume::IfRecorded, None).await {
            Ok(launched) => return Ok(launched),
            Err((Some(resumed), error @ (LaunchError::ExitedEarly(_) | LaunchError::NotReady(_)))) => (resumed, error),
            Err((_, error)) => return Err(error),
        };
        tracing::warn!(conversation = %resumed, %error, "resuming the previous conversation failed; starting fresh");
        // Keep what the failed attempt printed; the fresh attempt writes its own stderr.log.
        let _ = std::fs::rename(spec.session_dir.join("stderr.log"), spec.session_dir.join("stderr.resume-failed.log"));
        let note = HarnessEvent::Status {
            text: format!(
                "could not resume the previous conversation {resumed} ({error}); started a fresh conversation"
            ),
        };
        Session::launch_once(&spec, event_capacity, Resume::Fresh, Some(note)).await.map_err(|(_, error)| error)
    }

    /// One launch attempt. The error carries the conversation it tried to resume, if any.
    async fn launch_once(
        spec: &LaunchSpec,
        event_capacity: usize,
        resume: Resume,
        note: Option<HarnessEvent>,
    ) -> Result<(Session, mpsc::Receiver<HarnessEvent>), (Option<String>, LaunchError)> {
        let mut resuming = None;
        Session::spawn(spec, event_capacity, resume, note, &mut resuming).await.map_err(|e| (resuming, e))
    }

    async fn spawn(
        spec: &LaunchSpec,
        event_capacity: usize,
        resume: Resume,
        note: Option<HarnessEvent>,
        resuming: &mut Option<String>,
    ) -> Result<(Session, mpsc::Receiver<HarnessEvent>), LaunchError> {
        let files = |path: PathBuf| move |source| LaunchError::Files { path, source };
        std::fs::create_dir_all(spec.session_dir.join("home")).map_err(files(spec.session_dir.clone()))?;
        std::fs::create_dir_all(&spec.cwd).map_err(files(spec.cwd.clone()))?;
        // A clean environment: the user's own settings never leak into a session.
        let mut command = Command::new(&spec.program);
        command
            .args(&spec.program_args)
            .current_dir(&spec.cwd)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", spec.session_dir.join("home"))
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let mut codec: Box<dyn Codec> = match spec.kind {
            HarnessKind::Scripted => scripted::prepare(spec, &mut command)?,
            HarnessKind::Claude => claude::prepare(spec, &mut command, resume)?,
            HarnessKind::Codex => crate::codex::prepare(spec, &mut command, resume)?,
            HarnessKind::Omp => crate::omp::prepare(spec, &mut command, resume)?,
            HarnessKind::Pi => crate::pi::prepare(spec, &mut command, resume)?,
        };
        *resuming = codec.resuming();
        let (mut command, rules) = match spec.sandbox.mode {
            SandboxMode::Off => (command, None),
            SandboxMode::Required => {
                let bwrap = Capability::cached(&spec.sandbox.bwrap).usable()?;
                let (confined, rules) = sandbox::wrap(&bwrap, &grants(spec)?, &command)?;
                (confined, Some(rules))
            }
        };
        let stderr_path = spec.session_dir.join("stderr.log");
        let stderr = std::fs::File::create(&stderr_path).map_err(files(stderr_path))?;
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(stderr).kill_on_drop(true);
        canopy_sys::new_session(&mut command);
        canopy_sys::die_with_parent(&mut command);
        let spawned = command.spawn();
        // The child entered the ruleset before exec; the parent's copy can go.
        drop(rules);
        let mut child = spawned.map_err(|source| LaunchError::Spawn { program: spec.program.clone(), source })?;
        let pid = child.id().unwrap_or(0);
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(LaunchError::Invalid("the harness's stdio was not captured".into()));
        };

        let stdin: Stdin = Arc::new(tokio::sync::Mutex::new(Some(stdin)));
        for line in codec.start() {
            if let Err(e) = write_to(&stdin, line).await {
                return Err(LaunchError::ExitedEarly(format!("writing its first input failed: {e}")));
            }
        }
        let codec = Arc::new(Mutex::new(codec));
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let (events_tx, events_rx) = mpsc::channel(event_capacity.max(16));
        if let Some(note) = note {
            // The channel is new and has room: the note is the first event the caller reads.
            let _ = events_tx.try_send(note);
        }
        let (exited_tx, exited) = watch::channel(false);
        let (ready_tx, ready_rx) = oneshot::channel();

        let reader = tokio::spawn(read_lines(
            stdout,
            spec.max_line_bytes,
            stdin.clone(),
            codec.clone(),
            pending.clone(),
            events_tx.clone(),
            ready_tx,
        ));
        tokio::spawn(async move {
            let status = child.wait().await;
            // Forward everything the harness printed before its exit, then the exit.
            let _ = reader.await;
            let (code, signal) = match &status {
                Ok(status) => {
                    use std::os::unix::process::ExitStatusExt;
                    (status.code(), status.signal())
                }
                Err(_) => (None, None),
            };
            let _ = events_tx.send(HarnessEvent::Exited { code, signal }).await;
            let _ = exited_tx.send(true);
        });

        let session = Session { kind: spec.kind, pid, stdin, codec, pending, exited };
        let mut exited = session.exited.clone();
        tokio::select! {
            ready = ready_rx => match ready {
                Ok(()) => Ok((session, events_rx)),
                Err(_) => Err(LaunchError::ExitedEarly("its output ended".into())),
            },
            _ = exited.wait_for(|e| *e) => Err(LaunchError::ExitedEarly("see stderr.log in the session directory".into())),
            () = tokio::time::sleep(spec.ready_timeout) => {
                session.kill();
                Err(LaunchError::NotReady(spec.ready_timeout))
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn kind(&self) -> HarnessKind {
        self.kind
    }

    /// Delivers `text` and reports what became of it.
    pub async fn send(
        &self,
        input_id: &str,
        text: &str,
        context: &InputContext,
        mode: SendMode,
    ) -> Result<SendOutcome, SessionError> {
        if matches!(mode, SendMode::Steer { .. }) && !self.kind.capabilities().steer {
            return Ok(SendOutcome::FellBack { reason: format!("the {} harness cannot steer", self.kind.as_str()) });
        }
        if let Some(outcome) = self.codec.lock().ok().and_then(|mut c| c.answer_now(&mode)) {
            return Ok(outcome);
        }
        let (tx, rx) = oneshot::channel();
        if let Ok(mut pending) = self.pending.lock() {
            pending.insert(input_id.to_owned(), tx);
        }
        let line = self.codec.lock().map(|mut c| c.encode_send(input_id, text, context, &mode)).unwrap_or_default();
        self.write_line(line).await?;
        if let Some(outcome) = self.codec.lock().ok().and_then(|mut c| c.written(input_id)) {
            if let Ok(mut pending) = self.pending.lock() {
                pending.remove(input_id);
            }
            return Ok(outcome);
        }
        let mut exited = self.exited.clone();
        tokio::select! {
            outcome = rx => outcome.map_err(|_| SessionError::Exited),
            _ = exited.wait_for(|e| *e) => Err(SessionError::Exited),
            () = tokio::time::sleep(Duration::from_secs(10)) => {
                if let Ok(mut pending) = self.pending.lock() {
                    pending.remove(input_id);
                }
                Err(SessionError::NoAnswer(input_id.to_owned()))
            }
        }
    }

    /// Asks the harness to stop the running turn.
    pub async fn interrupt(&self) -> Result<(), SessionError> {
        let line = self.codec.lock().map(|mut c| c.encode_interrupt()).unwrap_or_default();
        if line.is_empty() {
            return Ok(());
        }
        self.write_line(line).await
    }

    /// Stops the session: a shutdown line, `grace`, SIGTERM to its group, `grace`, SIGKILL.
    pub async fn shutdown(&self, grace: Duration) {
        let line = self.codec.lock().map(|mut c| c.encode_shutdown()).unwrap_or_default();
        if !line.is_empty() {
            let _ = self.write_line(line).await;
        }
        // End of input is the polite stop for harnesses that read until EOF (Codex).
        self.stdin.lock().await.take();
        let mut exited = self.exited.clone();
        if tokio::time::timeout(grace, exited.wait_for(|e| *e)).await.is_ok() {
            return;
        }
        canopy_sys::signal_group(self.pid, canopy_sys::SIGTERM);
        if tokio::time::timeout(grace, exited.wait_for(|e| *e)).await.is_ok() {
            return;
        }
        tracing::warn!(pid = self.pid, "harness ignored SIGTERM; killing it");
        self.kill();
        let _ = tokio::time::timeout(grace, exited.wait_for(|e| *e)).await;
    }

    /// SIGKILLs the process group at once.
    pub fn kill(&self) {
        canopy_sys::signal_group(self.pid, canopy_sys::SIGKILL);
    }

    async fn write_line(&self, line: Vec<u8>) -> Result<(), SessionError> {
        if *self.exited.borrow() {
            return Err(SessionError::Exited);
        }
        write_to(&self.stdin, line).await
    }
}

/// What a confined session of `spec` is granted: its program's install and the configured
/// paths to read; its agent directory, working directory and the configured paths to write;
/// TCP to its MCP endpoint, its model endpoints (a real harness) and the configured ports.
/// A grant that would expose the data directory or the operator's home is refused.
pub(crate) fn grants(spec: &LaunchSpec) -> Result<Grants, LaunchError> {
    let settings = &spec.sandbox;
    let own = spec.agent_dir.as_ref().unwrap_or(&spec.session_dir);
    let program = crate::find_program(&spec.program, std::env::var_os("PATH").as_deref()).ok_or_else(|| {
        LaunchError::Spawn { program: spec.program.clone(), source: std::io::ErrorKind::NotFound.into() }
    })?;
    let mut read_only = sandbox::program_paths(&program);
    for path in &read_only {
        sandbox::check_grant(&format!("the {} harness's install", spec.kind.as_str()), path, &settings.data_dir, None)?;
    }
    for path in &settings.read_only {
        sandbox::check_grant("sandbox.read_only", path, &settings.data_dir, None)?;
    }
    read_only.extend(settings.read_only.iter().cloned());
    if let Some(mirror) = &spec.repo_mirror {
        let repos = settings.data_dir.join("repos");
        if !sandbox::normal(mirror).starts_with(sandbox::normal(&repos)) {
            return Err(Unconfinable(format!(
                "the repository mirror {} is not in {}",
                mirror.display(),
                repos.display()
            ))
            .into());
        }
        sandbox::check_grant("the repository mirror", mirror, &settings.data_dir, Some(mirror))?;
        read_only.push(mirror.clone());
    }
    let mut read_write = vec![own.clone()];
    if !spec.cwd.starts_with(own) {
        sandbox::check_grant("the working directory", &spec.cwd, &settings.data_dir, Some(own))?;
        read_write.push(spec.cwd.clone());
    }
    for path in &settings.read_write {
        sandbox::check_grant("sandbox.read_write", path, &settings.data_dir, None)?;
    }
    read_write.extend(settings.read_write.iter().cloned());
    let mcp = sandbox::url_port(&spec.mcp_url)
        .ok_or_else(|| Unconfinable(format!("the MCP endpoint {:?} names no TCP port", spec.mcp_url)))?;
    let mut connect_ports = vec![mcp];
    if spec.kind != HarnessKind::Scripted {
        connect_ports.extend(sandbox::model_ports(&spec.env, spec.provider.as_ref().map(|p| p.base_url.as_str())));
    }
    connect_ports.extend(settings.connect_ports.iter().copied());
    connect_ports.sort_unstable();
    connect_ports.dedup();
    Ok(Grants { read_only, read_write, connect_ports })
}

/// Writes a file readable by the session's user only (it may hold a credential).
pub(crate) fn write_private(path: PathBuf, bytes: &[u8]) -> Result<(), LaunchError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut file| file.write_all(bytes))
        .map_err(|source| LaunchError::Files { path, source })
}

/// Writes one line (adding the newline) to the harness's stdin.
async fn write_to(stdin: &Stdin, mut line: Vec<u8>) -> Result<(), SessionError> {
    line.push(b'\n');
    let mut stdin = stdin.lock().await;
    let Some(stdin) = stdin.as_mut() else { return Err(SessionError::Exited) };
    stdin.write_all(&line).await.map_err(SessionError::Write)?;
    stdin.flush().await.map_err(SessionError::Write)
}

impl Drop for Session {
    fn drop(&mut self) {
        if !*self.exited.borrow() {
            self.kill();
        }
    }
}

/// Reads stdout as bounded lines and turns them into events and acknowledgements.
async fn read_lines(
    mut stdout: impl AsyncRead + Unpin,
    max_line: usize,
    stdin: Stdin,
    codec: Arc<Mutex<Box<dyn Codec>>>,
    pending: Pending,
    events: mpsc::Sender<HarnessEvent>,
    ready: oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    let mut buf = vec![0u8; 64 * 1024];
    let mut line: Vec<u8> = Vec::new();
    let mut overflowed = false;
    loop {
        let n = match stdout.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for &byte in &buf[..n] {
            if byte != b'\n' {
                if line.len() < max_line {
                    line.push(byte);
                } else {
                    overflowed = true;
                }
                continue;
            }
            let decoded = if overflowed {
                vec![Decoded::Event(HarnessEvent::Malformed {
                    reason: format!("a line longer than {max_line} bytes was cut off and dropped"),
                })]
            } else if line.iter().all(u8::is_ascii_whitespace) {
                Vec::new()
            } else {
                codec.lock().map(|mut c| c.decode(&line)).unwrap_or_default()
            };
            line.clear();
            overflowed = false;
            for item in decoded {
                match item {
                    Decoded::Write(reply) => {
                        if let Err(e) = write_to(&stdin, reply).await {
                            tracing::debug!(error = %e, "answering the harness failed");
                        }
                    }
                    Decoded::Ack { input_id, outcome } => {
                        let waiter = pending.lock().ok().and_then(|mut p| p.remove(&input_id));
                        if let Some(waiter) = waiter {
                            let _ = waiter.send(outcome);
                        }
                    }
                    Decoded::Event(HarnessEvent::Ready) if ready.is_some() => {
                        if let Some(ready) = ready.take() {
                            let _ = ready.send(());
                        }
                        if events.send(HarnessEvent::Ready).await.is_err() {
                            return;
                        }
                    }
                    Decoded::Event(event) => {
                        if let HarnessEvent::Malformed { reason } = &event {
                            tracing::warn!(%reason, "malformed line from a harness");
                        }
                        if events.send(event).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}
