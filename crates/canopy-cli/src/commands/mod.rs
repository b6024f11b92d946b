//! The top-level dispatch: each parsed command goes to its area's file (the same areas as
//! the daemon's and `canopy_proto::api`'s), one function per command that builds the request,
//! calls, prints and picks the exit code.
//!
//! Commands that need no daemon's API run first (`local.rs`, `prompts.rs`'s bundle check,
//! the other top-level files); every other one connects once, here. The helpers the areas
//! share are `call.rs`'s, so no area imports this file.

mod agents;
mod budgets;
mod call;
mod checks;
mod credentials;
mod gate;
mod history;
mod issues;
mod local;
mod merges;
mod messages;
mod prompts;
mod repos;
mod runs;
mod sessions;

use canopy_config::DataDir;
use canopy_proto::api::AgentsBudgetRequest;

use crate::args::{AgentsCommand, BundleCommand, Cli, Command, PromptCommand};
use crate::client::{Client, Follower};
use crate::exit::fail;

/// Runs a parsed command and returns the process exit code.
pub async fn run(cli: Cli) -> u8 {
    // Absolute, because sessions run in other working directories and get paths from it.
    let dir = DataDir::new(std::path::absolute(&cli.dir).unwrap_or_else(|_| cli.dir.clone()));
    let json = cli.json;
    match cli.command {
        Command::Init(args) => local::init(&dir, json, &args).await,
        Command::Daemon(args) => local::daemon(&dir, json, &args).await,
        Command::Up { init, daemon } => local::up(&dir, json, &init, &daemon).await,
        Command::Runner(args) => local::runner(&dir, json, &args).await,
        Command::Mcp(args) => local::mcp(json, &args).await,
        Command::Web(args) => local::web(&dir, json, &args).await,
        Command::NatsConfig => local::nats_config(&dir, json),
        Command::Completions { shell } => crate::completions::script(shell),
        Command::Man => crate::completions::man(),
        Command::Complete { what } => crate::completions::candidates(&dir, what).await,
        Command::Doctor => crate::doctor::run(&dir, json).await,
        Command::Top { interval } => crate::top::run(&dir, interval.max(std::time::Duration::from_millis(100))).await,
        Command::Demo { yes } => crate::demo::run(yes).await,
        Command::Bundle(BundleCommand::Check { bundle, gated }) => prompts::bundle_check(&dir, json, bundle, gated),
        Command::Bundle(BundleCommand::Import { from, bundle }) => crate::import::run(&dir, json, &from, bundle).await,
        // A role's prompt needs only the bundle: without a daemon it renders here.
        Command::Prompt(PromptCommand::Render { agent: None, role: Some(role) })
            if !crate::client::connection_info(&dir).is_ok_and(|i| canopy_sys::alive(i.pid)) =>
        {
            prompts::render_role_here(&dir, json, &role)
        }
        command => match Client::connect(&dir).await {
            Ok(client) => api_command(&dir, client, json, command).await,
            Err(e) => fail(json, &e),
        },
    }
}

/// A command that goes through the daemon's API, handed to its area.
async fn api_command(dir: &DataDir, owned: Client, json: bool, command: Command) -> u8 {
    let client = &owned;
    match command {
        Command::Whoami => agents::whoami(client, json).await,
        Command::Agents(command) => agents_command(client, json, command).await,
        Command::Tree => agents::tree(client, json).await,
        Command::Roster => agents::roster(client, json).await,
        Command::Watch(args) => agents::watch(Follower::new(dir, owned), json, args).await,
        Command::Channels { command } => messages::channels(client, json, command).await,
        Command::Topics { channel, command } => messages::topics(client, json, channel, command).await,
        Command::Board { channel, command } => messages::board(client, json, channel, command).await,
        Command::Post(args) => messages::post(dir, client, json, args).await,
        Command::Read(args) => messages::read(client, json, args).await,
        Command::Tail(args) => messages::tail(Follower::new(dir, owned), json, args).await,
        Command::Status => sessions::status(dir, client, json).await,
        Command::Approve { id } => gate::decide(client, json, id, None).await,
        Command::Deny { id, reason } => gate::decide(client, json, id, Some(reason)).await,
        Command::Requests { state, wait } => gate::requests(client, json, state, wait).await,
        Command::Audit { since } => gate::audit(client, json, since).await,
        Command::Runs { agent, open } => runs::list(client, json, agent, open).await,
        Command::Repos(command) => repos::repos(client, json, command).await,
        Command::Merges { state, command } => merges::merges(client, json, state, command).await,
        Command::Checks { repo, branch, limit, command } => {
            checks::checks(client, json, repo, branch, limit, command).await
        }
        Command::Issues { list, command } => issues::issues(client, json, list, command).await,
        Command::Prompt(command) => prompts::render(client, json, command).await,
        Command::Usage { agent, since, series: false, .. } => history::usage(client, json, agent, since).await,
        Command::Usage { agent, subtree, issue, daily, .. } => {
            history::usage_series(client, json, agent, subtree, issue, daily).await
        }
        Command::Operators(command) => credentials::operators(client, json, command).await,
        Command::Runners { command } => credentials::runners(dir, client, json, command).await,
        Command::Credentials(command) => credentials::credentials(dir, client, json, command).await,
        // Run by `run` before any connection.
        Command::Init(_)
        | Command::Daemon(_)
        | Command::Up { .. }
        | Command::Runner(_)
        | Command::Mcp(_)
        | Command::Completions { .. }
        | Command::Man
        | Command::Complete { .. }
        | Command::Bundle(_)
        | Command::Doctor
        | Command::Top { .. }
        | Command::Web(_)
        | Command::NatsConfig
        | Command::Demo { .. } => 0,
    }
}

/// `canopy agents ...`: the agents area, except sessions and budgets.
async fn agents_command(client: &Client, json: bool, command: AgentsCommand) -> u8 {
    match command {
        AgentsCommand::Create(args) => agents::create(client, json, args).await,
        AgentsCommand::List => agents::list(client, json).await,
        AgentsCommand::Show { handle } => agents::show(client, json, handle).await,
        AgentsCommand::Reparent { handle, parent } => agents::reparent(client, json, handle, parent).await,
        AgentsCommand::Despawn { handle, yes } => agents::despawn(client, json, handle, yes).await,
        AgentsCommand::Start { handle, harness } => sessions::start(client, json, handle, harness).await,
        AgentsCommand::Stop { handle } => sessions::stop(client, json, handle).await,
        AgentsCommand::Interrupt { handle } => sessions::interrupt(client, json, handle).await,
        AgentsCommand::Budget { handle, usd, tokens, period, subtree, clear } => {
            let request = AgentsBudgetRequest { handle, usd, tokens, period, subtree, clear };
            budgets::budget(client, json, request).await
        }
    }
}
