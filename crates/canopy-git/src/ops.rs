//! The git operations: mirrors, checkouts, publishing a branch into the mirror, status,
//! a run's summary, merges (into a Manager's checkout, and into the canonical repository
//! through a scratch checkout), the check command, and removal.
//!
//! Refs in a mirror: `refs/heads/*` are the canonical repository's branches as last fetched;
//! Canopy's own live under `refs/canopy/`: `agents/<handle>` (an agent's branch as last
//! published), `runs/<id>` (a run's branch), `merges/<id>` (the head a merge request asked
//! for) and `merged/<id>` (what landing it produced). Does not decide who may do any of this.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::git::{Captured, Confined, Git, GitError, last_lines};

/// An agent's checkout as its Manager sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Status {
    /// The checked-out branch (empty when HEAD is detached).
    pub branch: String,
    pub head: String,
    /// Commits on HEAD not on the base, and on the base not on HEAD.
    pub ahead: u32,
    pub behind: u32,
    /// Changed or untracked files (`git status --porcelain` paths), at most 200.
    pub dirty: Vec<String>,
}

/// What a run left in its checkout.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    pub branch: String,
    pub head: String,
    /// `<short sha> <subject>`, oldest first, at most 50.
    pub commits: Vec<String>,
    /// `git diff --stat` from the base to HEAD (empty when nothing changed).
    pub diffstat: String,
    pub dirty: Vec<String>,
}

/// The result of a check command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    pub command: String,
    pub passed: bool,
    /// It ran out of time and was killed.
    pub timed_out: bool,
    /// `exit 0`, `exit 101`, `timed out after 600s`, or why it could not run.
    pub outcome: String,
    pub duration_ms: u64,
    /// Its output (standard error folded in): the last bytes kept, a timed-out check's too.
    pub log: String,
}

/// What a merge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergeOutcome {
    /// The target now has this commit (a fast-forward or a merge commit).
    Merged { commit: String, fast_forward: bool },
    /// The target already contained the commit.
    UpToDate { commit: String },
    /// The merge conflicts in these files; nothing was changed.
    Conflict { files: Vec<String> },
}

/// A short sha.
pub fn short(sha: &str) -> &str {
    &sha[..sha.len().min(10)]
}

fn lines(text: &str) -> Vec<String> {
    text.lines().map(str::trim_end).filter(|l| !l.is_empty()).map(str::to_owned).collect()
}

/// Paths of `git status --porcelain -z` output.
fn porcelain_paths(out: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut records = out.split('\0').filter(|r| !r.is_empty());
    while let Some(record) = records.next() {
        if record.len() > 3 {
            paths.push(record[3..].to_owned());
        }
        // A rename's record is followed by its source path.
        if record.starts_with('R') || record.starts_with('C') {
            records.next();
        }
    }
    paths.truncate(200);
    paths
}

impl Git {
    /// Where repository `name`'s mirror lives.
    pub fn mirror_path(&self, name: &str) -> PathBuf {
        self.data_dir().join("repos").join(format!("{name}.git"))
    }

    /// Where scratch checkouts for merges into repository `name` go.
    pub fn scratch_path(&self, name: &str, what: &str) -> PathBuf {
        self.data_dir().join("repos").join(format!("{name}.scratch")).join(what)
    }

    /// Makes the mirror of `source` (a path or URL) and checks it has `base`; returns the
    /// base's commit. A failed attempt leaves no mirror behind.
    pub async fn create_mirror(&self, source: &str, mirror: &Path, base: &str) -> Result<String, GitError> {
        let parent = mirror.parent().ok_or_else(|| GitError::Invalid("a mirror needs a parent directory".into()))?;
        std::fs::create_dir_all(parent).map_err(|e| io("creating the repos directory", e))?;
        if mirror.exists() {
            return Err(GitError::Invalid(format!("{} already exists", mirror.display())));
        }
        let target = mirror.display().to_string();
        let made = async {
            self.trusted(parent, &["clone", "--bare", "--quiet", source, &target]).await?;
            self.base_commit(mirror, base).await
        }
        .await;
        if made.is_err() {
            // Cleanup after a failure: the clone's error is the answer, and a leftover is
            // removed by the next attempt (`register_repo`) or `repos.gc`.
            let _ = std::fs::remove_dir_all(mirror);
        }
        made
    }

