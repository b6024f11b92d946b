//! The repositories rules: repository, branch and title names, the branches and mirror refs
//! Canopy names, who decides a merge request, the stack order, and every sentence Canopy
//! posts about runs' branches and merge requests. Runs no git and reads nothing.

use crate::acl::Caller;
use crate::{Error, MergeRequest, MergeState};

/// A repository name: a short name (`names::is_short_name`).
pub fn check_repo_name(field: &'static str, name: &str) -> Result<(), Error> {
    match crate::names::is_short_name(name) {
        true => Ok(()),
        false => Err(Error::invalid(field, format!("{name:?} is not a repository name (1-40 of a-z, 0-9, -, _)"))),
    }
}

/// A branch name git accepts and no option parser mistakes for a flag (a subset of
/// `git check-ref-format --branch`).
pub fn check_branch(field: &'static str, name: &str) -> Result<(), Error> {
    let bad_char = |c: char| c.is_control() || c.is_whitespace() || "~^:?*[\\".contains(c);
    let ok = !name.is_empty()
        && name.len() <= 100
        && !name.starts_with(['-', '/', '.'])
        && !name.ends_with(['/', '.'])
        && !name.ends_with(".lock")
        && !name.contains("..")
        && !name.contains("//")
        && !name.contains("@{")
        && !name.chars().any(bad_char);
    match ok {
        true => Ok(()),
        false => Err(Error::invalid(field, format!("{name:?} is not a branch name"))),
    }
}

/// A revision a Manager may start a run from: a branch, tag, `HEAD`, a sha, with `~N`/`^N`.
pub fn check_revision(field: &'static str, rev: &str) -> Result<(), Error> {
    let ok = !rev.is_empty()
        && rev.len() <= 120
        && !rev.starts_with('-')
        && rev.chars().all(|c| c.is_ascii_alphanumeric() || "/._-~^".contains(c));
    match ok {
        true => Ok(()),
        false => Err(Error::invalid(field, format!("{rev:?} is not a revision (a branch, a commit, HEAD~N)"))),
    }
}

/// A merge request's title: one line of 1 to 100 characters (it names a topic).
pub fn check_title(title: &str) -> Result<String, Error> {
    let title = title.trim();
    if title.is_empty() || title.chars().count() > 100 || title.chars().any(char::is_control) {
        return Err(Error::invalid("title", "must be one line of 1 to 100 characters"));
    }
    Ok(title.to_owned())
}

/// A standing agent's branch.
pub fn agent_branch(handle: &str) -> String {
    format!("canopy/{handle}")
}

/// A subagent run's branch.
pub fn run_branch(manager: &str, run: i64) -> String {
    format!("canopy/{manager}/run-{run}")
}

/// The mirror ref an agent's branch is published to.
pub fn agent_ref(handle: &str) -> String {
    format!("refs/canopy/agents/{handle}")
}

/// The mirror ref a run's branch is published to.
pub fn run_ref(run: i64) -> String {
    format!("refs/canopy/runs/{run}")
}

/// The mirror ref of the head a merge request asked for.
pub fn merge_head_ref(id: i64) -> String {
    format!("refs/canopy/merges/{id}")
}

/// The mirror ref of a merge request's merged tree.
pub fn merge_result_ref(id: i64) -> String {
    format!("refs/canopy/merged/{id}")
}

/// The topic a merge request is discussed in.
pub fn merge_topic(title: &str) -> String {
    format!("merge: {title}")
}

/// Parses `merge-<n>`.
pub fn parse_merge_id(field: &'static str, id: &str) -> Result<i64, Error> {
    id.strip_prefix("merge-")
        .and_then(|n| n.parse::<i64>().ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| Error::invalid(field, format!("{id:?} is not a merge request id like merge-3")))
}

/// Only an operator decides a merge request.
pub fn may_decide(caller: &Caller, approve: bool, id: &str) -> Result<(), Error> {
    match caller.is_operator() {
        true => Ok(()),
        false => Err(Error::Forbidden {
            action: format!("{} {id}", if approve { "approve" } else { "deny" }),
            reason: "only an operator can decide a merge request; agents never move the base branch".into(),
        }),
    }
}

/// What a decision may act on: an approval on a request waiting for the operator or for a
/// review (over which it needs an override); a denial also on one still in the queue.
pub fn check_decidable(request: &MergeRequest, approve: bool) -> Result<(), Error> {
    match request.state {
        MergeState::Pending | MergeState::InReview => Ok(()),
        MergeState::Queued if !approve => Ok(()),
        MergeState::Checking => Err(Error::ConflictOn {
            field: "id",
            reason: format!("{} is still being checked; decide it once its request is posted", request.id),
        }),
        state => Err(Error::ConflictOn {
            field: "id",
            reason: format!("{} is {state}, not waiting for a decision; nothing changed", request.id),
        }),
    }
}

