//! A typed client of the daemon's API: one method call is one NATS request carrying the
//! caller's token, and the reply is decoded into the method's response or its wire error.
//! A client in the daemon's own process (the embedded runner, the console) may instead hand
//! the same request bytes to the daemon's handler directly (`LocalApi`): the same subject,
//! token and payload, the same authentication and decoding, without the two trips through
//! `nats-server`.
//!
//! Used by the CLI (operator token), the runner (runner token) and the native tools
//! (session tokens). Does not choose tokens: each call names its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use canopy_proto::{ApiMethod, Method, Reply, Subjects, WireError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::client::Bus;

/// Why a call did not produce a response.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The daemon answered with a refusal.
    #[error("{0}")]
    Refused(WireError),
    /// The daemon could not be reached (or its reply could not be read).
    #[error("{0}")]
    Unreachable(String),
}

/// The daemon's request handler, reached in its own process: answers what a NATS request on
/// `subject` carrying `token` and `payload` would be answered, as the reply's bytes. The
/// handler must finish a request whose caller stopped waiting, as it does one that came
/// over NATS.
pub trait LocalApi: Send + Sync {
    fn handle(&self, subject: String, token: String, payload: Bytes) -> Pin<Box<dyn Future<Output = Bytes> + Send>>;
}

/// Calls the daemon's API for one workspace.
#[derive(Clone)]
pub struct ApiClient {
    pub bus: Bus,
    pub subjects: Subjects,
    pub timeout: Duration,
    /// The daemon's handler in this process, when there is one: calls skip NATS.
    local: Option<Arc<dyn LocalApi>>,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClient")
            .field("subjects", &self.subjects)
            .field("timeout", &self.timeout)
            .field("in_process", &self.local.is_some())
            .finish_non_exhaustive()
    }
}

impl ApiClient {
    pub fn new(bus: Bus, subjects: Subjects, timeout: Duration) -> ApiClient {
        ApiClient { bus, subjects, timeout, local: None }
    }

    /// The same client, calling the daemon's handler in this process instead of over NATS
    /// (its bus stays for what is not a call: subscriptions, doorbells, events).
    pub fn in_process(self, local: Arc<dyn LocalApi>) -> ApiClient {
        ApiClient { local: Some(local), ..self }
    }

    /// Whether calls go to the daemon's handler in this process.
    pub fn is_in_process(&self) -> bool {
        self.local.is_some()
    }

    /// The same client, waiting at most `timeout` for each reply (never longer than this one
    /// waits): for calls whose loss is better noticed at once than late.
    pub fn with_timeout(&self, timeout: Duration) -> ApiClient {
        ApiClient { timeout: self.timeout.min(timeout), ..self.clone() }
    }

    /// Calls method `M` with its request, authenticated by `token`: the method table's types
    /// make a call with the wrong request or response a compile error.
    pub async fn send<M: ApiMethod>(&self, token: &str, request: &M::Request) -> Result<M::Response, CallError> {
        self.call(M::METHOD, token, request).await
    }

    /// The whole roster `request` selects, every page of it: one page is at most
    /// `MAX_OPERATOR_PAGE` entries.
    pub async fn roster_all(
        &self,
        token: &str,
        request: canopy_proto::api::RosterRequest,
    ) -> Result<canopy_proto::api::RosterResponse, CallError> {
        let agents = self
            .every_page::<canopy_proto::method::Roster, _>(
                token,
                request,
                |r, after| r.after = after,
                |page| (page.agents, page.more),
                |a| a.handle.to_string(),
            )
            .await?;
        Ok(canopy_proto::api::RosterResponse { agents, more: 0 })
    }

    /// Every agent account, page by page.
    pub async fn agents_all(&self, token: &str) -> Result<canopy_proto::api::AgentsListResponse, CallError> {
        let agents = self
            .every_page::<canopy_proto::method::AgentsList, _>(
                token,
                canopy_proto::api::AgentsListRequest::default(),
                |r, after| r.after = after,
                |page| (page.agents, page.more),
                |a| a.handle.to_string(),
            )
            .await?;
        Ok(canopy_proto::api::AgentsListResponse { agents, more: 0 })
    }

    /// Calls `M` again `after` the last item's handle while the daemon says there are `more`.
    async fn every_page<M: ApiMethod, T>(
        &self,
        token: &str,
        mut request: M::Request,
        set_after: impl Fn(&mut M::Request, Option<String>),
        items: impl Fn(M::Response) -> (Vec<T>, u32),
        handle: impl Fn(&T) -> String,
    ) -> Result<Vec<T>, CallError> {
        let mut all = Vec::new();
        loop {
            let (page, more) = items(self.send::<M>(token, &request).await?);
            let after = page.last().map(&handle);
            all.extend(page);
            match after {
                Some(after) if more > 0 => set_after(&mut request, Some(after)),
                _ => return Ok(all),
            }
        }
    }

    /// Calls a method chosen at run time with a JSON request (the tool server's calls, whose
    /// arguments are already checked against the method's request type).
    pub async fn call_json(&self, method: Method, token: &str, request: &Value) -> Result<Value, CallError> {
        self.call(method, token, request).await
    }

    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: Method,
        token: &str,
        request: &Req,
    ) -> Result<Resp, CallError> {
        let payload =
            serde_json::to_vec(request).map_err(|e| CallError::Unreachable(format!("encoding the request: {e}")))?;
        let subject = self.subjects.api(method);
        let reply = match &self.local {
            Some(local) => {
                tokio::time::timeout(self.timeout, local.handle(subject, token.to_owned(), Bytes::from(payload)))
                    .await
                    .map_err(|_| {
                        CallError::Unreachable(format!(
                            "the daemon did not answer {} within {:?}",
                            method.as_str(),
                            self.timeout
                        ))
                    })?
            }
            None => self
                .bus
                .request(&subject, Some(token), Bytes::from(payload), self.timeout)
                .await
                .map_err(|e| CallError::Unreachable(e.to_string()))?,
        };
        let reply: Reply<Resp> = serde_json::from_slice(&reply).map_err(|e| {
            CallError::Unreachable(format!("the daemon's reply to {} did not parse: {e}", method.as_str()))
        })?;
        reply.into_result().map_err(CallError::Refused)
    }
}
