//! The branch watcher (`Watch`): every `[git] watch_interval` it reads each standing agent's
//! branch head from its checkout's files and each repository's base, and acts on what moved.
//!
//! A new head is published into the mirror; once a head has stayed put for one interval (debounced, so a burst of
//! commits is checked once, at its newest), every named check runs on it in a scratch checkout
//! and the owner hears of a failure (`checks`). After any head or the base moved, every live
//! branch and open request is test-merged against the base and against each other where they
//! touch the same files (`git merge-tree`, no checkout); a conflict not told before is told to
//! each owner under `conflicts: <branch>`, and all are kept for `workspace_status`, `canopy
//! merges` and `canopy repos list`.
//!
//! Uses the store, delivery, repos (mirrors, git) and checks. Decides nothing about merging: a
//! merge request stays at the head it was asked at until its Manager asks again under its
//! title (`merges`); runs no check on a run's tree (`runs`) or a merge request's (`merges`).

use std::sync::Arc;

use canopy_core::checks::{self as rules, CheckTrigger};
use canopy_store::{BranchHead, Checkout, CheckoutState, RepoRow, Store, ops};
use dashmap::DashMap;

use crate::checks::{Checks, Subject};
use crate::delivery::Delivery;
use crate::repos::Repos;
use crate::trees::Tree;

/// The branch watcher. Cheap to clone.
#[derive(Clone)]
pub struct Watch {
    store: Store,
    delivery: Delivery,
    repos: Repos,
    checks: Checks,
    /// The base commit each repository had at the last look, by repository id.
    bases: Arc<DashMap<i64, String>>,
    /// Branches whose checks are running (a newer head waits for the next look).
    checking: Arc<DashMap<(i64, String), ()>>,
    /// One look at a time.
    looking: Arc<tokio::sync::Mutex<()>>,
}

/// A live branch of a standing agent: its owner, name and head now.
struct Live {
    owner: String,
    branch: String,
    head: String,
}

impl Watch {
    pub fn new(store: Store, delivery: Delivery, repos: Repos, checks: Checks) -> Self {
        Watch {
            store,
            delivery,
            repos,
            checks,
            bases: Arc::default(),
            checking: Arc::default(),
            looking: Arc::default(),
        }
    }

    /// One look at every repository (the daemon's timer calls it; a look still going is not
    /// doubled).
    pub async fn look(&self) {
        let Ok(_one) = self.looking.try_lock() else { return };
        let found = self
            .store
            .read(|conn| Ok((ops::list_repos(conn)?, ops::checkouts(conn, Some(CheckoutState::Ready))?)))
            .await;
        let (repos, checkouts) = match found {
            Ok(found) => found,
            Err(e) => return tracing::warn!(error = %e, "reading repositories to watch failed"),
        };
        for repo in repos {
            let standing: Vec<&Checkout> =
                checkouts.iter().filter(|c| c.repo.id == repo.id && c.run.is_none() && !c.retired).collect();
            if let Err(e) = self.look_at(&repo, &standing).await {
                tracing::warn!(repo = %repo.name, error = %e, "watching a repository failed");
            }
        }
    }

    async fn look_at(&self, repo: &RepoRow, standing: &[&Checkout]) -> Result<(), canopy_core::Error> {
        let base = {
            let lock = self.repos.repo_lock(&repo.name);
            let _held = lock.lock().await;
            self.repos.base_now(repo).await?
        };
        let mut moved = self.bases.insert(repo.id, base.clone()).as_ref() != Some(&base);
        let mut live = Vec::new();
        for checkout in standing {
            let owner = checkout.account.to_string();
            // A checkout on a runner's disk is read as its runner last pushed it.
            let (head, pushed) = match self.repos.trees().locate(&owner).await {
                Tree::Here(dir) => {
                    let branch = checkout.branch.clone();
                    let read = tokio::task::spawn_blocking(move || canopy_git::Git::read_branch_head(&dir, &branch));
                    (read.await.ok().flatten(), false)
                }
                Tree::Runner(_) => {
                    let mirror = self.repos.mirror(repo);
                    (self.repos.git().rev(&mirror, &canopy_core::repos::agent_ref(&owner)).await.ok().flatten(), true)
                }
            };
            let Some(head) = head else { continue };
            let (repo_id, branch) = (repo.id, checkout.branch.clone());
            let known =
                self.store.read(move |conn| ops::branch_head(conn, repo_id, &branch)).await?.unwrap_or_default();
            // Only a head git found in the agent's checkout (published into the mirror) is live:
            // a ref file naming no commit must not break the scan for everyone.
            let live_head = match known.head != head {
                true if self.took_commit(repo, checkout, &head, &known, pushed).await => {
                    moved = true;
                    head
                }
                true => known.head.clone(),
                false => {
                    if known.checked != head {
                        self.check_branch(repo, &owner, &checkout.branch, &head, &base, known.failing).await;
                    }
                    head
                }
            };
            if !live_head.is_empty() {
                live.push(Live { owner, branch: checkout.branch.clone(), head: live_head });
            }
        }
        if moved {
            self.scan(repo, &base, &live).await?;
        }
        Ok(())
    }

