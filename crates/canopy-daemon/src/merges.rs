//! The merge gate (`Merges`): `merges.request` (the Manager's branch published into the mirror,
//! its merged tree checked in a scratch checkout with every named check, the request posted for
//! the operators), `merges.show`, `merges.list`, `merges.queue`, `merges.decide` and an
//! operator's reply in the request's topic (`MergeReplies`), the merge queue that lands
//! approved requests, reviews (`reviews.request` starts a reviewer run, `reviews.submit` records
//! its verdict), and recovery of what a stopped daemon left half-done.
//!
//! Only an operator decides; an agent's attempt is refused and audited in the store. An
//! approval puts the request in its repository's queue, worked by one task per repository:
//! each entry is merged onto the base as it is then in a scratch tree, every check runs on
//! exactly that tree, and the base moves only when all pass, so the base only ever holds trees
//! that passed. A landed request's linked issues' owners are then told (the issues stay as they
//! are). Uses the store, delivery, the notifier, the repos area (mirrors, locks, git), checks,
//! runs (a reviewer run) and issues; does not make checkouts or merge runs into a Manager's
//! checkout (`repos`), nor watch branches (`watch`).

use std::sync::Arc;

use canopy_core::acl::Caller;
use canopy_core::checks::{CheckRun, CheckTrigger};
use canopy_core::gate::Reply;
use canopy_core::repos::{self as rules};
use canopy_core::{Error, MergeRequest, MergeState, Message};
use canopy_git::{GitError, MergeOutcome};
use canopy_proto::api::*;
use canopy_store::{Landed, MergeCheck, MergeSpec, RepoRow, Store, ops};
use dashmap::DashMap;
use futures_util::future::BoxFuture;

use crate::checks::{Checks, Subject};
use crate::delivery::Delivery;
use crate::issues::Issues;
use crate::notify::Notifier;
use crate::replies::ReplyHandler;
use crate::repos::{Repos, git_error};
use crate::runs::Runs;

/// The merge gate. Cheap to clone.
#[derive(Clone)]
pub struct Merges {
    store: Store,
    delivery: Delivery,
    notifier: Notifier,
    repos: Repos,
    checks: Checks,
    runs: Runs,
    issues: Issues,
    /// Each repository's queue worker, woken when an entry may be ready, by repository name.
    queues: Arc<DashMap<String, Arc<tokio::sync::Notify>>>,
    /// One task at a time builds and checks a request's merged tree (its scratch checkout and
    /// `merged/<id>` are the request's), by request number.
    trees: Arc<DashMap<i64, Arc<tokio::sync::Mutex<()>>>>,
}

/// The merge gate's reading of an operator's reply in a `merge: ...` topic.
pub struct MergeReplies(pub Merges);

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
/// How long `merges.request` waits for the check before answering `checking`.
const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// How often the queue merges an entry again when the base moved under it (someone pushed)
/// before it refuses it.
const BASE_MOVES: usize = 3;
/// The run definition a review starts.
const REVIEWER: &str = "reviewer";
/// The most of the diff a reviewer's brief quotes, in bytes.
const BRIEF_DIFF: usize = 24 * 1024;

/// A request's checks on its merged tree: the one-line result, whether all passed, and the runs.
struct TreeChecks {
    line: String,
    passed: bool,
}

