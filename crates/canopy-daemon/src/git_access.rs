//! Who may fetch from and push to the daemon's git endpoint (`GitAccess`): the decision
//! `canopy_git::http::serve` asks about every request.
//!
//! A runner logs in with its id and its token (the credential's). It may fetch a repository
//! while it hosts a checkout of it, and push only the refs of the checkouts it hosts: an
//! agent's `refs/canopy/agents/<handle>`, a run's `refs/canopy/runs/<id>`. Never a deletion,
//! never a branch of the canonical repository, never another runner's agent. Every refusal of a
//! known login is written to the audit log (`git_refused`). Does not serve the protocol
//! (`canopy-git` does) or decide where checkouts are (`trees`).

use std::sync::Arc;

use canopy_git::http::{Access, Asked, Authorize, Refusal};
use canopy_store::{Store, ops};

use crate::auth::Auth;

/// The endpoint's decisions. Cheap to clone.
#[derive(Clone)]
pub struct GitAccess {
    store: Store,
    auth: Auth,
}

impl GitAccess {
    pub fn new(store: Store, auth: Auth) -> Self {
        GitAccess { store, auth }
    }

    /// The decision in the shape the endpoint takes.
    pub fn authorize(&self) -> Authorize {
        let access = self.clone();
        Arc::new(move |asked| {
            let access = access.clone();
            Box::pin(async move { access.decide(asked).await })
        })
    }

    async fn decide(&self, asked: Asked) -> Result<String, Refusal> {
        let Some((user, password)) = &asked.login else { return Err(Refusal::Unauthenticated) };
        let runner = match self.auth.authenticate_runner(Some(password)) {
            Ok(runner) if runner.as_str() == user => runner,
            // A wrong password is not audited: it names nobody, and git retries without one.
            _ => return Err(Refusal::Unauthenticated),
        };
        let id = runner.to_string();
        let hosted = self.store.read(move |conn| ops::hosted_checkouts(conn, &id)).await.map_err(|e| {
            tracing::warn!(error = %e, "reading a runner's checkouts for git failed");
            Refusal::Forbidden("the daemon could not read what this runner hosts; try again".into())
        })?;
        let hosted: Vec<_> = hosted.into_iter().filter(|c| c.repo.name == asked.repo).collect();
        let refused = match &asked.access {
            _ if hosted.is_empty() => {
                Some(format!("runner {runner} hosts no checkout of {}, so it may not reach it", asked.repo))
            }
            Access::Fetch => None,
            Access::Push(updates) => updates.iter().find_map(|update| {
                let own = hosted.iter().any(|c| {
                    let mine = match c.run {
                        Some((run, _)) => canopy_core::repos::run_ref(run),
                        None => canopy_core::repos::agent_ref(c.account.as_str()),
                    };
                    mine == update.name
                });
                match (update.deletes(), own) {
                    (true, _) => Some(format!("a push may not delete {}", update.name)),
                    (false, false) => Some(format!(
                        "runner {runner} may push only the branches of the agents it hosts, not {}",
                        update.name
                    )),
                    (false, true) => None,
                }
            }),
        };
        match refused {
            None => Ok(user.clone()),
            Some(why) => {
                tracing::warn!(runner = %runner, repo = %asked.repo, peer = %asked.peer, "{why}");
                let (login, repo, audited) = (runner.to_string(), asked.repo.clone(), why.clone());
                let written =
                    self.store.write(move |conn| ops::record_git_refusal(conn, &login, &repo, &audited)).await;
                if let Err(e) = written {
                    tracing::error!(error = %e, "writing a git refusal to the audit log failed");
                }
                Err(Refusal::Forbidden(why))
            }
        }
    }
}