/// A stacked request is approved only while everything below it can still merge; the queue
/// then merges the stack bottom-up.
pub fn check_stack(request: &MergeRequest, below: &[(String, MergeState)]) -> Result<(), Error> {
    match below.iter().find(|(_, state)| matches!(state, MergeState::Denied | MergeState::Refused)) {
        None => Ok(()),
        Some((id, state)) => Err(Error::ConflictOn {
            field: "id",
            reason: format!("{} depends on {id}, which is {state}: it cannot merge on top of it", request.id),
        }),
    }
}

/// The lines a run's report gains when the run had a checkout.
pub fn run_branch_section(
    branch: &str,
    base: &str,
    commits: &[String],
    diffstat: &str,
    dirty: &[String],
    check: Option<&str>,
) -> String {
    let mut out = format!("\n\n---\nbranch: {branch} (from {})\n", &base[..base.len().min(10)]);
    match commits.is_empty() {
        true => out.push_str("commits: none\n"),
        false => {
            out.push_str(&format!("commits ({}):\n", commits.len()));
            for commit in commits {
                out.push_str(&format!("  {commit}\n"));
            }
        }
    }
    if !diffstat.trim().is_empty() {
        out.push_str("diffstat:\n");
        for line in diffstat.lines() {
            out.push_str(&format!("  {}\n", line.trim()));
        }
    }
    match dirty.is_empty() {
        true => out.push_str("tree: clean\n"),
        false => out.push_str(&format!("tree: dirty, {} uncommitted ({})\n", dirty.len(), dirty.join(", "))),
    }
    out.push_str(&format!("checks: {}\n", check.unwrap_or("none configured")));
    out
}

/// Canopy's posts about merge requests, in the requester's home channel under the topic.
pub mod say {
    use crate::{MergeRequest, MergeState};

    pub fn requested(mentions: &[String], request: &MergeRequest) -> String {
        let commits = match request.commits.is_empty() {
            true => "  (none)".to_owned(),
            false => request.commits.iter().map(|c| format!("  {c}")).collect::<Vec<_>>().join("\n"),
        };
        let stack = match request.depends_on.is_empty() {
            true => String::new(),
            false => format!("\nDepends on: {} (those merge first)", request.depends_on.join(", ")),
        };
        format!(
            "{mentions} {requester} asks to merge {branch} ({head}) into {repo}'s {base}. Request {id}.\n\
             Summary: {summary}{stack}\nCommits:\n{commits}\nDiffstat:\n{diffstat}\nChecks on the merged tree: {check}\n\
             Review: {review}\n\
             To answer: `canopy merges approve {id}` or `canopy merges deny {id} --reason TEXT`, or reply `approve` or `deny <reason>` in this topic. \
             An approval puts it in the merge queue, which merges it only if every check passes on the base as it is then.",
            mentions = mentions.iter().map(|o| format!("@{o}")).collect::<Vec<_>>().join(" "),
            requester = request.requester,
            branch = request.branch,
            head = &request.head[..request.head.len().min(10)],
            repo = request.repo,
            base = request.base,
            id = request.id,
            summary = request.summary,
            diffstat = indent(&request.diffstat),
            check = request.check,
            review = review_line(request),
        )
    }

    fn review_line(request: &MergeRequest) -> String {
        use crate::review::Verdict;
        match (request.verdict, request.state) {
            (Some(Verdict::Approve), _) => "approved by its reviewer".into(),
            (Some(Verdict::ChangesRequested), _) => {
                "changes requested (approving it anyway needs --override with a reason)".into()
            }
            (None, MergeState::InReview) => {
                "required and not yet given (approving without it needs --override with a reason)".into()
            }
            (None, _) => "none yet (the operator's approval is the review)".into(),
        }
    }

    /// An approval: the request is in its repository's queue.
    pub fn queued(operator: &str, request: &MergeRequest, ahead: usize) -> String {
        let place = match ahead {
            0 => "next in the queue".to_owned(),
            n => format!("in the queue behind {n}"),
        };
        format!(
            "Approved by {operator}: {} is {place}. The queue merges it onto {}'s {} as it is then and runs every \
             check on exactly that tree; {} moves only if they all pass.",
            request.id, request.repo, request.base, request.base
        )
    }