    /// The commit of branch `base` in the mirror.
    pub async fn base_commit(&self, mirror: &Path, base: &str) -> Result<String, GitError> {
        let spec = format!("refs/heads/{base}^{{commit}}");
        match self.trusted_any(mirror, &["rev-parse", "--verify", "--quiet", &spec]).await? {
            out if out.ok() => Ok(out.stdout.trim().to_owned()),
            _ => Err(GitError::Invalid(format!("the repository has no branch {base:?}"))),
        }
    }

    /// Fetches the canonical repository's branches into the mirror; returns `base`'s commit.
    pub async fn refresh(&self, mirror: &Path, source: &str, base: &str) -> Result<String, GitError> {
        self.trusted(mirror, &["fetch", "--quiet", "--no-tags", source, "+refs/heads/*:refs/heads/*"]).await?;
        self.base_commit(mirror, base).await
    }

    /// The commit a mirror ref names, if any.
    pub async fn rev(&self, mirror: &Path, refname: &str) -> Result<Option<String>, GitError> {
        let spec = format!("{refname}^{{commit}}");
        let out = self.trusted_any(mirror, &["rev-parse", "--verify", "--quiet", &spec]).await?;
        Ok(out.ok().then(|| out.stdout.trim().to_owned()))
    }

    /// Points mirror ref `refname` at `commit`.
    pub async fn set_ref(&self, mirror: &Path, refname: &str, commit: &str) -> Result<(), GitError> {
        self.trusted(mirror, &["update-ref", refname, commit]).await.map(|_| ())
    }

    /// Whether `ancestor` is an ancestor of (or equal to) `of`, both in the mirror.
    pub async fn is_ancestor(&self, mirror: &Path, ancestor: &str, of: &str) -> Result<bool, GitError> {
        Ok(self.trusted_any(mirror, &["merge-base", "--is-ancestor", ancestor, of]).await?.ok())
    }

    /// `<short sha> <subject>` of the commits on `head` not on `base` (oldest first, at most
    /// 50), and the diffstat between them, read in the mirror.
    pub async fn compare(&self, mirror: &Path, base: &str, head: &str) -> Result<(Vec<String>, String), GitError> {
        let range = format!("{base}..{head}");
        let log = self.trusted(mirror, &["log", "--reverse", "--format=%h %s", "-n", "50", &range]).await?;
        let stat = self.trusted(mirror, &["diff", "--stat=100", "--no-ext-diff", "--no-textconv", base, head]).await?;
        Ok((lines(&log.stdout), last_lines(&stat.stdout, 40)))
    }

    /// The diff from `base` to `head` (both in the mirror), cut to its first `max` bytes
    /// (at a line) with a note of how much more there is.
    pub async fn diff(&self, mirror: &Path, base: &str, head: &str, max: usize) -> Result<String, GitError> {
        let args = ["diff", "--no-ext-diff", "--no-textconv", "--no-color", base, head];
        let (text, more) = self.trusted_head(mirror, &args, max).await?;
        if !more {
            return Ok(text);
        }
        let end = text.rfind('\n').map(|i| i + 1).unwrap_or(text.len());
        Ok(format!("{}[... more of the diff: run `git diff {base} {head}` to read it]\n", &text[..end]))
    }

    /// A new checkout of the mirror in `dest` on a new `branch` from `start` (a commit in the
    /// mirror), committing as `identity`. Runs before any session sees `dest`, so trusted.
    pub async fn create_checkout(
        &self,
        mirror: &Path,
        dest: &Path,
        branch: &str,
        start: &str,
        identity: &str,
    ) -> Result<(), GitError> {
        if dest.exists() && std::fs::read_dir(dest).map(|mut d| d.next().is_some()).unwrap_or(true) {
            return Err(GitError::Invalid(format!("{} already exists and is not empty", dest.display())));
        }
        let parent = dest.parent().ok_or_else(|| GitError::Invalid("a checkout needs a parent directory".into()))?;
        std::fs::create_dir_all(parent).map_err(|e| io("creating a session directory", e))?;
        let (from, to) = (mirror.display().to_string(), dest.display().to_string());
        let made = async {
            self.trusted(parent, &["clone", "--quiet", "--shared", "--no-checkout", &from, &to]).await?;
            self.trusted(dest, &["checkout", "--quiet", "-b", branch, start]).await?;
            self.trusted(dest, &["config", "user.name", identity]).await?;
            self.trusted(dest, &["config", "user.email", &format!("{identity}@canopy.local")]).await?;
            Ok(())
        }
        .await;
        if made.is_err() {
            // Cleanup after a failure: the checkout's error is the answer, and a leftover is
            // removed by the next attempt (every checkout starts with `remove_dir`).
            let _ = std::fs::remove_dir_all(dest);
        }
        made
    }

