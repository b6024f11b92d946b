//! Where each checkout is, and the operations on its working tree wherever that is (`Trees`).
//!
//! A checkout is where its account's newest session runs: on the daemon's disk for the
//! embedded runner (made by `repos` under `<data>/sessions/<handle>/work`, worked on here with
//! `canopy-git`, confined), and on the runner's own disk for every other runner, which makes
//! it from the daemon's git endpoint and acts on it when asked (`runner.<id>.git`): it pushes
//! a ref back, reads its status or summary, merges a commit into it. Callers get the same
//! answers either way. Does not decide who may do any of this (the areas do) and holds no
//! repository lock (callers hold the mirror's).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use canopy_core::RunnerId;
use canopy_git::{GitError, MergeOutcome, Status, Summary};
use canopy_proto::Subjects;
use canopy_proto::api::{RunnerGitOp, RunnerGitReply, RunnerGitRequest};
use canopy_store::{Checkout, Store, ops};

use crate::wire::Wire;

/// Where a checkout's working tree is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tree {
    /// On this disk, in this directory.
    Here(PathBuf),
    /// On this runner's disk.
    Runner(RunnerId),
}

/// The checkouts' working trees. Cheap to clone.
#[derive(Clone)]
pub struct Trees {
    store: Store,
    git: Arc<canopy_git::Git>,
    data_dir: PathBuf,
    wire: Arc<dyn Wire>,
    subjects: Subjects,
    /// How long a runner gets to answer (a push or a merge moves objects over the network).
    timeout: Duration,
}

impl Trees {
    /// A runner gets `[daemon] request_timeout` to answer.
    pub fn new(
        store: Store,
        git: Arc<canopy_git::Git>,
        data_dir: PathBuf,
        (wire, subjects): (Arc<dyn Wire>, Subjects),
        config: &canopy_config::Config,
    ) -> Self {
        Trees { store, git, data_dir, wire, subjects, timeout: config.daemon.request_timeout }
    }

    /// The directory of an account's checkout on the daemon's disk.
    pub(crate) fn dir(&self, handle: &str) -> PathBuf {
        self.data_dir.join("sessions").join(handle).join("work")
    }

    /// Where `handle`'s checkout is now.
    pub(crate) async fn locate(&self, handle: &str) -> Tree {
        let who = handle.to_owned();
        let host = self.store.read(move |conn| ops::checkout_host(conn, &who)).await;
        match host {
            Ok(Some(runner)) if runner != canopy_config::EMBEDDED_RUNNER => {
                Tree::Runner(RunnerId::from_trusted(runner))
            }
            Ok(_) => Tree::Here(self.dir(handle)),
            Err(e) => {
                tracing::warn!(agent = %handle, error = %e, "reading where a checkout is failed; looking on this disk");
                Tree::Here(self.dir(handle))
            }
        }
    }

    /// Publishes `what` (a ref of the checkout) into the mirror as `to`; its commit, or none
    /// when the checkout has no such ref.
    pub(crate) async fn publish(
        &self,
        checkout: &Checkout,
        mirror: &Path,
        what: &str,
        to: &str,
    ) -> Result<Option<String>, GitError> {
        match self.locate(checkout.account.as_str()).await {
            Tree::Here(dir) => self.git.publish(mirror, &dir, what, to).await,
            Tree::Runner(runner) => {
                let op = RunnerGitOp::Publish { what: what.to_owned(), to: to.to_owned() };
                match self.ask(&runner, checkout, op).await? {
                    RunnerGitReply::Published { head } => Ok(head),
                    other => Err(unexpected(&runner, &other)),
                }
            }
        }
    }

    /// The checkout's branch, ahead/behind `base` and dirty files.
    pub(crate) async fn status(&self, checkout: &Checkout, mirror: &Path, base: &str) -> Result<Status, GitError> {
        match self.locate(checkout.account.as_str()).await {
            Tree::Here(dir) => self.git.status(mirror, &dir, base).await,
            Tree::Runner(runner) => {
                let (status, _) =
                    self.ask_tree(&runner, checkout, RunnerGitOp::Status { base: base.to_owned() }).await?;
                Ok(status)
            }
        }
    }

