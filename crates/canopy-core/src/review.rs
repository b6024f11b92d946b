//! Review as a step with a verdict: a repository's review policy, the verdicts and comments a
//! reviewer submits, whether a merge request is merge-ready, what approving it over a missing
//! or negative verdict needs, and the sentences Canopy posts about reviews. Reads nothing.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Error;
pub use crate::model::{ReviewPolicy, Verdict};

/// One comment on a line of a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReviewComment {
    /// A path in the repository, relative to its root.
    pub file: String,
    /// A line of the file as merged (1-based).
    pub line: u32,
    pub body: String,
}

/// A review of a merge request at one head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Review {
    /// `review-<n>`.
    pub id: String,
    /// `merge-<n>`.
    pub merge: String,
    /// The head it reviewed (a newer commit makes it stale).
    pub head: String,
    /// The reviewer run's handle (`run-5`), or the operator.
    pub reviewer: String,
    pub run_id: Option<i64>,
    pub focus: String,
    /// `running`, `submitted`, or `abandoned` (its run ended without a verdict).
    pub state: String,
    pub verdict: Option<Verdict>,
    pub summary: String,
    pub comments: Vec<ReviewComment>,
    pub created_at: String,
    pub submitted_at: Option<String>,
}

/// Most comments in one review.
pub const MAX_COMMENTS: usize = 100;
/// Longest review summary, and comment body, in bytes.
pub const MAX_SUMMARY: usize = 8192;
pub const MAX_BODY: usize = 4096;
/// Longest focus a Manager gives a reviewer, in bytes.
pub const MAX_FOCUS: usize = 2000;

/// A submitted review's summary and comments: each file a relative path inside the
/// repository, each line at least 1, each body non-empty and bounded.
pub fn check_submission(summary: &str, comments: &[ReviewComment]) -> Result<(), Error> {
    if summary.trim().is_empty() {
        return Err(Error::invalid("summary", "must not be empty: say what you found"));
    }
    if summary.len() > MAX_SUMMARY {
        return Err(Error::TooLarge { field: "summary", len: summary.len(), max: MAX_SUMMARY });
    }
    if comments.len() > MAX_COMMENTS {
        return Err(Error::invalid("comments", format!("at most {MAX_COMMENTS} comments")));
    }
    for c in comments {
        let bad_path = c.file.is_empty()
            || c.file.len() > 500
            || c.file.starts_with('/')
            || c.file.split('/').any(|part| part == ".." || part.is_empty())
            || c.file.chars().any(char::is_control);
        if bad_path {
            return Err(Error::invalid("comments", format!("{:?} is not a path inside the repository", c.file)));
        }
        if c.line == 0 {
            return Err(Error::invalid("comments", format!("{}: lines count from 1", c.file)));
        }
        if c.body.trim().is_empty() || c.body.len() > MAX_BODY {
            return Err(Error::invalid(
                "comments",
                format!("{}:{}: a comment says 1 to {MAX_BODY} bytes", c.file, c.line),
            ));
        }
    }
    Ok(())
}

/// What stands between a request and the operator's plain approval: `None` when its review
/// is settled (by the policy, or a current `approve`), else the reason `--override` is needed.
pub fn override_needed(policy: ReviewPolicy, verdict: Option<Verdict>) -> Option<String> {
    match (policy, verdict) {
        (_, Some(Verdict::Approve)) => None,
        (_, Some(Verdict::ChangesRequested)) => Some("its review requested changes".into()),
        (ReviewPolicy::Required, None) => Some("the repository requires a review and it has no verdict yet".into()),
        (ReviewPolicy::Operator, None) => None,
    }
}

/// A reviewer run's brief: what it reviews (the request, its summary, linked issues, checks,
/// focus) and the diff of the merged tree against the base (`diff`, already bounded).
pub fn brief(request: &crate::MergeRequest, base: &str, issues: &[(u64, String)], focus: &str, diff: &str) -> String {
    let short = |sha: &str| sha[..sha.len().min(10)].to_owned();
    let mut out = format!(
        "Review {id} ({title:?}) by {requester}: it merges {branch} ({head}) into {repo}'s {base_name} at {base}.\n\
         Your working directory is a read-only checkout of the merged tree; `git diff {base} HEAD` shows the change.\n\n\
         The requester's summary:\n{summary}\n",
        id = request.id,
        title = request.title,
        requester = request.requester,
        branch = request.branch,
        head = short(&request.head),
        repo = request.repo,
        base_name = request.base,
        base = short(base),
        summary = request.summary,
    );
    if !issues.is_empty() {
        out.push_str("\nIssues it works on:\n");
        for (n, title) in issues {
            out.push_str(&format!("  #{n} {title}\n"));
        }
    }
    out.push_str(&format!("\nChecks on the merged tree: {}\n", request.check.lines().next().unwrap_or("none yet")));
    if !focus.is_empty() {
        out.push_str(&format!("\nLook hardest at: {focus}\n"));
    }
    out.push_str(&format!(
        "\nSubmit one verdict with review_submit: approve, or changes_requested with comments on the file and \
         line each one is about.\n\nThe diff against {}:\n```diff\n{diff}```\n",
        request.base
    ));
    out
}

/// Canopy's posts about reviews, in the merge request's topic.
pub mod say {
    use super::{ReviewComment, Verdict};

    pub fn started(merge: &str, run: i64) -> String {
        format!("Review of {merge} started: run {run} reads the merged tree and will submit a verdict here.")
    }

    /// A submitted verdict with its comments, for the requester and the operators.
    pub fn submitted(
        merge: &str,
        reviewer: &str,
        verdict: Verdict,
        summary: &str,
        comments: &[ReviewComment],
    ) -> String {
        let mut out = match verdict {
            Verdict::Approve => format!("Review of {merge} by {reviewer}: approve.\n{summary}"),
            Verdict::ChangesRequested => format!(
                "Review of {merge} by {reviewer}: changes requested. Commit the fixes on your branch (its checks \
                 rerun), ask again with merge_request under the same title (the request takes the new head), \
                 then review_request for a new verdict.\n{summary}"
            ),
        };
        for c in comments {
            out.push_str(&format!("\n- {}:{}: {}", c.file, c.line, c.body.trim()));
        }
        out
    }

    pub fn abandoned(merge: &str, run: i64, why: &str) -> String {
        format!("Review of {merge} by run {run} ended without a verdict ({why}); ask for a new one.")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    fn comment(file: &str, line: u32) -> ReviewComment {
        ReviewComment { file: file.into(), line, body: "why".into() }
    }

    #[test]
    fn submissions_are_checked_naming_the_field() {
        assert!(check_submission("fine", &[comment("src/a.rs", 3)]).is_ok());
        assert!(check_submission(" ", &[]).is_err());
        for bad in [comment("/etc/passwd", 1), comment("a/../../b", 1), comment("a.rs", 0), comment("", 1)] {
            assert!(matches!(check_submission("x", &[bad]), Err(Error::InvalidArgument { field: "comments", .. })));
        }
    }

    #[test]
    fn an_override_is_needed_over_a_missing_required_or_negative_verdict() {
        assert_eq!(override_needed(ReviewPolicy::Operator, None), None);
        assert_eq!(override_needed(ReviewPolicy::Required, Some(Verdict::Approve)), None);
        assert!(override_needed(ReviewPolicy::Required, None).is_some());
        assert!(override_needed(ReviewPolicy::Operator, Some(Verdict::ChangesRequested)).is_some());
    }
}
