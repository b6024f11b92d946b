//! Confinement of every harness process: a bubblewrap mount, PID and (by default) network
//! namespace around it and a Landlock ruleset over TCP connect and signals, built from the
//! `LaunchSpec` alone.
//!
//! Owns what a session can see and reach: system files read-only, the harness's install
//! read-only, its own agent directory and working directory read-write, a private `/tmp`,
//! its own processes only, no capabilities, no controlling terminal, a network of its own
//! whose only ways out the runner serves (`network`; with `network = "host"`, the machine's
//! network with TCP connect only to its MCP endpoint's and model endpoints' ports). It refuses grants that would expose the data
//! directory's root files or the operator's home (Landlock and bind mounts are allow-lists:
//! a granted directory cannot have a hole carved into it, so a grant that contains the data
//! directory is never made). Does not decide whether a session is sandboxed (`[sandbox]
//! mode`, read by the daemon) and does not choose the ports of the endpoints (the runner's
//! MCP URL and the harness settings say them).

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use tokio::process::Command;

/// Whether sessions are confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxMode {
    /// Every session is confined; one that cannot be does not start.
    #[default]
    Required,
    /// No confinement: a session can read the data directory's secrets. Loud everywhere.
    Off,
}

impl SandboxMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Required => "required",
            SandboxMode::Off => "off",
        }
    }
}

/// Which network a confined session has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Network {
    /// Its own namespace: loopback only, with its endpoints relayed and an egress proxy that
    /// allows only its allow-list.
    #[default]
    Proxy,
    /// The machine's network, TCP connect limited by port (for machines without user network
    /// namespaces). Loud everywhere.
    Host,
}

impl Network {
    pub fn as_str(self) -> &'static str {
        match self {
            Network::Proxy => "proxy",
            Network::Host => "host",
        }
    }
}

/// `[sandbox]` as the runner needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSettings {
    pub mode: SandboxMode,
    /// The bubblewrap executable (`bwrap`, looked up on `PATH`, unless a path is given).
    pub bwrap: PathBuf,
    /// More paths a session may read (toolchains, a shared cache).
    pub read_only: Vec<PathBuf>,
    /// More paths a session may write.
    pub read_write: Vec<PathBuf>,
    /// More TCP ports a session may connect to (on any address; `network = "host"` only).
    pub connect_ports: Vec<u16>,
    /// The data directory: never granted, nor anything that contains it.
    pub data_dir: PathBuf,
    pub network: Network,
    /// Hosts (`host`, `host:port`, `*.domain`) the egress proxy allows beyond the model
    /// endpoints.
    pub allow_hosts: Vec<String>,
    pub limits: crate::limits::Limits,
}

impl SandboxSettings {
    /// Required confinement with nothing granted beyond the defaults.
    pub fn required(data_dir: impl Into<PathBuf>) -> SandboxSettings {
        SandboxSettings {
            mode: SandboxMode::Required,
            bwrap: PathBuf::from("bwrap"),
            read_only: Vec::new(),
            read_write: Vec::new(),
            connect_ports: Vec::new(),
            data_dir: data_dir.into(),
            network: Network::Proxy,
            allow_hosts: Vec::new(),
            limits: crate::limits::Limits::default(),
        }
    }

    /// No confinement.
    pub fn off(data_dir: impl Into<PathBuf>) -> SandboxSettings {
        SandboxSettings { mode: SandboxMode::Off, ..SandboxSettings::required(data_dir) }
    }
}

/// System paths every session reads (those that exist); `/bin`-style symlinks are recreated.
const SYSTEM_READ_ONLY: &[&str] = &["/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

/// Files under `/etc` hidden from sessions (replaced by an empty file).
const MASKED: &[&str] = &["/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers"];

/// Why a session cannot be confined.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unconfinable(pub String);

/// What this machine offers for confinement, for `canopy doctor` and the start check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    /// The bwrap found and its version line, or why not.
    pub bwrap: Result<(PathBuf, String), String>,
    /// Whether bwrap could build a user, mount and PID namespace here (and the error if not).
    pub namespaces: Result<(), String>,
    /// Whether it could build a network namespace too.
    pub network: Result<(), String>,
    /// The kernel's Landlock ABI (0: none).
    pub landlock_abi: i32,
}

