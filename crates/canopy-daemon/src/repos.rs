//! The repos area (`Repos`): repositories (`repos.*`), an agent's and a run's checkout (made
//! while its account is held, then released to run), `workspace.status`, `runs.merge` and
//! `runs.discard`, a run's branch in its report, the merge gate (`merges.*`: the request,
//! its check, the decision by command or by an operator's reply in its topic (`MergeReplies`),
//! landing on the canonical repository), retention and `repos.gc`.
//!
//! Git runs through `canopy-git` (which confines it in any checkout a session has
//! written); one repository's mirror is changed by one task at a time (`repo_lock`). The
//! decisions and their records are the store's, the rules core's; this module joins them.
//! An approval returns at once (`merging`); landing, and a request's check, run as tasks
//! whose outcome is posted in the requester's home channel. Uses the store, delivery, git,
//! the notifier and `RunEnds`; does not start runs (`runs`).

use std::path::PathBuf;
use std::sync::Arc;

use canopy_core::acl::Caller;
use canopy_core::gate::Reply;
use canopy_core::repos::{self as rules};
use canopy_core::{Error, MergeRequest, Message};
use canopy_git::{GitError, MergeOutcome};
use canopy_proto::api::*;
use canopy_store::{Checkout, CheckoutState, Landed, MergeCheck, MergeSpec, RepoRow, ops};

use canopy_config::Config;
use canopy_store::Store;
use dashmap::DashMap;
use futures_util::future::BoxFuture;

use crate::delivery::Delivery;
use crate::notify::Notifier;
use crate::replies::ReplyHandler;
use crate::run_ends::RunEnds;

/// The repos area. Cheap to clone.
#[derive(Clone)]
pub struct Repos {
    store: Store,
    delivery: Delivery,
    notifier: Notifier,
    ends: RunEnds,
    config: Arc<Config>,
    data_dir: PathBuf,
    /// How git runs (confined in any checkout a session has written).
    git: Arc<canopy_git::Git>,
    /// One task at a time changes a repository's mirror, by repository name.
    repo_locks: Arc<DashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// One pass at a time makes the checkouts still preparing.
    preparing: Arc<tokio::sync::Mutex<()>>,
}

/// The merge gate's reading of an operator's reply in a `merge: ...` topic.
pub struct MergeReplies(pub Repos);

impl ReplyHandler for MergeReplies {
    fn name(&self) -> &'static str {
        "merge gate"
    }

    fn claims(&self, message: &Message) -> bool {
        message.topic.as_str().starts_with("merge: ")
    }

    fn react<'a>(&'a self, poster: &'a Caller, message: &'a Message) -> BoxFuture<'a, ()> {
        Box::pin(self.0.merge_reply(poster, message))
    }
}

/// Longest merge request summary, in bytes.
const MAX_SUMMARY: usize = 8192;
/// Longest check command, in bytes.
const MAX_CHECK: usize = 4096;

