//! From a workspace's configuration to a runner: the runner's options, each harness's
//! launch settings and the sandbox settings from `canopy.toml`, the start-time check of the
//! sandbox grants, and the warning an unconfined workspace logs.
//!
//! Owns the translation of `canopy_config` types into `canopy_harness` types, so neither
//! crate knows the other and the daemon knows neither; the composition roots (the `canopy`
//! binary, the bench) call it. Does not start anything.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;

use canopy_bus::ApiClient;
use canopy_config::config::{HarnessKeys, NetworkConfig, SandboxModeConfig};
use canopy_config::{Config, ConfigError, DataDir, EMBEDDED_RUNNER, RunnerCredential};
use canopy_core::RunnerId;
use canopy_harness::{HarnessKind, HarnessSettings, Limits, Network, ProviderSettings, SandboxMode, SandboxSettings};

use crate::options::{RunnerOptions, RunnerSettings, RunnerToken};

/// Stops a runner started by `embedded`.
pub type Stop = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// The embedded runner, in the shape `canopy_daemon::DaemonOptions::embedded` takes: started
/// with a client of the daemon's own API once it answers, stopped by the returned closure.
pub fn embedded(
    dir: DataDir,
    config: Config,
    api: ApiClient,
) -> Pin<Box<dyn Future<Output = Result<Stop, String>> + Send>> {
    Box::pin(async move {
        let file = dir.runner_credential(EMBEDDED_RUNNER);
        let credential =
            canopy_config::credentials::read(&file).map_err(|e| format!("preparing the embedded runner: {e}"))?;
        let options = options(&dir, &config, api, &credential, &file)
            .map_err(|e| format!("preparing the embedded runner: {e}"))?;
        let handle = crate::runner::spawn(options).await.map_err(|e| e.to_string())?;
        let stop: Stop = Box::new(move || Box::pin(async move { handle.shutdown().await }));
        Ok(stop)
    })
}

/// The settings the runner copies into every launch of `kind`.
pub fn harness_settings(config: &Config, kind: HarnessKind) -> HarnessSettings {
    let from_keys = |keys: HarnessKeys<'_>| HarnessSettings {
        program: keys.bin.map(Path::to_path_buf),
        model: keys.model.map(str::to_owned),
        env: keys.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        provider: None,
    };
    match kind {
        HarnessKind::Scripted => HarnessSettings::default(),
        HarnessKind::Claude => from_keys(config.harness.claude.keys()),
        HarnessKind::Codex => {
            let codex = &config.harness.codex;
            HarnessSettings {
                provider: codex.provider.as_ref().map(|p| ProviderSettings {
                    base_url: p.base_url.clone(),
                    api_key_env: p.api_key_env.clone(),
                    api: None,
                }),
                ..from_keys(codex.keys())
            }
        }
        HarnessKind::Omp | HarnessKind::Pi => {
            let (table, omp) = match kind {
                HarnessKind::Pi => ("pi", &config.harness.pi),
                _ => ("omp", &config.harness.omp),
            };
            HarnessSettings {
                provider: omp.provider.as_ref().map(|p| ProviderSettings {
                    base_url: p.base_url.clone(),
                    api_key_env: p.api_key_env.clone(),
                    api: Some(p.api.clone()),
                }),
                ..from_keys(omp.keys_as(table))
            }
        }
    }
}

/// How the daemon runs git: `[git]`, confined in checkouts by the same `[sandbox]`
/// as every session.
pub fn git(config: &Config, data_dir: &Path) -> canopy_git::Git {
    canopy_git::Git::new(config.git.program.clone(), sandbox_settings(config, data_dir), config.git.check_timeout)
}

