//! Running one git (or check) command under the trust its repository deserves.
//!
//! `Git::trusted` runs git as the daemon, for Canopy's mirror, a fresh checkout and the
//! operator's repository: hooks off (`core.hooksPath=/dev/null`), no terminal prompt, no
//! signing, Canopy's identity for the commits it makes. `Git::confined` runs a command inside
//! a session-like sandbox (`canopy_harness::sandbox`): the granted paths only, no TCP at all,
//! a clean environment that ignores the operator's git configuration. Does not choose which
//! trust a repository gets; the operations in `ops.rs` do.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use canopy_harness::sandbox::{self, Capability, Grants, SandboxMode, SandboxSettings};
use tokio::process::Command;

/// Why a git command failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GitError {
    #[error("running {what}: {reason}")]
    Spawn { what: String, reason: String },
    #[error("{what} failed (exit {code}): {stderr}")]
    Failed { what: String, code: i32, stderr: String },
    #[error("{what} took longer than {}", humantime(*.limit))]
    Timeout { what: String, limit: Duration },
    #[error("{0}")]
    Unconfinable(String),
    #[error("{0}")]
    Invalid(String),
    /// The base branch moved since the merge onto it was prepared (a landing refuses it).
    #[error("{base} moved from {from} to {to} since the merge was prepared; approve again to merge onto it")]
    BaseMoved { base: String, from: String, to: String },
}

fn humantime(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

/// The paths a confined command is granted: `write` read-write, `read` read-only.
#[derive(Debug, Clone, Copy)]
pub struct Confined<'a> {
    pub write: &'a Path,
    pub read: &'a [&'a Path],
}

/// How Canopy runs git: the program, and the sandbox a confined command gets.
#[derive(Debug, Clone)]
pub struct Git {
    program: PathBuf,
    sandbox: SandboxSettings,
    /// The longest a check command may run.
    pub check_timeout: Duration,
}

/// What a finished command printed.
#[derive(Debug, Clone)]
pub(crate) struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub(crate) fn ok(&self) -> bool {
        self.code == 0
    }
}

/// Options every git command gets, whatever its trust.
const BASE_CONFIG: &[&str] = &[
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.quotepath=off",
    "-c",
    "color.ui=false",
    "-c",
    "commit.gpgsign=false",
    "-c",
    "tag.gpgsign=false",
    "-c",
    "advice.detachedHead=false",
    "-c",
    "protocol.file.allow=always",
];

impl Git {
    /// Git found as `program` (a name on `PATH` or a path), confined by `sandbox`.
    pub fn new(program: impl Into<PathBuf>, sandbox: SandboxSettings, check_timeout: Duration) -> Git {
        Git { program: program.into(), sandbox, check_timeout }
    }

    /// The git program (a name on `PATH` or a path).
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The data directory checkouts and mirrors live in.
    pub fn data_dir(&self) -> &Path {
        &self.sandbox.data_dir
    }

    /// Runs git as the daemon in `cwd` (a trusted repository); `Failed` unless it exits 0.
    pub(crate) async fn trusted(&self, cwd: &Path, args: &[&str]) -> Result<Output, GitError> {
        let out = self.trusted_any(cwd, args).await?;
        require_ok(args, out)
    }

    /// Runs git as the daemon and returns whatever it exited with.
    pub(crate) async fn trusted_any(&self, cwd: &Path, args: &[&str]) -> Result<Output, GitError> {
        run(self.trusted_command(cwd, args), &describe(args)).await
    }

    /// Runs git as the daemon with configuration `config` given in its environment (never
    /// on its command line, where other processes could read a credential); `Failed` unless
    /// it exits 0.
    pub(crate) async fn trusted_with(
        &self,
        cwd: &Path,
        args: &[&str],
        config: &[(&str, &str)],
    ) -> Result<Output, GitError> {
        let mut command = self.trusted_command(cwd, args);
        command.env("GIT_CONFIG_COUNT", config.len().to_string());
        for (i, (key, value)) in config.iter().enumerate() {
            command.env(format!("GIT_CONFIG_KEY_{i}"), key).env(format!("GIT_CONFIG_VALUE_{i}"), value);
        }
        require_ok(args, run(command, &describe(args)).await?)
    }

    /// Git as the daemon runs it in a trusted repository: hooks off, no prompt, no system
    /// configuration, Canopy's identity.
    fn trusted_command(&self, cwd: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(&self.program);
        command.current_dir(cwd).args(BASE_CONFIG).args(args);
        command.env("GIT_TERMINAL_PROMPT", "0").env("GIT_CONFIG_NOSYSTEM", "1");
        command.env("GIT_AUTHOR_NAME", "Canopy").env("GIT_AUTHOR_EMAIL", "canopy@localhost");
        command.env("GIT_COMMITTER_NAME", "Canopy").env("GIT_COMMITTER_EMAIL", "canopy@localhost");
        command
    }