    /// Copies `what` (a ref or `HEAD`) of a session's checkout into the mirror as `to`
    /// (forced: the ref is the checkout's); returns its commit, or `None` when the checkout
    /// has no such ref. Confined: the mirror writable, the checkout read-only.
    pub async fn publish(
        &self,
        mirror: &Path,
        checkout: &Path,
        what: &str,
        to: &str,
    ) -> Result<Option<String>, GitError> {
        let source = checkout.display().to_string();
        let spec = format!("+{what}:{to}");
        let grants = Confined { write: mirror, read: &[checkout] };
        let out = self.confined_any(grants, mirror, &["fetch", "--quiet", "--no-tags", &source, &spec]).await?;
        if !out.ok() {
            if out.stderr.contains("couldn't find remote ref") || out.stderr.contains("does not point to a valid") {
                return Ok(None);
            }
            return Err(GitError::Failed {
                what: "publishing a branch".into(),
                code: out.code,
                stderr: last_lines(&out.stderr, 6),
            });
        }
        self.rev(mirror, to).await
    }

    /// A checkout's branch, ahead/behind `base` and dirty files. Confined.
    pub async fn status(&self, mirror: &Path, checkout: &Path, base: &str) -> Result<Status, GitError> {
        let grants = Confined { write: checkout, read: &[mirror] };
        let branch = self.confined_any(grants, checkout, &["symbolic-ref", "--quiet", "--short", "HEAD"]).await?;
        let head = self.confined(grants, checkout, &["rev-parse", "HEAD"]).await?.stdout.trim().to_owned();
        let range = format!("{base}...HEAD");
        let counts = self.confined(grants, checkout, &["rev-list", "--left-right", "--count", &range]).await?;
        let mut numbers = counts.stdout.split_whitespace().map(|n| n.parse::<u32>().unwrap_or(0));
        let (behind, ahead) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
        let dirty = self.confined(grants, checkout, &["status", "--porcelain", "-z", "--untracked-files=all"]).await?;
        Ok(Status {
            branch: if branch.ok() { branch.stdout.trim().to_owned() } else { String::new() },
            head,
            ahead,
            behind,
            dirty: porcelain_paths(&dirty.stdout),
        })
    }

    /// What a run did since `base`: its commits, diffstat and dirty files. Confined.
    pub async fn summary(&self, mirror: &Path, checkout: &Path, base: &str) -> Result<Summary, GitError> {
        let status = self.status(mirror, checkout, base).await?;
        let grants = Confined { write: checkout, read: &[mirror] };
        let range = format!("{base}..HEAD");
        let log = self.confined(grants, checkout, &["log", "--reverse", "--format=%h %s", "-n", "50", &range]).await?;
        let stat = self.confined(grants, checkout, &["diff", "--stat=100", "--no-ext-diff", base, "HEAD"]).await?;
        Ok(Summary {
            branch: status.branch,
            head: status.head,
            commits: lines(&log.stdout),
            diffstat: last_lines(&stat.stdout, 40),
            dirty: status.dirty,
        })
    }

