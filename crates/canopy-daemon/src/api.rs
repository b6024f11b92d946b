//! `Api`: the dispatch table over the daemon's areas, and where they are composed. From a
//! subject and raw payload to reply bytes, through the dispatch the method table generates
//! (`canopy_proto::api_methods!`, which names each method's area and handler).
//!
//! Every request goes the same way: authenticate the token (`Auth`), check the table's access
//! and the role's tools, decode the payload strictly as the table's request type, then the
//! area's handler, which parses names at the edge, checks sizes, calls the store, and tells
//! after the commit. Nothing here panics on input: every failure is a typed `Error` in the
//! reply. Holds no handler of its own. `Api::build` makes each service once, lowest first,
//! each given exactly what it uses, and registers the reply handlers.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use canopy_config::Config;
use canopy_core::acl::Caller;
use canopy_core::{AccountKind, Error};
use canopy_proto::api::*;
use canopy_proto::{Method, Subjects, decode_request};
use canopy_store::{Store, ops};

use crate::agents::Agents;
use crate::auth::{Auth, Secrets};
use crate::budgets::Budgets;
use crate::bundle::Bundles;
use crate::checks::Checks;
use crate::credentials::Credentials;
use crate::delivery::Delivery;
use crate::edge::{ok, refusal};
use crate::gate::{Gate, SpawnReplies};
use crate::git_access::GitAccess;
use crate::history::History;
use crate::holds::BudgetGate;
use crate::issues::Issues;
use crate::merges::{MergeReplies, Merges};
use crate::messages::Messages;
use crate::notify::Notifier;
use crate::prompts::Prompts;
use crate::replies::Replies;
use crate::repos::Repos;
use crate::roles::RoleDefaults;
use crate::run_ends::RunEnds;
use crate::runs::Runs;
use crate::sessions::Sessions;
use crate::trees::Trees;
use crate::watch::Watch;
use crate::wire::Wire;

/// The daemon's areas, each built once with what it uses; the dispatch table over them.
/// Cheap to clone into each request task.
#[derive(Clone)]
pub struct Api {
    subjects: Subjects,
    /// For the audit of refused requests.
    store: Store,
    pub(crate) auth: Auth,
    pub(crate) agents: Agents,
    pub(crate) messages: Messages,
    pub(crate) sessions: Sessions,
    pub(crate) gate: Gate,
    pub(crate) runs: Runs,
    pub(crate) repos: Repos,
    pub(crate) checks: Checks,
    pub(crate) merges: Merges,
    pub(crate) watch: Watch,
    pub(crate) issues: Issues,
    pub(crate) prompts: Prompts,
    pub(crate) history: History,
    pub(crate) budgets: Budgets,
    pub(crate) credentials: Credentials,
    pub(crate) git_access: GitAccess,
    pub(crate) notifier: Notifier,
    pub(crate) workspace_id: String,
}

/// What the areas are built from: the daemon's shared parts, made at start.
pub struct Parts {
    pub store: Store,
    pub wire: Arc<dyn Wire>,
    pub subjects: Subjects,
    pub config: Arc<Config>,
    pub roles: Arc<RoleDefaults>,
    pub bundles: Arc<Bundles>,
    pub secrets: Arc<Secrets>,
    /// The data directory (relative script paths, sessions' directories, checkouts).
    pub data_dir: PathBuf,
    /// The managed NATS server, reloaded when credentials change; `None` for an external one.
    pub nats: Option<Arc<canopy_bus::ManagedNats>>,
    pub git: Arc<canopy_git::Git>,
    pub workspace_id: String,
    /// The daemon's git endpoint as runners reach it (`[daemon] git_url`, or the bound address).
    pub git_url: String,
}

