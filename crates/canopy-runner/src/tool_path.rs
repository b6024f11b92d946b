//! How a runner on another machine sends its sessions' tool calls (`HttpTools`): over HTTP to
//! the daemon's `/api/<method>` (its git listener, learned at sync), on kept-alive connections,
//! with the runner's login and the session's token; over NATS until the first sync said where,
//! or when that endpoint cannot be reached. The embedded runner calls the daemon in process.
//!
//! Owns the connections (a pool of idle HTTP/1.1 ones). Does not choose tokens or decode
//! replies: `canopy_bus::ApiClient` does, the same as for any other path.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use canopy_bus::Bus;
use canopy_bus::api::LocalApi;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

/// Most idle connections kept; more callers at once open more, closed after their call.
const IDLE: usize = 64;

/// The daemon's HTTP endpoint for tool calls, as the last sync named it.
#[derive(Clone)]
struct Endpoint {
    /// `host:port` to connect to, and the `Host` header.
    authority: String,
    authorization: String,
}

/// A session's tool calls over HTTP, NATS until then. Cheap to clone.
#[derive(Clone)]
pub struct HttpTools {
    bus: Bus,
    timeout: std::time::Duration,
    endpoint: Arc<Mutex<Option<Endpoint>>>,
    idle: Arc<Mutex<Vec<SendRequest<Full<Bytes>>>>>,
}

impl HttpTools {
    pub fn new(bus: Bus, timeout: std::time::Duration) -> HttpTools {
        HttpTools { bus, timeout, endpoint: Arc::default(), idle: Arc::default() }
    }

    /// Takes the daemon's endpoint (`http://host:port`) and this runner's login from a sync;
    /// an endpoint that is not plain `http://host:port` leaves calls on NATS.
    pub fn set(&self, url: &str, authorization: String) {
        let authority = url.strip_prefix("http://").map(|rest| rest.trim_end_matches('/').to_owned());
        let next = authority
            .filter(|a| !a.is_empty() && !a.contains('/'))
            .map(|authority| Endpoint { authority, authorization });
        if let Ok(mut endpoint) = self.endpoint.lock() {
            let moved = endpoint.as_ref().map(|e| &e.authority) != next.as_ref().map(|e| &e.authority);
            *endpoint = next;
            if moved && let Ok(mut idle) = self.idle.lock() {
                idle.clear();
            }
        }
    }

    async fn connection(&self, authority: &str) -> Result<SendRequest<Full<Bytes>>, String> {
        loop {
            let reused = self.idle.lock().ok().and_then(|mut idle| idle.pop());
            match reused {
                Some(sender) if sender.is_ready() => return Ok(sender),
                Some(_) => continue,
                None => break,
            }
        }
        let stream =
            tokio::net::TcpStream::connect(authority).await.map_err(|e| format!("connecting to {authority}: {e}"))?;
        // A call is a small write: sent at once, not after the peer's delayed acknowledgement.
        let _ = stream.set_nodelay(true);
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a tool-call connection to the daemon ended");
            }
        });
        Ok(sender)
    }

    /// The daemon's answer to one call over HTTP. An error is `Unsent` while nothing reached
    /// the daemon (a NATS retry cannot do the call twice), `Sent` once it may have.
    async fn post(&self, endpoint: &Endpoint, method: &str, token: &str, payload: Bytes) -> Result<Bytes, Failed> {
        let mut sender = self.connection(&endpoint.authority).await.map_err(Failed::Unsent)?;
        let request = http::Request::post(format!("/api/{method}"))
            .header(http::header::HOST, &endpoint.authority)
            .header(http::header::AUTHORIZATION, &endpoint.authorization)
            .header("canopy-token", token)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(payload))
            .map_err(|e| Failed::Unsent(e.to_string()))?;
        let response = sender.send_request(request).await.map_err(|e| Failed::Sent(e.to_string()))?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| Failed::Sent(e.to_string()))?.to_bytes();
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < IDLE
        {
            idle.push(sender);
        }
        match status.is_success() {
            true => Ok(body),
            // Refused before the API ran (the login, the method, the size): NATS may try.
            false => Err(Failed::Unsent(format!("HTTP {status}: {}", String::from_utf8_lossy(&body).trim()))),
        }
    }
}

/// How a call over HTTP failed.
enum Failed {
    /// Before the daemon could have run it.
    Unsent(String),
    /// After it may have.
    Sent(String),
}

impl LocalApi for HttpTools {
    fn handle(&self, subject: String, token: String, payload: Bytes) -> Pin<Box<dyn Future<Output = Bytes> + Send>> {
        let tools = self.clone();
        Box::pin(async move {
            let endpoint = tools.endpoint.lock().ok().and_then(|e| e.clone());
            let method = subject.rsplit_once(".api.").map(|(_, m)| m.to_owned()).unwrap_or_default();
            if let Some(endpoint) = endpoint {
                let posted =
                    tokio::time::timeout(tools.timeout, tools.post(&endpoint, &method, &token, payload.clone()));
                match posted.await {
                    Ok(Ok(reply)) => return reply,
                    Ok(Err(Failed::Unsent(e))) => {
                        tracing::warn!(error = %e, %method, "a tool call over HTTP could not be sent; sending it over NATS");
                    }
                    // It may have run: sent again it could run twice (a message posted twice).
                    Ok(Err(Failed::Sent(e))) => return unreachable_reply(&format!("the call over HTTP failed: {e}")),
                    Err(_) => return unreachable_reply(&format!("no answer over HTTP within {:?}", tools.timeout)),
                }
            }
            match tools.bus.request(&subject, Some(&token), payload, tools.timeout).await {
                Ok(reply) => reply,
                Err(e) => unreachable_reply(&e.to_string()),
            }
        })
    }
}

/// The reply a call gets when the daemon could not be reached either way.
fn unreachable_reply(why: &str) -> Bytes {
    let error = canopy_core::Error::Unavailable(format!("the daemon could not be reached: {why}"));
    let reply = canopy_proto::Reply::<()>::Error(canopy_proto::WireError::from(&error));
    Bytes::from(serde_json::to_vec(&reply).unwrap_or_default())
}
