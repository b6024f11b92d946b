//! The tools as streamable HTTP on loopback, with bearer tokens checked first.
//!
//! A request without a bearer token, or with one the `TokenCheck` does not know, gets a
//! 401 before MCP parses it; a known token is passed to the tool calls, which present it
//! to the daemon. One listener serves every session of a runner; a plain `tools/call` takes
//! the direct path (`direct.rs`), everything else rmcp's streamable-HTTP service.
//! `serve_fixed` (feature `testing`) is the same front answering a fixed body, the raw
//! baseline of `canopy-bench`'s MCP figure.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use crate::CanopyTools;
use crate::bearer::bearer;

/// Decides whether a bearer token belongs to a session this endpoint serves.
pub type TokenCheck = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The path the MCP endpoint is served on.
pub const MCP_PATH: &str = "/mcp";

/// A running HTTP endpoint.
#[derive(Debug)]
pub struct HttpEndpoint {
    pub addr: SocketAddr,
    pub url: String,
    stop: CancellationToken,
}

impl HttpEndpoint {
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for HttpEndpoint {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Binds 127.0.0.1 on a free port and serves Canopy's tools until stopped: a plain
/// `tools/call` by the direct path (`direct.rs`), everything else by rmcp.
pub async fn serve(tools: CanopyTools, check: TokenCheck) -> std::io::Result<HttpEndpoint> {
    serve_handler(tools.clone(), Some(tools), check).await
}

/// Serves `tools` (`probe::NoTools` for `canopy doctor`) over rmcp's streamable HTTP, with
/// the direct path to `direct` when given.
pub async fn serve_handler<S>(tools: S, direct: Option<CanopyTools>, check: TokenCheck) -> std::io::Result<HttpEndpoint>
where
    S: rmcp::ServerHandler + Clone + Send + Sync + 'static,
{
    let stop = CancellationToken::new();
    let config = StreamableHttpServerConfig::default()
        .with_cancellation_token(stop.child_token())
        .with_allowed_hosts(crate::direct::ALLOWED_HOSTS)
        .with_sse_keep_alive(None)
        // Stateless, answering in plain JSON: no session worker between a request and its
        // tool call, and no event stream to frame (the tools send no notifications). The bearer
        // token, not an MCP session, says who calls. `docs/decisions.md`, Performance.
        .with_legacy_session_mode(false)
        .with_json_response(true);
    let mcp = StreamableHttpService::new(move || Ok(tools.clone()), LocalSessionManager::default().into(), config);
    listen(stop, check, move |request: http::Request<Incoming>| {
        let (mut mcp, direct) = (mcp.clone(), direct.clone());
        async move {
            let (parts, body) = request.into_parts();
            let body = match direct {
                Some(tools) if crate::direct::eligible(&parts) => {
                    let bytes = match Limited::new(body, crate::direct::MAX_BODY as usize).collect().await {
                        Ok(collected) => collected.to_bytes(),
                        // rmcp's answer to a body it cannot read (`expect_json`).
                        Err(e) => {
                            let text = format!("Failed to read request body: {e}");
                            return respond(http::StatusCode::INTERNAL_SERVER_ERROR, None, text.into());
                        }
                    };
                    if let Some(call) = crate::direct::parse(&bytes) {
                        let token = bearer(&parts.headers).unwrap_or_default();
                        let result = tools.call(Some(token), &call.params.name, call.params.arguments).await;
                        return match crate::direct::encode(call.id, result) {
                            Ok(answer) => respond(http::StatusCode::OK, Some("application/json"), answer.into()),
                            Err(e) => respond(
                                http::StatusCode::INTERNAL_SERVER_ERROR,
                                Some("text/plain; charset=utf-8"),
                                format!("Internal Server Error: encoding a tool result: {e}").into(),
                            ),
                        };
                    }
                    Either::Right(Full::new(bytes))
                }
                _ => Either::Left(body),
            };
            match mcp.call(http::Request::from_parts(parts, body)).await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        }
    })
    .await
}

/// The same front as `serve` (listener, `TCP_NODELAY`, bearer check, HTTP/1.1 keep-alive)
/// answering every authorized request with `answer` once its body is read: the raw baseline
/// `canopy-bench` measures an MCP tool call against. Serves nothing else. Benchmark
/// scaffolding: only with the `testing` feature, never in the shipped binary.
#[cfg(feature = "testing")]
pub async fn serve_fixed(
    answer: Bytes,
    content_type: &'static str,
    check: TokenCheck,
) -> std::io::Result<HttpEndpoint> {
    listen(CancellationToken::new(), check, move |request: http::Request<Incoming>| {
        let answer = answer.clone();
        async move {
            // The body is read only to time what a real call reads; a broken one still gets the
            // fixed answer, as the baseline measures the front and not the request.
            let _ = request.into_body().collect().await;
            respond(http::StatusCode::OK, Some(content_type), answer)
        }
    })
    .await
}

/// The accept loop every endpoint shares: each connection is HTTP/1.1 with `TCP_NODELAY`, and
/// a request without a known bearer token gets a 401 before `handle` sees it.
async fn listen<H, F>(stop: CancellationToken, check: TokenCheck, handle: H) -> std::io::Result<HttpEndpoint>
where
    H: Fn(http::Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<BoxBody<Bytes, Infallible>>> + Send + 'static,
{
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let accept_stop = stop.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                () = accept_stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting an MCP connection");
                        continue;
                    }
                },
            };
            // A tool result is a small write after the response head: with Nagle on, it waits
            // for the client's delayed ACK of the head (40 ms on Linux) on a kept-alive
            // connection, which is how every harness calls. Small writes go out at once.
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY on an MCP connection");
            }
            let (handle, check, conn_stop) = (handle.clone(), check.clone(), accept_stop.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
                    let known = bearer(request.headers()).is_some_and(|token| check(token));
                    let answer = known.then(|| handle(request));
                    async move {
                        Ok::<_, Infallible>(match answer {
                            Some(answer) => answer.await,
                            None => unauthorized(),
                        })
                    }
                });
                let connection =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    () = conn_stop.cancelled() => {}
                    result = connection => {
                        if let Err(e) = result {
                            tracing::debug!(error = %e, "MCP connection ended");
                        }
                    }
                }
            });
        }
    });
    Ok(HttpEndpoint { addr, url: format!("http://{addr}{MCP_PATH}"), stop })
}

/// A response with `body` and, when given, its content type.
fn respond(
    status: http::StatusCode,
    content_type: Option<&'static str>,
    body: Bytes,
) -> http::Response<BoxBody<Bytes, Infallible>> {
    let mut response = http::Response::new(Full::new(body).boxed());
    *response.status_mut() = status;
    if let Some(content_type) = content_type {
        response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    }
    response
}

fn unauthorized() -> http::Response<BoxBody<Bytes, Infallible>> {
    let body = r#"{"error":{"code":"forbidden","message":"missing or unknown bearer token"}}"#;
    let mut response =
        respond(http::StatusCode::UNAUTHORIZED, Some("application/json"), Bytes::from_static(body.as_bytes()));
    response.headers_mut().insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
    response
}
