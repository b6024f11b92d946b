//! One function per command: build the request, call, print, pick the exit code.

use std::io::Read;

use canopy_config::{Config, DataDir};
use canopy_core::{ChannelKind, ErrorCode, PostPolicy, Seq};
use canopy_daemon::{DaemonError, DaemonOptions, InitOptions};
use canopy_proto::api::*;
use canopy_proto::{ApiMethod, Subjects, method};
use futures_util::StreamExt;

use crate::args::*;
use crate::client::{CallError, Client, Follower};
use crate::{EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE, output};

/// Runs a parsed command and returns the process exit code.
pub async fn run(cli: Cli) -> u8 {
    // Absolute, because sessions run in other working directories and get paths from it.
    let dir = DataDir::new(std::path::absolute(&cli.dir).unwrap_or_else(|_| cli.dir.clone()));
    let json = cli.json;
    match cli.command {
        Command::Init(args) => init(&dir, json, &args).await,
        Command::Daemon(args) => daemon(&dir, json, &args).await,
        Command::Up { init: init_args, daemon: daemon_args } => {
            if !dir.db().exists() {
                let code = init(&dir, json, &init_args).await;
                if code != 0 {
                    return code;
                }
            }
            daemon(&dir, json, &daemon_args).await
        }
        Command::Runner(args) => runner(&dir, json, &args).await,
        Command::Mcp(args) => mcp(json, &args).await,
        Command::Bench { quick, large, check, only } => bench(json, quick, large, check, &only).await,
        Command::Completions { shell } => crate::completions::script(shell),
        Command::Man => crate::completions::man(),
        Command::Complete { what } => crate::completions::candidates(&dir, what).await,
        Command::Doctor => crate::doctor::run(&dir, json).await,
        Command::Web { no_open } => web(&dir, json, no_open).await,
        Command::NatsConfig => nats_config(&dir, json),
        Command::Demo { yes } => crate::demo::run(yes).await,
        Command::Bundle(BundleCommand::Check { bundle, gated }) => bundle_check(&dir, json, bundle, gated),
        Command::Bundle(BundleCommand::Import { from, bundle }) => crate::import::run(&dir, json, &from, bundle).await,
        // A role's prompt needs only the bundle: without a daemon it renders here.
        Command::Prompt(PromptCommand::Render { agent: None, role: Some(role) })
            if !crate::client::connection_info(&dir).is_ok_and(|i| canopy_sys::alive(i.pid)) =>
        {
            render_role_here(&dir, json, &role)
        }
        command => {
            // Nothing below starts a child or writes a pipe of its own: a closed stdout
            // (`| head -1`) ends the process quietly, as for any Unix tool.
            canopy_sys::default_sigpipe();
            match Client::connect(&dir).await {
                Ok(client) => api_command(&dir, client, json, command).await,
                Err(e) => fail(json, &e),
            }
        }
    }
}

async fn init(dir: &DataDir, json: bool, args: &InitArgs) -> u8 {
    let operator = match &args.operator {
        Some(operator) => operator.clone(),
        None => default_operator(),
    };
    let options = InitOptions {
        mission: args.mission.clone(),
        operator,
        name: args.name.clone(),
        check_script: canopy_harness::scripted::check_script,
    };
    match canopy_daemon::init(dir, &options).await {
        Ok(report) if json => {
            output::json(&report);
            0
        }
        Ok(report) => {
            println!(
                "initialised workspace {} ({}) in {}",
                report.workspace.name, report.workspace.id, report.data_dir
            );
            println!("  operator {} (token in {}, mode 0600)", report.operator, report.token_file);
            println!("  config   {}", report.config_file);
            println!("  channels #announcements, #incidents, #home-supervisor");
            println!("next: canopy daemon --dir {}", report.data_dir);
            0
        }
        Err(e) => fail(json, &CallError::Refused((&e).into())),
    }
}

/// The operator handle when `--operator` is absent: `$USER` (or `$LOGNAME`) folded into
/// the handle grammar, or `admin` when neither gives a usable handle.
fn default_operator() -> String {
    let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_default();
    let folded: String = user
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() { c } else { '-' })
        .collect();
    let folded = folded.trim_matches('-').to_owned();
    match canopy_core::Handle::parse(&folded) {
        Ok(handle) => handle.to_string(),
        Err(_) => "admin".to_owned(),
    }
}

/// `canopy daemon`: the composition root. Checks what the daemon cannot (the sandbox grants,
/// which are the harness layer's rules), then runs the daemon with the embedded runner and
/// the scripted harness's script check.
async fn daemon(dir: &DataDir, json: bool, args: &DaemonArgs) -> u8 {
    let checked = Config::load(&dir.config()).and_then(|config| {
        canopy_runner::wiring::check_grants(&config, &dir.config(), dir.root())?;
        canopy_runner::wiring::warn_if_unconfined(&config);
        Ok(config)
    });
    let ran = match checked {
        Ok(config) => {
            let options = DaemonOptions {
                dir: dir.clone(),
                git: canopy_runner::wiring::git(&config, dir.root()),
                config,
                nats_url: args.nats_url.clone(),
                embedded: Some(Box::new(canopy_runner::wiring::embedded)),
                web: Some(Box::new(canopy_web::start)),
                client: None,
                check_script: canopy_harness::scripted::check_script,
            };
            canopy_daemon::run(options, shutdown_signal()).await
        }
        Err(e) => Err(DaemonError::Config(e)),
    };
    match ran {
        Ok(()) => 0,
        Err(e) => {
            let code = match &e {
                DaemonError::Config(_) | DaemonError::NoWorkspace { .. } | DaemonError::Locked { .. } => EXIT_USAGE,
                _ => EXIT_UNAVAILABLE,
            };
            if json {
                output::json(&serde_json::json!({ "error": { "code": "daemon", "message": e.to_string() } }));
            } else {
                eprintln!("error: {e}");
            }
            code
        }
    }
}

/// Resolves on the first SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
        (Ok(mut int), Ok(mut term)) => {
            tokio::select! {
                _ = int.recv() => tracing::info!("SIGINT received"),
                _ = term.recv() => tracing::info!("SIGTERM received"),
            }
        }
        _ => {
            tracing::error!("cannot install signal handlers; stop the daemon with SIGKILL");
            std::future::pending::<()>().await;
        }
    }
}

