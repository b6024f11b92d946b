//! The console's listener, routes and actions.
//!
//! Every page handler reads what it shows through the API with the session's operator token,
//! and every action is one API call with that token: an API refusal is shown as it came
//! (`forbidden` stays `forbidden`). The console adds checks of its own only about the browser:
//! a session cookie, the page's CSRF token on every POST, a same-origin `Origin`, and a `Host`
//! of this listener (against DNS rebinding). It keeps the port it first picked in `web/port`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use canopy_bus::{ApiClient, CallError};
use canopy_config::{Config, DataDir};
use canopy_core::issues::{IssueState, IssueSummary};
use canopy_core::{ErrorCode, MergeState};
use canopy_proto::api::*;
use canopy_proto::{ApiMethod, method};
use maud::Markup;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::auth::{Attempt, Auth, Limiter, Session, cookie, same};
use crate::console::{AuditHook, Console, LoggedIn, Refusal, Shared, call, logged_in};
use crate::issue_pages::{self, Board, CLOSED_SHOWN, IssueFilter};
use crate::listener::{Listener, Peer};
use crate::live;
use crate::pages;
use crate::{CSRF_HEADER, SESSION_COOKIE};

/// The header the page's script sets when it fetches the page again for its live regions.
const LIVE_HEADER: &str = "x-canopy-part";

/// Stops a console started by `start`.
pub type Stop = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// What `start` returns: the console's URL and how to stop it, once it listens.
pub type Started = Pin<Box<dyn Future<Output = Result<(String, Stop), String>> + Send>>;

/// Starts the console in the shape `canopy_daemon::DaemonOptions::web` takes: binds the
/// `[web] listen` address (port 0: the port kept in `web/port`, else a free one), speaks TLS
/// when `[web] tls_cert` is set, and serves until stopped. Returns its URL (a loopback one when
/// it listens on every address). `audit` records failed logins in the daemon's audit log.
pub fn start(dir: DataDir, config: Config, api: ApiClient, audit: AuditHook) -> Started {
    Box::pin(async move {
        let wanted = config.web.address().map_err(|e| format!("[web] listen: {e}"))?;
        let tls = match config.web.tls_files(dir.root()) {
            Some((cert, key)) => Some(crate::tls::server(&cert, &key).map_err(|e| format!("[web] tls_cert: {e}"))?),
            None => None,
        };
        let port_file = dir.web_dir().join("port");
        let tcp = bind(wanted, &port_file).await?;
        let addr = tcp.local_addr().map_err(|e| format!("the console's address: {e}"))?;
        if let Err(e) = crate::auth::write_private(&port_file, &addr.port().to_string()) {
            tracing::warn!(error = %e, file = %port_file.display(), "keeping the console's port");
        }
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let auth = Auth::load(dir.web_dir().join("sessions.json"), ms(config.web.session_ttl), ms(config.web.link_ttl));
        let port = addr.port();
        let mut hosts = vec![format!("127.0.0.1:{port}"), format!("localhost:{port}"), format!("[::1]:{port}")];
        hosts.push(authority(addr));
        hosts.extend(public_hosts(&config.web.public_url));
        let stop = CancellationToken::new();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let (server_tls, leaf) = match tls {
            Some(served) => (Some(served.config), Some(served.leaf)),
            None => (None, None),
        };
        let console = Arc::new(Console {
            api,
            auth,
            stop: stop.clone(),
            hosts,
            tls: leaf,
            port,
            public_origin: public_origin(&config.web.public_url),
            audit,
            limiter: Limiter::default(),
        });
        let app = router(console).into_make_service_with_connect_info::<Peer>();
        let listener = Listener::start(tcp, server_tls, stop.clone());
        let serving = stop.clone();
        let task = tokio::spawn(async move {
            let shutdown = serving.clone();
            if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await {
                tracing::error!(error = %e, "the console stopped serving");
            }
        });
        // Clients on this machine reach a console on every address through loopback.
        let reach = match addr.ip() {
            ip if ip.is_unspecified() && addr.is_ipv4() => SocketAddr::from(([127, 0, 0, 1], port)),
            ip if ip.is_unspecified() => SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
            _ => addr,
        };
        let url = format!("{scheme}://{}", authority(reach));
        tracing::info!(%url, listen = %addr, "operator console listening");
        let stop: Stop = Box::new(move || {
            Box::pin(async move {
                stop.cancel();
                // Live streams end with the token; a page still loading gets a second.
                match tokio::time::timeout(Duration::from_secs(1), task).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "the console's serving task ended abnormally"),
                    Err(_) => tracing::debug!("the console was still answering a request 1s after stop; leaving it"),
                }
            })
        });
        Ok((url, stop))
    })
}

