//! Request routing: from a subject and raw payload to reply bytes, through the dispatch the
//! method table generates, and authentication (an account's token, or the runner token).
//!
//! Every request goes the same way: authenticate the token, decode the payload strictly as
//! the table's request type, then the area's handler (`agents`, `messages`, `sessions`,
//! `gate`, `prompt_api`, `continuity`, `delivery`), which parses names at the edge, checks
//! sizes, makes one store call, and publishes after the commit. Nothing here panics on
//! input: every failure is a typed `Error` in the reply. Holds no handler of its own.

use bytes::Bytes;
use canopy_core::acl::Caller;
use canopy_core::{Error, RunnerId};
use canopy_proto::api::*;
use canopy_proto::{Method, decode_request};
use canopy_store::ops;

use crate::auth::token_hash;
use crate::context::{Api, ok, refusal};

/// The dispatch, generated from the method table (`canopy_proto::api_methods!`): a runner
/// method needs a runner credential; an operator method an operator's token; any other an
/// account's token that passes the per-role tool check. Then the request is decoded as the
/// table's request type and handed to the handler the table names, whose response must be the
/// table's response type. The table's access is checked here and nowhere else.
macro_rules! dispatch {
    (@call $api:ident, Runner, $handler:ident, $req:ty, $resp:ty, $token:ident, $payload:ident, $method:ident) => {{
        let runner = $api.authenticate_runner($token)?;
        let request: $req = decode_request($payload)?;
        let response: $resp = $api.$handler(runner, request).await?;
        ok(response)
    }};
    (@call $api:ident, Operators, $handler:ident, $req:ty, $resp:ty, $token:ident, $payload:ident, $method:ident) => {{
        let caller = $api.authenticate($token).await?;
        canopy_core::acl::require_operator(&caller, $method.as_str())?;
        let request: $req = decode_request($payload)?;
        let response: $resp = $api.$handler(caller, request).await?;
        ok(response)
    }};
    (@call $api:ident, Anyone, $handler:ident, $req:ty, $resp:ty, $token:ident, $payload:ident, $method:ident) => {{
        let caller = $api.authenticate($token).await?;
        $api.check_tool(&caller, $method).await?;
        let request: $req = decode_request($payload)?;
        let response: $resp = $api.$handler(caller, request).await?;
        ok(response)
    }};
    ($(($variant:ident, $handler:ident, $name:literal, $req:ty => $resp:ty, $access:ident, $who:literal, $what:literal, $tool:expr)),* $(,)?) => {
        impl Api {
            async fn dispatch(&self, method: &str, token: Option<&str>, payload: &[u8]) -> Result<Bytes, Error> {
                let api = self;
                let method = Method::parse(method).ok_or_else(|| Error::UnknownMethod { method: method.to_owned() })?;
                match method {
                    $(Method::$variant => dispatch!(@call api, $access, $handler, $req, $resp, token, payload, method),)*
                }
            }
        }
    };
}
canopy_proto::api_methods!(dispatch);

/// Most session tokens kept resolved at once (a workspace runs far fewer live sessions).
const SESSION_TOKENS_CACHED: usize = 100_000;
impl Api {
    /// Handles one request and returns the reply payload.
    pub async fn handle(&self, subject: &str, token: Option<&str>, payload: &[u8]) -> Bytes {
        let method = self.subjects.api_suffix(subject).unwrap_or(subject);
        match self.dispatch(method, token, payload).await {
            Ok(bytes) => bytes,
            Err(err) => {
                tracing::debug!(method, code = %err.code(), error = %err, "request refused");
                refusal(&err)
            }
        }
    }

    pub(crate) async fn authenticate(&self, token: Option<&str>) -> Result<Caller, Error> {
        let token = token.ok_or_else(|| Error::Unauthenticated("the request has no Canopy-Token header".into()))?;
        let hash = token_hash(token);
        if let Some(caller) = self.operators.find(&hash) {
            return Ok(caller);
        }
        let credentials = self.store.credential_epoch();
        if let Some(hit) = self.session_tokens.get(&hash)
            && hit.1 == credentials
        {
            return Ok(hit.0.clone());
        }
        let key = hash.clone();
        let epoch = self.revocations.load(std::sync::atomic::Ordering::SeqCst);
        let resolved = self.store.read(move |conn| ops::resolve_token(conn, &key)).await?;
        let Some(caller) = resolved else {
            self.session_tokens.remove(&hash);
            return Err(Error::Unauthenticated("the token is not known to this workspace".into()));
        };
        if caller.kind == canopy_core::AccountKind::Agent {
            // Kept only if no session or account changed while it was read.
            if self.store.credential_epoch() == credentials {
                if self.session_tokens.len() >= SESSION_TOKENS_CACHED {
                    self.session_tokens.clear();
                }
                self.session_tokens.insert(hash, (caller.clone(), credentials));
            }
            return Ok(caller);
        }
        if caller.is_operator() {
            self.operators.insert(hash.clone(), caller.clone());
            // A revocation that landed meanwhile may have read the cache before this entry.
            if self.revocations.load(std::sync::atomic::Ordering::SeqCst) != epoch {
                self.operators.remove(&hash);
            }
        }
        Ok(caller)
    }

    /// The runner a runner token belongs to.
    pub(crate) fn authenticate_runner(&self, token: Option<&str>) -> Result<RunnerId, Error> {
        let Some(token) = token else {
            return Err(Error::Unauthenticated("the request has no Canopy-Token header".into()));
        };
        let hash = token_hash(token);
        let runners =
            self.secrets.runners.read().map_err(|_| Error::Internal("the runner tokens are poisoned".into()))?;
        runners.get(&hash).cloned().ok_or_else(|| Error::Unauthenticated("this method needs a runner's token".into()))
    }
}
