//! A workspace's configuration, read by every process that serves or joins it: the schema,
//! defaults and validation of `canopy.toml` (`config`), the layout of the data directory
//! (`paths`), `daemon.json`, how a running daemon is reached (`connection`), and the
//! credential files (`credentials`).
//!
//! The composition roots (the `canopy` binary, the bench) read these and hand the parts to
//! the daemon and the runner; nothing imports the daemon for its configuration. Does no
//! networking and knows no harness, store or NATS type: converting settings into a
//! harness's launch settings is the runner's (`canopy_runner::wiring`).

pub mod config;
pub mod connection;
pub mod credentials;
pub mod paths;

pub use config::{Config, ConfigError};
pub use connection::{ConnectionInfo, read_connection_info};
pub use credentials::{CredentialError, EMBEDDED_RUNNER, NatsLogin, RunnerCredential};
pub use paths::DataDir;
