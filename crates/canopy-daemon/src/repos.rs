//! The repos area (`Repos`): repositories (`repos.*`), an agent's and a run's checkout (made
//! while its account is held, then released to run), `workspace.status`, `runs.merge` and
//! `runs.discard`, a run's branch in its report, retention and `repos.gc`; and the mirrors,
//! locks and git the merge gate (`merges`) uses.
//!
//! Git runs through `canopy-git` (which confines it in any checkout a session has
//! written); one repository's mirror is changed by one task at a time (`repo_lock`). The
//! decisions and their records are the store's, the rules core's; this module joins them.
//! Uses the store, delivery, git and `RunEnds`; does not start runs (`runs`) or decide merges
//! (`merges`).

use std::path::PathBuf;
use std::sync::Arc;

use canopy_core::Error;
use canopy_core::acl::Caller;
use canopy_core::repos::{self as rules};
use canopy_git::{GitError, MergeOutcome};
use canopy_proto::api::*;
use canopy_store::{Checkout, CheckoutState, RepoRow, ops};

use canopy_config::Config;
use canopy_store::Store;
use dashmap::DashMap;

use crate::delivery::Delivery;
use crate::run_ends::RunEnds;
use crate::trees::Trees;

/// The repos area. Cheap to clone.
#[derive(Clone)]
pub struct Repos {
    store: Store,
    delivery: Delivery,
    ends: RunEnds,
    config: Arc<Config>,
    data_dir: PathBuf,
    /// How git runs (confined in any checkout a session has written).
    git: Arc<canopy_git::Git>,
    /// The checkouts' working trees, here or on their runners.
    trees: Trees,
    /// One task at a time changes a repository's mirror, by repository name.
    repo_locks: Arc<DashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// One pass at a time makes the checkouts still preparing.
    preparing: Arc<tokio::sync::Mutex<()>>,
}

/// A git failure as an API error: what the caller can fix names `field`, the rest is internal.
pub(crate) fn git_error(field: &'static str, e: GitError) -> Error {
    match e {
        GitError::Invalid(message) => Error::invalid(field, message),
        other => Error::Internal(format!("git: {other}")),
    }
}