/// A git failure as an API error: what the caller can fix names `field`, the rest is internal.
fn git_error(field: &'static str, e: GitError) -> Error {
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
        notifier: Notifier,
        ends: RunEnds,
        config: Arc<Config>,
        data_dir: PathBuf,
        git: Arc<canopy_git::Git>,
    ) -> Self {
        Repos {
            store,
            delivery,
            notifier,
            ends,
            config,
            data_dir,
            git,
            repo_locks: Arc::default(),
            preparing: Arc::default(),
        }
    }

    /// The working directory of an account's checkout.
    pub(crate) fn checkout_dir(&self, handle: &str) -> PathBuf {
        self.data_dir.join("sessions").join(handle).join("work")
    }

    fn mirror(&self, repo: &RepoRow) -> PathBuf {
        self.git.mirror_path(&repo.name)
    }

    /// One task at a time changes a repository's mirror.
    fn repo_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
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
        let check = req.check.unwrap_or_default().trim().to_owned();
        if check.len() > MAX_CHECK {
            return Err(Error::TooLarge { field: "check", len: check.len(), max: MAX_CHECK });
        }
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
        let row = RepoRow { id: 0, name: req.name, source, base, check, created_at: String::new() };
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
            let req = ReposAddRequest {
                name: repo.name.clone(),
                source: repo.source.clone(),
                base: Some(repo.base.clone()),
                check: Some(repo.check.clone()),
            };
            self.register_repo(None, req, true).await.map_err(|e| (format!("repos[{i}] ({})", repo.name), e))?;
        }
        Ok(())
    }

    pub(crate) async fn repos_list(&self, _: Caller, _: ReposListRequest) -> Result<ReposListResponse, Error> {
        let (repos, checkouts) =
            self.store.read(|conn| Ok((ops::list_repos(conn)?, ops::checkouts(conn, None)?))).await?;
        Ok(ReposListResponse {
            repos: repos.iter().map(|r| r.view(self.mirror(r).display().to_string())).collect(),
            checkouts: checkouts.iter().map(|c| self.checkout_info(c)).collect(),
        })
    }

    fn checkout_info(&self, c: &Checkout) -> CheckoutInfo {
        CheckoutInfo {
            agent: c.account.to_string(),
            repo: c.repo.name.clone(),
            branch: c.branch.clone(),
            state: c.state.as_str().to_owned(),
            path: self.checkout_dir(c.account.as_str()).display().to_string(),
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
            if let Err(e) = self.ends.finish(*run, canopy_store::RunStatus::Failed, why).await {
                tracing::warn!(run, error = %e, "failing a run without a checkout failed");
            }
        }
        self.delivery.poke_runners().await;
    }

    /// The caller's ready checkout, or why it has none.
    async fn own_checkout(&self, caller: &Caller) -> Result<Checkout, Error> {
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
    async fn base_now(&self, repo: &RepoRow) -> Result<String, Error> {
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
        let dir = self.checkout_dir(caller.handle.as_str());
        let status =
            self.git.status(&self.mirror(&checkout.repo), &dir, &base).await.map_err(|e| git_error("caller", e))?;
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
        Ok(WorkspaceStatusResponse {
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
            Some(_) => {
                let dir = self.checkout_dir(caller.handle.as_str());
                let what = base.clone().unwrap_or_else(|| "HEAD".into());
                let what =
                    if what == "HEAD" || what.starts_with("refs/") { what } else { format!("refs/heads/{what}") };
                self.git
                    .publish(&mirror, &dir, &what, &rules::agent_ref(caller.handle.as_str()))
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
        Ok(Some(canopy_store::NewCheckout { repo_id: row.id, start }))
    }

    /// A finished run's report with its branch, commits, diffstat, tree and check appended.
    pub(crate) async fn run_report_with_branch(&self, run: i64, report: String) -> String {
        let handle = format!("run-{run}");
        let checkout = match self.store.read(move |conn| ops::checkout(conn, &handle)).await {
            Ok(Some(c)) if c.state == CheckoutState::Ready => c,
            _ => return report,
        };
        let dir = self.checkout_dir(checkout.account.as_str());
        let mirror = self.mirror(&checkout.repo);
        let summary = match self.git.summary(&mirror, &dir, &checkout.base_commit).await {
            Ok(summary) => summary,
            Err(e) => {
                return format!("{report}\n\n---\nbranch: {} (its state could not be read: {e})", checkout.branch);
            }
        };
        {
            let lock = self.repo_lock(&checkout.repo.name);
            let _held = lock.lock().await;
            let what = format!("refs/heads/{}", checkout.branch);
            if let Err(e) = self.git.publish(&mirror, &dir, &what, &rules::run_ref(run)).await {
                tracing::warn!(run, error = %e, "publishing a run's branch failed");
            }
        }
        let check = match checkout.repo.check.is_empty() {
            true => None,
            false => Some(self.git.check(&mirror, &dir, &checkout.repo.check).await),
        };
        let mut section = rules::run_branch_section(
            &checkout.branch,
            &checkout.base_commit,
            &summary.commits,
            &summary.diffstat,
            &summary.dirty,
            check.as_ref().map(|c| c.line()).as_deref(),
        );
        if let Some(check) = check.filter(|c| !c.passed && !c.tail.is_empty()) {
            section.push_str(&format!("check output (last lines):\n{}\n", canopy_core::redact::cut(&check.tail, 1500)));
        }
        format!("{report}{section}")
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
        let run_dir = self.checkout_dir(run_checkout.account.as_str());
        let lock = self.repo_lock(&own.repo.name);
        let _held = lock.lock().await;
        let what = format!("refs/heads/{}", run_checkout.branch);
        let head = self
            .git
            .publish(&mirror, &run_dir, &what, &rules::run_ref(run))
            .await
            .map_err(|e| git_error("run_id", e))?
            .ok_or_else(|| {
                Error::invalid("run_id", format!("run {run}'s checkout has no branch {}", run_checkout.branch))
            })?;
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
        let dir = self.checkout_dir(caller.handle.as_str());
        let outcome = self.git.merge_into(&mirror, &dir, &own.branch, &head, &message).await.map_err(|e| match e {
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
        if let Err(e) = canopy_git::remove_dir(&run_dir) {
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
        let dir = self.checkout_dir(checkout.account.as_str());
        {
            // Kept in the mirror all the same: a discarded branch is not merged, not lost.
            let lock = self.repo_lock(&checkout.repo.name);
            let _held = lock.lock().await;
            let what = format!("refs/heads/{}", checkout.branch);
            if let Err(e) = self.git.publish(&self.mirror(&checkout.repo), &dir, &what, &rules::run_ref(run)).await {
                tracing::warn!(run, error = %e, "keeping a discarded run's branch in the mirror failed");
            }
        }
        let who = caller.clone();
        self.store.write(move |conn| ops::close_run_checkout(conn, &who, run, CheckoutState::Discarded, "")).await?;
        canopy_git::remove_dir(&dir).map_err(|e| git_error("run_id", e))?;
        Ok(RunsDiscardResponse {
            discarded: true,
            message: format!("run {run}'s checkout is removed; its branch is not merged"),
        })
    }

    pub(crate) async fn merges_request(
        &self,
        caller: Caller,
        req: MergesRequestRequest,
    ) -> Result<MergeRequest, Error> {
        let own = self.own_checkout(&caller).await?;
        let title = rules::check_title(&req.title)?;
        let summary = req.summary.trim().to_owned();
        if summary.is_empty() {
            return Err(Error::invalid("summary", "must not be empty: say what changes and why"));
        }
        if summary.len() > MAX_SUMMARY {
            return Err(Error::TooLarge { field: "summary", len: summary.len(), max: MAX_SUMMARY });
        }
        if req.depends_on.len() > 20 {
            return Err(Error::invalid("depends_on", "at most 20 requests"));
        }
        let depends_on =
            req.depends_on.iter().map(|d| rules::parse_merge_id("depends_on", d)).collect::<Result<Vec<_>, _>>()?;
        let mirror = self.mirror(&own.repo);
        let dir = self.checkout_dir(caller.handle.as_str());
        let lock = self.repo_lock(&own.repo.name);
        let held = lock.lock().await;
        let what = format!("refs/heads/{}", own.branch);
        let head = self
            .git
            .publish(&mirror, &dir, &what, &rules::agent_ref(caller.handle.as_str()))
            .await
            .map_err(|e| git_error("caller", e))?
            .ok_or_else(|| Error::invalid("caller", format!("your checkout has no branch {}", own.branch)))?;
        let base = self.base_now(&own.repo).await?;
        if self.git.is_ancestor(&mirror, &head, &base).await.map_err(|e| git_error("caller", e))? {
            return Err(Error::invalid(
                "caller",
                format!("{} has no commits that are not on {}: commit your work first", own.branch, own.repo.base),
            ));
        }
        let spec = MergeSpec {
            repo_id: own.repo.id,
            branch: own.branch.clone(),
            head: head.clone(),
            title,
            summary,
            depends_on,
        };
        let who = caller.clone();
        let request = self.store.write(move |conn| ops::request_merge(conn, &who, &spec)).await?;
        let id = ops::merge_number(&request);
        self.git.set_ref(&mirror, &rules::merge_head_ref(id), &head).await.map_err(|e| git_error("caller", e))?;
        drop(held);
        let repos = self.clone();
        tokio::spawn(async move { repos.check_merge(id).await });
        Ok(request)
    }

    /// Checks a request's merged tree and posts the request for the operators.
    pub async fn check_merge(&self, id: i64) {
        let checked = async {
            let request = self.store.read(move |conn| ops::load_merge(conn, id)).await?;
            let repo_name = request.repo.clone();
            let repo = self.store.read(move |conn| ops::require_repo(conn, "repo", &repo_name)).await?;
            let (outcome, base) = self.merged_tree(&repo, &request, id).await?;
            let mirror = self.mirror(&repo);
            let (commits, diffstat) =
                self.git.compare(&mirror, &base, &request.head).await.map_err(|e| git_error("id", e))?;
            let (check, passed) = self.check_merged(&repo, &outcome, id).await;
            Ok::<_, Error>(MergeCheck { base_commit: base, commits, diffstat, check, passed })
        }
        .await;
        let check = match checked {
            Ok(check) => check,
            Err(e) => MergeCheck {
                base_commit: String::new(),
                commits: Vec::new(),
                diffstat: String::new(),
                check: format!("not run: {e}"),
                passed: false,
            },
        };
        match self.store.write(move |conn| ops::merge_checked(conn, id, &check)).await {
            Ok((request, notice)) => {
                self.notifier.notify("merge_request", &request);
                self.delivery.deliver_notices(vec![notice]).await
            }
            Err(e) => tracing::warn!(id, error = %e, "recording a merge request's check failed"),
        }
    }

    /// The request's head merged onto the base as it is now, in a scratch checkout; the
    /// result is in the mirror as `merged/<id>`.
    async fn merged_tree(
        &self,
        repo: &RepoRow,
        request: &MergeRequest,
        id: i64,
    ) -> Result<(MergeOutcome, String), Error> {
        let lock = self.repo_lock(&repo.name);
        let _held = lock.lock().await;
        let base = self.base_now(repo).await?;
        let scratch = self.git.scratch_path(&repo.name, &format!("merge-{id}"));
        let message = format!("Merge {} ({}: {})", request.branch, request.id, request.title);
        let outcome = self
            .git
            .merge_in_scratch(
                &self.mirror(repo),
                &scratch,
                &base,
                &request.head,
                &message,
                &rules::merge_result_ref(id),
            )
            .await
            .map_err(|e| git_error("id", e))?;
        Ok((outcome, base))
    }

    /// The check on a merged tree (in its scratch checkout, confined), as a line.
    async fn check_merged(&self, repo: &RepoRow, outcome: &MergeOutcome, id: i64) -> (String, bool) {
        let scratch = self.git.scratch_path(&repo.name, &format!("merge-{id}"));
        let result = match outcome {
            MergeOutcome::Conflict { files } => {
                (format!("not run: the branch conflicts with {} in {}", repo.base, files.join(", ")), false)
            }
            _ if repo.check.is_empty() => ("none configured".to_owned(), true),
            _ => {
                let check = self.git.check(&self.mirror(repo), &scratch, &repo.check).await;
                let mut line = check.line();
                if !check.passed && !check.tail.is_empty() {
                    line.push_str(&format!("\n{}", canopy_core::redact::cut(&check.tail, 1000)));
                }
                (line, check.passed)
            }
        };
        // A scratch checkout left behind is removed by the next check's `remove_dir` or `repos.gc`.
        if let Err(e) = canopy_git::remove_dir(&scratch) {
            tracing::warn!(error = %e, dir = %scratch.display(), "removing a merge check's scratch checkout failed");
        }
        result
    }

    pub(crate) async fn merges_list(&self, _: Caller, req: MergesListRequest) -> Result<MergesListResponse, Error> {
        let state = req.state;
        Ok(MergesListResponse { merges: self.store.read(move |conn| ops::list_merges(conn, state)).await? })
    }

    pub(crate) async fn merges_decide(&self, caller: Caller, req: MergesDecideRequest) -> Result<MergeRequest, Error> {
        let id = rules::parse_merge_id("id", &req.id)?;
        self.decide_merge(caller, id, req.approve, req.reason).await
    }

    /// Decides a request (an agent's attempt is refused and audited); an approval lands in
    /// a task and the request is returned `merging`.
    async fn decide_merge(
        &self,
        caller: Caller,
        id: i64,
        approve: bool,
        note: Option<String>,
    ) -> Result<MergeRequest, Error> {
        let note = note.map(|n| canopy_core::redact::cut(n.trim(), 1000)).filter(|n| !n.is_empty());
        let exists = self.store.read(move |conn| Ok(ops::load_merge(conn, id).is_ok())).await?;
        if !exists {
            rules::may_decide(&caller, approve, &format!("merge-{id}"))?;
            return Err(Error::invalid("id", format!("merge-{id} does not exist")));
        }
        let decided = self.store.write(move |conn| ops::decide_merge(conn, &caller, id, approve, note)).await?;
        self.delivery.deliver_notices(decided.notices).await;
        if let Some(error) = decided.refused {
            return Err(error);
        }
        if decided.land {
            let repos = self.clone();
            tokio::spawn(async move { repos.land(id).await });
        }
        Ok(decided.request)
    }

    /// Lands an approved request on the canonical repository, checking the merged tree again
    /// unless the base is where its check ran and the check passed there.
    async fn land(&self, id: i64) {
        let landed = async {
            let request = self.store.read(move |conn| ops::load_merge(conn, id)).await?;
            let repo_name = request.repo.clone();
            let repo = self.store.read(move |conn| ops::require_repo(conn, "repo", &repo_name)).await?;
            let (checked_base, passed) = self.store.read(move |conn| ops::merge_checked_base(conn, id)).await?;
            let mirror = self.mirror(&repo);
            let base = {
                let lock = self.repo_lock(&repo.name);
                let _held = lock.lock().await;
                self.base_now(&repo).await?
            };
            let result_ref = rules::merge_result_ref(id);
            let reuse = base == checked_base && passed;
            let commit = match reuse {
                true => self.git.rev(&mirror, &result_ref).await.map_err(|e| git_error("id", e))?,
                false => None,
            };
            let commit = match commit {
                Some(commit) => commit,
                None => {
                    let (outcome, _) = self.merged_tree(&repo, &request, id).await?;
                    let (line, passed) = self.check_merged(&repo, &outcome, id).await;
                    if !passed {
                        let why = match outcome {
                            MergeOutcome::Conflict { .. } => line.trim_start_matches("not run: ").to_owned(),
                            _ => format!("the check failed on the merged tree: {line}"),
                        };
                        return Ok(Landed::Refused(why));
                    }
                    match outcome {
                        MergeOutcome::UpToDate { commit } => return Ok(Landed::Merged { commit, fast_forward: true }),
                        _ => self
                            .git
                            .rev(&mirror, &result_ref)
                            .await
                            .map_err(|e| git_error("id", e))?
                            .ok_or_else(|| Error::Internal(format!("merge-{id}'s merged tree is missing")))?,
                    }
                }
            };
            let lock = self.repo_lock(&repo.name);
            let _held = lock.lock().await;
            match self.git.land(&mirror, &repo.source, &repo.base, &result_ref, &commit, &base).await {
                Ok(()) => Ok(Landed::Merged { fast_forward: commit == request.head, commit }),
                Err(e) => Ok(Landed::Refused(match e {
                    GitError::Invalid(m) => m,
                    other => other.to_string(),
                })),
            }
        }
        .await;
        let landed = landed.unwrap_or_else(|e: Error| Landed::Refused(e.to_string()));
        match self.store.write(move |conn| ops::finish_merge(conn, id, &landed)).await {
            Ok((_, notice)) => self.delivery.deliver_notices(vec![notice]).await,
            Err(e) => tracing::warn!(id, error = %e, "recording a merge's outcome failed"),
        }
    }

    /// A post in a `merge: <title>` topic that reads as an answer: it decides only in the
    /// request's own topic of its requester's home channel, and only an operator's does; an
    /// agent's `approve` is refused and audited. An operator's reply that decides nothing is
    /// answered in the topic.
    async fn merge_reply(&self, caller: &Caller, message: &Message) {
        let Some(reply) = Reply::parse(&message.body) else { return };
        let (channel, topic) = (message.channel.to_string(), message.topic.to_string());
        let found = self.store.read(move |conn| ops::merge_in_topic(conn, &channel, &topic)).await;
        let id = match found {
            Ok(Some(id)) => id,
            // A `merge: ` topic that holds no request: a conversation, nothing to decide.
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, seq = %message.seq, "finding the merge request of a reply failed");
                return;
            }
        };
        let answer = match reply {
            Reply::Unclear if caller.is_operator() => Some(
                "Reply exactly `approve`, or `deny <reason>`, to decide this merge request; nothing changed."
                    .to_owned(),
            ),
            Reply::Unclear => None,
            Reply::Approve => self.decide_merge(caller.clone(), id, true, None).await.err().map(|e| e.to_string()),
            Reply::Deny { reason } => {
                self.decide_merge(caller.clone(), id, false, Some(reason)).await.err().map(|e| e.to_string())
            }
        };
        // An agent's refused attempt was already told; an operator's failed decision is answered.
        if let Some(answer) = answer.filter(|_| caller.is_operator()) {
            match self.store.write(move |conn| ops::merge_notice(conn, id, &answer)).await {
                Ok(notice) => self.delivery.deliver_notices(vec![notice]).await,
                Err(e) => tracing::warn!(id, error = %e, "answering a reply in a merge topic failed"),
            }
        }
    }

    /// At start: merges a stopped daemon left half-done are pending again; unchecked
    /// requests are checked; checkouts still preparing are made.
    pub async fn recover(&self) {
        match self.store.write(ops::recover_merges).await {
            Ok((notices, checking)) => {
                self.delivery.deliver_notices(notices).await;
                for id in checking {
                    let repos = self.clone();
                    tokio::spawn(async move { repos.check_merge(id).await });
                }
            }
            Err(e) => tracing::warn!(error = %e, "recovering merge requests failed"),
        }
        self.prepare_checkouts().await;
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
            let dir = self.checkout_dir(checkout.account.as_str());
            let target = match checkout.run {
                Some((run, _)) => rules::run_ref(run),
                None => rules::agent_ref(checkout.account.as_str()),
            };
            if dir.exists() {
                let lock = self.repo_lock(&checkout.repo.name);
                let _held = lock.lock().await;
                let what = format!("refs/heads/{}", checkout.branch);
                if let Err(e) = self.git.publish(&self.mirror(&checkout.repo), &dir, &what, &target).await {
                    tracing::warn!(agent = %checkout.account, error = %e, "keeping a stale checkout's branch failed");
                    continue;
                }
            }
            if let Err(e) = canopy_git::remove_dir(&dir) {
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
