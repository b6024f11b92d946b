//! `canopy.toml`: the workspace's settings, their defaults, and their validation.
//!
//! Owns the schema of the file and the error that names the key at fault, and the checks
//! that need no IO. Checks that need the file system or a harness's rules (the sandbox
//! grants) are made where those rules live (`canopy_runner::wiring::check_grants`). The commented
//! default file is `config/canopy.toml` in the repository, embedded here; a test keeps it
//! equal to `Config::default()` and covering every key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The commented default configuration that `canopy init` writes.
pub const DEFAULT_TOML: &str = include_str!("../../../config/canopy.toml");

/// Largest `limits.max_body_bytes` accepted (the managed NATS server carries 4 MB).
pub const MAX_BODY_CEILING: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub daemon: DaemonConfig,
    pub nats: NatsConfig,
    pub limits: LimitsConfig,
    pub runner: RunnerConfig,
    pub sessions: SessionsConfig,
    pub delivery: DeliveryConfig,
    pub policy: PolicyConfig,
    pub prompts: PromptsConfig,
    pub runs: RunsConfig,
    pub retention: RetentionConfig,
    /// How sessions are confined (`[sandbox]`).
    pub sandbox: SandboxConfig,
    /// How git and repositories' checks run (`[git]`; `[workspaces]`, its old name, is read too).
    #[serde(alias = "workspaces")]
    pub git: GitConfig,
    /// Per-model prices (`[pricing.<model>]`), for harnesses that report tokens only.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub pricing: BTreeMap<String, PriceConfig>,
    /// Budget defaults per role and what a turn without usage counts as (`[budgets]`).
    pub budgets: BudgetsConfig,
    /// A command the daemon runs when a request starts waiting for the operator (`[notify]`).
    pub notify: NotifyConfig,
    /// The operator console, served by the daemon on loopback (`[web]`).
    pub web: WebConfig,
    /// Repositories registered at start (`[[repos]]`), as with `canopy repos add`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub repos: Vec<RepoConfig>,
    /// How to run the real harnesses on this machine (`[harness.claude]`, `[harness.codex]`).
    pub harness: HarnessTables,
    /// Per-role defaults: which harness a new agent of the role runs, with which script.
    pub roles: BTreeMap<String, RoleConfig>,
}

