//! The credentials area (`Credentials`): operators (`operators.*`: more of them, and
//! revocation, below the API too), runner credentials (`runners.add`, `runners.remove`) and
//! `credentials.rotate`, each applied to the managed NATS server's users and audited. Uses
//! the store, `Auth` (the runner tokens, an operator's revocation), the credential files
//! (`logins`), the managed server and delivery (runners told to sync). Does not resolve a
//! token to its caller (`auth`).

use std::path::PathBuf;
use std::sync::Arc;

use canopy_core::acl::Caller;
use canopy_core::{Error, Handle};
use canopy_proto::Subjects;
use canopy_proto::api::*;
use canopy_store::{Store, ops};

use crate::auth::{self, Auth};
use crate::delivery::Delivery;
use crate::edge::display_name;
use crate::logins;

/// The credentials area. Cheap to clone.
#[derive(Clone)]
pub struct Credentials {
    store: Store,
    auth: Auth,
    delivery: Delivery,
    subjects: Subjects,
    data_dir: PathBuf,
    workspace_id: String,
    /// The managed NATS server, reloaded when credentials change; `None` for an external one.
    nats: Option<Arc<canopy_bus::ManagedNats>>,
    /// One credential change at a time, held until the server has reloaded.
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl Credentials {
    pub fn new(
        store: Store,
        auth: Auth,
        delivery: Delivery,
        subjects: Subjects,
        data_dir: PathBuf,
        workspace_id: String,
        nats: Option<Arc<canopy_bus::ManagedNats>>,
    ) -> Self {
        Credentials { store, auth, delivery, subjects, data_dir, workspace_id, nats, lock: Arc::default() }
    }
}

/// Operators: more of them, and revocation.
impl Credentials {
    pub(crate) async fn operators_add(
        &self,
        _operator: Caller,
        req: OperatorsAddRequest,
    ) -> Result<OperatorsAddResponse, Error> {
        let handle = Handle::parse(&req.handle).map_err(|e| Error::name("handle", e))?;
        let display_name = display_name(&req.name.unwrap_or_else(|| handle.to_string()))?;
        let token = auth::new_token().map_err(|e| Error::Internal(format!("generating a token: {e}")))?;
        let spec = canopy_store::OperatorSpec { handle, display_name, token_hash: auth::token_hash(&token) };
        let account = self.store.write(move |conn| ops::create_operator(conn, &spec)).await?;
        Ok(OperatorsAddResponse { account, token })
    }

    pub(crate) async fn operators_list(
        &self,
        _operator: Caller,
        _: OperatorsListRequest,
    ) -> Result<OperatorsListResponse, Error> {
        Ok(OperatorsListResponse { operators: self.store.read(ops::operators).await? })
    }

    /// Revokes an operator and drops it from the token cache, so its very next request fails.
    pub(crate) async fn operators_revoke(
        &self,
        caller: Caller,
        req: OperatorsRevokeRequest,
    ) -> Result<canopy_core::Account, Error> {
        let handle = Handle::parse(&req.handle).map_err(|e| Error::name("handle", e))?;
        let target = handle.clone();
        let by = caller.clone();
        let account = self.store.write(move |conn| ops::revoke_operator(conn, &by, &target)).await?;
        self.auth.revoke_operator(&handle);
        // Below the API too: operators share one NATS login, so it changes, and the revoked
        // operator's client is closed at the reload (the others log in again from the file).
        self.rotate_operator_login(&caller, handle.as_str()).await?;
        Ok(account)
    }
}

/// How long after answering a credential change the NATS server reloads its users.
const RELOAD_AFTER: std::time::Duration = std::time::Duration::from_millis(250);

/// How long a runner token replaced by a rotation is still accepted: a runner re-reads its
/// credential before each sync, and its calls in between must not be lost.
const OLD_TOKENS_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// Runner credentials and rotation. One change at a time (`lock`, held until the server has
/// reloaded): the files change first, then the token map, the audit record, and, after the
/// reply, the server's users, read from the files as they are then.
impl Credentials {
    pub(crate) async fn runners_add(
        &self,
        caller: Caller,
        req: RunnersAddRequest,
    ) -> Result<RunnersAddResponse, Error> {
        let id = canopy_core::RunnerId::parse(&req.id).map_err(|e| Error::name("id", e))?;
        let guard = self.lock.clone().lock_owned().await;
        let dir = canopy_config::DataDir::new(&self.data_dir);
        let credential = logins::add_runner(&dir, &self.workspace_id, &id)?;
        let applied = self.credentials_changed(guard, &caller, "runners.add", id.as_str(), false).await?;
        Ok(RunnersAddResponse {
            path: dir.runner_credential(id.as_str()).display().to_string(),
            credential: RunnerCredentialWire {
                workspace_id: credential.workspace_id,
                runner_id: id,
                nats_user: credential.nats.user,
                nats_password: credential.nats.password,
                token: credential.token,
            },
            applied: applied.applied,
        })
    }

