//! The checkouts a runner keeps on its own disk (`Checkouts`): every runner but the embedded
//! one, which works in the daemon's. A repository is fetched from the daemon's git endpoint
//! into this runner's cache of its mirror (`<data>/repos/<name>.git` of the runner's data
//! directory, with the runner's id and token as the login; a runner started in the daemon's
//! own directory shares the daemon's mirror); an agent's checkout is made from it in the
//! agent's directory, starting where the agent last pushed (so a session moved here from
//! another runner keeps its work) or at its start commit.
//!
//! What a checkout's branch becomes is pushed back to the daemon's mirror: when the branch
//! moves (looked at every `[git] watch_interval`), when its session ends, and whenever the
//! daemon asks (`runner.<id>.git`: before a merge request, a run's merge or its report), each
//! push being a confined fetch from the checkout into the cache (git in a checkout runs in the
//! session's sandbox) and then a push from the cache. The daemon's questions about a checkout
//! (status, summary, a merge into it, its removal) are answered here too.
//!
//! Does not decide what may be pushed (the daemon's endpoint does) or when a session starts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use canopy_core::RunnerId;
use canopy_git::{Git, GitError, MergeOutcome, Remote};
use canopy_proto::api::{RepoAssignment, RunnerGitOp, RunnerGitReply, RunnerGitRequest};

/// The runner's API token as it is now (it is re-read from the credential before each sync).
pub type TokenSource = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// A checkout this runner made: its repository and branch, and what was last pushed.
#[derive(Debug, Clone)]
struct Kept {
    repo: RepoAssignment,
    pushed: Option<String>,
}

/// The checkouts on this runner's disk. Cheap to clone.
#[derive(Clone)]
pub struct Checkouts {
    inner: Arc<Inner>,
}

struct Inner {
    /// Git, confined as every session; its data directory holds the mirrors' caches.
    git: Git,
    /// Where each agent's directory is (its checkout is `<sessions>/<agent>/work`).
    sessions: PathBuf,
    id: RunnerId,
    token: TokenSource,
    /// The daemon's git endpoint, as its last sync said.
    url: Mutex<String>,
    kept: Mutex<HashMap<String, Kept>>,
    /// One task at a time changes a repository's cache, by name.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    watch_interval: Duration,
}

impl std::fmt::Debug for Checkouts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkouts").field("sessions", &self.inner.sessions).finish_non_exhaustive()
    }
}

/// The ref of the cache a checkout's branch is fetched into before it is pushed.
fn outgoing(agent: &str) -> String {
    format!("refs/canopy/outgoing/{agent}")
}

impl Checkouts {
    pub fn new(git: Git, sessions: PathBuf, id: RunnerId, token: TokenSource, watch_interval: Duration) -> Checkouts {
        Checkouts {
            inner: Arc::new(Inner {
                git,
                sessions,
                id,
                token,
                url: Mutex::new(String::new()),
                kept: Mutex::default(),
                locks: Mutex::default(),
                watch_interval,
            }),
        }
    }

    /// How often the watch looks at the checkouts here.
    pub(crate) fn watch_interval(&self) -> Duration {
        self.inner.watch_interval
    }

    /// Takes the daemon's git endpoint from a sync.
    pub(crate) fn set_url(&self, url: &str) {
        if let Ok(mut current) = self.inner.url.lock()
            && *current != url
        {
            tracing::info!(%url, "the daemon serves repositories at this URL");
            *current = url.to_owned();
        }
    }

    fn remote(&self) -> Result<Remote, GitError> {
        let url = self.inner.url.lock().map(|u| u.clone()).unwrap_or_default();
        if url.is_empty() {
            return Err(GitError::Invalid("the daemon has not said where it serves repositories yet".into()));
        }
        let token = (self.inner.token)().map_err(GitError::Invalid)?;
        Ok(Remote { url, authorization: canopy_git::http::basic_header(self.inner.id.as_str(), &token) })
    }

    fn mirror(&self, repo: &str) -> PathBuf {
        self.inner.git.mirror_path(repo)
    }

    /// An agent's checkout on this disk.
    pub(crate) fn dir(&self, agent: &str) -> PathBuf {
        self.inner.sessions.join(agent).join("work")
    }

    fn lock(&self, repo: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.inner.locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.entry(repo.to_owned()).or_default().clone()
    }

    fn kept(&self, agent: &str) -> Option<Kept> {
        self.inner.kept.lock().ok().and_then(|k| k.get(agent).cloned())
    }