impl Default for Config {
    fn default() -> Config {
        let scripted = |script: &str| RoleConfig {
            harness: "scripted".into(),
            script: Some(script.into()),
            allow_hosts: Vec::new(),
            needs: Vec::new(),
            fallback: Vec::new(),
        };
        let follows_manager = |script: &str| RoleConfig {
            harness: "manager".into(),
            script: Some(script.into()),
            allow_hosts: Vec::new(),
            needs: Vec::new(),
            fallback: Vec::new(),
        };
        Config {
            daemon: DaemonConfig::default(),
            nats: NatsConfig::default(),
            limits: LimitsConfig::default(),
            runner: RunnerConfig::default(),
            sessions: SessionsConfig::default(),
            delivery: DeliveryConfig::default(),
            policy: PolicyConfig::default(),
            prompts: PromptsConfig::default(),
            runs: RunsConfig::default(),
            retention: RetentionConfig::default(),
            sandbox: SandboxConfig::default(),
            git: GitConfig::default(),
            pricing: BTreeMap::new(),
            budgets: BudgetsConfig::default(),
            notify: NotifyConfig::default(),
            web: WebConfig::default(),
            repos: Vec::new(),
            harness: HarnessTables::default(),
            roles: BTreeMap::from([
                ("supervisor".to_owned(), scripted("supervisor.toml")),
                ("manager".to_owned(), scripted("manager.toml")),
                ("implementer".to_owned(), follows_manager("implementer.toml")),
                ("reviewer".to_owned(), follows_manager("reviewer.toml")),
            ]),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunnerConfig {
    /// Run a runner inside the daemon process.
    pub embedded: bool,
    /// How often a runner syncs with the daemon (its heartbeat).
    #[serde(with = "humantime_serde")]
    pub sync_interval: Duration,
    /// A runner silent this long is dead; its sessions move to another runner.
    #[serde(with = "humantime_serde")]
    pub runner_ttl: Duration,
    /// Most sessions one runner hosts.
    pub capacity: u32,
    #[serde(with = "humantime_serde")]
    pub restart_backoff_min: Duration,
    #[serde(with = "humantime_serde")]
    pub restart_backoff_max: Duration,
    /// This many crashes within `crash_loop_window` mark the agent `crashed`.
    pub crash_loop_count: u32,
    #[serde(with = "humantime_serde")]
    pub crash_loop_window: Duration,
    /// How long a harness may take to become ready.
    #[serde(with = "humantime_serde")]
    pub ready_timeout: Duration,
    /// Grace between shutdown request, SIGTERM and SIGKILL when stopping a session.
    #[serde(with = "humantime_serde")]
    pub stop_grace: Duration,
    /// Longest line read from a harness; longer lines are cut off and reported.
    pub max_line_bytes: usize,
    /// What this runner offers (`["linux", "gpu"]`): an agent or role that needs a label is
    /// placed only on a runner that has it.
    pub labels: Vec<String>,
}

impl Default for RunnerConfig {
    fn default() -> RunnerConfig {
        RunnerConfig {
            embedded: true,
            sync_interval: Duration::from_secs(2),
            runner_ttl: Duration::from_secs(10),
            capacity: 1000,
            restart_backoff_min: Duration::from_millis(500),
            restart_backoff_max: Duration::from_secs(30),
            crash_loop_count: 5,
            crash_loop_window: Duration::from_secs(120),
            ready_timeout: Duration::from_secs(20),
            stop_grace: Duration::from_secs(3),
            max_line_bytes: 1 << 20,
            labels: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// A session silent this long while working is `stalled`, and the operator is told.
    #[serde(with = "humantime_serde")]
    pub stall_after: Duration,
    /// Activity items kept per session; the oldest go first.
    pub activity_per_session: u32,
    /// A lane whose role names a harness chain moves to the next harness after this many
    /// model-side failures (rate limits, overload, provider errors)...
    pub failover_after: u32,
    /// ...within this long.
    #[serde(with = "humantime_serde")]
    pub failover_window: Duration,
    /// A lane moved off its first harness tries it again after this long (its next session
    /// there is the probe; one that fails over again waits twice as long before the next try).
    #[serde(with = "humantime_serde")]
    pub failback_after: Duration,
}

impl Default for SessionsConfig {
    fn default() -> SessionsConfig {
        SessionsConfig {
            stall_after: Duration::from_secs(600),
            activity_per_session: 1000,
            failover_after: 3,
            failover_window: Duration::from_secs(300),
            failback_after: Duration::from_secs(1800),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeliveryConfig {
    /// An idle agent is woken once no new message has arrived for this long...
    #[serde(with = "humantime_serde")]
    pub quiet_window: Duration,
    /// ...or once this long has passed since the first one, whichever comes first.
    #[serde(with = "humantime_serde")]
    pub coalesce_cap: Duration,
    /// Most messages injected at one turn start; the rest follow at the next.
    pub batch: u32,
    /// How often an idle session checks for pending messages without a doorbell.
    #[serde(with = "humantime_serde")]
    pub resync: Duration,
    /// How long a post waits for a mid-turn steer to be accepted before falling back.
    #[serde(with = "humantime_serde")]
    pub steer_timeout: Duration,
    /// Pending messages per agent above which the operator is told (nothing is dropped).
    pub max_pending: u64,
    /// Messages still undelivered after this long expire (the agent's cursor moves past
    /// them) and the operator is told how many in the agent's home channel.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Wakes between the same two agents within `loop_window` before further wakes are held.
    pub loop_wakes: u32,
    #[serde(with = "humantime_serde")]
    pub loop_window: Duration,
}

impl Default for DeliveryConfig {
    fn default() -> DeliveryConfig {
        DeliveryConfig {
            quiet_window: Duration::from_secs(2),
            coalesce_cap: Duration::from_secs(30),
            batch: 100,
            resync: Duration::from_secs(5),
            steer_timeout: Duration::from_secs(2),
            max_pending: 1000,
            retention: Duration::from_secs(7 * 24 * 3600),
            loop_wakes: 10,
            loop_window: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Deepest a child may sit (the Supervisor is depth 1).
    pub max_depth: u32,
    /// Most children (and pending requests) one Manager may have.
    pub max_children: u32,
    /// Most live agents in the workspace.
    pub max_agents: u32,
    /// Most pending spawn requests one requester may have.
    pub max_pending_requests: u32,
    /// A spawn request nobody answers expires after this long.
    #[serde(with = "humantime_serde")]
    pub request_ttl: Duration,
    /// Words a handle may not contain (as one of its hyphen-separated parts): the names of
    /// tools and vendors, because a lane is named by its function (`ci-manager`).
    pub forbidden_handle_words: Vec<String>,
}

/// The default `policy.forbidden_handle_words`.
pub const FORBIDDEN_HANDLE_WORDS: &[&str] = &[
    "aws",
    "gcp",
    "azure",
    "grafana",
    "github",
    "gitlab",
    "slack",
    "jira",
    "claude",
    "codex",
    "gpt",
    "openai",
    "anthropic",
    "gemini",
    "llm",
    "ai",
    "bot",
];

impl Default for PolicyConfig {
    fn default() -> PolicyConfig {
        PolicyConfig {
            max_depth: 5,
            max_children: 8,
            max_agents: 100,
            max_pending_requests: 3,
            request_ttl: Duration::from_secs(24 * 3600),
            forbidden_handle_words: FORBIDDEN_HANDLE_WORDS.iter().map(|w| (*w).to_owned()).collect(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PromptsConfig {
    /// The prompt bundle: a directory holding `config/prompts`, `config/roles`, `agents`,
    /// `skills` and `rules` (relative paths are relative to the data directory's parent).
    /// Empty: the bundle built into the binary.
    pub bundle: String,
    /// One line on the current project, rendered in every Manager's `# Why You're Here`.
    pub project: String,
    /// The working directory of every session (relative paths as for `bundle`). Empty: a
    /// private directory per agent under the data directory.
    pub workdir: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunsConfig {
    /// Most subagent runs one Manager may have out at once.
    pub max_per_manager: u32,
    /// A run still going after this long is stopped and reported as timed out.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Longest brief, in bytes.
    pub max_brief_bytes: usize,
}

impl Default for RunsConfig {
    fn default() -> RunsConfig {
        RunsConfig { max_per_manager: 4, timeout: Duration::from_secs(30 * 60), max_brief_bytes: 32 * 1024 }
    }
}

/// How long runtime records are kept. Channels, pins and charters are the operator's
/// record and are never pruned here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Session activity (`canopy watch`, the tool events `history_search` finds) and
    /// compaction checkpoints older than this are deleted.
    #[serde(with = "humantime_serde")]
    pub activity: Duration,
    /// Directories of ended sessions (harness transcripts, private homes) untouched for this
    /// long are deleted.
    #[serde(with = "humantime_serde")]
    pub transcripts: Duration,
    /// Token usage records (`canopy usage`) older than this are deleted.
    #[serde(with = "humantime_serde")]
    pub usage: Duration,
    /// How often the daemon prunes in the background.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Checkouts of despawned agents, and of ended runs neither merged nor discarded, are
    /// removed this long after (their branches stay in Canopy's mirror).
    #[serde(with = "humantime_serde")]
    pub checkouts: Duration,
    /// Check runs and their logs are deleted this long after they ended.
    #[serde(with = "humantime_serde")]
    pub checks: Duration,
}

impl Default for RetentionConfig {
    fn default() -> RetentionConfig {
        const DAY: u64 = 24 * 3600;
        RetentionConfig {
            activity: Duration::from_secs(30 * DAY),
            transcripts: Duration::from_secs(30 * DAY),
            usage: Duration::from_secs(90 * DAY),
            interval: Duration::from_secs(600),
            checkouts: Duration::from_secs(30 * DAY),
            checks: Duration::from_secs(14 * DAY),
        }
    }
}

/// `[pricing.<model>]`: US dollars per million tokens. The model is the session's (its role's
/// or `[harness.<h>] model`), or, for a session without one, its harness's name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    pub input: f64,
    #[serde(default)]
    pub cached_input: f64,
    pub output: f64,
}

impl Eq for PriceConfig {}

/// `[budgets]`: what a model turn counts as until its usage arrives (for good, when it never
/// does), and a default budget per role (`[budgets.roles.<role>]`) for agents and runs of
/// the role that have none of their own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetsConfig {
    pub unreported_turn_usd: f64,
    pub unreported_turn_tokens: u64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub roles: BTreeMap<String, RoleBudgetConfig>,
}

impl Eq for BudgetsConfig {}

impl Default for BudgetsConfig {
    fn default() -> BudgetsConfig {
        BudgetsConfig { unreported_turn_usd: 0.05, unreported_turn_tokens: 10_000, roles: BTreeMap::new() }
    }
}

/// `[budgets.roles.<role>]`: dollars and/or tokens per period (absent: the agent's lifetime);
/// `subtree = true` makes it the budget of the agent's whole subtree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleBudgetConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, with = "humantime_serde::option", skip_serializing_if = "Option::is_none")]
    pub period: Option<Duration>,
    #[serde(default)]
    pub subtree: bool,
}

/// `[notify]`: a command (run with `sh -c`, as the operator's user, outside any sandbox) that
/// the daemon starts when something starts waiting for the operator (a spawn or merge request,
/// an agent that is failing), with the item as one JSON object on its stdin
/// (`{"kind": "spawn_request", "request": {..}, "console_url": ..}`); `notify-send`, a webhook
/// with `curl`. Empty: none. Killed after `timeout`. An item still waiting after
/// `remind_after` is notified once more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotifyConfig {
    pub command: String,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub remind_after: Duration,
}

impl Default for NotifyConfig {
    fn default() -> NotifyConfig {
        NotifyConfig {
            command: String::new(),
            timeout: Duration::from_secs(10),
            remind_after: Duration::from_secs(3600),
        }
    }
}

/// `[web]`: the operator console. `listen` is a loopback address unless the console speaks
/// TLS (`tls_cert` and `tls_key`, PEM files; relative paths are in the data directory); port 0
/// picks a free port once, which the daemon keeps for later starts (`web/port`), so an open
/// page finds it again. A browser session lasts `session_ttl`; a login link is good once, for
/// `link_ttl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebConfig {
    pub enabled: bool,
    pub listen: String,
    #[serde(with = "humantime_serde")]
    pub session_ttl: Duration,
    #[serde(with = "humantime_serde")]
    pub link_ttl: Duration,
    /// The console's address as the operator's browser reaches it (`https://canopy.lan:8443`),
    /// when that is not `listen` itself: links in notices use it. Empty: the listen address
    /// (loopback when the console listens on every address).
    pub public_url: String,
    /// The console's certificate chain (PEM, leaf first); with `tls_key`, the console speaks
    /// HTTPS only. `canopy web --init-tls` makes a self-signed pair.
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
}

impl Default for WebConfig {
    fn default() -> WebConfig {
        WebConfig {
            enabled: true,
            listen: "127.0.0.1:0".into(),
            session_ttl: Duration::from_secs(12 * 3600),
            link_ttl: Duration::from_secs(120),
            public_url: String::new(),
            tls_cert: PathBuf::new(),
            tls_key: PathBuf::new(),
        }
    }
}

/// Checks a `public_url`: `http(s)://host[:port]`, nothing after but an optional `/`. Returns
/// it without the slash.
fn check_public_url(url: &str) -> Result<String, String> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    let Some(rest) = rest else { return Err(format!("{url:?} is not an http(s) URL such as https://canopy.lan:8443")) };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']');
    if authority.is_empty() || !authority.chars().all(allowed) {
        return Err(format!("{url:?} must be a scheme and a host (and port), with no path, user or query"));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

impl WebConfig {
    /// The address to listen on: loopback, or any address when the console speaks TLS (it acts
    /// as an operator: nothing of it crosses a network in the clear).
    pub fn address(&self) -> Result<std::net::SocketAddr, String> {
        let addr: std::net::SocketAddr =
            self.listen.parse().map_err(|_| format!("{:?} is not an address such as 127.0.0.1:0", self.listen))?;
        if !addr.ip().is_loopback() && !self.tls() {
            return Err(format!(
                "{addr} is not a loopback address: the console listens beyond this machine only over TLS (set \
                 [web] tls_cert and tls_key; `canopy web --init-tls` makes a pair), or reach it through an SSH tunnel"
            ));
        }
        Ok(addr)
    }

    /// Whether the console speaks TLS.
    pub fn tls(&self) -> bool {
        !self.tls_cert.as_os_str().is_empty()
    }

    /// The certificate and key files, relative paths taken in `data_dir`.
    pub fn tls_files(&self, data_dir: &std::path::Path) -> Option<(PathBuf, PathBuf)> {
        self.tls().then(|| (data_dir.join(&self.tls_cert), data_dir.join(&self.tls_key)))
    }
}

/// `[git]`: how Canopy runs git and repositories' check commands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GitConfig {
    /// The git executable (a name on `PATH` or a path); `git`, its old key, is read too.
    #[serde(alias = "git")]
    pub program: PathBuf,
    /// The longest a repository's check command may run.
    #[serde(with = "humantime_serde")]
    pub check_timeout: Duration,
    /// How often the daemon looks for new commits on standing agents' branches and a moved
    /// base branch (then checks them and test-merges every live branch).
    #[serde(with = "humantime_serde")]
    pub watch_interval: Duration,
}

impl Default for GitConfig {
    fn default() -> GitConfig {
        GitConfig {
            program: PathBuf::from("git"),
            check_timeout: Duration::from_secs(600),
            watch_interval: Duration::from_secs(15),
        }
    }
}

/// One `[[repos]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepoConfig {
    pub name: String,
    /// The canonical repository: a path (relative to the project directory) or a URL.
    pub source: String,
    #[serde(default = "default_base")]
    pub base: String,
    /// The single check of old: the check named `check`.
    #[serde(default)]
    pub check: String,
    /// Named checks, `name = "command"` (names and commands are checked when registered).
    #[serde(default)]
    pub checks: BTreeMap<String, String>,
    /// `operator` (the operator's approval is the review) or `required` (a reviewer run on
    /// every merge request, whose `approve` the operator's approval needs).
    #[serde(default = "default_review")]
    pub review: String,
}

fn default_review() -> String {
    "operator".into()
}

fn default_base() -> String {
    "main".into()
}

/// `[sandbox]`: how every session process is confined (`canopy-harness`'s `sandbox`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// `required`: every session is confined, one that cannot be does not start. `off`: no
    /// confinement (a session can read the data directory's secrets); warned about loudly.
    pub mode: SandboxModeConfig,
    /// The bubblewrap executable: a name looked up on `PATH`, or a path.
    pub bwrap: PathBuf,
    /// Absolute paths every session may read beyond the system directories and its
    /// harness's install (toolchains, caches).
    pub read_only: Vec<PathBuf>,
    /// Absolute directories every session may write beyond its own.
    pub read_write: Vec<PathBuf>,
    /// TCP ports every session may connect to beyond its MCP endpoint and model endpoints
    /// (`network = "host"` only: in a namespace of its own there is nothing else to reach).
    pub connect_ports: Vec<u16>,
    /// `proxy`: each session has a network namespace of its own (loopback only), its MCP and
    /// model endpoints relayed, everything else through an egress proxy that allows only
    /// `allow_hosts`. `host`: the machine's network, TCP connect limited to the endpoints'
    /// ports (for machines without user network namespaces); warned about loudly.
    pub network: NetworkConfig,
    /// Hosts every session may reach through the egress proxy beyond its model endpoints:
    /// `host`, `host:port` or `*.domain` (package registries a build needs, say).
    pub allow_hosts: Vec<String>,
    /// Processes a session (with everything it starts) may have at once.
    pub max_processes: u32,
    /// Resident memory a session's processes may use together (`4 GiB`).
    pub max_memory: canopy_core::size::Size,
    /// Open files per process in a session.
    pub max_open_files: u64,
    /// A session's CPU share against the daemon's 100, 1 to 100.
    pub cpu_weight: u32,
}

impl Default for SandboxConfig {
    fn default() -> SandboxConfig {
        SandboxConfig {
            mode: SandboxModeConfig::Required,
            bwrap: PathBuf::from("bwrap"),
            read_only: Vec::new(),
            read_write: Vec::new(),
            connect_ports: Vec::new(),
            network: NetworkConfig::Proxy,
            allow_hosts: Vec::new(),
            max_processes: 1024,
            max_memory: canopy_core::size::Size(4 << 30),
            max_open_files: 4096,
            cpu_weight: 50,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkConfig {
    Proxy,
    Host,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxModeConfig {
    Required,
    Off,
}

/// Whether `entry` reads as an allow-list entry: `host`, `host:port`, `*.domain`, an IP
/// address, `[v6]:port` (the egress proxy parses it again and says exactly what is wrong).
fn allow_entry(entry: &str) -> bool {
    let entry = entry.trim();
    !entry.is_empty()
        && entry.len() <= 260
        && entry.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:*[]".contains(&b))
        && entry.rfind('*').is_none_or(|i| i == 0 && entry.starts_with("*."))
}

impl Config {
    /// The working directory a session of `agent` gets: `[prompts] workdir` for every
    /// session when it is set (absolute, or relative to the project), else a private
    /// directory per agent under the data directory.
    pub fn workdir(&self, data_dir: &Path, agent: &str) -> PathBuf {
        match self.prompts.workdir.trim() {
            "" => data_dir.join("sessions").join(agent).join("work"),
            path => crate::paths::relative_to_project(data_dir, path),
        }
    }
}

/// `[harness.*]`: one table per real harness. The scripted harness needs none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HarnessTables {
    pub claude: ClaudeConfig,
    pub codex: CodexConfig,
    pub omp: OmpConfig,
    /// `[harness.pi]`: the same keys as `[harness.omp]`.
    pub pi: OmpConfig,
}

/// `[harness.claude]`: Claude Code.
///
/// `bin`, `model` and `env` are repeated in `CodexConfig` on purpose: serde cannot
/// `#[serde(flatten)]` a shared struct into a table that denies unknown keys. What the two
/// tables do with those keys is shared instead, through `HarnessKeys`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClaudeConfig {
    /// The `claude` executable; unset means `claude` on `PATH`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bin: Option<PathBuf>,
    /// `--model`; unset leaves Claude Code's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Environment for every session (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`); sessions
    /// otherwise start from a clean environment.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// `[harness.codex]`: Codex's app-server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CodexConfig {
    /// The `codex` executable; unset means `codex` on `PATH`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bin: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// A model provider written into the session's Codex config; unset uses Codex's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<CodexProviderConfig>,
}

/// `[harness.omp]`: oh-my-pi in RPC mode (and `[harness.pi]`, pi, with the same keys).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OmpConfig {
    /// The `omp` launcher; unset means `omp` on `PATH`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bin: Option<PathBuf>,
    /// The model id at the provider (`claude-sonnet-4-5`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The one model endpoint a session may contact, written into its `models.yml`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<OmpProviderConfig>,
}

/// `[harness.omp.provider]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OmpProviderConfig {
    /// The provider's base URL (`https://api.anthropic.com`; omp appends `/v1/messages`).
    pub base_url: String,
    /// The environment variable holding the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// `anthropic-messages` (default) or `openai-responses`.
    #[serde(default = "default_omp_api")]
    pub api: String,
}

fn default_omp_api() -> String {
    "anthropic-messages".into()
}

/// `[harness.codex.provider]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodexProviderConfig {
    /// The provider's base URL (`http://127.0.0.1:8080/v1`).
    pub base_url: String,
    /// The environment variable (set in `[harness.codex.env]` or inherited by nothing else)
    /// that holds the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
}

impl ClaudeConfig {
    pub fn keys(&self) -> HarnessKeys<'_> {
        HarnessKeys { table: "claude", bin: self.bin.as_deref(), model: self.model.as_deref(), env: &self.env }
    }
}

impl CodexConfig {
    pub fn keys(&self) -> HarnessKeys<'_> {
        HarnessKeys { table: "codex", bin: self.bin.as_deref(), model: self.model.as_deref(), env: &self.env }
    }
}

impl OmpConfig {
    /// Its keys, as the table `table` (`omp` or `pi`) names them.
    pub fn keys_as(&self, table: &'static str) -> HarnessKeys<'_> {
        HarnessKeys { table, bin: self.bin.as_deref(), model: self.model.as_deref(), env: &self.env }
    }
}

/// The keys every `[harness.<table>]` has, borrowed from its table: what validation and the
/// launch settings (`canopy_runner::wiring`) read alike for every harness.
pub struct HarnessKeys<'a> {
    pub table: &'static str,
    pub bin: Option<&'a Path>,
    pub model: Option<&'a str>,
    pub env: &'a BTreeMap<String, String>,
}

impl HarnessKeys<'_> {
    /// Checks the values, naming the key at fault.
    fn validate(&self) -> Result<(), (String, String)> {
        let name = self.table;
        if self.bin.is_some_and(|b| b.as_os_str().is_empty()) {
            return Err((format!("harness.{name}.bin"), "must not be empty".into()));
        }
        if self.model.is_some_and(|m| m.trim().is_empty() || m.chars().any(char::is_control)) {
            return Err((format!("harness.{name}.model"), "must be a non-empty model name".into()));
        }
        for (key, value) in self.env {
            if !is_env_name(key) {
                return Err((format!("harness.{name}.env.{key}"), "is not an environment variable name".into()));
            }
            if value.contains('\0') {
                return Err((format!("harness.{name}.env.{key}"), "must not contain a NUL byte".into()));
            }
        }
        Ok(())
    }
}

/// `[A-Za-z_][A-Za-z0-9_]*`, what a shell accepts.
fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, from = "RoleConfigFile", into = "RoleConfigFile")]
pub struct RoleConfig {
    /// `scripted`, `claude`, `codex`, `omp` or `pi`; for a run's role also `manager` (its
    /// runs take their Manager's harness). In the file, the first of `harness`.
    pub harness: String,
    /// The rest of a chain `harness = ["claude", "codex"]`: the harnesses a lane moves to, in
    /// order, when the one it is on keeps failing for a model-side reason.
    pub fallback: Vec<String>,
    /// For the scripted harness: a script shipped in `config/scripts/` by name, or a path
    /// (relative to the data directory).
    #[serde(default)]
    pub script: Option<String>,
    /// Hosts its sessions may reach through the egress proxy beyond `[sandbox] allow_hosts`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_hosts: Vec<String>,
    /// Runner labels its sessions need (`["gpu"]`): placed only on a runner with every one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub needs: Vec<String>,
}

