//! Canopy's control plane: workspace initialisation, and the daemon that serves the API over
//! NATS and tells everyone what it committed.
//!
//! The daemon is a set of areas, each a struct naming the services it uses, composed once at
//! start (`api::Api::build`), lowest first:
//!
//! - services: `delivery` (carries a committed post; uses the store and the `wire`), `holds`
//!   (the budget snapshot), `notify`, `run_ends`, `auth`, `replies` (reactions to posts),
//!   `trees` (checkouts' working trees, here or on their runners), `git_access` (who may use
//!   the git endpoint), `runner_api` (tool calls from runners elsewhere, over HTTP);
//! - areas: `budgets`, `issues`, `prompts`, `repos`, `runs`, `gate`, `agents`, `sessions`, `history`,
//!   `credentials`, `messages`; `api` dispatches each method to its area (the method table
//!   names it); `daemon` and `serve` are the lifecycle and the request loop.
//!
//! Does not hold SQL (that is `canopy-store`), build subjects (`canopy-proto`), own the
//! configuration (`canopy-config`), or know the runner and the harnesses: the `canopy` binary
//! composes the daemon with its embedded runner (`DaemonOptions::embedded`), the scripted
//! harness's script check, and how git is confined (`DaemonOptions::git`).

pub mod agents;
pub mod api;
pub mod auth;
pub mod budgets;
pub mod builtin;
pub mod bundle;
pub mod checks;
pub mod credentials;
pub mod daemon;
pub mod delivery;
pub mod edge;
pub mod gate;
pub mod git_access;
pub mod history;
pub mod holds;
pub mod init;
pub mod issues;
pub mod logins;
pub mod merges;
pub mod messages;
pub mod notify;
pub mod prompts;
pub mod replies;
pub mod repos;
pub mod roles;
pub mod run_ends;
pub mod runner_api;
pub mod runs;
mod serve;
pub mod sessions;
#[cfg(test)]
mod testing;
pub mod trees;
pub mod watch;
pub mod wire;

pub use daemon::{DaemonError, DaemonOptions, Embedded, StopEmbedded, run};
pub use init::{InitOptions, InitReport, init};