/// `host:port` of an address, IPv6 in brackets.
fn authority(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => a.to_string(),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    }
}

/// The `Host` values a browser sends for `[web] public_url`: its authority, and without the
/// scheme's default port when it names that port (or none).
fn public_hosts(url: &str) -> Vec<String> {
    let Some((scheme, rest)) = url.split_once("://") else { return Vec::new() };
    let default = if scheme == "https" { "443" } else { "80" };
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() {
        return Vec::new();
    }
    match authority.rsplit_once(':').filter(|(_, p)| !p.ends_with(']')) {
        Some((host, port)) if port == default => vec![authority.to_owned(), host.to_owned()],
        Some(_) => vec![authority.to_owned()],
        None => vec![authority.to_owned(), format!("{authority}:{default}")],
    }
}

/// `[web] public_url` as an `Origin` header carries it: scheme and host, the port only when it
/// is not the scheme's default.
fn public_origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.trim_end_matches('/');
    let default = if scheme == "https" { ":443" } else { ":80" };
    (!authority.is_empty()).then(|| format!("{scheme}://{}", authority.strip_suffix(default).unwrap_or(authority)))
}

async fn bind(wanted: SocketAddr, port_file: &std::path::Path) -> Result<tokio::net::TcpListener, String> {
    if wanted.port() == 0 {
        let kept = std::fs::read_to_string(port_file).ok().and_then(|t| t.trim().parse::<u16>().ok());
        if let Some(port) = kept {
            match tokio::net::TcpListener::bind(SocketAddr::new(wanted.ip(), port)).await {
                Ok(listener) => return Ok(listener),
                Err(e) => tracing::warn!(port, error = %e, "the console's earlier port is taken; picking another"),
            }
        }
    }
    tokio::net::TcpListener::bind(wanted).await.map_err(|e| format!("binding the console to {wanted}: {e}"))
}

fn router(console: Shared) -> Router {
    Router::new()
        .route("/", get(waiting))
        .route("/tree", get(tree))
        .route("/channels", get(channels))
        .route("/channels/{channel}", get(channel))
        .route("/agents/{handle}", get(agent))
        .route("/agents/{handle}/timeline", get(timeline))
        .route("/spend", get(spend))
        .route("/issues", get(issues_board).post(file_issue))
        .route("/issues/{number}", get(issue))
        .route("/issues/{number}/assign", post(assign_issue))
        .route("/issues/{number}/comment", post(comment_issue))
        .route("/audit", get(audit))
        .route("/events", get(live::events))
        .route("/link", post(link))
        .route("/login/{secret}", get(login))
        .route("/logout", post(logout))
        .route("/spawn/{id}", post(decide_spawn))
        .route("/merges/{id}", post(decide_merge))
        .route("/post", post(post_message))
        .route("/assets/console.js", get(|| async { asset("text/javascript", pages::JS) }))
        .route("/assets/console.css", get(|| async { asset("text/css", pages::CSS) }))
        .fallback(|| async { (StatusCode::NOT_FOUND, pages::bare("Not found", "There is no such page.")) })
        .layer(axum::middleware::from_fn_with_state(console.clone(), guard))
        .with_state(console)
}

fn asset(kind: &'static str, text: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "no-cache")], text).into_response()
}

/// Refuses a `Host` that is not this listener (DNS rebinding), and sets the headers every
/// answer carries: no framing, no referrer to other sites, no sniffing, scripts and styles from here only.
async fn guard(
    State(console): State<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    if !console.host_ok(host) {
        let why = "the console answers on its own addresses and names only (loopback, [web] public_url, the names of \
                   its certificate)";
        return (StatusCode::MISDIRECTED_REQUEST, why).into_response();
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    let csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
               form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(csp));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// A state-changing request: logged in, from this origin, with the page's CSRF token (header
/// or form field).
fn acting(console: &Console, headers: &HeaderMap, form_csrf: Option<&str>) -> Result<Session, Refusal> {
    let (_, session) = logged_in(console, headers)?;
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok())
        && !console.origin_ok(origin)
    {
        let refused = pages::outcome_page("Refused", Err("a request from another origin"));
        return Err(Box::new((StatusCode::FORBIDDEN, refused).into_response()));
    }
    let given = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()).or(form_csrf).unwrap_or("");
    if given.is_empty() || !same(given, &session.csrf) {
        let why = "the request carries no valid CSRF token; reload the page";
        return Err(Box::new((StatusCode::FORBIDDEN, pages::outcome_page("Refused", Err(why))).into_response()));
    }
    Ok(session)
}