    /// Revokes a runner: its credential, its connection (at the reload), its live sessions.
    pub(crate) async fn runners_remove(
        &self,
        caller: Caller,
        req: RunnersRemoveRequest,
    ) -> Result<CredentialsChangedResponse, Error> {
        let id = canopy_core::RunnerId::parse(&req.id).map_err(|e| Error::name("id", e))?;
        let guard = self.lock.clone().lock_owned().await;
        logins::remove_runner(&canopy_config::DataDir::new(&self.data_dir), &id)?;
        let changed = self.credentials_changed(guard, &caller, "runners.remove", id.as_str(), false).await?;
        let ended = self.store.write(move |conn| ops::forget_runner(conn, &id)).await?;
        if ended > 0 {
            self.delivery.poke_runners().await;
        }
        Ok(changed)
    }

    pub(crate) async fn credentials_rotate(
        &self,
        caller: Caller,
        _req: CredentialsRotateRequest,
    ) -> Result<CredentialsChangedResponse, Error> {
        let guard = self.lock.clone().lock_owned().await;
        // Whatever the rotation managed to write is applied, even when it stopped partway:
        // the server must accept the passwords the files now hold.
        let rotated = logins::rotate(&canopy_config::DataDir::new(&self.data_dir), &self.workspace_id);
        let changed = self.credentials_changed(guard, &caller, "credentials.rotate", "all", true).await?;
        rotated.map(|_| changed)
    }

    /// A new NATS login for operator clients (a revoked operator keeps no way in below the
    /// API), applied like any credential change.
    pub(crate) async fn rotate_operator_login(&self, caller: &Caller, revoked: &str) -> Result<(), Error> {
        let guard = self.lock.clone().lock_owned().await;
        logins::rotate_operator(&canopy_config::DataDir::new(&self.data_dir))?;
        self.credentials_changed(guard, caller, "credentials.rotate_operator", revoked, false).await.map(|_| ())
    }

    /// Applies the credential files as they now are: the runner tokens (with `keep_old`, the
    /// replaced ones stay valid for `OLD_TOKENS_FOR`), the audit log, and the managed server's
    /// users (a reload after the reply, which closes the connections of renamed users, the
    /// caller's and the daemon's own included; they log in again from their files).
    async fn credentials_changed(
        &self,
        guard: tokio::sync::OwnedMutexGuard<()>,
        caller: &Caller,
        action: &'static str,
        target: &str,
        keep_old: bool,
    ) -> Result<CredentialsChangedResponse, Error> {
        let dir = canopy_config::DataDir::new(&self.data_dir);
        let now = logins::load(&dir)?;
        {
            // A poisoned map still holds whole entries (each insert is one call): use it.
            let mut tokens = self.auth.secrets.runners.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            let fresh = now.runner_tokens();
            if keep_old {
                // The old tokens stay beside the new ones for a while, then go.
                let secrets = self.auth.secrets.clone();
                let current = fresh.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(OLD_TOKENS_FOR).await;
                    let mut tokens = secrets.runners.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                    tokens.retain(|hash, _| current.contains_key(hash));
                });
            } else {
                tokens.clear();
            }
            tokens.extend(fresh);
        }
        let applied = match &self.nats {
            Some(nats) => {
                let (nats, subjects) = (nats.clone(), self.subjects.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(RELOAD_AFTER).await;
                    // The files as they are now; the lock keeps the next change out until then.
                    match logins::load(&dir) {
                        Ok(now) => {
                            if let Err(e) = nats.reload(&now.users(&subjects)) {
                                tracing::error!(error = %e, "reloading the NATS server's users failed");
                            }
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "reading the credentials to reload the NATS server failed")
                        }
                    }
                    drop(guard);
                });
                true
            }
            None => false,
        };
        let (caller, target, detail) =
            (caller.clone(), target.to_owned(), if applied { "applied" } else { "install canopy nats-config" });
        self.store.write(move |conn| ops::record_act(conn, &caller, action, &target, detail)).await?;
        tracing::info!(action, applied, "credentials changed");
        Ok(CredentialsChangedResponse { users: now.user_names(), applied })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::testing::{Fixture, req};

    #[tokio::test]
    async fn an_added_operators_token_works_until_it_is_revoked() {
        let fx = Fixture::new().await;
        let added = fx.api.credentials.operators_add(fx.operator.clone(), req(json!({ "handle": "op2" }))).await;
        let added = added.unwrap_or_else(|e| panic!("{e}"));
        let who = fx.api.auth.authenticate(Some(&added.token)).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(who.is_operator() && who.handle.as_str() == "op2");
        let revoke = req(json!({ "handle": "op2" }));
        fx.api.credentials.operators_revoke(fx.operator.clone(), revoke).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(fx.api.auth.authenticate(Some(&added.token)).await.is_err(), "its very next request fails");
        assert!(fx.audited().await.iter().any(|a| a == "operators.revoke"), "{:?}", fx.audited().await);
    }
}
