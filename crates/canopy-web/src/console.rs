//! What every console handler shares: the `Console` (API client, browser sessions, stop
//! token, the hosts and origins it answers to, the audit hook), the logged-in session of a
//! request, and the one way a handler calls the API (with the session's operator token,
//! ending the sessions of a token the API no longer accepts).
//!
//! Below both `server` (routes and actions) and `live` (the event feed), so neither imports
//! the other. Does not route requests or render pages beyond the login-needed answer.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use canopy_bus::{ApiClient, CallError};
use canopy_proto::ApiMethod;
use tokio_util::sync::CancellationToken;

use crate::SESSION_COOKIE;
use crate::auth::{Auth, Session, cookie};
use crate::pages;

/// A request refused before any API call (no session, no CSRF token): the answer to send.
pub type Refusal = Box<Response>;

/// Records a line in the daemon's audit log: an action (`console.login_failed`) and what
/// happened. The daemon gives it; the console holds no store access of its own.
pub type AuditHook = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// What every handler shares.
pub struct Console {
    pub api: ApiClient,
    pub auth: Auth,
    pub stop: CancellationToken,
    /// `host:port` values a request's `Host` (and a POST's `Origin`) may carry.
    pub hosts: Vec<String>,
    /// With TLS: the certificate (a `Host` it names, on this port, is this console too).
    pub tls: Option<rustls::pki_types::CertificateDer<'static>>,
    /// The port the console listens on.
    pub port: u16,
    /// `[web] public_url` as a browser's `Origin` names it (`https://canopy.lan`).
    pub public_origin: Option<String>,
    pub audit: AuditHook,
    /// Failed logins per address.
    pub limiter: crate::auth::Limiter,
}

impl Console {
    /// Whether a request's `Host` names this console: a loopback form, the listening address,
    /// `[web] public_url`, or with TLS any name its certificate carries, on its port (a host
    /// without a port is on the scheme's default one, as browsers send it).
    pub fn host_ok(&self, host: &str) -> bool {
        if self.hosts.iter().any(|h| h == host) {
            return true;
        }
        let Some(cert) = &self.tls else { return false };
        let (name, port) = match host.rsplit_once(':').filter(|(_, p)| !p.ends_with(']')) {
            Some((name, port)) => (name, port.parse::<u16>().ok()),
            None => (host, Some(443)),
        };
        port == Some(self.port) && crate::tls::names(cert, name)
    }

    /// Whether a POST's `Origin` is this console's: `[web] public_url`'s origin (a proxy in
    /// front may speak another scheme), or the scheme it speaks with a host it answers.
    pub fn origin_ok(&self, origin: &str) -> bool {
        if self.public_origin.as_deref() == Some(origin) {
            return true;
        }
        let scheme = if self.tls.is_some() { "https://" } else { "http://" };
        origin.strip_prefix(scheme).is_some_and(|host| self.host_ok(host))
    }
}

pub type Shared = Arc<Console>;

/// The logged-in session of a request, or the page that says how to log in.
pub fn logged_in(console: &Console, headers: &HeaderMap) -> Result<(String, Session), Refusal> {
    let id = cookie(headers, SESSION_COOKIE).unwrap_or("");
    match console.auth.session(id) {
        Some(session) => Ok((id.to_owned(), session)),
        None => Err(Box::new((StatusCode::UNAUTHORIZED, pages::login_needed()).into_response())),
    }
}

/// A page request's logged-in session (the session id, and the session): the login page
/// when there is none.
pub struct LoggedIn(pub String, pub Session);

impl axum::extract::FromRequestParts<Shared> for LoggedIn {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut http::request::Parts, console: &Shared) -> Result<LoggedIn, Response> {
        logged_in(console, &parts.headers).map(|(id, session)| LoggedIn(id, session)).map_err(|r| *r)
    }
}

/// One API call with the session's token. A refusal that turns out to be the token's (a
/// revoked operator) ends every console session holding it, at once.
pub async fn call<M: ApiMethod>(
    console: &Console,
    session: &Session,
    request: &M::Request,
) -> Result<M::Response, CallError> {
    let answer = console.api.send::<M>(&session.token, request).await;
    if let Err(CallError::Refused(e)) = &answer
        && e.code == canopy_core::ErrorCode::Forbidden
        && token_refused(console, &session.token).await
    {
        console.auth.end_token(&session.token);
    }
    answer
}

/// Whether the API no longer accepts `token` at all (`whoami` is forbidden; a passing failure,
/// such as a daemon shutting down, is not a revocation).
pub async fn token_refused(console: &Console, token: &str) -> bool {
    let whoami = canopy_proto::api::WhoamiRequest {};
    matches!(
        console.api.send::<canopy_proto::method::Whoami>(token, &whoami).await,
        Err(CallError::Refused(e)) if e.code == canopy_core::ErrorCode::Forbidden
    )
}