async fn api_command(dir: &DataDir, owned: Client, json: bool, command: Command) -> u8 {
    let client = &owned;
    let result = match command {
        Command::Whoami => {
            waiting_banner(client, json).await;
            call::<method::Whoami>(client, json, &WhoamiRequest {}, |r: &WhoamiResponse| {
                println!(
                    "{} ({}) in workspace {} ({}), daemon {}",
                    r.account.handle, r.account.kind, r.workspace.name, r.workspace.id, r.version
                );
            })
            .await
        }
        Command::Agents(AgentsCommand::Create {
            handle,
            name,
            role,
            parent,
            charter,
            harness,
            script,
            persona,
            repo,
        }) => {
            let script = match script.map(|path| read_script(&path)).transpose() {
                Ok(script) => script,
                Err(e) => return fail(json, &e),
            };
            let request = AgentsCreateRequest { handle, name, role, parent, charter, harness, script, persona, repo };
            call::<method::AgentsCreate>(client, json, &request, output::account).await
        }
        Command::Agents(AgentsCommand::Start { handle }) => {
            let request = AgentsStartStopRequest { handle };
            call::<method::AgentsStart>(client, json, &request, desired("run: a session starts")).await
        }
        Command::Agents(AgentsCommand::Stop { handle }) => {
            let request = AgentsStartStopRequest { handle };
            call::<method::AgentsStop>(client, json, &request, desired("stop: its session ends")).await
        }
        Command::Agents(AgentsCommand::Budget { handle, usd, tokens, period, subtree, clear }) => {
            let request = AgentsBudgetRequest { handle, usd, tokens, period, subtree, clear };
            call::<method::AgentsBudget>(client, json, &request, output::budget_change).await
        }
        Command::Agents(AgentsCommand::Interrupt { handle }) => {
            call::<method::AgentsInterrupt>(
                client,
                json,
                &AgentsInterruptRequest { handle },
                |r: &AgentsInterruptResponse| match (&r.turn_id, &r.reason) {
                    (Some(turn), _) if r.interrupted => {
                        println!("interrupted {} turn {turn} (session #{} stays up)", r.agent, r.incarnation)
                    }
                    (_, reason) => println!(
                        "{}: nothing to interrupt ({})",
                        r.agent,
                        reason.as_deref().unwrap_or("no turn is running")
                    ),
                },
            )
            .await
        }
        Command::Agents(AgentsCommand::Despawn { handle, yes }) => {
            if !yes && !confirm_despawn(client, &handle).await {
                eprintln!("not despawned");
                return crate::EXIT_REFUSED;
            }
            call::<method::AgentsDespawn>(
                client,
                json,
                &AgentsDespawnRequest { handle },
                |r: &AgentsDespawnResponse| println!("despawned {}", r.despawned.join(", ")),
            )
            .await
        }
        Command::Approve { id } => {
            let request = SpawnDecideRequest { id, approve: true, reason: None };
            call::<method::SpawnDecide>(client, json, &request, output::spawn_request).await
        }
        Command::Deny { id, reason } => {
            let request = SpawnDecideRequest { id, approve: false, reason: Some(reason) };
            call::<method::SpawnDecide>(client, json, &request, output::spawn_request).await
        }
        Command::Repos(ReposCommand::Add { name, source, base, check }) => {
            // A relative path is the caller's, not the daemon's.
            let source = match std::path::Path::new(&source).exists() {
                true => std::path::absolute(&source).map(|p| p.display().to_string()).unwrap_or(source),
                false => source,
            };
            let request = ReposAddRequest { name, source, base: Some(base), check };
            call::<method::ReposAdd>(client, json, &request, output::repo).await
        }
        Command::Repos(ReposCommand::List) => {
            call::<method::ReposList>(client, json, &ReposListRequest {}, output::repos).await
        }
        Command::Repos(ReposCommand::Gc { dry_run }) => {
            call::<method::ReposGc>(client, json, &ReposGcRequest { dry_run }, output::gc).await
        }
        Command::Merges { state, command: None } => {
            let state = match state.as_deref().map(|s| canopy_core::MergeState::parse(s).ok_or(s)) {
                None => None,
                Some(Ok(state)) => Some(state),
                Some(Err(bad)) => {
                    let message = format!("unknown state {bad:?}; one of {}", canopy_core::MergeState::expected());
                    let wire = canopy_proto::WireError {
                        code: ErrorCode::InvalidArgument,
                        message,
                        field: Some("state".into()),
                    };
                    return fail(json, &CallError::Refused(wire));
                }
            };
            call::<method::MergesList>(client, json, &MergesListRequest { state }, output::merges).await
        }
        Command::Merges { command: Some(MergesCommand::Approve { id }), .. } => {
            return approve_merge(client, json, id).await;
        }
        Command::Merges { command: Some(MergesCommand::Deny { id, reason }), .. } => {
            let request = MergesDecideRequest { id, approve: false, reason: Some(reason) };
            call::<method::MergesDecide>(client, json, &request, output::merge).await
        }
        Command::Requests { state, wait } => {
            let state = match state.as_deref().map(|s| canopy_core::SpawnState::parse(s).ok_or(s)) {
                None => None,
                Some(Ok(state)) => Some(state),
                Some(Err(bad)) => {
                    let message = format!("unknown state {bad:?}; one of {}", canopy_core::SpawnState::expected());
                    return fail_usage(json, "state", &message);
                }
            };
            match wait {
                true => wait_for_request(client, json).await,
                false => {
                    call::<method::SpawnList>(client, json, &SpawnListRequest { state }, |r: &SpawnListResponse| {
                        r.requests.iter().for_each(output::spawn_request)
                    })
                    .await
                }
            }
        }
        Command::Audit { since } => {
            let request = AuditListRequest { since_secs: since.map(|d| d.as_secs()) };
            call::<method::AuditList>(client, json, &request, |r: &AuditListResponse| {
                for e in &r.entries {
                    let actor = e.actor.as_ref().map_or("canopy".to_owned(), ToString::to_string);
                    println!("{} {actor:12} {:24} {} {}", output::time(&e.at), e.action, e.target, e.detail);
                }
            })
            .await
        }
        Command::Prompt(PromptCommand::Render { agent, role }) => {
            call::<method::PromptsRender>(client, json, &PromptsRenderRequest { agent, role }, print_render).await
        }
        Command::Runs { agent, open } => {
            call::<method::RunsList>(
                client,
                json,
                &RunsListRequest { agent: Some(agent), open },
                |r: &RunsListResponse| {
                    for run in &r.runs {
                        let ended = run.ended_at.as_deref().unwrap_or("-");
                        println!(
                            "{:8} {:10} {:14} started {} ended {ended}",
                            run.handle, run.status, run.definition, run.started_at
                        );
                    }
                },
            )
            .await
        }
        Command::Usage { agent, since } => {
            let request = UsageRequest { agent, since_secs: since.map(|d| d.as_secs()) };
            call::<method::Usage>(client, json, &request, output::usage).await
        }
        Command::Status => status(dir, client, json).await,
        Command::Roster => {
            waiting_banner(client, json).await;
            client.roster().await.map(|roster| match json {
                true => output::json(&roster),
                false => output::roster(&roster.agents),
            })
        }
        Command::Watch(args) => watch(Follower::new(dir, owned), json, args).await,
        Command::Agents(AgentsCommand::List) => client.agents().await.map(|list| match json {
            true => output::json(&list),
            false => output::agents(&list.agents),
        }),
        Command::Agents(AgentsCommand::Show { handle }) => {
            call::<method::AgentsShow>(client, json, &AgentsShowRequest { handle }, |r: &AgentsShowResponse| {
                output::account(&r.account);
                if !r.children.is_empty() {
                    println!("  children {}", r.children.join(", "));
                }
                for s in &r.subscriptions {
                    let mandatory = if s.mandatory { "mandatory" } else { "optional" };
                    println!("  subscribed #{} ({mandatory}, cursor {})", s.channel, s.cursor);
                }
            })
            .await
        }
        Command::Agents(AgentsCommand::Reparent { handle, parent }) => {
            call::<method::AgentsReparent>(client, json, &AgentsReparentRequest { handle, parent }, output::account)
                .await
        }
        Command::Tree => {
            waiting_banner(client, json).await;
            call::<method::Tree>(client, json, &TreeRequest { depth: None }, |r: &TreeResponse| output::tree(&r.root))
                .await
        }
        Command::Channels { command: None | Some(ChannelsCommand::List) } => {
            call::<method::ChannelsList>(client, json, &ChannelsListRequest {}, |r: &ChannelsListResponse| {
                output::channels(&r.channels)
            })
            .await
        }
        Command::Channels { command: Some(ChannelsCommand::Create { name, kind, post_policy, posters, wake }) } => {
            let request = ChannelsCreateRequest {
                name,
                kind: Some(match kind {
                    KindArg::General => ChannelKind::General,
                    KindArg::Broadcast => ChannelKind::Broadcast,
                }),
                post_policy: post_policy.map(|p| match p {
                    PostPolicyArg::Open => PostPolicy::Open,
                    PostPolicyArg::OwnerOnly => PostPolicy::OwnerOnly,
                    PostPolicyArg::Restricted => PostPolicy::Restricted,
                }),
                posters,
                wake: wake.map(|w| match w {
                    WakeArg::Always => canopy_core::WakePolicy::Always,
                    WakeArg::Mentions => canopy_core::WakePolicy::Mentions,
                    WakeArg::Never => canopy_core::WakePolicy::Never,
                }),
            };
            call::<method::ChannelsCreate>(client, json, &request, |c: &canopy_core::Channel| {
                output::channels(std::slice::from_ref(c))
            })
            .await
        }
        Command::Topics { channel, command: None } => {
            call::<method::TopicsList>(client, json, &TopicsListRequest { channel }, |r: &TopicsListResponse| {
                output::topics(&r.topics)
            })
            .await
        }
        Command::Topics { channel, command: Some(TopicsCommand::Rename { topic, to }) } => {
            let request = TopicsRenameRequest { channel, topic: topic.clone(), to: to.clone() };
            call::<method::TopicsRename>(client, json, &request, |_: &Done| println!("renamed {topic:?} to {to:?}"))
                .await
        }
        Command::Topics { channel, command: Some(TopicsCommand::Resolve { topic, reopen }) } => {
            let request = TopicsResolveRequest { channel, topic: topic.clone(), resolved: !reopen };
            let word = if reopen { "reopened" } else { "resolved" };
            call::<method::TopicsResolve>(client, json, &request, |_: &Done| println!("{word} {topic:?}")).await
        }
        Command::Board { channel, command: None } => {
            call::<method::BoardList>(client, json, &BoardListRequest { channel }, output::board).await
        }
        Command::Board { channel, command: Some(BoardCommand::Pin { seq }) } => {
            call::<method::BoardPin>(client, json, &BoardPinRequest { channel, seq }, output::board).await
        }
        Command::Board { channel, command: Some(BoardCommand::Unpin { seq }) } => {
            call::<method::BoardUnpin>(client, json, &BoardPinRequest { channel, seq }, output::board).await
        }
        Command::Post(mut args) => {
            let body = match args.body.take() {
                Some(body) if body != "-" => body,
                _ => match body_from_stdin(dir) {
                    Ok(body) => body,
                    Err(BadBody::NotText(why)) => return fail_usage(json, "body", &why),
                    Err(BadBody::TooLarge(why)) => {
                        let wire = canopy_proto::WireError {
                            code: ErrorCode::LimitExceeded,
                            message: why,
                            field: Some("body".into()),
                        };
                        return fail(json, &CallError::Refused(wire));
                    }
                },
            };
            post(client, json, args, body).await
        }
        Command::Read(args) => {
            let request = ReadRequest {
                channel: args.channel,
                topic: args.topic,
                after: args.after,
                limit: args.limit,
                unread: false,
                newest: !args.from_start && args.after == Seq(0),
            };
            call::<method::MessagesRead>(client, json, &request, output::read).await
        }
        Command::Tail(args) => tail(Follower::new(dir, owned), json, args).await,
        Command::Runners(RunnersCommand::Add { id, out }) => runners_add(client, json, id, out).await,
        Command::Operators(OperatorsCommand::Add { handle, name, out }) => {
            operators_add(client, json, OperatorsAddRequest { handle, name }, out).await
        }
        Command::Operators(OperatorsCommand::List) => {
            call::<method::OperatorsList>(client, json, &OperatorsListRequest {}, |r: &OperatorsListResponse| {
                output::operators(&r.operators)
            })
            .await
        }
        Command::Operators(OperatorsCommand::Revoke { handle }) => {
            let request = OperatorsRevokeRequest { handle };
            call::<method::OperatorsRevoke>(client, json, &request, |a: &canopy_core::Account| {
                println!("revoked operator {}: its token is refused from now on", a.handle)
            })
            .await
        }
        Command::Runners(RunnersCommand::Remove { id }) => {
            let request = RunnersRemoveRequest { id: id.clone() };
            call::<method::RunnersRemove>(client, json, &request, |r: &CredentialsChangedResponse| {
                output::credentials_changed(&format!("revoked runner {id}"), r)
            })
            .await
        }
        Command::Credentials(CredentialsCommand::Rotate) => {
            call::<method::CredentialsRotate>(client, json, &CredentialsRotateRequest {}, |r| {
                output::credentials_changed("rotated every NATS login and runner token", r)
            })
            .await
        }
        Command::Init(_)
        | Command::Daemon(_)
        | Command::Up { .. }
        | Command::Runner(_)
        | Command::Mcp(_)
        | Command::Bench { .. }
        | Command::Completions { .. }
        | Command::Man
        | Command::Complete { .. }
        | Command::Bundle(_)
        | Command::Doctor
        | Command::Web { .. }
        | Command::NatsConfig
        | Command::Demo { .. } => Ok(()),
    };
    match result {
        Ok(()) => 0,
        Err(e) => fail(json, &e),
    }
}