    /// Merges `commit` (in the mirror) into the checked-out `branch` of a session's checkout:
    /// a fast-forward when it can, else a merge commit with `message`. A conflict is undone
    /// (`merge --abort`) and reported with its files; a checkout on another branch, or with
    /// changes the merge would overwrite, is refused before anything changes. Confined.
    pub async fn merge_into(
        &self,
        mirror: &Path,
        checkout: &Path,
        branch: &str,
        commit: &str,
        message: &str,
    ) -> Result<MergeOutcome, GitError> {
        let grants = Confined { write: checkout, read: &[mirror] };
        let current = self.confined_any(grants, checkout, &["symbolic-ref", "--quiet", "--short", "HEAD"]).await?;
        if current.stdout.trim() != branch {
            return Err(GitError::Invalid(format!(
                "the checkout is on {:?}, not {branch}: check out {branch} first",
                current.stdout.trim()
            )));
        }
        let merged = self.confined_any(grants, checkout, &["merge-base", "--is-ancestor", commit, "HEAD"]).await?;
        if merged.ok() {
            return Ok(MergeOutcome::UpToDate { commit: self.head(grants, checkout).await? });
        }
        let before = self.head(grants, checkout).await?;
        let out = self.confined_any(grants, checkout, &["merge", "--no-edit", "-m", message, commit]).await?;
        if out.ok() {
            let after = self.head(grants, checkout).await?;
            let fast_forward =
                self.confined_any(grants, checkout, &["merge-base", "--is-ancestor", &before, commit]).await?.ok()
                    && after == commit;
            return Ok(MergeOutcome::Merged { commit: after, fast_forward });
        }
        let conflicted = self.confined_any(grants, checkout, &["diff", "--name-only", "--diff-filter=U"]).await?;
        let files = lines(&conflicted.stdout);
        if files.is_empty() {
            // Refused before it began (local changes in the way): nothing to undo.
            return Err(GitError::Invalid(format!(
                "git refused the merge: {}",
                last_lines(&format!("{}\n{}", out.stdout, out.stderr), 6)
            )));
        }
        self.confined(grants, checkout, &["merge", "--abort"]).await?;
        Ok(MergeOutcome::Conflict { files })
    }

    async fn head(&self, grants: Confined<'_>, checkout: &Path) -> Result<String, GitError> {
        Ok(self.confined(grants, checkout, &["rev-parse", "HEAD"]).await?.stdout.trim().to_owned())
    }

    /// Merges `head` into `base` (both commits in the mirror) in a fresh scratch checkout
    /// and records the result in the mirror as `result_ref`, before anything else runs there.
    pub async fn merge_in_scratch(
        &self,
        mirror: &Path,
        scratch: &Path,
        base: &str,
        head: &str,
        message: &str,
        result_ref: &str,
    ) -> Result<MergeOutcome, GitError> {
        // An earlier merge's scratch checkout, if one was left: none is the usual case.
        let _ = std::fs::remove_dir_all(scratch);
        self.create_checkout(mirror, scratch, "canopy-merge", base, "Canopy").await?;
        let already = self.trusted_any(scratch, &["merge-base", "--is-ancestor", head, "HEAD"]).await?;
        if already.ok() {
            return Ok(MergeOutcome::UpToDate { commit: base.to_owned() });
        }
        let fast_forward = self.trusted_any(scratch, &["merge-base", "--is-ancestor", base, head]).await?.ok();
        let out = self.trusted_any(scratch, &["merge", "--no-edit", "-m", message, head]).await?;
        if !out.ok() {
            let conflicted = self.trusted_any(scratch, &["diff", "--name-only", "--diff-filter=U"]).await?;
            // The scratch checkout is thrown away after the merge either way; the abort only
            // tidies it, so its failure changes nothing.
            let _ = self.trusted_any(scratch, &["merge", "--abort"]).await;
            return Ok(MergeOutcome::Conflict { files: lines(&conflicted.stdout) });
        }
        let commit = self.trusted(scratch, &["rev-parse", "HEAD"]).await?.stdout.trim().to_owned();
        let spec = format!("+{commit}:{result_ref}");
        let source = scratch.display().to_string();
        self.trusted(mirror, &["fetch", "--quiet", "--no-tags", &source, &spec]).await?;
        Ok(MergeOutcome::Merged { commit, fast_forward })
    }

    /// Runs `command` with `sh -c` confined in `dir` (the mirror readable), for at most the
    /// check timeout, keeping the last `keep` bytes of its output.
    pub async fn check(&self, mirror: &Path, dir: &Path, command: &str, keep: usize) -> CheckResult {
        let started = Instant::now();
        let grants = Confined { write: dir, read: &[mirror] };
        let result = self.confined_shell(grants, dir, command, self.check_timeout, keep).await;
        let duration_ms = started.elapsed().as_millis() as u64;
        let (passed, timed_out, outcome, log) = match result {
            Ok(Captured { code: Some(code), log }) => (code == 0, false, format!("exit {code}"), log),
            Ok(Captured { code: None, log }) => {
                (false, true, format!("timed out after {}", humantime_secs(self.check_timeout)), log)
            }
            Err(e) => (false, false, format!("could not run: {e}"), String::new()),
        };
        CheckResult { command: command.to_owned(), passed, timed_out, outcome, duration_ms, log }
    }

