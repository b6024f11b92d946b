//! `canopy doctor`: can this machine run the workspace's sessions?
//!
//! Reports `nats-server`, the confinement this machine offers (bubblewrap and its version,
//! whether it can build the namespaces, the kernel's Landlock ABI, and `[sandbox] mode`),
//! and every harness: where its program is, its `--version`, and for
//! Claude Code and Codex whether a session actually starts (the adapter's launch and
//! handshake with the configured settings, confined as `[sandbox]` says, then a stop, with
//! no model call). Codex is ready
//! only once its MCP server is, so doctor serves a stand-in endpoint with no tools for it
//! (`canopy_tools::probe`: the runner's HTTP front and transport, an empty tool list, no
//! daemon). Exits 69 when something the configuration needs (`nats-server`, or a harness a
//! configured role runs) is missing or broken. It reads `canopy.toml` from the data directory
//! when there is one and needs no daemon; it changes nothing but a scratch directory it
//! removes (`doctor-<pid>` in the data directory, since Codex refuses to put its helper
//! binaries under the system temporary directory).

use std::path::{Path, PathBuf};
use std::time::Duration;

use canopy_config::{Config, DataDir};
use canopy_harness::{
    Capability, HarnessKind, HarnessSettings, LaunchSpec, Limits, Network, Prompt, SandboxMode, SandboxSettings,
    Session,
};
use serde::Serialize;

use crate::exit::{EXIT_UNAVAILABLE, EXIT_USAGE};
use crate::output;
use crate::writer::{errln, outln};

/// One line of the report.
#[derive(Debug, Serialize)]
pub struct Check {
    pub name: String,
    /// Whether the configuration needs it (`nats-server` always; a harness when a role
    /// runs it).
    pub required: bool,
    pub ok: bool,
    pub path: Option<String>,
    pub version: Option<String>,
    /// For harnesses Canopy can start without a model call: whether a session started.
    pub session_starts: Option<bool>,
    pub problem: Option<String>,
    /// Works, but not as it should (`[sandbox] mode = "off"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    /// Everything required is there and works.
    pub ok: bool,
    pub checks: Vec<Check>,
}

pub async fn run(dir: &DataDir, json: bool) -> u8 {
    let config = match Config::load(&dir.config()) {
        Ok(config) => config,
        Err(e) => {
            if json {
                output::json(
                    &serde_json::json!({"error": {"code": "invalid_argument", "message": e.to_string(), "field": e.key}}),
                );
            } else {
                errln!("error: {e}");
            }
            return EXIT_USAGE;
        }
    };
    let scratch = Scratch::new(dir.root());
    let mut report =
        report(&config, &canopy_runner::wiring::sandbox_settings(&config, dir.root()), &scratch.path).await;
    drop(scratch);
    let settings = config_check(&config, dir);
    let refused = !settings.ok;
    report.ok &= settings.ok;
    report.checks.insert(0, settings);
    if json {
        output::json(&report);
    } else {
        for check in &report.checks {
            let mark = match (check.ok, check.required) {
                _ if check.warning.is_some() => "WARNING",
                (true, _) => "ok     ",
                // Found, but it cannot run a session as configured (no credential, fails to start).
                (false, true) if check.path.is_some() => "NOT READY",
                (false, true) => "MISSING",
                (false, false) => "absent ",
            };
            let mut line = format!("{mark} {}", check.name);
            if let Some(path) = &check.path {
                line.push_str(&format!(" {path}"));
            }
            if let Some(version) = &check.version {
                line.push_str(&format!(" ({version})"));
            }
            if check.session_starts == Some(true) {
                line.push_str("; a session starts");
            }
            if let Some(problem) = &check.problem {
                line.push_str(&format!(": {problem}"));
            }
            if let Some(warning) = &check.warning {
                line.push_str(&format!(": {warning}"));
            }
            if !check.required {
                line.push_str(" [no configured role uses it]");
            }
            outln!("{line}");
        }
        if refused {
            errln!("canopy doctor: the daemon would refuse this canopy.toml (see above)");
        } else if !report.ok {
            errln!("canopy doctor: something the configured roles need is missing (see above)");
        }
    }
    match (refused, report.ok) {
        (true, _) => EXIT_USAGE,
        (false, true) => 0,
        (false, false) => EXIT_UNAVAILABLE,
    }
}