/// Calls a method and prints the response as JSON or through `human`.
/// `canopy merges approve`: approves, then waits while Canopy merges (and checks) it;
/// exits 1 when the merge was refused.
async fn approve_merge(client: &Client, json: bool, id: String) -> u8 {
    let request = MergesDecideRequest { id: id.clone(), approve: true, reason: None };
    let mut request_state = match client.send::<method::MergesDecide>(&request).await {
        Ok(r) => r,
        Err(e) => return fail(json, &e),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3600);
    while request_state.state == canopy_core::MergeState::Merging && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        match client.send::<method::MergesList>(&MergesListRequest { state: None }).await {
            Ok(list) => {
                if let Some(found) = list.merges.into_iter().find(|m| m.id == id) {
                    request_state = found;
                }
            }
            Err(e) => return fail(json, &e),
        }
    }
    if json {
        output::json(&request_state);
    } else {
        output::merge(&request_state);
    }
    match request_state.state {
        canopy_core::MergeState::Merged => 0,
        _ => EXIT_REFUSED,
    }
}

async fn call<M: ApiMethod>(
    client: &Client,
    json: bool,
    request: &M::Request,
    human: impl FnOnce(&M::Response),
) -> Result<(), CallError> {
    let response = client.send::<M>(request).await?;
    if json {
        output::json(&response);
    } else {
        human(&response);
    }
    Ok(())
}

