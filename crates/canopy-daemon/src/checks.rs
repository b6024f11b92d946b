//! The checks area (`Checks`): a repository's named checks run confined on a tree (a run's
//! checkout, a scratch checkout of a commit, a merged tree), each recorded `running` and then
//! with its outcome and the last MiB of its log; `checks.status`, `checks.list`, `checks.log`;
//! and the notice in `checks: <branch>` that tells a branch's owner a check failed (with the
//! log's last 60 lines) or passes again.
//!
//! Uses the store, delivery and the repos area (mirrors, git, scratch paths). Does not decide
//! when checks run: runs (`runs`), new commits (`watch`), merge requests and the queue
//! (`merges`) ask.

use std::path::Path;
use std::sync::Arc;

use canopy_config::Config;
use canopy_core::Error;
use canopy_core::acl::Caller;
use canopy_core::checks::{self as rules, CheckRun, CheckState, CheckTrigger};
use canopy_proto::api::*;
use canopy_store::{CheckEnd, CheckStart, RepoRow, Store, ops};

use crate::delivery::Delivery;
use crate::repos::{Repos, git_error};

/// The checks area. Cheap to clone.
#[derive(Clone)]
pub struct Checks {
    store: Store,
    delivery: Delivery,
    repos: Repos,
    config: Arc<Config>,
}

/// Longest page of a check's log one `checks.log` answer carries.
const LOG_PAGE: usize = 256 * 1024;

/// What a set of checks ran for.
#[derive(Debug, Clone)]
pub struct Subject {
    pub trigger: CheckTrigger,
    /// A branch, or `merge-<n>`.
    pub name: String,
}

impl Checks {
    pub fn new(store: Store, delivery: Delivery, repos: Repos, config: Arc<Config>) -> Self {
        Checks { store, delivery, repos, config }
    }

    /// Runs every check of `repo` in `dir` (a checkout of `commit`), one after another, each
    /// recorded before it starts and with its outcome and log after.
    pub async fn run_in(&self, repo: &RepoRow, dir: &Path, commit: &str, subject: &Subject) -> Vec<CheckRun> {
        let mirror = self.repos.mirror(repo);
        let mut runs = Vec::with_capacity(repo.checks.len());
        for check in &repo.checks {
            let start = CheckStart {
                repo_id: repo.id,
                name: check.name.clone(),
                command: check.command.clone(),
                commit: commit.to_owned(),
                trigger: subject.trigger,
                subject: subject.name.clone(),
            };
            let id = match self.store.write(move |conn| ops::start_check(conn, &start)).await {
                Ok(id) => id,
                Err(e) => {
                    tracing::warn!(repo = %repo.name, check = %check.name, error = %e, "recording a check failed");
                    continue;
                }
            };
            let result = self.repos.git().check(&mirror, dir, &check.command, rules::MAX_LOG).await;
            let end = CheckEnd {
                state: match (result.passed, result.timed_out, result.outcome.starts_with("could not run")) {
                    (true, ..) => CheckState::Passed,
                    (_, true, _) => CheckState::TimedOut,
                    (_, _, true) => CheckState::Error,
                    _ => CheckState::Failed,
                },
                outcome: result.outcome,
                duration_ms: result.duration_ms,
                log: result.log,
            };
            match self.store.write(move |conn| ops::finish_check(conn, id, &end)).await {
                Ok(run) => runs.push(run),
                Err(e) => tracing::warn!(id, error = %e, "recording a check's outcome failed"),
            }
        }
        runs
    }

