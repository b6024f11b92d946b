//! A runner's side of repositories it reaches over the daemon's smart HTTP endpoint: its own
//! cache of each mirror, brought up to date from the daemon's, and pushes of the refs its
//! checkouts published there back to the daemon's mirror.
//!
//! The login travels in git's environment (`http.extraHeader`), never on a command line.
//! Does not decide what is fetched or pushed when; the runner does, and the daemon's endpoint
//! decides whether it may.

use std::path::Path;

use crate::git::{Git, GitError};

/// The daemon's git endpoint as one runner reaches it.
#[derive(Clone)]
pub struct Remote {
    /// The endpoint's base URL (`http://10.0.0.5:7420`); a repository is `<url>/<name>.git`.
    pub url: String,
    /// The `Authorization` header value: the runner's id and token (`http::basic_header`).
    pub authorization: String,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote").field("url", &self.url).finish_non_exhaustive()
    }
}

impl Remote {
    fn repo_url(&self, name: &str) -> String {
        format!("{}/{name}.git", self.url.trim_end_matches('/'))
    }

    fn header(&self) -> String {
        format!("Authorization: {}", self.authorization)
    }
}

impl Git {
    /// Brings `mirror`, this machine's cache of repository `name`, up to date with the
    /// daemon's mirror (its branches and Canopy's refs), making the cache first when there is
    /// none.
    pub async fn fetch_remote(&self, remote: &Remote, name: &str, mirror: &Path) -> Result<(), GitError> {
        if !mirror.join("HEAD").exists() {
            let parent =
                mirror.parent().ok_or_else(|| GitError::Invalid("a mirror needs a parent directory".into()))?;
            std::fs::create_dir_all(parent)
                .map_err(|e| GitError::Spawn { what: "creating the repos directory".into(), reason: e.to_string() })?;
            let target = mirror.display().to_string();
            self.trusted(parent, &["init", "--bare", "--quiet", &target]).await?;
        }
        let url = remote.repo_url(name);
        let header = remote.header();
        let args = [
            "fetch",
            "--quiet",
            "--no-tags",
            "--force",
            &url,
            "+refs/heads/*:refs/heads/*",
            "+refs/canopy/*:refs/canopy/*",
        ];
        self.trusted_with(mirror, &args, &[("http.extraHeader", &header)]).await.map(|_| ())
    }

    /// Pushes ref `from` of `mirror`, this machine's cache of repository `name`, to the
    /// daemon's mirror as `to`: forced (the ref is the agent's branch as it is now), or with
    /// `lease` only while `to` is at that commit there (`Some(None)`: while it does not exist).
    pub async fn push_remote(
        &self,
        remote: &Remote,
        name: &str,
        mirror: &Path,
        (from, to): (&str, &str),
        lease: Option<Option<&str>>,
    ) -> Result<(), GitError> {
        let (url, header) = (remote.repo_url(name), remote.header());
        let (spec, lease) = match lease {
            None => (format!("+{from}:{to}"), None),
            // No `+`: the lease alone allows a rewrite, and only over the expected commit.
            Some(expected) => {
                (format!("{from}:{to}"), Some(format!("--force-with-lease={to}:{}", expected.unwrap_or(""))))
            }
        };
        let mut args = vec!["push", "--quiet", "--no-verify"];
        args.extend(lease.as_deref());
        args.extend([url.as_str(), spec.as_str()]);
        self.trusted_with(mirror, &args, &[("http.extraHeader", &header)]).await.map(|_| ())
    }
}