/// A message body from stdin that cannot be sent: past the limit (refused, exit 1, as the
/// daemon would), or not text (a usage error, exit 64).
enum BadBody {
    TooLarge(String),
    NotText(String),
}

/// The body from stdin, read no further than the limit `canopy.toml` sets, so a body past it
/// is refused by the daemon's rule and code rather than lost in transport.
fn body_from_stdin(dir: &DataDir) -> Result<String, BadBody> {
    let max = Config::load(&dir.config()).unwrap_or_default().limits.max_body_bytes;
    let mut bytes = Vec::new();
    std::io::stdin()
        .take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| BadBody::NotText(format!("reading the message body from stdin: {e}")))?;
    if bytes.len() > max {
        return Err(BadBody::TooLarge(format!(
            "body is more than {max} bytes; the limit is {max} (`[limits] max_body_bytes`)"
        )));
    }
    let body = String::from_utf8(bytes).map_err(|e| {
        BadBody::NotText(format!("the body on stdin is not UTF-8 text (at byte {})", e.utf8_error().valid_up_to()))
    })?;
    // `echo text |` and editors end the text with a newline that is not the message's.
    let trimmed = body.strip_suffix('\n').map(|b| b.strip_suffix('\r').unwrap_or(b));
    Ok(trimmed.map(str::to_owned).unwrap_or(body))
}

async fn post(client: &Client, json: bool, args: PostArgs, body: String) -> Result<(), CallError> {
    let request = PostRequest {
        channel: args.channel,
        topic: args.topic,
        body,
        create_topic: args.create_topic,
        idempotency_key: args.idempotency_key,
        ack_only: args.ack_only,
        wake: args.wake,
    };
    call::<method::MessagesPost>(client, json, &request, |r: &PostResponse| {
        let retry = if r.duplicate { " (already posted with this idempotency key)" } else { "" };
        println!("posted seq {} to #{} > {}{retry}", r.message.seq, r.message.channel, r.message.topic);
        output::outcomes(r);
    })
    .await
}

/// Follows new messages: event doorbells, resync from the store on reconnect and on a timer;
/// after a daemon restart, from the daemon's new server (`Follower`), from the same cursor.
async fn tail(mut follower: Follower, json: bool, args: TailArgs) -> Result<(), CallError> {
    let mut last = match args.after {
        Some(after) => after,
        None => {
            let request = ChannelsListRequest {};
            let channels: ChannelsListResponse = follower.client.send::<method::ChannelsList>(&request).await?;
            channels
                .channels
                .iter()
                .filter(|c| args.channel.as_deref().is_none_or(|name| c.name.as_str() == name.trim_start_matches('#')))
                .map(|c| c.last_seq)
                .max()
                .unwrap_or_default()
        }
    };
    if args.after.is_none() && args.last > 0 {
        recent(&follower.client, json, &args, last).await?;
    }
    let mut told = false;
    loop {
        let lost = tail_connection(&mut follower, json, &args, &mut last, &mut told).await?;
        let mut timer = tokio::time::interval(args.resync);
        loop {
            timer.tick().await;
            if follower.recover(&lost).await {
                break;
            }
        }
    }
}

/// Prints the last `args.last` messages up to `head`, so `tail` does not open on a blank
/// screen: one channel's newest page, or (every channel) the newest of the sequences just
/// before `head`, which an operator reads all of.
async fn recent(client: &Client, json: bool, args: &TailArgs, head: Seq) -> Result<(), CallError> {
    let n = args.last.min(100);
    let messages: Vec<canopy_core::Message> = match &args.channel {
        Some(channel) => {
            let request = ReadRequest {
                channel: channel.trim_start_matches('#').to_owned(),
                topic: None,
                after: Seq(0),
                limit: Some(n),
                unread: false,
                newest: true,
            };
            client.send::<method::MessagesRead>(&request).await?.groups.into_iter().flat_map(|g| g.messages).collect()
        }
        None => {
            let request =
                SyncRequest { after: Seq(head.get().saturating_sub(u64::from(n))), channel: None, limit: None };
            client.send::<method::MessagesSync>(&request).await?.messages
        }
    };
    let mut messages: Vec<_> = messages.into_iter().filter(|m| m.seq <= head).collect();
    messages.sort_by_key(|m| m.seq);
    for message in messages.iter().skip(messages.len().saturating_sub(n as usize)) {
        match json {
            true => output::json_line(message),
            false => println!("{}", output::message_line(message, true)),
        }
    }
    Ok(())
}