    /// Runs every check of `repo` on `commit` (in the mirror) in a fresh scratch checkout,
    /// removed after.
    pub async fn run_on_commit(&self, repo: &RepoRow, commit: &str, subject: &Subject) -> Result<Vec<CheckRun>, Error> {
        if repo.checks.is_empty() {
            return Ok(Vec::new());
        }
        let suffix = canopy_sys::random_hex(4).map_err(|e| Error::Internal(format!("randomness: {e}")))?;
        let scratch = self.repos.git().scratch_path(&repo.name, &format!("check-{suffix}"));
        let mirror = self.repos.mirror(repo);
        self.repos.git().scratch_checkout(&mirror, &scratch, commit).await.map_err(|e| git_error("ref", e))?;
        let runs = self.run_in(repo, &scratch, commit, subject).await;
        if let Err(e) = canopy_git::remove_dir(&scratch) {
            tracing::warn!(error = %e, dir = %scratch.display(), "removing a check's scratch checkout failed");
        }
        Ok(runs)
    }

    /// The first failing check's line and the last 60 lines of its log, for a notice.
    pub async fn failure(&self, runs: &[CheckRun]) -> Option<(CheckRun, String)> {
        let failed = runs.iter().find(|r| r.state != CheckState::Passed)?.clone();
        let id = ops::parse_check_id("id", &failed.id).ok()?;
        let log = self.store.read(move |conn| ops::check_log(conn, id)).await.map(|(_, log)| log).unwrap_or_default();
        Some((failed, rules::tail(&log, rules::TAIL_LINES)))
    }

    /// Tells `owner` in `checks: <branch>` that a check failed there, or that every check
    /// passes again after a failure; returns whether the branch is failing now.
    pub async fn tell(&self, owner: &str, branch: &str, commit: &str, runs: &[CheckRun], was_failing: bool) -> bool {
        let body = match self.failure(runs).await {
            Some((failed, tail)) => Some(rules::say::failed(branch, &failed, &tail)),
            None if was_failing && !runs.is_empty() => {
                let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
                Some(rules::say::green(branch, commit, &names))
            }
            None => None,
        };
        let failing = !rules::all_passed(runs);
        if let Some(body) = body {
            let (owner, topic) = (owner.to_owned(), rules::topic(branch));
            match self.store.write(move |conn| ops::notice_to(conn, &owner, &topic, &body)).await {
                Ok(notice) => self.delivery.deliver_notices(vec![notice]).await,
                Err(e) => tracing::warn!(branch, error = %e, "telling a branch's owner about its checks failed"),
            }
        }
        failing
    }

    /// Retention: check runs and logs past `[retention] checks`.
    pub async fn prune(&self) {
        let cutoff = self.store.clock().now_ms().saturating_sub(self.config.retention.checks.as_millis() as i64);
        if let Err(e) = self.store.write(move |conn| ops::prune_checks(conn, cutoff)).await {
            tracing::warn!(error = %e, "pruning checks failed");
        }
    }

    /// At start: checks a stopped daemon left running ended with it.
    pub async fn recover(&self) {
        if let Err(e) = self.store.write(ops::recover_checks).await {
            tracing::warn!(error = %e, "recovering checks failed");
        }
    }