    /// Runs git as the daemon and keeps only the first `max` bytes of what it prints (the rest
    /// is not read: the process is killed), and whether there was more; `Failed` unless it
    /// exits 0 having printed at most `max` bytes.
    pub(crate) async fn trusted_head(&self, cwd: &Path, args: &[&str], max: usize) -> Result<(String, bool), GitError> {
        use tokio::io::AsyncReadExt;
        let mut command = self.trusted_command(cwd, args);
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).kill_on_drop(true);
        let what = describe(args);
        let spawn_error = |e: std::io::Error| GitError::Spawn { what: what.clone(), reason: e.to_string() };
        let mut child = command.spawn().map_err(spawn_error)?;
        let stdout = child.stdout.take().ok_or_else(|| spawn_error(std::io::Error::other("no output pipe")))?;
        let mut kept = Vec::new();
        stdout.take(max as u64 + 1).read_to_end(&mut kept).await.map_err(spawn_error)?;
        let more = kept.len() > max;
        kept.truncate(max);
        if more {
            // Enough read: the rest is never wanted, so the process ends here.
            let _ = child.kill().await;
        } else {
            let status = child.wait().await.map_err(spawn_error)?;
            if !status.success() {
                return Err(GitError::Failed { what, code: status.code().unwrap_or(-1), stderr: String::new() });
            }
        }
        let mut text = String::from_utf8_lossy(&kept).into_owned();
        if more && text.ends_with('\u{FFFD}') {
            text.pop();
        }
        Ok((text, more))
    }

    /// Runs git confined to `grants`, in `cwd`; `Failed` unless it exits 0.
    pub(crate) async fn confined(&self, grants: Confined<'_>, cwd: &Path, args: &[&str]) -> Result<Output, GitError> {
        let out = self.confined_any(grants, cwd, args).await?;
        require_ok(args, out)
    }

    /// Runs git confined, whatever it exits with.
    pub(crate) async fn confined_any(
        &self,
        grants: Confined<'_>,
        cwd: &Path,
        args: &[&str],
    ) -> Result<Output, GitError> {
        let mut full: Vec<&str> = BASE_CONFIG.to_vec();
        full.extend_from_slice(args);
        let program = self.program.display().to_string();
        let (command, _rules) = self.confined_command(grants, cwd, &program, &full, &describe(args))?;
        run(command, &describe(args)).await
    }

    /// Runs `sh -c command` confined in `cwd` for at most `limit`, its standard error into its
    /// output, keeping the last `keep` bytes of that output (a timed-out one's too).
    pub(crate) async fn confined_shell(
        &self,
        grants: Confined<'_>,
        cwd: &Path,
        command: &str,
        limit: Duration,
        keep: usize,
    ) -> Result<Captured, GitError> {
        let script = format!("exec 2>&1\n{command}");
        let what = format!("the check `{command}`");
        let (mut command, _rules) = self.confined_command(grants, cwd, "sh", &["-c", &script], &what)?;
        // A check runs code a session wrote: held to a session's process and memory limits by
        // a cgroup of its own where the machine offers one.
        let limits = &self.sandbox.limits;
        let group = match self.sandbox.mode {
            SandboxMode::Off => None,
            SandboxMode::Required => canopy_harness::cgroup::create(limits).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "no cgroup for a check; it runs without process and memory limits");
                None
            }),
        };
        if let Some(group) = &group {
            canopy_sys::namespace::join_cgroups_in_child(&mut command, group.procs_files());
        }
        let mut captured = capture(command, &what, limit, keep).await;
        if let (Some(group), Ok(captured)) = (&group, &mut captured)
            && let Some(reason) = group.hit(limits)
        {
            captured.log.push_str(&format!("\ncanopy: the check hit a [sandbox] limit: {reason}\n"));
            if captured.code == Some(0) {
                captured.code = Some(1);
            }
        }
        captured
    }

    /// The command for `program args` in `cwd`, wrapped in the sandbox `grants` allow (as is
    /// when the sandbox is off), and the Landlock rules its child enters: they must outlive
    /// the spawn, so the caller holds them until the command has run.
    fn confined_command(
        &self,
        grants: Confined<'_>,
        cwd: &Path,
        program: &str,
        args: &[&str],
        what: &str,
    ) -> Result<(Command, Option<canopy_sys::ConnectRules>), GitError> {
        let mut inner = Command::new(program);
        inner.current_dir(cwd).args(args).env_clear();
        let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
        inner.env("PATH", path).env("HOME", "/tmp").env("LANG", "C.UTF-8");
        inner.env("GIT_CONFIG_NOSYSTEM", "1").env("GIT_CONFIG_GLOBAL", "/dev/null");
        inner.env("GIT_TERMINAL_PROMPT", "0");
        if self.sandbox.mode == SandboxMode::Off {
            return Ok((inner, None));
        }
        let data = &self.sandbox.data_dir;
        let refuse = |e: sandbox::Unconfinable| GitError::Unconfinable(e.0);
        sandbox::check_grant("a checkout", grants.write, data, Some(grants.write)).map_err(refuse)?;
        for path in grants.read {
            sandbox::check_grant("a mirror", path, data, Some(path)).map_err(refuse)?;
        }
        for path in &self.sandbox.read_only {
            sandbox::check_grant("sandbox.read_only", path, data, None).map_err(refuse)?;
        }
        let mut read_only: Vec<PathBuf> = grants.read.iter().map(|p| p.to_path_buf()).collect();
        read_only.extend(self.sandbox.read_only.iter().cloned());
        if let Some(found) = canopy_harness::find_program(&self.program, std::env::var_os("PATH").as_deref()) {
            read_only.extend(sandbox::program_paths(&found));
        }
        let grants = Grants {
            read_only,
            read_write: vec![grants.write.to_path_buf()],
            protected: Vec::new(),
            connect_ports: Vec::new(),
            // Git and the checks need no network: with a namespace of their own, nothing they
            // run reaches one (no UDP, no DNS either).
            own_network: self.sandbox.network == sandbox::Network::Proxy,
            hosts_file: None,
        };
        let bwrap = Capability::cached(&self.sandbox.bwrap).usable(self.sandbox.network).map_err(refuse)?;
        let (outer, rules) = sandbox::wrap(&bwrap, &grants, &inner, None).map_err(refuse)?;
        tracing::trace!(what, "confined");
        Ok((outer, Some(rules)))
    }
}