    /// Test-merges commits `ours` and `theirs` in the mirror without a checkout (`git
    /// merge-tree --write-tree`): the files that conflict, none when they merge cleanly.
    pub async fn conflicts(&self, mirror: &Path, ours: &str, theirs: &str) -> Result<Vec<String>, GitError> {
        let args = ["merge-tree", "--write-tree", "--name-only", "--no-messages", ours, theirs];
        let out = self.trusted_any(mirror, &args).await?;
        match out.code {
            0 => Ok(Vec::new()),
            // Exit 1 is "conflicts": the tree's id, then one conflicted path per line (and
            // also a bad revision, which prints no tree).
            1 if out
                .stdout
                .lines()
                .next()
                .is_some_and(|l| l.len() >= 40 && l.bytes().all(|b| b.is_ascii_hexdigit())) =>
            {
                let mut files: Vec<String> = lines(&out.stdout).into_iter().skip(1).collect();
                files.dedup();
                Ok(files)
            }
            code => Err(GitError::Failed { what: "git merge-tree".into(), code, stderr: last_lines(&out.stderr, 6) }),
        }
    }

    /// Test-merges every live branch (name, head) against the base (`base_name` at `base`),
    /// and each pair of branches that change a file in common against each other, all in the
    /// mirror without a checkout: (branch, other, conflicting files) for each that does not
    /// merge cleanly, `other` being `base_name` or the other branch. A branch the base already
    /// holds is skipped.
    pub async fn conflict_scan(
        &self,
        mirror: &Path,
        base_name: &str,
        base: &str,
        branches: &[(String, String)],
    ) -> Result<Vec<(String, String, Vec<String>)>, GitError> {
        let mut found = Vec::new();
        let mut live: Vec<(&str, &str, Vec<String>)> = Vec::new();
        for (name, head) in branches {
            if self.is_ancestor(mirror, head, base).await? {
                continue;
            }
            let files = self.conflicts(mirror, base, head).await?;
            if !files.is_empty() {
                found.push((name.clone(), base_name.to_owned(), files));
            }
            let mut changed = self.changed_files(mirror, base, head).await?;
            changed.sort();
            live.push((name, head, changed));
        }
        for (i, (a, head_a, changed_a)) in live.iter().enumerate() {
            for (b, head_b, changed_b) in &live[i + 1..] {
                let overlap = changed_a.iter().any(|f| changed_b.binary_search(f).is_ok());
                if !overlap || head_a == head_b {
                    continue;
                }
                let files = self.conflicts(mirror, head_a, head_b).await?;
                if !files.is_empty() {
                    found.push(((*a).to_owned(), (*b).to_owned(), files));
                }
            }
        }
        Ok(found)
    }

