//! The command-line grammar (clap derive), and the list of its command paths the prompt lint
//! checks a bundle against. Every command takes `--dir` and `--json`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Every command path of the CLI (`canopy agents create`), for the prompt lint.
pub fn cli_commands() -> Vec<String> {
    fn walk(command: &clap::Command, prefix: &str, out: &mut Vec<String>) {
        for sub in command.get_subcommands() {
            let path = format!("{prefix} {}", sub.get_name());
            out.push(path.clone());
            walk(sub, &path, out);
        }
    }
    let mut out = Vec::new();
    walk(&<Cli as clap::CommandFactory>::command(), "canopy", &mut out);
    out
}

#[derive(Debug, Parser)]
#[command(name = "canopy", version, about = "Run a tree of coding-agent sessions for a human operator.")]
pub struct Cli {
    /// The workspace's data directory.
    #[arg(long, global = true, env = "CANOPY_DIR", default_value = ".canopy")]
    pub dir: PathBuf,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Log format on stderr (`RUST_LOG` sets the level).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Show times in UTC instead of this machine's time zone.
    #[arg(long, global = true)]
    pub utc: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// `canopy web`.
#[derive(Debug, Args)]
pub struct WebArgs {
    /// Only print the link; do not start a browser.
    #[arg(long)]
    pub no_open: bool,
    /// Also print the link as a QR code, for a phone's camera.
    #[arg(long)]
    pub qr: bool,
    /// Make a self-signed certificate and key for the console in web/tls/ and print its
    /// fingerprint and the `[web]` lines that use it (no link).
    #[arg(long)]
    pub init_tls: bool,
    /// With --init-tls: a name or address the certificate is also good for (repeatable):
    /// the name your phone or laptop reaches this machine by.
    #[arg(long = "name", requires = "init_tls")]
    pub names: Vec<String>,
    /// With --init-tls: replace an existing pair.
    #[arg(long, requires = "init_tls")]
    pub force: bool,
}

/// What `canopy complete` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompleteWhat {
    Handles,
    Channels,
    Requests,
    Issues,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a workspace: the database, the Supervisor, the broadcast channels, an operator.
    Init(InitArgs),
    /// Run the daemon (and its private nats-server unless --nats-url is given).
    Daemon(DaemonArgs),
    /// `init` when the directory has no workspace yet, then `daemon`.
    Up {
        #[command(flatten)]
        init: InitArgs,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Show who the operator token belongs to and which workspace the daemon serves.
    Whoami,
    /// Standing agents: create, list, show, reparent.
    #[command(subcommand)]
    Agents(AgentsCommand),
    /// The agent tree from the Supervisor down.
    Tree,
    /// List channels, or create one.
    Channels {
        #[command(subcommand)]
        command: Option<ChannelsCommand>,
    },
    /// The topics of a channel (most recent activity first), or rename or resolve one.
    Topics {
        /// The channel.
        #[arg(long)]
        channel: String,
        #[command(subcommand)]
        command: Option<TopicsCommand>,
    },
    /// A channel's pinned board: list it, or pin a message to it.
    Board {
        /// The channel.
        #[arg(long)]
        channel: String,
        #[command(subcommand)]
        command: Option<BoardCommand>,
    },
    /// Post a message to a channel and topic (the body from the argument or stdin).
    Post(PostArgs),
    /// Read a channel's messages, grouped by topic.
    Read(ReadArgs),
    /// Follow new messages live.
    Tail(TailArgs),
    /// Every agent's live state: presence, why it is idle, its activity line, last seen.
    Roster,
    /// One screen: the daemon, runners, agents by presence, what waits for you, budget
    /// alerts, the latest incidents.
    Status,
    /// Follow an agent's session live, read-only: turns, text, tool calls.
    Watch(WatchArgs),
    /// A live full-screen view: the tree, what waits for you (approve, deny), budget alerts,
    /// the newest messages; follows a restarted daemon. Keys are listed at the bottom.
    Top {
        /// How often to read the workspace again.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: std::time::Duration,
    },
    /// The operator console in a browser: prints a one-time login link (the token stays here),
    /// or with --init-tls makes the console a self-signed certificate for HTTPS.
    Web(WebArgs),
    /// Run a runner as its own process: it hosts sessions placed on it by the daemon.
    Runner(RunnerArgs),
    /// Operators: add one (a token of its own), list them, revoke one.
    #[command(subcommand)]
    Operators(OperatorsCommand),
    /// Runners: list them (the default), add a credential (a NATS login and an API token),
    /// revoke one, drain one or take it back.
    Runners {
        #[command(subcommand)]
        command: Option<RunnersCommand>,
    },
    /// The workspace's NATS logins and runner tokens: rotate them all.
    #[command(subcommand)]
    Credentials(CredentialsCommand),
    /// Print the `authorization` block (bcrypt password hashes) for an external nats-server
    /// the daemon uses with --nats-url.
    NatsConfig,
    /// Serve the native tools over MCP on stdio for one session's token (for harnesses
    /// that only speak stdio).
    Mcp(McpArgs),
    /// Check this machine: nats-server and each harness (found, version, a session starts).
    /// Exits 69 when something the configured roles need is missing.
    Doctor,
    /// Play the four flows of the product on a temporary workspace, narrated.
    Demo {
        /// Approve the spawn request automatically instead of asking at the terminal.
        #[arg(long)]
        yes: bool,
    },
    /// Approve a pending spawn request.
    Approve {
        /// The request, `req-N`.
        id: String,
    },
    /// Deny a pending spawn request.
    Deny {
        /// The request, `req-N`.
        id: String,
        /// Why, told to the requester.
        #[arg(long)]
        reason: String,
    },
    /// Repositories agents work on: add one, list them with every checkout, collect leftovers.
    #[command(subcommand)]
    Repos(ReposCommand),
    /// Named checks' runs, newest first (by repository or branch), or one check's log.
    #[command(args_conflicts_with_subcommands = true)]
    Checks {
        /// Only this repository's.
        #[arg(long)]
        repo: Option<String>,
        /// Only this branch's (or `merge-N`'s).
        #[arg(long)]
        branch: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[command(subcommand)]
        command: Option<ChecksCommand>,
    },
    /// Merge requests, newest first, with their conflicts; show one, approve one (it joins the
    /// merge queue), deny one, or see the queue.
    Merges {
        /// checking, in_review, pending, queued, merging, merged, denied or refused.
        #[arg(long)]
        state: Option<String>,
        #[command(subcommand)]
        command: Option<MergesCommand>,
    },
    /// The work ledger: issues that are not closed (filters below), or file, show, assign,
    /// move, comment on, close, edit, budget, import from GitHub or export them.
    #[command(args_conflicts_with_subcommands = true)]
    Issues {
        #[command(flatten)]
        list: IssuesListArgs,
        #[command(subcommand)]
        command: Option<IssuesCommand>,
    },
    /// Spawn requests, newest first.
    Requests {
        /// pending, approved, spawned, failed, denied, expired or cancelled.
        #[arg(long)]
        state: Option<String>,
        /// Wait until a new request arrives, print it and exit.
        #[arg(long, conflicts_with = "state")]
        wait: bool,
    },
    /// The audit log, newest first.
    Audit {
        /// Only entries newer than this (humantime: 1h, 2days).
        #[arg(long, value_parser = humantime::parse_duration)]
        since: Option<std::time::Duration>,
    },
    /// Prompts: print exactly what a session receives.
    #[command(subcommand)]
    Prompt(PromptCommand),
    /// The prompt bundle: validate it.
    #[command(subcommand)]
    Bundle(BundleCommand),
    /// An agent's subagent runs, newest first.
    Runs {
        /// The Manager whose runs to list.
        #[arg(long)]
        agent: String,
        /// Only runs still out.
        #[arg(long)]
        open: bool,
    },
    /// Tokens (and cost, where the harness reports it) used by sessions: per agent, and for
    /// one agent per session and per recent turn.
    Usage {
        /// Only this agent, with its sessions and recent turns.
        #[arg(long)]
        agent: Option<String>,
        /// Only usage reported within this long (humantime: 1h, 7days).
        #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "series")]
        since: Option<std::time::Duration>,
        /// Spend over time instead: a point per hour over the last 24 (`--daily`: per day over 30).
        #[arg(long)]
        series: bool,
        /// With --series and --agent: the agent's whole subtree.
        #[arg(long, requires = "series")]
        subtree: bool,
        /// With --series: only what was charged to this issue.
        #[arg(long, requires = "series", conflicts_with = "agent")]
        issue: Option<u64>,
        /// With --series: a point per day over the last 30.
        #[arg(long, requires = "series")]
        daily: bool,
    },
    /// Print a shell completion script: `source <(canopy completions bash)`. Bash also
    /// completes handles, channels, request ids and issue numbers from the running daemon.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff): `canopy man | man -l -`.
    Man,
    /// Completion candidates from the running daemon, one per line (used by the scripts).
    #[command(hide = true)]
    Complete {
        /// handles, channels, requests or issues.
        #[arg(value_enum)]
        what: CompleteWhat,
    },
}

#[derive(Debug, Subcommand)]
pub enum TopicsCommand {
    /// Rename a topic.
    Rename {
        /// The topic as it is named now.
        topic: String,
        /// Its new name.
        to: String,
    },
    /// Mark a topic resolved (`--reopen` to open it again).
    Resolve {
        /// The topic.
        topic: String,
        /// Open it again instead.
        #[arg(long)]
        reopen: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum BoardCommand {
    /// Pin message SEQ of the channel.
    Pin {
        /// The message's sequence number.
        seq: canopy_core::Seq,
    },
    /// Take message SEQ off the channel's board (operators: any pin).
    Unpin {
        /// The message's sequence number.
        seq: canopy_core::Seq,
    },
}

#[derive(Debug, Clone, Args)]
pub struct WatchArgs {
    /// The agent's handle.
    pub handle: String,
    /// How many earlier items to show first.
    #[arg(long, default_value_t = 20)]
    pub tail: u32,
    /// Print what is stored and exit instead of following.
    #[arg(long)]
    pub no_follow: bool,
    /// How often to resync from the store even without a doorbell.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub resync: std::time::Duration,
    /// Print where the agent's time went instead (its turns, the tool calls in them, steers
    /// and deliveries) over the last 24 hours, and exit.
    #[arg(long, conflicts_with_all = ["tail", "no_follow"])]
    pub timeline: bool,
}

#[derive(Debug, Clone, Args)]
pub struct RunnerArgs {
    /// The NATS server the daemon uses (default: the one in daemon.json).
    #[arg(long, env = "CANOPY_NATS_URL")]
    pub nats_url: Option<String>,
    /// The runner's credential in this data directory (`canopy runners add ID` made it).
    #[arg(long, conflicts_with = "credentials")]
    pub id: Option<String>,
    /// A runner credential file (`canopy runners add ID --out FILE`, carried to this machine).
    #[arg(long)]
    pub credentials: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum OperatorsCommand {
    /// Another operator; its token is written to --out (mode 0600) or printed once.
    Add {
        /// The operator's handle.
        handle: String,
        /// Display name (default: the handle).
        #[arg(long)]
        name: Option<String>,
        /// Write the token here (mode 0600) instead of printing it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Every operator and its state.
    List,
    /// Revoke an operator: its token is refused from its next request on.
    Revoke {
        /// The operator's handle.
        handle: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum RunnersCommand {
    /// A credential for a new runner; the managed NATS server accepts it at once.
    Add {
        /// The runner's id: lowercase letters, digits and hyphens.
        id: String,
        /// Also write the credential here (mode 0600), to carry to the runner's machine.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Revoke a runner's credential: its connection is closed, its token refused.
    Remove {
        /// The runner's id.
        id: String,
    },
    /// Every runner: labels, sessions, capacity, last sync, version, draining (the default).
    List,
    /// Take a runner out of service: no new sessions there, and each of its sessions moves
    /// to another runner at its next turn boundary (never mid-turn).
    Drain {
        /// The runner's id.
        id: String,
    },
    /// Put a drained runner back in service.
    Undrain {
        /// The runner's id.
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum CredentialsCommand {
    /// New passwords and tokens for every NATS login and runner; old connections are closed.
    Rotate,
}

#[derive(Debug, Clone, Args)]
pub struct McpArgs {
    /// Serve on stdin/stdout (the only transport of this command).
    #[arg(long, required = true)]
    pub stdio: bool,
    /// The runner's MCP endpoint the session was given (`http://127.0.0.1:PORT/mcp`).
    #[arg(long, env = "CANOPY_MCP_URL")]
    pub url: String,
    /// The session's bearer token.
    #[arg(long, env = "CANOPY_MCP_TOKEN", hide_env_values = true)]
    pub token: String,
}

#[derive(Debug, Clone, Args)]
pub struct InitArgs {
    /// What this workspace is for; every Manager's prompt carries it.
    #[arg(long, default_value = "")]
    pub mission: String,
    /// The operator's handle (defaults to $USER, or `admin` when that is not a valid handle).
    #[arg(long)]
    pub operator: Option<String>,
    /// The workspace's display name.
    #[arg(long, default_value = "canopy")]
    pub name: String,
}

#[derive(Debug, Clone, Args)]
pub struct DaemonArgs {
    /// Use this NATS server instead of starting a private one.
    #[arg(long, env = "CANOPY_NATS_URL")]
    pub nats_url: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum ReposCommand {
    /// Register a repository: Canopy mirrors it; agents never write it.
    Add {
        /// Its name in Canopy (1-40 of `a-z`, `0-9`, `-`, `_`).
        name: String,
        /// The canonical repository: a path or a URL.
        source: String,
        /// The branch merges land on.
        #[arg(long, default_value = "main")]
        base: String,
        /// A named check, `NAME=CMD` (repeatable), run confined on each run's tree, each new
        /// commit of a Manager's branch, each merge request and in the merge queue; a bare
        /// command is the check named `check`.
        #[arg(long = "check", value_name = "NAME=CMD")]
        checks: Vec<String>,
        /// Whose word makes a merge request reviewed: `operator` (default) or `required` (a
        /// reviewer run on every merge request).
        #[arg(long)]
        review: Option<String>,
    },
    /// The repositories and every checkout.
    List,
    /// Report checkout directories nothing owns, and remove them.
    Gc {
        /// Only report.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ChecksCommand {
    /// A check's output (its last MiB), `check-N`.
    Log {
        /// The check run, `check-N`.
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum MergesCommand {
    /// Approve a merge request: it joins its repository's merge queue, which merges it only if
    /// every check passes on the base as it is then; waits for the outcome.
    Approve {
        /// The request, `merge-N`.
        id: String,
        /// Approve over a missing or negative review verdict, saying why (recorded).
        #[arg(long = "override", value_name = "REASON")]
        override_reason: Option<String>,
        /// Return once it is queued instead of waiting for the queue.
        #[arg(long)]
        no_wait: bool,
    },
    /// One request: its checks, review verdicts and comments, conflicts and place in the queue.
    Show {
        /// The request, `merge-N`.
        id: String,
    },
    /// Each repository's merge queue, in order.
    Queue {
        /// Only this repository's.
        #[arg(long)]
        repo: Option<String>,
    },
    /// Deny a pending merge request.
    Deny {
        /// The request, `merge-N`.
        id: String,
        /// Why, told to the requester.
        #[arg(long)]
        reason: String,
    },
}

/// `canopy issues`: which issues to list.
#[derive(Debug, Clone, Default, Args)]
pub struct IssuesListArgs {
    /// Only issues in this state: open, in_progress, blocked, in_review, done or wontdo.
    #[arg(long)]
    pub state: Option<String>,
    /// Only issues this account owns, or `nobody` for unassigned ones.
    #[arg(long, conflicts_with = "subtree")]
    pub owner: Option<String>,
    /// Only issues owned by this agent or one of its descendants.
    #[arg(long)]
    pub subtree: Option<String>,
    /// Only issues with this label.
    #[arg(long)]
    pub label: Option<String>,
    /// Closed issues too (done, wontdo).
    #[arg(long)]
    pub all: bool,
    /// At most this many issues (default: every one that matches).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: Option<u32>,
}

#[derive(Debug, Subcommand)]
pub enum IssuesCommand {
    /// File an issue (state open); without --assign it has no owner and the Supervisor
    /// triages it.
    New(IssuesNewArgs),
    /// One issue: its fields, body, sub-issues, runs, merge requests and spend, then its
    /// events oldest first.
    Show {
        /// The issue, `N` or `#N`.
        issue: String,
    },
    /// Give an issue an owner; its topic moves to the owner's home channel.
    Assign {
        /// The issue, `N` or `#N`.
        issue: String,
        /// The new owner's handle (an agent or an operator).
        owner: String,
        /// Why, told to the new owner.
        #[arg(long)]
        note: Option<String>,
    },
    /// Move an issue to another state, with a note; `blocked` names what blocks it.
    Move {
        /// The issue, `N` or `#N`.
        issue: String,
        /// open, in_progress, blocked or in_review (`close` closes).
        state: String,
        /// Why it moves.
        #[arg(long)]
        note: String,
        /// For blocked: an issue it waits for (repeatable).
        #[arg(long = "blocked-by")]
        blocked_by: Vec<String>,
        /// For blocked: the question it waits on the operator's answer to.
        #[arg(long)]
        question: Option<String>,
    },
    /// Comment on an issue; the comment reaches its owner in the issue's topic.
    Comment {
        /// The issue, `N` or `#N`.
        issue: String,
        /// The comment (markdown); read from stdin when absent or `-`.
        text: Option<String>,
    },
    /// Close an issue as done (every sub-issue closed first), or with --wontdo as not to be
    /// done, with a one-line resolution.
    Close {
        /// The issue, `N` or `#N`.
        issue: String,
        /// One line saying how it ended.
        #[arg(long)]
        resolution: String,
        /// Close it as wontdo instead of done.
        #[arg(long)]
        wontdo: bool,
        /// The note on the move (default: the resolution).
        #[arg(long)]
        note: Option<String>,
    },
    /// Change an issue's title, body, labels or dependencies.
    Edit(IssuesEditArgs),
    /// Set or clear an issue's dollar budget: runs for it are held once it is spent.
    Budget {
        /// The issue, `N` or `#N`.
        issue: String,
        /// US dollars.
        #[arg(long, required_unless_present = "clear", conflicts_with = "clear")]
        usd: Option<f64>,
        /// Remove the budget.
        #[arg(long)]
        clear: bool,
    },
    /// File issues from GitHub's JSON, as `gh issue list --state all --limit 1000 --json
    /// number,title,body,labels,state` prints it; issues imported before are skipped.
    Import {
        /// The JSON file (`-`: stdin). It is checked whole before anything is filed.
        file: PathBuf,
        /// Where the issues come from (`github:owner/repo`); each keeps `<source>#<number>`.
        #[arg(long, default_value = "github")]
        source: String,
    },
    /// Write every issue as JSON lines, one issue per line, lowest number first.
    Export {
        /// Write to this file instead of stdout (replaced only once every issue is written).
        #[arg(long)]
        output: Option<PathBuf>,
    },
}

// `canopy issues new`.
#[derive(Debug, Clone, Args)]
pub struct IssuesNewArgs {
    /// One line.
    #[arg(long)]
    pub title: String,
    /// Markdown: what, why, what done means; `-` reads it from stdin.
    #[arg(long)]
    pub body: Option<String>,
    /// Its owner's handle (default: nobody; the Supervisor triages it).
    #[arg(long)]
    pub assign: Option<String>,
    /// A label (repeatable).
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// The issue this is a sub-issue of, `N` or `#N`.
    #[arg(long)]
    pub parent: Option<String>,
    /// An issue this one depends on (repeatable).
    #[arg(long = "depends-on")]
    pub depends_on: Vec<String>,
    /// A retry with the same key returns the issue filed first instead of filing twice.
    #[arg(long)]
    pub idempotency_key: Option<String>,
}

// `canopy issues edit`: each flag given replaces what the issue has.
#[derive(Debug, Clone, Args)]
pub struct IssuesEditArgs {
    /// The issue, `N` or `#N`.
    pub issue: String,
    /// A new title.
    #[arg(long)]
    pub title: Option<String>,
    /// A new body; `-` reads it from stdin.
    #[arg(long)]
    pub body: Option<String>,
    /// The labels (repeatable), replacing the issue's.
    #[arg(long = "label", conflicts_with = "clear_labels")]
    pub labels: Vec<String>,
    /// Remove every label.
    #[arg(long)]
    pub clear_labels: bool,
    /// The issues it depends on (repeatable), replacing its dependencies.
    #[arg(long = "depends-on", conflicts_with = "clear_depends_on")]
    pub depends_on: Vec<String>,
    /// Remove every dependency.
    #[arg(long)]
    pub clear_depends_on: bool,
}

#[derive(Debug, Subcommand)]
pub enum AgentsCommand {
    /// Provision a standing agent under a parent (the Supervisor by default).
    Create(CreateArgs),
    /// Every agent.
    List,
    /// One agent with its children and subscriptions.
    Show {
        /// The agent's handle.
        handle: String,
    },
    /// Start (or restart after a crash loop) an agent's session.
    Start {
        /// The agent's handle.
        handle: String,
        /// Move its lane to this harness of its role's chain (back from a failover, say); a
        /// live session on another harness ends at its next turn boundary.
        #[arg(long)]
        harness: Option<String>,
    },
    /// Stop an agent's session; it stays stopped until `start`.
    Stop {
        /// The agent's handle.
        handle: String,
    },
    /// Interrupt an agent's running turn; the session stays up and takes its next message.
    Interrupt {
        /// The agent's handle.
        handle: String,
    },
    /// Set, clear or show an agent's budget (its own turns and runs, or with --subtree its
    /// whole subtree's): US dollars and/or tokens per period, or for its lifetime.
    Budget {
        /// The agent's handle.
        handle: String,
        /// US dollars per period.
        #[arg(long)]
        usd: Option<f64>,
        /// Tokens per period (fresh input, cache writes and output).
        #[arg(long)]
        tokens: Option<u64>,
        /// How long a period lasts (`1day`, `30days`, at least `1m`), or `lifetime` (the default).
        #[arg(long)]
        period: Option<String>,
        /// The budget of the agent's subtree: it, its descendants and all their runs.
        #[arg(long)]
        subtree: bool,
        /// Remove the budget (of this scope).
        #[arg(long)]
        clear: bool,
    },
    /// Despawn an agent and its subtree: sessions stop, history stays. Asks first on a
    /// terminal.
    Despawn {
        /// The agent's handle.
        handle: String,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
    /// Move an agent under another parent.
    Reparent {
        /// The agent's handle.
        handle: String,
        /// Its new parent.
        #[arg(long)]
        parent: String,
    },
}

// `canopy agents create`: its doc is the variant's, so the help reads as before.
#[derive(Debug, Clone, Args)]
pub struct CreateArgs {
    /// Its handle: lowercase letters, digits and hyphens (`ci-manager`).
    #[arg(long)]
    pub handle: String,
    /// Display name, e.g. "CI Manager".
    #[arg(long)]
    pub name: String,
    /// Its role in the prompt bundle (`manager`, `implementer`, ...).
    #[arg(long, default_value = "manager")]
    pub role: String,
    /// Its parent in the tree (default: the Supervisor).
    #[arg(long)]
    pub parent: Option<String>,
    /// What the agent's lane is for.
    #[arg(long, default_value = "")]
    pub charter: String,
    /// The harness its sessions run (default: the role's, from canopy.toml).
    #[arg(long)]
    pub harness: Option<String>,
    /// A script file for the scripted harness (default: the role's).
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// A persona overlay, rendered last in the agent's prompt.
    #[arg(long)]
    pub persona: Option<String>,
    /// A repository (`canopy repos add`): the agent works in its own checkout, on branch
    /// canopy/<handle>.
    #[arg(long)]
    pub repo: Option<String>,
    /// A runner label its sessions need (repeatable, or comma-separated): it is placed only on
    /// a runner with every one (`[runner] labels`).
    #[arg(long, value_delimiter = ',')]
    pub needs: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum ChannelsCommand {
    /// Every channel.
    List,
    /// Create a general or broadcast channel.
    Create {
        /// The channel's name: lowercase letters, digits and hyphens.
        name: String,
        /// A general channel (anyone subscribed may post) or a broadcast one.
        #[arg(long, value_enum, default_value_t = KindArg::General)]
        kind: KindArg,
        /// Who may post (default: open for general channels, restricted for broadcast).
        #[arg(long, value_enum)]
        post_policy: Option<PostPolicyArg>,
        /// A poster of a restricted channel (repeatable).
        #[arg(long = "poster")]
        posters: Vec<String>,
        /// Whether posts wake idle recipients (default: mentions for broadcast channels,
        /// always for general ones).
        #[arg(long, value_enum)]
        wake: Option<WakeArg>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WakeArg {
    Always,
    Mentions,
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KindArg {
    General,
    Broadcast,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PostPolicyArg {
    Open,
    #[value(name = "owner_only")]
    OwnerOnly,
    Restricted,
}

#[derive(Debug, Clone, Args)]
pub struct PostArgs {
    /// The channel.
    #[arg(long)]
    pub channel: String,
    /// The topic (one line; `--create-topic` to start a new one).
    #[arg(long)]
    pub topic: String,
    /// Start the topic if it does not exist.
    #[arg(long)]
    pub create_topic: bool,
    /// A retry with the same key returns the first result instead of posting twice.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// An acknowledgement only: recipients see it at their next turn; it wakes no one.
    #[arg(long)]
    pub ack_only: bool,
    /// Wake every idle recipient, whatever the channel's wake policy (operators).
    #[arg(long)]
    pub wake: bool,
    /// The message; read from stdin when absent or `-`.
    pub body: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct ReadArgs {
    /// The channel.
    #[arg(long)]
    pub channel: String,
    /// Only this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only messages with a sequence above this (read forwards from there).
    #[arg(long, default_value_t = canopy_core::Seq(0))]
    pub after: canopy_core::Seq,
    /// How many messages (default 100, at most 1000).
    #[arg(long)]
    pub limit: Option<u32>,
    /// Start at the oldest message instead of showing the newest page.
    #[arg(long)]
    pub from_start: bool,
}

#[derive(Debug, Clone, Args)]
pub struct TailArgs {
    /// Only this channel (default: every channel).
    #[arg(long)]
    pub channel: Option<String>,
    /// Start after this sequence instead of at the newest message.
    #[arg(long)]
    pub after: Option<canopy_core::Seq>,
    /// Show this many recent messages first (without --after).
    #[arg(long, default_value_t = 5)]
    pub last: u32,
    /// How often to resync from the store even without a doorbell.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub resync: std::time::Duration,
}

#[derive(Debug, Subcommand)]
pub enum PromptCommand {
    /// Render the prompt a session of an agent (or a role) receives, with its hash.
    Render {
        /// The agent whose next session's prompt to render.
        #[arg(long, conflicts_with = "role", required_unless_present = "role")]
        agent: Option<String>,
        /// A role, rendered with example identity facts.
        #[arg(long)]
        role: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum BundleCommand {
    /// Load and lint a bundle: file and line of every problem; exit 1 when there is one.
    Check {
        /// The directory holding config/, agents/, skills/ and rules/ (default: the one the
        /// daemon uses: `[prompts] bundle` in canopy.toml, else the one built into canopy).
        #[arg(long)]
        bundle: Option<PathBuf>,
        /// Also list, per role, each line its sessions do not see yet and the tool it waits for.
        #[arg(long)]
        gated: bool,
    },
    /// Bring a user's existing agent configuration into a bundle: Claude Code skills, agents
    /// and CLAUDE.md, Cursor rules, AGENTS.md, MCP server lists.
    Import {
        /// Where the configuration is (a project or home directory).
        #[arg(long)]
        from: PathBuf,
        /// The bundle to write into (default: `[prompts] bundle`, which must be set).
        #[arg(long)]
        bundle: Option<PathBuf>,
    },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

    use clap::CommandFactory;

    /// `agents create` keeps its help and flags now that they are a struct of their own.
    #[test]
    fn agents_create_keeps_its_help_and_flags() {
        let mut cli = super::Cli::command();
        let create = cli
            .find_subcommand_mut("agents")
            .and_then(|agents| agents.find_subcommand_mut("create"))
            .unwrap_or_else(|| panic!("no `agents create`"));
        let about = create.get_about().map(ToString::to_string).unwrap_or_default();
        assert!(about.starts_with("Provision a standing agent under a parent"), "{about:?}");
        let flags: Vec<&str> = create.get_arguments().filter_map(|a| a.get_long()).collect();
        let expected = ["handle", "name", "role", "parent", "charter", "harness", "script", "persona", "repo"];
        assert_eq!(&flags[..expected.len()], &expected[..]);
    }

    /// `canopy issues` lists with its filters, takes subcommands after them, and refuses a
    /// list filter given to a subcommand rather than ignoring it.
    #[test]
    fn issues_lists_with_filters_or_runs_a_subcommand() {
        use clap::Parser;
        let parse = |args: &[&str]| super::Cli::try_parse_from(std::iter::once("canopy").chain(args.iter().copied()));
        let cli = parse(&["issues", "--state", "blocked", "--subtree", "web", "--all", "--json"]).unwrap();
        match cli.command {
            super::Command::Issues { list, command: None } => {
                assert_eq!(
                    (list.state.as_deref(), list.subtree.as_deref(), list.all),
                    (Some("blocked"), Some("web"), true)
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(cli.json);
        let cli = parse(&[
            "--json",
            "issues",
            "move",
            "#3",
            "blocked",
            "--note",
            "n",
            "--blocked-by",
            "4",
            "--blocked-by",
            "#5",
        ])
        .unwrap();
        match cli.command {
            super::Command::Issues { command: Some(super::IssuesCommand::Move { issue, blocked_by, .. }), .. } => {
                assert_eq!((issue.as_str(), blocked_by), ("#3", vec!["4".to_owned(), "#5".to_owned()]));
            }
            other => panic!("{other:?}"),
        }
        assert!(parse(&["issues", "--state", "open", "show", "3"]).is_err(), "a list filter on a subcommand");
        assert!(parse(&["issues", "--owner", "a", "--subtree", "b"]).is_err());
        assert!(parse(&["issues", "budget", "3"]).is_err(), "--usd or --clear");
        assert!(parse(&["issues", "budget", "3", "--usd", "5", "--clear"]).is_err());
        assert!(parse(&["issues", "--limit", "0"]).is_err());
        assert!(parse(&["issues", "close", "3"]).is_err(), "a close takes a resolution");
    }

    /// The benchmark is its own binary (`canopy-bench`), not a command of the shipped one.
    #[test]
    fn there_is_no_bench_command() {
        assert!(!super::cli_commands().iter().any(|c| c == "canopy bench"));
    }
}
