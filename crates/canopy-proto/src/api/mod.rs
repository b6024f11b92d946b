//! Request and response bodies for every API method, and the message event.
//!
//! Requests carry names as plain strings: the daemon parses them at the edge so a bad name
//! comes back as `invalid_argument` naming its field. Every request rejects unknown fields.
//! Responses reuse the model types from `canopy-core`.
//!
//! One file per area, named as the daemon's areas and the CLI's commands are: `agents`,
//! `messages`, `sessions`, `delivery`, `gate`, `runs`, `repos`, `checks`, `merges`, `issues`, `prompts`, `history`,
//! `budgets`, `credentials`. This module only re-exports them, so `canopy_proto::api::*`
//! names every wire type; an area imports from a lower one, never the other way.

mod agents;
mod budgets;
mod checks;
mod credentials;
mod delivery;
mod gate;
mod history;
mod issues;
mod merges;
mod messages;
mod prompts;
mod repos;
mod runs;
mod sessions;

pub use agents::*;
pub use budgets::*;
pub use checks::*;
pub use credentials::*;
pub use delivery::*;
pub use gate::*;
pub use history::*;
pub use issues::*;
pub use merges::*;
pub use messages::*;
pub use prompts::*;
pub use repos::*;
pub use runs::*;
pub use sessions::*;