impl Merges {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Store,
        delivery: Delivery,
        notifier: Notifier,
        repos: Repos,
        checks: Checks,
        runs: Runs,
        issues: Issues,
    ) -> Self {
        Merges { store, delivery, notifier, repos, checks, runs, issues, queues: Arc::default(), trees: Arc::default() }
    }

    pub(crate) async fn merges_request(
        &self,
        caller: Caller,
        req: MergesRequestRequest,
    ) -> Result<MergeRequest, Error> {
        crate::issues::numbers("issues", &req.issues)?;
        let own = self.repos.own_checkout(&caller).await?;
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
        let mirror = self.repos.mirror(&own.repo);
        let lock = self.repos.repo_lock(&own.repo.name);
        let held = lock.lock().await;
        let what = format!("refs/heads/{}", own.branch);
        let head = self
            .repos
            .trees()
            .publish(&own, &mirror, &what, &rules::agent_ref(caller.handle.as_str()))
            .await
            .map_err(|e| git_error("caller", e))?
            .ok_or_else(|| Error::invalid("caller", format!("your checkout has no branch {}", own.branch)))?;
        let base = self.repos.base_now(&own.repo).await?;
        if self.repos.git().is_ancestor(&mirror, &head, &base).await.map_err(|e| git_error("caller", e))? {
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
            issues: req.issues.clone(),
        };
        let linked = req.issues;
        let who = caller.clone();
        let request = self.store.write(move |conn| ops::request_merge(conn, &who, &spec)).await?;
        let id = ops::merge_number(&request);
        self.repos
            .git()
            .set_ref(&mirror, &rules::merge_head_ref(id), &head)
            .await
            .map_err(|e| git_error("caller", e))?;
        drop(held);
        let merges = self.clone();
        let checking = tokio::spawn(async move { merges.check_merge(id).await });
        self.issues.announce(linked, &caller).await;
        // The answer waits for the check a while, so it usually carries the commits, diffstat
        // and result; a longer check goes on, and its result is posted in the request's topic.
        match tokio::time::timeout(ANSWER_WAIT, checking).await {
            Ok(Ok(())) => self.store.read(move |conn| ops::load_merge(conn, id)).await,
            _ => Ok(request),
        }
    }

    /// The lock on request `id`'s merged tree.
    fn tree_lock(&self, id: i64) -> Arc<tokio::sync::Mutex<()>> {
        self.trees.entry(id).or_default().clone()
    }

    /// Checks a request's merged tree and posts the request for the operators. A check of an
    /// older head still running finishes first (its result is then ignored: the head moved).
    pub async fn check_merge(&self, id: i64) {
        let lock = self.tree_lock(id);
        let _tree = lock.lock().await;
        let checked = async {
            let request = self.store.read(move |conn| ops::load_merge(conn, id)).await?;
            let repo_name = request.repo.clone();
            let repo = self.store.read(move |conn| ops::require_repo(conn, "repo", &repo_name)).await?;
            let (outcome, base) = self.merged_tree(&repo, &request, id).await?;
            let mirror = self.repos.mirror(&repo);
            let (commits, diffstat) =
                self.repos.git().compare(&mirror, &base, &request.head).await.map_err(|e| git_error("id", e))?;
            let tree = self.check_merged(&repo, &outcome, id, CheckTrigger::Merge).await;
            Ok::<_, Error>(MergeCheck {
                head: request.head,
                base_commit: base,
                commits,
                diffstat,
                check: tree.line,
                passed: tree.passed,
            })
        }
        .await;
        let check = match checked {
            Ok(check) => check,
            Err(e) => {
                let head = self.store.read(move |conn| ops::load_merge(conn, id)).await.map(|m| m.head);
                MergeCheck {
                    head: head.unwrap_or_default(),
                    base_commit: String::new(),
                    commits: Vec::new(),
                    diffstat: String::new(),
                    check: format!("not run: {e}"),
                    passed: false,
                }
            }
        };
        match self.store.write(move |conn| ops::merge_checked(conn, id, &check)).await {
            Ok(Some((request, notice))) => {
                self.notifier.merge("merge_request", &request, false);
                self.delivery.deliver_notices(vec![notice]).await;
                // In review with no verdict yet only where the repository requires a review
                // (`review::override_needed`): Canopy starts that review itself.
                if request.state == MergeState::InReview && request.verdict.is_none() {
                    self.start_review(&request, None).await;
                }
            }
            // Its head moved while it was checked: the newer head's check records instead.
            Ok(None) => {}
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
        let lock = self.repos.repo_lock(&repo.name);
        let _held = lock.lock().await;
        let base = self.repos.base_now(repo).await?;
        let scratch = self.repos.git().scratch_path(&repo.name, &format!("merge-{id}"));
        let message = format!("Merge {} ({}: {})", request.branch, request.id, request.title);
        let outcome = self
            .repos
            .git()
            .merge_in_scratch(
                &self.repos.mirror(repo),
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

    /// Every check on a merged tree (in its scratch checkout, confined), then the scratch
    /// checkout removed.
    async fn check_merged(&self, repo: &RepoRow, outcome: &MergeOutcome, id: i64, trigger: CheckTrigger) -> TreeChecks {
        let scratch = self.repos.git().scratch_path(&repo.name, &format!("merge-{id}"));
        let result = match outcome {
            MergeOutcome::Conflict { files } => TreeChecks {
                line: format!("not run: the branch conflicts with {} in {}", repo.base, files.join(", ")),
                passed: false,
            },
            MergeOutcome::Merged { commit, .. } | MergeOutcome::UpToDate { commit } => {
                let subject = Subject { trigger, name: format!("merge-{id}") };
                let runs: Vec<CheckRun> = self.checks.run_in(repo, &scratch, commit, &subject).await;
                let mut line = canopy_core::checks::summary(&runs);
                if let Some((failed, tail)) = self.checks.failure(&runs).await {
                    line.push_str(&format!("\n{} output (last lines):\n```\n{tail}\n```", failed.name));
                }
                TreeChecks { line, passed: canopy_core::checks::all_passed(&runs) }
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
        let merges = self.store.read(move |conn| ops::list_merges(conn, state)).await?;
        Ok(MergesListResponse { merges, conflicts: self.repos.conflicts(None, None).await? })
    }

    pub(crate) async fn merges_queue(&self, _: Caller, req: MergesQueueRequest) -> Result<MergesQueueResponse, Error> {
        let repo_id = match req.repo {
            Some(name) => Some(self.store.read(move |conn| ops::require_repo(conn, "repo", &name)).await?.id),
            None => None,
        };
        Ok(MergesQueueResponse { queue: self.store.read(move |conn| ops::merge_queue(conn, repo_id)).await? })
    }

    /// One request with its checks, reviews, conflicts and place in the queue.
    pub(crate) async fn merges_show(&self, _: Caller, req: MergesShowRequest) -> Result<MergeDetail, Error> {
        let id = rules::parse_merge_id("id", &req.id)?;
        let request = self.store.read(move |conn| ops::load_merge(conn, id)).await?;
        let repo_name = request.repo.clone();
        let (checks, reviews, queue) = self
            .store
            .read(move |conn| {
                let repo = ops::require_repo(conn, "repo", &repo_name)?;
                let checks = ops::latest_checks(conn, repo.id, &format!("merge-{id}"))?;
                Ok((checks, ops::reviews_of(conn, id)?, ops::merge_queue(conn, Some(repo.id))?))
            })
            .await?;
        let conflicts = self.repos.conflicts(Some(request.repo.clone()), Some(request.branch.clone())).await?;
        let queue_position = queue.iter().position(|m| m.id == request.id).map(|p| p as u32 + 1);
        Ok(MergeDetail { request, checks, reviews, conflicts, queue_position })
    }

    pub(crate) async fn merges_decide(&self, caller: Caller, req: MergesDecideRequest) -> Result<MergeRequest, Error> {
        let id = rules::parse_merge_id("id", &req.id)?;
        let override_reason =
            req.override_reason.map(|r| canopy_core::redact::cut(r.trim(), 1000)).filter(|r| !r.is_empty());
        self.decide_merge(caller, id, req.approve, req.reason, override_reason).await
    }

    /// Decides a request (an agent's attempt is refused and audited); an approval queues it
    /// and wakes its repository's queue.
    async fn decide_merge(
        &self,
        caller: Caller,
        id: i64,
        approve: bool,
        note: Option<String>,
        override_reason: Option<String>,
    ) -> Result<MergeRequest, Error> {
        let note = note.map(|n| canopy_core::redact::cut(n.trim(), 1000)).filter(|n| !n.is_empty());
        let exists = self.store.read(move |conn| Ok(ops::load_merge(conn, id).is_ok())).await?;
        if !exists {
            rules::may_decide(&caller, approve, &format!("merge-{id}"))?;
            return Err(Error::invalid("id", format!("merge-{id} does not exist")));
        }
        let decided =
            self.store.write(move |conn| ops::decide_merge(conn, &caller, id, approve, note, override_reason)).await?;
        self.delivery.deliver_notices(decided.notices).await;
        if let Some(error) = decided.refused {
            return Err(error);
        }
        // A denial can refuse queued requests stacked on it, so the queue looks either way.
        self.kick(&decided.request.repo);
        Ok(decided.request)
    }

    /// Wakes repository `repo`'s queue worker, starting it the first time.
    pub fn kick(&self, repo: &str) {
        let notify = self
            .queues
            .entry(repo.to_owned())
            .or_insert_with(|| {
                let notify = Arc::new(tokio::sync::Notify::new());
                let (merges, woken, name) = (self.clone(), notify.clone(), repo.to_owned());
                tokio::spawn(async move {
                    loop {
                        merges.drain(&name).await;
                        woken.notified().await;
                    }
                });
                notify
            })
            .clone();
        notify.notify_one();
    }

    /// Works repository `repo`'s queue until no entry is ready: one entry at a time.
    async fn drain(&self, repo: &str) {
        let name = repo.to_owned();
        let Ok(row) = self.store.read(move |conn| ops::require_repo(conn, "repo", &name)).await else { return };
        loop {
            let repo_id = row.id;
            let step = match self.store.write(move |conn| ops::queue_next(conn, repo_id)).await {
                Ok(step) => step,
                Err(e) => return tracing::warn!(repo, error = %e, "taking the merge queue's next entry failed"),
            };
            self.delivery.deliver_notices(step.notices).await;
            for refused in &step.refused {
                self.notifier.merge("merge_refused", refused, false);
            }
            let Some(next) = step.next else { return };
            let id = ops::merge_number(&next);
            let landed = self.land(&row, id).await.unwrap_or_else(|e| Landed::Refused(e.to_string()));
            self.record_landing(id, landed).await;
        }
    }

    /// Records how an entry ended, tells its requester, and tells its linked issues' owners.
    async fn record_landing(&self, id: i64, landed: Landed) {
        let commit = match &landed {
            Landed::Merged { commit, .. } => Some(commit.clone()),
            Landed::Refused(_) => None,
        };
        match self.store.write(move |conn| ops::finish_merge(conn, id, &landed)).await {
            Ok((request, notice)) => {
                if request.state == MergeState::Refused {
                    self.notifier.merge("merge_refused", &request, false);
                }
                self.delivery.deliver_notices(vec![notice]).await
            }
            Err(e) => tracing::warn!(id, error = %e, "recording a merge's outcome failed"),
        }
        // The outcome is recorded first, on its own: telling the linked issues' owners cannot
        // undo it.
        if let Some(commit) = commit {
            match self.store.write(move |conn| ops::issues_merge_landed(conn, id, &commit)).await {
                Ok(told) => self.issues.publish(told, &crate::delivery::canopy()).await,
                Err(e) => tracing::warn!(id, error = %e, "telling a landed merge's issues failed"),
            }
        }
    }

    /// The queue's step for one entry: merged onto the base as it is now in a scratch tree,
    /// every check run on exactly that tree, and the base moved to it only if all pass. An
    /// entry whose head the base already holds (a daemon stopped after landing it) is merged
    /// already, never twice; a base that moved under it is merged onto again.
    async fn land(&self, repo: &RepoRow, id: i64) -> Result<Landed, Error> {
        let lock = self.tree_lock(id);
        let _tree = lock.lock().await;
        let mirror = self.repos.mirror(repo);
        let result_ref = rules::merge_result_ref(id);
        for _ in 0..BASE_MOVES {
            let request = self.store.read(move |conn| ops::load_merge(conn, id)).await?;
            let (outcome, base) = self.merged_tree(repo, &request, id).await?;
            let commit = match &outcome {
                MergeOutcome::Merged { commit, .. } => commit.clone(),
                done => {
                    // Nothing to check: its scratch checkout goes now (else `repos.gc` finds it).
                    let _ = canopy_git::remove_dir(&self.repos.git().scratch_path(&repo.name, &format!("merge-{id}")));
                    return Ok(match done {
                        MergeOutcome::Conflict { files } => Landed::Refused(format!(
                            "it conflicts with {} as it is now, in {}",
                            repo.base,
                            files.join(", ")
                        )),
                        // The base already holds its head (a daemon stopped after landing it).
                        _ => Landed::Merged { commit: base, fast_forward: true },
                    });
                }
            };
            let tree = self.check_merged(repo, &outcome, id, CheckTrigger::Queue).await;
            if !tree.passed {
                return Ok(Landed::Refused(format!(
                    "the checks failed on {} merged with {}, so {} did not move: {}",
                    request.branch, repo.base, repo.base, tree.line
                )));
            }
            let lock = self.repos.repo_lock(&repo.name);
            let _held = lock.lock().await;
            match self.repos.git().land(&mirror, &repo.source, &repo.base, &result_ref, &commit, &base).await {
                Ok(()) => return Ok(Landed::Merged { fast_forward: commit == request.head, commit }),
                Err(GitError::BaseMoved { .. }) => {
                    tracing::info!(id, "the base moved while the queue checked an entry; merging onto it again");
                    continue;
                }
                Err(GitError::Invalid(m)) => return Ok(Landed::Refused(m)),
                Err(other) => return Ok(Landed::Refused(other.to_string())),
            }
        }
        Ok(Landed::Refused(format!("{} kept moving while the queue checked it; approve it again", repo.base)))
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
            Reply::Approve => {
                self.decide_merge(caller.clone(), id, true, None, None).await.err().map(|e| e.to_string())
            }
            Reply::Deny { reason } => {
                self.decide_merge(caller.clone(), id, false, Some(reason), None).await.err().map(|e| e.to_string())
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

    /// At start: unchecked requests are checked, and each queue a stopped daemon left is
    /// resumed (its entry merging stays at its head, and is not merged twice).
    pub async fn recover(&self) {
        let recovered = match self.store.write(ops::recover_merges).await {
            Ok(recovered) => recovered,
            Err(e) => return tracing::warn!(error = %e, "recovering merge requests failed"),
        };
        self.delivery.deliver_notices(recovered.notices).await;
        for id in recovered.checking {
            let merges = self.clone();
            tokio::spawn(async move { merges.check_merge(id).await });
        }
        match self.store.read(ops::list_repos).await {
            Ok(repos) => {
                for repo in repos.iter().filter(|r| recovered.queues.contains(&r.id)) {
                    self.kick(&repo.name);
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing repositories to resume their queues failed"),
        }
    }

    pub(crate) async fn reviews_request(
        &self,
        caller: Caller,
        req: ReviewsRequestRequest,
    ) -> Result<ReviewsRequestResponse, Error> {
        let id = rules::parse_merge_id("merge_request", &req.merge_request)?;
        let focus = req.focus.map(|f| f.trim().to_owned()).unwrap_or_default();
        if focus.len() > canopy_core::review::MAX_FOCUS {
            return Err(Error::TooLarge { field: "focus", len: focus.len(), max: canopy_core::review::MAX_FOCUS });
        }
        let found = self.store.read(move |conn| ops::load_merge(conn, id)).await;
        let request = match found {
            Ok(r) if r.requester == caller.handle => r,
            _ => {
                return Err(Error::invalid(
                    "merge_request",
                    format!("{} is not one of your requests", req.merge_request),
                ));
            }
        };
        if !matches!(request.state, MergeState::Checking | MergeState::InReview | MergeState::Pending) {
            return Err(Error::ConflictOn {
                field: "merge_request",
                reason: format!("{} is {}; only an undecided request is reviewed", request.id, request.state),
            });
        }
        self.review_run(&caller, &request, focus).await
    }

    /// Starts a review of `request` on its own (`review = "required"`), as its requester.
    async fn start_review(&self, request: &MergeRequest, focus: Option<String>) {
        let caller = Caller { handle: request.requester.clone(), kind: canopy_core::AccountKind::Agent };
        if let Err(e) = self.review_run(&caller, request, focus.unwrap_or_default()).await {
            let body = format!("A review of {} could not start: {e}. Ask for one with review_request.", request.id);
            let id = ops::merge_number(request);
            match self.store.write(move |conn| ops::merge_notice(conn, id, &body)).await {
                Ok(notice) => self.delivery.deliver_notices(vec![notice]).await,
                Err(e) => tracing::warn!(id, error = %e, "telling a review that could not start failed"),
            }
        }
    }

    /// A reviewer run on the request's merged tree: its brief carries the summary, the linked
    /// issues, the checks and the diff against the base.
    async fn review_run(
        &self,
        caller: &Caller,
        request: &MergeRequest,
        focus: String,
    ) -> Result<ReviewsRequestResponse, Error> {
        let id = ops::merge_number(request);
        let repo_name = request.repo.clone();
        let (repo, issues) = self
            .store
            .read(move |conn| Ok((ops::require_repo(conn, "repo", &repo_name)?, ops::merge_issues(conn, id)?)))
            .await?;
        let mirror = self.repos.mirror(&repo);
        let merged = self
            .repos
            .git()
            .rev(&mirror, &rules::merge_result_ref(id))
            .await
            .map_err(|e| git_error("merge_request", e))?;
        let (base, _) = self.store.read(move |conn| ops::merge_checked_base(conn, id)).await?;
        let merged = merged.filter(|_| !base.is_empty() && request.state != MergeState::Checking);
        // The merged tree must hold this head: one made for an older head (before a conflict,
        // or a check still going) is not what the request asks to merge.
        let current = match &merged {
            Some(m) => self.repos.git().is_ancestor(&mirror, &request.head, m).await.unwrap_or(false),
            None => false,
        };
        let Some(merged) = merged.filter(|_| current) else {
            return Err(Error::ConflictOn {
                field: "merge_request",
                reason: format!(
                    "{} has no merged tree to review yet (it is being checked, or it conflicts with {})",
                    request.id, repo.base
                ),
            });
        };
        let diff = self
            .repos
            .git()
            .diff(&mirror, &base, &merged, BRIEF_DIFF)
            .await
            .map_err(|e| git_error("merge_request", e))?;
        let brief = canopy_core::review::brief(request, &base, &issues, &focus, &diff);
        let role = self.runs.delta_role(REVIEWER)?;
        let checkout = canopy_store::NewCheckout { repo_id: repo.id, start: merged, read_only: true };
        let issue = issues.first().map(|(n, _)| *n);
        let started = self.runs.launch(caller.clone(), REVIEWER.to_owned(), role, brief, Some(checkout), issue).await?;
        let run_id = started.run.id;
        let head = request.head.clone();
        let review = self.store.write(move |conn| ops::start_review(conn, id, run_id, &head, &focus)).await?;
        let body = canopy_core::review::say::started(&request.id, run_id);
        if let Ok(notice) = self.store.write(move |conn| ops::merge_notice(conn, id, &body)).await {
            self.delivery.deliver_notices(vec![notice]).await;
        }
        Ok(ReviewsRequestResponse { review, run_id })
    }

    pub(crate) async fn reviews_submit(
        &self,
        caller: Caller,
        req: ReviewsSubmitRequest,
    ) -> Result<canopy_core::review::Review, Error> {
        let who = caller.clone();
        let submitted = self
            .store
            .write(move |conn| ops::submit_review(conn, &who, req.verdict, &req.summary, &req.comments))
            .await?;
        self.delivery.deliver_notices(submitted.notices).await;
        if submitted.request.state == MergeState::Pending {
            self.notifier.merge("merge_request", &submitted.request, false);
        }
        Ok(submitted.review)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::testing::{Fixture, agent, req};

    #[tokio::test]
    async fn a_merge_needs_a_checkout_and_an_unknown_request_is_refused_to_agents_and_operators_alike() {
        let fx = Fixture::new().await;
        fx.manager("m1").await;
        let ask = req(json!({ "title": "parser", "summary": "the new parser" }));
        let refused = fx.api.merges.merges_request(agent("m1"), ask).await;
        match refused {
            Err(canopy_core::Error::InvalidArgument { field: "caller", reason }) => {
                assert!(reason.contains("no repository"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        let decide = || req(json!({ "id": "merge-9", "approve": true }));
        let by_agent = fx.api.merges.merges_decide(agent("m1"), decide()).await;
        assert!(matches!(by_agent, Err(canopy_core::Error::Forbidden { .. })), "{by_agent:?}");
        let by_operator = fx.api.merges.merges_decide(fx.operator.clone(), decide()).await;
        assert!(matches!(by_operator, Err(canopy_core::Error::InvalidArgument { field: "id", .. })), "{by_operator:?}");
        let listed = fx.api.merges.merges_list(fx.operator.clone(), req(json!({}))).await;
        assert!(listed.unwrap_or_else(|e| panic!("{e}")).merges.is_empty());
    }

    #[tokio::test]
    async fn an_approve_in_a_merge_topic_without_a_request_is_conversation() {
        let fx = Fixture::new().await;
        fx.manager("m1").await;
        let post = req(json!({ "channel": "home-m1", "topic": "merge: parser", "body": "approve",
            "create_topic": true }));
        let posted = fx.api.messages.messages_post(fx.operator.clone(), post).await.unwrap_or_else(|e| panic!("{e}"));
        let read = req(json!({ "channel": "home-m1", "topic": "merge: parser" }));
        let page = fx.api.messages.messages_read(fx.operator.clone(), read).await.unwrap_or_else(|e| panic!("{e}"));
        let seqs: Vec<_> = page.groups.iter().flat_map(|g| &g.messages).map(|m| m.seq).collect();
        assert_eq!(seqs, vec![posted.message.seq], "nothing answered a topic that holds no request");
    }
}