impl Api {
    /// Builds every area, lowest first, each with exactly the services it names, and registers
    /// the reactions to posts (the spawn gate's and the merge gate's replies).
    pub fn build(parts: Parts) -> Api {
        let Parts {
            store,
            wire,
            subjects,
            config,
            roles,
            bundles,
            secrets,
            data_dir,
            nats,
            git,
            workspace_id,
            git_url,
        } = parts;
        let holds = Arc::new(BudgetGate::default());
        let delivery =
            Delivery::new(Arc::new(store.clone()), wire.clone(), subjects.clone(), config.clone(), holds.clone());
        let auth = Auth::new(store.clone(), secrets);
        let notifier = Notifier::new(config.clone(), data_dir.clone(), store.clone());
        let ends = RunEnds::new(store.clone(), delivery.clone(), config.clone());
        let budgets = Budgets::new(store.clone(), delivery.clone(), holds, &config);
        let issues = Issues::new(store.clone(), delivery.clone(), wire.clone(), subjects.clone(), budgets.clone());
        let prompts =
            Prompts::new(store.clone(), bundles, roles.clone(), config.clone(), data_dir.clone(), ends.clone());
        let trees = Trees::new(store.clone(), git.clone(), data_dir.clone(), (wire.clone(), subjects.clone()), &config);
        let repos =
            Repos::new(store.clone(), delivery.clone(), ends.clone(), config.clone(), data_dir.clone(), git, trees);
        let git_access = GitAccess::new(store.clone(), auth.clone());
        let checks = Checks::new(store.clone(), delivery.clone(), repos.clone(), config.clone());
        let runs = Runs::new(
            store.clone(),
            delivery.clone(),
            prompts.clone(),
            budgets.clone(),
            repos.clone(),
            checks.clone(),
            ends,
            issues.clone(),
            config.clone(),
        );
        let gate = Gate::new(
            store.clone(),
            delivery.clone(),
            roles,
            repos.clone(),
            budgets.clone(),
            notifier.clone(),
            config.clone(),
        );
        let agents = Agents::new(
            store.clone(),
            delivery.clone(),
            prompts.clone(),
            repos.clone(),
            budgets.clone(),
            config.clone(),
        );
        let sessions = Sessions::new(
            store.clone(),
            auth.clone(),
            delivery.clone(),
            wire,
            subjects.clone(),
            prompts.clone(),
            repos.clone(),
            budgets.clone(),
            config.clone(),
            data_dir.clone(),
            git_url,
            runs.clone(),
            notifier.clone(),
        );
        let history = History::new(store.clone(), config.clone(), data_dir.clone());
        let credentials = Credentials::new(
            store.clone(),
            auth.clone(),
            delivery.clone(),
            subjects.clone(),
            data_dir,
            workspace_id.clone(),
            nats,
        );
        let merges = Merges::new(
            store.clone(),
            delivery.clone(),
            notifier.clone(),
            repos.clone(),
            checks.clone(),
            runs.clone(),
            issues.clone(),
        );
        let watch = Watch::new(store.clone(), delivery.clone(), repos.clone(), checks.clone());
        let mut replies = Replies::default();
        replies.register(Arc::new(SpawnReplies(gate.clone())));
        replies.register(Arc::new(MergeReplies(merges.clone())));
        let messages = Messages::new(store.clone(), delivery, replies, config);
        Api {
            subjects,
            store,
            auth,
            agents,
            messages,
            sessions,
            gate,
            runs,
            repos,
            checks,
            merges,
            watch,
            issues,
            prompts,
            history,
            budgets,
            credentials,
            git_access,
            notifier,
            workspace_id,
        }
    }

    /// The decision the daemon's git endpoint asks about every request.
    pub fn git_authorize(&self) -> canopy_git::http::Authorize {
        self.git_access.authorize()
    }
}

/// Methods whose handler records an agent's refused attempt itself, in the same transaction as
/// what it tells the operators (a post the policy forbids; deciding a spawn or merge request).
const AUDITED_BY_HANDLER: [Method; 3] = [Method::MessagesPost, Method::SpawnDecide, Method::MergesDecide];

