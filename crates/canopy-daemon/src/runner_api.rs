//! Tool calls from runners on other machines over HTTP (`/api/<method>` on the daemon's git
//! listener): the runner's tool server sends a session's call here instead of through
//! `nats-server`, the same request bytes the API takes over NATS, answered by the same
//! in-process handler with the same authentication.
//!
//! Why a second path ([decision](../../../docs/decisions.md#runners-on-other-machines)): a
//! NATS request round trip alone costs about 2.3 times the HTTP echo on loopback, so a tool
//! call through it cannot stay within 3 times; one HTTP hop on a kept-alive connection can.
//! A request needs the runner's login (HTTP Basic: its id and token, as for git) and a
//! session's token (`Canopy-Token`), and only the tool methods and `whoami` are served: a
//! runner's own methods stay on NATS. Does not decide anything the API does not.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use canopy_bus::api::LocalApi;
use canopy_git::http::{Body, OTHER_PREFIX, Other, text};
use canopy_proto::{Method, Subjects};
use http_body_util::{BodyExt, Full, Limited};

use crate::auth::Auth;

/// The handler `canopy_git::http::serve` routes `/api/` to.
pub fn handler(local: Arc<dyn LocalApi>, auth: Auth, subjects: Subjects, max_body: usize) -> Other {
    Arc::new(move |request, peer| {
        let (local, auth, subjects) = (local.clone(), auth.clone(), subjects.clone());
        Box::pin(async move { answer(request, peer, local.as_ref(), &auth, &subjects, max_body).await })
    })
}

async fn answer(
    request: http::Request<hyper::body::Incoming>,
    peer: SocketAddr,
    local: &dyn LocalApi,
    auth: &Auth,
    subjects: &Subjects,
    max_body: usize,
) -> http::Response<Body> {
    let method = request.uri().path().strip_prefix(OTHER_PREFIX).and_then(Method::parse);
    let Some(method) = method.filter(|m| m.tool().is_some() || *m == Method::Whoami) else {
        return text(http::StatusCode::NOT_FOUND, "not a tool method");
    };
    if request.method() != http::Method::POST {
        return text(http::StatusCode::METHOD_NOT_ALLOWED, "tool calls are POSTs");
    }
    let runner = canopy_git::http::basic_login(request.headers())
        .and_then(|(user, password)| auth.authenticate_runner(Some(&password)).ok().filter(|r| r.as_str() == user));
    if runner.is_none() {
        tracing::debug!(%peer, "a tool call without a runner's login");
        let mut refused = text(http::StatusCode::UNAUTHORIZED, "a runner's login is required");
        refused
            .headers_mut()
            .insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Basic realm=\"canopy\""));
        return refused;
    }
    let token = request.headers().get("canopy-token").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let payload = match Limited::new(request.into_body(), max_body).collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return text(http::StatusCode::PAYLOAD_TOO_LARGE, &format!("the request body: {e}")),
    };
    let reply: Bytes = local.handle(subjects.api(method), token, payload).await;
    let mut response = http::Response::new(Full::new(reply).map_err(|never| match never {}).boxed());
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}