/// What the daemon checks of `canopy.toml` at start beyond its syntax: role harnesses and
/// scripts, the prompt bundle, the sandbox's grants. A refusal names the key; a setting
/// the daemon ignores is a warning.
fn config_check(config: &Config, dir: &DataDir) -> Check {
    let path = dir.config();
    let mut check = Check {
        name: "canopy.toml".into(),
        required: true,
        ok: true,
        path: Some(path.display().to_string()),
        version: None,
        session_starts: None,
        problem: None,
        warning: None,
    };
    let roles =
        canopy_daemon::roles::RoleDefaults::resolve(config, &path, dir.root(), canopy_harness::scripted::check_script);
    let checked = roles
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|_| canopy_daemon::bundle::Bundles::open(config, &path, dir.root()).map(|_| ()))
        .and_then(|()| canopy_runner::wiring::check_grants(config, &path, dir.root()));
    if let Err(e) = checked {
        check.ok = false;
        check.problem = Some(format!("{}: {}", e.key, e.message));
    }
    if let Ok(roles) = &roles
        && !roles.warnings.is_empty()
    {
        let lines: Vec<String> = roles.warnings.iter().map(|(key, why)| format!("{key} {why}")).collect();
        check.warning = Some(lines.join("; "));
    }
    check
}

/// Where session start checks put their files; removed on drop, with the data directory
/// itself when doctor had to create it.
struct Scratch {
    path: PathBuf,
    created_root: Option<PathBuf>,
}

impl Scratch {
    fn new(root: &Path) -> Scratch {
        let created_root = (!root.exists()).then(|| root.to_owned());
        Scratch { path: root.join(format!("doctor-{}", std::process::id())), created_root }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Absent when no session check ran; any other failure leaves a scratch directory
        // named for this process, which the report cannot mention any more.
        if let Err(e) = std::fs::remove_dir_all(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("removing doctor's scratch directory {}: {e}", self.path.display());
        }
        if let Some(root) = &self.created_root {
            // Only if empty: anything else in it is not doctor's, so a refusal is right.
            let _ = std::fs::remove_dir(root);
        }
    }
}

/// Run roles pinned to the scripted stand-in while Managers run a real harness: their runs end
/// `done` without a model call, so doctor says so (and such runs are marked `scripted`).
fn scripted_runs_under_real_managers(config: &Config) -> Option<String> {
    let manager = config.roles.get("manager").map(|r| r.harness.as_str()).unwrap_or("scripted");
    if matches!(manager, "scripted" | "") {
        return None;
    }
    let pinned: Vec<&str> = config
        .roles
        .iter()
        .filter(|(role, r)| *role != "manager" && *role != "supervisor" && r.harness == "scripted")
        .map(|(role, _)| role.as_str())
        .collect();
    (!pinned.is_empty()).then(|| {
        format!(
            "Managers run {manager}, but runs of {} stay on the scripted stand-in (no model call; marked scripted): \
             set harness = \"manager\" under [roles.<role>] to have them follow their Manager",
            pinned.join(", ")
        )
    })
}

pub async fn report(config: &Config, sandbox: &SandboxSettings, scratch: &Path) -> Report {
    let used: Vec<HarnessKind> = config.roles.values().filter_map(|r| HarnessKind::parse(&r.harness)).collect();
    let mut checks = vec![nats_check().await];
    checks.extend(sandbox_checks(sandbox));
    for &kind in HarnessKind::ALL {
        let required = used.contains(&kind);
        let check = match kind.default_program() {
            None => Check {
                name: kind.as_str().into(),
                required,
                ok: true,
                path: std::env::current_exe().ok().map(|p| p.display().to_string()),
                version: Some(format!("built in, canopy {}", env!("CARGO_PKG_VERSION"))),
                session_starts: None,
                problem: None,
                warning: scripted_runs_under_real_managers(config),
            },
            Some(default) => {
                harness_check(
                    kind,
                    default,
                    &canopy_runner::wiring::harness_settings(config, kind),
                    sandbox,
                    required,
                    scratch,
                )
                .await
            }
        };
        checks.push(check);
    }
    let ok = checks.iter().all(|c| c.ok || !c.required);
    Report { ok, checks }
}

async fn nats_check() -> Check {
    let mut check = Check {
        name: "nats-server".into(),
        required: true,
        ok: false,
        path: None,
        version: None,
        session_starts: None,
        problem: None,
        warning: None,
    };
    match canopy_bus::find_nats_server() {
        Ok(path) => {
            check.path = Some(path.display().to_string());
            match version(&path, &[]).await {
                Ok(v) => {
                    check.version = Some(v);
                    check.ok = true;
                }
                Err(e) => check.problem = Some(e),
            }
        }
        Err(e) => check.problem = Some(e.to_string()),
    }
    check
}