impl Capability {
    /// Probes the machine with `bwrap` (a name on `PATH` or a path).
    pub fn probe(bwrap: &Path) -> Capability {
        let landlock_abi = canopy_sys::landlock_abi();
        let found = crate::find_program(bwrap, std::env::var_os("PATH").as_deref())
            .ok_or_else(|| format!("bubblewrap ({}) was not found", bwrap.display()));
        let bwrap = found.and_then(|path| {
            let out = std::process::Command::new(&path)
                .arg("--version")
                .output()
                .map_err(|e| format!("running {}: {e}", path.display()))?;
            let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            Ok((path, version))
        });
        let namespaces = try_namespaces(&bwrap, &[]);
        let network = try_namespaces(&bwrap, &["--unshare-net"]);
        Capability { bwrap, namespaces, network, landlock_abi }
    }

    /// Whether a session can be confined here with `network`, and why not.
    pub fn usable(&self, network: Network) -> Result<PathBuf, Unconfinable> {
        let (path, _) =
            self.bwrap.clone().map_err(|e| Unconfinable(format!("{e}; install bubblewrap or set [sandbox] bwrap")))?;
        self.namespaces.clone().map_err(Unconfinable)?;
        if network == Network::Proxy {
            self.network.clone().map_err(|e| {
                Unconfinable(format!(
                    "{e}; a machine without user network namespaces needs [sandbox] network = \"host\""
                ))
            })?;
        }
        if self.landlock_abi < 4 {
            return Err(Unconfinable(format!(
                "this kernel's Landlock ABI is {}; TCP-connect rules need ABI 4 (Linux 6.7) or later",
                self.landlock_abi
            )));
        }
        Ok(path)
    }

    /// The probe for `bwrap`, done once per process and path (a machine does not change
    /// under a running runner; a failed probe is cached too, so a broken sandbox costs one
    /// probe, not one per start).
    pub fn cached(bwrap: &Path) -> Capability {
        static PROBES: Mutex<Vec<(PathBuf, Capability)>> = Mutex::new(Vec::new());
        if let Ok(probes) = PROBES.lock()
            && let Some((_, found)) = probes.iter().find(|(p, _)| p == bwrap)
        {
            return found.clone();
        }
        let probed = Capability::probe(bwrap);
        if let Ok(mut probes) = PROBES.lock() {
            probes.push((bwrap.to_owned(), probed.clone()));
        }
        probed
    }
}

/// Whether bwrap at `bwrap` can build its namespaces here, with `more` of them.
fn try_namespaces(bwrap: &Result<(PathBuf, String), String>, more: &[&str]) -> Result<(), String> {
    let (path, _) = bwrap.as_ref().map_err(Clone::clone)?;
    let mut command = std::process::Command::new(path);
    command.args(["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--cap-drop", "ALL"]);
    command.args(more).args(["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--", "true"]);
    match command.output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "bwrap could not build the {}namespaces: {}",
            if more.is_empty() { "" } else { "network " },
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("running {}: {e}", path.display())),
    }
}

/// What one session is granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    pub read_only: Vec<PathBuf>,
    pub read_write: Vec<PathBuf>,
    /// Paths inside a read-write grant that stay read-only (bound last, over it): a reviewer
    /// run's checkout inside its own session directory.
    pub protected: Vec<PathBuf>,
    pub connect_ports: Vec<u16>,
    /// A network namespace of its own (loopback only).
    pub own_network: bool,
    /// The file bound over `/etc/hosts` (its endpoints' names), with `own_network`.
    pub hosts_file: Option<PathBuf>,
}

/// A path made absolute and free of `.`/`..` (resolving symlinks where the path exists).
pub fn normal(path: &Path) -> PathBuf {
    if let Ok(real) = std::fs::canonicalize(path) {
        return real;
    }
    let mut out = PathBuf::new();
    let absolute = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")).join(path)
    };
    for component in absolute.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Refuses a grant that is `/`, contains (or is) the data directory or the operator's
/// home, or lies inside the data directory without being inside `own` (the session's own
/// agent directory). `what` names the grant (a config key or what derived it).
pub fn check_grant(what: &str, path: &Path, data_dir: &Path, own: Option<&Path>) -> Result<(), Unconfinable> {
    let path = normal(path);
    let data = normal(data_dir);
    let refuse = |why: String| Err(Unconfinable(format!("{what} {} {why}", path.display())));
    if path.parent().is_none() {
        return refuse("is the root directory".into());
    }
    if data.starts_with(&path) {
        return refuse(format!("contains the data directory {}, whose secrets no session may read", data.display()));
    }
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from).map(|h| normal(&h))
        && home.parent().is_some()
        && home.starts_with(&path)
    {
        return refuse(format!("contains the operator's home {}", home.display()));
    }
    if path.starts_with(&data) && !own.is_some_and(|own| path.starts_with(normal(own))) {
        return refuse(format!("is inside the data directory {}", data.display()));
    }
    Ok(())
}