impl RoleConfig {
    /// The harness chain: `harness`, then `fallback`.
    pub fn chain(&self) -> Vec<String> {
        std::iter::once(self.harness.clone()).chain(self.fallback.iter().cloned()).collect()
    }
}

/// `[roles.<role>]` as written: `harness` is one name or a chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleConfigFile {
    harness: OneOrChain,
    #[serde(default)]
    script: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    allow_hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    needs: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
enum OneOrChain {
    One(String),
    Chain(Vec<String>),
}

impl From<RoleConfigFile> for RoleConfig {
    fn from(file: RoleConfigFile) -> RoleConfig {
        let mut chain = match file.harness {
            OneOrChain::One(one) => vec![one],
            OneOrChain::Chain(chain) => chain,
        };
        // An empty chain keeps an empty harness, which validation refuses naming the key.
        let harness = if chain.is_empty() { String::new() } else { chain.remove(0) };
        RoleConfig { harness, fallback: chain, script: file.script, allow_hosts: file.allow_hosts, needs: file.needs }
    }
}

impl From<RoleConfig> for RoleConfigFile {
    fn from(role: RoleConfig) -> RoleConfigFile {
        let harness = match role.fallback.is_empty() {
            true => OneOrChain::One(role.harness.clone()),
            false => OneOrChain::Chain(role.chain()),
        };
        RoleConfigFile { harness, script: role.script, allow_hosts: role.allow_hosts, needs: role.needs }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    pub max_in_flight: usize,
    pub store_queue: usize,
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Where the daemon serves its mirrors over git's smart HTTP to runners that keep their own
    /// checkouts (port 0 picks a free one). A runner on another machine needs an address it
    /// can reach: `0.0.0.0:7420`, say, with `git_url` naming it.
    pub git_listen: String,
    /// The URL runners are told to fetch from and push to (`http://build-host:7420`); empty:
    /// `http://` and the address `git_listen` bound.
    pub git_url: String,
}

impl DaemonConfig {
    /// The git endpoint's address.
    pub fn git_address(&self) -> Result<std::net::SocketAddr, String> {
        self.git_listen.parse().map_err(|_| format!("{:?} is not an address such as 127.0.0.1:0", self.git_listen))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsConfig {
    #[serde(with = "humantime_serde")]
    pub restart_backoff_min: Duration,
    #[serde(with = "humantime_serde")]
    pub restart_backoff_max: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub max_body_bytes: usize,
}

impl Default for DaemonConfig {
    fn default() -> DaemonConfig {
        DaemonConfig {
            request_timeout: Duration::from_secs(10),
            max_in_flight: 256,
            store_queue: 1024,
            shutdown_grace: Duration::from_secs(10),
            git_listen: "127.0.0.1:0".into(),
            git_url: String::new(),
        }
    }
}

impl Default for NatsConfig {
    fn default() -> NatsConfig {
        NatsConfig { restart_backoff_min: Duration::from_millis(100), restart_backoff_max: Duration::from_secs(10) }
    }
}

impl Default for LimitsConfig {
    fn default() -> LimitsConfig {
        LimitsConfig { max_body_bytes: 64 * 1024 }
    }
}

/// A configuration that cannot be used. The CLI exits 64 (EX_USAGE) with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {key}: {message}")]
pub struct ConfigError {
    pub path: PathBuf,
    /// The key at fault (`limits.max_body_bytes`), or `(file)` when none can be named.
    pub key: String,
    pub message: String,
}

impl Config {
    /// Reads the file; a missing file means every default.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Config::parse(path, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
            Err(e) => Err(ConfigError { path: path.to_owned(), key: "(file)".into(), message: e.to_string() }),
        }
    }

