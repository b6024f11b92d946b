//! The merge gate (`Merges`): `merges.request` (the Manager's branch published into the mirror,
//! its merged tree checked in a scratch checkout, the request posted for the operators),
//! `merges.list`, `merges.decide` and an operator's reply in the request's topic
//! (`MergeReplies`), landing an approved request on the canonical repository, and recovery of
//! requests a stopped daemon left half-done.
//!
//! Only an operator decides; an agent's attempt is refused and audited in the store. An
//! approval returns at once (`merging`); landing, and a request's check, run as tasks whose
//! outcome is posted in the requester's home channel; a landed request's linked issues' owners
//! are then told (the issues stay as they are). Uses the store, delivery, the notifier, the repos
//! area (mirrors, locks, checkouts, git) and the issues area; does not make checkouts or merge
//! runs into a Manager's checkout (`repos`).

use canopy_core::acl::Caller;
use canopy_core::gate::Reply;
use canopy_core::repos::{self as rules};
use canopy_core::{Error, MergeRequest, Message};
use canopy_git::{GitError, MergeOutcome};
use canopy_proto::api::*;
use canopy_store::{Landed, MergeCheck, MergeSpec, RepoRow, Store, ops};
use futures_util::future::BoxFuture;

use crate::delivery::Delivery;
use crate::issues::Issues;
use crate::notify::Notifier;
use crate::replies::ReplyHandler;
use crate::repos::{Repos, git_error};

/// The merge gate. Cheap to clone.
#[derive(Clone)]
pub struct Merges {
    store: Store,
    delivery: Delivery,
    notifier: Notifier,
    repos: Repos,
    issues: Issues,
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
impl Merges {
    pub fn new(store: Store, delivery: Delivery, notifier: Notifier, repos: Repos, issues: Issues) -> Self {
        Merges { store, delivery, notifier, repos, issues }
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
        let dir = self.repos.checkout_dir(caller.handle.as_str());
        let lock = self.repos.repo_lock(&own.repo.name);
        let held = lock.lock().await;
        let what = format!("refs/heads/{}", own.branch);
        let head = self
            .repos
            .git()
            .publish(&mirror, &dir, &what, &rules::agent_ref(caller.handle.as_str()))
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

    /// Checks a request's merged tree and posts the request for the operators.
    pub async fn check_merge(&self, id: i64) {
        let checked = async {
            let request = self.store.read(move |conn| ops::load_merge(conn, id)).await?;
            let repo_name = request.repo.clone();
            let repo = self.store.read(move |conn| ops::require_repo(conn, "repo", &repo_name)).await?;
            let (outcome, base) = self.merged_tree(&repo, &request, id).await?;
            let mirror = self.repos.mirror(&repo);
            let (commits, diffstat) =
                self.repos.git().compare(&mirror, &base, &request.head).await.map_err(|e| git_error("id", e))?;
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

    /// The check on a merged tree (in its scratch checkout, confined), as a line.
    async fn check_merged(&self, repo: &RepoRow, outcome: &MergeOutcome, id: i64) -> (String, bool) {
        let scratch = self.repos.git().scratch_path(&repo.name, &format!("merge-{id}"));
        let result = match outcome {
            MergeOutcome::Conflict { files } => {
                (format!("not run: the branch conflicts with {} in {}", repo.base, files.join(", ")), false)
            }
            _ if repo.check.is_empty() => ("none configured".to_owned(), true),
            _ => {
                let check = self.repos.git().check(&self.repos.mirror(repo), &scratch, &repo.check).await;
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
            let merges = self.clone();
            tokio::spawn(async move { merges.land(id).await });
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
            let mirror = self.repos.mirror(&repo);
            let base = {
                let lock = self.repos.repo_lock(&repo.name);
                let _held = lock.lock().await;
                self.repos.base_now(&repo).await?
            };
            let result_ref = rules::merge_result_ref(id);
            let reuse = base == checked_base && passed;
            let commit = match reuse {
                true => self.repos.git().rev(&mirror, &result_ref).await.map_err(|e| git_error("id", e))?,
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
                            .repos
                            .git()
                            .rev(&mirror, &result_ref)
                            .await
                            .map_err(|e| git_error("id", e))?
                            .ok_or_else(|| Error::Internal(format!("merge-{id}'s merged tree is missing")))?,
                    }
                }
            };
            let lock = self.repos.repo_lock(&repo.name);
            let _held = lock.lock().await;
            match self.repos.git().land(&mirror, &repo.source, &repo.base, &result_ref, &commit, &base).await {
                Ok(()) => Ok(Landed::Merged { fast_forward: commit == request.head, commit }),
                Err(e) => Ok(Landed::Refused(match e {
                    GitError::Invalid(m) => m,
                    other => other.to_string(),
                })),
            }
        }
        .await;
        let landed = landed.unwrap_or_else(|e: Error| Landed::Refused(e.to_string()));
        let commit = match &landed {
            Landed::Merged { commit, .. } => Some(commit.clone()),
            Landed::Refused(_) => None,
        };
        match self.store.write(move |conn| ops::finish_merge(conn, id, &landed)).await {
            Ok((_, notice)) => self.delivery.deliver_notices(vec![notice]).await,
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
    /// requests are checked.
    pub async fn recover(&self) {
        match self.store.write(ops::recover_merges).await {
            Ok((notices, checking)) => {
                self.delivery.deliver_notices(notices).await;
                for id in checking {
                    let merges = self.clone();
                    tokio::spawn(async move { merges.check_merge(id).await });
                }
            }
            Err(e) => tracing::warn!(error = %e, "recovering merge requests failed"),
        }
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