/// Follows messages over one connection until a call finds the daemon unreachable; returns why.
async fn tail_connection(
    follower: &mut Follower,
    json: bool,
    args: &TailArgs,
    last: &mut Seq,
    told: &mut bool,
) -> Result<String, CallError> {
    let client = &follower.client.clone();
    let subject = match &args.channel {
        Some(channel) => client.api.subjects.message_event(channel.trim_start_matches('#')),
        None => client.api.subjects.message_events_all(),
    };
    let mut connection = client.api.bus.connection_events();
    let mut events = client.api.bus.subscribe(&subject).await.map_err(|e| CallError::Unreachable(e.to_string()))?;
    let mut timer = tokio::time::interval(args.resync);
    let channel = args.channel.as_deref();
    // Catch up once now: anything committed before subscribing (or while the daemon was away).
    let mut result = catch_up(client, json, channel, last).await;
    if result.is_ok() {
        follower.answered();
    }
    if !std::mem::replace(told, true) {
        // On stderr, so `--json` output stays one message per line; scripts can wait for it.
        eprintln!("following messages after {last} (Ctrl-C to stop)");
    }
    loop {
        match result {
            Err(CallError::Unreachable(reason)) => return Ok(reason),
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        result = tokio::select! {
            event = events.next() => {
                let Some(event) = event else { return Ok("the event subscription ended".into()) };
                let seq = serde_json::from_slice::<MessageEvent>(&event.payload).map(|e| e.message.seq).unwrap_or(Seq(u64::MAX));
                if seq > *last { catch_up(client, json, channel, last).await } else { Ok(()) }
            }
            change = connection.recv() => {
                if matches!(change, Ok(canopy_bus::ConnectionEvent::Connected)) {
                    tracing::info!("reconnected to NATS; resyncing from #{last}");
                    catch_up(client, json, channel, last).await
                } else {
                    Ok(())
                }
            }
            _ = timer.tick() => catch_up(client, json, channel, last).await,
        };
    }
}

/// Prints every message after `last` from the store, moving `last`.
async fn catch_up(client: &Client, json: bool, channel: Option<&str>, last: &mut Seq) -> Result<(), CallError> {
    loop {
        let request = SyncRequest { after: *last, channel: channel.map(str::to_owned), limit: None };
        let page: SyncResponse = client.send::<method::MessagesSync>(&request).await?;
        for message in &page.messages {
            if json {
                output::json_line(message);
            } else {
                println!("{}", output::message_line(message, true));
            }
        }
        *last = page.next_after.max(*last);
        if !page.more {
            return Ok(());
        }
    }
}

/// `canopy status`: everything an operator checks first, read in one go.
async fn status(dir: &DataDir, client: &Client, json: bool) -> Result<(), CallError> {
    let daemon = crate::client::connection_info(dir)?;
    let whoami: WhoamiResponse = client.send::<method::Whoami>(&WhoamiRequest {}).await?;
    let roster = client.roster().await?;
    let pending = SpawnListRequest { state: Some(canopy_core::SpawnState::Pending) };
    let spawns = client.send::<method::SpawnList>(&pending).await?.requests;
    let merges = MergesListRequest { state: Some(canopy_core::MergeState::Pending) };
    let merges = client.send::<method::MergesList>(&merges).await?.merges;
    let incidents = ReadRequest {
        channel: "incidents".into(),
        topic: None,
        after: Seq(0),
        limit: Some(3),
        unread: false,
        newest: true,
    };
    let incidents: Vec<canopy_core::Message> =
        client.send::<method::MessagesRead>(&incidents).await?.groups.into_iter().flat_map(|g| g.messages).collect();
    let status = output::Status {
        workspace: whoami.workspace.name.clone(),
        daemon_pid: daemon.pid,
        daemon_version: whoami.version.clone(),
        nats_url: daemon.nats_url.clone(),
        agents: roster.agents,
        spawns,
        merges,
        incidents,
    };
    match json {
        true => output::json(&status),
        false => output::status(&status),
    }
    Ok(())
}

/// On a terminal, asks before despawning a subtree (it cannot be undone); elsewhere (a
/// script) the command goes ahead, as with `--yes`.
async fn confirm_despawn(client: &Client, handle: &str) -> bool {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return true;
    }
    let request = AgentsShowRequest { handle: handle.to_owned() };
    let below = match client.send::<method::AgentsShow>(&request).await {
        Ok(shown) if !shown.children.is_empty() => format!(" and its reports ({})", shown.children.join(", ")),
        _ => String::new(),
    };
    eprint!("despawn {handle}{below}? Their sessions stop; history stays. [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    matches!(answer.trim(), "y" | "Y" | "yes")
}

/// `canopy prompt render --role` with no daemon running: the bundle and `canopy.toml` are
/// local; the workspace's name and mission are examples (said on stderr).
fn render_role_here(dir: &DataDir, json: bool, role: &str) -> u8 {
    let config = match Config::load(&dir.config()) {
        Ok(config) => config,
        Err(_) if !dir.config().exists() => Config::default(),
        Err(e) => return fail_usage(json, &e.key, &e.message),
    };
    let prompts = match canopy_daemon::prompts::Prompts::open(&config, &dir.config(), dir.root()) {
        Ok(prompts) => prompts,
        Err(e) => return fail_usage(json, &e.key, &e.message),
    };
    let roles = match canopy_daemon::roles::RoleDefaults::resolve(
        &config,
        &dir.config(),
        dir.root(),
        canopy_harness::scripted::check_script,
    ) {
        Ok(roles) => roles,
        Err(e) => return fail_usage(json, &e.key, &e.message),
    };
    let workspace = canopy_core::Workspace {
        id: "example".into(),
        name: "example workspace".into(),
        mission: "(the workspace's mission)".into(),
        created_at: String::new(),
    };
    let rendered =
        canopy_daemon::prompt_api::render_role(&config, dir.root(), &prompts.refreshed(), &roles, &workspace, role);
    match rendered {
        Ok(r) if json => {
            output::json(&r);
            0
        }
        Ok(r) => {
            print_render(&r);
            eprintln!("-- rendered without a daemon: the workspace's name and mission are examples");
            0
        }
        Err(e) => fail(json, &CallError::Refused(canopy_proto::WireError::from(&e))),
    }
}

fn print_render(r: &PromptsRenderResponse) {
    print!("{}", r.text);
    eprintln!(
        "-- {} {} ({} mode, {}), sections: {}; sha256 {}",
        r.role,
        r.definition.as_deref().map(|d| format!("[{d}]")).unwrap_or_default(),
        r.mode,
        r.delivery,
        r.sections.join(", "),
        r.hash
    );
    if let Some(s) = &r.session {
        let same = if s.hash == r.hash { "same" } else { "differs: the bundle or facts changed since" };
        eprintln!("-- session {} started with sha256 {} ({same})", s.incarnation, s.hash);
    }
}

/// What `agents start` and `stop` say: the change takes effect at the runner's next sync.
fn desired(what: &'static str) -> impl FnOnce(&canopy_core::RosterEntry) {
    move |e| println!("{} will {what} at its runner's next sync (it was {})", e.handle, e.presence)
}

/// Opens a human listing with what waits for the operator: pending spawn and merge requests.
async fn waiting_banner(client: &Client, json: bool) {
    if json {
        return;
    }
    let pending = SpawnListRequest { state: Some(canopy_core::SpawnState::Pending) };
    let spawns = client.send::<method::SpawnList>(&pending).await.map(|r| r.requests).unwrap_or_default();
    let merges = MergesListRequest { state: Some(canopy_core::MergeState::Pending) };
    let merges = client.send::<method::MergesList>(&merges).await.map(|r| r.merges).unwrap_or_default();
    if let Some(line) = output::waiting(&spawns, &merges) {
        println!("{line}");
    }
}

/// `canopy requests --wait`: blocks until a spawn request that was not pending at the start
/// is, and prints it (for scripts and notifications).
async fn wait_for_request(client: &Client, json: bool) -> Result<(), CallError> {
    let pending = SpawnListRequest { state: Some(canopy_core::SpawnState::Pending) };
    let seen: std::collections::HashSet<String> =
        client.send::<method::SpawnList>(&pending).await?.requests.into_iter().map(|r| r.id).collect();
    // On stderr in both modes: `--json` output stays the request alone; scripts can wait for it.
    eprintln!("waiting for a new spawn request ({} pending already; Ctrl-C to stop)", seen.len());
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    loop {
        tick.tick().await;
        let now = client.send::<method::SpawnList>(&pending).await?.requests;
        let fresh: Vec<_> = now.into_iter().filter(|r| !seen.contains(&r.id)).collect();
        if !fresh.is_empty() {
            for request in &fresh {
                match json {
                    true => output::json_line(request),
                    false => output::spawn_request(request),
                }
            }
            return Ok(());
        }
    }
}

/// Reads a script file for `agents create --script`; the daemon validates it.
fn read_script(path: &std::path::Path) -> Result<ScriptSource, CallError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CallError::Refused(canopy_proto::WireError {
            code: ErrorCode::InvalidArgument,
            message: format!("reading {}: {e}", path.display()),
            field: Some("script".into()),
        })
    })?;
    Ok(ScriptSource { name: path.display().to_string(), text })
}