    fn indent(text: &str) -> String {
        match text.trim().is_empty() {
            true => "  (no changes)".into(),
            false => text.lines().map(|l| format!("  {}", l.trim())).collect::<Vec<_>>().join("\n"),
        }
    }

    pub fn attempt(agent: &str, approve: bool, request: &MergeRequest) -> String {
        format!(
            "@{agent} tried to {} {} ({}). Only an operator can decide a merge request; nothing changed.",
            if approve { "approve" } else { "deny" },
            request.id,
            request.title
        )
    }

    pub fn merged(operator: &str, request: &MergeRequest, commit: &str, fast_forward: bool) -> String {
        format!(
            "Approved by {operator}: {} is merged into {}'s {} ({}, now at {}). Request {}.",
            request.branch,
            request.repo,
            request.base,
            if fast_forward { "a fast-forward" } else { "a merge commit" },
            &commit[..commit.len().min(10)],
            request.id
        )
    }

    pub fn denied(operator: &str, request: &MergeRequest, reason: Option<&str>) -> String {
        match reason {
            Some(reason) => format!("Denied by {operator}: {} is not merged. Reason: {reason}", request.id),
            None => format!("Denied by {operator}: {} is not merged.", request.id),
        }
    }

    pub fn refused(operator: &str, request: &MergeRequest, why: &str) -> String {
        format!(
            "Approved by {operator}, but {} could not merge into {}'s {}: {why}. Nothing changed on {}; fix it on {} and ask again.",
            request.id, request.repo, request.base, request.base, request.branch
        )
    }

    pub fn interrupted(request: &MergeRequest) -> String {
        format!(
            "The daemon restarted while {} was merging; it stays at the head of the queue and is merged (or found \
             already merged) once, not twice.",
            request.id
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_repo_name("name", "app-1").is_ok());
        for bad in ["", "App", "-x", "a/b", "a b", &"x".repeat(41)] {
            assert!(check_repo_name("name", bad).is_err(), "{bad:?}");
        }
        assert!(check_branch("base", "main").is_ok());
        assert!(check_branch("base", "release/1.2").is_ok());
        for bad in ["", "-f", "a..b", "a b", "a~1", "x.lock", "/a", "a/", "a@{1}"] {
            assert!(check_branch("base", bad).is_err(), "{bad:?}");
        }
        assert!(check_revision("base", "HEAD~2").is_ok());
        assert!(check_revision("base", "--upload-pack=x").is_err());
        assert!(check_title(" Add a greeting ").is_ok());
        assert!(check_title("two\nlines").is_err());
        assert_eq!(parse_merge_id("id", "merge-3").ok(), Some(3));
        assert!(parse_merge_id("id", "merge-0").is_err());
    }

    #[test]
    fn a_stack_is_approved_while_its_parents_can_merge_and_the_queue_state_decides_what_is_decidable() {
        let request = MergeRequest {
            id: "merge-2".into(),
            requester: crate::Handle::from_trusted("lead".into()),
            repo: "app".into(),
            branch: "canopy/lead".into(),
            head: "abc".into(),
            base: "main".into(),
            title: "t".into(),
            summary: "s".into(),
            depends_on: vec!["merge-1".into()],
            state: MergeState::Pending,
            commits: vec![],
            diffstat: String::new(),
            check: String::new(),
            decided_by: None,
            note: None,
            merged_commit: None,
            created_at: String::new(),
            decided_at: None,
            verdict: None,
            override_reason: None,
            queued_at: None,
        };
        let refused = check_stack(&request, &[("merge-1".into(), MergeState::Denied)]).unwrap_err();
        assert!(refused.to_string().contains("merge-1, which is denied"), "{refused}");
        assert!(check_stack(&request, &[("merge-1".into(), MergeState::Pending)]).is_ok());
        assert!(check_stack(&request, &[("merge-1".into(), MergeState::Merged)]).is_ok());
        assert!(check_decidable(&request, true).is_ok());
        let queued = MergeRequest { state: MergeState::Queued, ..request.clone() };
        assert!(check_decidable(&queued, false).is_ok(), "a queued request can still be denied");
        assert!(check_decidable(&queued, true).is_err(), "and is not approved twice");
    }

    #[test]
    fn a_run_section_says_branch_commits_and_tree() {
        let text = run_branch_section("canopy/lead/run-1", "0123456789abc", &["abc Add".into()], " a | 1 +", &[], None);
        assert!(text.contains("branch: canopy/lead/run-1 (from 0123456789)"));
        assert!(text.contains("  abc Add") && text.contains("tree: clean") && text.contains("checks: none configured"));
    }
}