/// The TCP port of an `http(s)://host[:port]/...` URL (80 or 443 when absent).
pub fn url_port(url: &str) -> Option<u16> {
    url_host_port(url).map(|(_, port)| port)
}

/// The host (lowercase, an IPv6 address without brackets) and TCP port of an
/// `http(s)://host[:port]/...` URL (80 or 443 when absent).
pub fn url_host_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit('@').next()?;
    // An IPv6 host is bracketed; its port, if any, follows the closing bracket.
    let (host, port) = match host_port.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map(|(host, rest)| (host, rest.strip_prefix(':')))?,
        None => match host_port.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        },
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        Some(port) if !port.is_empty() => port.parse().ok()?,
        _ => match scheme.to_ascii_lowercase().as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        },
    };
    Some((host.to_ascii_lowercase(), port))
}

/// The model endpoints' ports a harness is configured for: every `*_BASE_URL` in its
/// environment and its provider's `base_url`; 443 when none is configured.
pub fn model_ports(env: &[(String, String)], provider_url: Option<&str>) -> Vec<u16> {
    let mut ports: Vec<u16> = env
        .iter()
        .filter(|(k, _)| k.ends_with("BASE_URL"))
        .filter_map(|(_, v)| url_port(v))
        .chain(provider_url.and_then(url_port))
        .collect();
    if ports.is_empty() {
        ports.push(443);
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// What a harness program needs to be readable inside: the program as named, where its
/// symlinks lead, and its install prefix (the directory above `node_modules`, or above a
/// `bin` directory), unless the system paths already cover it.
pub fn program_paths(program: &Path) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    let named = normal_keep_link(program);
    let real = normal(program);
    for path in [&named, &real] {
        let prefix = path
            .ancestors()
            .find(|a| a.file_name().is_some_and(|n| n == "node_modules"))
            .and_then(Path::parent)
            .or_else(|| path.parent().filter(|p| p.file_name().is_some_and(|n| n == "bin")).and_then(Path::parent));
        match prefix {
            Some(prefix) => paths.push(prefix.to_owned()),
            None => paths.push(path.clone()),
        }
    }
    paths.retain(|p| !SYSTEM_READ_ONLY.iter().any(|s| p.starts_with(s)));
    paths.sort();
    paths.dedup();
    paths
}

/// `path` made absolute without resolving its last component's symlink.
fn normal_keep_link(path: &Path) -> PathBuf {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => normal(parent).join(name),
        _ => normal(path),
    }
}

/// The bwrap arguments (before `--`) that confine a session with these grants.
pub fn bwrap_args(grants: &Grants, cwd: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |items: &[&dyn AsRef<std::ffi::OsStr>]| args.extend(items.iter().map(|i| i.as_ref().to_owned()));
    // bwrap's root is an empty tmpfs: only what is bound below exists. Without a network of its
    // own, the network namespace is shared (Landlock decides which ports a connect may reach).
    push(&[&"--unshare-user", &"--unshare-ipc", &"--unshare-pid", &"--unshare-uts", &"--unshare-cgroup-try"]);
    if grants.own_network {
        push(&[&"--unshare-net"]);
    }
    push(&[&"--die-with-parent", &"--cap-drop", &"ALL", &"--hostname", &"canopy-session"]);
    for system in SYSTEM_READ_ONLY {
        let path = Path::new(system);
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    push(&[&"--symlink", &target, &path]);
                }
            }
            Ok(_) => push(&[&"--ro-bind", &path, &path]),
            Err(_) => {}
        }
    }
    for masked in MASKED {
        if Path::new(masked).exists() {
            push(&[&"--ro-bind", &"/dev/null", masked]);
        }
    }
    if let (true, Some(hosts)) = (grants.own_network, &grants.hosts_file) {
        push(&[&"--ro-bind", hosts, &"/etc/hosts"]);
    }
    // Its own PID namespace's /proc, with /proc/sys read-only: a session of a runner that runs
    // as root is uid 0 (without capabilities), and the kernel lets uid 0 write most sysctls.
    push(&[&"--proc", &"/proc", &"--ro-bind", &"/proc/sys", &"/proc/sys"]);
    push(&[&"--dev", &"/dev", &"--tmpfs", &"/tmp", &"--tmpfs", &"/run"]);
    for path in &grants.read_only {
        if path.exists() {
            push(&[&"--ro-bind", path, path]);
        }
    }
    for path in &grants.read_write {
        push(&[&"--bind", path, path]);
    }
    for path in &grants.protected {
        push(&[&"--ro-bind", path, path]);
    }
    push(&[&"--chdir", &cwd]);
    args
}