/// The dispatch, generated from the method table (`canopy_proto::api_methods!`): a runner
/// method needs a runner credential; an operator method an operator's token; any other an
/// account's token that passes the per-role tool check. Then the request is decoded as the
/// table's request type and handed to the handler the table names, whose response must be the
/// table's response type. The table's access is checked here and nowhere else.
macro_rules! dispatch {
    (@call $api:ident, Runner, $area:ident . $handler:ident, $req:ty, $resp:ty, $token:ident, $payload:ident, $method:ident) => {{
        let runner = $api.auth.authenticate_runner($token)?;
        let request: $req = decode_request($payload)?;
        let response: $resp = $api.$area.$handler(runner, request).await?;
        ok(response)
    }};
    (@call $api:ident, Operators, $area:ident . $handler:ident, $req:ty, $resp:ty, $token:ident, $payload:ident, $method:ident) => {{
        let caller = $api.auth.authenticate($token).await?;
        // Kept only for an agent, whose refusals are audited.
        let agent = (caller.kind == AccountKind::Agent).then(|| caller.clone());
        let answer: Result<$resp, Error> = async {
            canopy_core::acl::require_operator(&caller, $method.as_str())?;
            let request: $req = decode_request($payload)?;
            $api.$area.$handler(caller, request).await
        }
        .await;
        ok($api.audited(agent.as_ref(), $method, answer).await?)
    }};
    (@call $api:ident, Anyone, $area:ident . $handler:ident, $req:ty, $resp:ty, $token:ident, $payload:ident, $method:ident) => {{
        let caller = $api.auth.authenticate($token).await?;
        // Kept only for an agent, whose refusals are audited.
        let agent = (caller.kind == AccountKind::Agent).then(|| caller.clone());
        let answer: Result<$resp, Error> = async {
            $api.prompts.check_tool(&caller, $method).await?;
            let request: $req = decode_request($payload)?;
            $api.$area.$handler(caller, request).await
        }
        .await;
        ok($api.audited(agent.as_ref(), $method, answer).await?)
    }};
    ($(($variant:ident, $area:ident . $handler:ident, $name:literal, $req:ty => $resp:ty, $access:ident, $who:literal, $what:literal, $tool:expr)),* $(,)?) => {
        impl Api {
            async fn dispatch(&self, method: &str, token: Option<&str>, payload: &[u8]) -> Result<Bytes, Error> {
                let api = self;
                let method = Method::parse(method).ok_or_else(|| Error::UnknownMethod { method: method.to_owned() })?;
                match method {
                    $(Method::$variant => dispatch!(@call api, $access, $area . $handler, $req, $resp, token, payload, method),)*
                }
            }
        }
    };
}
canopy_proto::api_methods!(dispatch);

impl Api {
    /// Records an agent's (`agent`: the caller when it is one) refused request (`forbidden`: a method only operators call, a tool its
    /// role lacks, an act outside its subtree or its channels) in the audit log as
    /// `<method>.refused`, then returns the answer unchanged. A failed record is logged: the
    /// refusal stands either way.
    async fn audited<T>(&self, agent: Option<&Caller>, method: Method, answer: Result<T, Error>) -> Result<T, Error> {
        if let Err(Error::Forbidden { action, reason }) = &answer
            && let Some(caller) = agent
            && !AUDITED_BY_HANDLER.contains(&method)
        {
            let (who, act, what, why) =
                (caller.clone(), format!("{}.refused", method.as_str()), action.clone(), reason.clone());
            if let Err(e) = self.store.write(move |conn| ops::record_act(conn, &who, &act, &what, &why)).await {
                tracing::warn!(error = %e, agent = %caller.handle, method = method.as_str(), "auditing a refusal failed");
            }
        }
        answer
    }

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
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::testing::Fixture;

    #[tokio::test]
    async fn an_agents_refused_requests_are_audited_once_each_and_an_operators_are_not() {
        let fx = Fixture::new().await;
        fx.manager("m1").await;
        let token = fx.token("m1").await;
        let answer = fx.call(&token, "operators.list", json!({})).await;
        assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
        // A post the policy forbids is recorded by its own handler, once.
        let post = json!({ "channel": "announcements", "topic": "news", "body": "hi", "create_topic": true });
        let answer = fx.call(&token, "messages.post", post).await;
        assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
        let audited = fx.audited().await;
        assert_eq!(audited.iter().filter(|a| *a == "operators.list.refused").count(), 1, "{audited:?}");
        assert_eq!(audited.iter().filter(|a| a.starts_with("messages.post")).count(), 1, "{audited:?}");
        // A refusal that is no `forbidden` (a bad argument) is an error, not an audit record.
        let answer = fx.call(&token, "messages.post", json!({ "channel": "home-m1", "topic": "x", "body": " " })).await;
        assert_eq!(answer["error"]["code"], "invalid_argument", "{answer}");
        assert_eq!(fx.audited().await.len(), audited.len());
    }

    #[tokio::test]
    async fn a_request_without_a_known_token_is_refused_naming_why() {
        let fx = Fixture::new().await;
        let answer = fx.call("cnp_not-a-token", "whoami", json!({})).await;
        assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
        let answer = fx.call("cnp_not-a-token", "no.such.method", json!({})).await;
        assert!(answer["error"]["code"].is_string(), "{answer}");
    }
}