    /// Makes `agent`'s checkout of `repo` here unless it is already made, its repository
    /// fetched fresh first; its directory and the cache the session may read.
    pub(crate) async fn ensure(&self, agent: &str, repo: &RepoAssignment) -> Result<(PathBuf, PathBuf), GitError> {
        let remote = self.remote()?;
        let mirror = self.mirror(&repo.name);
        let dir = self.dir(agent);
        let lock = self.lock(&repo.name);
        let _held = lock.lock().await;
        self.inner.git.fetch_remote(&remote, &repo.name, &mirror).await?;
        let pushed = self.inner.git.rev(&mirror, &repo.published).await?;
        if !canopy_git::is_checkout(&dir) {
            // Nothing of the agent's is here yet: a leftover of a failed attempt is ours to redo.
            canopy_git::remove_dir(&dir)?;
            let start = pushed.clone().unwrap_or_else(|| repo.start.clone());
            self.inner.git.create_checkout(&mirror, &dir, &repo.branch, &start, agent).await?;
            tracing::info!(%agent, repo = %repo.name, start = %canopy_git::short(&start), "made a checkout on this runner");
        } else if let Some(pushed) = &pushed {
            // Back here after running elsewhere: continue from what it pushed there, never
            // push this older tree over it.
            let here = Git::read_branch_head(&dir, &repo.branch);
            if here.as_deref() != Some(pushed.as_str()) {
                let message = format!("Merge what {agent} pushed from another runner");
                self.inner.git.merge_into(&mirror, &dir, &repo.branch, pushed, &message).await?;
            }
        }
        if let Ok(mut kept) = self.inner.kept.lock() {
            kept.insert(agent.to_owned(), Kept { repo: repo.clone(), pushed });
        }
        Ok((dir, mirror))
    }

    /// Pushes `what` (a ref of `agent`'s checkout) to the daemon's mirror as `to`; the commit
    /// pushed, or none when the checkout has no such ref. With `lease`, only while `to` is still
    /// at that commit (or absent, for `Some(None)`) on the daemon.
    async fn publish(
        &self,
        agent: &str,
        repo: &str,
        (what, to): (&str, &str),
        lease: Option<Option<&str>>,
    ) -> Result<Option<String>, GitError> {
        let remote = self.remote()?;
        let (mirror, dir) = (self.mirror(repo), self.dir(agent));
        let lock = self.lock(repo);
        let _held = lock.lock().await;
        let Some(head) = self.inner.git.publish(&mirror, &dir, what, &outgoing(agent)).await? else { return Ok(None) };
        self.inner.git.push_remote(&remote, repo, &mirror, (&outgoing(agent), to), lease).await?;
        Ok(Some(head))
    }

    /// Pushes `agent`'s branch to its daemon ref when it moved since the last push (a look
    /// of the watch, and a session's end).
    pub(crate) async fn save(&self, agent: &str) {
        let Some(kept) = self.kept(agent) else { return };
        let (dir, branch) = (self.dir(agent), kept.repo.branch.clone());
        let head = tokio::task::spawn_blocking(move || Git::read_branch_head(&dir, &branch)).await.ok().flatten();
        if head.is_none() || head == kept.pushed {
            return;
        }
        let what = format!("refs/heads/{}", kept.repo.branch);
        // Only over what this runner last saw there: a newer push from elsewhere is not undone.
        let lease = Some(kept.pushed.as_deref());
        match self.publish(agent, &kept.repo.name, (&what, &kept.repo.published), lease).await {
            Ok(pushed) => {
                if let Ok(mut all) = self.inner.kept.lock()
                    && let Some(entry) = all.get_mut(agent)
                {
                    entry.pushed = pushed;
                }
            }
            // Refused: the agent runs elsewhere now (or its ref moved on there); this copy is
            // no longer pushed, so a refusal is not retried at every look.
            Err(e) if e.to_string().contains("403") || e.to_string().contains("stale info") => {
                tracing::warn!(%agent, error = %e, "the daemon no longer takes this checkout's branch; it stays here only");
                if let Ok(mut kept) = self.inner.kept.lock() {
                    kept.remove(agent);
                }
            }
            Err(e) => tracing::warn!(%agent, error = %e, "pushing a checkout's branch to the daemon failed"),
        }
    }

    /// Whether `agent`'s checkout is one this runner made and keeps.
    pub(crate) fn keeps(&self, agent: &str) -> bool {
        self.inner.kept.lock().is_ok_and(|k| k.contains_key(agent))
    }

    /// Publishes the branch of a checkout in the daemon's own directory (the embedded runner's
    /// session ended) into the daemon's mirror, so the agent continues from it wherever it
    /// starts next.
    pub(crate) async fn publish_here(&self, repo: &RepoAssignment, mirror: &Path, checkout: &Path) {
        let what = format!("refs/heads/{}", repo.branch);
        if let Err(e) = self.inner.git.publish(mirror, checkout, &what, &repo.published).await {
            tracing::warn!(branch = %repo.branch, error = %e, "publishing a checkout's branch at its session's end failed");
        }
    }

    /// One look of the watch: every checkout here whose branch moved is pushed.
    pub(crate) async fn save_all(&self) {
        let agents: Vec<String> = self.inner.kept.lock().map(|k| k.keys().cloned().collect()).unwrap_or_default();
        for agent in agents {
            self.save(&agent).await;
        }
    }