/// Follows an agent's activity: stored items first, then doorbells, resyncing on reconnect
/// and on a timer; after a daemon restart, from the daemon's new server (`Follower`).
async fn watch(mut follower: Follower, json: bool, args: WatchArgs) -> Result<(), CallError> {
    let first = ActivityReadRequest { agent: args.handle.clone(), after: 0, limit: None, tail: Some(args.tail) };
    let page: ActivityReadResponse = follower.client.send::<method::ActivityRead>(&first).await?;
    for item in &page.items {
        output::activity(item, &args.handle, json);
    }
    let mut last = page.next_after;
    if args.no_follow {
        return Ok(());
    }
    loop {
        let lost = watch_connection(&mut follower, json, &args, &mut last).await?;
        let mut timer = tokio::time::interval(args.resync);
        loop {
            timer.tick().await;
            if follower.recover(&lost).await {
                break;
            }
        }
    }
}

/// Follows activity over one connection until a call finds the daemon unreachable; returns why.
async fn watch_connection(
    follower: &mut Follower,
    json: bool,
    args: &WatchArgs,
    last: &mut u64,
) -> Result<String, CallError> {
    let client = &follower.client.clone();
    let subject = client.api.subjects.activity_event(&args.handle);
    let mut connection = client.api.bus.connection_events();
    let mut events = client.api.bus.subscribe(&subject).await.map_err(|e| CallError::Unreachable(e.to_string()))?;
    let mut timer = tokio::time::interval(args.resync);
    let mut due = true;
    loop {
        while due {
            let request = ActivityReadRequest { agent: args.handle.clone(), after: *last, limit: None, tail: None };
            let page: ActivityReadResponse = match client.send::<method::ActivityRead>(&request).await {
                Ok(page) => page,
                Err(CallError::Unreachable(reason)) => return Ok(reason),
                Err(e) => return Err(e),
            };
            follower.answered();
            for item in &page.items {
                output::activity(item, &args.handle, json);
            }
            *last = page.next_after.max(*last);
            due = page.more;
        }
        due = tokio::select! {
            event = events.next() => match event {
                Some(event) => serde_json::from_slice::<ActivityEvent>(&event.payload).map_or(true, |e| e.item.id > *last),
                None => return Ok("the event subscription ended".into()),
            },
            change = connection.recv() => matches!(change, Ok(canopy_bus::ConnectionEvent::Connected)),
            _ = timer.tick() => true,
        };
    }
}

/// `canopy web`: asks the daemon's console for a one-time login link with the operator's
/// token (sent in a header, never put in the link), prints it, and opens it in a browser when
/// this session has one (`$BROWSER`, or `xdg-open` under a display) unless `--no-open`.
async fn web(dir: &DataDir, json: bool, no_open: bool) -> u8 {
    let info = match crate::client::connection_info(dir) {
        Ok(info) => info,
        Err(e) => return fail(json, &e),
    };
    let Some(base) = info.web_url else {
        let why = "the daemon serves no console: [web] enabled is false in canopy.toml, or the console could not \
                   bind its address (the daemon's log says why)";
        return fail(json, &CallError::Unreachable(why.into()));
    };
    let token = match crate::client::read_token(&dir.operator_token()) {
        Ok(token) => token,
        Err(e) => return fail(json, &e),
    };
    let link = match canopy_web::request_link(&base, &token).await {
        Ok(link) => link,
        Err(canopy_web::LinkError::Refused(message)) => {
            let error = canopy_proto::WireError { code: canopy_core::ErrorCode::Forbidden, message, field: None };
            return fail(json, &CallError::Refused(error));
        }
        Err(e) => return fail(json, &CallError::Unreachable(e.to_string())),
    };
    let opened = !no_open && open_browser(&link);
    if json {
        output::json(&serde_json::json!({ "url": base, "link": link, "opened": opened }));
    } else {
        println!("{link}");
        match opened {
            true => eprintln!("opened in your browser; the link works once"),
            false => eprintln!("open it in a browser on this machine; it works once, for a short time"),
        }
    }
    0
}

