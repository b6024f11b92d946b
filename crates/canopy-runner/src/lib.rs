//! The runner: hosts agent sessions on one machine.
//!
//! It syncs with the daemon on a timer and on a doorbell (`runner.poke`): the sync is its
//! heartbeat, and the reply is the set of sessions it should host, each with its
//! incarnation and token. The runner starts what it lacks and stops what it should not
//! run. Each session is one task (`session`) that owns its harness process and reports
//! what happens to the daemon through one batching `reporter`. The runner also serves the
//! native tools over MCP on loopback, admitting only the tokens of sessions it hosts. It
//! decides restarts (backoff, crash loops) but not placement: the daemon does that.

mod reporter;
mod runner;
mod session;
pub mod wiring;

pub use runner::{RunnerError, RunnerHandle, RunnerOptions, RunnerSettings, RunnerToken, spawn};

/// The longest a runner waits for the daemon's answer to a call of its own (sync, pull,
/// acknowledgement, reports), never more than `[daemon] request_timeout`. The daemon answers
/// these in milliseconds; a reply lost with a NATS server or a daemon that died is noticed
/// after this and the call is retried, instead of holding deliveries for the full request
/// timeout. Tool calls keep the request timeout: a merge's check may take long.
const LIVE_CALL: std::time::Duration = std::time::Duration::from_secs(2);
