//! The daemon's shared request context: `Api` (the store, the bus, the configuration and
//! the caches every area's handlers use), the credentials it checks, the publish and poke
//! helpers every area shares, and the small validators and reply encoders.
//!
//! Every API area (`agents`, `messages`, `sessions`, `gate`, `prompt_api`, `continuity`,
//! `delivery`, `workspaces`) adds its handlers to `Api` in its own module and imports only this one, so
//! no two area modules import each other. Does not route requests (`handlers`) or hold SQL.

use bytes::Bytes;
use canopy_bus::Bus;
use canopy_core::Error;
use canopy_core::acl::Caller;
use canopy_proto::api::*;
use canopy_proto::{Reply, Subjects};
use canopy_store::Store;
use serde::Serialize;

use crate::roles::RoleDefaults;
use canopy_config::Config;

/// Longest display name, in bytes.
pub const MAX_DISPLAY_NAME: usize = 128;
/// Longest charter, in bytes.
pub const MAX_CHARTER: usize = 8192;
/// Longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 128;

/// Everything a handler needs. Cheap to clone into each request task.
#[derive(Clone, Debug)]
pub struct Api {
    pub store: Store,
    pub bus: Bus,
    pub subjects: Subjects,
    pub config: std::sync::Arc<Config>,
    pub roles: std::sync::Arc<RoleDefaults>,
    pub secrets: std::sync::Arc<Secrets>,
    /// Where relative script paths are read from.
    pub data_dir: std::path::PathBuf,
    /// Wakes between pairs of agents (in memory: a restart forgets recent loops).
    pub loops: std::sync::Arc<canopy_core::delivery::LoopGuard>,
    /// Operator token hash -> caller. Operator tokens never change while the daemon runs,
    /// so they are resolved once.
    pub operators: std::sync::Arc<crate::auth::OperatorTokens>,
    /// Session token hash -> (caller, the store's credential epoch it was resolved in). A
    /// session token dies with its session, so an entry holds only while no commit since has
    /// changed a session or an account (`Store::credential_epoch`).
    pub session_tokens: std::sync::Arc<dashmap::DashMap<String, (Caller, u64)>>,
    /// Moves at every revocation: a lookup that began before one does not fill the cache.
    pub revocations: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// The prompt bundle in use.
    pub prompts: std::sync::Arc<crate::prompts::Prompts>,
    /// Agent handle -> role (and run definition), for the per-role tool check.
    pub role_cache: std::sync::Arc<dashmap::DashMap<String, RoleOf>>,
    /// One credential change at a time, held until the server has reloaded.
    pub credentials_lock: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// The managed NATS server, reloaded when credentials change; `None` for an external one.
    pub nats: Option<std::sync::Arc<canopy_bus::ManagedNats>>,
    pub workspace_id: String,
    /// How git runs (confined in any checkout a session has written).
    pub git: std::sync::Arc<canopy_workspace::Git>,
    /// One task at a time changes a repository's mirror, by repository name.
    pub repo_locks: std::sync::Arc<dashmap::DashMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>>,
    /// Runs whose end is being summarised (their checkout read, their check run).
    pub finishing: std::sync::Arc<dashmap::DashMap<i64, ()>>,
    /// One pass at a time makes the checkouts still preparing.
    pub preparing: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// Who a spent budget holds (read from the store after every change).
    pub budgets: std::sync::Arc<crate::budgets::BudgetGate>,
    /// `[budgets.roles]`, as the store applies it.
    pub role_budgets: std::sync::Arc<Vec<canopy_store::RoleBudget>>,
}

/// The daemon's credentials for runners and sessions.
pub struct Secrets {
    /// Runner token hash -> the runner it belongs to (replaced when credentials change).
    pub runners: std::sync::RwLock<std::collections::HashMap<String, canopy_core::RunnerId>>,
    /// Secret from which session tokens are derived.
    pub session_secret: String,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secrets { .. }")
    }
}

/// What a session's role allows, cached by handle (an account's role, and a run's definition and
/// Manager, never change).
#[derive(Debug, Clone)]
pub struct RoleOf {
    pub role: String,
    /// For a subagent run: its definition.
    pub definition: Option<String>,
    /// For a subagent run: its Manager (its activity shows under the Manager too).
    pub manager: Option<String>,
}

/// A runner acts only as itself: the runner id a request names must be its token's.
pub fn as_runner(runner: &canopy_core::RunnerId, claimed: &canopy_core::RunnerId) -> Result<(), Error> {
    if runner == claimed {
        Ok(())
    } else {
        Err(Error::Forbidden {
            action: format!("act as runner {claimed}"),
            reason: format!("the request's token is runner {runner}'s"),
        })
    }
}

impl Api {
    /// Rings the runners' doorbell so they sync now rather than at their next tick.
    pub async fn poke_runners(&self) {
        if let Err(e) = self.bus.publish(&self.subjects.runner_poke(), Bytes::new()).await {
            tracing::debug!(error = %e, "poking runners failed; they sync on their timer");
        }
    }

    /// Publishes committed messages as events (doorbells). A failed publish is logged: the
    /// message is committed and followers catch up from their cursors.
    /// Publishes the events of committed messages (followers' doorbells). This alone reaches
    /// no agent: a notice goes through `deliver_notices`, which also rings its recipients.
    pub(crate) async fn publish_messages(&self, messages: Vec<canopy_core::Message>) {
        for message in messages {
            let subject = self.subjects.message_event(message.channel.as_str());
            if let Err(e) = self.bus.publish(&subject, encode(&MessageEvent { message })).await {
                tracing::warn!(error = %e, "publishing a message event failed");
            }
        }
    }
}

pub(crate) fn page_limit(limit: Option<u32>) -> Result<u32, Error> {
    match limit.unwrap_or(DEFAULT_READ_LIMIT) {
        0 => Err(Error::invalid("limit", "must be at least 1")),
        n if n > MAX_READ_LIMIT => {
            Err(Error::invalid("limit", format!("{n} is above the maximum of {MAX_READ_LIMIT}")))
        }
        n => Ok(n),
    }
}

pub(crate) fn display_name(name: &str) -> Result<String, Error> {
    if name.trim().is_empty() || name.trim() != name || name.chars().any(char::is_control) {
        return Err(Error::invalid("name", "a display name is one line of text without surrounding whitespace"));
    }
    bounded_text("name", name.to_owned(), MAX_DISPLAY_NAME)
}

pub(crate) fn bounded_text(field: &'static str, text: String, max: usize) -> Result<String, Error> {
    if text.len() > max {
        return Err(Error::TooLarge { field, len: text.len(), max });
    }
    Ok(text)
}

pub(crate) fn ok<T: Serialize>(value: T) -> Result<Bytes, Error> {
    Ok(encode(&Reply::Ok(value)))
}

/// The reply payload refusing a request with `error`.
pub(crate) fn refusal(error: &Error) -> Bytes {
    encode(&Reply::<()>::Error(canopy_proto::WireError::from(error)))
}

/// Serialises a value the daemon built. These types always serialise; the fallback
/// keeps the daemon answering even if one day one does not.
pub(crate) fn encode<T: Serialize>(value: &T) -> Bytes {
    match serde_json::to_vec(value) {
        Ok(bytes) => Bytes::from(bytes),
        Err(e) => Bytes::from(format!(
            r#"{{"error":{{"code":"internal","message":"encoding the reply failed: {}"}}}}"#,
            e.to_string().replace(['"', '\\'], "'")
        )),
    }
}