/// Starts a browser on `link`, detached; false when this session has none.
fn open_browser(link: &str) -> bool {
    let program = match std::env::var("BROWSER") {
        Ok(browser) if !browser.trim().is_empty() => browser,
        _ if std::env::var_os("DISPLAY").is_some() || std::env::var_os("WAYLAND_DISPLAY").is_some() => {
            "xdg-open".to_owned()
        }
        _ => return false,
    };
    std::process::Command::new(program)
        .arg(link)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .is_ok()
}

/// Runs a standalone runner until SIGINT/SIGTERM.
async fn runner(dir: &DataDir, json: bool, args: &RunnerArgs) -> u8 {
    // A configuration it cannot use is a usage error (64) naming the key, as for the daemon.
    let checked = Config::load(&dir.config())
        .and_then(|config| canopy_runner::wiring::check_grants(&config, &dir.config(), dir.root()).map(|()| config));
    let config = match checked {
        Ok(config) => config,
        Err(e) => return fail_usage(json, &e.key, &e.to_string()),
    };
    canopy_runner::wiring::warn_if_unconfined(&config);
    if args.id.as_deref() == Some(canopy_config::EMBEDDED_RUNNER) {
        let why = "`embedded` is the runner inside the daemon; give this one its own: `canopy runners add ID`";
        return fail_usage(json, "id", why);
    }
    let file = match (&args.credentials, &args.id) {
        (Some(file), _) => file.clone(),
        (None, Some(id)) => dir.runner_credential(id),
        (None, None) => {
            let why = "a runner needs its credential: --id ID (made by `canopy runners add ID`) or --credentials FILE";
            return fail_usage(json, "id", why);
        }
    };
    let started = async {
        let credential: canopy_config::RunnerCredential = canopy_config::credentials::read(&file)
            .map_err(|e| CallError::Unreachable(format!("reading the runner's credential: {e}")))?;
        // Another machine has no daemon.json: the credential names the workspace, --nats-url the server.
        let url = match (&args.nats_url, crate::client::connection_info(dir)) {
            (Some(url), _) => url.clone(),
            (None, Ok(info)) => info.nats_url,
            (None, Err(e)) => return Err(e),
        };
        let subjects = Subjects::new(&credential.workspace_id);
        let id = canopy_core::RunnerId::parse(&credential.runner_id)
            .map_err(|e| CallError::Unreachable(format!("{}: runner id: {e}", file.display())))?;
        let login_file = file.clone();
        let login = canopy_bus::Login::reading(
            move || canopy_config::credentials::read_login(&login_file),
            Some(subjects.inbox(canopy_proto::Party::Runner(&id))),
        );
        let api = crate::client::connect(dir, &url, subjects, &login, "canopy-runner").await?;
        let options = canopy_runner::wiring::options(dir, &config, api, &credential, &file)
            .map_err(|e| CallError::Unreachable(format!("preparing the runner: {e}")))?;
        canopy_runner::spawn(options).await.map_err(|e| CallError::Unreachable(e.to_string()))
    };
    let handle = match started.await {
        Ok(handle) => handle,
        Err(e) => return fail(json, &e),
    };
    if json {
        output::json_line(&serde_json::json!({ "runner": handle.id, "mcp_url": handle.mcp_url }));
    } else {
        eprintln!("runner {} serving tools at {}", handle.id, handle.mcp_url);
    }
    shutdown_signal().await;
    // Its sessions get their stop grace; what it would still tell the daemon (session ends)
    // waits no longer when the daemon or NATS is gone: the daemon ends them on its own timer.
    let bound = config.runner.stop_grace + std::time::Duration::from_secs(2);
    if tokio::time::timeout(bound, handle.shutdown()).await.is_err() {
        tracing::warn!(?bound, "the runner did not finish stopping in time (the daemon is unreachable?); exiting");
    }
    0
}

/// `canopy operators add`: the token goes to `--out` (0600), or is printed once.
async fn operators_add(
    client: &Client,
    json: bool,
    request: OperatorsAddRequest,
    out: Option<std::path::PathBuf>,
) -> Result<(), CallError> {
    let response = client.send::<method::OperatorsAdd>(&request).await?;
    if let Some(out) = &out {
        write_secret(out, &format!("{}\n", response.token))?;
    }
    if json {
        output::json(&response);
    } else {
        let handle = &response.account.handle;
        match &out {
            Some(out) => println!("operator {handle}: token written to {} (0600)", out.display()),
            None => println!("operator {handle}: token {} (shown once; keep it 0600)", response.token),
        }
    }
    Ok(())
}

/// `canopy runners add`: the daemon writes the credential; `--out` writes a copy to carry.
async fn runners_add(
    client: &Client,
    json: bool,
    id: String,
    out: Option<std::path::PathBuf>,
) -> Result<(), CallError> {
    let response = client.send::<method::RunnersAdd>(&RunnersAddRequest { id }).await?;
    if let Some(out) = &out {
        write_credential(out, &response.credential)?;
    }
    if json {
        output::json(&response);
    } else {
        output::runner_added(&response, out.as_deref());
    }
    Ok(())
}

/// Writes a runner credential where the operator asked, mode 0600.
fn write_credential(path: &std::path::Path, wire: &RunnerCredentialWire) -> Result<(), CallError> {
    let credential = canopy_config::RunnerCredential {
        workspace_id: wire.workspace_id.clone(),
        runner_id: wire.runner_id.to_string(),
        nats: canopy_config::NatsLogin { user: wire.nats_user.clone(), password: wire.nats_password.clone() },
        token: wire.token.clone(),
    };
    write_secret(path, &canopy_config::credentials::to_text(&credential))
}

/// Writes a secret where the operator asked, mode 0600.
fn write_secret(path: &std::path::Path, text: &str) -> Result<(), CallError> {
    canopy_sys::write_private(path, text.as_bytes())
        .map_err(|e| CallError::Unreachable(format!("writing {}: {e}", path.display())))
}

/// bcrypt's cheapest cost: the passwords are 256 random bits, so no cost makes guessing them
/// any harder, and the server pays it at every connect.
const BCRYPT_COST: u32 = 4;