    /// The answer to the daemon's request about a checkout here.
    pub(crate) async fn answer(&self, request: Result<RunnerGitRequest, String>) -> RunnerGitReply {
        let request = match request {
            Ok(request) => request,
            Err(e) => return RunnerGitReply::Refused { reason: format!("bad git request: {e}") },
        };
        // Names become paths here: a handle and a repository name, or nothing is touched.
        // (An agent's handle, or a run's `run-<id>`: lowercase letters, digits and hyphens.)
        let agent = &request.agent;
        let named = !agent.is_empty()
            && agent.len() <= 64
            && agent.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && canopy_core::repos::check_repo_name("repo", &request.repo).is_ok();
        if !named {
            return RunnerGitReply::Refused { reason: format!("bad git request: {request:?} names no checkout") };
        }
        let dir = self.dir(&request.agent);
        if !canopy_git::is_checkout(&dir) {
            return match request.op {
                RunnerGitOp::Remove => RunnerGitReply::Removed,
                _ => RunnerGitReply::Refused {
                    reason: format!("{}'s checkout is not on runner {}", request.agent, self.inner.id),
                },
            };
        }
        let answered = self.act(&request, &dir).await;
        answered.unwrap_or_else(|e| match e {
            GitError::Invalid(reason) => RunnerGitReply::Refused { reason },
            other => RunnerGitReply::Failed { reason: other.to_string() },
        })
    }

    async fn act(&self, request: &RunnerGitRequest, dir: &Path) -> Result<RunnerGitReply, GitError> {
        let (agent, repo) = (request.agent.as_str(), request.repo.as_str());
        let mirror = self.mirror(repo);
        let git = &self.inner.git;
        Ok(match &request.op {
            RunnerGitOp::Publish { what, to } => {
                RunnerGitReply::Published { head: self.publish(agent, repo, (what, to), None).await? }
            }
            RunnerGitOp::Status { base } => {
                let s = git.status(&mirror, dir, base).await?;
                RunnerGitReply::Tree {
                    branch: s.branch,
                    head: s.head,
                    ahead: s.ahead,
                    behind: s.behind,
                    dirty: s.dirty,
                    commits: Vec::new(),
                    diffstat: String::new(),
                }
            }
            RunnerGitOp::Summary { base } => {
                let s = git.summary(&mirror, dir, base).await?;
                let status = git.status(&mirror, dir, base).await?;
                RunnerGitReply::Tree {
                    branch: s.branch,
                    head: s.head,
                    ahead: status.ahead,
                    behind: status.behind,
                    dirty: s.dirty,
                    commits: s.commits,
                    diffstat: s.diffstat,
                }
            }
            RunnerGitOp::Merge { branch, commit, from, message } => {
                let remote = self.remote()?;
                {
                    let lock = self.lock(repo);
                    let _held = lock.lock().await;
                    git.fetch_remote(&remote, repo, &mirror).await?;
                }
                if git.rev(&mirror, from).await?.as_deref() != Some(commit.as_str()) {
                    return Err(GitError::Invalid(format!(
                        "{from} is not at {} in the daemon's mirror",
                        canopy_git::short(commit)
                    )));
                }
                match git.merge_into(&mirror, dir, branch, commit, message).await? {
                    MergeOutcome::Merged { commit, fast_forward } => RunnerGitReply::Merged { commit, fast_forward },
                    MergeOutcome::UpToDate { commit } => RunnerGitReply::UpToDate { commit },
                    MergeOutcome::Conflict { files } => RunnerGitReply::Conflict { files },
                }
            }
            RunnerGitOp::Remove => {
                canopy_git::remove_dir(dir)?;
                if let Ok(mut kept) = self.inner.kept.lock() {
                    kept.remove(agent);
                }
                RunnerGitReply::Removed
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    fn checkouts(dir: &Path) -> Checkouts {
        let git =
            Git::new("git", canopy_harness::sandbox::SandboxSettings::off(dir.join("data")), Duration::from_secs(5));
        let token: TokenSource = Arc::new(|| Ok("cnr_x".to_owned()));
        Checkouts::new(git, dir.join("sessions"), RunnerId::parse("r1").unwrap(), token, Duration::from_secs(1))
    }

    #[tokio::test]
    async fn a_request_whose_names_are_not_a_checkout_touches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("keep");
        std::fs::create_dir_all(outside.join(".git")).unwrap();
        let here = checkouts(dir.path());
        for (agent, repo) in [("../keep", "app"), ("a/b", "app"), ("", "app"), ("lead", "../x"), ("Lead", "app")] {
            let request = RunnerGitRequest { agent: agent.into(), repo: repo.into(), op: RunnerGitOp::Remove };
            let answer = here.answer(Ok(request)).await;
            assert!(matches!(answer, RunnerGitReply::Refused { .. }), "{agent} {repo}: {answer:?}");
        }
        assert!(outside.join(".git").exists());
        let missing = RunnerGitRequest {
            agent: "lead".into(),
            repo: "app".into(),
            op: RunnerGitOp::Status { base: "main".into() },
        };
        assert!(
            matches!(here.answer(Ok(missing)).await, RunnerGitReply::Refused { reason } if reason.contains("not on runner r1"))
        );
        assert!(matches!(here.answer(Err("junk".into())).await, RunnerGitReply::Refused { .. }));
    }
}
