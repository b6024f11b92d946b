//! The runner: hosts agent sessions on one machine.
//!
//! It syncs with the daemon on a timer and on a doorbell (`runner.poke`): the sync is its
//! heartbeat, and the reply is the set of sessions it should host, each with its
//! incarnation and token. The runner starts what it lacks and stops what it should not
//! run. Each session is one task (`session`) that owns its harness process and reports
//! what happens to the daemon through one batching `reporter`. The runner also serves the
//! native tools over MCP on loopback, admitting only the tokens of sessions it hosts. It
//! decides restarts (backoff, crash loops) but not placement: the daemon does that.
//!
//! Files import downward only: `wiring` starts a `runner`; `runner` uses `requests`,
//! `restarts`, `session` and `reporter`; all of them read `options`, which imports only
//! `checkouts` (the checkouts a runner keeps on its own disk), which imports none of them;
//! `tool_path` (tool calls over HTTP from a runner elsewhere) imports nothing of the runner. Nothing imports this file: it only declares and re-exports.

mod checkouts;
mod options;
mod reporter;
mod requests;
mod restarts;
mod runner;
mod session;
mod tool_path;
pub mod wiring;

pub use checkouts::Checkouts;
pub use options::{RunnerOptions, RunnerSettings, RunnerToken, TokenUnreadable};
pub use runner::{RunnerError, RunnerHandle, spawn};
pub use tool_path::HttpTools;