/// Prints the `authorization` block for an external nats-server: every login of this
/// workspace with its permissions, passwords as bcrypt hashes. Needs no daemon.
fn nats_config(dir: &DataDir, json: bool) -> u8 {
    let built = (|| {
        let credentials = canopy_daemon::credentials::load(dir).map_err(|e| e.to_string())?;
        let workspace = credentials
            .runners
            .first()
            .map(|r| r.workspace_id.clone())
            .ok_or_else(|| format!("no runner credential in {}: run `canopy init` first", dir.root().display()))?;
        let mut users = credentials.users(&Subjects::new(&workspace));
        for user in &mut users {
            user.password = bcrypt::hash(&user.password, BCRYPT_COST).map_err(|e| e.to_string())?;
        }
        Ok::<_, String>((workspace, canopy_bus::render_authorization(&users)))
    })();
    match built {
        Ok((workspace, block)) if json => {
            output::json(&serde_json::json!({ "workspace_id": workspace, "authorization": block }));
            0
        }
        Ok((workspace, block)) => {
            println!("# NATS logins of Canopy workspace {workspace}: put this in the nats-server configuration,");
            println!("# reload the server, then run `canopy daemon --nats-url URL`. Re-run after");
            println!("# `canopy runners add|remove` and `canopy credentials rotate`.");
            print!("{block}");
            0
        }
        Err(e) => fail(json, &CallError::Unreachable(e)),
    }
}

/// Runs the benchmark and prints each figure beside its baseline.
async fn bench(json: bool, quick: bool, large: bool, check: bool, only: &[String]) -> u8 {
    let only = match canopy_bench::Parts::parse(only.iter().map(String::as_str)) {
        Ok(only) => only,
        Err(e) => return fail_usage(json, "only", &e),
    };
    match canopy_bench::run(canopy_bench::Options { quick, large, only }).await {
        Ok(figures) => {
            if json {
                output::json(&figures);
            } else {
                print!("{}", canopy_bench::table(&figures));
            }
            let failed = if check { canopy_bench::check::check(&figures) } else { Vec::new() };
            for line in &failed {
                eprintln!("canopy bench --check: {line}");
            }
            u8::from(!failed.is_empty())
        }
        Err(e) => fail(json, &CallError::Unreachable(format!("benchmark failed: {e}"))),
    }
}

/// Bridges stdio to the runner's MCP endpoint with one session token: every JSON-RPC line
/// read is relayed over HTTP, every answer written back as a line. It needs no data
/// directory, no `daemon.json` and no NATS credential, so it works inside a session's sandbox.
async fn mcp(json: bool, args: &McpArgs) -> u8 {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut client = match canopy_scripted::mcp::McpClient::new(&args.url, &args.token) {
        Ok(client) => client,
        Err(e) => return fail_usage(json, "url", &e.to_string()),
    };
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    loop {
        let line = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => return 0,
            Err(e) => return fail(json, &CallError::Unreachable(format!("reading stdin: {e}"))),
        };
        if line.trim().is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<serde_json::Value>(&line) {
            Ok(message) => client.forward(message).await,
            Err(e) => Some(serde_json::json!({
                "jsonrpc": "2.0", "id": null, "error": { "code": -32700, "message": format!("parse error: {e}") },
            })),
        };
        if let Some(answer) = answer {
            let mut text = answer.to_string();
            text.push('\n');
            if stdout.write_all(text.as_bytes()).await.is_err() || stdout.flush().await.is_err() {
                return 0; // The client went away.
            }
        }
    }
}

/// Prints a usage error naming `field` and returns 64.
pub(crate) fn fail_usage(json: bool, field: &str, message: &str) -> u8 {
    let wire = canopy_proto::WireError {
        code: ErrorCode::InvalidArgument,
        message: message.to_owned(),
        field: Some(field.to_owned()),
    };
    if json {
        output::json(&serde_json::json!({ "error": wire }));
    } else {
        eprintln!("error: {wire}");
    }
    EXIT_USAGE
}

/// Prints an error and returns its exit code.
fn fail(json: bool, error: &CallError) -> u8 {
    let (code, wire) = match error {
        CallError::Refused(wire) => (EXIT_REFUSED, wire.clone()),
        CallError::Unreachable(message) => (
            EXIT_UNAVAILABLE,
            canopy_proto::WireError { code: ErrorCode::Unavailable, message: message.clone(), field: None },
        ),
    };
    if json {
        output::json(&serde_json::json!({ "error": wire }));
    } else {
        eprintln!("error: {wire}");
    }
    code
}

/// `canopy bundle check`: loads and lints a bundle locally (no daemon needed).
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

fn bundle_check(dir: &DataDir, json: bool, bundle: Option<std::path::PathBuf>, gated: bool) -> u8 {
    use canopy_daemon::prompts::{BundleSource, check};
    let source = match bundle {
        Some(path) => BundleSource::Dir(path),
        None => match Config::load(&dir.config()) {
            Ok(config) => BundleSource::from_config(&config, dir.root()),
            Err(e) => return fail(json, &CallError::Unreachable(e.to_string())),
        },
    };
    let name = match &source {
        BundleSource::Embedded => "embedded".to_owned(),
        BundleSource::Dir(path) => path.display().to_string(),
    };
    match check(&source, cli_commands()) {
        Ok(renderer) => {
            let b = renderer.bundle();
            let counts = serde_json::json!({
                "roles": b.roles.len(), "definitions": b.definitions.len(),
                "skills": b.skills.len(), "rules": b.rules.len(),
            });
            let waiting = if gated { canopy_prompt::gated(&renderer) } else { Vec::new() };
            if json {
                let waiting: Vec<serde_json::Value> = waiting
                    .iter()
                    .map(|g| serde_json::json!({ "role": g.role, "file": g.file, "line": g.line, "waits_for": g.waits_for, "text": g.text }))
                    .collect();
                output::json(
                    &serde_json::json!({ "ok": true, "bundle": name, "counts": counts, "problems": [], "gated": waiting }),
                );
            } else {
                let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
                println!(
                    "bundle {name}: ok ({}, {}, {}, {})",
                    count(b.roles.len(), "role"),
                    count(b.definitions.len(), "definition"),
                    count(b.skills.len(), "skill"),
                    count(b.rules.len(), "rule")
                );
                if gated {
                    output::gated(&waiting);
                }
            }
            0
        }
        Err(problems) => {
            if json {
                output::json(&serde_json::json!({ "ok": false, "bundle": name, "problems": problems }));
            } else {
                eprintln!("bundle {name}: {} problem(s)", problems.len());
                for p in &problems {
                    eprintln!("  {p}");
                }
            }
            1
        }
    }
}