/// The HTTP status of an API failure.
fn status_of(error: &CallError) -> StatusCode {
    match error {
        CallError::Unreachable(_) => StatusCode::SERVICE_UNAVAILABLE,
        CallError::Refused(e) => match e.code {
            ErrorCode::Forbidden => StatusCode::FORBIDDEN,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::InvalidArgument => StatusCode::BAD_REQUEST,
            ErrorCode::Conflict => StatusCode::CONFLICT,
            ErrorCode::LimitExceeded => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        },
    }
}

/// A page whose reads failed: the API's refusal, with its status.
fn failed(session: &Session, title: &str, error: &CallError) -> Response {
    (status_of(error), pages::page(title, session, pages::failure(error))).into_response()
}

fn page(session: &Session, title: &str, body: Result<Markup, CallError>) -> Response {
    match body {
        Ok(body) => pages::page(title, session, body).into_response(),
        Err(e) => failed(session, title, &e),
    }
}

async fn waiting(State(console): State<Shared>, LoggedIn(_, session): LoggedIn) -> Response {
    let body = async {
        let spawns = call::<method::SpawnList>(&console, &session, &SpawnListRequest { state: None }).await?.requests;
        let merges = call::<method::MergesList>(&console, &session, &MergesListRequest { state: None }).await?.merges;
        let mut waiting = Vec::new();
        for m in merges.iter().filter(|m| matches!(m.state, MergeState::Pending | MergeState::InReview)) {
            waiting
                .push(call::<method::MergesShow>(&console, &session, &MergesShowRequest { id: m.id.clone() }).await?);
        }
        let queue = call::<method::MergesQueue>(&console, &session, &MergesQueueRequest { repo: None }).await?.queue;
        let issues = call::<method::Whoami>(&console, &session, &WhoamiRequest {}).await?.waiting_issues;
        Ok(pages::waiting(&spawns, &waiting, &queue, &issues, canopy_sys::unix_ms(), &session.csrf))
    }
    .await;
    page(&session, "Waiting", body)
}

async fn tree(State(console): State<Shared>, LoggedIn(_, session): LoggedIn) -> Response {
    let body = async {
        let tree = call::<method::Tree>(&console, &session, &TreeRequest { depth: None }).await?;
        let roster = roster(&console, &session).await?;
        let usage = call::<method::Usage>(&console, &session, &UsageRequest { agent: None, since_secs: None }).await?;
        let pending = SpawnListRequest { state: Some(canopy_core::SpawnState::Pending) };
        let spawns = call::<method::SpawnList>(&console, &session, &pending).await?.requests;
        let pending = MergesListRequest { state: Some(MergeState::Pending) };
        let merges = call::<method::MergesList>(&console, &session, &pending).await?.merges;
        // What waits for the operator, by whose it is: requests, merges, a failing lane.
        let mut waiting: std::collections::HashSet<&str> = spawns.iter().map(|r| r.requester.as_str()).collect();
        waiting.extend(merges.iter().map(|m| m.requester.as_str()));
        waiting.extend(
            roster
                .iter()
                .filter(|a| matches!(a.presence, canopy_core::Presence::Failing | canopy_core::Presence::Crashed))
                .map(|a| a.handle.as_str()),
        );
        Ok(pages::tree(&tree.root, &roster, &usage, &waiting))
    }
    .await;
    page(&session, "Tree", body)
}

async fn spend(
    State(console): State<Shared>,
    LoggedIn(_, session): LoggedIn,
    Query(query): Query<pages::SpendQuery>,
) -> Response {
    let body = async {
        let agent = query.agent.clone().filter(|a| !a.trim().is_empty());
        let scope = match (&agent, query.issue) {
            (Some(a), _) if query.subtree => format!("@{a} and below"),
            (Some(a), _) => format!("@{a}"),
            (None, Some(n)) => format!("issue #{n}"),
            (None, None) => "the workspace".to_owned(),
        };
        let bucket = if query.daily { SeriesBucket::Day } else { SeriesBucket::Hour };
        let request = UsageSeriesRequest { agent, subtree: query.subtree, issue: query.issue, bucket };
        let series = call::<method::UsageSeries>(&console, &session, &request).await?;
        Ok(pages::spend(&series, &scope, &query))
    }
    .await;
    page(&session, "Spend", body)
}

#[derive(Deserialize)]
struct TurnQuery {
    turn: Option<String>,
}