    /// The commit branch `branch` of the checkout in `dir` points at, read from its files
    /// without running git (a loose ref, else `packed-refs`): cheap enough to poll every
    /// checkout. Only regular files are read, at most 1 MiB, and only a hex object id counts.
    pub fn read_branch_head(dir: &Path, branch: &str) -> Option<String> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let git_dir = dir.join(".git");
        // The checkout is the agent's: `.git` must be a directory, and each file is opened
        // without following a symlink and without blocking (a FIFO answers nothing), then
        // checked to be a regular file before at most 1 MiB of it is read.
        if !std::fs::symlink_metadata(&git_dir).is_ok_and(|m| m.is_dir()) {
            return None;
        }
        let read = |path: &Path| -> Option<String> {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(path)
                .ok()?;
            if !file.metadata().ok()?.is_file() {
                return None;
            }
            let mut text = String::new();
            file.take(1024 * 1024).read_to_string(&mut text).ok()?;
            Some(text)
        };
        let is_id = |s: &str| (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit());
        if let Some(text) = read(&git_dir.join("refs/heads").join(branch)) {
            let id = text.trim();
            return is_id(id).then(|| id.to_owned());
        }
        let packed = read(&git_dir.join("packed-refs"))?;
        let wanted = format!("refs/heads/{branch}");
        packed.lines().find_map(|line| {
            let (id, name) = line.split_once(' ')?;
            (name == wanted && is_id(id)).then(|| id.to_owned())
        })
    }

    /// The files `head` changes since it left `base` (`git diff --name-only base...head`).
    pub async fn changed_files(&self, mirror: &Path, base: &str, head: &str) -> Result<Vec<String>, GitError> {
        let range = format!("{base}...{head}");
        let out = self.trusted(mirror, &["diff", "--name-only", "--no-renames", &range]).await?;
        Ok(lines(&out.stdout))
    }

    /// A fresh scratch checkout of `commit` (in the mirror) in `scratch`, for a check to run
    /// on exactly that tree; an earlier one left there is replaced.
    pub async fn scratch_checkout(&self, mirror: &Path, scratch: &Path, commit: &str) -> Result<(), GitError> {
        // An earlier check's scratch checkout, if one was left: none is the usual case.
        let _ = std::fs::remove_dir_all(scratch);
        self.create_checkout(mirror, scratch, "canopy-check", commit, "Canopy").await
    }

    /// Moves the canonical repository's `base` to `commit` (a descendant of `expected`, in
    /// the mirror as `commit_ref`). A bare repository, or one whose work tree is on another
    /// branch, gets a push (refused unless a fast-forward); one with `base` checked out gets
    /// `merge --ff-only` in its work tree, which refuses to overwrite the operator's changes.
    /// Runs with the operator's environment, since the repository and its hooks are theirs.
    pub async fn land(
        &self,
        mirror: &Path,
        source: &str,
        base: &str,
        commit_ref: &str,
        commit: &str,
        expected: &str,
    ) -> Result<(), GitError> {
        let canonical = Path::new(source);
        let checked_out = canonical.is_dir()
            && !self.trusted_any(canonical, &["rev-parse", "--is-bare-repository"]).await?.stdout.trim().eq("true")
            && self.trusted_any(canonical, &["symbolic-ref", "--quiet", "--short", "HEAD"]).await?.stdout.trim()
                == base;
        let now = self.refresh(mirror, source, base).await?;
        if now != expected {
            return Err(GitError::BaseMoved {
                base: base.to_owned(),
                from: short(expected).to_owned(),
                to: short(&now).to_owned(),
            });
        }
        if checked_out {
            let from = mirror.display().to_string();
            self.trusted(canonical, &["fetch", "--quiet", "--no-tags", &from, commit_ref]).await?;
            let out = self.trusted_any(canonical, &["merge", "--ff-only", "--quiet", commit]).await?;
            if !out.ok() {
                return Err(GitError::Invalid(format!(
                    "the canonical work tree refused the fast-forward: {}",
                    last_lines(&format!("{}\n{}", out.stdout, out.stderr), 6)
                )));
            }
        } else {
            let spec = format!("{commit}:refs/heads/{base}");
            self.trusted(mirror, &["push", "--quiet", source, &spec]).await?;
        }
        // Landed: the mirror catching up is the next use's refresh if this one fails, never a
        // reason to call the landing refused.
        if let Err(e) = self.refresh(mirror, source, base).await {
            tracing::warn!(error = %e, "refreshing the mirror after landing failed");
        }
        Ok(())
    }
}

/// `600s`, `1.5s`: a check timeout as the outcome names it.
fn humantime_secs(limit: std::time::Duration) -> String {
    match limit.subsec_millis() {
        0 => format!("{}s", limit.as_secs()),
        _ => format!("{:.1}s", limit.as_secs_f64()),
    }
}

fn io(what: &str, e: std::io::Error) -> GitError {
    GitError::Spawn { what: what.to_owned(), reason: e.to_string() }
}

/// Removes a checkout directory (a run's, once merged or discarded).
pub fn remove_dir(dir: &Path) -> Result<(), GitError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(&format!("removing {}", dir.display()), e)),
    }
}

/// Whether `dir` looks like a checkout (it has a `.git`).
pub fn is_checkout(dir: &Path) -> bool {
    dir.join(".git").exists()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    #[test]
    fn porcelain_paths_skip_rename_sources() {
        let out = " M a.txt\0R  new.txt\0old.txt\0?? dir/b c.txt\0";
        assert_eq!(porcelain_paths(out), vec!["a.txt", "new.txt", "dir/b c.txt"]);
    }
}
