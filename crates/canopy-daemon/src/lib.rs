//! Canopy's control plane: configuration, workspace initialisation, and the daemon that
//! serves the API over NATS and publishes an event for every committed message.
//!
//! Owns request handling (decode, authenticate, validate at the edge, call the store,
//! reply) and the daemon's lifecycle (lock, managed NATS, graceful stop). Does not hold
//! SQL (that is `canopy-store`) or build subjects (that is `canopy-proto`).

pub mod auth;
pub mod builtin;
pub mod config;
pub mod continuity;
pub mod daemon;
pub mod delivery;
pub mod gate;
pub mod handlers;
pub mod init;
pub mod paths;
pub mod prompt_api;
pub mod prompts;
pub mod roles;

pub use config::{Config, ConfigError};
pub use daemon::{ConnectionInfo, DaemonError, DaemonOptions, read_connection_info, run};
pub use init::{InitOptions, InitReport, init};
pub use paths::DataDir;