    /// The repository and subject a `ref` names for `caller`: an agent's own branch by default,
    /// a run's branch (`run-N`), a merge request (`merge-N`) or a branch; an agent only in its
    /// own repository.
    async fn resolve(
        &self,
        caller: &Caller,
        reference: Option<String>,
        repo: Option<String>,
    ) -> Result<(RepoRow, String), Error> {
        let own = match caller.is_operator() {
            true => None,
            false => Some(self.repos.own_checkout(caller).await?),
        };
        if let Some(name) = &repo {
            canopy_core::repos::check_repo_name("repo", name)?;
        }
        let reference = reference.map(|r| r.trim().to_owned()).filter(|r| !r.is_empty());
        let (repo_name, subject) = match (reference, &own) {
            (None, Some(own)) => (own.repo.name.clone(), own.branch.clone()),
            (None, None) => {
                return Err(Error::invalid("ref", "name a branch, run-N or merge-N (operators have no branch)"));
            }
            (Some(r), _) if r.starts_with("merge-") => {
                let id = canopy_core::repos::parse_merge_id("ref", &r)?;
                let request = self
                    .store
                    .read(move |conn| ops::load_merge(conn, id))
                    .await
                    .map_err(|_| Error::invalid("ref", format!("{r} does not exist")))?;
                (request.repo, r)
            }
            (Some(r), _) if r.starts_with("run-") => {
                let handle = r.clone();
                let checkout = self.store.read(move |conn| ops::checkout(conn, &handle)).await?;
                let checkout = checkout.ok_or_else(|| Error::invalid("ref", format!("{r} has no checkout")))?;
                (checkout.repo.name, checkout.branch)
            }
            (Some(branch), _) => {
                canopy_core::repos::check_branch("ref", &branch)?;
                let name = match (&repo, &own) {
                    (Some(name), _) => name.clone(),
                    (None, Some(own)) => own.repo.name.clone(),
                    (None, None) => {
                        let subject = branch.clone();
                        let found =
                            self.store.read(move |conn| ops::list_checks(conn, None, Some(&subject), 1)).await?;
                        found.first().map(|c| c.repo.clone()).ok_or_else(|| {
                            Error::invalid("ref", format!("no checks have run for {branch}; name its repo"))
                        })?
                    }
                };
                (name, branch)
            }
        };
        if let Some(own) = &own
            && own.repo.name != repo_name
        {
            return Err(Error::invalid("ref", format!("{subject} is not in your repository {}", own.repo.name)));
        }
        let row = self.store.read(move |conn| ops::require_repo(conn, "repo", &repo_name)).await?;
        Ok((row, subject))
    }

    pub(crate) async fn checks_status(
        &self,
        caller: Caller,
        req: ChecksStatusRequest,
    ) -> Result<ChecksStatusResponse, Error> {
        let (repo, subject) = self.resolve(&caller, req.reference, req.repo).await?;
        let (repo_id, name) = (repo.id, subject.clone());
        let checks = self.store.read(move |conn| ops::latest_checks(conn, repo_id, &name)).await?;
        Ok(ChecksStatusResponse {
            repo: repo.name,
            subject,
            commit: checks.first().map(|c| c.commit.clone()).unwrap_or_default(),
            summary: match checks.is_empty() && !repo.checks.is_empty() {
                true => "not run yet".into(),
                false => rules::summary(&checks),
            },
            passed: rules::all_passed(&checks) && (repo.checks.is_empty() || !checks.is_empty()),
            checks,
        })
    }

    pub(crate) async fn checks_list(&self, _: Caller, req: ChecksListRequest) -> Result<ChecksListResponse, Error> {
        if let Some(repo) = &req.repo {
            canopy_core::repos::check_repo_name("repo", repo)?;
        }
        if let Some(branch) = &req.branch
            && !branch.starts_with("merge-")
        {
            canopy_core::repos::check_branch("branch", branch)?;
        }
        let limit = req.limit.unwrap_or(50);
        if limit == 0 || limit > 500 {
            return Err(Error::invalid("limit", "must be 1 to 500"));
        }
        let checks = self
            .store
            .read(move |conn| ops::list_checks(conn, req.repo.as_deref(), req.branch.as_deref(), limit))
            .await?;
        Ok(ChecksListResponse { checks })
    }

    pub(crate) async fn checks_log(&self, _: Caller, req: ChecksLogRequest) -> Result<ChecksLogResponse, Error> {
        let id = ops::parse_check_id("id", &req.id)?;
        let found = self.store.read(move |conn| ops::check_log(conn, id)).await;
        let (check, log) = found.map_err(|_| Error::invalid("id", format!("{} does not exist", req.id)))?;
        let offset = (req.offset as usize).min(log.len());
        let mut end = (offset + LOG_PAGE).min(log.len());
        while end < log.len() && !log.is_char_boundary(end) {
            end -= 1;
        }
        let start = (offset..=end).find(|i| log.is_char_boundary(*i)).unwrap_or(end);
        Ok(ChecksLogResponse {
            check,
            log: log[start..end].to_owned(),
            offset: start as u64,
            next_offset: (end < log.len()).then_some(end as u64),
        })
    }
}