/// The sandbox settings the runner applies to every launch.
pub fn sandbox_settings(config: &Config, data_dir: &Path) -> SandboxSettings {
    let sandbox = &config.sandbox;
    SandboxSettings {
        mode: match sandbox.mode {
            SandboxModeConfig::Required => SandboxMode::Required,
            SandboxModeConfig::Off => SandboxMode::Off,
        },
        bwrap: sandbox.bwrap.clone(),
        read_only: sandbox.read_only.clone(),
        read_write: sandbox.read_write.clone(),
        connect_ports: sandbox.connect_ports.clone(),
        data_dir: data_dir.to_owned(),
        network: match sandbox.network {
            NetworkConfig::Proxy => Network::Proxy,
            NetworkConfig::Host => Network::Host,
        },
        allow_hosts: sandbox.allow_hosts.clone(),
        limits: Limits {
            max_processes: sandbox.max_processes,
            max_memory: sandbox.max_memory.0,
            max_open_files: sandbox.max_open_files,
            cpu_weight: sandbox.cpu_weight,
        },
    }
}

/// The checks of `[sandbox]` (and `prompts.workdir`) that need the file system: every
/// granted path exists (written ones as directories) and none would expose the data
/// directory `data_dir` or the operator's home. The daemon's and a standalone runner's
/// start call this; a refusal exits 64 naming the key (`path` is the `canopy.toml` read).
pub fn check_grants(config: &Config, path: &Path, data_dir: &Path) -> Result<(), ConfigError> {
    use canopy_harness::sandbox::check_grant;
    let refuse = |key: String, message: String| ConfigError { path: path.to_owned(), key, message };
    if config.sandbox.mode == SandboxModeConfig::Off {
        return Ok(());
    }
    let lists = [
        ("sandbox.read_only", &config.sandbox.read_only, false),
        ("sandbox.read_write", &config.sandbox.read_write, true),
    ];
    for (key, paths, write) in lists {
        for (i, granted) in paths.iter().enumerate() {
            let key = format!("{key}[{i}]");
            match std::fs::metadata(granted) {
                Err(e) => return Err(refuse(key, format!("{}: {e}", granted.display()))),
                Ok(meta) if write && !meta.is_dir() => {
                    return Err(refuse(key, format!("{} is not a directory", granted.display())));
                }
                Ok(_) => {}
            }
            check_grant("grants", granted, data_dir, None).map_err(|e| refuse(key, e.to_string()))?;
        }
    }
    if !config.prompts.workdir.trim().is_empty() {
        let dir = config.workdir(data_dir, "");
        check_grant("the shared working directory", &dir, data_dir, None)
            .map_err(|e| refuse("prompts.workdir".into(), e.to_string()))?;
    }
    Ok(())
}

/// The warning every start of an unconfined workspace logs.
pub const UNCONFINED_WARNING: &str = "[sandbox] mode = \"off\": sessions run unconfined and can read the operator \
     token, the session secret and every agent's files; set mode = \"required\" in canopy.toml";

/// The warning every start of a workspace whose sessions share the machine's network logs.
pub const HOST_NETWORK_WARNING: &str = "[sandbox] network = \"host\": sessions share this machine's network and can \
     reach any host on their model endpoints' ports, and send UDP and DNS anywhere; set network = \"proxy\" in \
     canopy.toml where user network namespaces are available";

/// Logs `UNCONFINED_WARNING` when `[sandbox] mode` is off, `HOST_NETWORK_WARNING` when
/// confined sessions share the machine's network.
pub fn warn_if_unconfined(config: &Config) {
    match (config.sandbox.mode, config.sandbox.network) {
        (SandboxModeConfig::Off, _) => tracing::warn!("{UNCONFINED_WARNING}"),
        (SandboxModeConfig::Required, NetworkConfig::Host) => tracing::warn!("{HOST_NETWORK_WARNING}"),
        (SandboxModeConfig::Required, NetworkConfig::Proxy) => {}
    }
}