/// What confinement this machine offers, and whether `[sandbox]` asks for it: namespaces and
/// Landlock (`sandbox`), the network mode (`network`) and the limits and how this machine
/// enforces them (`limits`).
fn sandbox_checks(sandbox: &SandboxSettings) -> Vec<Check> {
    let probe = Capability::probe(&sandbox.bwrap);
    let mut parts = Vec::new();
    if let Ok((_, version)) = &probe.bwrap {
        parts.push(version.clone());
    }
    parts.push(match &probe.namespaces {
        Ok(()) => "user, mount and PID namespaces usable".to_owned(),
        Err(_) => "namespaces not usable".to_owned(),
    });
    parts.push(format!("Landlock ABI {}", probe.landlock_abi));
    let usable = probe.usable(Network::Host);
    let required = sandbox.mode == SandboxMode::Required;
    let check = |name: &str, ok: bool, version: String, problem: Option<String>, warning: Option<&str>| Check {
        name: name.into(),
        required,
        ok,
        path: None,
        version: Some(version),
        session_starts: None,
        problem,
        warning: warning.map(str::to_owned),
    };
    let mut confinement = check(
        "sandbox",
        usable.is_ok(),
        parts.join(", "),
        usable.err().map(|e| e.0),
        (sandbox.mode == SandboxMode::Off).then_some(canopy_runner::wiring::UNCONFINED_WARNING),
    );
    confinement.path = probe.bwrap.as_ref().ok().map(|(path, _)| path.display().to_string());
    let (network_ok, network) = match (sandbox.network, &probe.network) {
        (Network::Proxy, Ok(())) => (
            true,
            format!(
                "proxy: a namespace of its own per session, its MCP and model endpoints relayed, an egress proxy \
                 allowing {}",
                match sandbox.allow_hosts.is_empty() {
                    true => "nothing else".to_owned(),
                    false => sandbox.allow_hosts.join(", "),
                }
            ),
        ),
        (Network::Proxy, Err(e)) => (false, format!("proxy: {e}; set [sandbox] network = \"host\" on this machine")),
        (Network::Host, _) => (true, "host: the machine's network, TCP connect limited by port".to_owned()),
    };
    let host = (sandbox.mode == SandboxMode::Required && sandbox.network == Network::Host)
        .then_some(canopy_runner::wiring::HOST_NETWORK_WARNING);
    let problem = (!network_ok).then(|| network.clone());
    vec![
        confinement,
        check("network", network_ok, network, problem, host),
        check("limits", true, limits_line(&sandbox.limits), None, None),
    ]
}

/// The limits and how this machine enforces them: a cgroup per session where the machine
/// offers one, the per-process limits (the kernel exempts a root runner from the process one),
/// and the runner's watch. Probed from this process, so it holds for a runner started as
/// doctor was (the same user, the same cgroup).
fn limits_line(limits: &Limits) -> String {
    // The owner of this process's /proc entry is its effective user.
    let root = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0).unwrap_or(false);
    let cgroups = canopy_harness::cgroup::Cgroups::probed();
    let kernel = match cgroups {
        canopy_harness::cgroup::Cgroups::Unavailable(_) => match root {
            true => "the runner's watch (the kernel exempts a root runner from the process rlimit)",
            false => "a per-session process rlimit and the runner's watch",
        },
        _ => "the session's cgroup and the runner's watch",
    };
    format!(
        "per session: {} processes, {} memory, {} open files, CPU weight {}; enforced by {kernel}, open files \
         by rlimit; {}",
        limits.max_processes,
        canopy_core::size::Size(limits.max_memory),
        limits.max_open_files,
        limits.cpu_weight,
        cgroups.describe()
    )
}

async fn harness_check(
    kind: HarnessKind,
    default: &str,
    settings: &HarnessSettings,
    sandbox: &SandboxSettings,
    required: bool,
    scratch: &Path,
) -> Check {
    let mut check = Check {
        name: kind.as_str().into(),
        required,
        ok: false,
        path: None,
        version: None,
        session_starts: None,
        problem: None,
        warning: None,
    };
    let wanted = settings.program.clone().unwrap_or_else(|| PathBuf::from(default));
    let Some(program) = canopy_harness::find_program(&wanted, std::env::var_os("PATH").as_deref()) else {
        check.problem = Some(match &settings.program {
            Some(path) => format!("[harness.{}] bin = {} is not an executable file", kind.as_str(), path.display()),
            None => format!("`{default}` is not on PATH; install it or set [harness.{}] bin", kind.as_str()),
        });
        return check;
    };
    check.path = Some(program.display().to_string());
    match version(&program, &settings.env).await {
        Ok(v) => check.version = Some(v),
        Err(e) => {
            check.problem = Some(e);
            return check;
        }
    }
    // Claude Code answers its `initialize` handshake, Codex creates its thread and connects
    // its MCP server, omp prints its `ready` frame and pi answers `get_state` (once its
    // extension has listed Canopy's tools), without a model call, so a session
    // can be started for real (confined as configured).
    if matches!(kind, HarnessKind::Claude | HarnessKind::Codex | HarnessKind::Omp | HarnessKind::Pi) {
        if kind == HarnessKind::Claude && !canopy_harness::claude::has_credentials(&settings.env) {
            check.problem = Some(format!(
                "found, no credential: set one of {} in [harness.claude.env] or in the environment that runs canopy",
                canopy_harness::claude::CREDENTIAL_ENV.join(", ")
            ));
            return check;
        }
        // Codex's missing API key is refused by the adapter at launch, naming the variable.
        errln!("doctor: starting a {} session to check it (no model call)...", kind.as_str());
        match session_starts(kind, &program, settings, sandbox, scratch).await {
            Ok(()) => check.session_starts = Some(true),
            Err(e) => {
                check.session_starts = Some(false);
                check.problem = Some(format!("a session did not start: {e}"));
                return check;
            }
        }
    }
    check.ok = true;
    check
}