async fn timeline(
    State(console): State<Shared>,
    LoggedIn(_, session): LoggedIn,
    Path(handle): Path<String>,
    Query(query): Query<TurnQuery>,
) -> Response {
    let body = async {
        let read = ActivityReadRequest { agent: handle.clone(), after: 0, limit: None, tail: Some(MAX_READ_LIMIT) };
        let items = call::<method::ActivityRead>(&console, &session, &read).await?.items;
        let now = canopy_sys::unix_ms();
        let timeline = canopy_core::timeline::build(&items, now - 86_400_000, now);
        let zoom = query
            .turn
            .as_deref()
            .and_then(|key| timeline.turns.iter().find(|t| format!("{}-{}", t.incarnation, t.turn_id) == key));
        Ok(pages::timeline(&handle, &timeline, zoom))
    }
    .await;
    page(&session, &format!("{handle}: where the time went"), body)
}

/// The whole roster, a page of 500 at a time.
async fn roster(console: &Console, session: &Session) -> Result<Vec<canopy_core::RosterEntry>, CallError> {
    let mut roster = Vec::new();
    let mut after = None;
    loop {
        let request = RosterRequest { after: after.take(), limit: Some(500), ..RosterRequest::default() };
        let page = call::<method::Roster>(console, session, &request).await?;
        after = page.agents.last().map(|a| a.handle.to_string());
        roster.extend(page.agents);
        if page.more == 0 || after.is_none() {
            return Ok(roster);
        }
    }
}

async fn channels(State(console): State<Shared>, LoggedIn(_, session): LoggedIn) -> Response {
    let body = async {
        let mut channels = call::<method::ChannelsList>(&console, &session, &ChannelsListRequest {}).await?.channels;
        channels.sort_by_key(|c| std::cmp::Reverse(c.last_seq));
        Ok(pages::channels(&channels))
    }
    .await;
    page(&session, "Channels", body)
}

#[derive(Deserialize)]
struct TopicQuery {
    topic: Option<String>,
}

async fn channel(
    State(console): State<Shared>,
    LoggedIn(_, session): LoggedIn,
    Path(name): Path<String>,
    Query(query): Query<TopicQuery>,
) -> Response {
    let body = async {
        let topics =
            call::<method::TopicsList>(&console, &session, &TopicsListRequest { channel: name.clone() }).await?.topics;
        let topic =
            query.topic.clone().filter(|t| !t.is_empty()).or_else(|| topics.first().map(|t| t.name.to_string()));
        let messages = match &topic {
            Some(topic) => {
                let request = ReadRequest {
                    channel: name.clone(),
                    topic: Some(topic.clone()),
                    after: canopy_core::Seq(0),
                    limit: Some(100),
                    unread: false,
                    newest: true,
                };
                let read = call::<method::MessagesRead>(&console, &session, &request).await?;
                read.groups.into_iter().flat_map(|g| g.messages).collect()
            }
            None => Vec::new(),
        };
        let pins = call::<method::BoardList>(&console, &session, &BoardListRequest { channel: name.clone() }).await?;
        let pinned: Vec<canopy_core::Seq> = pins.pins.iter().map(|m| m.seq).collect();
        Ok(pages::channel(&name, &topics, topic.as_deref(), &messages, &pinned, &session.csrf))
    }
    .await;
    page(&session, &format!("#{name}"), body)
}

async fn agent(
    State(console): State<Shared>,
    LoggedIn(_, session): LoggedIn,
    headers: HeaderMap,
    Path(handle): Path<String>,
) -> Response {
    // A live refresh swaps only the `data-live` regions: the prompt is not one, so a busy
    // agent's activity does not render its prompt again on every event.
    let live = headers.contains_key(LIVE_HEADER);
    let body = async {
        let roster = RosterRequest { handles: vec![handle.clone()], ..RosterRequest::default() };
        let entry = call::<method::Roster>(&console, &session, &roster).await?.agents.into_iter().next();
        let activity = ActivityReadRequest { agent: handle.clone(), after: 0, limit: None, tail: Some(200) };
        let activity = call::<method::ActivityRead>(&console, &session, &activity).await?.items;
        let prompt = PromptsRenderRequest { agent: Some(handle.clone()), role: None };
        // An agent whose prompt cannot be rendered now (its bundle broken) still has a page.
        let prompt = match live {
            true => Err("not read on a live refresh".to_owned()),
            false => call::<method::PromptsRender>(&console, &session, &prompt).await.map_err(|e| e.to_string()),
        };
        let runs = RunsListRequest { agent: Some(handle.clone()), open: false };
        let runs = call::<method::RunsList>(&console, &session, &runs).await?.runs;
        let usage = UsageRequest { agent: Some(handle.clone()), since_secs: None };
        let usage = call::<method::Usage>(&console, &session, &usage).await?;
        Ok(pages::agent(&handle, entry.as_ref(), &activity, &prompt, &runs, &usage))
    }
    .await;
    page(&session, &handle, body)
}

