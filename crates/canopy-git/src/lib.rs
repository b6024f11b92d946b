//! Git: Canopy's mirror of each repository, the checkout each agent and each
//! subagent run works in, the merges between them, and the check command.
//!
//! The mechanism ([why](../../../docs/decisions.md#repositories-and-checkouts)): a repository's canonical copy
//! is the operator's; Canopy keeps a bare mirror of it in `<data>/repos/<name>.git`, and every
//! checkout is a `git clone --shared` of the mirror (its objects through `alternates`), bound
//! read-write into its own session's sandbox while the mirror is bound read-only. So a session
//! can commit on its own branch and read shared history, and cannot move any ref it does not
//! own: the mirror's refs and the canonical repository are out of its reach.
//!
//! Trust decides how each command runs (`git.rs`): in the mirror, in a fresh checkout no
//! session has seen yet, and in the operator's canonical repository, git runs as the daemon;
//! in a checkout a session has written, git (and the check command) runs inside the same
//! sandbox as that session, because its hooks, config and filters are the agent's.
//!
//! This crate does not decide who may merge or when (the daemon's merge gate and the store
//! do), and knows nothing of NATS, the store or sessions beyond the paths it is given.

mod git;
pub mod http;
mod ops;
mod remote;

pub use git::{Confined, Git, GitError};
pub use ops::{CheckResult, MergeOutcome, Status, Summary, is_checkout, remove_dir, short};
pub use remote::Remote;