/// `program --version` in a clean environment (plus the harness's configured env), first line.
async fn version(program: &Path, env: &[(String, String)]) -> Result<String, String> {
    let home = std::env::temp_dir().join(format!("canopy-doctor-home-{}", std::process::id()));
    // Without it the program runs with a HOME that does not exist, and its answer says so.
    if let Err(e) = std::fs::create_dir_all(&home) {
        tracing::debug!("creating the scratch HOME {}: {e}", home.display());
    }
    let mut command = tokio::process::Command::new(program);
    command
        .arg("--version")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &home)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(20), command.output()).await;
    if let Err(e) = std::fs::remove_dir_all(&home)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("removing the scratch HOME {}: {e}", home.display());
    }
    let output = match output {
        Err(_) => return Err(format!("{} --version did not finish within 20s", program.display())),
        Ok(Err(e)) => return Err(format!("running {} --version: {e}", program.display())),
        Ok(Ok(output)) => output,
    };
    // Most print it on stdout; pi prints it on stderr.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let text = if stdout.trim().is_empty() { String::from_utf8_lossy(&output.stderr) } else { stdout };
    let first = text.lines().next().unwrap_or_default().trim().to_owned();
    if !output.status.success() || first.is_empty() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!("{} --version failed ({}): {}", program.display(), output.status, stderr.trim()));
    }
    Ok(first)
}

/// Starts one session of `kind` in the scratch directory, waits until it is ready, stops it.
/// Claude Code needs no MCP server to be ready (nothing listens at its URL); Codex waits for
/// its MCP server, so it gets the stand-in endpoint with no tools.
async fn session_starts(
    kind: HarnessKind,
    program: &Path,
    settings: &HarnessSettings,
    sandbox: &SandboxSettings,
    scratch: &Path,
) -> Result<(), String> {
    const TOKEN: &str = "cns_doctor";
    let dir = scratch.join(kind.as_str());
    let probe = match kind {
        // Codex connects its MCP server before it is ready, and pi's extension lists the tools.
        HarnessKind::Codex | HarnessKind::Pi => Some(
            canopy_tools::probe::serve_probe(TOKEN.to_owned())
                .await
                .map_err(|e| format!("serving a stand-in MCP endpoint: {e}"))?,
        ),
        _ => None,
    };
    let spec = LaunchSpec {
        kind,
        program: program.to_owned(),
        program_args: Vec::new(),
        session_dir: dir.join("session"),
        agent_dir: None,
        cwd: dir.join("session").join("work"),
        builtin_tools: Vec::new(),
        prompt: Prompt::replace("canopy doctor: a session start check.".into()),
        // For Claude Code nothing listens there: the check needs no tools and makes no model call.
        mcp_url: probe.as_ref().map_or_else(|| "http://127.0.0.1:9/mcp".to_owned(), |p| p.url.clone()),
        mcp_token: TOKEN.into(),
        env: settings.env.clone(),
        model: settings.model.clone(),
        provider: settings.provider.clone(),
        script: None,
        max_line_bytes: 1 << 20,
        ready_timeout: Duration::from_secs(30),
        sandbox: sandbox.clone(),
        repo_mirror: None,
        cwd_read_only: false,
        subagents: Vec::new(),
    };
    let result = match Session::launch(spec, 64).await {
        Ok((session, _events)) => {
            session.shutdown(Duration::from_secs(2)).await;
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    };
    drop(probe);
    if let Err(e) = std::fs::remove_dir_all(&dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("removing the session check's directory {}: {e}", dir.display());
    }
    result
}