#[derive(Deserialize)]
struct AuditQuery {
    action: Option<String>,
    actor: Option<String>,
    text: Option<String>,
}

async fn audit(
    State(console): State<Shared>,
    LoggedIn(_, session): LoggedIn,
    Query(query): Query<AuditQuery>,
) -> Response {
    let body = async {
        let entries =
            call::<method::AuditList>(&console, &session, &AuditListRequest { since_secs: None }).await?.entries;
        let filter = pages::AuditFilter {
            action: query.action.unwrap_or_default(),
            actor: query.actor.unwrap_or_default(),
            text: query.text.unwrap_or_default(),
        };
        Ok(pages::audit(&entries, &filter))
    }
    .await;
    page(&session, "Audit", body)
}

/// `POST /link` with `Authorization: Bearer <token>`: a login link, for operators only (the
/// API says who the token is).
/// A login attempt from `peer` may go ahead: `None`, or the refusal while the address has
/// failed too often (the first refusal of a window is audited).
fn limited(console: &Console, peer: Peer) -> Option<Response> {
    match console.limiter.attempt(peer.0.ip()) {
        Attempt::Allowed => None,
        Attempt::Limited { first } => {
            if first {
                let detail = format!(
                    "from {}: {} failed logins within a minute; refusing every login from it for the rest of it",
                    peer.0.ip(),
                    crate::auth::LOGIN_FAILURES
                );
                (console.audit)("console.login_limited", &detail);
            }
            let why = "Too many failed logins from this address: wait a minute, then run `canopy web` again.";
            Some((StatusCode::TOO_MANY_REQUESTS, pages::bare("Too many failed logins", why)).into_response())
        }
    }
}

/// A failed login from `peer` (counted when it was attempted): audited.
fn login_failed(console: &Console, peer: Peer, why: &str) {
    (console.audit)("console.login_failed", &format!("from {}: {why}", peer.0.ip()));
}

