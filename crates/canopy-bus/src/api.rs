//! A typed client of the daemon's API: one method call is one NATS request carrying the
//! caller's token, and the reply is decoded into the method's response or its wire error.
//!
//! Used by the CLI (operator token), the runner (runner token) and the native tools
//! (session tokens). Does not choose tokens: each call names its own.

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

/// Calls the daemon's API for one workspace.
#[derive(Debug, Clone)]
pub struct ApiClient {
    pub bus: Bus,
    pub subjects: Subjects,
    pub timeout: Duration,
}

impl ApiClient {
    pub fn new(bus: Bus, subjects: Subjects, timeout: Duration) -> ApiClient {
        ApiClient { bus, subjects, timeout }
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

    /// The whole roster `request` selects, every page of it (`after` the last handle of each
    /// while the daemon says `more`): one page is at most `MAX_OPERATOR_PAGE` entries.
    pub async fn roster_all(
        &self,
        token: &str,
        mut request: canopy_proto::api::RosterRequest,
    ) -> Result<canopy_proto::api::RosterResponse, CallError> {
        let mut all = Vec::new();
        loop {
            let page = self.send::<canopy_proto::method::Roster>(token, &request).await?;
            request.after = page.agents.last().map(|a| a.handle.to_string());
            all.extend(page.agents);
            if page.more == 0 || request.after.is_none() {
                return Ok(canopy_proto::api::RosterResponse { agents: all, more: 0 });
            }
        }
    }

    /// Every agent account, page by page (`after` the last handle while the daemon says `more`).
    pub async fn agents_all(&self, token: &str) -> Result<canopy_proto::api::AgentsListResponse, CallError> {
        let mut request = canopy_proto::api::AgentsListRequest::default();
        let mut all = Vec::new();
        loop {
            let page = self.send::<canopy_proto::method::AgentsList>(token, &request).await?;
            request.after = page.agents.last().map(|a| a.handle.to_string());
            all.extend(page.agents);
            if page.more == 0 || request.after.is_none() {
                return Ok(canopy_proto::api::AgentsListResponse { agents: all, more: 0 });
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
        let reply = self
            .bus
            .request(&subject, Some(token), Bytes::from(payload), self.timeout)
            .await
            .map_err(|e| CallError::Unreachable(e.to_string()))?;
        let reply: Reply<Resp> = serde_json::from_slice(&reply).map_err(|e| {
            CallError::Unreachable(format!("the daemon's reply to {} did not parse: {e}", method.as_str()))
        })?;
        reply.into_result().map_err(CallError::Refused)
    }
}
