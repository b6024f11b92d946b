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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, oneshot, watch};

use crate::HarnessKind;
use crate::codec::{Codec, Decoded};
use crate::confine;
use crate::event::{HarnessEvent, SendMode, SendOutcome};
use crate::kinds;
use crate::launch::{InputContext, LaunchError, LaunchSpec, Resume};

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
        let (failed_log, kept_log) =
            (spec.session_dir.join("stderr.log"), spec.session_dir.join("stderr.resume-failed.log"));
        if let Err(e) = std::fs::rename(&failed_log, &kept_log) {
            tracing::debug!(error = %e, path = %failed_log.display(), "keeping the failed resume's stderr.log");
        }
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
        let (command, codec) = prepare_command(spec, resume).map_err(|e| (None, e))?;
        let resuming = codec.resuming();
        Session::spawn(spec, event_capacity, command, codec, note).await.map_err(|e| (resuming, e))
    }

    /// One launch of a prepared command: the child, its first input, the tasks that read its
    /// output and wait for its exit, then the wait until it is ready.
    async fn spawn(
        spec: &LaunchSpec,
        event_capacity: usize,
        command: Command,
        mut codec: Box<dyn Codec>,
        note: Option<HarnessEvent>,
    ) -> Result<(Session, mpsc::Receiver<HarnessEvent>), LaunchError> {
        let (mut child, pending) = confine::start(spec, command)?;
        let pid = child.id().unwrap_or(0);
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(LaunchError::Invalid("the harness's stdio was not captured".into()));
        };
        let (events_tx, events_rx) = mpsc::channel(event_capacity.max(16));
        let confined = match pending {
            Some(pending) => Some(pending.finish(spec, &mut child, events_tx.clone()).await?),
            None => None,
        };

        let stdin: Stdin = Arc::new(tokio::sync::Mutex::new(Some(stdin)));
        for line in codec.start() {
            if let Err(e) = write_to(&stdin, line).await {
                return Err(LaunchError::ExitedEarly(format!("writing its first input failed: {e}")));
            }
        }
        let codec = Arc::new(Mutex::new(codec));
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        if let Some(note) = note
            && let Err(e) = events_tx.try_send(note)
        {
            // Cannot happen: the channel is new, has room and its receiver is held here.
            tracing::warn!(error = %e, "queueing the fresh-conversation note failed");
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
        if let Some(confined) = &confined {
            confine::watch_limits(spec, confined, events_tx.clone(), exited.clone());
        }
        tokio::spawn(watch_exit(child, reader, events_tx, exited_tx, confined));

        let session = Session { kind: spec.kind, pid, stdin, codec, pending, exited };
        session.wait_ready(ready_rx, spec.ready_timeout).await?;
        Ok((session, events_rx))
    }

    /// Waits until the reader saw the harness say it is ready; kills it after `timeout`.
    async fn wait_ready(&self, ready: oneshot::Receiver<()>, timeout: Duration) -> Result<(), LaunchError> {
        let mut exited = self.exited.clone();
        tokio::select! {
            ready = ready => match ready {
                Ok(()) => Ok(()),
                Err(_) => Err(LaunchError::ExitedEarly("its output ended".into())),
            },
            _ = exited.wait_for(|e| *e) => Err(LaunchError::ExitedEarly("see stderr.log in the session directory".into())),
            () = tokio::time::sleep(timeout) => {
                self.kill();
                Err(LaunchError::NotReady(timeout))
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
        if !line.is_empty()
            && let Err(e) = self.write_line(line).await
        {
            // The signals below stop it anyway.
            tracing::debug!(pid = self.pid, error = %e, "writing the shutdown line to the harness");
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
        if tokio::time::timeout(grace, exited.wait_for(|e| *e)).await.is_err() {
            tracing::warn!(pid = self.pid, "harness still not reaped after SIGKILL and {grace:?}");
        }
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

/// The harness's command in a clean environment (the user's own settings never leak into a
/// session), with the kind's arguments and files added, and the codec that speaks to it.
fn prepare_command(spec: &LaunchSpec, resume: Resume) -> Result<(Command, Box<dyn Codec>), LaunchError> {
    std::fs::create_dir_all(spec.session_dir.join("home")).map_err(LaunchError::files(spec.session_dir.clone()))?;
    std::fs::create_dir_all(&spec.cwd).map_err(LaunchError::files(spec.cwd.clone()))?;
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.program_args)
        .current_dir(&spec.cwd)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", spec.session_dir.join("home"))
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let codec = kinds::prepare(spec, &mut command, resume)?;
    Ok((command, codec))
}

/// Waits for the child's exit, forwards everything the harness printed before it, then
/// reports the exit as the last event and marks the session exited.
async fn watch_exit(
    mut child: Child,
    reader: tokio::task::JoinHandle<()>,
    events: mpsc::Sender<HarnessEvent>,
    exited: watch::Sender<bool>,
    confined: Option<confine::Confined>,
) {
    let status = child.wait().await;
    // Its network's listeners stop with it.
    drop(confined);
    if let Err(e) = reader.await {
        tracing::warn!(error = %e, "the harness's output reader ended abnormally");
    }
    let (code, signal) = match &status {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            (status.code(), status.signal())
        }
        Err(e) => {
            tracing::warn!(error = %e, "waiting for the harness's exit failed");
            (None, None)
        }
    };
    // A closed channel means the owner stopped listening (it dropped the session's events);
    // nobody is left to tell.
    let _ = events.send(HarnessEvent::Exited { code, signal }).await;
    exited.send_replace(true);
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
                            // The sender stopped waiting (it timed out); the answer is stale.
                            let _ = waiter.send(outcome);
                        }
                    }
                    Decoded::Event(HarnessEvent::Ready) if ready.is_some() => {
                        if let Some(ready) = ready.take() {
                            // The launch stopped waiting (it timed out and killed the harness).
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