async fn link(State(console): State<Shared>, ConnectInfo(peer): ConnectInfo<Peer>, headers: HeaderMap) -> Response {
    let refuse =
        |status: StatusCode, why: &str| (status, axum::Json(serde_json::json!({ "error": why }))).into_response();
    if limited(&console, peer).is_some() {
        return refuse(StatusCode::TOO_MANY_REQUESTS, "too many failed logins from this address; wait a minute");
    }
    let Some(token) = bearer(&headers) else {
        login_failed(&console, peer, "a link asked for without a token");
        return refuse(StatusCode::UNAUTHORIZED, "present an operator token as `Authorization: Bearer <token>`");
    };
    let whoami = match console.api.send::<method::Whoami>(token, &WhoamiRequest {}).await {
        Ok(whoami) => whoami,
        Err(e) => {
            match &e {
                CallError::Refused(w) if w.code == ErrorCode::Forbidden => {
                    login_failed(&console, peer, "a link asked for with a token the workspace does not know");
                }
                // The daemon could not answer: no one failed to log in.
                _ => console.limiter.succeeded(peer.0.ip()),
            }
            return refuse(status_of(&e), &e.to_string());
        }
    };
    if whoami.account.kind != canopy_core::AccountKind::Operator {
        login_failed(
            &console,
            peer,
            &format!("a link asked for with {}'s token, not an operator's", whoami.account.handle),
        );
        return refuse(StatusCode::FORBIDDEN, "only an operator's token opens the console");
    }
    console.limiter.succeeded(peer.0.ip());
    match console.auth.mint_link(token, whoami.account.handle.as_str()) {
        Ok(secret) => axum::Json(serde_json::json!({ "path": format!("/login/{secret}") })).into_response(),
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, &format!("minting a link: {e}")),
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

/// Opens a link once: sets the session cookie and goes to the waiting page.
async fn login(
    State(console): State<Shared>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(secret): Path<String>,
) -> Response {
    if let Some(refused) = limited(&console, peer) {
        return refused;
    }
    let opened = console.auth.open_link(&secret);
    if opened.is_some() {
        console.limiter.succeeded(peer.0.ip());
    }
    match opened {
        Some(Ok(id)) => {
            // Over TLS the cookie never travels in the clear.
            let secure = if console.tls.is_some() { "; Secure" } else { "" };
            let cookie = format!("{SESSION_COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict{secure}");
            // Not a redirect: a link opened from another site (a chat, a terminal emulator's
            // handler) would follow it without the Strict cookie. A page of ours moves on.
            let mut response = pages::logged_in_page().into_response();
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
        }
        Some(Err(e)) => {
            (StatusCode::INTERNAL_SERVER_ERROR, pages::bare("Login failed", &format!("{e}"))).into_response()
        }
        None => {
            login_failed(&console, peer, "a login link that is unknown, used or expired");
            (
                StatusCode::UNAUTHORIZED,
                pages::bare(
                    "This link is used up",
                    "A login link works once and for a short time. Run `canopy web` for a new one.",
                ),
            )
                .into_response()
        }
    }
}

#[derive(Deserialize)]
struct CsrfOnly {
    csrf: Option<String>,
}

async fn logout(State(console): State<Shared>, headers: HeaderMap, Form(form): Form<CsrfOnly>) -> Response {
    if let Err(r) = acting(&console, &headers, form.csrf.as_deref()) {
        return *r;
    }
    if let Some(id) = cookie(&headers, SESSION_COOKIE) {
        console.auth.end(id);
    }
    let mut response = (StatusCode::OK, pages::bare("Logged out", "Run `canopy web` to log in again.")).into_response();
    let gone = format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    if let Ok(value) = HeaderValue::from_str(&gone) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

#[derive(Deserialize)]
struct Decision {
    csrf: Option<String>,
    decision: String,
    #[serde(default)]
    reason: String,
    /// A merge approved over a missing or negative review verdict: why (recorded).
    #[serde(default, rename = "override")]
    override_reason: String,
}

impl Decision {
    /// `approve`, or `deny` with a reason: the console asks for one (the gate then tells the
    /// requester why).
    fn checked(&self) -> Result<(bool, Option<String>), &'static str> {
        let reason = Some(self.reason.trim().to_owned()).filter(|r| !r.is_empty());
        match self.decision.as_str() {
            "approve" => Ok((true, reason)),
            "deny" if reason.is_some() => Ok((false, reason)),
            "deny" => Err("a denial needs a reason, so the requester knows why"),
            _ => Err("the decision is `approve` or `deny`"),
        }
    }
}

fn outcome(result: Result<Markup, CallError>, title: &str) -> Response {
    match result {
        Ok(markup) => pages::outcome_page(title, Ok(markup)).into_response(),
        Err(e) => (status_of(&e), pages::outcome_page(title, Err(&e.to_string()))).into_response(),
    }
}

fn bad_form(why: &str) -> Response {
    (StatusCode::BAD_REQUEST, pages::outcome_page("Refused", Err(why))).into_response()
}

/// One decision through the API: `request` builds the method's request from the checked
/// form, `shown` renders its answer.
async fn decide<M: ApiMethod>(
    console: &Console,
    headers: &HeaderMap,
    form: Decision,
    request: impl FnOnce(bool, Option<String>) -> M::Request,
    shown: fn(&M::Response) -> Markup,
) -> Response {
    let session = match acting(console, headers, form.csrf.as_deref()) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let (approve, reason) = match form.checked() {
        Ok(d) => d,
        Err(why) => return bad_form(why),
    };
    let decided = call::<M>(console, &session, &request(approve, reason)).await;
    outcome(decided.map(|r| shown(&r)), "Decision")
}

async fn decide_spawn(
    State(console): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<Decision>,
) -> Response {
    let request = |approve, reason| SpawnDecideRequest { id, approve, reason };
    decide::<method::SpawnDecide>(&console, &headers, form, request, pages::spawn_decided).await
}

async fn decide_merge(
    State(console): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<Decision>,
) -> Response {
    let override_reason = Some(form.override_reason.trim().to_owned()).filter(|r| !r.is_empty());
    let request = |approve, reason| MergesDecideRequest { id, approve, reason, override_reason };
    decide::<method::MergesDecide>(&console, &headers, form, request, pages::merge_decided).await
}

#[derive(Deserialize)]
struct PostForm {
    csrf: Option<String>,
    channel: String,
    topic: String,
    body: String,
    /// A checkbox: present (`on`) when ticked.
    create_topic: Option<String>,
    idempotency_key: Option<String>,
}

async fn post_message(State(console): State<Shared>, headers: HeaderMap, Form(form): Form<PostForm>) -> Response {
    let session = match acting(&console, &headers, form.csrf.as_deref()) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let request = PostRequest {
        channel: form.channel.trim().trim_start_matches('#').to_owned(),
        topic: form.topic.trim().to_owned(),
        body: form.body,
        create_topic: form.create_topic.is_some(),
        // The form's own key: a double submit (or a retry after a timeout) posts once.
        idempotency_key: form.idempotency_key.filter(|k| !k.is_empty()),
        ack_only: false,
        wake: false,
    };
    let posted = call::<method::MessagesPost>(&console, &session, &request).await;
    outcome(posted.map(|r| pages::posted(&r)), "Posted")
}

/// The most pages of open issues (200 each) the board reads; past them it asks for a filter.
const OPEN_PAGES: usize = 10;
#[derive(Deserialize)]
struct BoardQuery {
    subtree: Option<String>,
    owner: Option<String>,
    label: Option<String>,
}

/// A form or query value, trimmed; `None` when empty. A handle may be typed as `@name`.
fn given(value: &str) -> Option<String> {
    Some(value.trim().trim_start_matches('@').to_owned()).filter(|v| !v.is_empty())
}

/// An issue number typed in a path or a form (`3` or `#3`), or the refusal the API would give.
fn issue_number(field: &'static str, text: &str) -> Result<u64, CallError> {
    canopy_core::issues::parse_number(field, text).map_err(|e| CallError::Refused((&e).into()))
}

/// The board's list request for `state` (none: every issue not closed), from `after` on.
fn list_request(filter: &IssueFilter, state: Option<IssueState>, after: Option<u64>) -> IssuesListRequest {
    IssuesListRequest {
        state,
        owner: given(&filter.owner),
        subtree: given(&filter.subtree),
        label: given(&filter.label),
        include_closed: false,
        after,
        newest: false,
        before: None,
        limit: Some(200),
    }
}

/// Up to `pages` pages of what `request` lists, from its `after` on; true when more remain.
async fn read_issues(
    console: &Console,
    session: &Session,
    mut request: IssuesListRequest,
    pages: usize,
) -> Result<(Vec<IssueSummary>, bool), CallError> {
    let mut issues = Vec::new();
    for _ in 0..pages {
        let page = call::<method::IssuesList>(console, session, &request).await?;
        issues.extend(page.issues);
        match page.next_after {
            // A page that does not move the cursor ends the read (nothing more can come of it).
            Some(next) if Some(next) != request.after => request.after = Some(next),
            _ => return Ok((issues, false)),
        }
    }
    Ok((issues, true))
}

/// The newest `CLOSED_SHOWN` issues in the closed `state`, newest first, and whether others
/// exist: one page, newest first.
async fn newest_closed(
    console: &Console,
    session: &Session,
    filter: &IssueFilter,
    state: IssueState,
) -> Result<(Vec<IssueSummary>, bool), CallError> {
    let request =
        IssuesListRequest { newest: true, limit: Some(CLOSED_SHOWN as u32), ..list_request(filter, Some(state), None) };
    let page = call::<method::IssuesList>(console, session, &request).await?;
    Ok((page.issues, page.next_after.is_some()))
}

/// The handles the forms offer: every agent's. Not read on a live refresh (the list is outside
/// the live regions).
async fn handles(console: &Console, session: &Session, live: bool) -> Result<Vec<canopy_core::Handle>, CallError> {
    match live {
        true => Ok(Vec::new()),
        false => Ok(roster(console, session).await?.into_iter().map(|a| a.handle).collect()),
    }
}

async fn issues_board(
    State(console): State<Shared>,
    LoggedIn(_, session): LoggedIn,
    headers: HeaderMap,
    Query(query): Query<BoardQuery>,
) -> Response {
    let live = headers.contains_key(LIVE_HEADER);
    let filter = IssueFilter {
        subtree: given(query.subtree.as_deref().unwrap_or("")).unwrap_or_default(),
        owner: given(query.owner.as_deref().unwrap_or("")).unwrap_or_default(),
        label: query.label.unwrap_or_default().trim().to_owned(),
    };
    let body = async {
        let (open, open_capped) =
            read_issues(&console, &session, list_request(&filter, None, None), OPEN_PAGES).await?;
        let mut closed = Vec::new();
        for state in [IssueState::Done, IssueState::Wontdo] {
            let (issues, others) = newest_closed(&console, &session, &filter, state).await?;
            closed.push((state, issues, others));
        }
        let handles = handles(&console, &session, live).await?;
        let board = Board { open, open_capped, closed };
        Ok(issue_pages::board(&board, &filter, &handles, canopy_sys::unix_ms(), &session.csrf))
    }
    .await;
    page(&session, "Issues", body)
}

async fn issue(
    State(console): State<Shared>,
    LoggedIn(_, session): LoggedIn,
    headers: HeaderMap,
    Path(number): Path<String>,
) -> Response {
    let live = headers.contains_key(LIVE_HEADER);
    let body = async {
        let number = issue_number("issue", &number)?;
        let detail = call::<method::IssuesShow>(&console, &session, &IssuesShowRequest { issue: number }).await?;
        let handles = handles(&console, &session, live).await?;
        let title = format!("#{number} {}", detail.issue.title);
        Ok((title, issue_pages::issue(&detail, &handles, canopy_sys::unix_ms(), &session.csrf)))
    }
    .await;
    match body {
        Ok((title, markup)) => pages::page(&title, &session, markup).into_response(),
        Err(e) => failed(&session, &format!("#{}", number.trim_start_matches('#')), &e),
    }
}

/// A textarea's text as typed: browsers send its line breaks as CRLF.
fn typed(text: &str) -> String {
    text.replace("\r\n", "\n")
}

#[derive(Deserialize)]
struct FileForm {
    csrf: Option<String>,
    #[serde(default)]
    title: String,
    #[serde(default)]
    body: String,
    /// The handle to assign it to; empty: nobody (the Supervisor triages it).
    #[serde(default)]
    owner: String,
    /// Comma-separated.
    #[serde(default)]
    labels: String,
    /// `N` or `#N`; empty: not a sub-issue.
    #[serde(default)]
    parent: String,
}

async fn file_issue(State(console): State<Shared>, headers: HeaderMap, Form(form): Form<FileForm>) -> Response {
    let session = match acting(&console, &headers, form.csrf.as_deref()) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let parent = match form.parent.trim() {
        "" => None,
        text => match issue_number("parent", text) {
            Ok(n) => Some(n),
            Err(e) => return outcome(Err(e), "Filed"),
        },
    };
    // The same form sent twice in one session (a double click, a resent request) files once.
    let key = filing_key(&session.csrf, &[&form.title, &form.body, &form.owner, &form.labels, &form.parent]);
    let request = IssuesCreateRequest {
        title: form.title,
        body: typed(&form.body),
        owner: given(&form.owner),
        parent,
        labels: form.labels.split(',').map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect(),
        depends_on: Vec::new(),
        idempotency_key: Some(key),
    };
    let filed = call::<method::IssuesCreate>(&console, &session, &request).await;
    outcome(filed.map(|i| issue_pages::filed(&i)), "Filed")
}

/// An idempotency key for a filing: the session's and the form's words, digested.
fn filing_key(session: &str, fields: &[&str]) -> String {
    let words: Vec<&str> = std::iter::once(session).chain(fields.iter().copied()).collect();
    format!("console-{}", crate::auth::digest(&words.join("\0")))
}

#[derive(Deserialize)]
struct AssignForm {
    csrf: Option<String>,
    #[serde(default)]
    owner: String,
    #[serde(default)]
    note: String,
}

async fn assign_issue(
    State(console): State<Shared>,
    headers: HeaderMap,
    Path(number): Path<String>,
    Form(form): Form<AssignForm>,
) -> Response {
    let session = match acting(&console, &headers, form.csrf.as_deref()) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let assigned = async {
        let issue = issue_number("issue", &number)?;
        let owner = given(&form.owner).unwrap_or_default();
        let request = IssuesAssignRequest { issue, owner, note: given(&form.note) };
        call::<method::IssuesAssign>(&console, &session, &request).await
    }
    .await;
    outcome(assigned.map(|i| issue_pages::assigned(&i)), "Assigned")
}

#[derive(Deserialize)]
struct CommentForm {
    csrf: Option<String>,
    #[serde(default)]
    text: String,
}

async fn comment_issue(
    State(console): State<Shared>,
    headers: HeaderMap,
    Path(number): Path<String>,
    Form(form): Form<CommentForm>,
) -> Response {
    let session = match acting(&console, &headers, form.csrf.as_deref()) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let commented = async {
        let issue = issue_number("issue", &number)?;
        let request = IssuesCommentRequest { issue, text: typed(&form.text) };
        call::<method::IssuesComment>(&console, &session, &request).await
    }
    .await;
    outcome(commented.map(|i| issue_pages::commented(&i)), "Commented")
}

#[cfg(test)]
mod tests {
    use super::{public_hosts, public_origin};

    #[test]
    fn a_public_url_is_the_host_and_origin_browsers_send() {
        assert_eq!(public_hosts("https://canopy.lan"), ["canopy.lan", "canopy.lan:443"]);
        assert_eq!(public_hosts("https://canopy.lan:443/"), ["canopy.lan:443", "canopy.lan"]);
        assert_eq!(public_hosts("https://canopy.lan:8443"), ["canopy.lan:8443"]);
        assert_eq!(public_hosts("http://[::1]:8080"), ["[::1]:8080"]);
        assert!(public_hosts("").is_empty());
        assert_eq!(public_origin("https://canopy.lan:443/").as_deref(), Some("https://canopy.lan"));
        assert_eq!(public_origin("http://127.0.0.1:8080").as_deref(), Some("http://127.0.0.1:8080"));
        assert_eq!(public_origin(""), None);
    }
}
