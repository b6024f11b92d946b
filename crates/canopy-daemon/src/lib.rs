//! Canopy's control plane: workspace initialisation, and the daemon that serves the API over
//! NATS and publishes an event for every committed message.
//!
//! Owns request handling (decode, authenticate, validate at the edge, call the store,
//! reply) and the daemon's lifecycle (lock, managed NATS, graceful stop). Does not hold
//! SQL (that is `canopy-store`), build subjects (that is `canopy-proto`), own the
//! configuration (`canopy-config`), or know the runner and the harnesses: the `canopy`
//! binary composes the daemon with its embedded runner (`DaemonOptions::embedded`), the
//! scripted harness's script check, and how git is confined (`DaemonOptions::git`).

pub mod agents;
pub mod auth;
pub mod budgets;
pub mod builtin;
pub mod context;
pub mod continuity;
pub mod credentials;
pub mod daemon;
pub mod delivery;
pub mod gate;
pub mod handlers;
pub mod init;
pub mod messages;
pub mod notify;
pub mod prompt_api;
pub mod prompts;
pub mod roles;
pub mod sessions;
pub mod workspaces;

pub use daemon::{DaemonError, DaemonOptions, Embedded, StopEmbedded, run};
pub use init::{InitOptions, InitReport, init};