    /// What was done in the checkout since `base`.
    pub(crate) async fn summary(&self, checkout: &Checkout, mirror: &Path, base: &str) -> Result<Summary, GitError> {
        match self.locate(checkout.account.as_str()).await {
            Tree::Here(dir) => self.git.summary(mirror, &dir, base).await,
            Tree::Runner(runner) => {
                let (status, (commits, diffstat)) =
                    self.ask_tree(&runner, checkout, RunnerGitOp::Summary { base: base.to_owned() }).await?;
                Ok(Summary { branch: status.branch, head: status.head, commits, diffstat, dirty: status.dirty })
            }
        }
    }

    /// Merges `commit` (in the mirror as ref `from`) into the checkout's checked-out `branch`.
    pub(crate) async fn merge_into(
        &self,
        checkout: &Checkout,
        mirror: &Path,
        branch: &str,
        commit: &str,
        from: &str,
        message: &str,
    ) -> Result<MergeOutcome, GitError> {
        match self.locate(checkout.account.as_str()).await {
            Tree::Here(dir) => self.git.merge_into(mirror, &dir, branch, commit, message).await,
            Tree::Runner(runner) => {
                let op = RunnerGitOp::Merge {
                    branch: branch.to_owned(),
                    commit: commit.to_owned(),
                    from: from.to_owned(),
                    message: message.to_owned(),
                };
                match self.ask(&runner, checkout, op).await? {
                    RunnerGitReply::Merged { commit, fast_forward } => {
                        Ok(MergeOutcome::Merged { commit, fast_forward })
                    }
                    RunnerGitReply::UpToDate { commit } => Ok(MergeOutcome::UpToDate { commit }),
                    RunnerGitReply::Conflict { files } => Ok(MergeOutcome::Conflict { files }),
                    other => Err(unexpected(&runner, &other)),
                }
            }
        }
    }

    /// Deletes the checkout's working tree.
    pub(crate) async fn remove(&self, checkout: &Checkout) -> Result<(), GitError> {
        match self.locate(checkout.account.as_str()).await {
            Tree::Here(dir) => canopy_git::remove_dir(&dir),
            Tree::Runner(runner) => match self.ask(&runner, checkout, RunnerGitOp::Remove).await? {
                RunnerGitReply::Removed => Ok(()),
                other => Err(unexpected(&runner, &other)),
            },
        }
    }

    /// A status or summary from `runner`: the status, and the commits and diffstat.
    async fn ask_tree(
        &self,
        runner: &RunnerId,
        checkout: &Checkout,
        op: RunnerGitOp,
    ) -> Result<(Status, (Vec<String>, String)), GitError> {
        match self.ask(runner, checkout, op).await? {
            RunnerGitReply::Tree { branch, head, ahead, behind, dirty, commits, diffstat } => {
                Ok((Status { branch, head, ahead, behind, dirty }, (commits, diffstat)))
            }
            other => Err(unexpected(runner, &other)),
        }
    }

    /// Asks `runner` to act on `checkout`; its refusal or failure as git's error.
    async fn ask(&self, runner: &RunnerId, checkout: &Checkout, op: RunnerGitOp) -> Result<RunnerGitReply, GitError> {
        let request = RunnerGitRequest { agent: checkout.account.to_string(), repo: checkout.repo.name.clone(), op };
        let what = format!("asking runner {runner} about {}'s checkout", checkout.account);
        let payload =
            serde_json::to_vec(&request).map_err(|e| GitError::Spawn { what: what.clone(), reason: e.to_string() })?;
        let reply = self
            .wire
            .request(&self.subjects.runner_git(runner), Bytes::from(payload), self.timeout)
            .await
            .map_err(|e| GitError::Spawn { what: what.clone(), reason: format!("it did not answer ({e})") })?;
        match serde_json::from_slice::<RunnerGitReply>(&reply) {
            Ok(RunnerGitReply::Refused { reason }) => Err(GitError::Invalid(reason)),
            Ok(RunnerGitReply::Failed { reason }) => Err(GitError::Failed { what, code: 1, stderr: reason }),
            Ok(answer) => Ok(answer),
            Err(e) => Err(GitError::Spawn { what, reason: format!("its answer did not parse ({e})") }),
        }
    }
}

fn unexpected(runner: &RunnerId, reply: &RunnerGitReply) -> GitError {
    GitError::Spawn { what: format!("runner {runner}'s git answer"), reason: format!("unexpected: {reply:?}") }
}
