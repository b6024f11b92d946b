//! Canopy's domain: names, the model types, tree rules, ACL decisions and errors.
//!
//! Owns every rule that can be decided from values alone: which names are valid, who may
//! post where, whether a reparent makes a cycle, what a reply in a spawn request's topic
//! says. Does no IO and knows nothing of SQLite, NATS or async; the store and the daemon
//! call into it with the facts they have read.

pub mod acl;
pub mod budget;
pub mod checks;
pub mod continuity;
pub mod delivery;
pub mod error;
/// Test scaffolding (a seeded RNG and a mutator): compiled for this crate's tests and for
/// crates that enable the `testing` feature in their dev-dependencies, never shipped.
#[cfg(any(test, feature = "testing"))]
pub mod fuzz;
pub mod gate;
pub mod harness;
pub mod ids;
pub mod issues;
mod macros;
pub mod mention;
pub mod model;
pub mod names;
pub mod notices;
pub mod placement;
pub mod redact;
pub mod render;
pub mod repos;
pub mod review;
pub mod schedule;
pub mod size;
pub mod spawn;
pub mod timeline;
pub mod tree;

pub use error::{Error, ErrorCode};
pub use ids::{Incarnation, RunnerId, Seq};
pub use model::*;
pub use names::{ChannelName, Handle, NameError, RoleName, TopicName};
