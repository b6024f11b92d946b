//! The commands that need no running daemon's API: `init` (the store before any daemon),
//! `daemon` and `up` (the daemon in this process: the composition root), `runner` (a
//! standalone runner), `mcp` (the stdio bridge a session's harness runs), `web` (a login
//! link from the console) and `nats-config`.
//!
//! Wires the crates together and maps their failures to exit codes; owns no rule of its own.

use canopy_config::{Config, DataDir};
use canopy_daemon::{DaemonError, DaemonOptions, InitOptions};
use canopy_proto::Subjects;

use crate::args::{DaemonArgs, InitArgs, McpArgs, RunnerArgs, WebArgs};
use crate::client::CallError;
use crate::exit::{EXIT_UNAVAILABLE, EXIT_USAGE, fail, fail_usage};
use crate::output;
use crate::writer::{errln, out, outln};

/// `canopy init`: creates the workspace.
pub async fn init(dir: &DataDir, json: bool, args: &InitArgs) -> u8 {
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
            outln!("initialised workspace {} ({}) in {}", report.workspace.name, report.workspace.id, report.data_dir);
            outln!("  operator {} (token in {}, mode 0600)", report.operator, report.token_file);
            outln!("  config   {}", report.config_file);
            outln!("  channels #announcements, #incidents, #home-supervisor");
            outln!("next: canopy daemon --dir {}", report.data_dir);
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

/// `canopy up`: `init` when the directory has no workspace yet, then `daemon`.
pub async fn up(dir: &DataDir, json: bool, init_args: &InitArgs, daemon_args: &DaemonArgs) -> u8 {
    if !dir.db().exists() {
        let code = init(dir, json, init_args).await;
        if code != 0 {
            return code;
        }
    }
    daemon(dir, json, daemon_args).await
}

/// `canopy daemon`: the composition root. Checks what the daemon cannot (the sandbox grants,
/// which are the harness layer's rules), then runs the daemon with the embedded runner and
/// the scripted harness's script check.
pub async fn daemon(dir: &DataDir, json: bool, args: &DaemonArgs) -> u8 {
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
                errln!("error: {e}");
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

/// `canopy runner`: runs a standalone runner until SIGINT/SIGTERM.
pub async fn runner(dir: &DataDir, json: bool, args: &RunnerArgs) -> u8 {
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
    let handle = match start_runner(dir, &config, args, &file).await {
        Ok(handle) => handle,
        Err(e) => return fail(json, &e),
    };
    if json {
        output::json_line(&serde_json::json!({ "runner": handle.id, "mcp_url": handle.mcp_url }));
    } else {
        errln!("runner {} serving tools at {}", handle.id, handle.mcp_url);
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

/// How long a starting runner keeps trying a login the server refuses.
const RUNNER_LOGIN_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads the runner's credential in `file`, connects to NATS as that runner and starts it.
async fn start_runner(
    dir: &DataDir,
    config: &Config,
    args: &RunnerArgs,
    file: &std::path::Path,
) -> Result<canopy_runner::RunnerHandle, CallError> {
    let credential: canopy_config::RunnerCredential = canopy_config::credentials::read(file)
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
    let login_file = file.to_owned();
    let login = canopy_bus::Login::reading(
        move || canopy_config::credentials::read_login(&login_file),
        Some(subjects.inbox(canopy_proto::Party::Runner(&id))),
    );
    // A runner started right after `canopy runners add` may come before the server applied it.
    let api = crate::client::connect(dir, &url, subjects, &login, "canopy-runner", RUNNER_LOGIN_PATIENCE).await?;
    let options = canopy_runner::wiring::options(dir, config, api, &credential, file)
        .map_err(|e| CallError::Unreachable(format!("preparing the runner: {e}")))?;
    canopy_runner::spawn(options).await.map_err(|e| CallError::Unreachable(e.to_string()))
}

/// `canopy mcp --stdio`: bridges stdio to the runner's MCP endpoint with one session token:
/// every JSON-RPC line read is relayed over HTTP, every answer written back as a line. It
/// needs no data directory, no `daemon.json` and no NATS credential, so it works inside a
/// session's sandbox.
pub async fn mcp(json: bool, args: &McpArgs) -> u8 {
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

/// `canopy web`: asks the daemon's console for a one-time login link with the operator's
/// token (sent in a header, never put in the link), prints it (as a QR code too with `--qr`),
/// and opens it in a browser when this session has one (`$BROWSER`, or `xdg-open` under a
/// display) unless `--no-open`. The link names `[web] public_url` when it is set. With
/// `--init-tls`, makes the console's certificate instead.
pub async fn web(dir: &DataDir, json: bool, args: &WebArgs) -> u8 {
    if args.init_tls {
        return init_tls(dir, json, args);
    }
    let info = match crate::client::connection_info(dir) {
        Ok(info) => info,
        Err(e) => return fail(json, &e),
    };
    let Some(base) = info.web_url else {
        let why = "the daemon serves no console: [web] enabled is false in canopy.toml, or the console could not \
                   bind its address (the daemon's log says why)";
        return fail(json, &CallError::Unreachable(why.into()));
    };
    let config = match canopy_config::Config::load(&dir.config()) {
        Ok(config) => config,
        Err(e) => return crate::exit::fail_usage(json, &e.key, &e.to_string()),
    };
    let tls = match config.web.tls_files(dir.root()) {
        Some((cert, _)) => match canopy_web::tls::pinned_client(&cert) {
            Ok(client) => Some(client),
            Err(e) => return crate::exit::fail_usage(json, "web.tls_cert", &e),
        },
        None => None,
    };
    let token = match crate::client::read_token(&dir.operator_token()) {
        Ok(token) => token,
        Err(e) => return fail(json, &e),
    };
    let link = match canopy_web::request_link(&base, &token, tls).await {
        Ok(link) => link,
        Err(canopy_web::LinkError::Refused(message)) => {
            let error = canopy_proto::WireError { code: canopy_core::ErrorCode::Forbidden, message, field: None };
            return fail(json, &CallError::Refused(error));
        }
        Err(e) => return fail(json, &CallError::Unreachable(e.to_string())),
    };
    // The browser may be elsewhere: it reaches the console by its public address.
    let public = config.web.public_url.trim_end_matches('/');
    let link = match link.strip_prefix(base.trim_end_matches('/')) {
        Some(path) if !public.is_empty() => format!("{public}{path}"),
        _ => link,
    };
    let opened = !args.no_open && open_browser(&link);
    if json {
        output::json(&serde_json::json!({ "url": base, "link": link, "opened": opened }));
        return 0;
    }
    outln!("{link}");
    if args.qr {
        match qrcode::QrCode::new(link.as_bytes()) {
            Ok(code) => outln!("{}", code.render::<qrcode::render::unicode::Dense1x2>().quiet_zone(true).build()),
            Err(e) => errln!("the link does not fit a QR code: {e}"),
        }
    }
    match opened {
        true => errln!("opened in your browser; the link works once"),
        false => errln!("open it in a browser (or scan it); it works once, for a short time"),
    }
    0
}

/// `canopy web --init-tls`: a self-signed pair for the console, its fingerprint, and the lines
/// that put it to use.
fn init_tls(dir: &DataDir, json: bool, args: &WebArgs) -> u8 {
    let made = match canopy_web::tls::init(&dir.web_dir(), &args.names, args.force) {
        Ok(made) => made,
        Err(e) => {
            let wire = canopy_proto::WireError {
                code: canopy_core::ErrorCode::Conflict,
                message: e,
                field: Some("init_tls".into()),
            };
            return fail(json, &CallError::Refused(wire));
        }
    };
    let relative = |p: &std::path::Path| p.strip_prefix(dir.root()).unwrap_or(p).display().to_string();
    let (cert, key) = (relative(&made.cert), relative(&made.key));
    if json {
        output::json(&serde_json::json!({
            "cert": made.cert, "key": made.key, "sha256": made.fingerprint, "names": made.names,
        }));
        return 0;
    }
    outln!("certificate {cert} (key {key}, 0600)");
    outln!("names       {}", made.names.join(", "));
    outln!("SHA-256     {}", made.fingerprint);
    outln!("check that fingerprint where your browser shows the certificate the first time it connects.");
    outln!("to serve HTTPS, set in canopy.toml and restart the daemon:");
    outln!("  [web]");
    outln!("  listen = \"0.0.0.0:8443\"");
    outln!("  tls_cert = \"{cert}\"");
    outln!("  tls_key = \"{key}\"");
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

/// bcrypt's cheapest cost: the passwords are 256 random bits, so no cost makes guessing them
/// any harder, and the server pays it at every connect.
const BCRYPT_COST: u32 = 4;

/// `canopy nats-config`: prints the `authorization` block for an external nats-server: every
/// login of this workspace with its permissions, passwords as bcrypt hashes. Needs no daemon.
pub fn nats_config(dir: &DataDir, json: bool) -> u8 {
    let built = (|| {
        let credentials = canopy_daemon::logins::load(dir).map_err(|e| e.to_string())?;
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
            outln!("# NATS logins of Canopy workspace {workspace}: put this in the nats-server configuration,");
            outln!("# reload the server, then run `canopy daemon --nats-url URL`. Re-run after");
            outln!("# `canopy runners add|remove` and `canopy credentials rotate`.");
            out!("{block}");
            0
        }
        Err(e) => fail(json, &CallError::Unreachable(e)),
    }
}
