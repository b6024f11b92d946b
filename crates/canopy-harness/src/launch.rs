//! What a harness launch is made of: the session's prompt, the `LaunchSpec`, the input
//! attribution (`InputContext`), the launch errors, whether a launch resumes the previous
//! conversation, and what a confined session is granted.
//!
//! The vocabulary the codecs (`claude`, `codex`, `omp`, `pi`, `scripted`) and `session`
//! share, below both, so neither imports the other. Owns `write_private`, how a launch writes
//! a file that may hold a credential (0600), and `forget_record`, how a failed resume is
//! forgotten. Does not start processes (`session` does) or build a harness's command
//! line (each adapter does).

use std::path::PathBuf;
use std::time::Duration;

use crate::sandbox::{self, Grants, SandboxSettings, Unconfinable};
use crate::{HarnessKind, PromptMode, ProviderSettings};

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
    /// The working directory is read-only to the session (a reviewer run's checkout).
    pub cwd_read_only: bool,
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

impl LaunchError {
    /// The error of a file or directory `path` a launch could not make, for `map_err`.
    pub(crate) fn files(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> LaunchError {
        let path = path.into();
        move |source| LaunchError::Files { path, source }
    }
}

/// Whether `prepare` may resume the agent's previous conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resume {
    /// Resume the recorded conversation if there is one (and `agent_dir` is set).
    IfRecorded,
    /// Start a fresh conversation: the resume was tried and failed.
    Fresh,
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
    let protected = match spec.cwd_read_only {
        true => vec![spec.cwd.clone()],
        false => Vec::new(),
    };
    Ok(Grants { read_only, read_write, protected, connect_ports, own_network: false, hosts_file: None })
}

/// Drops the record of a conversation that must not be resumed again. A record already
/// gone is the goal reached; any other failure is logged, and the next launch may try the
/// conversation once more and fall back to a fresh one again.
pub(crate) fn forget_record(record: &std::path::Path) {
    match std::fs::remove_file(record) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(error = %e, path = %record.display(), "removing a conversation record"),
    }
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
        .map_err(LaunchError::files(path))
}

/// A launch spec for unit tests: `kind` with an MCP endpoint on a loopback port, nothing
/// granted, unconfined.
#[cfg(test)]
pub(crate) fn test_spec(kind: crate::HarnessKind, dir: &std::path::Path) -> LaunchSpec {
    LaunchSpec {
        kind,
        program: kind.default_program().unwrap_or("canopy").into(),
        program_args: vec![],
        session_dir: dir.join("s"),
        agent_dir: None,
        cwd: dir.join("w"),
        builtin_tools: Vec::new(),
        prompt: Prompt::replace(String::new()),
        mcp_url: "http://127.0.0.1:1/mcp".into(),
        mcp_token: "t".into(),
        env: vec![],
        model: None,
        provider: None,
        script: None,
        max_line_bytes: 1024,
        ready_timeout: Duration::from_secs(1),
        sandbox: crate::SandboxSettings::off(dir.join("data")),
        repo_mirror: None,
        cwd_read_only: false,
        subagents: Vec::new(),
    }
}