    /// Parses and validates the text of a `canopy.toml`.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError {
            path: path.to_owned(),
            key: key_at(text, e.span()).unwrap_or_else(|| "(file)".into()),
            message: e.message().trim().to_owned(),
        })?;
        config.validate().map_err(|(key, message)| ConfigError { path: path.to_owned(), key: key.into(), message })?;
        config.validate_harnesses().map_err(|(key, message)| ConfigError { path: path.to_owned(), key, message })?;
        Ok(config)
    }

    /// Checks `[harness.*]`; keys there are dynamic (`harness.claude.env.NAME`).
    fn validate_harnesses(&self) -> Result<(), (String, String)> {
        self.harness.claude.keys().validate()?;
        for (table, omp) in [("omp", &self.harness.omp), ("pi", &self.harness.pi)] {
            omp.keys_as(table).validate()?;
            if let Some(provider) = &omp.provider {
                let url = provider.base_url.as_str();
                if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() < 10 {
                    return Err((
                        format!("harness.{table}.provider.base_url"),
                        format!("{url:?} is not an http(s) URL"),
                    ));
                }
                if provider.api_key_env.as_deref().is_some_and(|k| !is_env_name(k)) {
                    return Err((
                        format!("harness.{table}.provider.api_key_env"),
                        "is not an environment variable name".into(),
                    ));
                }
                if !["anthropic-messages", "openai-responses"].contains(&provider.api.as_str()) {
                    return Err((
                        format!("harness.{table}.provider.api"),
                        format!("{:?} is not one of: anthropic-messages, openai-responses", provider.api),
                    ));
                }
            }
        }
        let codex = &self.harness.codex;
        codex.keys().validate()?;
        if let Some(provider) = &codex.provider {
            let url = provider.base_url.as_str();
            if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() < 10 {
                return Err(("harness.codex.provider.base_url".into(), format!("{url:?} is not an http(s) URL")));
            }
            if provider.api_key_env.as_deref().is_some_and(|k| !is_env_name(k)) {
                return Err((
                    "harness.codex.provider.api_key_env".into(),
                    "is not an environment variable name".into(),
                ));
            }
        }
        Ok(())
    }

    /// Checks the values that need no IO, one `[section]` at a time. Role names, harnesses
    /// and scripts are checked by the daemon at start (`roles::RoleDefaults`), which knows
    /// the shipped scripts.
    fn validate(&self) -> Result<(), Invalid> {
        self.validate_daemon()?;
        self.validate_nats()?;
        self.validate_runner()?;
        self.validate_sessions()?;
        self.validate_runs()?;
        self.validate_prompts()?;
        self.validate_delivery()?;
        self.validate_policy()?;
        self.validate_sandbox()?;
        self.validate_git()?;
        self.validate_pricing()?;
        self.validate_budgets()?;
        self.validate_repos()?;
        self.validate_web()?;
        self.validate_git_endpoint()?;
        self.validate_retention()?;
        self.validate_notify()
    }

    /// `[daemon]` and `[limits]`.
    fn validate_daemon(&self) -> Result<(), Invalid> {
        at_least_one("daemon.max_in_flight", self.daemon.max_in_flight)?;
        at_least_one("daemon.store_queue", self.daemon.store_queue)?;
        at_least_one("limits.max_body_bytes", self.limits.max_body_bytes)?;
        if self.limits.max_body_bytes > MAX_BODY_CEILING {
            return Err((
                "limits.max_body_bytes",
                format!("{} is above the ceiling of {MAX_BODY_CEILING}", self.limits.max_body_bytes),
            ));
        }
        longer_than_zero(&[("daemon.request_timeout", self.daemon.request_timeout)])
    }

    fn validate_nats(&self) -> Result<(), Invalid> {
        if self.nats.restart_backoff_min.is_zero() || self.nats.restart_backoff_min > self.nats.restart_backoff_max {
            return Err(("nats.restart_backoff_min", "must be above zero and at most nats.restart_backoff_max".into()));
        }
        Ok(())
    }

    fn validate_runner(&self) -> Result<(), Invalid> {
        let runner = &self.runner;
        if runner.restart_backoff_min.is_zero() || runner.restart_backoff_min > runner.restart_backoff_max {
            return Err((
                "runner.restart_backoff_min",
                "must be above zero and at most runner.restart_backoff_max".into(),
            ));
        }
        longer_than_zero(&[
            ("runner.sync_interval", runner.sync_interval),
            ("runner.ready_timeout", runner.ready_timeout),
            ("runner.stop_grace", runner.stop_grace),
            ("runner.crash_loop_window", runner.crash_loop_window),
        ])?;
        if runner.runner_ttl < runner.sync_interval * 2 {
            return Err(("runner.runner_ttl", "must be at least twice runner.sync_interval".into()));
        }
        at_least_one("runner.capacity", runner.capacity as usize)?;
        canopy_core::placement::check_labels("runner.labels", &runner.labels)
            .map_err(|e| ("runner.labels", e.to_string()))?;
        for (role, config) in &self.roles {
            canopy_core::placement::check_labels("needs", &config.needs)
                .map_err(|e| ("roles.needs", format!("[roles.{role}] {e}")))?;
        }
        at_least_one("runner.crash_loop_count", runner.crash_loop_count as usize)?;
        if runner.max_line_bytes < 1024 {
            return Err(("runner.max_line_bytes", "must be at least 1024".into()));
        }
        Ok(())
    }

    fn validate_sessions(&self) -> Result<(), Invalid> {
        let sessions = &self.sessions;
        longer_than_zero(&[
            ("sessions.stall_after", sessions.stall_after),
            ("sessions.failover_window", sessions.failover_window),
            ("sessions.failback_after", sessions.failback_after),
        ])?;
        at_least_one("sessions.failover_after", sessions.failover_after as usize)?;
        at_least_one("sessions.activity_per_session", sessions.activity_per_session as usize)?;
        const HARNESSES: [&str; 5] = ["scripted", "claude", "codex", "omp", "pi"];
        for (role, config) in &self.roles {
            let chain = config.chain();
            for (i, harness) in config.fallback.iter().enumerate() {
                if !HARNESSES.contains(&harness.as_str()) {
                    let why =
                        format!("[roles.{role}] harness chain: {harness:?} is not one of: {}", HARNESSES.join(", "));
                    return Err(("roles.harness", why));
                }
                if chain[..=i].contains(harness) {
                    return Err(("roles.harness", format!("[roles.{role}] harness chain names {harness} twice")));
                }
            }
        }
        Ok(())
    }

    fn validate_runs(&self) -> Result<(), Invalid> {
        at_least_one("runs.max_per_manager", self.runs.max_per_manager as usize)?;
        at_least_one("runs.max_brief_bytes", self.runs.max_brief_bytes)?;
        longer_than_zero(&[("runs.timeout", self.runs.timeout)])
    }

    fn validate_prompts(&self) -> Result<(), Invalid> {
        if self.prompts.project.chars().count() > 1000 {
            return Err(("prompts.project", "must be at most 1000 characters".into()));
        }
        Ok(())
    }

    fn validate_delivery(&self) -> Result<(), Invalid> {
        let delivery = &self.delivery;
        longer_than_zero(&[
            ("delivery.coalesce_cap", delivery.coalesce_cap),
            ("delivery.resync", delivery.resync),
            ("delivery.steer_timeout", delivery.steer_timeout),
            ("delivery.loop_window", delivery.loop_window),
            ("delivery.retention", delivery.retention),
        ])?;
        if delivery.quiet_window > delivery.coalesce_cap {
            return Err(("delivery.quiet_window", "must be at most delivery.coalesce_cap".into()));
        }
        at_least_one("delivery.batch", delivery.batch as usize)?;
        at_least_one("delivery.max_pending", delivery.max_pending as usize)?;
        at_least_one("delivery.loop_wakes", delivery.loop_wakes as usize)
    }

    fn validate_policy(&self) -> Result<(), Invalid> {
        let policy = &self.policy;
        if policy.max_depth < 2 {
            return Err(("policy.max_depth", "must be at least 2 (the Supervisor and one level)".into()));
        }
        at_least_one("policy.max_children", policy.max_children as usize)?;
        at_least_one("policy.max_agents", policy.max_agents as usize)?;
        at_least_one("policy.max_pending_requests", policy.max_pending_requests as usize)?;
        longer_than_zero(&[("policy.request_ttl", policy.request_ttl)])?;
        if let Some(bad) = policy
            .forbidden_handle_words
            .iter()
            .find(|w| w.is_empty() || !w.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
        {
            return Err(("policy.forbidden_handle_words", format!("{bad:?} is not one lowercase word")));
        }
        Ok(())
    }

    fn validate_sandbox(&self) -> Result<(), Invalid> {
        let sandbox = &self.sandbox;
        if sandbox.bwrap.as_os_str().is_empty() {
            return Err(("sandbox.bwrap", "must name the bubblewrap executable".into()));
        }
        for (key, paths) in [("sandbox.read_only", &sandbox.read_only), ("sandbox.read_write", &sandbox.read_write)] {
            if let Some(bad) = paths.iter().find(|p| !p.is_absolute()) {
                return Err((key, format!("{} is not an absolute path", bad.display())));
            }
        }
        if sandbox.connect_ports.contains(&0) {
            return Err(("sandbox.connect_ports", "ports are 1 to 65535".into()));
        }
        if let Some(bad) = sandbox.allow_hosts.iter().find(|h| !allow_entry(h)) {
            return Err(("sandbox.allow_hosts", format!("{bad:?} is not host, host:port or *.domain")));
        }
        for (role, config) in &self.roles {
            if let Some(bad) = config.allow_hosts.iter().find(|h| !allow_entry(h)) {
                return Err((
                    "roles.allow_hosts",
                    format!("[roles.{role}] {bad:?} is not host, host:port or *.domain"),
                ));
            }
        }
        if sandbox.max_processes < 16 {
            return Err(("sandbox.max_processes", "at least 16 (a harness alone runs several)".into()));
        }
        if sandbox.max_memory.0 < 64 << 20 {
            return Err(("sandbox.max_memory", "at least 64 MiB".into()));
        }
        if sandbox.max_open_files < 64 {
            return Err(("sandbox.max_open_files", "at least 64".into()));
        }
        if !(1..=100).contains(&sandbox.cpu_weight) {
            return Err(("sandbox.cpu_weight", "1 to 100 (the daemon's is 100)".into()));
        }
        Ok(())
    }

    fn validate_git(&self) -> Result<(), Invalid> {
        if self.git.program.as_os_str().is_empty() {
            return Err(("git.program", "must name the git executable".into()));
        }
        longer_than_zero(&[
            ("git.check_timeout", self.git.check_timeout),
            ("git.watch_interval", self.git.watch_interval),
        ])
    }

    fn validate_pricing(&self) -> Result<(), Invalid> {
        for price in self.pricing.values() {
            if [price.input, price.cached_input, price.output].iter().any(|p| !p.is_finite() || *p < 0.0) {
                return Err(("pricing", "prices are zero or more US dollars per million tokens".into()));
            }
        }
        Ok(())
    }

    /// `[budgets]`; `budgets.roles` names roles of `[roles]`.
    fn validate_budgets(&self) -> Result<(), Invalid> {
        let budgets = &self.budgets;
        if !(budgets.unreported_turn_usd.is_finite() && budgets.unreported_turn_usd >= 0.0) {
            return Err(("budgets.unreported_turn_usd", "is zero or more US dollars".into()));
        }
        for (role, budget) in &budgets.roles {
            let key = "budgets.roles";
            if !self.roles.contains_key(role) {
                let known: Vec<&str> = self.roles.keys().map(String::as_str).collect();
                return Err((key, format!("{role:?} is not a role in [roles] ({})", known.join(", "))));
            }
            if budget.usd.is_none() && budget.tokens.is_none() {
                return Err((key, format!("{role}: a budget names usd, tokens or both")));
            }
            if budget.usd.is_some_and(|u| !(u.is_finite() && u > 0.0)) || budget.tokens == Some(0) {
                return Err((key, format!("{role}: a budget is more than zero")));
            }
            let years = Duration::from_secs(100 * 365 * 86_400);
            if budget.period.is_some_and(|p| p < Duration::from_secs(60) || p > years) {
                return Err((key, format!("{role}: a budget's period is 1m to 100years (absent: the lifetime)")));
            }
        }
        Ok(())
    }

    fn validate_repos(&self) -> Result<(), Invalid> {
        for repo in &self.repos {
            if repo.name.trim().is_empty() || repo.source.trim().is_empty() {
                return Err(("repos", "every [[repos]] entry names a name and a source".into()));
            }
        }
        Ok(())
    }

    fn validate_git_endpoint(&self) -> Result<(), Invalid> {
        self.daemon.git_address().map_err(|e| ("daemon.git_listen", e))?;
        let url = self.daemon.git_url.as_str();
        let shaped = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
        if !url.is_empty() && !shaped.is_some_and(|rest| !rest.is_empty() && !rest.contains(char::is_whitespace)) {
            return Err(("daemon.git_url", format!("{url:?} is not an http(s) URL such as http://build-host:7420")));
        }
        Ok(())
    }

    fn validate_web(&self) -> Result<(), Invalid> {
        if self.web.tls_cert.as_os_str().is_empty() != self.web.tls_key.as_os_str().is_empty() {
            let missing = if self.web.tls() { "web.tls_key" } else { "web.tls_cert" };
            return Err((missing, "tls_cert and tls_key go together: set both or neither".into()));
        }
        self.web.address().map_err(|e| ("web.listen", e))?;
        if !self.web.public_url.is_empty() {
            check_public_url(&self.web.public_url).map_err(|e| ("web.public_url", e))?;
        }
        longer_than_zero(&[("web.session_ttl", self.web.session_ttl), ("web.link_ttl", self.web.link_ttl)])
    }

    fn validate_retention(&self) -> Result<(), Invalid> {
        let retention = &self.retention;
        longer_than_zero(&[
            ("retention.activity", retention.activity),
            ("retention.transcripts", retention.transcripts),
            ("retention.usage", retention.usage),
            ("retention.interval", retention.interval),
            ("retention.checkouts", retention.checkouts),
            ("retention.checks", retention.checks),
        ])
    }

    fn validate_notify(&self) -> Result<(), Invalid> {
        longer_than_zero(&[("notify.timeout", self.notify.timeout), ("notify.remind_after", self.notify.remind_after)])
    }
}

