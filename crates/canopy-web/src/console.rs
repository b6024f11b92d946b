//! What every console handler shares: the `Console` (API client, browser sessions, stop
//! token, the hosts it answers to), the logged-in session of a request, and the one way a
//! handler calls the API (with the session's operator token).
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

/// What every handler shares.
pub struct Console {
    pub api: ApiClient,
    pub auth: Auth,
    pub stop: CancellationToken,
    /// `host:port` values a request's `Host` (and a POST's `Origin`) may carry.
    pub hosts: Vec<String>,
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

/// One API call with the session's token.
pub async fn call<M: ApiMethod>(
    console: &Console,
    session: &Session,
    request: &M::Request,
) -> Result<M::Response, CallError> {
    console.api.send::<M>(&session.token, request).await
}