/// A confined version of `inner`: the same program, arguments, environment and working
/// directory run by `bwrap` with `grants`, entering the Landlock ruleset first. With
/// `handshake` (`--info-fd`, `--block-fd`: descriptors the command keeps across its exec),
/// bwrap says its first process's pid and waits for a byte before running the program. The
/// returned ruleset must live until the command has been spawned.
pub fn wrap(
    bwrap: &Path,
    grants: &Grants,
    inner: &Command,
    handshake: Option<[std::os::fd::RawFd; 2]>,
) -> Result<(Command, canopy_sys::ConnectRules), Unconfinable> {
    let std = inner.as_std();
    let cwd = std.get_current_dir().map(Path::to_owned).unwrap_or_else(|| PathBuf::from("/"));
    let mut outer = Command::new(bwrap);
    outer.args(bwrap_args(grants, &cwd));
    if let Some([info, block]) = handshake {
        outer.args(["--info-fd", &info.to_string(), "--block-fd", &block.to_string()]);
        canopy_sys::namespace::inherit(&mut outer, [info, block]);
    }
    outer.arg("--").arg(std.get_program()).args(std.get_args());
    outer.env_clear();
    for (key, value) in std.get_envs() {
        if let Some(value) = value {
            outer.env(key, value);
        }
    }
    let rules = canopy_sys::ConnectRules::new(&grants.connect_ports)
        .map_err(|e| Unconfinable(format!("building the Landlock ruleset: {e}")))?;
    rules.apply_in_child(&mut outer);
    Ok((outer, rules))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    #[test]
    fn ports_come_from_urls_and_default_to_443() {
        assert_eq!(url_port("http://127.0.0.1:4317/mcp"), Some(4317));
        assert_eq!(url_port("https://api.anthropic.com"), Some(443));
        assert_eq!(url_port("http://[::1]:8080/v1"), Some(8080));
        assert_eq!(url_port("http://[::1]/v1"), Some(80));
        assert_eq!(url_port("http://user:pw@host:99/"), Some(99));
        assert_eq!(url_port("nonsense"), None);
        assert_eq!(url_port("http://host:notaport/"), None);
        let env =
            vec![("ANTHROPIC_BASE_URL".into(), "http://127.0.0.1:9001".into()), ("X".into(), "http://h:1".into())];
        assert_eq!(model_ports(&env, Some("http://127.0.0.1:9002/v1")), vec![9001, 9002]);
        assert_eq!(model_ports(&[], None), vec![443]);
    }

    #[test]
    fn grants_never_expose_the_data_directory_or_home() {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("project/.canopy");
        let own = data.join("sessions/a");
        std::fs::create_dir_all(&own).unwrap();
        let refused = |p: &Path| check_grant("k", p, &data, Some(&own)).unwrap_err().0;
        assert!(refused(Path::new("/")).contains("root directory"));
        assert!(refused(&root.path().join("project")).contains("contains the data directory"));
        assert!(refused(&data).contains("contains the data directory"));
        assert!(refused(&data.join("sessions/b")).contains("inside the data directory"));
        assert!(refused(&data.join("sessions/a/../b")).contains("inside the data directory"));
        assert!(refused(&data.join("operator.token")).contains("inside the data directory"));
        check_grant("k", &own.join("work"), &data, Some(&own)).unwrap();
        check_grant("k", &root.path().join("elsewhere"), &data, Some(&own)).unwrap();
        if let Some(home) = std::env::var_os("HOME").map(PathBuf::from).filter(|h| h.parent().is_some()) {
            assert!(refused(&home).contains("operator's home"), "{}", refused(&home));
        }
    }

    #[test]
    fn a_program_s_install_prefix_is_granted() {
        let root = tempfile::tempdir().unwrap();
        let prefix = root.path().join("claude-1");
        let bin = prefix.join("node_modules/.bin");
        let package = prefix.join("node_modules/@x/claude/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&package).unwrap();
        std::fs::write(package.join("claude.exe"), "").unwrap();
        std::os::unix::fs::symlink("../@x/claude/bin/claude.exe", bin.join("claude")).unwrap();
        let prefix = normal(&prefix);
        assert_eq!(program_paths(&bin.join("claude")), vec![prefix]);
        let local = root.path().join("tools/bin");
        std::fs::create_dir_all(&local).unwrap();
        std::fs::write(local.join("agent"), "").unwrap();
        assert_eq!(program_paths(&local.join("agent")), vec![normal(&root.path().join("tools"))]);
        assert!(program_paths(Path::new("/usr/bin/sh")).is_empty());
    }
}