/// A refused value: the dotted key and why.
type Invalid = (&'static str, String);

/// Refuses a count of zero.
fn at_least_one(key: &'static str, value: usize) -> Result<(), Invalid> {
    if value == 0 { Err((key, "must be at least 1".to_owned())) } else { Ok(()) }
}

/// Refuses the first zero duration of `values`.
fn longer_than_zero(values: &[(&'static str, Duration)]) -> Result<(), Invalid> {
    match values.iter().find(|(_, value)| value.is_zero()) {
        Some((key, _)) => Err((key, "must be longer than zero".into())),
        None => Ok(()),
    }
}

/// Names the dotted key whose line holds the error span: the nearest `[table]` header above
/// it and the `key =` on its line.
fn key_at(text: &str, span: Option<std::ops::Range<usize>>) -> Option<String> {
    let start = span?.start.min(text.len());
    let before = &text[..start];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let line = text[line_start..line_end].trim();
    let table = before[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && l.ends_with(']'))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_owned());
    if line.starts_with('[') {
        return Some(line.trim_matches(|c| c == '[' || c == ']').trim().to_owned());
    }
    let key = line.split('=').next().map(str::trim).filter(|k| !k.is_empty() && !k.starts_with('#'))?;
    Some(match table {
        Some(table) => format!("{table}.{key}"),
        None => key.to_owned(),
    })
}

/// Durations as humantime strings (`30s`, `24h`).
mod humantime_serde {
    use super::*;

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&humantime::format_duration(*value).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text)
            .map_err(|e| serde::de::Error::custom(format!("{text:?} is not a duration like \"30s\" or \"24h\": {e}")))
    }

    /// An optional duration; `"lifetime"` is none.
    pub mod option {
        use super::*;

        pub fn serialize<S: Serializer>(value: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
            match value {
                Some(d) => super::serialize(d, serializer),
                None => serializer.serialize_str("lifetime"),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
            let text = String::deserialize(deserializer)?;
            if text == "lifetime" {
                return Ok(None);
            }
            humantime::parse_duration(&text).map(Some).map_err(|e| {
                serde::de::Error::custom(format!("{text:?} is not a period like \"1day\" or \"lifetime\": {e}"))
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    #[test]
    fn a_role_names_one_harness_or_a_chain_and_a_bad_chain_is_refused() {
        let chain: Config = toml::from_str("[roles.manager]\nharness = [\"claude\", \"codex\"]\n").unwrap();
        let role = &chain.roles["manager"];
        assert_eq!((role.harness.as_str(), role.fallback.as_slice()), ("claude", &["codex".to_owned()][..]));
        assert_eq!(role.chain(), ["claude", "codex"]);
        let one: Config = toml::from_str("[roles.manager]\nharness = \"claude\"\n").unwrap();
        assert!(one.roles["manager"].fallback.is_empty());
        for (bad, why) in [("[\"claude\", \"gpt\"]", "not one of"), ("[\"claude\", \"claude\"]", "twice")] {
            let config: Config = toml::from_str(&format!("[roles.manager]\nharness = {bad}\n")).unwrap();
            let (key, message) = config.validate_sessions().unwrap_err();
            assert!(key == "roles.harness" && message.contains(why), "{bad}: {message}");
        }
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("canopy.toml"), text)
    }

    #[test]
    fn the_shipped_file_is_the_defaults() {
        assert_eq!(parse(DEFAULT_TOML), Ok(Config::default()));
    }

    #[test]
    fn git_settings_under_their_old_name_still_read() {
        let old = parse("[workspaces]\ngit = \"/usr/bin/git\"\ncheck_timeout = \"5m\"\n");
        let old = old.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(old.git.program, PathBuf::from("/usr/bin/git"));
        assert_eq!(old.git.check_timeout, Duration::from_secs(300));
        let empty = parse("[git]\nprogram = \"\"\n");
        assert!(empty.is_err_and(|e| e.key == "git.program"));
    }

    #[test]
    fn the_shipped_file_shows_every_key() {
        let defaults = toml::to_string(&Config::default()).unwrap_or_default();
        let mut table = String::new();
        for line in defaults.lines() {
            if line.starts_with('[') {
                table = line.trim_matches(|c| c == '[' || c == ']').to_owned();
                assert!(DEFAULT_TOML.lines().any(|l| l == line), "config/canopy.toml lacks {line}");
            } else if let Some((key, _)) = line.split_once(" = ") {
                let shown = DEFAULT_TOML.lines().any(|l| l.starts_with(&format!("{key} = ")));
                assert!(shown, "config/canopy.toml lacks {table}.{key}");
            }
        }
    }

    #[test]
    fn role_budgets_are_checked_against_the_roles() {
        let ok = parse("[budgets.roles.manager]\nusd = 5.0\nperiod = \"1day\"\nsubtree = true\n")
            .expect("a manager budget parses");
        let manager = &ok.budgets.roles["manager"];
        assert_eq!(
            (manager.usd, manager.period, manager.subtree),
            (Some(5.0), Some(Duration::from_secs(86_400)), true)
        );
        let lifetime = parse("[budgets.roles.implementer]\ntokens = 100000\nperiod = \"lifetime\"\n")
            .expect("a lifetime budget parses");
        assert_eq!(lifetime.budgets.roles["implementer"].period, None);
        for bad in [
            "[budgets.roles.ghost]\nusd = 1.0\n",
            "[budgets.roles.manager]\nperiod = \"1day\"\n",
            "[budgets.roles.manager]\nusd = -1.0\n",
            "[budgets.roles.manager]\nusd = 1.0\nperiod = \"5s\"\n",
        ] {
            assert_eq!(parse(bad).err().map(|e| e.key), Some("budgets.roles".into()), "{bad}");
        }
        let err = parse("[budgets.roles.manager]\nusd = 1.0\nperiod = \"soon\"\n").err();
        assert!(err.is_some_and(|e| e.key.starts_with("budgets")));
        let err = parse("[budgets]\nunreported_turn_usd = -0.5\n").err();
        assert_eq!(err.map(|e| e.key), Some("budgets.unreported_turn_usd".into()));
    }

    #[test]
    fn bad_keys_and_values_name_the_key() {
        let err = parse("[limits]\nmax_body_bytes = \"big\"\n").err();
        assert_eq!(err.map(|e| e.key), Some("limits.max_body_bytes".into()));
        let err = parse("[daemon]\nrequest_timout = \"5s\"\n").err();
        assert_eq!(err.map(|e| e.key), Some("daemon.request_timout".into()));
        let err = parse("[daemon]\nrequest_timeout = \"soon\"\n").err();
        assert_eq!(err.as_ref().map(|e| e.key.as_str()), Some("daemon.request_timeout"));
        let err = parse("[limits]\nmax_body_bytes = 0\n").err();
        assert_eq!(err.map(|e| e.key), Some("limits.max_body_bytes".into()));
        let err = parse("[retention]\nactivity = \"0s\"\n").err();
        assert_eq!(err.map(|e| e.key), Some("retention.activity".into()));
        let err = parse("[retention]\ntranscripts = \"forever\"\n").err();
        assert_eq!(err.map(|e| e.key), Some("retention.transcripts".into()));
        let err = parse("[nope]\n").err();
        assert_eq!(err.map(|e| e.key), Some("nope".into()));
    }

    #[test]
    fn harness_tables_parse_and_name_bad_keys() {
        let text = "[harness.claude]\nbin = \"/opt/claude\"\nmodel = \"sonnet\"\n[harness.claude.env]\nANTHROPIC_API_KEY = \"k\"\n\
                    [harness.codex.provider]\nbase_url = \"http://127.0.0.1:9/v1\"\napi_key_env = \"KEY\"\n";
        let config = parse(text).unwrap_or_default();
        let claude = config.harness.claude.keys();
        assert_eq!(claude.bin, Some(Path::new("/opt/claude")));
        assert_eq!(claude.env.get("ANTHROPIC_API_KEY").map(String::as_str), Some("k"));
        let codex = &config.harness.codex;
        assert_eq!(codex.provider.as_ref().map(|p| p.base_url.as_str()), Some("http://127.0.0.1:9/v1"));
        let key = |text: &str| parse(text).err().map(|e| e.key);
        assert_eq!(key("[harness.claude]\nmodle = \"x\"\n"), Some("harness.claude.modle".into()));
        assert_eq!(key("[harness.claude.env]\n\"BAD-NAME\" = \"x\"\n"), Some("harness.claude.env.BAD-NAME".into()));
        assert_eq!(key("[harness.claude]\nmodel = \" \"\n"), Some("harness.claude.model".into()));
        assert_eq!(
            key("[harness.codex.provider]\nbase_url = \"ftp://x\"\n"),
            Some("harness.codex.provider.base_url".into())
        );
        assert_eq!(key("[harness.claude]\nprovider = 1\n"), Some("harness.claude.provider".into()));
    }

    #[test]
    fn sandbox_keys_are_checked() {
        let key = |text: &str| parse(text).err().map(|e| e.key);
        assert_eq!(key("[sandbox]\nmode = \"maybe\"\n"), Some("sandbox.mode".into()));
        assert_eq!(key("[sandbox]\nread_only = [\"relative/path\"]\n"), Some("sandbox.read_only".into()));
        assert_eq!(key("[sandbox]\nconnect_ports = [0]\n"), Some("sandbox.connect_ports".into()));
        assert_eq!(key("[sandbox]\nconnect_ports = [70000]\n"), Some("sandbox.connect_ports".into()));
        assert_eq!(key("[sandbox]\nbwrap = \"\"\n"), Some("sandbox.bwrap".into()));
        assert_eq!(key("[sandbox]\nnetwork = \"wide\"\n"), Some("sandbox.network".into()));
        assert_eq!(key("[sandbox]\nallow_hosts = [\"a b\"]\n"), Some("sandbox.allow_hosts".into()));
        assert_eq!(key("[sandbox]\nallow_hosts = [\"ev*l.com\"]\n"), Some("sandbox.allow_hosts".into()));
        assert_eq!(key("[sandbox]\nmax_processes = 3\n"), Some("sandbox.max_processes".into()));
        assert_eq!(key("[sandbox]\nmax_memory = \"2 GB\"\n"), Some("sandbox.max_memory".into()));
        assert_eq!(key("[sandbox]\nmax_memory = \"1 MiB\"\n"), Some("sandbox.max_memory".into()));
        assert_eq!(key("[sandbox]\nmax_open_files = 1\n"), Some("sandbox.max_open_files".into()));
        assert_eq!(key("[sandbox]\ncpu_weight = 0\n"), Some("sandbox.cpu_weight".into()));
        let role = "[roles.implementer]\nharness = \"scripted\"\nallow_hosts = [\"bad host\"]\n";
        assert_eq!(key(role), Some("roles.allow_hosts".into()));
        let fine =
            parse("[sandbox]\nmax_memory = \"2 GiB\"\nallow_hosts = [\"*.crates.io:443\", \"registry.npmjs.org\"]\n");
        assert_eq!(fine.unwrap_or_default().sandbox.max_memory, canopy_core::size::Size(2 << 30));
        let off = parse("[sandbox]\nmode = \"off\"\n").unwrap_or_default();
        assert_eq!(off.sandbox.mode, SandboxModeConfig::Off);
    }

    #[test]
    fn durations_are_humantime() {
        let config = parse("[daemon]\nshutdown_grace = \"1m 30s\"\n").unwrap_or_default();
        assert_eq!(config.daemon.shutdown_grace, Duration::from_secs(90));
    }

    #[test]
    fn the_consoles_public_url_and_the_reminder_age_are_checked() {
        let config = parse("[web]\npublic_url = \"https://canopy.lan:8443/\"\n[notify]\nremind_after = \"2h\"\n");
        let config = config.unwrap_or_default();
        assert_eq!(config.web.public_url, "https://canopy.lan:8443/");
        assert_eq!(config.notify.remind_after, Duration::from_secs(7200));
        for bad in ["canopy.lan", "ftp://x", "https://", "https://a/b", "https://u@a", "https://a?x=1"] {
            let err = parse(&format!("[web]\npublic_url = \"{bad}\"\n")).err();
            assert_eq!(err.map(|e| e.key), Some("web.public_url".into()), "{bad}");
        }
        let err = parse("[notify]\nremind_after = \"0s\"\n").err();
        assert_eq!(err.map(|e| e.key), Some("notify.remind_after".into()));
        // Beyond loopback only over TLS, and the certificate needs its key.
        let err = parse("[web]\nlisten = \"0.0.0.0:8443\"\n").err();
        assert_eq!(err.map(|e| e.key), Some("web.listen".into()));
        let err = parse("[web]\ntls_cert = \"web/tls/cert.pem\"\n").err();
        assert_eq!(err.map(|e| e.key), Some("web.tls_key".into()));
        let tls = "[web]\nlisten = \"0.0.0.0:8443\"\ntls_cert = \"c.pem\"\ntls_key = \"/k.pem\"\n";
        let web = parse(tls).unwrap_or_default().web;
        let files = web.tls_files(std::path::Path::new("/data"));
        assert_eq!(files, Some(("/data/c.pem".into(), "/k.pem".into())));
    }
}