impl Repos {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Store,
        delivery: Delivery,
        ends: RunEnds,
        config: Arc<Config>,
        data_dir: PathBuf,
        git: Arc<canopy_git::Git>,
        trees: Trees,
    ) -> Self {
        Repos {
            store,
            delivery,
            ends,
            config,
            data_dir,
            git,
            trees,
            repo_locks: Arc::default(),
            preparing: Arc::default(),
        }
    }

    /// The checkouts' working trees (the merge gate and the watcher read them).
    pub(crate) fn trees(&self) -> &Trees {
        &self.trees
    }

    /// How git runs (the merge gate runs it on this area's mirrors).
    pub(crate) fn git(&self) -> &canopy_git::Git {
        &self.git
    }

    /// The working directory of an account's checkout on the daemon's disk.
    pub(crate) fn checkout_dir(&self, handle: &str) -> PathBuf {
        self.trees.dir(handle)
    }

    pub(crate) fn mirror(&self, repo: &RepoRow) -> PathBuf {
        self.git.mirror_path(&repo.name)
    }

    /// One task at a time changes a repository's mirror.
    pub(crate) fn repo_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.repo_locks.entry(name.to_owned()).or_default().clone()
    }

    /// The source as given: a URL as is, a path made absolute (relative to the project).
    fn source(&self, source: &str) -> Result<String, Error> {
        let source = source.trim();
        if source.is_empty() || source.len() > 1000 || source.starts_with('-') || source.chars().any(char::is_control) {
            return Err(Error::invalid("source", "must be a path or a URL of at most 1000 characters"));
        }
        let url = source.contains("://") || (source.contains('@') && source.contains(':') && !source.starts_with('/'));
        match url {
            true => Ok(source.to_owned()),
            false => Ok(canopy_config::paths::relative_to_project(&self.data_dir, source).display().to_string()),
        }
    }

    /// Makes a mirror (if missing) and records the repository.
    async fn register_repo(
        &self,
        caller: Option<&Caller>,
        req: ReposAddRequest,
        update: bool,
    ) -> Result<RepoRow, Error> {
        rules::check_repo_name("name", &req.name)?;
        let base = req.base.unwrap_or_else(|| "main".into());
        rules::check_branch("base", &base)?;
        let mut named: Vec<(String, String)> = req.checks.into_iter().collect();
        if let Some(check) = req.check.map(|c| c.trim().to_owned()).filter(|c| !c.is_empty()) {
            if named.iter().any(|(name, _)| name == canopy_core::checks::LEGACY_NAME) {
                return Err(Error::invalid("check", "a check named check is given twice (check and checks.check)"));
            }
            named.push((canopy_core::checks::LEGACY_NAME.to_owned(), check));
        }
        let checks = canopy_core::checks::check_checks("checks", &named)?;
        let review = req.review.unwrap_or_default();
        let source = self.source(&req.source)?;
        // Held before the record is read: two adds of one name cannot both make a mirror.
        let lock = self.repo_lock(&req.name);
        let _held = lock.lock().await;
        let name = req.name.clone();
        let existing = self.store.read(move |conn| ops::repo(conn, &name)).await?;
        if existing.is_some() && !update {
            return Err(Error::AlreadyExists { field: "name", what: format!("a repository named {}", req.name) });
        }
        let mirror = self.git.mirror_path(&req.name);
        if existing.is_none() || !mirror.exists() {
            // A mirror without a record is a leftover of an attempt that did not commit.
            if existing.is_none() && mirror.exists() {
                canopy_git::remove_dir(&mirror).map_err(|e| git_error("name", e))?;
            }
            self.git.create_mirror(&source, &mirror, &base).await.map_err(|e| match e {
                GitError::Invalid(m) if m.contains("no branch") => Error::invalid("base", m),
                other => Error::invalid("source", format!("{source} could not be mirrored: {other}")),
            })?;
        } else if self.git.base_commit(&mirror, &base).await.is_err() {
            // A base the mirror has not fetched yet (a changed entry): fetch once. Otherwise
            // nothing is fetched here; each use refreshes what it needs.
            self.git.refresh(&mirror, &source, &base).await.map_err(|e| git_error("base", e))?;
        }
        let row = RepoRow { id: 0, name: req.name, source, base, checks, review, created_at: String::new() };
        let caller = caller.cloned();
        self.store.write(move |conn| ops::add_repo(conn, caller.as_ref(), &row, update)).await
    }

    pub(crate) async fn repos_add(&self, caller: Caller, req: ReposAddRequest) -> Result<canopy_core::Repo, Error> {
        let row = self.register_repo(Some(&caller), req, false).await?;
        Ok(row.view(self.mirror(&row).display().to_string()))
    }

    /// Registers `[[repos]]` at start (making missing mirrors, updating changed entries).
    pub async fn register_configured_repos(&self) -> Result<(), (String, Error)> {
        for (i, repo) in self.config.repos.iter().enumerate() {
            let key = format!("repos[{i}] ({})", repo.name);
            let review = canopy_core::review::ReviewPolicy::parse(&repo.review).ok_or_else(|| {
                (key.clone(), Error::invalid("review", format!("{:?} is not one of: operator, required", repo.review)))
            })?;
            let req = ReposAddRequest {
                name: repo.name.clone(),
                source: repo.source.clone(),
                base: Some(repo.base.clone()),
                check: Some(repo.check.clone()),
                checks: repo.checks.clone(),
                review: Some(review),
            };
            self.register_repo(None, req, true).await.map_err(|e| (key, e))?;
        }
        Ok(())
    }

    pub(crate) async fn repos_list(&self, _: Caller, _: ReposListRequest) -> Result<ReposListResponse, Error> {
        let (repos, checkouts) =
            self.store.read(|conn| Ok((ops::list_repos(conn)?, ops::checkouts(conn, None)?))).await?;
        Ok(ReposListResponse {
            repos: repos.iter().map(|r| r.view(self.mirror(r).display().to_string())).collect(),
            checkouts: checkouts.iter().map(|c| self.checkout_info(c)).collect(),
            conflicts: self.conflicts(None, None).await?,
        })
    }

    /// The conflicts known between live branches and the base, of one repository or branch.
    pub(crate) async fn conflicts(
        &self,
        repo: Option<String>,
        branch: Option<String>,
    ) -> Result<Vec<ConflictInfo>, Error> {
        let found = self.store.read(move |conn| ops::conflicts(conn, repo.as_deref(), branch.as_deref())).await?;
        Ok(found
            .into_iter()
            .map(|c| ConflictInfo {
                repo: c.repo,
                branch: c.branch,
                other: c.other,
                files: c.files,
                found_at: c.found_at,
            })
            .collect())
    }

    fn checkout_info(&self, c: &Checkout) -> CheckoutInfo {
        CheckoutInfo {
            agent: c.account.to_string(),
            repo: c.repo.name.clone(),
            branch: c.branch.clone(),
            state: c.state.as_str().to_owned(),
            path: c.state.has_directory().then(|| self.checkout_dir(c.account.as_str()).display().to_string()),
            note: c.note.clone(),
        }
    }

    /// Makes every checkout still `preparing` (at start, and after an account is created).
    pub async fn prepare_checkouts(&self) {
        let _one_pass = self.preparing.lock().await;
        let pending = self.store.read(|conn| ops::checkouts(conn, Some(CheckoutState::Preparing))).await;
        match pending {
            Ok(pending) => {
                for checkout in pending {
                    self.prepare(&checkout).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing checkouts to prepare failed"),
        }
    }

    /// Makes one checkout and lets its account run; a failure holds the account and says why
    /// (a run fails with the reason in its report).
    async fn prepare(&self, checkout: &Checkout) {
        let handle = checkout.account.to_string();
        let dir = self.checkout_dir(&handle);
        let mirror = self.mirror(&checkout.repo);
        let made = async {
            let start = match checkout.start.is_empty() {
                false => checkout.start.clone(),
                true => {
                    let lock = self.repo_lock(&checkout.repo.name);
                    let _held = lock.lock().await;
                    match self.git.refresh(&mirror, &checkout.repo.source, &checkout.repo.base).await {
                        Ok(commit) => commit,
                        Err(e) => {
                            tracing::warn!(repo = %checkout.repo.name, error = %e, "refreshing a mirror failed; using its last base");
                            self.git.base_commit(&mirror, &checkout.repo.base).await?
                        }
                    }
                }
            };
            // Nothing has run in a checkout still preparing: an earlier attempt's is ours to redo.
            canopy_git::remove_dir(&dir)?;
            self.git.create_checkout(&mirror, &dir, &checkout.branch, &start, &handle).await?;
            Ok::<_, GitError>(start)
        }
        .await;
        let (state, commit, note) = match made {
            Ok(start) => (CheckoutState::Ready, Some(start), None),
            Err(e) => (CheckoutState::Failed, None, Some(e.to_string())),
        };
        let recorded = {
            let (handle, note) = (handle.clone(), note.clone());
            self.store
                .write(move |conn| ops::set_checkout(conn, &handle, state, commit.as_deref(), note.as_deref()))
                .await
        };
        if let Err(e) = recorded {
            tracing::warn!(agent = %handle, error = %e, "recording a checkout failed");
        }
        if let (Some(note), Some((run, _))) = (note, checkout.run.as_ref()) {
            let why = format!("its checkout of {} could not be made: {note}", checkout.repo.name);
            if let Err(e) = self.ends.finish(*run, canopy_store::RunStatus::Failed, why, None).await {
                tracing::warn!(run, error = %e, "failing a run without a checkout failed");
            }
        }
        self.delivery.poke_runners().await;
    }

    /// The caller's ready checkout, or why it has none.
    pub(crate) async fn own_checkout(&self, caller: &Caller) -> Result<Checkout, Error> {
        if caller.is_operator() {
            return Err(Error::invalid("caller", "operators have no checkout; this is an agent's tool"));
        }
        let handle = caller.handle.to_string();
        let found = self.store.read(move |conn| ops::checkout(conn, &handle)).await?;
        match found {
            Some(c) if c.state == CheckoutState::Ready => Ok(c),
            Some(c) => Err(Error::invalid("caller", format!("your checkout is {}", c.state.as_str()))),
            None => Err(Error::invalid(
                "caller",
                format!("{} works on no repository, so it has no checkout", caller.handle),
            )),
        }
    }

    /// The base branch's commit, refreshed from the canonical repository when it answers.
    pub(crate) async fn base_now(&self, repo: &RepoRow) -> Result<String, Error> {
        let mirror = self.mirror(repo);
        match self.git.refresh(&mirror, &repo.source, &repo.base).await {
            Ok(commit) => Ok(commit),
            Err(e) => {
                tracing::warn!(repo = %repo.name, error = %e, "refreshing a mirror failed; using its last base");
                self.git.base_commit(&mirror, &repo.base).await.map_err(|e| git_error("repo", e))
            }
        }
    }

    pub(crate) async fn workspace_status(
        &self,
        caller: Caller,
        _: WorkspaceStatusRequest,
    ) -> Result<WorkspaceStatusResponse, Error> {
        let checkout = self.own_checkout(&caller).await?;
        let base = {
            let lock = self.repo_lock(&checkout.repo.name);
            let _held = lock.lock().await;
            self.base_now(&checkout.repo).await?
        };
        let status = self
            .trees
            .status(&checkout, &self.mirror(&checkout.repo), &base)
            .await
            .map_err(|e| git_error("caller", e))?;
        let manager = caller.handle.to_string();
        let (runs, checkouts) = self
            .store
            .read(move |conn| Ok((ops::list_runs(conn, &manager, false)?, ops::run_checkouts(conn, &manager)?)))
            .await?;
        let unmerged_runs = checkouts
            .into_iter()
            .filter(|c| c.state == CheckoutState::Ready)
            .filter_map(|c| {
                let (id, _) = c.run?;
                let run = runs.iter().find(|r| r.id == id && r.ended_at.is_some())?;
                Some(RunBranch { run_id: id, branch: c.branch, status: run.status.as_str().to_owned() })
            })
            .collect();
        let (repo_id, branch) = (checkout.repo.id, checkout.branch.clone());
        let checks = self.store.read(move |conn| ops::latest_checks(conn, repo_id, &branch)).await?;
        let conflicts = self.conflicts(Some(checkout.repo.name.clone()), Some(checkout.branch.clone())).await?;
        Ok(WorkspaceStatusResponse {
            checks,
            conflicts,
            repo: checkout.repo.name.clone(),
            branch: status.branch,
            own_branch: checkout.branch,
            head: status.head,
            base: checkout.repo.base,
            ahead: status.ahead,
            behind: status.behind,
            dirty: status.dirty,
            unmerged_runs,
        })
    }

    /// What a run with a checkout starts from, and in which repository: the Manager's own
    /// repository (default) from its current HEAD or `base`, published into the mirror; or
    /// another repository from its base branch (or `base` there).
    pub(crate) async fn run_checkout(
        &self,
        caller: &Caller,
        repo: Option<String>,
        base: Option<String>,
    ) -> Result<Option<canopy_store::NewCheckout>, Error> {
        if let Some(base) = &base {
            rules::check_revision("base", base)?;
        }
        let handle = caller.handle.to_string();
        let own = self
            .store
            .read(move |conn| ops::checkout(conn, &handle))
            .await?
            .filter(|c| c.state == CheckoutState::Ready);
        let repo_name = match (&repo, &own) {
            (Some(name), _) => name.clone(),
            (None, Some(own)) => own.repo.name.clone(),
            (None, None) if base.is_some() => {
                return Err(Error::invalid("base", "a base needs a repository: you have none, so name one in repo"));
            }
            (None, None) => return Ok(None),
        };
        let lookup = repo_name.clone();
        let row = self.store.read(move |conn| ops::require_repo(conn, "repo", &lookup)).await?;
        let mirror = self.mirror(&row);
        let lock = self.repo_lock(&row.name);
        let _held = lock.lock().await;
        let start = match own.filter(|own| own.repo.id == row.id) {
            Some(own) => {
                let what = base.clone().unwrap_or_else(|| "HEAD".into());
                let what =
                    if what == "HEAD" || what.starts_with("refs/") { what } else { format!("refs/heads/{what}") };
                self.trees
                    .publish(&own, &mirror, &what, &rules::agent_ref(caller.handle.as_str()))
                    .await
                    .map_err(|e| git_error("base", e))?
                    .ok_or_else(|| Error::invalid("base", format!("your checkout has no {what}")))?
            }
            None => {
                let base_commit = self.base_now(&row).await?;
                match &base {
                    None => base_commit,
                    Some(rev) => self
                        .git
                        .rev(&mirror, &format!("refs/heads/{rev}"))
                        .await
                        .map_err(|e| git_error("base", e))?
                        .ok_or_else(|| Error::invalid("base", format!("{} has no branch {rev}", row.name)))?,
                }
            }
        };
        Ok(Some(canopy_store::NewCheckout { repo_id: row.id, start, read_only: false }))
    }

    /// A finished run's checkout, its directory when it is on this disk, and what it did
    /// since its base (or why that could not be read), its branch published into the mirror
    /// first; none without a ready checkout. A run whose runner is gone is read from what it
    /// last published.
    pub(crate) async fn run_tree(
        &self,
        run: i64,
    ) -> Option<(Checkout, Option<PathBuf>, Result<canopy_git::Summary, String>)> {
        let handle = format!("run-{run}");
        let checkout = match self.store.read(move |conn| ops::checkout(conn, &handle)).await {
            Ok(Some(c)) if c.state == CheckoutState::Ready => c,
            _ => return None,
        };
        let mirror = self.mirror(&checkout.repo);
        let dir = match self.trees.locate(checkout.account.as_str()).await {
            crate::trees::Tree::Here(dir) => Some(dir),
            crate::trees::Tree::Runner(_) => None,
        };
        let summary = self.trees.summary(&checkout, &mirror, &checkout.base_commit).await;
        if summary.is_ok() {
            let lock = self.repo_lock(&checkout.repo.name);
            let _held = lock.lock().await;
            let what = format!("refs/heads/{}", checkout.branch);
            if let Err(e) = self.trees.publish(&checkout, &mirror, &what, &rules::run_ref(run)).await {
                tracing::warn!(run, error = %e, "publishing a run's branch failed");
            }
        }
        let summary = match summary {
            Ok(summary) => Ok(summary),
            Err(e) if dir.is_none() => self.published_summary(&checkout, run).await.ok_or_else(|| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        Some((checkout, dir, summary))
    }

    /// What a run on a runner that is gone last published (`refs/canopy/runs/<id>`).
    async fn published_summary(&self, checkout: &Checkout, run: i64) -> Option<canopy_git::Summary> {
        let mirror = self.mirror(&checkout.repo);
        let head = self.git.rev(&mirror, &rules::run_ref(run)).await.ok().flatten()?;
        let (commits, diffstat) = self.git.compare(&mirror, &checkout.base_commit, &head).await.ok()?;
        Some(canopy_git::Summary { branch: checkout.branch.clone(), head, commits, diffstat, dirty: Vec::new() })
    }

    /// A run's branch head as its checkout has it now, published into the mirror; when its
    /// runner is gone, what it last published (`failed (runner lost)` keeps that).
    async fn latest_run_head(&self, checkout: &Checkout, mirror: &std::path::Path, run: i64) -> Result<String, Error> {
        let what = format!("refs/heads/{}", checkout.branch);
        let no_branch = || Error::invalid("run_id", format!("run {run}'s checkout has no branch {}", checkout.branch));
        match self.trees.publish(checkout, mirror, &what, &rules::run_ref(run)).await {
            Ok(Some(head)) => Ok(head),
            Ok(None) => Err(no_branch()),
            Err(e) => match self.trees.locate(checkout.account.as_str()).await {
                crate::trees::Tree::Runner(runner) => {
                    tracing::warn!(run, %runner, error = %e, "the run's runner did not publish; using what it pushed last");
                    self.git
                        .rev(mirror, &rules::run_ref(run))
                        .await
                        .map_err(|e| git_error("run_id", e))?
                        .ok_or_else(no_branch)
                }
                crate::trees::Tree::Here(_) => Err(git_error("run_id", e)),
            },
        }
    }

    pub(crate) async fn runs_merge(&self, caller: Caller, req: RunsMergeRequest) -> Result<RunsMergeResponse, Error> {
        let run = req.run_id;
        let who = caller.clone();
        let run_checkout = self.store.read(move |conn| ops::run_checkout_for(conn, &who, run)).await?;
        let own = self.own_checkout(&caller).await?;
        if own.repo.id != run_checkout.repo.id {
            return Err(Error::invalid(
                "run_id",
                format!("run {run} worked on {}, your checkout is of {}", run_checkout.repo.name, own.repo.name),
            ));
        }
        let mirror = self.mirror(&own.repo);
        let lock = self.repo_lock(&own.repo.name);
        let _held = lock.lock().await;
        let head = self.latest_run_head(&run_checkout, &mirror, run).await?;
        if head == run_checkout.base_commit {
            return Ok(RunsMergeResponse {
                merged: false,
                commit: String::new(),
                fast_forward: false,
                conflicts: Vec::new(),
                message: format!(
                    "run {run} committed nothing on {}; discard it with runs_discard",
                    run_checkout.branch
                ),
            });
        }
        let message = format!("Merge {} (run {run})", run_checkout.branch);
        let merged = self.trees.merge_into(&own, &mirror, &own.branch, &head, &rules::run_ref(run), &message).await;
        let outcome = merged.map_err(|e| match e {
            GitError::Invalid(m) => Error::ConflictOn { field: "run_id", reason: m },
            other => git_error("run_id", other),
        })?;
        let (commit, fast_forward) = match outcome {
            MergeOutcome::Conflict { files } => {
                return Ok(RunsMergeResponse {
                    merged: false,
                    commit: String::new(),
                    fast_forward: false,
                    message: format!(
                        "run {run}'s branch conflicts with {} in {}; nothing changed. Resolve it on your branch or brief a run to",
                        own.branch,
                        files.join(", ")
                    ),
                    conflicts: files,
                });
            }
            MergeOutcome::Merged { commit, fast_forward } => (commit, fast_forward),
            MergeOutcome::UpToDate { commit } => (commit, true),
        };
        let detail = format!("into {} at {}", own.branch, canopy_git::short(&commit));
        let who = caller.clone();
        self.store.write(move |conn| ops::close_run_checkout(conn, &who, run, CheckoutState::Merged, &detail)).await?;
        if let Err(e) = self.trees.remove(&run_checkout).await {
            tracing::warn!(run, error = %e, "removing a merged run's checkout failed");
        }
        Ok(RunsMergeResponse {
            merged: true,
            message: format!(
                "run {run}'s branch is merged into {} ({}); its checkout is removed",
                own.branch,
                if fast_forward { "a fast-forward" } else { "a merge commit" }
            ),
            commit,
            fast_forward,
            conflicts: Vec::new(),
        })
    }

    pub(crate) async fn runs_discard(
        &self,
        caller: Caller,
        req: RunsDiscardRequest,
    ) -> Result<RunsDiscardResponse, Error> {
        let run = req.run_id;
        let who = caller.clone();
        let checkout = self.store.read(move |conn| ops::run_checkout_for(conn, &who, run)).await?;
        {
            // Kept in the mirror all the same: a discarded branch is not merged, not lost.
            let lock = self.repo_lock(&checkout.repo.name);
            let _held = lock.lock().await;
            let what = format!("refs/heads/{}", checkout.branch);
            let mirror = self.mirror(&checkout.repo);
            if let Err(e) = self.trees.publish(&checkout, &mirror, &what, &rules::run_ref(run)).await {
                tracing::warn!(run, error = %e, "keeping a discarded run's branch in the mirror failed");
            }
        }
        let who = caller.clone();
        self.store.write(move |conn| ops::close_run_checkout(conn, &who, run, CheckoutState::Discarded, "")).await?;
        if let Err(e) = self.trees.remove(&checkout).await {
            // Recorded as discarded: a tree left on a runner that is gone is that runner's to sweep.
            tracing::warn!(run, error = %e, "removing a discarded run's checkout failed");
        }
        Ok(RunsDiscardResponse {
            discarded: true,
            message: format!("run {run}'s checkout is removed; its branch is not merged"),
        })
    }

    /// Retention: checkouts of despawned agents and of ended, undecided runs past
    /// `[retention] checkouts` are removed (their branches published to the mirror first).
    pub(crate) async fn prune_checkouts(&self) {
        let cutoff = self.store.clock().now_ms().saturating_sub(self.config.retention.checkouts.as_millis() as i64);
        let stale = match self.store.read(move |conn| ops::stale_checkouts(conn, cutoff)).await {
            Ok(stale) => stale,
            Err(e) => return tracing::warn!(error = %e, "finding stale checkouts failed"),
        };
        for checkout in stale {
            let target = match checkout.run {
                Some((run, _)) => rules::run_ref(run),
                None => rules::agent_ref(checkout.account.as_str()),
            };
            let gone = matches!(self.trees.locate(checkout.account.as_str()).await, crate::trees::Tree::Here(dir) if !dir.exists());
            if !gone {
                let lock = self.repo_lock(&checkout.repo.name);
                let _held = lock.lock().await;
                let what = format!("refs/heads/{}", checkout.branch);
                if let Err(e) = self.trees.publish(&checkout, &self.mirror(&checkout.repo), &what, &target).await {
                    tracing::warn!(agent = %checkout.account, error = %e, "keeping a stale checkout's branch failed");
                    continue;
                }
            }
            if let Err(e) = self.trees.remove(&checkout).await {
                tracing::warn!(agent = %checkout.account, error = %e, "removing a stale checkout failed");
                continue;
            }
            let handle = checkout.account.to_string();
            let removed = self
                .store
                .write(move |conn| {
                    ops::set_checkout(conn, &handle, CheckoutState::Removed, None, Some("removed by retention"))
                })
                .await;
            if let Err(e) = removed {
                tracing::warn!(agent = %checkout.account, error = %e, "recording a removed checkout failed");
            }
        }
    }

    pub(crate) async fn repos_gc(&self, _: Caller, req: ReposGcRequest) -> Result<ReposGcResponse, Error> {
        let (checkouts, repos, merges) = self
            .store
            .read(|conn| Ok((ops::checkouts(conn, None)?, ops::list_repos(conn)?, ops::list_merges(conn, None)?)))
            .await?;
        // A merge being checked or landed has its scratch checkout in use.
        let busy: Vec<String> = merges
            .iter()
            .filter(|m| matches!(m.state, canopy_core::MergeState::Checking | canopy_core::MergeState::Merging))
            .map(|m| m.id.clone())
            .collect();
        let mut leftovers = Vec::new();
        let mut remove = Vec::new();
        let owned = |handle: &str| checkouts.iter().find(|c| c.account.as_str() == handle);
        let sessions = self.data_dir.join("sessions");
        for entry in std::fs::read_dir(&sessions).into_iter().flatten().flatten() {
            let handle = entry.file_name().to_string_lossy().into_owned();
            let work = entry.path().join("work");
            if !canopy_git::is_checkout(&work) {
                continue;
            }
            let why = match owned(&handle) {
                None => Some("a checkout no account owns".to_owned()),
                Some(c)
                    if matches!(c.state, CheckoutState::Merged | CheckoutState::Discarded | CheckoutState::Removed) =>
                {
                    Some(format!("the checkout of a run that is {}", c.state.as_str()))
                }
                Some(_) => None,
            };
            if let Some(why) = why {
                leftovers.push(Leftover { path: work.display().to_string(), why });
                remove.push(work);
            }
        }
        for repo in &repos {
            // A merge's scratch checkout is removed once its check ran; one left behind by a
            // merge no longer checking or merging is an interrupted one's.
            let scratch = self.git.scratch_path(&repo.name, "");
            for entry in std::fs::read_dir(&scratch).into_iter().flatten().flatten() {
                if busy.iter().any(|id| entry.file_name().to_str() == Some(id.as_str())) {
                    continue;
                }
                leftovers.push(Leftover {
                    path: entry.path().display().to_string(),
                    why: "a merge's scratch checkout".into(),
                });
                remove.push(entry.path());
            }
        }
        for c in checkouts.iter().filter(|c| c.state == CheckoutState::Ready) {
            let dir = self.checkout_dir(c.account.as_str());
            if !canopy_git::is_checkout(&dir) {
                leftovers.push(Leftover {
                    path: dir.display().to_string(),
                    why: format!("{}'s checkout is missing", c.account),
                });
            }
        }
        if !req.dry_run {
            for path in &remove {
                canopy_git::remove_dir(path).map_err(|e| git_error("dry_run", e))?;
            }
        }
        Ok(ReposGcResponse { leftovers, removed: !req.dry_run })
    }

    /// The repository a spawn request's child gets: the one named, else the requester's.
    pub(crate) async fn spawn_repo(&self, caller: &Caller, repo: Option<String>) -> Result<Option<i64>, Error> {
        let handle = caller.handle.to_string();
        self.store
            .read(move |conn| match &repo {
                Some(name) => Ok(Some(ops::require_repo(conn, "repo", name)?.id)),
                None => Ok(ops::checkout(conn, &handle)?.map(|c| c.repo.id)),
            })
            .await
    }

    /// Brings a standing agent's checkout on this disk up to what it last pushed from another
    /// runner (a merge of the pushed head, a fast-forward when nothing was committed here since);
    /// nothing when it pushed nothing newer. A failure is logged: the session starts on what is here.
    pub(crate) async fn catch_up(&self, checkout: &Checkout) {
        if checkout.run.is_some() || checkout.state != CheckoutState::Ready {
            return;
        }
        let (dir, mirror) = self.session_checkout(checkout);
        let handle = checkout.account.as_str();
        let Ok(Some(pushed)) = self.git.rev(&mirror, &rules::agent_ref(handle)).await else { return };
        let Some(here) = canopy_git::Git::read_branch_head(&dir, &checkout.branch) else { return };
        if here == pushed {
            return;
        }
        let message = format!("Merge what {handle} pushed from another runner");
        match self.git.merge_into(&mirror, &dir, &checkout.branch, &pushed, &message).await {
            Ok(MergeOutcome::UpToDate { .. }) => {}
            Ok(outcome) => {
                tracing::info!(agent = %handle, ?outcome, "a checkout caught up with what its agent pushed elsewhere")
            }
            Err(e) => {
                tracing::warn!(agent = %handle, error = %e, "catching a checkout up with what its agent pushed failed")
            }
        }
    }

    /// The working directory and mirror a session of `handle` gets, when it has a checkout.
    pub(crate) fn session_checkout(&self, checkout: &Checkout) -> (PathBuf, PathBuf) {
        (self.checkout_dir(checkout.account.as_str()), self.mirror(&checkout.repo))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::testing::{Fixture, req};

    #[tokio::test]
    async fn bad_repositories_are_refused_naming_the_field_and_an_agent_without_one_is_told() {
        let fx = Fixture::new().await;
        let m1 = fx.manager("m1").await;
        let bad = fx.api.repos.repos_add(fx.operator.clone(), req(json!({ "name": "../x", "source": "/tmp" }))).await;
        assert!(matches!(bad, Err(canopy_core::Error::InvalidArgument { field: "name", .. })), "{bad:?}");
        let flag = fx.api.repos.repos_add(fx.operator.clone(), req(json!({ "name": "app", "source": "-x" }))).await;
        assert!(matches!(flag, Err(canopy_core::Error::InvalidArgument { field: "source", .. })), "{flag:?}");
        let status = fx.api.repos.workspace_status(m1, req(json!({}))).await;
        match status {
            Err(canopy_core::Error::InvalidArgument { reason, .. }) => assert!(reason.contains("no repository")),
            other => panic!("{other:?}"),
        }
        let listed =
            fx.api.repos.repos_list(fx.operator.clone(), req(json!({}))).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(listed.repos.is_empty());
    }
}