    /// A branch's new head: published into the mirror (confined: the checkout is the
    /// agent's), recorded, and taken by the branch's undecided merge requests. Its checks wait
    /// for the next look, so a burst of commits is checked once.
    async fn took_commit(
        &self,
        repo: &RepoRow,
        checkout: &Checkout,
        head: &str,
        known: &BranchHead,
        pushed: bool,
    ) -> bool {
        let owner = checkout.account.to_string();
        let dir = self.repos.checkout_dir(&owner);
        let mirror = self.repos.mirror(repo);
        let published = if pushed {
            Ok(Some(head.to_owned()))
        } else {
            let lock = self.repos.repo_lock(&repo.name);
            let _held = lock.lock().await;
            let what = format!("refs/heads/{}", checkout.branch);
            self.repos.git().publish(&mirror, &dir, &what, &canopy_core::repos::agent_ref(&owner)).await
        };
        // What git found is what counts: a ref file that named an object git does not have
        // is not a commit.
        let head = match published {
            Ok(Some(found)) if found == head => found,
            Ok(_) => return false,
            Err(e) => {
                tracing::warn!(agent = %owner, error = %e, "publishing a branch's new head failed");
                return false;
            }
        };
        let next = BranchHead { head: head.clone(), checked: known.checked.clone(), failing: known.failing };
        let (repo_id, branch) = (repo.id, checkout.branch.clone());
        if let Err(e) = self.store.write(move |conn| ops::set_branch_head(conn, repo_id, &branch, &next)).await {
            tracing::warn!(agent = %owner, error = %e, "recording a branch's head failed");
            return false;
        }
        true
    }

    /// Every check on a branch head that stayed put, in a task (a branch already being
    /// checked waits: its newest head is checked next); nothing to check on a head the base
    /// already holds.
    async fn check_branch(&self, repo: &RepoRow, owner: &str, branch: &str, head: &str, base: &str, failing: bool) {
        let key = (repo.id, branch.to_owned());
        if repo.checks.is_empty() || self.checking.contains_key(&key) {
            return;
        }
        let held = self.repos.git().is_ancestor(&self.repos.mirror(repo), head, base).await.unwrap_or(false);
        if held {
            // Nothing of its own to check: recorded as checked, so the next look asks git nothing.
            let next = BranchHead { head: head.to_owned(), checked: head.to_owned(), failing };
            let (repo_id, name) = (repo.id, branch.to_owned());
            if let Err(e) = self.store.write(move |conn| ops::set_branch_head(conn, repo_id, &name, &next)).await {
                tracing::warn!(branch, error = %e, "recording a branch's head failed");
            }
            return;
        }
        self.checking.insert(key.clone(), ());
        let (watch, repo, owner, branch, head) =
            (self.clone(), repo.clone(), owner.to_owned(), branch.to_owned(), head.to_owned());
        tokio::spawn(async move {
            let subject = Subject { trigger: CheckTrigger::Branch, name: branch.clone() };
            match watch.checks.run_on_commit(&repo, &head, &subject).await {
                Ok(runs) => {
                    let failing = watch.checks.tell(&owner, &branch, &head, &runs, failing).await;
                    let next = BranchHead { head: head.clone(), checked: head.clone(), failing };
                    let (repo_id, name) = (repo.id, branch.clone());
                    // The head may have moved on while the checks ran: keep the newer one.
                    let recorded = watch
                        .store
                        .write(move |conn| {
                            let now = ops::branch_head(conn, repo_id, &name)?.unwrap_or_default();
                            let next = BranchHead { head: now.head.clone(), ..next };
                            ops::set_branch_head(conn, repo_id, &name, &next)
                        })
                        .await;
                    if let Err(e) = recorded {
                        tracing::warn!(branch, error = %e, "recording a branch's checks failed");
                    }
                }
                Err(e) => tracing::warn!(branch, error = %e, "checking a branch's new head failed"),
            }
            watch.checking.remove(&key);
        });
    }

    /// Test-merges every live branch and open request against the base and each other, keeps
    /// what conflicts, and tells each owner of a conflict not told before.
    async fn scan(&self, repo: &RepoRow, base: &str, live: &[Live]) -> Result<(), canopy_core::Error> {
        let repo_id = repo.id;
        let open = self.store.read(move |conn| ops::open_merges(conn, repo_id)).await?;
        let mut branches: Vec<(String, String)> = live.iter().map(|l| (l.branch.clone(), l.head.clone())).collect();
        let mut owners: Vec<(String, String)> = live.iter().map(|l| (l.branch.clone(), l.owner.clone())).collect();
        for request in open {
            if !branches.iter().any(|(b, _)| *b == request.branch) {
                branches.push((request.branch.clone(), request.head.clone()));
                owners.push((request.branch.clone(), request.requester.to_string()));
            }
        }
        let mirror = self.repos.mirror(repo);
        let found = self
            .repos
            .git()
            .conflict_scan(&mirror, &repo.base, base, &branches)
            .await
            .map_err(|e| crate::repos::git_error("repo", e))?;
        let new = self.store.write(move |conn| ops::set_conflicts(conn, repo_id, &found)).await?;
        let owner_of = |branch: &str| owners.iter().find(|(b, _)| b == branch).map(|(_, o)| o.clone());
        let mut notices = Vec::new();
        for (branch, other, files) in new {
            let against_base = other == repo.base;
            let mut tell =
                vec![(owner_of(&branch), rules::say::conflict(&branch, &other, against_base, &files), branch.clone())];
            if !against_base {
                tell.push((owner_of(&other), rules::say::conflict(&other, &branch, false, &files), other.clone()));
            }
            for (owner, body, about) in tell {
                let Some(owner) = owner else { continue };
                let topic = rules::conflicts_topic(&about);
                match self.store.write(move |conn| ops::notice_to(conn, &owner, &topic, &body)).await {
                    Ok(notice) => notices.push(notice),
                    Err(e) => tracing::warn!(branch = %about, error = %e, "telling a conflict failed"),
                }
            }
        }
        self.delivery.deliver_notices(notices).await;
        Ok(())
    }
}