/// The embedded (or standalone) runner's options from the configuration and its credential.
pub fn options(
    dir: &DataDir,
    config: &Config,
    api: ApiClient,
    credential: &RunnerCredential,
    file: &Path,
) -> std::io::Result<RunnerOptions> {
    let runner = &config.runner;
    let id = RunnerId::parse(&credential.runner_id).map_err(|e| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("runner id {:?}: {e}", credential.runner_id))
    })?;
    let token = RunnerToken::from_file(&credential.token, file.to_owned());
    let current = token.clone();
    let checkouts = crate::checkouts::Checkouts::new(
        git(config, dir.root()),
        dir.sessions(),
        id.clone(),
        std::sync::Arc::new(move || current.get().map_err(|e| e.to_string())),
        config.git.watch_interval,
    );
    Ok(RunnerOptions {
        api,
        id,
        token,
        checkouts,
        name: format!("{}-{}", hostname(), std::process::id()),
        sessions_dir: dir.sessions(),
        scripted_program: std::env::current_exe()?,
        scripted_args: vec![SCRIPTED_SUBCOMMAND.to_owned()],
        harnesses: HarnessKind::ALL.iter().map(|&kind| (kind, harness_settings(config, kind))).collect(),
        sandbox: sandbox_settings(config, dir.root()),
        settings: RunnerSettings {
            sync_interval: runner.sync_interval,
            capacity: runner.capacity,
            restart_backoff_min: runner.restart_backoff_min,
            restart_backoff_max: runner.restart_backoff_max,
            crash_loop_count: runner.crash_loop_count,
            crash_loop_window: runner.crash_loop_window,
            ready_timeout: runner.ready_timeout,
            stop_grace: runner.stop_grace,
            max_line_bytes: runner.max_line_bytes,
            report_queue: 4096,
            quiet_window: config.delivery.quiet_window,
            coalesce_cap: config.delivery.coalesce_cap,
            delivery_batch: config.delivery.batch,
            delivery_resync: config.delivery.resync,
            labels: runner.labels.clone(),
        },
    })
}

/// The hidden `canopy` subcommand that runs the scripted harness, so a session's harness
/// is the very binary that runs the runner.
pub const SCRIPTED_SUBCOMMAND: &str = "harness-scripted";

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_else(|_| "host".into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    fn parse(text: &str) -> Config {
        Config::parse(Path::new("canopy.toml"), text).unwrap()
    }

    #[test]
    fn harness_tables_become_launch_settings() {
        let config = parse(
            "[harness.claude]\nbin = \"/opt/claude\"\n[harness.claude.env]\nANTHROPIC_API_KEY = \"k\"\n\
             [harness.codex.provider]\nbase_url = \"http://127.0.0.1:9/v1\"\napi_key_env = \"KEY\"\n",
        );
        let claude = harness_settings(&config, HarnessKind::Claude);
        assert_eq!(claude.program, Some(std::path::PathBuf::from("/opt/claude")));
        assert_eq!(claude.env, vec![("ANTHROPIC_API_KEY".to_owned(), "k".to_owned())]);
        let codex = harness_settings(&config, HarnessKind::Codex);
        assert_eq!(codex.provider.map(|p| p.base_url), Some("http://127.0.0.1:9/v1".to_owned()));
        assert_eq!(sandbox_settings(&config, Path::new("/d")).mode, SandboxMode::Required);
    }

    #[test]
    fn grants_that_expose_the_data_directory_are_refused_naming_the_key() {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("project/.canopy");
        std::fs::create_dir_all(&data).unwrap();
        let grants = |text: String| check_grants(&parse(&text), Path::new("canopy.toml"), &data);
        let project = root.path().join("project");
        let refused = grants(format!("[sandbox]\nread_only = [{:?}]\n", project.display().to_string()));
        assert_eq!(refused.map_err(|e| e.key), Err("sandbox.read_only[0]".into()));
        let missing =
            grants(format!("[sandbox]\nread_write = [{:?}]\n", root.path().join("nope").display().to_string()));
        assert_eq!(missing.map_err(|e| e.key), Err("sandbox.read_write[0]".into()));
        let shared = grants("[prompts]\nworkdir = \".\"\n".into());
        assert_eq!(shared.map_err(|e| e.key), Err("prompts.workdir".into()));
        let elsewhere = root.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        assert_eq!(grants(format!("[sandbox]\nread_write = [{:?}]\n", elsewhere.display().to_string())), Ok(()));
        let off = grants(format!("[sandbox]\nmode = \"off\"\nread_only = [{:?}]\n", project.display().to_string()));
        assert_eq!(off, Ok(()));
    }
}