/// `git a b` for messages (the first few arguments).
fn describe(args: &[&str]) -> String {
    let shown: Vec<&str> = args.iter().take(3).copied().collect();
    format!("git {}", shown.join(" "))
}

fn require_ok(args: &[&str], out: Output) -> Result<Output, GitError> {
    match out.ok() {
        true => Ok(out),
        false => Err(GitError::Failed { what: describe(args), code: out.code, stderr: last_lines(&out.stderr, 6) }),
    }
}

/// The last `n` non-empty lines of `text`, each cut to 300 characters.
pub(crate) fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim_end).filter(|l| !l.is_empty()).collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].iter().map(|l| l.chars().take(300).collect::<String>()).collect::<Vec<_>>().join("\n")
}

/// The longest one git command may take (a fetch from a remote that stopped answering holds its
/// repository's lock, so it must end): killed after this, as `Timeout`.
const GIT_TIMEOUT: Duration = Duration::from_secs(600);

async fn run(mut command: Command, what: &str) -> Result<Output, GitError> {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let child = command.spawn().map_err(|e| GitError::Spawn { what: what.to_owned(), reason: e.to_string() })?;
    // Dropping the future on the timeout drops the child, which `kill_on_drop` kills.
    let out = tokio::time::timeout(GIT_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| GitError::Timeout { what: what.to_owned(), limit: GIT_TIMEOUT })?
        .map_err(|e| GitError::Spawn { what: what.to_owned(), reason: e.to_string() })?;
    Ok(Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// What a bounded command printed (standard error folded into its output) and how it ended.
#[derive(Debug, Clone)]
pub(crate) struct Captured {
    /// Its exit code; `None` when it ran out of time and was killed.
    pub code: Option<i32>,
    /// The last bytes of its output (at most the `keep` asked for), lossily UTF-8.
    pub log: String,
}

/// Runs `command` (in its own process group, so a timeout ends everything it started) for at
/// most `limit`, keeping only the last `keep` bytes of its standard output as it goes.
async fn capture(mut command: Command, what: &str, limit: Duration, keep: usize) -> Result<Captured, GitError> {
    use tokio::io::AsyncReadExt;
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).kill_on_drop(true);
    command.process_group(0);
    let spawn_error = |e: std::io::Error| GitError::Spawn { what: what.to_owned(), reason: e.to_string() };
    let mut child = command.spawn().map_err(spawn_error)?;
    let mut stdout = child.stdout.take().ok_or_else(|| spawn_error(std::io::Error::other("no output pipe")))?;
    let mut kept: Vec<u8> = Vec::new();
    let finished = tokio::time::timeout(limit, async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = stdout.read(&mut buf).await.map_err(spawn_error)?;
            if n == 0 {
                break;
            }
            kept.extend_from_slice(&buf[..n]);
            // Trimmed in batches, so a long output costs a copy per `keep` bytes, not per read.
            if kept.len() > 2 * keep.max(1) {
                kept.drain(..kept.len() - keep);
            }
        }
        child.wait().await.map_err(spawn_error)
    })
    .await;
    if kept.len() > keep {
        kept.drain(..kept.len() - keep);
    }
    let log = String::from_utf8_lossy(&kept).into_owned();
    match finished {
        Ok(status) => Ok(Captured { code: Some(status?.code().unwrap_or(-1)), log }),
        Err(_) => {
            if let Some(pid) = child.id() {
                canopy_sys::signal_group(pid, libc::SIGKILL);
            }
            // Reaped here, so the timed-out check leaves no zombie; its group was killed above.
            let _ = child.kill().await;
            Ok(Captured { code: None, log })
        }
    }
}
